"""session/data.py: a restored run keeps the checkpoint's data order or fails, naming both."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from elastra_worker.assignment import assignment_from_env
from elastra_worker.dataorder import DataOrder, rank_shares
from elastra_worker.errors import PermanentError
from elastra_worker.layout import Manifest
from elastra_worker.session.data import DataPosition
from elastra_worker.session.world import World

SAVED = {"seed": 7, "datasetSize": 100, "globalBatchSize": 24}


def _position(consistency: str, rank: int = 1) -> DataPosition:
    env = {"RANK": str(rank), "WORLD_SIZE": "2", "ELASTRA_GLOBAL_BATCH_SIZE": "24",
           "ELASTRA_MICRO_BATCH_SIZE": "2", "ELASTRA_SEED": "7",
           "ELASTRA_CONSISTENCY": consistency}  # fmt: skip
    world = World(assignment_from_env(env), local_rank=0, device=torch.device("cpu"),
                  rendezvous_timeout_s=1, collective_timeout_s=1)  # fmt: skip
    return DataPosition(world)


def _manifest(extra: dict[str, Any]) -> Manifest:
    return Manifest(job="j", step=4, world_size=2, world_version=1, files={}, extra=extra)


@pytest.mark.parametrize(
    ("consistency", "size", "extra", "error"),
    [
        ("data", 100, {"dataOrder": SAVED}, None),
        ("data", 90, {"dataOrder": SAVED}, "differs from this run's"),
        ("bitwise", 90, {"dataOrder": SAVED}, "consistency bitwise cannot hold"),
        ("none", 90, {"dataOrder": SAVED}, None),  # no promise about the order to keep
        ("data", 90, {}, None),  # a checkpoint that does not say
    ],
)
def test_the_restored_order_is_kept_or_the_run_fails_naming_both(
    consistency: str, size: int, extra: dict[str, Any], error: str | None
) -> None:
    data = _position(consistency)
    if error is None:
        data.begin(size, _manifest(extra))
        assert data.manifest_extra()["dataOrder"]["datasetSize"] == size
        return
    with pytest.raises(PermanentError, match=error) as err:
        data.begin(size, _manifest(extra))
    assert "'datasetSize': 100" in str(err.value) and "'datasetSize': 90" in str(err.value)


def test_a_step_holds_the_orders_samples_and_this_ranks_shares() -> None:
    data = _position("data")
    with pytest.raises(RuntimeError, match="batches"):
        data.step_samples(0)
    with pytest.raises(RuntimeError, match="inside batches"):
        data.manifest_extra()
    data.begin(100, None)
    samples, shares = data.step_samples(3)
    assert samples == DataOrder(7, 100, 24).step_samples(3)
    assert shares == rank_shares(samples, (12, 12), 1, 2)
