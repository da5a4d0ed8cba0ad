"""Bring a real local control plane with kwok-simulated nodes up and down.

Why: Elastra's integration tests need the real API server (admission, CEL, subresources,
watches), scheduler and controller-manager, with many GPU nodes that cost nothing. This module
starts etcd (data on tmpfs, no fsync), kube-apiserver (client certificates, RBAC, service-account
keys), kube-controller-manager, kube-scheduler and kwok on free loopback ports, writes
<dir>/kubeconfig and <dir>/env, installs the CRDs in crds/ and applies a fleet.

Guarantees:
- Every started process is recorded in <dir>/state.json before anything waits on it, so `down`
  can always stop exactly what `up` started (by PID, checked against the executable path).
- `up` on a running cluster does nothing but report it; a half-dead cluster is stopped first.
- Every wait has a deadline and names what it waited for, with the log to read.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from . import procs
from .api import Api, ApiError, WaitTimeoutError, probe_http_health, probe_https_health, wait_for
from .fleet import FLEET_LABEL, KWOK_ANNOTATION, Fleet, load_fleet, resolve_fleet_path
from .pki import Pki, ensure_pki

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "e2e" / "toolchain" / "build.sh"
STAGES = Path(__file__).resolve().parent / "kwok-stages.yaml"
# ELASTRA_CRDS_DIR installs CRDs from elsewhere (a chart, a candidate generation) instead.
CRDS_DIR = Path(os.environ.get("ELASTRA_CRDS_DIR", REPO / "crds"))
FLEETS_DIR = REPO / "e2e" / "fleets"
DEFAULT_FLEET = "hetero-small"

# Every address the cluster hands out is on loopback, so a client that tries to reach one (an
# in-cluster config, the operator reading a fake pod's metrics) stays on this machine and gets
# "connection refused" instead of sending packets to a private range. Service IPs are
# allocated but never translated: no kube-proxy runs for kwok nodes and the endpoint reconciler
# is off. (A real node with kube-proxy needs a non-loopback service range plus blackhole routes.)
SERVICE_CIDR = "127.96.0.0/16"
FIRST_SERVICE_IP = "127.96.0.1"
KWOK_POD_CIDR = "127.128.0.0/9"
KWOK_NODE_IP = "127.0.0.2"
# kwok renews each node's Lease every NODE_LEASE_SECONDS / 4; the node lifecycle controller
# marks a node Unknown after NODE_GRACE_SECONDS without a renewal (the default 50 s is too
# tight for a thousand simulated nodes on a busy two-core machine).
NODE_LEASE_SECONDS = 80
NODE_GRACE_SECONDS = 120

Log = Callable[[str], None]


class ClusterError(RuntimeError):
    """Bringing the cluster up failed; the message says what and where to look."""


def _say(msg: str) -> None:
    print(f"cluster: {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Layout:
    """Where one cluster keeps its files (default: <repo>/.cluster)."""

    root: Path

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def env(self) -> Path:
        return self.root / "env"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pki(self) -> Pki:
        return Pki(self.root / "pki")

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    def component_kubeconfig(self, name: str) -> Path:
        return self.etc / f"{name}.kubeconfig"

    def data_dir(self) -> Path:
        """etcd's data on tmpfs when /dev/shm is usable (one folder per cluster dir)."""
        tag = hashlib.sha256(str(self.root.resolve()).encode()).hexdigest()[:10]
        shm = Path("/dev/shm")
        if shm.is_dir() and os.access(shm, os.W_OK):
            return shm / f"elastra-{os.getuid()}-{tag}"
        return self.root / "data"


def default_layout() -> Layout:
    return Layout(Path(os.environ.get("ELASTRA_CLUSTER_DIR", REPO / ".cluster")).resolve())


# --- state -----------------------------------------------------------------------------------


