"""session/world.py: what the environment gives a Session, and the plans a world refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from elastra_worker.assignment import assignment_from_env, parse_assignment
from elastra_worker.control import CONTROL_DIR_ENV
from elastra_worker.errors import PermanentError
from elastra_worker.session.world import (
    ASSIGNMENT_JSON_ENV,
    STEP_LOG_ENV,
    World,
    arguments_from_env,
)


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
