"""Events that aggregate: a repeat is one patch of one Event, and whatever the recorder's cache
does not know (an operator restart, an expired Event, a concurrent writer, an evicted entry) is
repaired without a duplicate and without an error.

Against a small in-memory Events API (aiohttp on a local port) that keeps resourceVersions and
answers 404 and 409 as the API server does, so the test reads the stored Events and the
requests made, not calls to a mock. The real API server: tests/integration/test_events.py.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiohttp import web

from elastra.kube import events
from elastra.kube.client import Kube
from elastra.kube.config import Connection
from elastra.kube.events import (
    ATTEMPTS,
    MESSAGE_LIMIT,
    EventRecorder,
    EventsGaveUpError,
    recorder_for,
)

NAMESPACE = "team-a"
JOB: dict[str, Any] = {
    "apiVersion": "elastra.dev/v1alpha1",
    "kind": "TrainingJob",
    "metadata": {"name": "gpt", "namespace": NAMESPACE, "uid": "u-1", "resourceVersion": "7"},
}
T0 = datetime(2026, 12, 1, 3, 0, 0, tzinfo=UTC)
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "status": "Failure", "reason": reason, "message": message}
    return web.json_response(body, status=code)


@dataclass
class EventsApi:
    """The Events of one namespace, with the API server's answers for create, get and patch."""

    stored: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    version: int = 100
    vanishing: bool = False
    """Every read finds nothing and every create finds it there (something keeps deleting)."""

    def bump(self, event: dict[str, Any]) -> None:
        self.version += 1
        event["metadata"]["resourceVersion"] = str(self.version)

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append((request.method, request.path))
        base = f"/api/v1/namespaces/{NAMESPACE}/events"
        name = request.path.removeprefix(base).strip("/")
        if request.method == "POST" and not name:
            return self._create(await request.json())
        found = None if self.vanishing else self.stored.get(name)
        if found is None:
            return _status(404, "NotFound", f'events "{name}" not found')
        if request.method == "GET":
            return web.json_response(found)
        if request.method == "PATCH":
            return self._patch(found, json.loads(await request.text()))
        return _status(405, "MethodNotAllowed", request.method)

    def _create(self, event: dict[str, Any]) -> web.Response:
        name = event["metadata"]["name"]
        if name in self.stored or self.vanishing:
            return _status(409, "AlreadyExists", f'events "{name}" already exists')
        self.bump(event)
        self.stored[name] = event
        return web.json_response(event, status=201)

    def _patch(self, found: dict[str, Any], patch: dict[str, Any]) -> web.Response:
        wanted = (patch.get("metadata") or {}).pop("resourceVersion", None)
        if wanted is not None and wanted != found["metadata"]["resourceVersion"]:
            return _status(409, "Conflict", "the object has been modified")
        found.update({k: v for k, v in patch.items() if k != "metadata"})
        self.bump(found)
        return web.json_response(found)

    def verbs(self) -> list[str]:
        return [method for method, _ in self.requests]

    def only(self) -> dict[str, Any]:
        (event,) = self.stored.values()
        return event


