"""The per-pod agent: turns assignments into trainer processes, world version after world version.

``elastra-worker run -- CMD ARGS...`` is the container's entry point. It waits until the pod is
in a world, starts ``localWorldSize`` trainers (one per GPU; one on CPU) with torchrun-style
variables, and watches the assignment file. On a new world version (or ``stop: true``) it asks
its trainers to stop at the next step boundary, which makes the whole old world agree on a step
and commit a checkpoint of it; then it starts fresh trainers in the new world, which restore that
checkpoint resharded (or, below, lets them move there in memory). Every world version has a new
rendezvous namespace, so nothing of the previous world (store keys, peer addresses, a half-dead
process group) survives but what a moving trainer holds in memory.

A pod that stays in the new world with as many trainers lets them move there in memory: before
the stop, the agent offers the new assignment (``next.json``); trainers that can move report
``continued``, join the new version's rendezvous in their own processes and keep their state
(``session/carry.py``), and the agent keeps them as the new world's trainers. A trainer that
cannot move exits stopped as before, and the new world starts fresh trainers (the fallback; the
state file counts both: ``resizesInMemory``, ``resizesRestarted``).

If the old world cannot stop (a member vanished and the survivors block in a collective), the
agent kills its trainers after ``stop_timeout_s``: the new world resumes from the last good
checkpoint instead of waiting for a collective timeout. SIGTERM (eviction, preemption, scale-in)
asks for a stop and a checkpoint too, and kills the trainers if the grace period runs out.

``--launch torchrun`` runs a plain script written for torchrun instead (see ``torchrun.py``):
torchrun's variables, and SIGTERM plus a grace period in place of the stop file.

The agent imports no torch: it starts in milliseconds and stays small.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from . import exitcodes
from .assignment import Assignment, AssignmentError, read_assignment_file, session_env
from .control import CONTROL_DIR_ENV, WARM_DIR_ENV, ControlDir
from .cpushare import with_threads
from .layout import CheckpointError, UnusableRootError
from .lifeline import PARENT_PID_ENV
from .push import PushedAssignments
from .staging import StagingError
from .standby import warm_command
from .termination import report_permanent
from .torchrun import (
    Launch,
    checkpoint_dir,
    cold_command,
    prepare_checkpoint_dir,
    staging_store,
    torchrun_env,
)

log = logging.getLogger(__name__)

IN_MEMORY_RESIZE_ENV = "ELASTRA_IN_MEMORY_RESIZE"
"""``0``: every world change restarts the trainers (``AgentConfig.in_memory_resize``)."""

Outcome = Literal["done", "stopped", "continued", "failed", "peers_lost", "terminated", "invalid"]


@dataclass
class AgentConfig:
    """How the agent runs; every duration is in seconds."""

    command: Sequence[str]
    control_dir: Path
    assignment_file: Path | None = None
    static_assignment: Assignment | None = None
    poll_s: float = 0.2
    stop_timeout_s: float = 120.0
    failure_wait_s: float = 10.0
    """After trainers failed, how long to wait for a newer world version before the pod
    exits failed (``_newer_after_failure``)."""
    peers_lost_wait_s: float = 60.0
    """The same when every failed trainer ended on a failed collective (``PEERS_LOST``): a
    peer is gone, and the operator drops a lost node's pods once the node's Lease is overdue
    and its workers are silent (about 15 s), or else once the node controller marks it
    NotReady (its 40 s grace period and 5 s monitor period by default), plus 2 s to settle.
    A survivor that left before would be replaced as a failed pod, a world of survivors one
    member short until the replacement joins after the growth cooldown."""
    grace_s: float = 25.0
    state_file: Path | None = None
    warm_start: bool = True
    in_memory_resize: bool = True
    """Offer trainers the next world version so they move there in their own processes
    (``session/carry.py``); off: every world change restarts the trainers."""
    launch: Launch = "elastra"
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    pushed: PushedAssignments | None = None
    """Assignments the operator pushed over HTTP (``push.py``): one ahead of the file's world
    version is acted on before the kubelet refreshes the file."""


class Agent:
    """One pod's agent (see the module docstring). ``run()`` returns the exit code."""

    def __init__(self, config: AgentConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        if config.assignment_file is None and config.static_assignment is None:
            raise ValueError("an agent needs an assignment file or a static assignment")
        self.config = config
        self.control = ControlDir(config.control_dir)
        self.clock = clock
        self._terminating = False
        self._finished_version: int | None = None
        self._said_waiting = False
        self._warm_argv = warm_command(config.command) if config.warm_start else None
        self.state: dict[str, Any] = {
            "phase": "waiting", "trainerStarts": 0, "resizesInMemory": 0, "resizesRestarted": 0,
            "warm": self._warm_argv is None,  # a cold command has nothing to import ahead
        }  # fmt: skip
        self._standbys: list[subprocess.Popen[bytes]] = []
        self._worlds_started = 0
        self._stopped_clean: int | None = None
        """torchrun mode: the world version whose script last exited 0 on a stop here."""
        self._carried: tuple[Assignment, list[subprocess.Popen[bytes]]] | None = None
        """The world version trainers moved to in memory, and those trainers."""
        self._offered: Assignment | None = None
        """The next world version offered to the running trainers (``_offer_next``)."""

    # ---- state ------------------------------------------------------------------------------

    def _set_state(self, **changes: Any) -> None:
        self.state.update(changes)
        path = self.config.state_file
        if path is not None:
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(json.dumps(self.state, sort_keys=True), encoding="utf-8")
            os.replace(tmp, path)

    def _read(self) -> Assignment | None:
        """The assignment to act on now: the static one, else the file's, or a pushed one
        ahead of it (``PushedAssignments.newest``). Every look at the assignment comes here,
        each time afresh, so a push is seen within one ``poll_s``."""
        if self.config.static_assignment is not None:
            return self.config.static_assignment
        assert self.config.assignment_file is not None
        from_file = read_assignment_file(self.config.assignment_file)
        pushed = self.config.pushed
        return from_file if pushed is None else pushed.newest(from_file)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self._terminating = True

    # ---- main loop --------------------------------------------------------------------------

    def run(self) -> int:
        """Serve world versions until done, stopped or terminated; return the exit code."""
        previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            return self._loop()
        except AssignmentError as err:
            report_permanent(f"bad assignment: {err}")  # the job's condition shows it
            self._set_state(phase="failed", error=str(err))
            return exitcodes.CONFIG
        finally:
            signal.signal(signal.SIGTERM, previous)
            self._drop_standbys()

    # ---- standby trainers (see standby.py) ------------------------------------------------

    def _prepare_standbys(self, count: int) -> None:
        """Start ``count`` pre-importing trainer processes for the next world, if warm."""
        self._standbys = [p for p in self._standbys if p.poll() is None]
        if self._warm_argv is None or self._standbys:
            return
        self._standbys = [self._new_standby() for _ in range(count)]

    def _new_standby(self) -> subprocess.Popen[bytes]:
        env = dict(self.config.env)
        env[PARENT_PID_ENV] = str(os.getpid())
        env[WARM_DIR_ENV] = str(self.control.warm_dir)
        return subprocess.Popen(
            [sys.executable, "-m", "elastra_worker.standby"],
            stdin=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )

    @property
    def warm(self) -> bool:
        """Whether this pod can join a world without importing torch inside its downtime:
        its trainers ran, or every standby it keeps has imported torch (a standby that died
        counts: the trainer that replaces it shows why, rather than a pod never Ready), or its
        command starts cold anyway. Once true it stays true. The pod's startup probe asks
        this (``metrics.serve``): the operator adds a pod to a running world only once it is
        Ready, so the world trains on while the pod imports torch instead of waiting for it."""
        return bool(self.state["warm"])

    def _note_warm(self) -> None:
        if self.warm:
            return
        standbys = self._standbys
        ready = all(p.poll() is not None or self.control.is_warm(p.pid) for p in standbys)
        if self._worlds_started or (standbys and ready):
            self._set_state(warm=True)

    def _drop_standbys(self) -> None:
        for p in self._standbys:
            if p.stdin is not None:
                p.stdin.close()  # EOF: the standby exits by itself
        _kill_all(self._standbys)
        self._standbys = []

    def _start_trainer(self, env: dict[str, str]) -> subprocess.Popen[bytes]:
        """A trainer for ``env``: through a standby where the command runs warm (one started
        now where none is ready, as in the first world: its script can then run again in the
        next world, ``session/rerun.py``), else the command itself."""
        if self._warm_argv is not None and not any(p.poll() is None for p in self._standbys):
            self._standbys.append(self._new_standby())
        while self._standbys and self._warm_argv is not None:
            standby = self._standbys.pop(0)
            if standby.poll() is not None or standby.stdin is None:
                continue
            order = json.dumps({"env": env, "argv": self._warm_argv}) + "\n"
            try:
                standby.stdin.write(order.encode())
                standby.stdin.close()
            except BrokenPipeError:
                continue
            return standby
        command = list(self.config.command)
        return subprocess.Popen(
            cold_command(command) if self.config.launch == "torchrun" else command,
            env=env,
            start_new_session=True,  # its own process group: killed as a whole
        )

    def _loop(self) -> int:
        while True:
            if self._terminating:
                self._set_state(phase="terminated")
                return exitcodes.OK
            carried, self._carried = self._carried, None
            a = self._read() if carried is None else carried[0]
            if a is not None and a.stop:
                log.info("assignment says stop: exiting")
                self._set_state(phase="stopped", worldVersion=a.world_version)
                return exitcodes.OK
            runnable = (
                a is not None
                and not a.waiting
                and (self._finished_version is None or a.world_version > self._finished_version)
            )
            if not runnable:
                if self.config.static_assignment is not None:
                    return exitcodes.OK  # a static world that has stopped: nothing to wait for
                if a is not None:
                    self._prepare_standbys(max(a.local_world_size, 1))
                self._note_warm()
                if not self._said_waiting:
                    log.info("waiting for a world assignment in %s", self.config.assignment_file)
                    self._said_waiting = True
                    self._set_state(phase="waiting")
                time.sleep(self.config.poll_s)
                continue
            assert a is not None
            self._said_waiting = False
            outcome = self._run_world(a, None if carried is None else carried[1])
            self._finished_version = a.world_version
            if outcome == "continued":
                continue
            if outcome == "done":
                self._set_state(phase="done", worldVersion=a.world_version)
                return exitcodes.OK
            if outcome == "terminated":
                self._set_state(phase="terminated", worldVersion=a.world_version)
                return exitcodes.OK if self.state.get("checkpointed") else exitcodes.RETRYABLE
            if outcome == "invalid":
                # A trainer exited CONFIG (bad root, bad model, bad arguments): no new world
                # version fixes that, so the pod says so to the operator.
                self._set_state(phase="failed", worldVersion=a.world_version)
                return exitcodes.CONFIG
            if outcome in ("failed", "peers_lost"):
                newer = self._newer_after_failure(a, peers_lost=outcome == "peers_lost")
                if newer is None or newer.stop or newer.world_version <= a.world_version:
                    self._set_state(phase="failed", worldVersion=a.world_version)
                    return exitcodes.RETRYABLE  # at a stop: its last save may be lost
                # A pod that leaves as its world breaks (its trainer parked at the stop step
                # when a peer died) has nothing left to lose: it waits for a world like any
                # pod left out, instead of failing for a world it is no longer in.
                log.info("trainer failed but world version %d is assigned%s", newer.world_version,
                         " (this pod waits in it)" if newer.waiting else "")  # fmt: skip
                continue
            self._set_state(phase="stopped", worldVersion=a.world_version)

    def _newer_after_failure(self, a: Assignment, *, peers_lost: bool) -> Assignment | None:
        """The assignment once trainers of world ``a`` failed, waiting up to
        ``failure_wait_s`` (``peers_lost_wait_s`` when their collectives failed) for a newer
        version: a peer's death (a lost node, its trainers ended because their peers were
        lost) breaks this pod's collectives before the operator writes the world of
        survivors, and the kubelet may show it here a few seconds after the peer's pod saw
        its own. Exiting before would make a survivor a failed pod."""
        wait = self.config.peers_lost_wait_s if peers_lost else self.config.failure_wait_s
        if peers_lost:
            log.info("a collective failed (a peer is gone): waiting up to %.0f s for the "
                     "world of survivors", wait)  # fmt: skip
            # On the metrics page until the next world starts: the operator's first sign that
            # a member of this world is gone, seconds before the member's node Lease says so.
            self._set_state(peersLostWorldVersion=a.world_version)
        deadline = self.clock() + wait
        while True:
            newer = self._read()
            found = newer is not None and newer.world_version > a.world_version
            if found or self._terminating or self.clock() >= deadline:
                return newer
            time.sleep(self.config.poll_s)

    def _trainer_env(self, a: Assignment, local_rank: int) -> dict[str, str]:
        base = with_threads(self.config.env, trainers=a.local_world_size)
        if self.config.launch == "torchrun":
            return torchrun_env(
                base,
                a,
                local_rank=local_rank,
                restart_count=self._worlds_started,
                progress_file=self.control.progress_path(local_rank),
            )
        return {
            **base,
            **session_env(a, local_rank),
            PARENT_PID_ENV: str(os.getpid()),
            CONTROL_DIR_ENV: str(self.control.path),
        }

    def _run_world(
        self, a: Assignment, carried: list[subprocess.Popen[bytes]] | None = None
    ) -> Outcome:
        """Run the trainers of world ``a`` (new ones, or ``carried`` from the previous world
        in memory) until they all exit, are killed, or move to the next world in memory."""
        self._offered = None
        if carried is not None:
            self.control.reset(keep_reports_of=a.world_version)
            log.info("world version %d: its trainers moved here in memory", a.world_version)
            self._set_state(
                phase="running", worldVersion=a.world_version, worldSize=a.world_size,
                rank=a.rank, resizesInMemory=self.state["resizesInMemory"] + 1,
                peersLostWorldVersion=None,
            )  # fmt: skip
            return self._watch_trainers(a, carried)
        self.control.reset()
        log.info(
            "world version %d: ranks %d..%d of %d",
            a.world_version,
            a.rank,
            a.rank + a.local_world_size - 1,
            a.world_size,
        )
        if self.config.launch == "torchrun":
            try:
                prepare_checkpoint_dir(a)
            except UnusableRootError as err:  # no world of this job could ever save
                report_permanent(str(err))
                return "invalid"
            except CheckpointError as err:  # the object store out of reach: maybe for now
                log.error("%s", err)
                return "failed"
            if not self._download(a):
                return "failed"
        procs = [self._start_trainer(self._trainer_env(a, lr)) for lr in range(a.local_world_size)]
        self._worlds_started += 1
        self._note_warm()
        # The next world's standbys start now, not after this world's first step: a resize soon
        # after a cold start (the first world, or one after a crash) otherwise starts cold too,
        # importing torch inside its downtime. Their imports overlap this world's rendezvous
        # and checkpoint load, which mostly wait.
        self._prepare_standbys(len(procs))
        self._set_state(
            phase="running",
            worldVersion=a.world_version,
            worldSize=a.world_size,
            rank=a.rank,
            trainerStarts=self.state["trainerStarts"] + len(procs),
            trainerPids=[p.pid for p in procs],
            checkpointed=False,
            peersLostWorldVersion=None,
        )
        if self.config.launch == "torchrun":
            return self._watch_script(a, procs)
        return self._watch_trainers(a, procs)

    def _stop_timeout(self) -> float:
        """How long trainers asked to stop may take: ``stop_timeout_s``, or nothing at all
        before their first step (nothing to save; they may be stuck in a rendezvous with a
        pod that is gone) or when the next world replaces lost members (``peersLost``: the
        old world's stop is a collective with a dead peer and can never be agreed)."""
        newer = self._read()
        if newer is not None and newer.peers_lost and not newer.stop:
            log.info("members of this world were lost: ending its trainers now")
            return 0.0
        if self.state["phase"] == "stopped":  # parked at this world's stop step: they exit
            return self.config.stop_timeout_s
        return self.config.stop_timeout_s if self.control.progress(0) is not None else 0.0

    def _stop_reason(self, a: Assignment) -> str | None:
        """Why world ``a`` must end now (SIGTERM, stop, a new version), or None."""
        if self._terminating:
            return "SIGTERM"
        newer = self._read()
        if newer is None or newer.stop or newer.world_version != a.world_version:
            return "stop" if newer is not None and newer.stop else "new world version"
        return None

    def _watch_trainers(self, a: Assignment, procs: list[subprocess.Popen[bytes]]) -> Outcome:
        """Session trainers: a stop file makes the whole world stop at one step, checkpointed."""
        deadline: float | None = None
        stop_sent = False
        terminated = False
        while True:
            codes = [p.poll() for p in procs]
            if any(c not in (None, 0) for c in codes):
                bad = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
                log.warning("trainer(s) failed (local rank, exit code): %s", bad)
                _kill_all(procs)
                if exitcodes.CONFIG in codes:
                    return "invalid"
                if terminated:
                    return "terminated"
                return "peers_lost" if {c for _, c in bad} == {exitcodes.PEERS_LOST} else "failed"
            if all(c == 0 for c in codes):
                if self._offered is not None:  # offered the next world, but they restart
                    self._set_state(resizesRestarted=self.state["resizesRestarted"] + 1)
                return self._trainers_exit(len(procs), terminated=terminated)
            if self._offered is not None and self._all_moved(len(procs)):
                self._carried = (self._offered, procs)
                return "continued"
            if self.state["phase"] == "running" and self._all_parked(len(procs)):
                self._set_state(phase="stopped")  # the world reached its stop step
            if self._terminating and not terminated:
                terminated = True
                self.control.request_stop("SIGTERM", world_version=a.world_version)
                stop_sent = True
                deadline = self.clock() + self.config.grace_s
            if not stop_sent and (why := self._stop_reason(a)) is not None:
                log.info("asking trainers to stop at the next step boundary (%s)", why)
                self._offer_next(a)
                self.control.request_stop(why, world_version=a.world_version)
                stop_sent = True
                deadline = self.clock() + self._stop_timeout()
            if deadline is not None and self.clock() >= deadline:
                return self._end_late_trainers(procs, terminated=terminated)
            time.sleep(self.config.poll_s)

    def _end_late_trainers(
        self, procs: list[subprocess.Popen[bytes]], *, terminated: bool
    ) -> Outcome:
        """Kill trainers past their stop deadline. Before their first step (a deadline of 0:
        ``_stop_timeout``) that loses nothing, so the world ends as stopped, not failed."""
        unstarted = self.control.progress(0) is None
        if unstarted:
            log.info("no step made in this world yet: ending its trainers (nothing to save)")
        else:
            log.warning("trainers did not stop in time: killing them")
        _kill_all(procs)
        if terminated:
            return "terminated"
        return "stopped" if unstarted else "failed"

    def _offer_next(self, a: Assignment) -> None:
        """Offer the next world version to the trainers of ``a`` when this pod stays in it
        with as many trainers (they decide whether they can move: ``carry.why_not_carried``)."""
        newer = self._read()
        keeps_pod = (
            self.config.in_memory_resize
            and newer is not None
            and newer.world_version > a.world_version
            and not newer.stop
            and not newer.waiting
            and not newer.peers_lost
            and newer.local_world_size == a.local_world_size
        )
        if keeps_pod and newer is not None:
            self.control.offer_next(newer.to_json())
            self._offered = newer

    def _all_moved(self, count: int) -> bool:
        """Whether every trainer reported from the offered world version: ``continued``, or
        already anything there (a fast world may train to its stop step and park between two
        looks)."""
        version = None if self._offered is None else self._offered.world_version
        statuses = [self.control.status(lr) for lr in range(count)]
        return all(s is not None and s.world_version == version for s in statuses)

    def _all_parked(self, count: int) -> bool:
        """Whether every trainer reported ``parked`` at this world's stop step."""
        statuses = [self.control.status(lr) for lr in range(count)]
        return all(s is not None and s.state == "parked" for s in statuses)

    def _trainers_exit(self, count: int, *, terminated: bool) -> Outcome:
        """All Session trainers exited 0: done or stopped, as their status files say."""
        statuses = [self.control.status(lr) for lr in range(count)]
        checkpointed = all(s is not None and s.checkpoint_step == s.step for s in statuses)
        self._set_state(checkpointed=checkpointed)
        if terminated:
            return "terminated"
        if all(s is None for s in statuses):
            log.warning(
                "the trainer exited 0 without reporting through the Session API: taken as "
                "done (a plain torchrun script needs --launch torchrun to survive resizes)"
            )
        if all(s is None or s.state == "done" for s in statuses):
            return "done"
        return "stopped"

    def _watch_script(self, a: Assignment, procs: list[subprocess.Popen[bytes]]) -> Outcome:
        """A plain torchrun script: SIGTERM is the only stop request it understands.

        On a new version, ``stop: true`` or SIGTERM to the agent, every process of the script
        gets SIGTERM (its chance to checkpoint and exit 0) and ``grace_s`` to go, then SIGKILL;
        the new world starts once they are all gone. Unasked, exit 0 means finished and any
        other exit a crash, as under torchrun.
        """
        deadline: float | None = None
        terminated = False
        while True:
            codes = [p.poll() for p in procs]
            if deadline is None and any(c not in (None, 0) for c in codes):
                bad = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
                log.warning("script process(es) failed (local rank, exit code): %s", bad)
                _kill_all(procs)
                return "invalid" if exitcodes.CONFIG in codes else "failed"
            if all(c is not None for c in codes):
                return self._script_exit(
                    a, codes, stopping=deadline is not None, terminated=terminated
                )
            if self._terminating and not terminated:
                terminated = True
                deadline = None  # send SIGTERM again below, with the SIGTERM grace period
            if deadline is None and (why := self._stop_reason(a)) is not None:
                log.info(
                    "SIGTERM to the script (%s): %.0fs to checkpoint and exit",
                    why,
                    self.config.grace_s,
                )
                _signal_all(procs, signal.SIGTERM)
                deadline = self.clock() + self.config.grace_s
            if deadline is not None and self.clock() > deadline:
                log.warning("the script did not exit within %.0fs: killing it", self.config.grace_s)
                _kill_all(procs)
                self._set_state(checkpointed=False)
                return "terminated" if terminated else "stopped"
            time.sleep(self.config.poll_s)

    def _script_exit(
        self, a: Assignment, codes: list[int | None], *, stopping: bool, terminated: bool
    ) -> Outcome:
        """Every script process has exited: done, or stopped for the next world. After exit 0
        a job on object storage has its staging folder uploaded first (``_upload``)."""
        clean = all(c == 0 for c in codes)
        uploaded = clean and self._upload(a)
        self._stopped_clean = a.world_version if uploaded and stopping else None
        if stopping or terminated:
            if not clean:
                log.info("script exit codes after SIGTERM: %s (no checkpoint promised)", codes)
            self._set_state(checkpointed=uploaded)
            return "terminated" if terminated else "stopped"
        if not uploaded:
            return "failed"  # a new world trains from the last upload again
        # Exit 0 unasked is "finished", unless the next world is already assigned: then the
        # script most likely stopped with peers that got their SIGTERM first.
        if self._stop_reason(a) is not None:
            log.info("the script exited 0 while a new world was assigned: taken as stopped")
            return "stopped"
        return "done"

    def _download(self, a: Assignment) -> bool:
        """A job on object storage: the last upload into the staging folder, before the script
        starts (every pod: any may hold rank 0). A pod whose script stopped cleanly in the
        previous world first waits for that world's upload by its rank-0 pod (up to the grace
        period): it may stop sooner than rank 0 finishes uploading. False: it could not be
        fetched."""
        store = staging_store(a)
        if store is None:
            return True
        try:
            if self._stopped_clean is not None and not store.wait_for_upload(
                self._stopped_clean, timeout=self.config.grace_s
            ):
                log.warning(
                    "no upload of world version %d after %.0fs (its rank 0 did not save?): "
                    "starting from the last one",
                    self._stopped_clean,
                    self.config.grace_s,
                )
            count = store.download(checkpoint_dir(a))
        except StagingError as err:
            log.error("%s: not starting the script without its checkpoint", err)
            return False
        if count:
            log.info("downloaded %d file(s) of the last upload into %s", count, checkpoint_dir(a))
        return True

    def _upload(self, a: Assignment) -> bool:
        """A job on object storage: the world's rank-0 pod uploads the staging folder after the
        script exited 0 (its stop checkpoint, or its last). False: the upload failed."""
        store = staging_store(a)
        if store is None or a.rank != 0:
            return True
        try:
            count = store.upload(checkpoint_dir(a), a.world_version)
        except StagingError as err:
            log.error("%s: this world's checkpoint is not in the object store", err)
            return False
        log.info(
            "uploaded %d file(s) of %s (world version %d)",
            count,
            checkpoint_dir(a),
            a.world_version,
        )
        return True


def _signal_all(procs: Sequence[subprocess.Popen[bytes]], sig: signal.Signals) -> None:
    """Send ``sig`` to each running process's group (the script and anything it started)."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, sig)


def _kill_all(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGKILL each trainer's process group (ours: started with start_new_session)."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        p.wait()
