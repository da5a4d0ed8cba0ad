"""Which nodes get a Warning Event: those left out for their GPUs, once per reason."""

from __future__ import annotations

import pytest

from elastra.controller.engine.nodewarnings import to_warn
from elastra.planner.inventory import (
    GPUS_NOT_ADVERTISED,
    MIG_PARTITIONED,
    UNKNOWN_GPU_TYPE,
    ExcludedNode,
    NodeName,
)

RTX = ExcludedNode(
    NodeName("rtx"), "8 nvidia.com/gpu but no known GPU type in ...", UNKNOWN_GPU_TYPE
)
MIG = ExcludedNode(NodeName("mig"), "MIG partitions are not planned (...)", MIG_PARTITIONED)
JOINING = ExcludedNode(NodeName("new"), "the device plugin has not registered", GPUS_NOT_ADVERTISED)
TAINTED = ExcludedNode(NodeName("t"), "taint sku=gpu:NoSchedule not tolerated")
DOWN = ExcludedNode(NodeName("down"), "NotReady (Ready=False)")


@pytest.mark.parametrize(
    ("warned", "due"),
    [
        ({}, ["rtx", "mig"]),  # GPU exclusions only: not a joining node, a taint, NotReady
        ({"rtx": RTX.reason, "mig": MIG.reason}, []),  # once
        ({"rtx": RTX.reason, "mig": "MIG partitions are not planned (other layout)"}, ["mig"]),
    ],
)
def test_nodes_left_out_for_their_gpus_are_warned_once_per_reason(
    warned: dict[str, str], due: list[str]
) -> None:
    excluded = [RTX, MIG, JOINING, TAINTED, DOWN]
    assert [n.name for n in to_warn(excluded, warned)] == due