@asynccontextmanager
async def serving(api: EventsApi) -> AsyncIterator[Kube]:
    """A client talking to ``api`` on a free local port."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", api.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with Kube(Connection(server=f"http://127.0.0.1:{port}")) as kube:
            yield kube
    finally:
        await runner.cleanup()


def run(api: EventsApi, scenario: Callable[[Kube], Awaitable[None]]) -> None:
    async def main() -> None:
        async with serving(api) as kube:
            await scenario(kube)

    asyncio.run(main())


async def warn(
    kube: Kube, message: str = "no node has 8 free A100", *, at: datetime = T0, **kw: Any
) -> dict[str, Any]:
    return await events.record_event(
        kube,
        kw.pop("job", JOB),
        kind=kw.pop("kind", "Warning"),
        reason=kw.pop("reason", "Unschedulable"),
        message=message,
        now=at,
    )


def test_five_repeats_are_one_event_counted_five_times_one_request_each() -> None:
    api = EventsApi()

    async def scenario(kube: Kube) -> None:
        for minute in range(5):
            await warn(kube, at=T0 + timedelta(minutes=minute))

    run(api, scenario)
    event = api.only()
    assert event["count"] == 5
    assert event["firstTimestamp"] == "2026-12-01T03:00:00Z"
    assert event["lastTimestamp"] == "2026-12-01T03:04:00Z"
    assert event["involvedObject"]["uid"] == "u-1"
    assert (event["type"], event["reason"]) == ("Warning", "Unschedulable")
    assert api.verbs() == ["POST", "PATCH", "PATCH", "PATCH", "PATCH"]


def test_a_different_message_reason_or_type_is_another_event() -> None:
    api = EventsApi()

    async def scenario(kube: Kube) -> None:
        await warn(kube)
        await warn(kube, "no node has 4 free H100")
        await warn(kube, reason="Degraded")
        await warn(kube, kind="Normal")
        await warn(kube)

    run(api, scenario)
    counts = sorted(e["count"] for e in api.stored.values())
    assert counts == [1, 1, 1, 2]
    assert len({e["metadata"]["name"] for e in api.stored.values()}) == 4
    for name in api.stored:
        assert name.startswith("gpt.") and DNS_SUBDOMAIN.match(name), name


def test_after_an_operator_restart_the_count_continues_on_the_same_event() -> None:
    """A new client has an empty cache: the create finds the Event (409), reads and bumps it."""
    api = EventsApi()

    async def before(kube: Kube) -> None:
        for _ in range(3):
            await warn(kube)

    async def after(kube: Kube) -> None:
        assert len(recorder_for(kube)) == 0
        await warn(kube)
        await warn(kube)

    run(api, before)
    api.requests.clear()
    run(api, after)
    assert api.only()["count"] == 5
    assert api.verbs() == ["POST", "GET", "PATCH", "PATCH"]


def test_an_expired_event_is_created_again() -> None:
    """The API server's event TTL deleted it: the patch's 404 becomes a create, count 1."""
    api = EventsApi()

    async def scenario(kube: Kube) -> None:
        await warn(kube)
        await warn(kube)
        api.stored.clear()
        api.requests.clear()
        again = await warn(kube, at=T0 + timedelta(hours=2))
        assert again["count"] == 1
        assert again["firstTimestamp"] == "2026-12-01T05:00:00Z"

    run(api, scenario)
    assert api.only()["count"] == 1
    assert api.verbs() == ["PATCH", "POST"]


def test_a_stale_cached_version_rereads_and_counts_on_top() -> None:
    """Another writer counted meanwhile: the precondition fails (409), the count is not lost."""
    api = EventsApi()

    async def scenario(kube: Kube) -> None:
        await warn(kube)
        other = api.only()
        other["count"] = 7
        api.bump(other)
        api.requests.clear()
        await warn(kube)

    run(api, scenario)
    assert api.only()["count"] == 8
    assert api.verbs() == ["PATCH", "GET", "PATCH"]


def test_the_cache_is_bounded_and_an_evicted_event_still_counts_right() -> None:
    api = EventsApi()
    recorder = EventRecorder(capacity=2)

    async def scenario(kube: Kube) -> None:
        for text in ("a", "b", "c", "a"):
            await recorder.record(
                kube, JOB, kind="Warning", reason="Unschedulable", message=text, now=T0
            )
            assert len(recorder) <= 2

    run(api, scenario)
    by_message = {e["message"]: e["count"] for e in api.stored.values()}
    assert by_message == {"a": 2, "b": 1, "c": 1}
    assert api.verbs() == ["POST", "POST", "POST", "POST", "GET", "PATCH"]


def test_long_messages_and_names_stay_within_the_api_limits() -> None:
    api = EventsApi()
    long_job = {**JOB, "metadata": {**JOB["metadata"], "name": "j" * 253}}

    async def scenario(kube: Kube) -> None:
        await warn(kube, "x" * 5000, job=long_job)
        await warn(kube, "x" * MESSAGE_LIMIT + "different tail", job=long_job)

    run(api, scenario)
    event = api.only()  # the two messages agree on what is kept, so they are one event
    assert event["count"] == 2
    assert len(event["message"]) == MESSAGE_LIMIT
    assert len(event["metadata"]["name"]) <= 253
    assert DNS_SUBDOMAIN.match(event["metadata"]["name"])


def test_an_event_that_keeps_vanishing_gives_up_with_a_message() -> None:
    api = EventsApi(vanishing=True)

    async def scenario(kube: Kube) -> None:
        with pytest.raises(EventsGaveUpError, match=r"changed or vanished 4 times"):
            await warn(kube)
        assert len(recorder_for(kube)) == 0

    run(api, scenario)
    assert api.verbs() == ["POST", "GET"] * ATTEMPTS
