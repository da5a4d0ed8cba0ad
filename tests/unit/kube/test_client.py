"""The client against a tiny local aiohttp server: transient answers retried honouring
Retry-After, a 401 answered with fresh credentials, an unreachable server in one line."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from elastra.kube.client import (
    ApiError,
    Kube,
    RetryPolicy,
    UnreachableError,
    gather_limited,
    resource_of,
)
from elastra.kube.config import Connection
from elastra.kube.credentials import Identity

Handler = Callable[[web.Request], Awaitable[web.Response]]


@asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[str]:
    """An HTTP server on a free local port answering every path with ``handler``."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@dataclass
class Sleeps:
    """An injected sleep that records the delays and does not wait."""

    delays: list[float] = field(default_factory=list)

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


def test_429_with_retry_after_then_200() -> None:
    answers = [
        web.json_response({"reason": "TooManyRequests"}, status=429, headers={"Retry-After": "3"}),
        web.json_response({"kind": "PodList", "items": [{"metadata": {"name": "p"}}]}),
    ]

    async def handler(request: web.Request) -> web.Response:
        return answers.pop(0)

    async def scenario() -> tuple[list[dict[str, object]], Kube]:
        sleeps = Sleeps()
        async with serving(handler) as server:
            kube = Kube(Connection(server=server), retry=RetryPolicy(sleep=sleeps))
            async with kube:
                pods = await kube.list("/api/v1/pods")
        assert sleeps.delays == [3.0]
        return pods, kube

    pods, kube = asyncio.run(scenario())
    assert [p["metadata"] for p in pods] == [{"name": "p"}]
    assert kube.requests["GET"] == 2  # the retry is a request, and counted


def test_transient_errors_give_up_after_bounded_attempts() -> None:
    seen = 0

    async def handler(request: web.Request) -> web.Response:
        nonlocal seen
        seen += 1
        body = {"reason": "Timeout", "message": "Too large resource version: 9, current: 5"}
        return web.json_response(body, status=504)

    async def scenario() -> list[float]:
        sleeps = Sleeps()
        async with serving(handler) as server:
            policy = RetryPolicy(attempts=4, first_delay_s=0.5, sleep=sleeps)
            async with Kube(Connection(server=server), retry=policy) as kube:
                with pytest.raises(ApiError, match="504 Timeout: Too large resource version"):
                    await kube.request("GET", "/api/v1/pods")
        return sleeps.delays

    assert asyncio.run(scenario()) == [0.5, 1.0, 2.0]  # doubling, no Retry-After
    assert seen == 4


def test_retry_stops_when_the_time_budget_is_spent() -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response({}, status=503, headers={"Retry-After": "10"})

    async def scenario() -> list[float]:
        sleeps = Sleeps()
        async with serving(handler) as server:
            policy = RetryPolicy(attempts=10, max_delay_s=10.0, budget_s=5.0, sleep=sleeps)
            async with Kube(Connection(server=server), retry=policy) as kube:
                with pytest.raises(ApiError, match="503"):
                    await kube.request("GET", "/version")
        return sleeps.delays

    assert asyncio.run(scenario()) == []  # waiting 10 s would overrun the 5 s budget


@dataclass
class RotatingToken:
    """Credentials whose token changes each time they are invalidated."""

    generation: int = 1
    invalidated: int = 0

    def identity(self) -> Identity:
        return Identity(token=f"token-{self.generation}")

    def invalidate(self) -> None:
        self.invalidated += 1
        self.generation += 1


def test_401_refreshes_the_credentials_once() -> None:
    async def handler(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != "Bearer token-2":
            return web.json_response({"reason": "Unauthorized"}, status=401)
        return web.json_response({"gitVersion": "v1.31.0"})

    credentials = RotatingToken()

    async def scenario() -> dict[str, object]:
        async with serving(handler) as server:
            kube = Kube(Connection(server=server, credentials=credentials))
            async with kube:
                return await kube.request("GET", "/version")

    assert asyncio.run(scenario()) == {"gitVersion": "v1.31.0"}
    assert credentials.invalidated == 1


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_unreachable_server_is_one_line_naming_it() -> None:
    server = f"https://127.0.0.1:{closed_port()}"
    connection = Connection(server=server, source="kubeconfig /k, context kind-x")

    async def scenario() -> None:
        async with Kube(connection) as kube:
            await kube.request("GET", "/version")

    with pytest.raises(UnreachableError) as err:
        asyncio.run(scenario())
    assert str(err.value) == (
        f"cannot reach the API server at {server} (connection refused): is the cluster up? "
        "(kubeconfig /k, context kind-x)"
    )


@pytest.mark.parametrize(
    ("path", "resource"),
    [
        ("/api/v1/namespaces/ns/pods/p/status", "pods"),
        ("/api/v1/pods?watch=1", "pods"),
        ("/api/v1/nodes", "nodes"),
        ("/apis/coordination.k8s.io/v1/namespaces/ns/leases/elastra-operator", "leases"),
        ("/apis/elastra.dev/v1alpha1/trainingjobs", "trainingjobs"),
        ("/api/v1/namespaces/ns", "namespaces"),
        ("/version", "version"),
    ],
)
def test_requests_are_counted_by_the_resource_they_are_about(path: str, resource: str) -> None:
    """The metric's ``resource`` label: what lets a test tell lease renewals from job work."""
    assert resource_of(path) == resource


def test_gather_limited_lets_every_job_end_before_raising_the_first_failure() -> None:
    """A batch's failure surfaces only once no write of it is in flight: the caller's
    reservations must outlive every create, not just the first refused one."""
    slow_done = asyncio.Event()
    in_flight = 0
    most = 0

    async def refused() -> None:
        raise ApiError(422, "refused", "quota")

    async def slow() -> str:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        for _ in range(3):
            await asyncio.sleep(0)
        in_flight -= 1
        slow_done.set()
        return "created"

    async def scenario() -> list[str]:
        with pytest.raises(ApiError) as raised:
            await gather_limited(2, refused(), slow(), slow())
        assert raised.value.status == 422
        assert slow_done.is_set() and in_flight == 0
        return await gather_limited(2, slow(), slow(), slow())

    assert asyncio.run(scenario()) == ["created"] * 3
    assert most <= 2  # never more than the limit in flight
