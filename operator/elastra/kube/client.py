"""A small asynchronous JSON client for the Kubernetes API: the one door Elastra uses.

Elastra needs a dozen verbs on four kinds (Nodes, Pods, Services, Events, TrainingJobs), as
plain dicts it hands to pure code. A thin client over aiohttp (which Kopf already brings)
does that with no generated model classes to convert, shares one connection pool with the
event loop Kopf runs, counts every request (the scale benchmark reports requests per job)
and maps HTTP failures onto a few typed errors the controller can act on: 409 means re-read
and retry, 404 means it is gone, 422 means the server rejected our object.

Answers that say "not now" are retried here, so no caller has to: 429 (API priority and
fairness), 503 and 504 (including a list that asked for a resourceVersion the watch cache has
not reached, "Too large resource version"), with exponential backoff that honours the server's
Retry-After, within a bounded number of attempts and total time. A 401 asks the credentials
for a fresh identity once (an exec plugin's token expired early, a rotated token file). A
server that cannot be reached at all raises ``UnreachableError``, whose message names the address
and the kubeconfig, so the CLI prints one line instead of a traceback.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import time
from collections import Counter
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any
from urllib.parse import urlencode

import aiohttp
from prometheus_client import Counter as Metric
from pydantic_core import from_json, to_json

from elastra.kube.config import Connection
from elastra.kube.credentials import Identity

JsonDict = dict[str, Any]
log = logging.getLogger("elastra.kube")

KILL_AFTER_WRITES_ENV = "ELASTRA_FAULT_KILL_AFTER_WRITES"
"""Fault injection for tests: SIGKILL this process right after its N-th write of a pod or a
TrainingJob returned (the reliability tests kill the operator at every step of a resize)."""
_PROTOCOL_WRITE = re.compile(r"/(pods|trainingjobs)(/|$)")
_WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class ApiError(Exception):
    """The API server answered with an error status."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class NotFoundError(ApiError):
    """404: the object is gone (or never was)."""


class ConflictError(ApiError):
    """409: a resourceVersion precondition failed, or the object already exists."""

    @property
    def already_exists(self) -> bool:
        """True for a create of a name that exists (not a stale write)."""
        return self.reason == "AlreadyExists"


class InvalidError(ApiError):
    """422: the server rejected the object (admission, CEL, schema)."""


class UnreachableError(ConnectionError):
    """No connection to the API server at all (refused, no route, unknown host, TLS, timeout)."""

    def __init__(self, connection: Connection, reason: str) -> None:
        where = f" ({connection.source})" if connection.source else ""
        super().__init__(
            f"cannot reach the API server at {connection.server} ({reason}): "
            f"is the cluster up?{where}"
        )
        self.server = connection.server
        self.reason = reason


RETRYABLE = frozenset({429, 503, 504})
"""Statuses that mean "not now": throttled, unavailable, or a wait that timed out."""


@dataclass(frozen=True)
class RetryPolicy:
    """How long to keep asking when the server says "not now" (injectable for tests)."""

    attempts: int = 6
    first_delay_s: float = 0.5
    max_delay_s: float = 10.0
    budget_s: float = 60.0
    """No retry starts once this much time has passed since the first attempt."""
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    def delay(self, attempt: int, retry_after: str | None) -> float:
        """Seconds before attempt ``attempt + 1``: Retry-After if given, else doubling."""
        backoff = min(self.max_delay_s, self.first_delay_s * 2.0 ** (attempt - 1))
        if retry_after:
            try:
                return min(self.max_delay_s, max(0.0, float(retry_after)))
            except ValueError:
                pass  # an HTTP date: rare from the API server, fall back to our own backoff
        return backoff


API_ERRORS = Metric("elastra_api_errors_total", "Failed API requests", ["status"])
API_REQUESTS = Metric("elastra_api_requests_total", "API requests made", ["verb", "resource"])
MAX_WATCH_LINE = 16 << 20
"""One watch event is one JSON line: a pod or job is kilobytes, so 16 MiB is a broken stream."""

_ERRORS: dict[int, type[ApiError]] = {404: NotFoundError, 409: ConflictError, 422: InvalidError}


