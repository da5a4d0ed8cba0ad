"""The files through which the agent and its trainers talk, in a per-pod control directory.

Files rather than signals: a signal that arrives while a trainer is still importing torch kills
it (the default action), and a signal delivered inside a blocking collective can interrupt a
system call in C++ code. A file is looked at once per step boundary, which is exactly when a
trainer can act on it, and costs one ``stat``.

- ``stop``: written by the agent; asks the trainers to stop at the next step boundary,
  checkpoint, and exit 0 (a new world version, ``stop: true``, or SIGTERM to the pod).
- ``next.json``: written by the agent before it asks for a stop on a new world version that
  keeps this pod (same number of trainers): the new assignment, which a trainer may join in
  the same process, keeping its state in memory (``session/carry.py``).
- ``status-<local rank>.json``: written by a trainer as it exits: ``done`` (the script finished
  its steps) or ``stopped`` (it stopped on request), with the step and the checkpoint step; or,
  still running, ``continued`` into the world version of ``next.json``, or ``parked`` (its world
  reached its stop step; it waits for ``next.json`` or ``stop``).
- ``progress-<local rank>.json``: written by a trainer after every step (step, loss, step
  seconds, samples/s, tokens/s when known, last checkpoint step); the agent serves it as
  Prometheus metrics, which the operator reads into the job's status. A torchrun-mode script
  gets the path as ``$ELASTRA_PROGRESS_FILE`` and writes it with ``report_progress`` (or by
  hand: the same JSON object, replaced atomically).
- ``warm/<pid>``: written (empty) by a standby trainer once it has imported torch
  (``standby.py``); the agent reads it to know that its pod can join a world without importing
  torch inside that world's downtime (``Agent.warm``). A directory: ``reset`` keeps it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

CONTROL_DIR_ENV = "ELASTRA_CONTROL_DIR"
PROGRESS_FILE_ENV = "ELASTRA_PROGRESS_FILE"
STOP = "stop"
NEXT = "next.json"
WARM = "warm"
WARM_DIR_ENV = "ELASTRA_STANDBY_WARM_DIR"
"""Where a standby trainer says it has imported torch (``mark_warm``)."""

ExitState = Literal["done", "stopped", "continued", "parked"]


def _write_json(path: Path, obj: Mapping[str, Any]) -> None:
    """Replace ``path`` atomically (no fsync: these files need not survive a node crash)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except json.JSONDecodeError:
        return None
    return raw if isinstance(raw, dict) else None


@dataclass(frozen=True)
class TrainerStatus:
    """How a trainer left (finished, stopped on request) or moved on (continued in the next
    world version), at which step."""

    state: ExitState
    step: int
    checkpoint_step: int | None
    world_version: int


