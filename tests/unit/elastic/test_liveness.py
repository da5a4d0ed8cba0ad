"""A node is lost when its Lease is overdue and its workers silent, never on one signal alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from elastra.elastic.liveness import (
    SILENT_AFTER,
    NodeSignals,
    lease_overdue,
    lease_overdue_after,
    node_lost,
    silence,
)

NOW = datetime(2026, 12, 4, 5, 0, 0, tzinfo=UTC)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def signals(
    lease: float | None, workers: int, silent: float | None, lease_s: int = 0
) -> NodeSignals:
    """A Lease renewed ``lease`` s ago (of ``lease_s`` s; 0: the default), ``workers`` asked,
    silent for ``silent`` s (``None``: one answered)."""
    return NodeSignals(
        None if lease is None else ago(lease),
        timedelta(seconds=lease_s) if lease_s else None,
        workers,
        None if silent is None else ago(silent),
    )


CASES = [
    pytest.param(signals(3, 2, None), False, id="healthy"),
    pytest.param(signals(3, 2, 9), False, id="lease fresh, workers silent: a network blip"),
    pytest.param(signals(30, 2, None), False, id="slow kubelet, workers answer"),
    pytest.param(signals(13, 1, 1), False, id="lease overdue, silent for 1 s only"),
    pytest.param(signals(11, 1, 5), False, id="lease 11 s old: a renewal late, not missed"),
    pytest.param(signals(13, 1, 3), True, id="lease overdue, workers silent 3 s"),
    pytest.param(signals(60, 3, 50), True, id="the node controller's grace long past"),
    pytest.param(signals(None, 1, 60), False, id="no Lease: left to the node controller"),
    pytest.param(signals(60, 0, 60), False, id="no worker to ask: left to the node controller"),
    pytest.param(signals(4, 1, 3, lease_s=10), True, id="a 10 s Lease is overdue after 3 s"),
    pytest.param(signals(13, 1, 3, lease_s=100), False, id="a 100 s Lease is not at 13 s"),
]


@pytest.mark.parametrize(("found", "lost"), CASES)
def test_a_node_is_lost_only_when_its_lease_and_its_workers_both_say_so(
    found: NodeSignals, lost: bool
) -> None:
    verdict = node_lost("n1", found, NOW)
    assert (verdict is not None) is lost
    if verdict is not None:
        assert found.renewed is not None
        assert verdict.lease_age == NOW - found.renewed
        assert "node n1: Lease not renewed" in verdict.message


def test_the_default_lease_is_overdue_after_one_missed_renewal() -> None:
    # The kubelet renews every 10 s (a quarter of 40 s): 12 s is late, 10.4 s (jitter) is not.
    assert lease_overdue_after(None) == timedelta(seconds=12)
    assert not lease_overdue(NodeSignals(ago(10.4)), NOW)
    assert lease_overdue(NodeSignals(ago(12.5)), NOW)


@pytest.mark.parametrize(
    ("previous", "answered", "expected"),
    [
        (None, True, None),
        (ago(5), True, None),  # any answer ends the silence
        (None, False, NOW),  # the first unanswered round starts it
        (ago(5), False, ago(5)),  # later ones keep its start
    ],
)
def test_silence_starts_at_the_first_unanswered_round(
    previous: datetime | None, answered: bool, expected: datetime | None
) -> None:
    assert silence(previous, answered=answered, probed_at=NOW) == expected


def test_silence_past_the_threshold_is_needed() -> None:
    just = NodeSignals(ago(20), None, 1, NOW - SILENT_AFTER + timedelta(milliseconds=1))
    assert node_lost("n1", just, NOW) is None
    assert node_lost("n1", NodeSignals(ago(20), None, 1, NOW - SILENT_AFTER), NOW) is not None