@dataclass
class State:
    ports: dict[str, int]
    daemons: list[procs.Daemon]
    data_dir: str
    bindir: str
    fleet: str | None = None

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    def save(self, layout: Layout) -> None:
        body = {
            "ports": self.ports,
            "daemons": [d.to_json() for d in self.daemons],
            "data_dir": self.data_dir,
            "bindir": self.bindir,
            "fleet": self.fleet,
        }
        tmp = layout.state.with_suffix(".tmp")
        tmp.write_text(json.dumps(body, indent=2) + "\n")
        tmp.replace(layout.state)

    @staticmethod
    def load(layout: Layout) -> State | None:
        try:
            raw = json.loads(layout.state.read_text())
        except FileNotFoundError:
            return None
        return State(
            ports={str(k): int(v) for k, v in raw["ports"].items()},
            daemons=[procs.Daemon.from_json(d) for d in raw["daemons"]],
            data_dir=str(raw["data_dir"]),
            bindir=str(raw["bindir"]),
            fleet=raw.get("fleet"),
        )


def admin_api(layout: Layout, state: State) -> Api:
    pki = layout.pki
    return Api(
        state.server,
        ca=pki.ca_cert,
        cert=pki.client_cert("admin"),
        key=pki.client_key("admin"),
    )


# --- toolchain -------------------------------------------------------------------------------


def toolchain_bindir(*, build: bool = True) -> Path:
    """The toolchain's bin dir, building it first when the cache is cold (build.sh decides)."""
    if not BUILD_SCRIPT.exists():
        raise ClusterError(f"missing {BUILD_SCRIPT}")
    args = [str(BUILD_SCRIPT)] if build else [str(BUILD_SCRIPT), "--print-bindir"]
    out = subprocess.run(args, check=False, stdout=subprocess.PIPE, text=True)
    if out.returncode != 0:
        raise ClusterError(f"the toolchain build failed (exit {out.returncode}); see above")
    bindir = Path(out.stdout.strip().splitlines()[-1])
    return bindir


# --- helpers ---------------------------------------------------------------------------------


def free_ports(count: int) -> list[int]:
    """Ports the kernel says are free on 127.0.0.1 (held together so they are distinct)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(path: Path, *, server: str, pki: Pki, user: str) -> None:
    """A self-contained kubeconfig (certificates embedded) for one client identity."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "elastra-local",
                "cluster": {"server": server, "certificate-authority-data": _b64(pki.ca_cert)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": _b64(pki.client_cert(user)),
                    "client-key-data": _b64(pki.client_key(user)),
                },
            }
        ],
        "contexts": [
            {"name": "elastra-local", "context": {"cluster": "elastra-local", "user": user}}
        ],
        "current-context": "elastra-local",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def write_env(layout: Layout, bindir: Path) -> None:
    layout.env.write_text(
        "# Source me: . .cluster/env  (written by `python -m e2e.cluster up`)\n"
        f"export KUBECONFIG={layout.kubeconfig}\n"
        f'export PATH={bindir}:"$PATH"\n'
        f"export ELASTRA_TOOLCHAIN_BIN={bindir}\n"
    )


def _tail(path: str | Path, lines: int = 15) -> str:
    try:
        text = Path(path).read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text[-lines:])


