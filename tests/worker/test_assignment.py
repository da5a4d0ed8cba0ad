"""The assignment contract: what parses, what is refused and with which message."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from elastra_worker.assignment import (
    Assignment,
    AssignmentError,
    CheckpointPolicy,
    ParallelPlan,
    RankCoord,
    assignment_from_env,
    default_coords,
    parse_assignment,
    read_assignment_file,
    split_layers,
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


@pytest.mark.parametrize("lost", [True, False])
def test_peers_lost_round_trips_and_defaults_to_false(lost: bool) -> None:
    assert parse_assignment(json.dumps(wire())).peers_lost is False  # an older operator's
    a = parse_assignment(json.dumps(wire(peersLost=lost)))
    assert a.peers_lost is lost and "peersLost" not in a.extra
    assert parse_assignment(a.to_json()) == a


def test_full_plan_round_trips() -> None:
    """Every plan field the operator writes (uneven shares, interleaved pipeline stages,
    every rank's coordinates) comes back equal through the wire."""
    coords = default_coords(2, 2, 2)
    plan = ParallelPlan(
        dp=2,
        tp=2,
        pp=2,
        micro_batch_size=2,
        batch_shares=(18, 14),
        virtual_stages=2,
        schedule="interleaved1f1b",
        sharding="optimizer",
        recompute="selective",
        ranks=coords,
        stages=split_layers(10, 4),
    )
    a = Assignment(
        job="gpt",
        world_version=5,
        rank=4,
        world_size=8,
        master_addr="gpt-w0.gpt",
        master_port=29505,
        plan=plan,
        global_batch_size=32,
        checkpoint=CheckpointPolicy(path="/ckpt"),
        local_world_size=4,
        consistency="data",
    )
    back = parse_assignment(a.to_json())
    assert back == a and back.plan == plan
    assert [(s.start, s.stop) for s in back.plan.stages] == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert back.plan.coord(5) == RankCoord(rank=5, dp_rank=1, tp_rank=1, pp_stage=0)


@pytest.mark.parametrize(
    ("plan", "written"),
    [
        (ParallelPlan(dp=4, batch_shares=(8, 8, 8, 8)), {"dp": 4}),
        (
            ParallelPlan(
                dp=1, pp=2, virtual_stages=2, schedule="interleaved1f1b", batch_shares=(32,)
            ),
            {"dp": 1, "pp": 2, "virtualStages": 2},
        ),
        (
            ParallelPlan(dp=1, pp=2, schedule="gpipe", sharding="full", batch_shares=(32,)),
            {"dp": 1, "pp": 2, "schedule": "gpipe", "sharding": "full"},
        ),
    ],
)
def test_the_plan_is_written_without_what_the_reader_assumes(
    plan: ParallelPlan, written: dict[str, Any]
) -> None:
    """Plan and checkpoint fields at their defaults stay out of the annotation (every pod write
    and watch event carries it); the top level is whole; parsing gives the same assignment."""
    a = Assignment(
        job="gpt",
        world_version=1,
        rank=0,
        world_size=plan.dp * plan.tp * plan.pp,
        master_addr="gpt-w0.gpt",
        master_port=29501,
        plan=plan,
        global_batch_size=32,
        checkpoint=CheckpointPolicy(path="/ckpt", interval_seconds=600),
    )
    text = a.to_json()
    decoded = json.loads(text)
    assert decoded["plan"] == written
    assert decoded["checkpoint"] == {"path": "/ckpt", "intervalSeconds": 600}
    assert decoded["stop"] is False and decoded["stopAtStep"] is None and decoded["seed"] == 0
    assert " " not in text
    assert parse_assignment(text) == a


def test_a_blocking_checkpoint_travels_and_the_default_is_asynchronous() -> None:
    """``asynchronous`` is written only when false (true is what a reader assumes)."""
    a = parse_assignment(wire())
    assert a.checkpoint.asynchronous
    blocking = replace(a, checkpoint=replace(a.checkpoint, asynchronous=False))
    decoded = json.loads(blocking.to_json())
    assert decoded["checkpoint"]["asynchronous"] is False
    assert parse_assignment(blocking.to_json()).checkpoint.asynchronous is False
    assert "asynchronous" not in json.loads(a.to_json())["checkpoint"]


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
        ({"precision": "fp8"}, "precision: expected one of ('bf16', 'fp16', 'fp32'), got 'fp8'"),
        ({"gpus": -1}, "gpus: must be >= 0, got -1"),
        ({"gpus": True}, "gpus: expected an integer"),
        ({"gpus": 5000}, "gpus: 5000 is above the bound 1024"),
        ({"globalBatchSize": 30}, "batchShares: sums to 32"),
        ({"worldVersion": "3"}, "worldVersion: expected an integer"),
        ({"stop": 1}, "stop: expected bool"),
        ({"apiVersion": "v2"}, "apiVersion"),
        ({"job": "a/b"}, "job"),
        ({"checkpoint": {"path": ""}}, "checkpoint.path"),
        (
            {"checkpoint": {"path": "/ckpt", "asynchronous": "no"}},
            "checkpoint.asynchronous: expected bool",
        ),
        # hostile inputs: bounded, and never a path outside the claim
        ({"checkpoint": {"path": "../../etc"}}, "checkpoint.path: expected an absolute path"),
        ({"checkpoint": {"path": "/ckpt/../../etc"}}, "without '..'"),
        ({"checkpoint": {"path": "relative/ckpt"}}, "checkpoint.path: expected an absolute"),
        ({"checkpoint": {"path": "/ckpt\0/x"}}, "checkpoint.path: contains a NUL"),
        ({"checkpoint": {"path": "/" + "c" * 5000}}, "checkpoint.path: 5001 characters"),
        ({"job": "j" * 300}, "job: 300 characters, at most 253"),
        ({"job": ".."}, "job: expected a non-empty name"),
        ({"job": "a\0b"}, "job: contains a NUL"),
        ({"masterAddr": "m" * 300}, "masterAddr: 300 characters"),
        ({"plan": {"dp": 4, "batchShares": [1] * 200_000}}, "plan.batchShares: 200000 entries"),
        ({"plan": {"dp": 4, "ranks": [{}] * 200_000}}, "plan.ranks: has 200000 entries"),
        ({"plan": {"dp": 1, "pp": 4, "virtualStages": 10**9}}, "plan.virtualStages: 1000000000"),
        (
            {
                "worldSize": 2,
                "rank": 0,
                "plan": {
                    "dp": 1,
                    "pp": 2,
                    "virtualStages": 65536,
                    "stages": [{"layers": [0, 0]}] * 131_072,
                },
            },
            "plan.stages: 131072 entries",
        ),
    ],
)
def test_bad_fields_are_named(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(AssignmentError, match=re.escape(message)):
        parse_assignment(wire(**changes))


@pytest.mark.parametrize(
    ("changes", "precision", "gpus"),
    [
        ({"precision": "bf16", "gpus": 8}, "bf16", 8),
        ({"precision": "fp16", "gpus": 0}, "fp16", 0),
        ({}, "fp32", 0),  # an operator from before the fields: fp32 on whatever device
    ],
)
def test_precision_and_gpus_travel_and_default_to_what_was_before(
    changes: dict[str, Any], precision: str, gpus: int
) -> None:
    a = parse_assignment(wire(**changes))
    assert (a.precision, a.gpus) == (precision, gpus)
    assert (json.loads(a.to_json())["precision"], json.loads(a.to_json())["gpus"]) == (
        precision,
        gpus,
    )
    assert parse_assignment(a.to_json()) == a


def test_checkpoint_path_is_normalised() -> None:
    a = parse_assignment(wire(checkpoint={"path": "/ckpt//jobs/./a/"}))
    assert a.checkpoint.path == "/ckpt/jobs/a"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[" * 50_000 + "]" * 50_000, "not valid JSON"),  # RecursionError inside json
        (b"{\xff\xfe}", "not UTF-8"),
        ("1" * 5000, "not valid JSON"),  # int() digit limit: ValueError inside json
        (None, "cannot read it: Is a directory"),
        (b" " * (2 << 20), "larger than"),
    ],
)
def test_an_unreadable_file_is_an_assignment_error(
    tmp_path: Path, content: str | bytes | None, message: str
) -> None:
    f = tmp_path / "assignment"
    if content is None:
        f.mkdir()
    elif isinstance(content, bytes):
        f.write_bytes(content)
    else:
        f.write_text(content)
    with pytest.raises(AssignmentError, match=re.escape(message)):
        read_assignment_file(f)


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
    assert a.checkpoint.path == str(Path("checkpoints").resolve())  # relative: from the cwd
    with pytest.raises(AssignmentError, match="WORLD_SIZE"):
        assignment_from_env({"WORLD_SIZE": "two"})
    a = assignment_from_env({**env, "ELASTRA_PRECISION": "bf16", "ELASTRA_POD_GPUS": "2"})
    assert (a.precision, a.gpus) == ("bf16", 2)
