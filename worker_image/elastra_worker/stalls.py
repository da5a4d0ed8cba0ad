"""A trainer that stops making steps says where it waits: every thread's stack goes to its log.

Why: a rank that waits in a rendezvous, a collective or a checkpoint read makes no progress
until the collective timeout ends it (10 minutes by default), and until then its log is silent:
from outside the world looks Running. Python's ``faulthandler`` writes every thread's stack
from a watchdog thread of its own, without the stuck thread having to run Python code, so a rank
blocked inside gloo or NCCL shows the Python frame that made the call. The watch is re-armed at
every step boundary, so it writes only when no step completed for the whole interval, and again
after each further interval while the rank stays stuck.

faulthandler keeps one such timer per process: a script that arms its own
(``faulthandler.dump_traceback_later``) replaces this one, and the Session's next re-arm
replaces the script's; ``ELASTRA_STALL_DUMP_SECONDS=0`` turns the watch off.
"""

from __future__ import annotations

import faulthandler
import math
import sys
from collections.abc import Mapping

STALL_DUMP_ENV = "ELASTRA_STALL_DUMP_SECONDS"
DEFAULT_STALL_DUMP_S = 300.0
"""Long enough for a slow first step or a large checkpoint, well inside the collective
timeout, so a stuck world's stacks are in the log before its ranks give up."""


class StallWatch:
    """Dump every thread's stack after ``seconds`` without a call to :meth:`arm` (0: never)."""

    def __init__(self, seconds: float = DEFAULT_STALL_DUMP_S) -> None:
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(
                f"{STALL_DUMP_ENV}={seconds!r}: expected seconds >= 0 (0 turns it off)"
            )
        self.seconds = seconds
        self.armed = False

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> StallWatch:
        """The interval from ``$ELASTRA_STALL_DUMP_SECONDS`` (default 300 s)."""
        raw = env.get(STALL_DUMP_ENV, "").strip()
        if not raw:
            return cls()
        try:
            seconds = float(raw)
        except ValueError:
            raise ValueError(
                f"{STALL_DUMP_ENV}={raw!r}: expected seconds >= 0 (0 turns it off)"
            ) from None
        return cls(seconds)

    def arm(self) -> None:
        """Start (or restart) the interval: called at start-up and at every step boundary."""
        if self.seconds <= 0:
            return
        faulthandler.dump_traceback_later(self.seconds, repeat=True, file=sys.stderr)
        self.armed = True

    def disarm(self) -> None:
        """Stop the timer (leaving the world: a finished rank is not stuck)."""
        if self.armed:
            faulthandler.cancel_dump_traceback_later()
            self.armed = False
