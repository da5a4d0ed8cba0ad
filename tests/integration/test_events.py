"""Events aggregate on the real API server: the same event recorded five times is one Event
with count 5, a different message is a second Event, and a new client (an operator restart)
or a deleted Event (the server's event TTL) continues or restarts the count without a copy.

What is asserted is read back with kubectl, as ``kubectl describe tj`` users see it.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from e2e.cluster.api import wait_for

from elastra.kube import events
from elastra.kube.client import Kube
from elastra.kube.config import load_connection
from tests.cases.specs import base_manifest
from tests.integration.conftest import LocalCluster

T0 = datetime(2026, 12, 1, 3, 0, 0, tzinfo=UTC)
UNPLACEABLE = "no node has 8 free H100"
SETTLE_S = 30.0
"""Deadline for a write to show in a list (the API server may answer lists from its cache)."""


def job_events(cluster: LocalCluster, namespace: str, name: str) -> list[dict[str, Any]]:
    """Events about one TrainingJob, as kubectl lists them."""
    found: list[dict[str, Any]] = cluster.get(
        "events",
        "-n",
        namespace,
        f"--field-selector=involvedObject.kind=TrainingJob,involvedObject.name={name}",
    )["items"]
    return found


def counts(cluster: LocalCluster, namespace: str, name: str) -> dict[str, int]:
    """message -> count of the job's Events (a duplicate message would show as a lost key)."""
    found = job_events(cluster, namespace, name)
    by_message = {e["message"]: e["count"] for e in found}
    assert len(by_message) == len(found), f"two Events with one message: {found}"
    return by_message


def settled(cluster: LocalCluster, namespace: str, name: str, want: dict[str, int]) -> None:
    """Wait, with a deadline, until the job's Events are ``want`` (message -> count)."""

    def probe() -> dict[str, int] | None:
        seen = counts(cluster, namespace, name)
        return seen if seen == want else None

    wait_for(
        f"events {want}",
        probe,
        timeout=SETTLE_S,
        hint=lambda: str(counts(cluster, namespace, name)),
    )


async def record(kube: Kube, job: dict[str, Any], message: str, *, at: datetime) -> None:
    await events.record_event(
        kube, job, kind="Warning", reason="Unschedulable", message=message, now=at
    )


def test_repeated_events_are_counted_on_one_event(cluster: LocalCluster, namespace: str) -> None:
    cluster.apply(base_manifest("evented"), namespace=namespace)
    job = cluster.get("trainingjobs.elastra.dev", "evented", "-n", namespace)
    connection = load_connection(str(cluster.kubeconfig))

    async def five_then_another() -> int:
        async with Kube(connection) as kube:
            for minute in range(5):
                await record(kube, job, UNPLACEABLE, at=T0 + timedelta(minutes=minute))
            await record(kube, job, "no node has 4 free A100", at=T0 + timedelta(minutes=5))
            return sum(kube.requests.values())

    requests = asyncio.run(five_then_another())
    assert requests == 6  # one create, four patches, one create
    settled(cluster, namespace, "evented", {UNPLACEABLE: 5, "no node has 4 free A100": 1})
    (event,) = [e for e in job_events(cluster, namespace, "evented") if e["count"] == 5]
    assert event["involvedObject"]["uid"] == job["metadata"]["uid"]
    assert event["firstTimestamp"] == "2026-12-01T03:00:00Z"
    assert event["lastTimestamp"] == "2026-12-01T03:04:00Z"
    assert (event["type"], event["reason"]) == ("Warning", "Unschedulable")


def test_a_restart_continues_the_count_and_an_expired_event_starts_again(
    cluster: LocalCluster, namespace: str
) -> None:
    cluster.apply(base_manifest("restarted"), namespace=namespace)
    job = cluster.get("trainingjobs.elastra.dev", "restarted", "-n", namespace)
    connection = load_connection(str(cluster.kubeconfig))

    async def twice_with_a_new_client() -> None:
        for hour in range(2):
            async with Kube(connection) as kube:  # a new client: an empty cache
                await record(kube, job, UNPLACEABLE, at=T0 + timedelta(hours=hour))
                await record(kube, job, UNPLACEABLE, at=T0 + timedelta(hours=hour, minutes=1))

    asyncio.run(twice_with_a_new_client())
    settled(cluster, namespace, "restarted", {UNPLACEABLE: 4})
    (event,) = job_events(cluster, namespace, "restarted")
    assert event["lastTimestamp"] == "2026-12-01T04:01:00Z"

    async def after_expiry() -> None:
        async with Kube(connection) as kube:
            await record(kube, job, UNPLACEABLE, at=T0 + timedelta(hours=3))
            cluster.kubectl("delete", "event", event["metadata"]["name"], "-n", namespace)
            await record(kube, job, UNPLACEABLE, at=T0 + timedelta(hours=4))

    asyncio.run(after_expiry())
    settled(cluster, namespace, "restarted", {UNPLACEABLE: 1})
    (again,) = job_events(cluster, namespace, "restarted")
    assert again["firstTimestamp"] == "2026-12-01T07:00:00Z"
