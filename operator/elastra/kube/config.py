"""Where the API server is and how to prove who we are: kubeconfig or in-cluster credentials.

The operator runs in a pod (service-account token and CA mounted by Kubernetes) or beside a
cluster with a kubeconfig (``make cluster-up`` writes one). Both end as one ``Connection``:
a base URL, an SSL context that trusts the cluster CA and carries any client certificate,
and extra headers (a bearer token). Only what Elastra's own clusters and common clusters
use is supported: client certificates, tokens and token files. A kubeconfig that needs an
exec plugin is rejected with a message saying so, not half-used.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from elastra.errors import UserError

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True)
class Connection:
    """How to reach and authenticate to one API server."""

    server: str
    ssl_context: ssl.SSLContext | None
    headers: dict[str, str] = field(default_factory=dict)
    namespace: str = "default"
    token_file: Path | None = None
    """Re-read per request: projected service-account tokens rotate."""
    ca_pem: bytes | None = None
    client_cert_pem: bytes | None = None
    client_key_pem: bytes | None = None
    """Kept so that Kopf's own watch connections can log in with the same identity."""

    def auth_headers(self) -> dict[str, str]:
        """Headers for the next request (a rotated token file is read again)."""
        if self.token_file is None:
            return self.headers
        token = self.token_file.read_text().strip()
        return {**self.headers, "Authorization": f"Bearer {token}"}


def load_connection(kubeconfig: str | None = None, *, context: str | None = None) -> Connection:
    """Credentials from ``kubeconfig`` (or $KUBECONFIG, ~/.kube/config), else in-cluster."""
    path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None
    if path is None and not (SERVICE_ACCOUNT / "token").exists():
        default = Path.home() / ".kube" / "config"
        path = str(default) if default.exists() else None
    if path is None:
        return in_cluster_connection()
    return kubeconfig_connection(Path(path), context=context)


def in_cluster_connection() -> Connection:
    """The pod's service account: token, CA and namespace mounted by Kubernetes."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host or not (SERVICE_ACCOUNT / "token").exists():
        raise UserError(
            "no kubeconfig: set KUBECONFIG or --kubeconfig, or run inside a pod "
            "with a service account"
        )
    context = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT / "ca.crt"))
    namespace = (SERVICE_ACCOUNT / "namespace").read_text().strip()
    bracketed = f"[{host}]" if ":" in host else host
    return Connection(
        server=f"https://{bracketed}:{port}",
        ssl_context=context,
        namespace=namespace,
        token_file=SERVICE_ACCOUNT / "token",
        ca_pem=(SERVICE_ACCOUNT / "ca.crt").read_bytes(),
    )


def kubeconfig_connection(path: Path, *, context: str | None = None) -> Connection:
    """Credentials from one kubeconfig file."""
    try:
        config: dict[str, Any] = yaml.safe_load(path.read_text()) or {}
    except OSError as err:
        raise UserError(f"{path}: cannot read kubeconfig: {err.strerror}") from None
    except yaml.YAMLError:
        raise UserError(f"{path}: kubeconfig is not valid YAML") from None
    name = context or config.get("current-context")
    ctx = _named(config, "contexts", name, path)["context"]
    cluster = _named(config, "clusters", ctx.get("cluster"), path)["cluster"]
    user = _named(config, "users", ctx.get("user"), path).get("user") or {}
    base = path.parent
    server = str(cluster.get("server", "")).rstrip("/")
    if not server:
        raise UserError(f"{path}: cluster {ctx.get('cluster')!r} has no server")
    ssl_context: ssl.SSLContext | None = None
    ca = _material(cluster, "certificate-authority", base)
    cert = _material(user, "client-certificate", base)
    key = _material(user, "client-key", base)
    if server.startswith("https://"):
        ssl_context = ssl.create_default_context()
        if cluster.get("insecure-skip-tls-verify"):
            ssl_context.check_hostname = False
            ssl_context.verify_mode = ssl.CERT_NONE
        if ca is not None:
            ssl_context.load_verify_locations(cadata=ca.decode())
        if cert is not None and key is not None:
            _load_cert_chain(ssl_context, cert, key)
    if "exec" in user or "auth-provider" in user:
        raise UserError(
            f"{path}: user {ctx.get('user')!r} needs an exec/auth-provider plugin, which "
            "elastra does not run; use a token or client certificate"
        )
    headers: dict[str, str] = {}
    token_file: Path | None = None
    if user.get("token"):
        headers["Authorization"] = f"Bearer {user['token']}"
    elif user.get("tokenFile"):
        token_file = base / str(user["tokenFile"])
    return Connection(
        server=server,
        ssl_context=ssl_context,
        headers=headers,
        namespace=str(ctx.get("namespace") or "default"),
        token_file=token_file,
        ca_pem=ca,
        client_cert_pem=cert,
        client_key_pem=key,
    )


def _named(config: dict[str, Any], section: str, name: Any, path: Path) -> dict[str, Any]:
    for entry in config.get(section) or []:
        if entry.get("name") == name:
            return dict(entry)
    raise UserError(f"{path}: no {section[:-1]} named {name!r}")


def _material(entry: dict[str, Any], key: str, base: Path) -> bytes | None:
    """PEM bytes from ``key-data`` (base64) or from the file ``key`` names."""
    data = entry.get(f"{key}-data")
    if data:
        return base64.b64decode(data)
    file = entry.get(key)
    if file:
        return (base / str(file)).read_bytes()
    return None


def _load_cert_chain(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """ssl only loads client certificates from files: write them to private temp files."""
    with tempfile.TemporaryDirectory(prefix="elastra-cert-") as tmp:
        cert_path, key_path = Path(tmp) / "client.crt", Path(tmp) / "client.key"
        for target, content in ((cert_path, cert), (key_path, key)):
            target.touch(mode=0o600)
            target.write_bytes(content)
        context.load_cert_chain(str(cert_path), str(key_path))