def kubectl(bindir: Path | str, kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    """Run the toolchain's kubectl; raise ClusterError with its stderr on failure."""
    cmd = [str(Path(bindir) / "kubectl"), f"--kubeconfig={kubeconfig}", *args]
    out = subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise ClusterError(f"kubectl {' '.join(args)} failed: {out.stderr.strip()}")
    return out.stdout


# --- daemons ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ctx:
    layout: Layout
    state: State
    bindir: Path

    def start(self, name: str, argv: list[str]) -> procs.Daemon:
        argv = [str(self.bindir / argv[0]), *argv[1:]]
        daemon = procs.start(name, argv, log=self.layout.logs / f"{name}.log")
        self.state.daemons.append(daemon)
        self.state.save(self.layout)
        return daemon

    def wait_healthy(self, daemon: procs.Daemon, probe: Callable[[], bool], timeout: float) -> None:
        def check() -> bool:
            if not procs.is_running(daemon):
                raise ClusterError(
                    f"{daemon.name} exited during start-up; last lines of {daemon.log}:\n"
                    + _tail(daemon.log)
                )
            return probe()

        try:
            wait_for(f"{daemon.name} to become healthy", check, timeout=timeout, interval=0.1)
        except WaitTimeoutError as err:
            raise ClusterError(f"{err}; last lines of {daemon.log}:\n{_tail(daemon.log)}") from None


def _start_etcd(ctx: Ctx) -> None:
    p = ctx.state.ports
    data = Path(ctx.state.data_dir) / "etcd"
    client = f"http://127.0.0.1:{p['etcd']}"
    peer = f"http://127.0.0.1:{p['etcd_peer']}"
    daemon = ctx.start(
        "etcd",
        [
            "etcd",
            "--name=elastra",
            f"--data-dir={data}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=elastra={peer}",
            "--initial-cluster-state=new",
            "--unsafe-no-fsync",
            "--quota-backend-bytes=8589934592",
            "--snapshot-count=10000",
            "--log-level=warn",
        ],
    )
    ctx.wait_healthy(daemon, lambda: probe_http_health(f"{client}/health"), timeout=30)


def _start_apiserver(ctx: Ctx) -> None:
    p, pki = ctx.state.ports, ctx.layout.pki
    daemon = ctx.start(
        "kube-apiserver",
        [
            "kube-apiserver",
            f"--etcd-servers=http://127.0.0.1:{p['etcd']}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={p['apiserver']}",
            f"--cert-dir={ctx.layout.root / 'apiserver-certs'}",
            f"--tls-cert-file={pki.serving_cert}",
            f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_cert}",
            "--anonymous-auth=false",
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--endpoint-reconciler-type=none",
            "--allow-privileged=true",
            "--profiling=false",
            "--max-requests-inflight=800",
            "--max-mutating-requests-inflight=400",
            "--v=1",
        ],
    )
    api = admin_api(ctx.layout, ctx.state)
    ctx.wait_healthy(daemon, api.healthy, timeout=90)


def _start_controller_manager(ctx: Ctx) -> procs.Daemon:
    p, pki = ctx.state.ports, ctx.layout.pki
    kc = ctx.layout.component_kubeconfig("controller-manager")
    return ctx.start(
        "kube-controller-manager",
        [
            "kube-controller-manager",
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1",
            f"--secure-port={p['controller_manager']}",
            f"--cert-dir={ctx.layout.root / 'controller-manager-certs'}",
            "--leader-elect=false",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={pki.sa_key}",
            f"--root-ca-file={pki.ca_cert}",
            f"--cluster-signing-cert-file={pki.ca_cert}",
            f"--cluster-signing-key-file={pki.ca_key}",
            "--kube-api-qps=200",
            "--kube-api-burst=400",
            f"--node-monitor-grace-period={NODE_GRACE_SECONDS}s",
            "--profiling=false",
            "--v=1",
        ],
    )


def _start_scheduler(ctx: Ctx) -> procs.Daemon:
    p = ctx.state.ports
    kc = ctx.layout.component_kubeconfig("scheduler")
    config = ctx.layout.etc / "scheduler.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "clientConnection": {"kubeconfig": str(kc), "qps": 200, "burst": 400},
                "leaderElection": {"leaderElect": False},
            }
        )
    )
    return ctx.start(
        "kube-scheduler",
        [
            "kube-scheduler",
            f"--config={config}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1",
            f"--secure-port={p['scheduler']}",
            f"--cert-dir={ctx.layout.root / 'scheduler-certs'}",
            "--leader-elect=false",
            "--v=1",
        ],
    )


def _start_kwok(ctx: Ctx) -> procs.Daemon:
    p = ctx.state.ports
    config = ctx.layout.etc / "kwok.yaml"
    # kwok's defaults (4 workers, 40 s leases renewed every 10 s) fall behind with a thousand
    # nodes on two cores and nodes flap to NotReady; more workers and longer leases keep up.
    options = {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": {
            "nodeLeaseParallelism": 16,
            "nodePlayStageParallelism": 16,
            "podPlayStageParallelism": 16,
        },
    }
    config.write_text(yaml.safe_dump(options) + "---\n" + STAGES.read_text())
    return ctx.start(
        "kwok",
        [
            "kwok",
            f"--kubeconfig={ctx.layout.component_kubeconfig('kwok')}",
            f"--config={config}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
            f"--cidr={KWOK_POD_CIDR}",
            f"--node-ip={KWOK_NODE_IP}",
            f"--server-address=127.0.0.1:{p['kwok']}",
            f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}",
        ],
    )


