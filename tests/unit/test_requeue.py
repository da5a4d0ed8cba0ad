"""Requeue: when the next pass is due; zero is "now", never is a value, the earliest wins."""

from __future__ import annotations

from datetime import timedelta

import pytest

from elastra.requeue import Requeue

S = timedelta(seconds=1)
RESYNC = 300 * S


@pytest.mark.parametrize(
    ("requeue", "wait"),
    [
        (Requeue.NOW, timedelta(0)),
        (Requeue.after(timedelta(0)), timedelta(0)),
        (Requeue.after(-5 * S), timedelta(0)),  # a deadline already past
        (Requeue.after(5 * S), 5 * S),
        (Requeue.after(RESYNC + S), RESYNC),
        (Requeue.NEVER, RESYNC),
    ],
)
def test_the_wait_is_the_delay_at_most_the_limit(requeue: Requeue, wait: timedelta) -> None:
    assert requeue.within(RESYNC) == wait


@pytest.mark.parametrize(
    ("left", "earliest"),
    [
        ((), Requeue.NEVER),
        ((None, None), Requeue.NEVER),
        ((None, 7 * S, 3 * S), Requeue.after(3 * S)),
        ((timedelta(0), 3 * S), Requeue.NOW),  # zero is a deadline, not "none"
        ((-2 * S, None), Requeue.NOW),
    ],
)
def test_earliest_takes_the_first_deadline_set(
    left: tuple[timedelta | None, ...], earliest: Requeue
) -> None:
    assert Requeue.earliest(*left) == earliest


def test_requeues_order_by_when_they_are_due_never_last() -> None:
    due = [Requeue.NEVER, Requeue.after(2 * S), Requeue.NOW]
    assert sorted(due) == [Requeue.NOW, Requeue.after(2 * S), Requeue.NEVER]
    assert min(Requeue.NOW, Requeue.NEVER) == Requeue.NOW
    assert Requeue.NEVER.is_never and not Requeue.after(RESYNC).is_never
