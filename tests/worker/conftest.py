"""Helpers for the multi-process tests: run the local launcher and read its step log.

Every run has a deadline (a hang fails the test instead of blocking CI) and one intra-op thread
per process, because these machines are shared.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from elastra_worker.stalls import STALL_DUMP_ENV

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "worker_image" / "examples" / "train_tiny_gpt.py"
STEPS = 21  # every bitwise run in these tests trains 21 steps of the same job


def quiet_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({"ELASTRA_THREADS": "1", "OMP_NUM_THREADS": "1", "ELASTRA_METRICS_PORT": "0"})
    # a trainer that makes no step for a minute writes its stacks to the run's output, inside
    # the launcher's world timeout (120 s), so a hung test says where its ranks wait
    env.setdefault(STALL_DUMP_ENV, "60")
    return env


@dataclass
class LocalRun:
    """The outcome of one ``elastra-worker local`` run."""

    returncode: int
    records: list[dict[str, Any]]
    output: str

    def by_step(self) -> dict[int, dict[str, Any]]:
        return {r["step"]: r for r in self.records}

    def notable(self) -> str:
        """The output's lines that say why a world was formed again or a step trained twice
        (failures, kills, restores, restarts), for an assertion's message."""
        lines = [line for line in self.output.splitlines() if _NOTABLE.search(line)]
        return "\n".join(lines)[-4000:]


_NOTABLE = re.compile(r"fail|kill|restor|restart|unreadable|did not|skipped|timed out", re.I)


def run_local(
    tmp: Path,
    schedule: str,
    *,
    consistency: str = "bitwise",
    steps: int = STEPS,
    extra: Sequence[str] = (),
    checkpoint_dir: Path | None = None,
    script_args: Sequence[str] = (),
    trainer: Sequence[str] | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 300,
) -> LocalRun:
    """Run the example (or ``python TRAINER...``) under the local launcher; fail on a timeout."""
    tmp.mkdir(parents=True, exist_ok=True)
    log = tmp / "steps.jsonl"
    cmd = [
        sys.executable, "-m", "elastra_worker.cli", "local",
        "--schedule", schedule, "--steps", str(steps),
        "--checkpoint-dir", str(checkpoint_dir or tmp / "ckpt"),
        "--consistency", consistency, "--log", str(log),
        "--world-timeout", "120", "--global-batch-size", "24", "--micro-batch-size", "2",
        *extra, "--", sys.executable,
        *(trainer or (str(EXAMPLE), "--dataset-size", "500", *script_args)),
    ]  # fmt: skip
    try:
        proc = subprocess.run(
            cmd,
            env={**quiet_env(), **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"elastra-worker local hung past {timeout}s: {err.stderr!r:.3000}")
    records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return LocalRun(proc.returncode, records, proc.stdout + proc.stderr)


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``cond`` until true; fail with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(scope="session")
def static_run(tmp_path_factory: pytest.TempPathFactory) -> LocalRun:
    """The reference: 4 ranks, no resize, bitwise mode."""
    run = run_local(tmp_path_factory.mktemp("static"), "4:0")
    assert run.returncode == 0, run.output[-3000:]
    assert [r["step"] for r in run.records] == list(range(STEPS))
    return run
