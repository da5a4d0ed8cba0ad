"""The local elastic launcher: plays the operator on one machine, no Kubernetes.

``elastra-worker local --schedule 4:0,2:20,3:40 --steps 60 ...`` starts one agent process per
"pod" (``elastra-worker run``, the container entry point) and drives them only through their
assignment files, exactly as the operator drives pods through the annotation: each resize is a
new world version with a fresh master port, pods that leave get ``worldSize: 0`` and wait
(their agents keep a warm standby trainer), pods that join are started, and at the end every pod
gets ``stop: true``. A world is told to stop at the next resize step (``stopAtStep``), so a schedule
lands on exact steps and the step log reads the same on every run.

``--fail RANK@STEP`` kills one trainer with SIGKILL in the middle of that step (``--fail-in-save``
while it writes the checkpoint of that step). The launcher then does what the operator does for
a failed pod: a new world version for the same size, a fresh agent for the failed pod, and the
new world resumes from the last good checkpoint.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import exitcodes
from .assignment import API_VERSION, KIND, Consistency
from .faults import KILL_AT_STEP_ENV, KILL_IN_SAVE_ENV
from .lifeline import PARENT_PID_ENV

log = logging.getLogger(__name__)


class LaunchError(RuntimeError):
    """The local run could not finish; the message says where it got stuck."""


@dataclass(frozen=True)
class Segment:
    """World size ``size`` from step ``start`` until step ``end``."""

    size: int
    start: int
    end: int


def parse_schedule(text: str, steps: int) -> list[Segment]:
    """``SIZE:STEP[,SIZE:STEP...]`` -> segments; the first must start at step 0."""
    points: list[tuple[int, int]] = []
    for part in text.split(","):
        try:
            size_s, step_s = part.split(":")
            size, step = int(size_s), int(step_s)
        except ValueError as err:
            raise ValueError(f"schedule entry {part!r}: expected SIZE:STEP") from err
        if size < 1 or step < 0:
            raise ValueError(f"schedule entry {part!r}: size >= 1 and step >= 0")
        points.append((size, step))
    if not points or points[0][1] != 0:
        raise ValueError("schedule must start at step 0, e.g. 4:0,2:20")
    if any(b[1] <= a[1] for a, b in itertools.pairwise(points)):
        raise ValueError("schedule steps must increase")
    if points[-1][1] >= steps:
        raise ValueError(f"schedule step {points[-1][1]} is not below --steps {steps}")
    ends = [p[1] for p in points[1:]] + [steps]
    return [Segment(size, start, end) for (size, start), end in zip(points, ends, strict=True)]


def parse_fault(text: str | None) -> tuple[int, int] | None:
    """``RANK@STEP`` -> (rank, step)."""
    if not text:
        return None
    try:
        rank_s, step_s = text.split("@")
        return int(rank_s), int(step_s)
    except ValueError as err:
        raise ValueError(f"fault {text!r}: expected RANK@STEP") from err


def even_shares(global_batch: int, dp: int, micro: int) -> list[int]:
    """Split the global batch over ``dp`` ranks in whole logical shares, as evenly as possible."""
    if global_batch % micro:
        raise ValueError(f"global batch {global_batch} is not a multiple of micro batch {micro}")
    logical = global_batch // micro
    if dp > logical:
        raise ValueError(f"{dp} ranks but only {logical} logical shares of {micro}")
    base, rest = divmod(logical, dp)
    return [(base + (1 if r < rest else 0)) * micro for r in range(dp)]


def free_port() -> int:
    """A port nobody listens on right now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LocalJob:
    """Everything ``elastra-worker local`` was asked to do."""

    command: Sequence[str]
    schedule: list[Segment]
    steps: int
    checkpoint_dir: Path
    log_file: Path
    consistency: Consistency = "none"
    global_batch_size: int = 32
    micro_batch_size: int = 2
    seed: int = 0
    checkpoint_every: int = 0
    fail: tuple[int, int] | None = None
    fail_in_save: tuple[int, int] | None = None
    world_timeout_s: float = 600.0
    job: str = "local"
    work_dir: Path | None = None
    extra_env: dict[str, str] = field(default_factory=dict)


