"""Where the API server is and how to prove who we are: kubeconfigs or in-cluster credentials.

The operator runs in a pod (service-account token and CA mounted by Kubernetes) or beside a
cluster with the kubeconfig its user already has: ``make cluster-up``'s, or a GKE, EKS or AKS
one, which authenticates through an exec plugin. Both end as one ``Connection``: a base URL,
the cluster CA, and ``Credentials`` that say what to present on the next request.

What is read, with kubectl's rules: ``--kubeconfig`` (one file), else every file of
``$KUBECONFIG`` (colon-separated, missing files skipped; for clusters, contexts and users the
first file that names an entry wins, and ``current-context`` comes from the first file that sets
it), else the pod's service account, else ``~/.kube/config``. Users may hold a token, a
``tokenFile``, a client certificate, an ``exec`` plugin (client.authentication.k8s.io/v1 and
v1beta1) or an ``auth-provider`` with a static ``access-token`` (``id-token`` for oidc);
auth-providers that must fetch or refresh a token themselves (gcp, azure, oidc refresh) are
refused with a message naming the provider and the exec plugin that replaced it.

Why Elastra keeps its own loader instead of a library's (checked: ``kubernetes`` 37, installed,
and ``kubernetes_asyncio`` 36.1, the maintained async client): both loaders take
``current-context`` from the *last* file of ``$KUBECONFIG`` (kubectl: the first), so the two
would pick different clusters for the same shell; both hand back a ``Configuration`` meant for
their generated ``ApiClient``, whose requests bypass ``Kube``'s request counting and typed errors,
so the loader is all we would use and its exec refresh hooks only fire inside that client; the
synchronous one runs plugins with no cache, blocking the event loop on every load; and neither
is typed for ``mypy --strict``. The kubeconfig rules fit in this module and its tests; a library
would add a dependency to the operator image for a part of it that we would then work around.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from elastra.errors import UserError
from elastra.kube.credentials import (
    Clock,
    Credentials,
    ExecCredentials,
    Identity,
    StaticCredentials,
    TokenFileCredentials,
    parse_exec,
    parse_time,
    utc_now,
)

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
REPLACEMENT_PLUGINS = {
    "gcp": "gke-gcloud-auth-plugin",
    "azure": "kubelogin",
    "oidc": "kubelogin (oidc-login)",
}
"""The exec plugins that replaced the in-tree auth-providers (kubectl dropped those in 1.26)."""


@dataclass(frozen=True)
class Connection:
    """How to reach and authenticate to one API server."""

    server: str
    credentials: Credentials = field(default_factory=StaticCredentials)
    ca_pem: bytes | None = None
    insecure: bool = False
    namespace: str = "default"
    source: str = ""
    """Where this came from ("kubeconfig PATH, context NAME"), for error messages."""

    def ssl_context(self, identity: Identity) -> ssl.SSLContext | None:
        """TLS settings for requests presenting ``identity`` (None for plain http)."""
        if not self.server.startswith("https://"):
            return None
        context = ssl.create_default_context()
        if self.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.ca_pem is not None:
            context.load_verify_locations(cadata=self.ca_pem.decode())
        if identity.cert_pem is not None and identity.key_pem is not None:
            _load_cert_chain(context, identity.cert_pem, identity.key_pem)
        return context


def load_connection(
    kubeconfig: str | None = None,
    *,
    context: str | None = None,
    env: Mapping[str, str] | None = None,
    service_account: Path = SERVICE_ACCOUNT,
    home: Path | None = None,
    clock: Clock = utc_now,
) -> Connection:
    """Credentials from ``kubeconfig``, $KUBECONFIG, the pod's service account or ~/.kube/config.

    ``env``, ``service_account`` and ``home`` default to the real ones (tests pass fakes).
    """
    env = os.environ if env is None else env
    if kubeconfig:
        return kubeconfig_connection([Path(kubeconfig).expanduser()], context=context, clock=clock)
    listed = [Path(p).expanduser() for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        present = [p for p in listed if p.exists()]
        if not present:
            raise UserError(
                "none of the KUBECONFIG files exist: " + ", ".join(str(p) for p in listed)
            )
        return kubeconfig_connection(present, context=context, clock=clock)
    in_pod = bool(env.get("KUBERNETES_SERVICE_HOST")) and (service_account / "token").exists()
    default = (home or Path(env.get("HOME") or Path.home())) / ".kube" / "config"
    if default.exists() and (context is not None or not in_pod):
        return kubeconfig_connection([default], context=context, clock=clock)
    return in_cluster_connection(env=env, service_account=service_account)


def in_cluster_connection(
    *, env: Mapping[str, str] | None = None, service_account: Path = SERVICE_ACCOUNT
) -> Connection:
    """The pod's service account: token (re-read when kubelet rotates it), CA and namespace."""
    env = os.environ if env is None else env
    host = env.get("KUBERNETES_SERVICE_HOST")
    port = env.get("KUBERNETES_SERVICE_PORT", "443")
    if not host or not (service_account / "token").exists():
        raise UserError(
            "no kubeconfig: set KUBECONFIG or --kubeconfig, or run inside a pod "
            "with a service account"
        )
    namespace_file = service_account / "namespace"
    namespace = namespace_file.read_text().strip() if namespace_file.exists() else "default"
    bracketed = f"[{host}]" if ":" in host else host
    return Connection(
        server=f"https://{bracketed}:{port}",
        credentials=TokenFileCredentials(service_account / "token"),
        ca_pem=(service_account / "ca.crt").read_bytes(),
        namespace=namespace or "default",
        source=f"in-cluster service account {service_account}",
    )


