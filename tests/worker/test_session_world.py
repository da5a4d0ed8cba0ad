"""session/world.py: what the environment gives a Session, and the plans a world refuses."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from elastra_worker.assignment import assignment_from_env, parse_assignment
from elastra_worker.control import CONTROL_DIR_ENV
from elastra_worker.errors import GLOO_TRANSPORT, PermanentError
from elastra_worker.launcher import free_port
from elastra_worker.session.world import (
    ASSIGNMENT_JSON_ENV,
    STEP_LOG_ENV,
    World,
    arguments_from_env,
)

from .distributed import run_world


def test_the_agents_environment_names_assignment_rank_folders_and_timeouts(
    tmp_path: Path,
) -> None:
    raw = {"job": "j", "worldVersion": 3, "rank": 2, "worldSize": 4, "localWorldSize": 2,
           "masterAddr": "127.0.0.1", "masterPort": 29511, "globalBatchSize": 8,
           "plan": {"dp": 4, "microBatchSize": 2},
           "checkpoint": {"path": str(tmp_path)}}  # fmt: skip
    env = {ASSIGNMENT_JSON_ENV: parse_assignment(raw).to_json(), "LOCAL_RANK": "1",
           CONTROL_DIR_ENV: str(tmp_path / "control"), STEP_LOG_ENV: str(tmp_path / "s.jsonl"),
           "ELASTRA_RENDEZVOUS_TIMEOUT": "12.5", "ELASTRA_COLLECTIVE_TIMEOUT": "30"}  # fmt: skip
    assignment, args = arguments_from_env(env)
    assert (assignment.job, assignment.world_version, assignment.rank) == ("j", 3, 2)
    assert args["local_rank"] == 1
    assert args["control"].path == tmp_path / "control"
    assert args["step_log"] == tmp_path / "s.jsonl"
    assert (args["rendezvous_timeout_s"], args["collective_timeout_s"]) == (12.5, 30.0)


def test_an_empty_environment_is_a_world_of_one_with_the_default_timeouts() -> None:
    assignment, args = arguments_from_env({})
    assert (assignment.rank, assignment.world_size, args["local_rank"]) == (0, 1, 0)
    assert args["control"] is None and args["step_log"] is None
    assert "rendezvous_timeout_s" not in args and "collective_timeout_s" not in args


def test_a_world_knows_its_coordinates_and_refuses_bitwise_over_a_mesh(tmp_path: Path) -> None:
    env = {"RANK": "3", "WORLD_SIZE": "4", "ELASTRA_GLOBAL_BATCH_SIZE": "8"}
    world = World(assignment_from_env(env), local_rank=0, device=torch.device("cpu"),
                  rendezvous_timeout_s=1, collective_timeout_s=1)  # fmt: skip
    assert (world.rank, world.dp_rank, world.backend) == (3, 3, "gloo")
    with pytest.raises(RuntimeError, match="not started"):
        world.mesh  # noqa: B018 - the property is what is tested
    bitwise = parse_assignment({"job": "j", "worldVersion": 1, "rank": 0, "worldSize": 2,
                                "masterAddr": "127.0.0.1", "masterPort": 1, "globalBatchSize": 4,
                                "consistency": "bitwise", "checkpoint": {"path": str(tmp_path)},
                                "plan": {"dp": 1, "tp": 2, "microBatchSize": 2}})  # fmt: skip
    with pytest.raises(PermanentError, match="consistency bitwise is data parallel only"):
        World(bitwise, local_rank=0, device=torch.device("cpu"), rendezvous_timeout_s=1,
              collective_timeout_s=1)  # fmt: skip


BLOCKED_S, TIMEOUT_S = 6.0, 2.0


def _late_member(rank: int, world: int, port: int) -> str:
    """Rank 1 comes late, past the world's collective timeout, to a barrier on a group with a
    longer one (which waits for it: a timeout there fails the test) and then to an all-reduce
    on the world's group: what the all-reduce said."""
    a = parse_assignment({"job": "late", "worldVersion": 1, "rank": rank, "worldSize": world,
                          "masterAddr": "127.0.0.1", "masterPort": port, "globalBatchSize": 2,
                          "plan": {"microBatchSize": 1},
                          "checkpoint": {"path": "/unused"}})  # fmt: skip
    w = World(a, local_rank=0, device=torch.device("cpu"), rendezvous_timeout_s=60,
              collective_timeout_s=TIMEOUT_S)  # fmt: skip
    w.join()
    patient = w.gloo_group(timeout_s=60)
    if rank == 1:
        time.sleep(BLOCKED_S)  # the fault: a member that blocks without closing a connection
    dist.barrier(group=patient)
    if rank == 1:
        time.sleep(BLOCKED_S)
    try:
        dist.all_reduce(torch.zeros(1))
    except RuntimeError as err:
        return str(err)
    return "completed"


def test_a_collective_blocked_past_the_collective_timeout_fails_as_a_lost_peer() -> None:
    results = run_world(_late_member, 2, free_port(), timeout=120, form_world=False)
    said = results[0]
    assert GLOO_TRANSPORT in said and "Timed out" in said, said
