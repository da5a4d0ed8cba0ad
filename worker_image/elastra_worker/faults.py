"""Fault injection for tests and the local launcher: kill this trainer at a chosen point.

Set by ``elastra-worker local --fail`` on one pod only. The kill is a SIGKILL to the trainer
itself: no handler, no flush, no checkpoint, which is what a lost node or an OOM kill looks like.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass

KILL_AT_STEP_ENV = "ELASTRA_FAULT_KILL_AT_STEP"
KILL_IN_SAVE_ENV = "ELASTRA_FAULT_KILL_IN_SAVE"


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class Faults:
    """Where to die: during step ``kill_at_step`` or while saving checkpoint ``kill_in_save``."""

    kill_at_step: int | None = None
    kill_in_save: int | None = None

    @staticmethod
    def from_env(environ: Mapping[str, str]) -> Faults:
        """Read ``ELASTRA_FAULT_KILL_AT_STEP`` / ``ELASTRA_FAULT_KILL_IN_SAVE``."""

        def opt(name: str) -> int | None:
            raw = environ.get(name, "")
            return int(raw) if raw else None

        return Faults(kill_at_step=opt(KILL_AT_STEP_ENV), kill_in_save=opt(KILL_IN_SAVE_ENV))

    def at_step(self, step: int) -> None:
        """Called in the middle of global step ``step`` (after backward, before the reduce)."""
        if self.kill_at_step == step:
            _kill_self()

    def in_save(self, step: int) -> None:
        """Called after this rank's shards of checkpoint ``step`` are written, before commit."""
        if self.kill_in_save == step:
            _kill_self()