@dataclass(frozen=True)
class Entry:
    """One named cluster, context or user, and the directory its relative paths start from."""

    value: dict[str, Any]
    base: Path
    file: Path


@dataclass
class Kubeconfig:
    """Several kubeconfig files merged as kubectl merges them."""

    files: list[Path]
    sections: dict[str, dict[str, Entry]] = field(default_factory=dict)
    current_context: str | None = None

    def named(self, section: str, name: str) -> Entry:
        """The entry ``name`` of ``clusters``, ``contexts`` or ``users``, or a UserError."""
        found = self.sections.get(section, {}).get(name)
        if found is None:
            known = ", ".join(sorted(self.sections.get(section, {}))) or "none"
            raise UserError(f"{self.describe()}: no {section[:-1]} named {name!r} (known: {known})")
        return found

    def describe(self) -> str:
        """The files, as an error message names them."""
        return "kubeconfig " + os.pathsep.join(str(f) for f in self.files)


def merge_kubeconfigs(paths: list[Path]) -> Kubeconfig:
    """Read and merge kubeconfig files: first file to name an entry or set current-context wins."""
    merged = Kubeconfig(files=list(paths))
    for path in paths:
        try:
            config = yaml.safe_load(path.read_text()) or {}
        except OSError as err:
            raise UserError(f"{path}: cannot read kubeconfig: {err.strerror}") from None
        except yaml.YAMLError:
            raise UserError(f"{path}: kubeconfig is not valid YAML") from None
        if not isinstance(config, dict):
            raise UserError(f"{path}: kubeconfig is not a mapping")
        for section, inner in (("clusters", "cluster"), ("contexts", "context"), ("users", "user")):
            named = merged.sections.setdefault(section, {})
            for item in config.get(section) or []:
                name = str(item.get("name", ""))
                if name and name not in named:
                    named[name] = Entry(dict(item.get(inner) or {}), path.parent, path)
        if merged.current_context is None and config.get("current-context"):
            merged.current_context = str(config["current-context"])
    return merged


