"""The files through which the agent and its trainers talk, in a per-pod control directory.

Files rather than signals: a signal that arrives while a trainer is still importing torch kills
it (the default action), and a signal delivered inside a blocking collective can interrupt a
system call in C++ code. A file is looked at once per step boundary, which is exactly when a
trainer can act on it, and costs one ``stat``.

- ``stop``: written by the agent; asks the trainers to stop at the next step boundary,
  checkpoint, and exit 0 (a new world version, ``stop: true``, or SIGTERM to the pod).
- ``status-<local rank>.json``: written by a trainer as it exits: ``done`` (the script finished
  its steps) or ``stopped`` (it stopped on request), with the step and the checkpoint step.
- ``progress-<local rank>.json``: written by a trainer after every step (step, loss, step
  seconds, samples/s, tokens/s when known, last checkpoint step); the agent serves it as
  Prometheus metrics.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

CONTROL_DIR_ENV = "ELASTRA_CONTROL_DIR"
STOP = "stop"

ExitState = Literal["done", "stopped"]


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
    """How a trainer left: finished or stopped on request, at which step."""

    state: ExitState
    step: int
    checkpoint_step: int | None
    world_version: int


class ControlDir:
    """One pod's control directory (shared by its agent and its trainers)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    # agent side
    def reset(self) -> None:
        """Clear requests and reports before starting trainers for a new world."""
        self.path.mkdir(parents=True, exist_ok=True)
        for entry in self.path.iterdir():
            if entry.is_file():
                entry.unlink()

    def request_stop(self, reason: str) -> None:
        """Ask the trainers to stop at the next step boundary."""
        _write_json(self.path / STOP, {"reason": reason})

    def status(self, local_rank: int) -> TrainerStatus | None:
        """The exit report of trainer ``local_rank``, if it wrote one."""
        raw = _read_json(self.path / f"status-{local_rank}.json")
        if raw is None or raw.get("state") not in ("done", "stopped"):
            return None
        ckpt = raw.get("checkpointStep")
        return TrainerStatus(
            state=raw["state"],
            step=int(raw.get("step", 0)),
            checkpoint_step=None if ckpt is None else int(ckpt),
            world_version=int(raw.get("worldVersion", 0)),
        )

    def progress(self, local_rank: int) -> dict[str, Any] | None:
        """The last progress report of trainer ``local_rank``."""
        return _read_json(self.path / f"progress-{local_rank}.json")

    # trainer side
    def stop_requested(self) -> bool:
        """True once the agent has asked for a stop."""
        return (self.path / STOP).exists()

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
        _write_json(self.path / f"progress-{local_rank}.json", progress)
