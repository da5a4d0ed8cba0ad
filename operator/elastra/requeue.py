"""When a job's next pass is due with no new event: now, after a delay, or never.

A value of its own, not ``timedelta | None``: ``timedelta(0)`` is falsy, so ``delay or
resync`` read "due now" as "nothing asked for" and the job waited out the 300 s resync (the
job loop, the progress interval of a pass, the retire timeout of a resize decision all did).
A ``Requeue`` has no truth value of its own, and mypy's ``truthy-bool`` check (enabled in
pyproject.toml) rejects ``requeue or ...`` and ``if requeue:``; "never" (a pass on events
only) is a value of the type, so no ``None`` stands for it.

Requeues order by when they are due, ``never`` last: the earliest of several is ``min``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import ClassVar

_NEVER = timedelta.max
"""The delay that stands for never: later than any other, and adding it to a date overflows
instead of passing unnoticed."""


@dataclass(frozen=True, order=True)
class Requeue:
    """When the next pass is due: ``NOW``, ``NEVER``, ``after`` a delay, or the ``earliest`` of
    several deadlines."""

    delay: timedelta
    """From the end of this pass; ``timedelta.max`` for never (see ``is_never``)."""

    NOW: ClassVar[Requeue]
    """Due at once."""
    NEVER: ClassVar[Requeue]
    """Not due on a timer: the next pass comes with an event (or the resync safety net)."""

    @classmethod
    def after(cls, delay: timedelta) -> Requeue:
        """Due in ``delay`` (a deadline already past is due now)."""
        return cls(max(delay, timedelta(0)))

    @classmethod
    def earliest(cls, *left: timedelta | None) -> Requeue:
        """Due at the first of these deadlines (``None``: that one is not set); never without
        any."""
        return min((cls.after(t) for t in left if t is not None), default=cls.NEVER)

    @property
    def is_never(self) -> bool:
        """Not due on a timer."""
        return self.delay == _NEVER

    def within(self, limit: timedelta) -> timedelta:
        """How long to wait for it, at most ``limit`` (never waits the whole ``limit``)."""
        return min(self.delay, limit)


Requeue.NOW = Requeue(timedelta(0))
Requeue.NEVER = Requeue(_NEVER)