class ControlDir:
    """One pod's control directory (shared by its agent and its trainers)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    # agent side
    def reset(self, *, keep_reports_of: int | None = None) -> None:
        """Clear requests and reports before starting trainers for a new world; with
        ``keep_reports_of``, before watching trainers that moved to that world version in
        memory, keep what they already reported in it (a fast world may have trained to its
        stop step and parked before the agent looked)."""
        self.path.mkdir(parents=True, exist_ok=True)
        for entry in self.path.iterdir():
            if not entry.is_file():
                continue
            if keep_reports_of is not None and entry.name.startswith("status-"):
                raw = _read_json(entry)
                if raw is not None and raw.get("worldVersion") == keep_reports_of:
                    continue
            entry.unlink(missing_ok=True)

    def request_stop(self, reason: str, *, world_version: int) -> None:
        """Ask the trainers of ``world_version`` to stop at the next step boundary."""
        _write_json(self.path / STOP, {"reason": reason, "worldVersion": world_version})

    def offer_next(self, assignment_json: str) -> None:
        """Offer the next world version's assignment to the trainers (``reset`` withdraws it)."""
        _write_json(self.path / NEXT, {"assignment": assignment_json})

    def status(self, local_rank: int) -> TrainerStatus | None:
        """The exit report of trainer ``local_rank``, if it wrote one."""
        raw = _read_json(self.path / f"status-{local_rank}.json")
        if raw is None or raw.get("state") not in ("done", "stopped", "continued", "parked"):
            return None
        ckpt = raw.get("checkpointStep")
        return TrainerStatus(
            state=raw["state"],
            step=int(raw.get("step", 0)),
            checkpoint_step=None if ckpt is None else int(ckpt),
            world_version=int(raw.get("worldVersion", 0)),
        )

    def progress_path(self, local_rank: int) -> Path:
        """Where trainer ``local_rank`` reports its progress (local rank 0's is the pod's)."""
        return self.path / f"progress-{local_rank}.json"

    def progress(self, local_rank: int) -> dict[str, Any] | None:
        """The last progress report of trainer ``local_rank``."""
        return _read_json(self.progress_path(local_rank))

    @property
    def warm_dir(self) -> Path:
        """Where standby trainers say they have imported torch (``mark_warm``)."""
        return self.path / WARM

    def is_warm(self, pid: int) -> bool:
        """Whether the standby trainer of process ``pid`` has imported torch."""
        return (self.warm_dir / str(pid)).exists()

    # trainer side
    def stop_requested(self, world_version: int) -> bool:
        """True once the agent has asked the trainers of ``world_version`` to stop (a stop
        for an earlier version, which a trainer that continued has acted on, is not one)."""
        path = self.path / STOP
        if not path.exists():  # one stat per step in the common case
            return False
        raw = _read_json(path)
        asked = None if raw is None else raw.get("worldVersion")
        return not isinstance(asked, int) or asked >= world_version

    def next_assignment(self) -> str | None:
        """The next world version's assignment (JSON) the agent offered, if any."""
        raw = _read_json(self.path / NEXT)
        value = None if raw is None else raw.get("assignment")
        return value if isinstance(value, str) else None

    def write_status(self, local_rank: int, status: TrainerStatus) -> None:
        """Report how this trainer is leaving."""
        _write_json(
            self.path / f"status-{local_rank}.json",
            {
                "state": status.state,
                "step": status.step,
                "checkpointStep": status.checkpoint_step,
                "worldVersion": status.world_version,
            },
        )

    def write_progress(self, local_rank: int, progress: Mapping[str, Any]) -> None:
        """Report progress after a step."""
        _write_json(self.progress_path(local_rank), progress)


def report_progress(
    step: int,
    *,
    loss: float | None = None,
    samples_per_second: float | None = None,
    step_seconds: float | None = None,
    tokens_per_second: float | None = None,
    last_checkpoint_step: int | None = None,
    environ: Mapping[str, str] = os.environ,
) -> bool:
    """Report a torchrun-mode script's progress: ``step`` optimizer steps done, and what else
    is known (``None`` is left out), for the job's status, metrics and dashboard as a
    ``Session`` reports it. Cheap (one small file replaced); call it on every rank after each
    step: local rank 0's report is the pod's, and the world's rank 0 pod's is the job's.

    Returns False, writing nothing, where ``$ELASTRA_PROGRESS_FILE`` is not set (under plain
    ``torchrun`` or ``python``), so a script may call it unconditionally.
    """
    path = environ.get(PROGRESS_FILE_ENV)
    if not path:
        return False
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"report_progress: step must be a whole number >= 0, got {step!r}")
    rates = {
        "loss": loss,
        "samplesPerSecond": samples_per_second,
        "stepSeconds": step_seconds,
        "tokensPerSecond": tokens_per_second,
    }
    report: dict[str, int | float] = {"step": step}
    report.update({k: float(v) for k, v in rates.items() if v is not None})
    if last_checkpoint_step is not None:
        report["lastCheckpointStep"] = int(last_checkpoint_step)
    _write_json(Path(path), report)
    return True


def mark_warm(environ: Mapping[str, str] = os.environ) -> None:
    """Say, as a standby trainer, that this process has imported torch (nothing where the agent
    gave no ``$ELASTRA_STANDBY_WARM_DIR``)."""
    folder = environ.get(WARM_DIR_ENV)
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / str(os.getpid())).touch()