class Kube:
    """An open session to one API server. Use as ``async with Kube(connection) as kube``."""

    def __init__(
        self,
        connection: Connection,
        *,
        timeout_s: float = 30.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.connection = connection
        self.requests: Counter[str] = Counter()
        """Requests made, by verb (retries included): what the scale benchmark reports."""
        self.retry = retry or RetryPolicy()
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._tls_identity: tuple[bytes | None, bytes | None] = (None, None)
        self._retired: list[aiohttp.ClientSession] = []
        self._kill_after = int(os.environ.get(KILL_AFTER_WRITES_ENV) or 0)
        self._protocol_writes = 0

    async def __aenter__(self) -> Kube:
        self.open()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self.close()

    def open(self, identity: Identity | None = None) -> aiohttp.ClientSession:
        """The connection pool for ``identity``'s client certificate (inside the event loop).

        A new certificate (an exec plugin's renewed one) needs a new TLS context, so a new pool;
        the old one is closed with the client, not under requests still using it.
        """
        identity = identity or self.connection.credentials.identity()
        tls = (identity.cert_pem, identity.key_pem)
        if self._session is not None and tls != self._tls_identity:
            self._retired.append(self._session)
            self._session = None
        if self._session is None:
            ssl_option: Any = self.connection.ssl_context(identity) or False
            connector = aiohttp.TCPConnector(ssl=ssl_option, limit=32)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
            self._tls_identity = tls
        return self._session

    async def close(self) -> None:
        """Close the connection pools."""
        for session in [*self._retired, *([self._session] if self._session else [])]:
            await session.close()
        self._session, self._retired = None, []

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> JsonDict:
        """One API call; returns the decoded JSON body or raises a typed ``ApiError``.

        Retries 429/503/504 per ``self.retry`` and a 401 once with fresh credentials.
        """
        url = self.connection.server + path
        if params:
            url += "?" + urlencode(params)
        data = None if body is None else to_json(body)
        started, refreshed = time.monotonic(), False
        for attempt in range(1, self.retry.attempts + 1):
            status, answer, retry_after = await self._send(method, url, data, content_type)
            if status == 401 and not refreshed:
                self.connection.credentials.invalidate()
                refreshed = True
                continue
            if status in RETRYABLE and attempt < self.retry.attempts:
                delay = self.retry.delay(attempt, retry_after)
                if time.monotonic() - started + delay <= self.retry.budget_s:
                    why = _error(status, answer)
                    log.info("%s %s: %s; retry in %.1f s", method, path, why, delay)
                    await self.retry.sleep(delay)
                    continue
            if status >= 400:
                if status not in {404, 409}:
                    API_ERRORS.labels(status=str(status)).inc()
                raise _error(status, answer)
            self._count_write(method, path)
            return _decoded(answer) if answer else {}
        raise _error(status, answer)  # the last attempt was a 401 after a refresh

    def _count_write(self, method: str, path: str) -> None:
        """Count a pod or TrainingJob write; die after the N-th when a test asked for it."""
        if not self._kill_after or method not in _WRITE_METHODS:
            return
        if _PROTOCOL_WRITE.search(path.split("?", 1)[0]):
            self._protocol_writes += 1
            if self._protocol_writes >= self._kill_after:
                log.warning("fault injection: killed after write %d", self._protocol_writes)
                os.kill(os.getpid(), signal.SIGKILL)

    async def _send(
        self, method: str, url: str, data: bytes | None, content_type: str
    ) -> tuple[int, bytes, str | None]:
        """One HTTP exchange: status, body, Retry-After; ``UnreachableError`` if no connection."""
        identity = self.connection.credentials.identity()
        session = self.open(identity)
        headers = {"Accept": "application/json"}
        if identity.token:
            headers["Authorization"] = f"Bearer {identity.token}"
        if data is not None:
            headers["Content-Type"] = content_type
        self._count(method, url)
        try:
            async with session.request(method, url, data=data, headers=headers) as response:
                return response.status, await response.read(), response.headers.get("Retry-After")
        except aiohttp.ClientConnectorError as err:
            raise UnreachableError(self.connection, _unreachable_reason(err)) from err
        except aiohttp.ConnectionTimeoutError as err:
            raise UnreachableError(self.connection, "timed out connecting") from err

    def _count(self, verb: str, url: str) -> None:
        self.requests[verb] += 1
        path = url.removeprefix(self.connection.server)
        API_REQUESTS.labels(verb=verb, resource=resource_of(path)).inc()

    async def watch(
        self, path: str, params: Mapping[str, str], *, read_timeout_s: float
    ) -> AsyncGenerator[JsonDict, None]:
        """The events of one watch request, decoded, until the server ends the stream.

        Counted as a request of verb ``WATCH`` when it is opened; the events that follow on the
        open stream are not requests. ``read_timeout_s``: the longest silence before the stream
        is taken as broken (the server sends bookmarks about once a minute). An error answer
        raises the typed ``ApiError``; a 401 also invalidates the credentials, so the caller's
        next attempt logs in afresh.
        """
        url = f"{self.connection.server}{path}?{urlencode(params)}"
        identity = self.connection.credentials.identity()
        session = self.open(identity)
        headers = {"Accept": "application/json"}
        if identity.token:
            headers["Authorization"] = f"Bearer {identity.token}"
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=read_timeout_s)
        self._count("WATCH", url)
        try:
            async with session.get(url, headers=headers, timeout=timeout) as response:
                if response.status >= 400:
                    if response.status == 401:
                        self.connection.credentials.invalidate()
                    raise _error(response.status, await response.read())
                while line := await response.content.readline(max_line_length=MAX_WATCH_LINE):
                    if line.strip():
                        yield _decoded(line)
        except aiohttp.ClientConnectorError as err:
            raise UnreachableError(self.connection, _unreachable_reason(err)) from err

    async def list_versioned(
        self, path: str, *, label_selector: str | None = None, page_size: int = 500
    ) -> tuple[list[JsonDict], str]:
        """Every item of a collection and the list's resourceVersion (where a watch starts).

        Pages after the first are served from the first page's snapshot (the ``continue``
        token pins it), so the first page's resourceVersion describes the whole list.
        """
        items: list[JsonDict] = []
        params: dict[str, str] = {"limit": str(page_size)}
        if label_selector:
            params["labelSelector"] = label_selector
        version = ""
        while True:
            page = await self.request("GET", path, params=params)
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            version = version or str(meta.get("resourceVersion") or "")
            if not meta.get("continue"):
                return items, version
            params["continue"] = meta["continue"]

    async def list(
        self,
        path: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
    ) -> list[JsonDict]:
        """Every item of a collection, following ``continue`` tokens page by page."""
        items: list[JsonDict] = []
        params: dict[str, str] = {"limit": str(page_size)}
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        while True:
            page = await self.request("GET", path, params=params)
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items
            params["continue"] = token

    async def get(self, path: str) -> JsonDict | None:
        """The object at ``path``, or ``None`` if it does not exist."""
        try:
            return await self.request("GET", path)
        except NotFoundError:
            return None

    async def create(self, path: str, body: JsonDict) -> JsonDict | None:
        """Create; ``None`` when an object of that name already exists (idempotent create)."""
        try:
            return await self.request("POST", path, body=body)
        except ConflictError as err:
            if err.already_exists:
                return None
            raise

    async def patch(self, path: str, patch: Any, *, kind: str = MERGE_PATCH) -> JsonDict | None:
        """Patch; ``None`` when the object is gone."""
        try:
            return await self.request("PATCH", path, body=patch, content_type=kind)
        except NotFoundError:
            return None

    async def replace(self, path: str, body: JsonDict) -> JsonDict:
        """PUT, the body's resourceVersion a precondition: ``ConflictError`` if stale."""
        return await self.request("PUT", path, body=body)

    async def delete(self, path: str, *, grace_seconds: int | None = None) -> bool:
        """Delete; ``False`` when it was already gone."""
        body: JsonDict = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        try:
            await self.request("DELETE", path, body=body)
        except NotFoundError:
            return False
        return True


