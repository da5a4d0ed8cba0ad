"""A tiny HTTPS client for the local API server, and waiting with deadlines.

Why: bringing the cluster up needs a handful of calls (readiness, listing nodes, creating
objects in bulk) before any Kubernetes client library can be assumed, and this package must
not depend on the operator's. Requests authenticate with a client certificate; every wait is
a poll against a deadline that says what it was waiting for when it gives up.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class WaitTimeoutError(TimeoutError):
    """A condition did not hold before its deadline."""


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    *,
    timeout: float,
    interval: float = 0.1,
    hint: Callable[[], str] | None = None,
) -> T:
    """Poll probe until it returns something other than None/False; raise after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result is not None and result is not False:
            return result
        if time.monotonic() >= deadline:
            extra = f": {hint()}" if hint else ""
            raise WaitTimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{extra}")
        time.sleep(interval)


@dataclass(frozen=True)
class ApiStatusError(Exception):
    status: int
    body: str

    def __str__(self) -> str:
        return f"HTTP {self.status}: {self.body[:500]}"


class Api:
    """Authenticated requests to https://127.0.0.1:<port>, one kept-alive connection a thread.

    Keeping connections open matters when a fleet of a thousand nodes is created: a TLS
    handshake per request costs more CPU than the request itself on a busy two-core machine.
    """

    def __init__(self, server: str, *, ca: Path, cert: Path | None, key: Path | None) -> None:
        parsed = urllib.parse.urlsplit(server)
        if parsed.scheme != "https" or not parsed.hostname:
            raise ValueError(f"expected https://host:port, got {server!r}")
        self.server = server.rstrip("/")
        self._host = parsed.hostname
        self._port = parsed.port or 443
        self._ctx = ssl.create_default_context(cafile=str(ca))
        if cert and key:
            self._ctx.load_cert_chain(str(cert), str(key))
        self._local = threading.local()

    def _connection(self, timeout: float) -> http.client.HTTPSConnection:
        conn: http.client.HTTPSConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPSConnection(
                self._host, self._port, context=self._ctx, timeout=timeout
            )
            self._local.conn = conn
        conn.timeout = timeout
        return conn

    def _drop_connection(self) -> None:
        conn: http.client.HTTPSConnection | None = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        timeout: float = 30.0,
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        for attempt in (1, 2):
            conn = self._connection(timeout)
            try:
                conn.request(method, path, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
                break
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                # The server closed a kept-alive connection: open a new one, once.
                self._drop_connection()
                if attempt == 2:
                    raise
            except OSError:
                self._drop_connection()
                raise
        if resp.status >= 400:
            raise ApiStatusError(resp.status, raw.decode(errors="replace"))
        if not raw:
            return None
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw.decode(errors="replace")

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def healthy(self, path: str = "/readyz") -> bool:
        """True when the endpoint answers 200 (connection errors count as not yet)."""
        try:
            self.request("GET", path, timeout=3.0)
        except (ApiStatusError, OSError, http.client.HTTPException):
            return False
        return True


def probe_https_health(url: str, *, timeout: float = 2.0) -> bool:
    """GET a component's /healthz on its self-signed serving cert (loopback only)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def probe_http_health(url: str, *, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False
