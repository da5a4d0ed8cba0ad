"""Who we are to the API server, for the next request: static, token-file and exec credentials.

A kubeconfig user (or a pod's service account) names a way to get an identity, not always the
identity itself: a token file that kubelet rotates, or an exec plugin (``gke-gcloud-auth-plugin``,
``aws eks get-token``, ``kubelogin``) that prints a short-lived ExecCredential. Each kind here
answers ``identity()`` with what to send now and ``invalidate()`` when the server said 401, so
the client and Kopf's login ask again instead of failing until restarted.

Guarantees: an exec plugin runs once per credential lifetime (cached until its
``expirationTimestamp``, less a small margin) and again after a 401; a token file is re-read
only when its modification time or size changes. Plugins run without a terminal
(``interactive: false``); one that needs a person to log in fails with its own message.
``identity()`` is synchronous: a plugin (typically under a second, once an hour for cloud
tokens) briefly holds up the event loop that asks, which is simpler than making every request
await a thread; Kopf calls its login handler in a worker thread anyway.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from elastra.errors import UserError

Clock = Callable[[], datetime]
EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
REFRESH_MARGIN = timedelta(seconds=10)
"""Refresh this long before a credential expires, so no request leaves with a dying token."""


def utc_now() -> datetime:
    """The real clock (tests pass their own)."""
    return datetime.now(UTC)


@dataclass(frozen=True)
class Identity:
    """What one request presents: a bearer token and/or a client certificate."""

    token: str | None = None
    cert_pem: bytes | None = None
    key_pem: bytes | None = None
    expires: datetime | None = None


class Credentials(Protocol):
    """A source of identities that may change while Elastra runs."""

    def identity(self) -> Identity:
        """What to present now (cached; may run a plugin or read a file)."""

    def invalidate(self) -> None:
        """The server rejected the last identity (401): get a fresh one next time."""


@dataclass
class StaticCredentials:
    """A token or certificate written in the kubeconfig: nothing to refresh."""

    fixed: Identity = field(default_factory=Identity)

    def identity(self) -> Identity:
        return self.fixed

    def invalidate(self) -> None:
        return None


@dataclass
class TokenFileCredentials:
    """A bearer token in a file (``tokenFile``, the service-account token kubelet rotates)."""

    path: Path
    base: Identity = field(default_factory=Identity)
    """Anything else the user has (a client certificate) besides the token."""
    _seen: tuple[int, int] | None = field(default=None, init=False, repr=False)
    _token: str = field(default="", init=False, repr=False)

    def identity(self) -> Identity:
        try:
            info = self.path.stat()
            if (info.st_mtime_ns, info.st_size) != self._seen:
                self._token = self.path.read_text().strip()
                self._seen = (info.st_mtime_ns, info.st_size)
        except OSError as err:
            raise UserError(f"cannot read token file {self.path}: {err.strerror}") from None
        return Identity(token=self._token, cert_pem=self.base.cert_pem, key_pem=self.base.key_pem)

    def invalidate(self) -> None:
        self._seen = None


@dataclass(frozen=True)
class ExecSpec:
    """A kubeconfig ``user.exec`` entry, checked."""

    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    api_version: str = EXEC_API_VERSIONS[0]
    cluster: Mapping[str, Any] | None = None
    """``spec.cluster`` for the plugin when ``provideClusterInfo`` is set."""
    install_hint: str = ""
    where: str = ""
    """The kubeconfig and user, for error messages."""


def parse_exec(
    entry: Mapping[str, Any], *, base: Path, where: str, cluster: Mapping[str, Any]
) -> ExecSpec:
    """The ``exec`` block of a kubeconfig user; a relative command path is the file's."""
    command = str(entry.get("command") or "")
    version = str(entry.get("apiVersion") or "")
    if not command:
        raise UserError(f"{where}: exec has no command")
    if version not in EXEC_API_VERSIONS:
        raise UserError(
            f"{where}: exec apiVersion {version!r} is not supported; use one of "
            + ", ".join(EXEC_API_VERSIONS)
        )
    if entry.get("interactiveMode") == "Always":
        raise UserError(
            f"{where}: exec plugin {command!r} needs a terminal (interactiveMode: Always); "
            "elastra runs plugins without one: log in with the plugin first or use a token"
        )
    if os.sep in command and not os.path.isabs(command):
        command = str(base / command)
    env = tuple((str(e["name"]), str(e["value"])) for e in entry.get("env") or [])
    return ExecSpec(
        command=command,
        args=tuple(str(a) for a in entry.get("args") or []),
        env=env,
        api_version=version,
        cluster=dict(cluster) if entry.get("provideClusterInfo") else None,
        install_hint=str(entry.get("installHint") or ""),
        where=where,
    )


