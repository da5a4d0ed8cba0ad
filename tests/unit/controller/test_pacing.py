"""When a status that only reports progress is written: the table of what is progress and what
waits."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from elastra.api import Condition, ConditionStatus, ConditionType, TrainingJobStatus
from elastra.controller.decide.pacing import STATUS_PACE, progress_only, status_wait
from tests.unit.controller.fakecluster import T0

FORMING = "world forming: 3 of 8 workers running"


def status(
    *,
    message: str = FORMING,
    reason: str = "NotRunning",
    state: ConditionStatus = ConditionStatus.FALSE,
    **fields: Any,
) -> TrainingJobStatus:
    running = Condition(
        type=ConditionType.RUNNING,
        status=state,
        reason=reason,
        message=message,
        last_transition_time="2026-01-01T00:00:00Z",
    )
    return TrainingJobStatus(conditions=[running], ready_replicas=3, replicas=8).model_copy(
        update=fields
    )


BEFORE = status()


def with_condition(
    base: TrainingJobStatus, kind: ConditionType, state: ConditionStatus, reason: str
) -> TrainingJobStatus:
    """``base`` with one more condition."""
    extra = Condition(type=kind, status=state, reason=reason, message=reason)
    return base.model_copy(update={"conditions": [*base.conditions, extra]})


def forming(**running: Any) -> TrainingJobStatus:
    """A world forming (Resizing True) whose Running condition is ``status(**running)``'s."""
    return with_condition(
        status(**running), ConditionType.RESIZING, ConditionStatus.TRUE, "ScaledUp"
    )


def formed() -> TrainingJobStatus:
    """The world of ``forming`` with every member Ready: Resizing False, Running True."""
    return with_condition(
        status(state=ConditionStatus.TRUE, reason="WorldRunning", ready_replicas=8),
        ConditionType.RESIZING,
        ConditionStatus.FALSE,
        "Steady",
    )


def suspended(message: str) -> TrainingJobStatus:
    """``BEFORE`` with a Suspended condition saying ``message``."""
    held = Condition(
        type=ConditionType.SUSPENDED,
        status=ConditionStatus.TRUE,
        reason="AwaitingAdmission",
        message=message,
    )
    return BEFORE.model_copy(update={"conditions": [*BEFORE.conditions, held]})


CHANGES: list[tuple[str, TrainingJobStatus, TrainingJobStatus, bool]] = [
    ("Running's message", BEFORE, status(message="world forming: 5 of 8 workers running"), True),
    ("one more Ready worker", BEFORE, status(ready_replicas=4), True),
    (
        "both",
        BEFORE,
        status(message="world forming: 4 of 8 workers running", ready_replicas=4),
        True,
    ),
    ("Suspended's message", suspended("creating the Workload"), suspended("no quota"), False),
    ("a new condition", BEFORE, suspended("creating the Workload"), False),
    ("nothing", BEFORE, status(), False),
    ("a condition's status", BEFORE, status(state=ConditionStatus.TRUE), False),
    ("a condition's reason", BEFORE, status(reason="WorldRunning"), False),
    ("a count and a reason", BEFORE, status(reason="WorldRunning", ready_replicas=8), False),
    ("pods in the job", BEFORE, status(replicas=7), False),
    ("the restarts", BEFORE, status(restarts=1), False),
    (
        "Running turns True while the world forms",
        forming(),
        forming(state=ConditionStatus.TRUE, reason="WorldRunning"),
        True,
    ),
    (
        "Placed turns True while the world forms",
        forming(),
        with_condition(forming(), ConditionType.PLACED, ConditionStatus.TRUE, "AllBound"),
        True,
    ),
    ("the world formed: Resizing turns False", forming(), formed(), False),
    (
        "Degraded while the world forms",
        forming(),
        with_condition(forming(), ConditionType.DEGRADED, ConditionStatus.TRUE, "WorkerLost"),
        False,
    ),
    ("the world forming again", formed(), forming(), False),
]


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [(before, after, expected) for _, before, after, expected in CHANGES],
    ids=[what for what, _, _, _ in CHANGES],
)
def test_counts_and_a_forming_worlds_placed_and_running_are_progress(
    before: TrainingJobStatus, after: TrainingJobStatus, expected: bool
) -> None:
    assert progress_only(before, after) is expected


MORE_READY = status(ready_replicas=4)
WAITS: list[tuple[str, TrainingJobStatus, timedelta | None, timedelta | None]] = [
    (
        "a count, written 2 s ago",
        MORE_READY,
        timedelta(seconds=2),
        STATUS_PACE - timedelta(seconds=2),
    ),
    ("a count, written a pace ago", MORE_READY, STATUS_PACE, None),
    ("a count, written long ago", MORE_READY, timedelta(minutes=5), None),
    ("a count, not written since the operator started", MORE_READY, None, None),
    ("a reason, written 1 s ago", status(reason="WorldRunning"), timedelta(seconds=1), None),
    ("nothing new, written 1 s ago", status(), timedelta(seconds=1), None),
    (
        "a count, written by a clock ahead of this one",
        MORE_READY,
        -timedelta(minutes=1),
        STATUS_PACE,
    ),
]


@pytest.mark.parametrize(
    ("after", "ago", "expected"),
    [(after, ago, expected) for _, after, ago, expected in WAITS],
    ids=[what for what, _, _, _ in WAITS],
)
def test_a_count_waits_out_the_pace_from_the_last_write_and_nothing_else_waits(
    after: TrainingJobStatus, ago: timedelta | None, expected: timedelta | None
) -> None:
    written = None if ago is None else T0 - ago
    assert status_wait(BEFORE, after, written=written, now=T0) == expected
