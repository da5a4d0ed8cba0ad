"""A small asynchronous JSON client for the Kubernetes API: the one door Elastra uses.

Elastra needs a dozen verbs on four kinds (Nodes, Pods, Services, Events, TrainingJobs), as
plain dicts it hands to pure code. A thin client over aiohttp (which Kopf already brings)
does that with no generated model classes to convert, shares one connection pool with the
event loop Kopf runs, counts every request (the scale benchmark reports requests per job)
and maps HTTP failures onto a few typed errors the controller can act on: 409 means re-read
and retry, 404 means it is gone, 422 means the server rejected our object.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Mapping
from types import TracebackType
from typing import Any
from urllib.parse import urlencode

import aiohttp
from prometheus_client import Counter as Metric

from elastra.kube.config import Connection

JsonDict = dict[str, Any]

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


API_ERRORS = Metric("elastra_api_errors_total", "Failed API requests", ["status"])
API_REQUESTS = Metric("elastra_api_requests_total", "API requests made", ["verb"])

_ERRORS: dict[int, type[ApiError]] = {404: NotFoundError, 409: ConflictError, 422: InvalidError}


class Kube:
    """An open session to one API server. Use as ``async with Kube(connection) as kube``."""

    def __init__(self, connection: Connection, *, timeout_s: float = 30.0) -> None:
        self.connection = connection
        self.requests: Counter[str] = Counter()
        """Requests made, by verb: what the scale benchmark reports per job."""
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

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

    def open(self) -> None:
        """Create the connection pool (inside the running event loop)."""
        if self._session is None:
            ssl_option: Any = self.connection.ssl_context or False
            connector = aiohttp.TCPConnector(ssl=ssl_option, limit=32)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)

    async def close(self) -> None:
        """Close the connection pool."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> JsonDict:
        """One API call; returns the decoded JSON body or raises a typed ``ApiError``."""
        self.open()
        assert self._session is not None
        url = self.connection.server + path
        if params:
            url += "?" + urlencode(params)
        headers = {"Accept": "application/json", **self.connection.auth_headers()}
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body)
        self.requests[method] += 1
        API_REQUESTS.labels(verb=method).inc()
        async with self._session.request(method, url, data=data, headers=headers) as response:
            text = await response.text()
            if response.status >= 400:
                if response.status not in {404, 409}:
                    API_ERRORS.labels(status=str(response.status)).inc()
                raise _error(response.status, text)
            return json.loads(text) if text else {}

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


def _error(status: int, text: str) -> ApiError:
    reason, message = "", text[:500]
    try:
        decoded = json.loads(text)
        reason = str(decoded.get("reason", ""))
        message = str(decoded.get("message", message))
    except (ValueError, AttributeError):
        pass
    return _ERRORS.get(status, ApiError)(status, reason, message)


async def gather_limited(limit: int, *jobs: Any) -> list[Any]:
    """Run awaitables with at most ``limit`` in flight (bulk creates without a stampede)."""
    gate = asyncio.Semaphore(limit)

    async def one(job: Any) -> Any:
        async with gate:
            return await job

    return list(await asyncio.gather(*(one(job) for job in jobs)))