Runner = Callable[[Sequence[str], Mapping[str, str]], "subprocess.CompletedProcess[str]"]


def run_plugin(argv: Sequence[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """Run an exec plugin with no terminal (stdin closed), capturing both streams."""
    return subprocess.run(
        list(argv),
        env=dict(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@dataclass
class ExecCredentials:
    """An exec plugin's ExecCredential, cached until it expires or the server refuses it."""

    spec: ExecSpec
    clock: Clock = utc_now
    runner: Runner = run_plugin
    _cached: Identity | None = field(default=None, init=False, repr=False)

    def identity(self) -> Identity:
        cached = self._cached
        if cached is None or (
            cached.expires is not None and self.clock() >= cached.expires - REFRESH_MARGIN
        ):
            cached = self._cached = self._run()
        return cached

    def invalidate(self) -> None:
        self._cached = None

    def _run(self) -> Identity:
        spec = self.spec
        if shutil.which(spec.command) is None:
            hint = f" ({spec.install_hint.strip()})" if spec.install_hint else ""
            raise UserError(f"{spec.where}: exec plugin {spec.command!r} not found{hint}")
        info: dict[str, Any] = {
            "apiVersion": spec.api_version,
            "kind": "ExecCredential",
            "spec": {"interactive": False},
        }
        if spec.cluster is not None:
            info["spec"]["cluster"] = dict(spec.cluster)
        env = {**os.environ, **dict(spec.env), "KUBERNETES_EXEC_INFO": json.dumps(info)}
        try:
            done = self.runner([spec.command, *spec.args], env)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise UserError(f"{spec.where}: exec plugin {spec.command!r} failed: {err}") from None
        if done.returncode != 0:
            tail = (done.stderr or "").strip().splitlines()[-1:] or [""]
            raise UserError(
                f"{spec.where}: exec plugin {spec.command!r} exited {done.returncode}: {tail[0]}"
            )
        return parse_exec_credential(done.stdout, spec=spec)


def parse_exec_credential(text: str, *, spec: ExecSpec) -> Identity:
    """The identity in a plugin's ExecCredential (token, or certificate and key)."""
    try:
        credential = json.loads(text)
        status = credential["status"]
    except (ValueError, KeyError, TypeError):
        raise UserError(
            f"{spec.where}: exec plugin {spec.command!r} did not print an ExecCredential"
        ) from None
    if credential.get("apiVersion") != spec.api_version:
        raise UserError(
            f"{spec.where}: exec plugin answered apiVersion {credential.get('apiVersion')!r}, "
            f"asked for {spec.api_version!r}"
        )
    expires = None
    if status.get("expirationTimestamp"):
        expires = parse_time(str(status["expirationTimestamp"]))
    token = status.get("token") or None
    cert, key = status.get("clientCertificateData"), status.get("clientKeyData")
    if not token and not (cert and key):
        raise UserError(
            f"{spec.where}: exec plugin's ExecCredential has neither a token nor "
            "clientCertificateData and clientKeyData"
        )
    return Identity(
        token=token,
        cert_pem=str(cert).encode() if cert else None,
        key_pem=str(key).encode() if key else None,
        expires=expires,
    )


def parse_time(text: str) -> datetime:
    """An RFC 3339 timestamp as the API writes it (``Z`` or an offset), timezone-aware."""
    stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)