# --- public operations -----------------------------------------------------------------------


def is_up(layout: Layout) -> bool:
    state = State.load(layout)
    if state is None or not state.daemons:
        return False
    if not all(procs.is_running(d) for d in state.daemons):
        return False
    return admin_api(layout, state).healthy()


@contextlib.contextmanager
def _locked(layout: Layout) -> Iterator[None]:
    """One up/down/apply-fleet at a time per cluster folder (two terminals, make -j)."""
    layout.root.mkdir(parents=True, exist_ok=True)
    with (layout.root / ".lock").open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say(f"another cluster command holds {layout.root / '.lock'}; waiting")
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


@contextlib.contextmanager
def _step(what: str) -> Iterator[None]:
    started = time.monotonic()
    _say(f"{what} ...")
    yield
    _say(f"{what}: ok ({time.monotonic() - started:.1f}s)")


def up(layout: Layout | None = None, *, fleet: str | None = DEFAULT_FLEET) -> bool:
    """Start the cluster (or find it running). Returns True when this call started it."""
    layout = layout or default_layout()
    with _locked(layout):
        return _up(layout, fleet)


def _up(layout: Layout, fleet: str | None) -> bool:
    if is_up(layout):
        state = State.load(layout)
        assert state is not None
        _say(f"already running at {state.server} (kubeconfig {layout.kubeconfig})")
        if fleet and fleet != state.fleet:
            _apply_fleet(fleet, layout, replace=False, timeout=300)
        return False
    if State.load(layout) is not None:
        _say("found a stopped or half-running cluster; cleaning it up first")
        _down(layout, keep_logs=True)
    started = time.monotonic()
    bindir = toolchain_bindir()
    layout.root.mkdir(parents=True, exist_ok=True)
    layout.etc.mkdir(exist_ok=True)
    data_dir = layout.data_dir()
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    names = ["etcd", "etcd_peer", "apiserver", "controller_manager", "scheduler", "kwok"]
    state = State(
        ports=dict(zip(names, free_ports(len(names)), strict=True)),
        daemons=[],
        data_dir=str(data_dir),
        bindir=str(bindir),
    )
    state.save(layout)
    try:
        _bring_up(Ctx(layout, state, bindir), fleet)
    except BaseException:
        _say(f"start-up failed; stopping what was started (logs stay in {layout.logs})")
        _down(layout, keep_logs=True)
        raise
    _say(f"up in {time.monotonic() - started:.1f}s: . {layout.env}  (then kubectl get nodes)")
    return True


def _bring_up(ctx: Ctx, fleet: str | None) -> None:
    layout, state = ctx.layout, ctx.state
    with _step("pki"):
        pki = ensure_pki(layout.root / "pki", service_ip=FIRST_SERVICE_IP)
    for user in ("controller-manager", "scheduler", "kwok"):
        write_kubeconfig(layout.component_kubeconfig(user), server=state.server, pki=pki, user=user)
    write_kubeconfig(layout.kubeconfig, server=state.server, pki=pki, user="admin")
    with _step(f"etcd on 127.0.0.1:{state.ports['etcd']} (data in {state.data_dir})"):
        _start_etcd(ctx)
    with _step(f"kube-apiserver on {state.server}"):
        _start_apiserver(ctx)
    with _step("kube-controller-manager, kube-scheduler, kwok"):
        kcm = _start_controller_manager(ctx)
        sched = _start_scheduler(ctx)
        kwok = _start_kwok(ctx)
        cm_url = f"https://127.0.0.1:{state.ports['controller_manager']}/healthz"
        ctx.wait_healthy(kcm, lambda: probe_https_health(cm_url), timeout=60)
        sch_url = f"https://127.0.0.1:{state.ports['scheduler']}/healthz"
        ctx.wait_healthy(sched, lambda: probe_https_health(sch_url), timeout=60)
        kw_url = f"http://127.0.0.1:{state.ports['kwok']}/healthz"
        ctx.wait_healthy(kwok, lambda: probe_http_health(kw_url), timeout=60)
    write_env(layout, ctx.bindir)
    api = admin_api(layout, state)
    with _step("controller-manager creates service accounts"):
        wait_for(
            "the default service account (kube-controller-manager's serviceaccount controller)",
            lambda: _exists(api, "/api/v1/namespaces/default/serviceaccounts/default"),
            timeout=60,
        )
    install_crds(layout, state)
    if fleet:
        _apply_fleet(fleet, layout, replace=False, timeout=300)


