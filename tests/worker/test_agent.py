"""The agent: assignment watching, stop requests, SIGTERM, exit codes and metrics.

The first tests use a fake trainer (a few lines of Python, no torch) to pin the protocol fast;
the last one runs the real example in a world of two pods driven through assignment files.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from elastra_worker import exitcodes
from elastra_worker.launcher import free_port
from elastra_worker.layout import CheckpointRoot
from elastra_worker.standby import warm_command

from .conftest import EXAMPLE, quiet_env, wait_for

FAKE_TRAINER = textwrap.dedent(
    """
    import json, os, pathlib, sys, time
    control = pathlib.Path(os.environ["ELASTRA_CONTROL_DIR"])
    (control / "progress-0.json").write_text(json.dumps(
        {"step": 5, "loss": 1.5, "samplesPerSecond": 10.0, "lastCheckpointStep": 4,
         "worldVersion": int(os.environ["ELASTRA_WORLD_VERSION"])}))
    deadline = time.monotonic() + 60
    while not (control / "stop").exists():
        if time.monotonic() > deadline:
            sys.exit(9)
        time.sleep(0.02)
    (control / "status-0.json").write_text(json.dumps(
        {"state": "stopped", "step": 5, "checkpointStep": 5,
         "worldVersion": int(os.environ["ELASTRA_WORLD_VERSION"])}))
    """
)


def assignment(version: int, *, rank: int = 0, size: int = 1, port: int = 1, **kw: Any) -> str:
    return json.dumps(
        {
            "job": "t", "worldVersion": version, "rank": rank, "worldSize": size,
            "masterAddr": "127.0.0.1", "masterPort": port, "globalBatchSize": 24,
            "plan": {"dp": size, "microBatchSize": 2}, "checkpoint": {"path": kw.pop("ckpt", "/x")},
            **kw,
        }
    )  # fmt: skip


def start_agent(pod: Path, command: list[str], *, metrics_port: int = 0) -> subprocess.Popen[str]:
    pod.mkdir(parents=True, exist_ok=True)
    env = quiet_env()
    env.update(
        {
            "ELASTRA_ASSIGNMENT_FILE": str(pod / "assignment"),
            "ELASTRA_METRICS_PORT": str(metrics_port),
            "ELASTRA_STEP_LOG": str(pod.parent / "steps.jsonl"),
        }
    )
    cmd = [sys.executable, "-m", "elastra_worker.cli", "run", "--control-dir", str(pod / "ctl"),
           "--state-file", str(pod / "agent.json"), "--grace", "20", "--", *command]  # fmt: skip
    return subprocess.Popen(cmd, env=env, text=True)


def write(pod: Path, text: str) -> None:
    tmp = pod / ".assignment.tmp"
    tmp.write_text(text)
    tmp.replace(pod / "assignment")


def agent_state(pod: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((pod / "agent.json").read_text()))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def test_bad_assignment_is_a_permanent_error(tmp_path: Path) -> None:
    (tmp_path / "assignment").write_text('{"job": "t", "worldVersion": 1, "worldSize": "two"}')
    proc = start_agent(tmp_path, [sys.executable, "-c", "pass"])
    assert proc.wait(timeout=60) == exitcodes.CONFIG


def test_crashed_trainer_is_retryable(tmp_path: Path) -> None:
    write(tmp_path, assignment(1, port=free_port()))
    proc = start_agent(tmp_path, [sys.executable, "-c", "raise SystemExit(3)"])
    assert proc.wait(timeout=60) == exitcodes.RETRYABLE


def test_waits_then_runs_serves_metrics_and_stops_on_request(tmp_path: Path) -> None:
    port = free_port()
    proc = start_agent(tmp_path, [sys.executable, "-c", FAKE_TRAINER], metrics_port=port)
    try:
        write(tmp_path, assignment(0, size=0))  # in no world yet: keeps waiting
        wait_for(lambda: agent_state(tmp_path).get("phase") == "waiting", 30, "a waiting agent")
        write(tmp_path, assignment(3, port=free_port()))
        wait_for((tmp_path / "ctl" / "progress-0.json").exists, 60, "trainer progress")

        def scrape() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                return str(resp.read().decode())

        wait_for(lambda: "elastra_worker_world_version 3.0" in scrape(), 30, "metrics")
        text = scrape()
        assert "elastra_worker_step 5.0" in text
        assert "elastra_worker_last_checkpoint_step 4.0" in text
        write(tmp_path, assignment(4, stop=True))
        assert proc.wait(timeout=60) == exitcodes.OK
        assert agent_state(tmp_path)["phase"] == "stopped"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_resize_through_assignment_files_then_sigterm(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    pods = [tmp_path / "pod0", tmp_path / "pod1"]
    command = [sys.executable, str(EXAMPLE), "--dataset-size", "500"]
    port = free_port()
    for rank, pod in enumerate(pods):
        pod.mkdir()
        write(pod, assignment(1, rank=rank, size=2, port=port, ckpt=str(ckpt), consistency="data"))
    procs = [start_agent(pod, command) for pod in pods]
    steps = tmp_path / "steps.jsonl"

    def records() -> list[dict[str, Any]]:
        if not steps.exists():
            return []
        return [json.loads(line) for line in steps.read_text().splitlines() if line.strip()]

    try:
        wait_for(lambda: len(records()) >= 3, 180, "three steps in world version 1")
        # The operator's resize: version 2 keeps pod 0 alone, pod 1 leaves.
        write(pods[0], assignment(2, size=1, port=free_port(), ckpt=str(ckpt), consistency="data"))
        write(pods[1], assignment(2, stop=True))
        assert procs[1].wait(timeout=120) == exitcodes.OK
        wait_for(lambda: any(r["worldVersion"] == 2 for r in records()), 180, "version 2 steps")
        by_version = {r["step"]: r["worldVersion"] for r in records()}
        stop_step = min(k for k, v in by_version.items() if v == 2)
        assert sorted(by_version) == list(range(len(by_version)))  # no step lost or repeated
        assert all(v == 1 for k, v in by_version.items() if k < stop_step)

        # Preemption: SIGTERM -> checkpoint of the current step, exit 0, within the grace.
        wait_for(lambda: len(records()) >= stop_step + 2, 120, "steps in version 2")
        started = time.monotonic()
        procs[0].send_signal(signal.SIGTERM)
        assert procs[0].wait(timeout=60) == exitcodes.OK
        assert time.monotonic() - started < 20
        root = CheckpointRoot(ckpt, job="t")
        last = max(r["step"] for r in records())
        assert root.latest_step() == last + 1
        manifest = root.check_structure(last + 1)
        root.check_hashes(last + 1, list(manifest.files))
        assert stop_step in root.committed_steps()  # the resize's checkpoint
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_only_own_interpreter_scripts_start_warm(tmp_path: Path) -> None:
    exe = sys.executable
    assert warm_command([exe, "train.py", "--steps", "3"]) == ["train.py", "--steps", "3"]
    assert warm_command([exe, "-m", "pkg.train", "-x"]) == ["-m", "pkg.train", "-x"]
    assert warm_command([exe, "-u", "train.py"]) is None  # interpreter options: start cold
    assert warm_command(["bash", "train.sh"]) is None
    other = tmp_path / "bin" / "python"
    other.parent.mkdir()
    other.symlink_to(exe)  # another virtual environment's python: start cold
    assert warm_command([str(other), "train.py"]) is None
