"""The informer against a tiny local API server: list, watch from the list's version, relist
on 410 Gone, tell listeners only what changed in the store, and count each request once."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import web

from elastra.kube.client import Kube
from elastra.kube.config import Connection
from elastra.kube.informer import Informer
from tests.unit.kube.test_client import serving


def pod(name: str, version: int, *, job: str | None = None, phase: str = "Pending") -> Any:
    labels = {"job": job} if job else {}
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "resourceVersion": str(version),
            "labels": labels,
            "managedFields": [{"manager": "kubectl"}],
        },
        "status": {"phase": phase},
    }


class Server:
    """Answers lists from ``pages`` and each watch with the next script of events."""

    def __init__(
        self, pages: list[dict[str, Any]], watches: list[list[dict[str, Any]] | int]
    ) -> None:
        self.pages = pages
        self.watches = watches
        self.seen: list[dict[str, str]] = []
        self.done = asyncio.Event()
        self.stop = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(dict(request.query))
        if request.query.get("watch") != "1":
            return web.json_response(self.pages.pop(0))
        if not self.watches:
            self.done.set()
            await self.stop.wait()  # a watch that stays open: nothing more happens
        script = self.watches.pop(0)
        if isinstance(script, int):
            return web.json_response({"reason": "Expired"}, status=script)
        response = web.StreamResponse()
        await response.prepare(request)
        for event in script:
            await response.write(json.dumps(event).encode() + b"\n")
        return response


def test_lists_watches_relists_on_gone_and_tells_only_changes() -> None:
    server = Server(
        pages=[
            {"metadata": {"resourceVersion": "10", "continue": "t"}, "items": [pod("a", 5)]},
            {"metadata": {"resourceVersion": "99"}, "items": [pod("b", 6)]},
            {"metadata": {"resourceVersion": "30"}, "items": [pod("b", 21), pod("c", 22)]},
        ],
        watches=[
            [
                {"type": "MODIFIED", "object": pod("a", 11, phase="Running")},
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "12"}}},
            ],
            [
                {"type": "DELETED", "object": pod("a", 13)},
                {"type": "ERROR", "object": {"code": 410, "reason": "Expired"}},
            ],
        ],
    )
    told: list[tuple[str, str]] = []

    async def scenario() -> tuple[Informer, Kube]:
        async with serving(server.handle) as url, Kube(Connection(server=url)) as kube:
            informer = Informer(kube, "/api/v1/pods", watch_timeout_s=60)
            informer.listeners.append(
                lambda kind, old, new: told.append((kind, (new or old or {})["metadata"]["name"]))
            )
            task = asyncio.create_task(informer.run())
            await asyncio.wait_for(server.done.wait(), timeout=10)
            task.cancel()
            server.stop.set()
            return informer, kube

    informer, kube = asyncio.run(scenario())
    watches = [q for q in server.seen if q.get("watch") == "1"]
    assert [q["resourceVersion"] for q in watches] == ["10", "12", "30"]
    assert all(q["allowWatchBookmarks"] == "true" for q in watches)
    assert all(30 <= int(q["timeoutSeconds"]) <= 60 for q in watches)
    assert told == [
        ("ADDED", "a"),
        ("ADDED", "b"),
        ("MODIFIED", "a"),
        ("DELETED", "a"),
        ("MODIFIED", "b"),  # the relist: b changed while the watch was gone
        ("ADDED", "c"),
    ]
    assert sorted(p["metadata"]["name"] for p in informer.items()) == ["b", "c"]
    assert all("managedFields" not in p["metadata"] for p in informer.items())
    assert informer.synced and informer.lists == 2
    assert kube.requests == {"GET": 3, "WATCH": 3}


def test_a_watch_refused_with_410_lists_again_at_once(caplog: pytest.LogCaptureFixture) -> None:
    server = Server(
        pages=[
            {"metadata": {"resourceVersion": "1"}, "items": [pod("a", 1)]},
            {"metadata": {"resourceVersion": "5"}, "items": [pod("a", 4)]},
        ],
        watches=[410],
    )

    async def scenario() -> Informer:
        async with serving(server.handle) as url, Kube(Connection(server=url)) as kube:
            informer = Informer(kube, "/api/v1/pods")
            task = asyncio.create_task(informer.run())
            await asyncio.wait_for(server.done.wait(), timeout=5)
            task.cancel()
            server.stop.set()
            return informer

    informer = asyncio.run(scenario())
    assert informer.lists == 2
    assert "listing again in" not in caplog.text, "no backoff: 410 is not a failure"
    assert informer.get("ns", "a")["metadata"]["resourceVersion"] == "4"  # type: ignore[index]


def test_a_change_the_transform_drops_is_silent() -> None:
    told: list[str] = []
    informer = Informer(None, "/api/v1/nodes", transform=lambda o: {"metadata": o["metadata"]})
    informer.listeners.append(lambda kind, old, new: told.append(kind))
    informer.replace([{"metadata": {"name": "n1"}, "status": {"heartbeat": 1}}], "1")
    before = informer.version
    informer.apply({"type": "MODIFIED", "object": {"metadata": {"name": "n1"}, "status": {}}})
    assert told == ["ADDED"] and informer.version == before


def test_groups_follow_their_objects() -> None:
    informer = Informer(None, "/api/v1/pods", index=lambda p: p["metadata"]["labels"].get("job"))
    informer.replace([pod("a", 1, job="x"), pod("b", 2, job="x"), pod("c", 3)], "3")
    assert sorted(p["metadata"]["name"] for p in informer.indexed("x")) == ["a", "b"]
    informer.apply({"type": "MODIFIED", "object": pod("a", 4, job="y")})
    informer.apply({"type": "DELETED", "object": pod("b", 5, job="x")})
    assert informer.indexed("x") == []
    assert [p["metadata"]["name"] for p in informer.indexed("y")] == ["a"]


def test_our_write_replaces_only_the_version_it_was_made_from() -> None:
    informer = Informer(None, "/api/v1/pods")
    informer.replace([pod("a", 1)], "1")
    informer.written("1", pod("a", 2, phase="Running"))
    assert informer.get("ns", "a")["metadata"]["resourceVersion"] == "2"  # type: ignore[index]
    informer.apply({"type": "MODIFIED", "object": pod("a", 3)})
    informer.written("2", pod("a", 4))  # the watch already brought a newer one
    assert informer.get("ns", "a")["metadata"]["resourceVersion"] == "3"  # type: ignore[index]
