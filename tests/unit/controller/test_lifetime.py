"""lifetime: the active deadline counts from startTime, the TTL from completionTime."""

from __future__ import annotations

from datetime import timedelta

import pytest

from elastra.api import TrainingJob, TrainingJobStatus
from elastra.controller.decide.lifetime import (
    Deadline,
    Expiry,
    completion_time,
    deadline,
    expiry,
    start_time,
)
from elastra.controller.decide.observe import format_time
from tests.unit.controller.fakecluster import T0
from tests.unit.controller.test_passplan import job as job_body

STARTED = format_time(T0)


def job(**spec: object) -> TrainingJob:
    return TrainingJob.model_validate(job_body(2, **spec))


@pytest.mark.parametrize(
    ("limit", "started", "after_s", "want"),
    [
        (None, STARTED, 10**6, Deadline(exceeded=False, left=None)),  # no deadline
        (600, None, 10**6, Deadline(exceeded=False, left=None)),  # held: not running
        (600, STARTED, 590, Deadline(exceeded=False, left=timedelta(seconds=10))),
    ],
)
def test_deadline_not_reached(
    limit: int | None, started: str | None, after_s: int, want: Deadline
) -> None:
    spec = {} if limit is None else {"activeDeadlineSeconds": limit}
    assert deadline(job(**spec), started, T0 + timedelta(seconds=after_s)) == want


def test_past_the_deadline_says_by_how_much_and_since_when() -> None:
    found = deadline(job(activeDeadlineSeconds=600), STARTED, T0 + timedelta(seconds=600))
    assert found.exceeded and found.left is None
    assert "activeDeadlineSeconds (600 s)" in found.message and STARTED in found.message


@pytest.mark.parametrize(
    ("before", "held", "want"),
    [
        (None, False, format_time(T0 + timedelta(hours=1))),  # first pass that runs: now
        ("2025-01-01T00:00:00Z", False, "2025-01-01T00:00:00Z"),  # kept
        ("2025-01-01T00:00:00Z", True, None),  # held: cleared, the deadline starts over
    ],
)
def test_start_time(before: str | None, held: bool, want: str | None) -> None:
    status = TrainingJobStatus(start_time=before)
    assert start_time(status, held=held, now=T0 + timedelta(hours=1)) == want


@pytest.mark.parametrize(
    ("before", "finished", "want"),
    [
        (None, False, None),
        (None, True, format_time(T0)),
        ("2025-01-01T00:00:00Z", True, "2025-01-01T00:00:00Z"),  # set once
    ],
)
def test_completion_time(before: str | None, finished: bool, want: str | None) -> None:
    status = TrainingJobStatus(completion_time=before)
    assert completion_time(status, finished=finished, now=T0) == want


@pytest.mark.parametrize(
    ("ttl", "completed", "after_s", "want"),
    [
        (None, STARTED, 10**6, Expiry(delete=False, left=None)),
        (60, None, 10**6, Expiry(delete=False, left=None)),  # not finished
        (60, STARTED, 45, Expiry(delete=False, left=timedelta(seconds=15))),
        (60, STARTED, 60, Expiry(delete=True, left=None)),
        (0, STARTED, 0, Expiry(delete=True, left=None)),  # 0: deleted as soon as it ends
    ],
)
def test_expiry(ttl: int | None, completed: str | None, after_s: int, want: Expiry) -> None:
    spec = {} if ttl is None else {"ttlSecondsAfterFinished": ttl}
    assert expiry(job(**spec), completed, T0 + timedelta(seconds=after_s)) == want
