"""The assignment contract: what parses, what is refused and with which message."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from elastra_worker.assignment import (
    AssignmentError,
    assignment_from_env,
    parse_assignment,
    read_assignment_file,
)


def wire(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "apiVersion": "elastra.dev/v1alpha1",
        "kind": "Assignment",
        "job": "gpt",
        "worldVersion": 3,
        "rank": 2,
        "worldSize": 4,
        "masterAddr": "gpt-w-0",
        "masterPort": 29500,
        "localWorldSize": 1,
        "plan": {"dp": 4, "tp": 1, "pp": 1, "microBatchSize": 2, "batchShares": [8, 8, 8, 8]},
        "globalBatchSize": 32,
        "consistency": "data",
        "seed": 7,
        "checkpoint": {"path": "/ckpt", "intervalSeconds": 300, "keep": 3},
        "stop": False,
    }
    base.update(changes)
    return base


def test_full_assignment_round_trips() -> None:
    a = parse_assignment(json.dumps(wire()))
    assert (a.job, a.world_version, a.rank, a.world_size) == ("gpt", 3, 2, 4)
    assert a.plan.batch_shares == (8, 8, 8, 8)
    assert a.checkpoint.path == "/ckpt" and a.checkpoint.interval_steps == 0
    assert a.stop_at_step is None and not a.stop and not a.waiting
    assert parse_assignment(a.to_json()) == a


def test_world_size_zero_waits_without_master_fields() -> None:
    a = parse_assignment({"job": "gpt", "worldVersion": 4, "worldSize": 0})
    assert a.waiting


def test_shares_default_to_even_split() -> None:
    plan = wire()["plan"]
    del plan["batchShares"]
    assert parse_assignment(wire(plan=plan)).plan.batch_shares == (8, 8, 8, 8)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"worldSize": 3}, "dp*tp*pp"),
        ({"rank": 4}, "exceeds worldSize"),
        ({"masterPort": 0}, "masterPort"),
        ({"consistency": "exact"}, "consistency"),
        ({"globalBatchSize": 30}, "batchShares: sums to 32"),
        ({"worldVersion": "3"}, "worldVersion: expected an integer"),
        ({"stop": 1}, "stop: expected bool"),
        ({"apiVersion": "v2"}, "apiVersion"),
        ({"job": "a/b"}, "job"),
        ({"checkpoint": {"path": ""}}, "checkpoint.path"),
    ],
)
def test_bad_fields_are_named(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(AssignmentError, match=re.escape(message)):
        parse_assignment(wire(**changes))


def test_bitwise_needs_whole_logical_shares() -> None:
    plan = {"dp": 4, "microBatchSize": 3, "batchShares": [8, 8, 8, 8]}
    with pytest.raises(AssignmentError, match=r"multiples of plan\.microBatchSize"):
        parse_assignment(wire(consistency="bitwise", plan=plan))


def test_missing_or_empty_file_means_waiting(tmp_path: Path) -> None:
    f = tmp_path / "assignment"
    assert read_assignment_file(f) is None
    f.write_text("")
    assert read_assignment_file(f) is None
    f.write_text("{not json")
    with pytest.raises(AssignmentError, match="not valid JSON"):
        read_assignment_file(f)


def test_from_env_uses_torchrun_variables() -> None:
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "1234", "ELASTRA_GLOBAL_BATCH_SIZE": "8"}
    a = assignment_from_env(env)
    assert (a.rank, a.world_size, a.master_port, a.plan.batch_shares) == (1, 2, 1234, (4, 4))
    with pytest.raises(AssignmentError, match="WORLD_SIZE"):
        assignment_from_env({"WORLD_SIZE": "two"})
