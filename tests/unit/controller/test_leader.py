"""Who may hold the operator Lease, decided on a clock the test controls."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from elastra.controller.engine.leader import can_take

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def lease(holder: str | None, renewed: datetime, seconds: int = 15) -> dict[str, object]:
    return {
        "spec": {
            "holderIdentity": holder,
            "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "leaseDurationSeconds": seconds,
        }
    }


def test_free_or_own_lease_can_be_taken() -> None:
    assert can_take(None, "a", NOW)
    assert can_take(lease(None, NOW), "a", NOW)
    assert can_take(lease("a", NOW), "a", NOW)


def test_someone_elses_live_lease_cannot() -> None:
    assert not can_take(lease("b", NOW - timedelta(seconds=10)), "a", NOW)


def test_an_expired_lease_can() -> None:
    assert can_take(lease("b", NOW - timedelta(seconds=16)), "a", NOW)
