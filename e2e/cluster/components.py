"""How each control-plane process is started: flags, config files, health checks.

Why: one place that says how etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
kwok are configured for Elastra's tests (tmpfs without fsync, client certificates and RBAC,
leader election off, kwok with our own stages) and how each one is known to be healthy.
"""

from __future__ import annotations

import base64
import json
import socket
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from . import procs
from .api import WaitTimeoutError, probe_http_health, probe_https_health, wait_for
from .fleet import KWOK_ANNOTATION
from .pki import Pki, ensure_client_cert
from .state import ClusterDirs, ClusterError, State, admin_api

STAGES = Path(__file__).resolve().parent / "kwok-stages.yaml"

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
# With a real node (`up --real-node`, e2e/node) the ranges cannot be loopback: a kubelet refuses
# loopback pod and node addresses. 198.18.0.0/15 is the benchmarking range (RFC 2544): no one
# else's network; the node adds blackhole routes for both ranges so nothing leaks from here.
REAL_POD_CIDR = "198.18.0.0/16"
REAL_NODE_POD_CIDR = "198.18.0.0/24"
REAL_SERVICE_CIDR = "198.19.0.0/16"
REAL_FIRST_SERVICE_IP = "198.19.0.1"
NODE_LEASE_SECONDS = 80
NODE_GRACE_SECONDS = 120
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


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(path: Path, *, server: str, pki: Pki, user: str) -> None:
    """A self-contained kubeconfig (certificates embedded) for one client identity."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "elastra-local",
                "cluster": {"server": server, "certificate-authority-data": b64(pki.ca_cert)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": b64(pki.client_cert(user)),
                    "client-key-data": b64(pki.client_key(user)),
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


def write_env(layout: ClusterDirs, bindir: Path) -> None:
    layout.env.write_text(
        "# Source me: . .cluster/env  (written by `python -m e2e.cluster up`)\n"
        f"export KUBECONFIG={layout.kubeconfig}\n"
        f'export PATH={bindir}:"$PATH"\n'
        f"export ELASTRA_TOOLCHAIN_BIN={bindir}\n"
    )


def tail(path: str | Path, lines: int = 15) -> str:
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


def has_condition(obj: Mapping[str, Any], kind: str) -> bool:
    """Whether an object's status holds condition ``kind`` with status True; an object whose
    controller has not yet written any condition (no status, null conditions) holds none."""
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)


def crd_established(crd: Mapping[str, Any]) -> bool:
    """Whether a CustomResourceDefinition object says Established (its API is served)."""
    return has_condition(crd, "Established")


def wait_crds_established(
    run_kubectl: Callable[..., str], *selector: str, timeout: float = 60
) -> None:
    """Poll until every CRD that ``kubectl get SELECTOR`` lists is Established.

    Why not ``kubectl wait --for=condition=Established``: on a loaded machine it can look
    before the API server has written a new CRD's first conditions, and then it fails at once
    (".status.conditions accessor error: <nil>") instead of waiting.
    """

    def pending() -> list[str]:
        got = json.loads(run_kubectl("get", *selector, "-o", "json"))
        items = got.get("items", []) if got.get("kind") == "List" else [got]
        return [i["metadata"]["name"] for i in items if not crd_established(i)]

    wait_for(
        f"CRDs {' '.join(selector)} to be Established",
        lambda: not pending(),
        timeout=timeout,
        interval=0.5,
        hint=lambda: "not yet: " + ", ".join(pending()),
    )


# --- daemons ---------------------------------------------------------------------------------


ENDPOINT_CONTROLLERS = (
    "endpoints-controller",
    "endpointslice-controller",
    "endpointslice-mirroring-controller",
)
"""The controller-manager's controllers that publish Services' endpoints. kwok's pods have
loopback addresses, which Endpoints and EndpointSlices may not hold: here these controllers
only retry refused writes (a benchmark can leave them out, ``Ctx.without_controllers``)."""


@dataclass(frozen=True)
class Ctx:
    layout: ClusterDirs
    state: State
    bindir: Path
    without_controllers: tuple[str, ...] = ()
    """Controller-manager controllers not to run (``--controllers=*,-name``)."""

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
                    + tail(daemon.log)
                )
            return probe()

        try:
            wait_for(f"{daemon.name} to become healthy", check, timeout=timeout, interval=0.1)
        except WaitTimeoutError as err:
            raise ClusterError(f"{err}; last lines of {daemon.log}:\n{tail(daemon.log)}") from None


def start_etcd(ctx: Ctx) -> None:
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


def start_apiserver(ctx: Ctx) -> None:
    p, pki = ctx.state.ports, ctx.layout.pki
    real = ctx.state.real_node
    # With a real node, pods reach the API server through the `kubernetes` Service, which
    # kube-proxy translates to the machine's own address: listen there too and keep the
    # Service's endpoints (the lease reconciler). Without one, loopback only, no endpoints.
    if real:
        service_cidr = REAL_SERVICE_CIDR
        addresses = ["--bind-address=0.0.0.0", f"--advertise-address={real['ip']}"]
        reconciler = "--endpoint-reconciler-type=lease"
        # The kubelet (system:node:<name>) is authorised by the Node authorizer.
        authz = "--authorization-mode=Node,RBAC"
        # kubectl logs/exec go API server -> kubelet, which checks a client cert from the CA.
        ensure_client_cert(
            pki, "apiserver-kubelet", "kube-apiserver-kubelet-client", "system:masters"
        )
        addresses += [
            f"--kubelet-client-certificate={pki.client_cert('apiserver-kubelet')}",
            f"--kubelet-client-key={pki.client_key('apiserver-kubelet')}",
            f"--kubelet-certificate-authority={pki.ca_cert}",
            "--kubelet-preferred-address-types=InternalIP",
        ]
    else:
        service_cidr = SERVICE_CIDR
        addresses = ["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1"]
        reconciler = "--endpoint-reconciler-type=none"
        authz = "--authorization-mode=RBAC"
    daemon = ctx.start(
        "kube-apiserver",
        [
            "kube-apiserver",
            f"--etcd-servers=http://127.0.0.1:{p['etcd']}",
            *addresses,
            f"--secure-port={p['apiserver']}",
            f"--cert-dir={ctx.layout.root / 'apiserver-certs'}",
            f"--tls-cert-file={pki.serving_cert}",
            f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_cert}",
            "--anonymous-auth=false",
            authz,
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            f"--service-cluster-ip-range={service_cidr}",
            reconciler,
            "--allow-privileged=true",
            "--profiling=false",
            "--max-requests-inflight=800",
            "--max-mutating-requests-inflight=400",
            "--v=1",
        ],
    )
    api = admin_api(ctx.layout, ctx.state)
    ctx.wait_healthy(daemon, api.healthy, timeout=90)


def start_controller_manager(ctx: Ctx) -> procs.Daemon:
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
            *_controllers_flag(ctx.without_controllers),
            "--v=1",
        ],
    )


def _controllers_flag(without: tuple[str, ...]) -> list[str]:
    """Every default controller but ``without`` (none: the flag is left out)."""
    return [f"--controllers=*,{','.join('-' + c for c in without)}"] if without else []


def start_scheduler(ctx: Ctx) -> procs.Daemon:
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


def start_kwok(ctx: Ctx) -> procs.Daemon:
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


def start_controllers(ctx: Ctx) -> None:
    """Start controller-manager, scheduler and kwok together, then wait for each to be healthy."""
    p = ctx.state.ports
    kcm = start_controller_manager(ctx)
    sched = start_scheduler(ctx)
    kwok = start_kwok(ctx)
    kcm_url = f"https://127.0.0.1:{p['controller_manager']}/healthz"
    ctx.wait_healthy(kcm, lambda: probe_https_health(kcm_url), timeout=60)
    sched_url = f"https://127.0.0.1:{p['scheduler']}/healthz"
    ctx.wait_healthy(sched, lambda: probe_https_health(sched_url), timeout=60)
    kwok_url = f"http://127.0.0.1:{p['kwok']}/healthz"
    ctx.wait_healthy(kwok, lambda: probe_http_health(kwok_url), timeout=60)
