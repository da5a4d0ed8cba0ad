"""A node is lost when its Lease is overdue and its workers silent, never on one signal alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from elastra.elastic.liveness import (
    PEERS_LOST_METRIC,
    SILENT_AFTER,
    NodeSignals,
    lease_overdue,
    lease_overdue_after,
    node_lost,
    peers_lost_version,
    silence,
)
from elastra_worker import metrics as worker_metrics

NOW = datetime(2026, 12, 4, 5, 0, 0, tzinfo=UTC)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def signals(
    lease: float | None,
    workers: int,
    silent: float | None,
    lease_s: int = 0,
    *,
    peers_lost: bool = False,
) -> NodeSignals:
    """A Lease renewed ``lease`` s ago (of ``lease_s`` s; 0: the default), ``workers`` asked,
    silent for ``silent`` s (``None``: one answered), ``peers_lost``: a world there lost a
    member."""
    return NodeSignals(
        None if lease is None else ago(lease),
        timedelta(seconds=lease_s) if lease_s else None,
        workers,
        None if silent is None else ago(silent),
        peers_lost,
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
    pytest.param(
        signals(1, 2, 3, peers_lost=True), True, id="lease fresh, a collective failed, silent 3 s"
    ),
    pytest.param(
        signals(1, 2, 2, peers_lost=True), False, id="a collective failed, silent 2 s only"
    ),
    pytest.param(
        signals(30, 2, None, peers_lost=True), False, id="a collective failed, workers answer"
    ),
    pytest.param(signals(None, 1, 9, peers_lost=True), False, id="a collective failed, no Lease"),
    pytest.param(
        signals(13, 1, 2, peers_lost=True), True, id="lease overdue and a collective failed"
    ),
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
        by_lease = lease_overdue(found, NOW)
        assert verdict.peers_lost is not by_lease
        said = "reported a failed collective" if verdict.peers_lost else "n1: Lease not renewed"
        assert said in verdict.message


@pytest.mark.parametrize(
    ("page", "version"),
    [
        ("elastra_worker_step 3.0\nelastra_worker_peers_lost_world_version 4.0\n", 4),
        ("elastra_worker_step 3.0\nelastra_worker_world_version 4.0\n", None),
        ("elastra_worker_peers_lost_world_version NaNx\n", None),
        ("elastra_worker_peers_lost_world_version +Inf\n", None),
        ("", None),
    ],
)
def test_a_workers_page_says_which_world_lost_a_member(page: str, version: int | None) -> None:
    assert peers_lost_version(page) == version


def test_the_operator_reads_the_gauge_the_agent_exports() -> None:
    assert PEERS_LOST_METRIC == worker_metrics.PEERS_LOST_METRIC


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
