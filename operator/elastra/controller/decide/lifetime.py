"""A job's clock: when it started and ended, its active deadline, and its time to live.

``spec.activeDeadlineSeconds`` and ``spec.ttlSecondsAfterFinished`` mean what they mean for a
Kubernetes Job. The deadline counts from ``status.startTime``, which is set when the job
starts to run and cleared while it is held (suspended, waiting for Kueue, evicted), so a
resumed job gets its full deadline again. Past it, the job stops as a suspend stops it (every
worker checkpoints first) and then ends Failed with reason ``DeadlineExceeded``. The TTL
counts from ``status.completionTime``; once it has passed, the operator deletes the
TrainingJob (its pods and Workload go with it by owner reference; checkpoint volumes are not
owned by the job and stay).

Pure: every function takes ``now``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from elastra.api import TrainingJob, TrainingJobStatus
from elastra.controller.decide.observe import format_time, parse_time


@dataclass(frozen=True)
class Deadline:
    """The active deadline as of ``now``: passed, or how long is left (``None``: no deadline)."""

    exceeded: bool
    left: timedelta | None
    message: str = ""


def deadline(job: TrainingJob, started: str | None, now: datetime) -> Deadline:
    """Whether the job has run past ``spec.activeDeadlineSeconds`` since ``started``."""
    limit = job.spec.active_deadline_seconds
    if limit is None or started is None:
        return Deadline(exceeded=False, left=None)
    left = _left(started, limit, now)
    if left > timedelta(0):
        return Deadline(exceeded=False, left=left)
    return Deadline(
        exceeded=True,
        left=None,
        message=f"the job ran longer than activeDeadlineSeconds ({limit} s) since {started}",
    )


def start_time(status: TrainingJobStatus, *, held: bool, now: datetime) -> str | None:
    """``status.startTime`` after this pass: cleared while held, set when first running."""
    if held:
        return None
    return status.start_time or format_time(now)


def completion_time(status: TrainingJobStatus, *, finished: bool, now: datetime) -> str | None:
    """``status.completionTime`` after this pass: set once, when the job ends."""
    if not finished:
        return status.completion_time
    return status.completion_time or format_time(now)


@dataclass(frozen=True)
class Expiry:
    """Whether a finished job is due for deletion, or when it will be."""

    delete: bool
    left: timedelta | None


def expiry(job: TrainingJob, completed: str | None, now: datetime) -> Expiry:
    """The TTL after the job finished at ``completed`` (``None``: not finished)."""
    ttl = job.spec.ttl_seconds_after_finished
    if ttl is None or completed is None:
        return Expiry(delete=False, left=None)
    left = _left(completed, ttl, now)
    if left > timedelta(0):
        return Expiry(delete=False, left=left)
    return Expiry(delete=True, left=None)


def _left(since: str, seconds: int, now: datetime) -> timedelta:
    """Time left of ``seconds`` counted from the timestamp ``since`` (negative once past)."""
    return parse_time(since, now) + timedelta(seconds=seconds) - now
