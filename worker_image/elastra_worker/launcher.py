"""The local elastic launcher: plays the operator on one machine, no Kubernetes.

``elastra-worker local --schedule 4:0,2:20,3:40 --steps 60 ...`` starts one agent process per
"pod" (``elastra-worker run``, the container entry point) and drives them only through their
assignment files, exactly as the operator drives pods through the annotation: each resize (or
change of plan, ``4:20:tp=2``) is a new world version with a fresh master port, pods that leave
get ``worldSize: 0`` and wait (their agents keep a warm standby trainer), pods that join are
started, and at the end every pod gets ``stop: true``. A world is told to stop at the next
resize step (``stopAtStep``), so a schedule lands on exact steps and the step log reads the same
on every run; a resize at a time (``2:16s``) is written when that time comes. The schedule's
grammar and checks are in ``schedule.py``.

``--launch torchrun`` runs a plain torchrun script instead of a Session script: the agents start
it with torchrun's variables and SIGTERM it on every resize (``torchrun.py``). When every member
of a world reports its trainers finished, the job is done, whatever the schedule still holds.

``--fail RANK@STEP`` kills one trainer with SIGKILL in the middle of that step (``--fail-in-save``
while it writes the checkpoint of that step). The launcher then does what the operator does for
a failed pod: a new world version for the same size, a fresh agent for the failed pod, and the
new world resumes from the last good checkpoint; each ``--fail`` fires once in a run.
``--chaos SEED:P_STEP:P_SAVE`` makes every trainer die at random (``faults.py``), and
``--max-failed-worlds`` lets a run survive as many failed worlds as such a test injects.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
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
from typing import Any, Literal

from . import exitcodes
from .assignment import API_VERSION, DEFAULT_PRECISION, KIND, Consistency, Precision, plan_to_wire
from .errors import PermanentError
from .faults import CHAOS_ENV, FIRED_DIR_ENV, KILL_AT_STEP_ENV, KILL_IN_SAVE_ENV
from .lifeline import PARENT_PID_ENV
from .schedule import Segment, plan_for
from .torchrun import Launch

log = logging.getLogger(__name__)

MAX_FAILED_WORLDS = 5
# Phases an agent writes just before it exits (see Agent._loop); "stopped" is not one of them,
# because an agent also reports it between two worlds.
EXITING_PHASES = ("done", "failed", "terminated")
AGENT_EXIT_WAIT_S = 30.0

WorldState = Literal["running", "finished", "done", "failed", "invalid"]
SegmentEnd = Literal["stopped", "replaced", "done"]


class _StopFailedError(RuntimeError):
    """An agent exited with an error after the schedule's final stop (``Launcher._finish``)."""

    def __init__(self, message: str, pod: int) -> None:
        super().__init__(message)
        self.pod = pod


class LaunchError(RuntimeError):
    """The local run could not finish; the message says where it got stuck."""


def parse_fault(text: str | None) -> tuple[int, int] | None:
    """``RANK@STEP`` -> (rank, step)."""
    if not text:
        return None
    try:
        rank_s, step_s = text.split("@")
        return int(rank_s), int(step_s)
    except ValueError as err:
        raise ValueError(f"fault {text!r}: expected RANK@STEP") from err


LOW_PORTS = range(20000, 32000)
"""Where world master ports are picked: below Linux's ephemeral range (32768+), where gloo's
own connections live; a master port the kernel chose from that range was sometimes taken by
the time the new world's rank 0 bound it, and that world failed and had to be formed again."""