def resource_of(path: str) -> str:
    """The resource a request is about (``pods``, ``leases``, ``trainingjobs``...), for metrics.

    ``/api/v1/namespaces/ns/pods/p/status`` is ``pods``; ``/version`` is ``version``.
    """
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    if parts[:1] == ["api"]:
        parts = parts[2:]
    elif parts[:1] == ["apis"]:
        parts = parts[3:]
    if parts[:1] == ["namespaces"] and len(parts) >= 3:
        parts = parts[2:]
    return parts[0] if parts else ""


def _unreachable_reason(err: aiohttp.ClientConnectorError) -> str:
    """A few words: "connection refused", "name or service not known", a TLS failure."""
    if isinstance(err, aiohttp.ClientConnectorCertificateError):
        return f"TLS: {err.certificate_error}"
    code = err.os_error.errno
    if isinstance(code, int) and code > 0:
        return os.strerror(code).lower()
    return str(err.os_error.strerror or err.os_error).lower()


def _decoded(body: bytes) -> Any:
    """A JSON body or watch event, parsed by pydantic's compiled parser (a dependency already):
    about twice as fast as ``json`` on pods, and a busy operator spends a quarter of its time
    parsing them (every watch event and every write's answer is a whole object)."""
    return from_json(body)


def _error(status: int, body: bytes) -> ApiError:
    text = body.decode("utf-8", "replace")
    reason, message = "", text[:500]
    try:
        decoded = json.loads(text)
        reason = str(decoded.get("reason", ""))
        message = str(decoded.get("message", message))
    except (ValueError, AttributeError):
        pass
    return _ERRORS.get(status, ApiError)(status, reason, message)


async def gather_limited(limit: int, *jobs: Any) -> list[Any]:
    """Run awaitables with at most ``limit`` in flight (bulk creates without a stampede).

    Every job runs to its end before the first failure is raised: a caller that holds
    something for the batch (a pass's reservations) never lets go of it while one of the
    batch's writes is still in flight."""
    gate = asyncio.Semaphore(limit)

    async def one(job: Any) -> Any:
        async with gate:
            return await job

    results = await asyncio.gather(*(one(job) for job in jobs), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results