def _kube_version(bindir: Path) -> str:
    """The Kubernetes version the toolchain was built at (from its MANIFEST), or ''."""
    try:
        lines = (bindir.parent / "MANIFEST").read_text().splitlines()
    except FileNotFoundError:
        return ""
    return next((ln.split("=", 1)[1] for ln in lines if ln.startswith("kubernetes=")), "")


def _exists(api: Api, path: str) -> bool:
    try:
        api.get(path)
    except ApiError as err:
        if err.status == 404:
            return False
        raise
    return True


def install_crds(layout: Layout, state: State, crds_dir: Path = CRDS_DIR) -> list[str]:
    """Apply every YAML in crds/ and wait until each CRD is Established."""
    files = sorted(p for p in crds_dir.glob("*.yaml") if p.is_file()) if crds_dir.is_dir() else []
    if not files:
        _say(f"no CRDs in {crds_dir}; skipping")
        return []
    names: list[str] = []
    for path in files:
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                names.append(doc["metadata"]["name"])
    with _step(f"CRDs from {crds_dir.name}/ ({', '.join(names) or 'none'})"):
        for path in files:
            kubectl(
                state.bindir,
                layout.kubeconfig,
                "apply",
                "--server-side",
                "--force-conflicts",
                "-f",
                str(path),
            )
        api = admin_api(layout, state)
        for name in names:
            wait_for(
                f"CRD {name} to be Established",
                lambda name=name: _crd_established(api, name),  # type: ignore[misc]
                timeout=60,
            )
    return names


def _crd_established(api: Api, name: str) -> bool:
    crd = api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


def _node_ready(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _list_nodes(api: Api, selector: str) -> list[dict[str, Any]]:
    query = urllib.parse.urlencode({"labelSelector": selector})
    items: list[dict[str, Any]] = api.get(f"/api/v1/nodes?{query}")["items"]
    return items


def _create_nodes(api: Api, manifests: list[dict[str, Any]], existing: set[str]) -> int:
    """POST the nodes that do not exist yet, a few at a time (thousands take seconds)."""
    todo = [m for m in manifests if m["metadata"]["name"] not in existing]

    def create(node: dict[str, Any]) -> None:
        try:
            api.request("POST", "/api/v1/nodes", node)
        except ApiError as err:
            if err.status != 409:
                raise ClusterError(f"creating node {node['metadata']['name']}: {err}") from None

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(create, todo))
    return len(todo)


def _delete_nodes(api: Api, names: list[str]) -> None:
    """DELETE nodes a few at a time; ones already gone are fine."""

    def delete(name: str) -> None:
        try:
            api.request("DELETE", f"/api/v1/nodes/{name}")
        except ApiError as err:
            if err.status != 404:
                raise ClusterError(f"deleting node {name}: {err}") from None

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(delete, names))


def apply_fleet(
    fleet_ref: str, *, layout: Layout | None = None, replace: bool = False, timeout: float = 300
) -> Fleet:
    """Make the cluster's fake nodes match a fleet file and wait until they are all Ready."""
    layout = layout or default_layout()
    with _locked(layout):
        return _apply_fleet(fleet_ref, layout, replace=replace, timeout=timeout)