def free_port() -> int:
    """A port below the ephemeral range that nobody listens on right now."""
    return free_ports(1)


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive ports in ``LOW_PORTS`` that nobody listens on now."""
    span = len(LOW_PORTS) - count + 1
    start = random.randrange(span)
    for offset in range(span):
        base = LOW_PORTS.start + (start + offset) % span
        if all(_port_free(port) for port in range(base, base + count)):
            return base
    raise LaunchError(f"no {count} free ports in {LOW_PORTS.start}..{LOW_PORTS.stop - 1}")


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass
class LocalJob:
    """Everything ``elastra-worker local`` was asked to do (``steps`` None: the script decides)."""

    command: Sequence[str]
    schedule: list[Segment]
    steps: int | None
    checkpoint_dir: Path
    log_file: Path
    consistency: Consistency = "none"
    precision: Precision = DEFAULT_PRECISION
    global_batch_size: int = 32
    micro_batch_size: int = 2
    seed: int = 0
    checkpoint_every: int = 0
    checkpoint_async: bool = True
    """Periodic saves in the background (a TrainingJob's ``checkpoint.asynchronous``)."""
    fail: tuple[int, int] | None = None
    fail_in_save: tuple[int, int] | None = None
    chaos: str | None = None
    max_failed_worlds: int = MAX_FAILED_WORLDS
    world_timeout_s: float = 600.0
    launch: Launch = "elastra"
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

    def running(self) -> bool:
        """The agent process has not exited (it may still be on its way out)."""
        return self.proc is not None and self.proc.poll() is None

    def alive(self) -> bool:
        """Whether the agent will serve the next world; if not, the launcher starts a new one.

        An agent writes its last phase (done, failed, terminated) a moment before it exits.
        One caught in between would never read another assignment, so it is waited for and
        counted as gone rather than taken for a live agent that the new world then waits for.
        """
        if self.proc is None or not self.running():
            return False
        if self.agent_state().get("phase") not in EXITING_PHASES:
            return True
        try:
            self.proc.wait(timeout=AGENT_EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            log.warning("pod %d's agent reported its end but did not exit: killing it", self.index)
            self.kill()
        return False

    def kill(self) -> None:
        """SIGKILL the agent's group, then its trainers' groups (by pid), and reap the agent."""
        if self.proc is None or not self.running():
            return  # an agent that exited has already reaped its trainers
        groups = [self.proc.pid] + [int(pid) for pid in self.agent_state().get("trainerPids", [])]
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        self.proc.kill()  # in case it left its group
        self.proc.wait()


class LocalLauncher:
    """Runs a ``LocalJob`` (see the module docstring); ``run()`` returns the exit code."""

    def __init__(self, job: LocalJob) -> None:
        self.job = job
        self._own_work_dir = job.work_dir is None
        self.work_dir = job.work_dir or Path(tempfile.mkdtemp(prefix="elastra-local-"))
        self.pods: dict[int, _Pod] = {}
        self.version = 0
        self._faults = {KILL_AT_STEP_ENV: job.fail, KILL_IN_SAVE_ENV: job.fail_in_save}
        self._fired_dir = self.work_dir / "faults-fired"  # each --fail fires once (faults.py)
        self.failures = 0
        self._t0 = time.monotonic()

    def _elapsed(self) -> float:
        return time.monotonic() - self._t0

    # ---- the operator's half ------------------------------------------------------------------

    def _write(self, pod: _Pod, obj: dict[str, Any]) -> None:
        tmp = pod.assignment_file.with_name(".assignment.tmp")
        tmp.write_text(json.dumps(obj), encoding="utf-8")
        os.replace(tmp, pod.assignment_file)  # atomic, like the kubelet's symlink swap

    def _assign(self, seg: Segment, port: int) -> None:
        j = self.job
        plan = plan_for(seg, global_batch=j.global_batch_size, micro_batch=j.micro_batch_size)
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
                    "plan": plan_to_wire(plan),
                    "globalBatchSize": j.global_batch_size,
                    "consistency": j.consistency,
                    "seed": j.seed,
                    "checkpoint": {
                        "path": str(j.checkpoint_dir),
                        "intervalSeconds": 0,
                        "keep": 3,
                        "intervalSteps": j.checkpoint_every,
                        "asynchronous": j.checkpoint_async,
                    },
                    "stopAtStep": seg.stop_at_step,
                    "stop": False,
                    "precision": j.precision,
                },
            )

    def _agent_env(self, pod: _Pod) -> dict[str, str]:
        """One pod's agent environment; a fault goes only to the pod it targets."""
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
        if self.job.chaos:
            env[CHAOS_ENV] = self.job.chaos
        env[FIRED_DIR_ENV] = str(self._fired_dir)
        for env_name, fault in self._faults.items():
            env.pop(env_name, None)
            if fault is not None and fault[0] == pod.index:
                env[env_name] = str(fault[1])
        return env

    def _start_agent(self, pod: _Pod) -> None:
        pod.state_file.unlink(missing_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "elastra_worker.cli",
            "run",
            "--launch",
            self.job.launch,
            "--control-dir",
            str(pod.dir / "control"),
            "--state-file",
            str(pod.state_file),
            "--stop-timeout",
            "60",
            "--",
            *self.job.command,
        ]
        pod.proc = subprocess.Popen(cmd, env=self._agent_env(pod), start_new_session=True)
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
        p = seg.plan
        log.info(
            "world version %d: world size %d (tp %d, pp %d, vpp %d), %s",
            self.version,
            seg.size,
            p.tp,
            p.pp,
            p.vpp,
            seg.span,
        )

    # ---- watching the world -------------------------------------------------------------------

    def _member(self, pod: _Pod) -> tuple[WorldState, str]:
        """Where one member of the current world stands, and the same in words."""
        st = pod.agent_state()
        phase, version = st.get("phase"), st.get("worldVersion")
        code = pod.proc.poll() if pod.proc is not None else None
        where = f"phase {phase!r} in world version {version}"
        if phase == "done" and code in (None, 0):
            return "done", f"pod {pod.index}: its trainers finished ({where})"
        if code == exitcodes.CONFIG:
            return "invalid", (
                f"pod {pod.index}'s agent exited with the permanent code {code} ({where}): "
                "a mistake no new world fixes (the trainer's line above says which)"
            )
        if code is not None:
            return "failed", f"pod {pod.index}'s agent exited with code {code} ({where})"
        if version == self.version and phase in ("stopped", "waiting"):
            return "finished", f"pod {pod.index}: stopped"
        if version != self.version:
            return "running", (
                f"pod {pod.index} (rank {pod.index}) never joined world version {self.version}: "
                f"its agent is still in {where} (its old trainers have not exited)"
            )
        if self.job.launch == "elastra" and not (pod.dir / "control" / "progress-0.json").exists():
            return "running", (
                f"pod {pod.index} (rank {pod.index}) has made no step in world version "
                f"{self.version} (is every rank started? a rendezvous or a restore hangs?)"
            )
        return "running", f"pod {pod.index}: running ({where})"

    def _world_state(self, seg: Segment) -> tuple[WorldState, str]:
        """The world's state and why: 'failed' if any member failed, 'done' once every member
        finished its steps (or stopped beside one that did), 'finished' once all stopped."""
        views = [self._member(self.pods[i]) for i in range(seg.size)]
        for worst in ("invalid", "failed"):
            for state, why in views:
                if state == worst:
                    return state, why
        states = {state for state, _ in views}
        if "done" in states and states <= {"done", "finished"}:
            return "done", ""
        if states == {"finished"}:
            return "finished", ""
        return "running", "; ".join(why for state, why in views if state == "running")

    def run(self) -> int:
        """Drive the schedule until its last world stops or the trainers finish; 0 when done.

        ``PermanentError`` when a folder cannot be made or a pod's agent exits with the
        permanent code (a new world would fail the same way); ``LaunchError`` when worlds keep
        failing or hang."""
        for option, folder in (
            ("--checkpoint-dir", self.job.checkpoint_dir),
            ("--log's folder", self.job.log_file.parent),
        ):
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as err:  # a regular file on the way, no permission
                raise PermanentError(f"{option} {folder}: {err.strerror}") from None
        self.job.log_file.unlink(missing_ok=True)
        shutil.rmtree(self._fired_dir, ignore_errors=True)  # a --work-dir run before this one
        self._fired_dir.mkdir(parents=True)
        self._t0 = time.monotonic()  # SECONDSs schedule points count from here
        # SIGTERM (a CI deadline, Ctrl-C's cousin) still runs the cleanup below.
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
        try:
            reached = 0  # the step the last world stopped at by itself
            last: Segment | None = None
            for seg in self.job.schedule:
                if seg.until_s is not None and self._elapsed() >= seg.until_s:
                    log.warning("schedule entry %r skipped: its time is over", seg.entry)
                    continue
                if seg.stop_at_step is not None and seg.stop_at_step <= reached:
                    log.warning("schedule entry %r skipped: its steps are done", seg.entry)
                    continue
                last = seg
                end = self._run_segment(seg)
                if end == "done":
                    break
                if end == "stopped" and seg.stop_at_step is not None:
                    reached = seg.stop_at_step
            self._finish(last)
            return exitcodes.OK
        finally:
            self._kill_all()
            if self._own_work_dir:
                shutil.rmtree(self.work_dir, ignore_errors=True)

    def _run_segment(self, seg: Segment) -> SegmentEnd:
        """Run one world until it stops at its step, is replaced at its time, or is done."""
        self._new_world(seg)
        deadline = time.monotonic() + self.job.world_timeout_s
        while True:
            state, why = self._world_state(seg)
            if state == "done":
                log.info("the trainers finished in world version %d: job done", self.version)
                return "done"
            if state == "finished":
                return "stopped"
            if state == "invalid":
                raise PermanentError(why)
            if seg.until_s is not None and self._elapsed() >= seg.until_s:
                return "replaced"
            if state == "failed":
                self._count_failure(why)
                self._new_world(seg)  # bump first, then restart the dead agents
                deadline = time.monotonic() + self.job.world_timeout_s
            elif time.monotonic() > deadline:
                raise LaunchError(
                    f"world version {self.version} ({seg.size} ranks, {seg.span}) did not "
                    f"finish within {self.job.world_timeout_s:.0f}s: {why}"
                )
            time.sleep(0.1)

    def _count_failure(self, why: str) -> None:
        """One more failed world (``LaunchError`` past ``--max-failed-worlds``)."""
        self.failures += 1
        if self.failures > self.job.max_failed_worlds:
            raise LaunchError(
                f"more than {self.job.max_failed_worlds} failed worlds, giving up; the last: {why}"
            )
        log.warning("world version %d failed (%s): starting a new one", self.version, why)

    def _finish(self, last: Segment | None) -> None:
        """Stop every pod at the end of the schedule. A world parked at its stop step commits
        that step only once it learns no world follows (``carry.save_or_hold``), so a trainer
        can still fail here: then the last world runs again from the newest checkpoint, as any
        failed world does, until a stop ends cleanly. A pod outside the last world whose agent
        failed is an error at once: running that world again would not mend it."""
        while True:
            try:
                self._stop_all()
                return
            except _StopFailedError as err:
                if last is None:
                    raise LaunchError(str(err)) from None
                if err.pod >= last.size:
                    raise LaunchError(f"{err}, though in no world since") from None
                self._count_failure(str(err))
            if self._run_segment(last) == "done":
                last = None  # its trainers finished by themselves: nothing left to run again

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
                phase = pod.agent_state().get("phase")
                raise _StopFailedError(
                    f"pod {pod.index}'s agent exited with code {code} at the end (phase {phase!r})",
                    pod.index,
                )

    def _kill_all(self) -> None:
        """Leave nothing behind: each agent's group, then its trainers' groups (by pid)."""
        for pod in self.pods.values():
            pod.kill()