def kubeconfig_connection(
    paths: list[Path], *, context: str | None = None, clock: Clock = utc_now
) -> Connection:
    """Credentials from one kubeconfig file or several merged."""
    config = merge_kubeconfigs(paths)
    name = context or config.current_context
    if not name:
        known = ", ".join(sorted(config.sections.get("contexts", {}))) or "none"
        raise UserError(
            f"{config.describe()}: no current-context; pass --context (contexts: {known})"
        )
    ctx = config.named("contexts", name).value
    cluster_entry = config.named("clusters", str(ctx.get("cluster", "")))
    cluster = cluster_entry.value
    server = str(cluster.get("server", "")).rstrip("/")
    if not server:
        raise UserError(f"{config.describe()}: cluster {ctx.get('cluster')!r} has no server")
    credentials: Credentials = StaticCredentials()
    if ctx.get("user"):
        user = config.named("users", str(ctx["user"]))
        where = f"{user.file}: user {ctx['user']!r}"
        credentials = user_credentials(user, where=where, cluster=cluster, clock=clock)
    return Connection(
        server=server,
        credentials=credentials,
        ca_pem=_material(cluster, "certificate-authority", cluster_entry.base),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        namespace=str(ctx.get("namespace") or "default"),
        source=f"{config.describe()}, context {name}",
    )


def user_credentials(
    user: Entry, *, where: str, cluster: Mapping[str, Any], clock: Clock = utc_now
) -> Credentials:
    """The ``Credentials`` a kubeconfig user describes (client-go's order: exec, token, file)."""
    fields, base = user.value, user.base
    certified = Identity(
        cert_pem=_material(fields, "client-certificate", base),
        key_pem=_material(fields, "client-key", base),
    )
    if fields.get("exec"):
        spec = parse_exec(fields["exec"], base=base, where=where, cluster=cluster)
        return ExecCredentials(spec, clock=clock)
    if fields.get("auth-provider"):
        return auth_provider_credentials(fields["auth-provider"], where=where, clock=clock)
    if fields.get("token"):
        return StaticCredentials(
            Identity(
                token=str(fields["token"]), cert_pem=certified.cert_pem, key_pem=certified.key_pem
            )
        )
    if fields.get("tokenFile"):
        return TokenFileCredentials(base / str(fields["tokenFile"]), base=certified)
    return StaticCredentials(certified)


def auth_provider_credentials(
    provider: Mapping[str, Any], *, where: str, clock: Clock = utc_now
) -> Credentials:
    """A static token from an ``auth-provider`` entry; providers that fetch tokens are refused."""
    name = str(provider.get("name") or "")
    config = provider.get("config") or {}
    token = config.get("id-token" if name == "oidc" else "access-token")
    if token:
        expiry = config.get("expiry")
        if expiry and _expired(str(expiry), clock):
            raise UserError(
                f"{where}: the access-token of auth-provider {name!r} expired at {expiry}; "
                f"elastra does not refresh it: switch the user to the exec plugin "
                f"{REPLACEMENT_PLUGINS.get(name, 'of your cluster')}"
            )
        return StaticCredentials(Identity(token=str(token)))
    replacement = REPLACEMENT_PLUGINS.get(name, "your cluster's exec credential plugin")
    raise UserError(
        f"{where}: auth-provider {name!r} is not supported (elastra only uses a static "
        f"access-token in auth-provider.config, and there is none); switch the user to an "
        f"exec plugin: {replacement}"
    )


def _expired(expiry: str, clock: Clock) -> bool:
    try:
        return clock() >= parse_time(expiry)
    except ValueError:
        return False


def _material(entry: Mapping[str, Any], key: str, base: Path) -> bytes | None:
    """PEM bytes from ``key-data`` (base64) or from the file ``key`` names."""
    data = entry.get(f"{key}-data")
    if data:
        return base64.b64decode(data)
    file = entry.get(key)
    if file:
        try:
            return (base / str(file)).expanduser().read_bytes()
        except OSError as err:
            raise UserError(f"cannot read {key} {base / str(file)}: {err.strerror}") from None
    return None


def _load_cert_chain(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """ssl only loads client certificates from files: write them to private temp files."""
    with tempfile.TemporaryDirectory(prefix="elastra-cert-") as tmp:
        cert_path, key_path = Path(tmp) / "client.crt", Path(tmp) / "client.key"
        for target, content in ((cert_path, cert), (key_path, key)):
            target.touch(mode=0o600)
            target.write_bytes(content)
        context.load_cert_chain(str(cert_path), str(key_path))