def _apply_fleet(fleet_ref: str, layout: Layout, *, replace: bool, timeout: float) -> Fleet:
    state = State.load(layout)
    if state is None or not is_up(layout):
        raise ClusterError("no cluster is running here; start one with `python -m e2e.cluster up`")
    fleet = load_fleet(resolve_fleet_path(fleet_ref, FLEETS_DIR))
    api = admin_api(layout, state)
    with _step(f"fleet {fleet.summary()}"):
        version = _kube_version(Path(state.bindir))
        wanted = {m["metadata"]["name"]: m for m in fleet.node_manifests(kubelet_version=version)}
        current = _list_nodes(api, FLEET_LABEL)
        stale = [
            n["metadata"]["name"]
            for n in current
            if replace
            or n["metadata"]["name"] not in wanted
            or n["metadata"]["labels"].get(FLEET_LABEL) != fleet.name
        ]
        _delete_nodes(api, stale)
        if stale:
            gone = set(stale)
            wait_for(
                f"{len(stale)} old nodes to go",
                lambda: not gone & {n["metadata"]["name"] for n in _list_nodes(api, FLEET_LABEL)},
                timeout=120,
            )
        existing = {n["metadata"]["name"] for n in _list_nodes(api, FLEET_LABEL)}
        created = _create_nodes(api, list(wanted.values()), existing)
        _say(f"  {created} nodes created, {len(stale)} removed; waiting for Ready")
        selector = f"{FLEET_LABEL}={fleet.name}"

        def all_ready() -> bool:
            nodes = _list_nodes(api, selector)
            return len(nodes) == fleet.node_count and all(_node_ready(n) for n in nodes)

        def not_ready() -> str:
            nodes = _list_nodes(api, selector)
            ready = sum(_node_ready(n) for n in nodes)
            return f"{ready}/{fleet.node_count} Ready (is kwok running? see {layout.logs}/kwok.log)"

        wait_for(
            f"fleet {fleet.name} to be Ready",
            all_ready,
            timeout=timeout,
            interval=0.25,
            hint=not_ready,
        )
    state.fleet = fleet.name
    state.save(layout)
    return fleet


def down(layout: Layout | None = None, *, keep_logs: bool = True) -> list[str]:
    """Stop exactly the processes this cluster dir recorded; remove its state and data."""
    layout = layout or default_layout()
    if not layout.root.is_dir():
        _say(f"no cluster folder {layout.root}; nothing to stop")
        return []
    with _locked(layout):
        return _down(layout, keep_logs=keep_logs)


def _down(layout: Layout, *, keep_logs: bool) -> list[str]:
    state = State.load(layout)
    stopped: list[str] = []
    if state is None:
        _say(f"no cluster recorded in {layout.root}; nothing to stop")
        return stopped
    # Reverse start order: kwok and the controllers before the API server, etcd last.
    for daemon in reversed(state.daemons):
        if procs.stop(daemon):
            stopped.append(f"{daemon.name} (pid {daemon.pid})")
    shutil.rmtree(state.data_dir, ignore_errors=True)
    for path in (layout.state, layout.env, layout.kubeconfig):
        path.unlink(missing_ok=True)
    for sub in ("apiserver-certs", "controller-manager-certs", "scheduler-certs", "etc"):
        shutil.rmtree(layout.root / sub, ignore_errors=True)
    if not keep_logs:
        shutil.rmtree(layout.logs, ignore_errors=True)
    _say(f"stopped {', '.join(stopped) if stopped else 'nothing (all were already gone)'}")
    return stopped


def status(layout: Layout | None = None) -> dict[str, Any]:
    """What runs, where, and how much memory it takes."""
    layout = layout or default_layout()
    state = State.load(layout)
    if state is None:
        return {"running": False, "dir": str(layout.root)}
    daemons = [
        {
            "name": d.name,
            "pid": d.pid,
            "running": procs.is_running(d),
            "rss_mib": round(procs.rss_kib(d) / 1024),
            "log": d.log,
        }
        for d in state.daemons
    ]
    result: dict[str, Any] = {
        "running": is_up(layout),
        "dir": str(layout.root),
        "server": state.server,
        "kubeconfig": str(layout.kubeconfig),
        "bindir": state.bindir,
        "fleet": state.fleet,
        "daemons": daemons,
        "rss_mib_total": sum(int(d["rss_mib"]) for d in daemons),  # type: ignore[call-overload]
    }
    if result["running"]:
        nodes = _list_nodes(admin_api(layout, state), "type=kwok")
        result["nodes"] = len(nodes)
        result["nodes_ready"] = sum(_node_ready(n) for n in nodes)
    return result