@dataclass
class _Pod:
    index: int
    dir: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def assignment_file(self) -> Path:
        return self.dir / "assignment.json"

    @property
    def state_file(self) -> Path:
        return self.dir / "agent.json"

    def agent_state(self) -> dict[str, Any]:
        try:
            raw = json.loads(self.state_file.read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError):
            return {}
        return raw if isinstance(raw, dict) else {}

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class LocalLauncher:
    """Runs a ``LocalJob`` (see the module docstring); ``run()`` returns the exit code."""

    def __init__(self, job: LocalJob) -> None:
        self.job = job
        self._own_work_dir = job.work_dir is None
        self.work_dir = job.work_dir or Path(tempfile.mkdtemp(prefix="elastra-local-"))
        self.pods: dict[int, _Pod] = {}
        self.version = 0
        self._faults_pending = {"step": job.fail, "save": job.fail_in_save}
        self.failures = 0

    # ---- the operator's half ------------------------------------------------------------------

    def _write(self, pod: _Pod, obj: dict[str, Any]) -> None:
        tmp = pod.assignment_file.with_name(".assignment.tmp")
        tmp.write_text(json.dumps(obj), encoding="utf-8")
        os.replace(tmp, pod.assignment_file)  # atomic, like the kubelet's symlink swap

    def _assign(self, seg: Segment, port: int) -> None:
        j = self.job
        shares = even_shares(j.global_batch_size, seg.size, j.micro_batch_size)
        for index, pod in sorted(self.pods.items()):
            base = {"apiVersion": API_VERSION, "kind": KIND, "job": j.job}
            if index >= seg.size:  # not in this world: the pod waits (its agent stays warm)
                self._write(pod, {**base, "worldVersion": self.version, "worldSize": 0})
                continue
            self._write(
                pod,
                {
                    **base,
                    "worldVersion": self.version,
                    "rank": index,
                    "worldSize": seg.size,
                    "masterAddr": "127.0.0.1",
                    "masterPort": port,
                    "localWorldSize": 1,
                    "plan": {
                        "dp": seg.size,
                        "tp": 1,
                        "pp": 1,
                        "microBatchSize": j.micro_batch_size,
                        "batchShares": shares,
                    },
                    "globalBatchSize": j.global_batch_size,
                    "consistency": j.consistency,
                    "seed": j.seed,
                    "checkpoint": {
                        "path": str(j.checkpoint_dir),
                        "intervalSeconds": 0,
                        "keep": 3,
                        "intervalSteps": j.checkpoint_every,
                    },
                    "stopAtStep": seg.end,
                    "stop": False,
                },
            )

    def _start_agent(self, pod: _Pod) -> None:
        env = dict(os.environ)
        env.update(
            {
                "ELASTRA_ASSIGNMENT_FILE": str(pod.assignment_file),
                PARENT_PID_ENV: str(os.getpid()),
                "ELASTRA_STEP_LOG": str(self.job.log_file),
                "ELASTRA_METRICS_PORT": "0",
                "ELASTRA_THREADS": env.get("ELASTRA_THREADS", "1"),
                "ELASTRA_RENDEZVOUS_TIMEOUT": str(int(self.job.world_timeout_s)),
                "ELASTRA_COLLECTIVE_TIMEOUT": str(int(self.job.world_timeout_s)),
            }
        )
        env.update(self.job.extra_env)
        for key, env_name in (("step", KILL_AT_STEP_ENV), ("save", KILL_IN_SAVE_ENV)):
            env.pop(env_name, None)
            fault = self._faults_pending[key]
            if fault is not None and fault[0] == pod.index:
                env[env_name] = str(fault[1])
        pod.state_file.unlink(missing_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "elastra_worker.cli",
            "run",
            "--control-dir",
            str(pod.dir / "control"),
            "--state-file",
            str(pod.state_file),
            "--stop-timeout",
            "60",
            "--",
            *self.job.command,
        ]
        pod.proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        pod.starts += 1

    def _pod(self, index: int) -> _Pod:
        if index not in self.pods:
            d = self.work_dir / f"pod-{index}"
            d.mkdir(parents=True, exist_ok=True)
            self.pods[index] = _Pod(index=index, dir=d)
        return self.pods[index]

    def _new_world(self, seg: Segment) -> None:
        self.version += 1
        for i in range(seg.size):
            self._pod(i)
        self._assign(seg, free_port())
        for i in range(seg.size):
            if not self.pods[i].alive():
                self._start_agent(self.pods[i])
        log.info(
            "world version %d: %d ranks, steps %d..%d", self.version, seg.size, seg.start, seg.end
        )

    def _world_state(self, seg: Segment) -> str:
        """'running', 'finished' (every member stopped/done in this version) or 'failed'."""
        finished = True
        for i in range(seg.size):
            pod = self.pods[i]
            st = pod.agent_state()
            if pod.proc is not None and pod.proc.poll() not in (None, 0):
                return "failed"
            # after its trainers stop, an agent reports "stopped", then "waiting" for a new world
            ended = st.get("phase") in ("stopped", "done", "waiting")
            if st.get("worldVersion") != self.version or not ended:
                finished = False
        return "finished" if finished else "running"

    def _consume_faults(self) -> None:
        """A fault fires once: forget the faults of pods whose agent died."""
        for key, fault in self._faults_pending.items():
            if fault is not None:
                pod = self.pods.get(fault[0])
                if pod is not None and pod.proc is not None and pod.proc.poll() not in (None, 0):
                    self._faults_pending[key] = None

    def run(self) -> int:
        """Drive every segment of the schedule; return 0 when all steps are done."""
        self.job.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        self.job.log_file.parent.mkdir(parents=True, exist_ok=True)
        self.job.log_file.unlink(missing_ok=True)
        # SIGTERM (a CI deadline, Ctrl-C's cousin) still runs the cleanup below.
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
        try:
            for seg in self.job.schedule:
                self._run_segment(seg)
            self._stop_all()
            return exitcodes.OK
        finally:
            self._kill_all()
            if self._own_work_dir:
                shutil.rmtree(self.work_dir, ignore_errors=True)

    def _run_segment(self, seg: Segment) -> None:
        self._new_world(seg)
        deadline = time.monotonic() + self.job.world_timeout_s
        while True:
            state = self._world_state(seg)
            if state == "finished":
                return
            if state == "failed":
                self.failures += 1
                if self.failures > 5:
                    raise LaunchError("more than 5 failed worlds: giving up")
                log.warning("world version %d failed: starting a new one", self.version)
                self._consume_faults()
                self._new_world(seg)  # bump first, then restart the dead agents
                deadline = time.monotonic() + self.job.world_timeout_s
            if time.monotonic() > deadline:
                raise LaunchError(
                    f"world version {self.version} ({seg.size} ranks, steps {seg.start}.."
                    f"{seg.end}) did not finish within {self.job.world_timeout_s:.0f}s"
                )
            time.sleep(0.1)

    def _stop_all(self) -> None:
        self.version += 1
        base = {"apiVersion": API_VERSION, "kind": KIND, "job": self.job.job}
        for pod in self.pods.values():
            self._write(pod, {**base, "worldVersion": self.version, "stop": True})
        deadline = time.monotonic() + 60
        for pod in self.pods.values():
            if pod.proc is None:
                continue
            try:
                code = pod.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired as err:
                raise LaunchError(f"pod {pod.index}'s agent did not exit after stop") from err
            if code != 0:
                raise LaunchError(f"pod {pod.index}'s agent exited with {code} after stop")

    def _kill_all(self) -> None:
        """Leave nothing behind: each agent's group, then its trainers' groups (by pid)."""
        for pod in self.pods.values():
            if pod.proc is None or not pod.alive():
                continue  # an agent that exited has already reaped its trainers
            groups = [pod.proc.pid] + [int(pid) for pid in pod.agent_state().get("trainerPids", [])]
            for pgid in groups:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
            pod.proc.wait()
