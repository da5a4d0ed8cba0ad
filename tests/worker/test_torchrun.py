"""torchrun compatibility: the variables a plain script gets, and a plain DDP script made elastic.

The last test is the done-when of torchrun mode: ``examples/torchrun_ddp.py`` (no Elastra
import) runs under ``elastra-worker local --launch torchrun`` through two resizes at times and
finishes every step, none lost beyond its checkpoints.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from elastra_worker.assignment import parse_assignment
from elastra_worker.layout import CheckpointRoot
from elastra_worker.lifeline import PARENT_PID_ENV
from elastra_worker.objectstore import ObjectCheckpointRoot
from elastra_worker.torchrun import launch_from_env, torchrun_env

from .conftest import REPO, quiet_env

EXAMPLE = REPO / "examples" / "torchrun_ddp.py"


def test_torchrun_env_is_torchruns_for_each_local_rank() -> None:
    wire = {"job": "gpt", "worldVersion": 7, "rank": 4, "worldSize": 8, "localWorldSize": 2,
            "masterAddr": "gpt-w-0.gpt", "masterPort": 29507, "globalBatchSize": 64,
            "checkpoint": {"path": "/ckpt"}, "precision": "bf16", "gpus": 2}  # fmt: skip
    a = parse_assignment(wire)
    base = {"PATH": "/bin", "TORCHELASTIC_USE_AGENT_STORE": "True", "ELASTRA_MAX_RESTARTS": "3",
            "ELASTRA_ASSIGNMENT_JSON": "{}", "ELASTRA_CONTROL_DIR": "/ctl"}  # fmt: skip
    progress = Path("/ctl/progress-1.json")
    env = torchrun_env(base, a, local_rank=1, restart_count=2, progress_file=progress)
    assert env == {
        "PATH": "/bin", "ELASTRA_MAX_RESTARTS": "3",
        "RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "2", "GROUP_WORLD_SIZE": "4", "ROLE_NAME": "default", "ROLE_RANK": "5",
        "ROLE_WORLD_SIZE": "8", "MASTER_ADDR": "gpt-w-0.gpt", "MASTER_PORT": "29507",
        "TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_MAX_RESTARTS": "3",
        "TORCHELASTIC_RUN_ID": "gpt", "ELASTRA_CHECKPOINT_DIR": "/ckpt/gpt",
        "ELASTRA_WORLD_VERSION": "7", "ELASTRA_GLOBAL_BATCH_SIZE": "64", "ELASTRA_JOB": "gpt",
        "ELASTRA_PRECISION": "bf16", "ELASTRA_POD_GPUS": "2", PARENT_PID_ENV: str(os.getpid()),
        "ELASTRA_PROGRESS_FILE": "/ctl/progress-1.json",
    }  # fmt: skip


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine whose torch sees no GPU")
def test_a_gpu_pod_without_gpus_never_starts_the_script(tmp_path: Path) -> None:
    """The wrapper checks the pod's GPUs before it execs the script: exit 2 and the line."""
    message = tmp_path / "termination-log"
    message.touch()
    env = {**quiet_env(), "ELASTRA_POD_GPUS": "1", "ELASTRA_TERMINATION_LOG": str(message)}
    out = subprocess.run(
        [sys.executable, "-m", "elastra_worker.torchrun", "echo", "started"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "started" not in out.stdout
    assert message.read_text().startswith("worker.gpus is 1 but ")
    env["ELASTRA_POD_GPUS"] = "0"  # a CPU pod: no check, no torch import
    out = subprocess.run(
        [sys.executable, "-m", "elastra_worker.torchrun", "echo", "started"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert (out.returncode, out.stdout) == (0, "started\n")


@pytest.mark.parametrize(
    ("job", "checkpoint", "folder", "uri"),
    [
        ("gpt", {"path": "/claim"}, "/claim/gpt", None),
        ("bert", {"path": "/claim"}, "/claim/bert", None),  # same claim: a folder of its own
        ("gpt", {"path": "/ckpt", "uri": "s3://bucket/runs"}, "/ckpt/gpt", "s3://bucket/runs/gpt"),
        ("gpt", {"path": "/ckpt", "uri": "s3://bucket"}, "/ckpt/gpt", "s3://bucket/gpt"),
    ],
)
def test_the_script_checkpoints_in_the_jobs_own_folder_and_prefix_as_the_session_does(
    job: str, checkpoint: dict[str, str], folder: str, uri: str | None
) -> None:
    """``ELASTRA_CHECKPOINT_DIR`` is the Session's root for the job (``CheckpointRoot``); with
    ``checkpoint.uri`` it is the local staging folder and ``ELASTRA_CHECKPOINT_URI`` the job's
    prefix, the Session's ``ObjectCheckpointRoot``."""
    wire = {"job": job, "worldVersion": 1, "rank": 0, "worldSize": 1, "localWorldSize": 1,
            "masterAddr": "a", "masterPort": 29500, "globalBatchSize": 8,
            "checkpoint": checkpoint}  # fmt: skip
    a = parse_assignment(wire)
    env = torchrun_env({}, a, local_rank=0, restart_count=0, progress_file=Path("/ctl/p.json"))
    assert env["ELASTRA_CHECKPOINT_DIR"] == folder
    assert folder == str(CheckpointRoot(checkpoint["path"], job=job).path)
    assert env.get("ELASTRA_CHECKPOINT_URI") == uri
    if uri is not None:
        assert uri == ObjectCheckpointRoot(checkpoint["uri"], job=job).uri


def test_launch_mode_comes_from_the_environment() -> None:
    assert launch_from_env({}) == "elastra"
    assert launch_from_env({"ELASTRA_LAUNCH": "torchrun"}) == "torchrun"
    with pytest.raises(ValueError, match=r"\$ELASTRA_LAUNCH: expected one of elastra, torchrun"):
        launch_from_env({"ELASTRA_LAUNCH": "mpirun"})


STEPS = 150
"""At 0.2 s a step, 30 s of training at least: the world of two after 30 s still has steps."""


@pytest.mark.slow
def test_plain_ddp_script_resizes_2_1_2_at_times_and_loses_no_step(tmp_path: Path) -> None:
    log = tmp_path / "steps.jsonl"
    cmd = [sys.executable, "-m", "elastra_worker.cli", "local", "--launch", "torchrun",
           "--schedule", "2:0,1:10s,2:30s", "--steps", str(STEPS),
           "--checkpoint-dir", str(tmp_path / "ckpt"), "--log", str(log), "--world-timeout", "90",
           "--work-dir", str(tmp_path / "pods"),
           "--", sys.executable, str(EXAMPLE), "--steps", str(STEPS),
           "--step-seconds", "0.2"]  # fmt: skip
    try:
        proc = subprocess.run(
            cmd, env=quiet_env(), capture_output=True, text=True, timeout=240, check=False
        )
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"elastra-worker local hung: {err.stderr!r:.3000}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    # Every step exactly once: a world resumes where the last one checkpointed.
    assert [r["step"] for r in records] == list(range(STEPS)), proc.stderr[-3000:]
    worlds = [k for k, _ in itertools.groupby((r["worldVersion"], r["worldSize"]) for r in records)]
    assert [size for _, size in worlds] == [2, 1, 2], worlds
    assert [version for version, _ in worlds] == [1, 2, 3]
    for version, _ in worlds[1:]:  # each later world starts at its predecessor's last step + 1
        first = next(r for r in records if r["worldVersion"] == version)
        assert first["resumedFrom"] == first["step"]
    assert records[-1]["loss"] < records[0]["loss"]
    assert "job done" in proc.stderr
    # The script's own report (ELASTRA_PROGRESS_FILE) is what the agent serves as metrics.
    report = json.loads((tmp_path / "pods" / "pod-0" / "control" / "progress-0.json").read_text())
    assert (report["step"], report["loss"]) == (STEPS, records[-1]["loss"])
    assert 0 < report["samplesPerSecond"] <= 32 / 0.2  # the launcher's batch of 32, steps >= 0.2 s
