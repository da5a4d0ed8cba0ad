"""A real Kubernetes node on this machine: containerd, CNI, kubelet, kube-proxy and CoreDNS.

Why: the e2e suite and `make demo` need real pods (real processes, real IPs, TCP between
pods) next to kwok's simulated nodes, and no image can be pulled here. The node uses Debian's
containerd on its own socket and state folders, runc, the bridge/host-local/loopback CNI
plugins, a pause image built locally (e2e/images) and the toolchain's kubelet and kube-proxy.

Guarantees:
- every daemon is recorded (PID + executable) in the cluster's state.json before anything
  waits on it, so the cluster's `down` stops it; `teardown` first removes the node's pods
  (CNI DEL), then stops the daemons, removes kube-proxy's iptables rules, our FORWARD guard,
  the blackhole routes and the network namespaces containerd left;
- nothing leaves the machine: the pod and service ranges have blackhole routes (the node's
  own pod /24 on the bridge is more specific), pods are never masqueraded, and a FORWARD rule
  drops pod traffic towards the default-route interface.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from e2e import hostpkgs
from e2e.cluster import procs
from e2e.cluster.api import Api, ApiStatusError, WaitTimeoutError, wait_for
from e2e.cluster.components import (
    REAL_NODE_POD_CIDR,
    REAL_POD_CIDR,
    REAL_SERVICE_CIDR,
    free_ports,
    has_condition,
    tail,
    write_kubeconfig,
)
from e2e.cluster.pki import Pki, ensure_client_cert, ensure_serving_cert
from e2e.cluster.state import ClusterDirs, ClusterError, State, admin_api, say
from e2e.images.build import BUILDERS, PAUSE_TAG, import_image, remove_orphans

REPO = Path(__file__).resolve().parents[2]
POD_CIDR = REAL_POD_CIDR
NODE_POD_CIDR = REAL_NODE_POD_CIDR
SERVICE_CIDR = REAL_SERVICE_CIDR
BRIDGE = "elastra0"
CNI_BIN_DIRS = ("/usr/lib/cni", "/opt/cni/bin")
NODE_LABEL = "elastra.dev/real-node"


def node_ip() -> str:
    """This machine's own address: the source address of its default route."""
    out = subprocess.run(
        ["ip", "-4", "-json", "route", "get", "192.0.2.255"],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode == 0:
        routes = json.loads(out.stdout)
        if routes and routes[0].get("prefsrc"):
            return str(routes[0]["prefsrc"])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.255", 9))  # UDP connect sends nothing; it only picks a route
        return str(s.getsockname()[0])


def default_iface() -> str:
    out = subprocess.run(
        ["ip", "-4", "-json", "route", "show", "default"],
        capture_output=True,
        text=True,
        check=False,
    )
    routes = json.loads(out.stdout or "[]")
    return str(routes[0]["dev"]) if routes else "eth0"


@dataclass(frozen=True)
class NodeLayout:
    root: Path  # <cluster dir>/node

    @property
    def sock(self) -> Path:
        return self.root / "containerd.sock"

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def store(self) -> Path:
        """containerd's root (content + snapshots), kept across clusters in the cache.

        Only one real node runs per machine (claim), so one store is safe, and a 5 GB worker
        image is imported once per machine instead of once per cluster (4-5 min each time).
        """
        base = os.environ.get("ELASTRA_CACHE") or str(Path.home() / ".cache" / "elastra")
        return Path(base) / "node" / "containerd-root"


# One real node per machine: its kubelet owns /sys/fs/cgroup/*/kubepods, and the bridge, the
# routes and the FORWARD rule are machine-wide. The node that runs is recorded here.
CLAIM = Path("/run/elastra-real-node.json")


def _claimed_by_other(layout: ClusterDirs) -> str | None:
    try:
        raw = json.loads(CLAIM.read_text())
    except (FileNotFoundError, ValueError):
        return None
    if raw.get("cluster") == str(layout.root):
        return None
    owner = procs.Daemon.from_json(raw["containerd"]) if raw.get("containerd") else None
    if owner is not None and procs.is_running(owner):
        return str(raw["cluster"])
    # Starting up (no containerd yet) counts for a minute; after that the claim is stale.
    fresh = time.time() - CLAIM.stat().st_mtime < 60
    return str(raw["cluster"]) if owner is None and fresh else None


def claim_holder() -> Path | None:
    """The cluster folder recorded as running this machine's real node, if any."""
    try:
        return Path(json.loads(CLAIM.read_text())["cluster"])
    except (FileNotFoundError, ValueError, KeyError):
        return None


def claim(layout: ClusterDirs, *, wait: float) -> None:
    """Record that layout's cluster runs this machine's real node.

    Another cluster's live node is waited for (wait seconds: test runs side by side take
    turns), then refused with a message naming it.
    """
    with (CLAIM.parent / (CLAIM.name + ".lock")).open("w") as handle:
        deadline = time.monotonic() + wait
        next_note = 0.0
        while True:
            fcntl.flock(handle, fcntl.LOCK_EX)
            other = _claimed_by_other(layout)
            if other is None:
                CLAIM.write_text(json.dumps({"cluster": str(layout.root), "containerd": None}))
                return
            fcntl.flock(handle, fcntl.LOCK_UN)
            if time.monotonic() >= deadline:
                raise ClusterError(
                    f"a real node already runs on this machine for the cluster in {other} "
                    "(one per machine: cgroups, bridge and routes are shared); stop it first"
                )
            if time.monotonic() >= next_note:
                say(f"waiting for the real node of {other} to stop (one per machine)")
                next_note = time.monotonic() + 30
            time.sleep(2)


def _record_claim(layout: ClusterDirs, containerd: procs.Daemon) -> None:
    CLAIM.write_text(json.dumps({"cluster": str(layout.root), "containerd": containerd.to_json()}))


def release(layout: ClusterDirs) -> None:
    with contextlib.suppress(FileNotFoundError, ValueError):
        if json.loads(CLAIM.read_text()).get("cluster") == str(layout.root):
            CLAIM.unlink()


def _need(tool: str) -> str:
    try:
        return hostpkgs.require(tool)
    except hostpkgs.HostPackageError as err:
        raise ClusterError(str(err)) from None


def _sh(argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and out.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} failed: {out.stderr.strip() or out.stdout.strip()}")
    return out


# --- containerd ------------------------------------------------------------------------------


def containerd_config(nl: NodeLayout, cni_bin: str, pause_tag: str) -> str:
    r = nl.root
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{nl.store}"
state = "{r / "containerd-state"}"
[grpc]
  address = "{nl.sock}"
[ttrpc]
  address = "{nl.sock}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{r / "containerd-opt"}"
[{cri}]
  sandbox_image = "{pause_tag}"
  tolerate_missing_hugepages_controller = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  # Lowering oom_score_adj needs CAP_SYS_RESOURCE, which this machine does not give root:
  # clamp pods to containerd's own value (runc otherwise fails: "can't get final child's PID").
  restrict_oom_score_adj = true
  max_container_log_line_size = 16384
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
[{cri}.cni]
  bin_dir = "{cni_bin}"
  conf_dir = "{nl.etc / "cni"}"
  max_conf_num = 1
"""


def cni_config(nl: NodeLayout) -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "name": "elastra",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": NODE_POD_CIDR}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(nl.root / "cni-ipam"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def start_containerd(nl: NodeLayout, state: State, layout: ClusterDirs) -> procs.Daemon:
    containerd = _need("containerd")
    _need("runc")
    cni_bin = next((d for d in CNI_BIN_DIRS if Path(d, "bridge").exists()), None)
    if cni_bin is None:
        raise ClusterError("CNI plugins missing: apt-get install -y containernetworking-plugins")
    (nl.etc / "cni").mkdir(parents=True, exist_ok=True)
    (nl.etc / "cni" / "10-elastra.conflist").write_text(json.dumps(cni_config(nl), indent=2))
    config = nl.etc / "containerd.toml"
    config.write_text(containerd_config(nl, cni_bin, PAUSE_TAG))
    nl.sock.unlink(missing_ok=True)
    env = dict(os.environ, PATH="/usr/sbin:/usr/bin:/sbin:/bin:" + os.environ.get("PATH", ""))
    daemon = procs.start(
        "containerd",
        [containerd, f"--config={config}"],
        log=layout.logs / "containerd.log",
        env=env,
    )
    state.daemons.append(daemon)
    state.save(layout)
    ctr = shutil.which("ctr") or "ctr"

    def ready() -> bool:
        if not procs.is_running(daemon):
            raise ClusterError(
                f"containerd exited; last lines of {daemon.log}:\n{tail(daemon.log)}"
            )
        return _sh([ctr, f"--address={nl.sock}", "version"], check=False).returncode == 0

    wait_for("containerd to answer on its socket", ready, timeout=30)
    return daemon


def import_images(nl: NodeLayout, names: list[str]) -> None:
    for name in names:
        import_image(BUILDERS[name](), address=str(nl.sock), store=str(nl.store))
    remove_orphans(address=str(nl.sock))


# --- network guards --------------------------------------------------------------------------


def _sysctl(key: str) -> str:
    return Path("/proc/sys", *key.split(".")).read_text().strip()


def _set_sysctl(key: str, value: str) -> None:
    Path("/proc/sys", *key.split(".")).write_text(value)


def guard_network(info: dict[str, Any]) -> None:
    """Blackhole routes for the pod and service ranges; drop pod traffic leaving the machine."""
    iface = default_iface()
    info["routes"] = []
    for cidr in (POD_CIDR, SERVICE_CIDR):
        if _sh(["ip", "route", "add", "blackhole", cidr], check=False).returncode == 0:
            info["routes"].append(cidr)
    rule = ["FORWARD", "-s", POD_CIDR, "-o", iface, "-j", "DROP"]
    if _sh(["iptables", "-C", *rule], check=False).returncode != 0:
        _sh(["iptables", "-I", *rule])
    info["forward_rule"] = rule
    info["sysctls"] = {}
    for key, want in (("net.bridge.bridge-nf-call-iptables", "1"),):
        with contextlib.suppress(OSError):
            have = _sysctl(key)
            if have != want:
                _set_sysctl(key, want)
                info["sysctls"][key] = have
    # The bridge plugin turns ip_forward on; remember what it was so teardown restores it.
    with contextlib.suppress(OSError):
        info["sysctls"].setdefault("net.ipv4.ip_forward", _sysctl("net.ipv4.ip_forward"))


def unguard_network(info: dict[str, Any]) -> None:
    for cidr in info.get("routes", []):
        _sh(["ip", "route", "del", "blackhole", cidr], check=False)
    rule = info.get("forward_rule")
    if rule:
        while _sh(["iptables", "-D", *rule], check=False).returncode == 0:
            pass
    for key, value in (info.get("sysctls") or {}).items():
        with contextlib.suppress(OSError):
            _set_sysctl(key, value)


# --- kubelet and kube-proxy ------------------------------------------------------------------


def node_name() -> str:
    return f"real-{socket.gethostname().split('.')[0].lower()}"[:63]


def start_kubelet(
    *,
    nl: NodeLayout,
    state: State,
    layout: ClusterDirs,
    bindir: Path,
    ip: str,
    ports: dict[str, int],
) -> procs.Daemon:
    pki: Pki = layout.pki
    name = node_name()
    ensure_client_cert(pki, "kubelet", f"system:node:{name}", "system:nodes")
    ensure_serving_cert(pki, "kubelet-serving", names=(name,), ips=(ip, "127.0.0.1"))
    kubeconfig = nl.etc / "kubelet.kubeconfig"
    write_kubeconfig(kubeconfig, server=state.server, pki=pki, user="kubelet")
    config = nl.etc / "kubelet.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kubelet.config.k8s.io/v1beta1",
                "kind": "KubeletConfiguration",
                "failCgroupV1": False,
                "cgroupDriver": "cgroupfs",
                "containerRuntimeEndpoint": f"unix://{nl.sock}",
                "address": ip,
                "port": ports["kubelet"],
                "readOnlyPort": 0,
                "healthzBindAddress": "127.0.0.1",
                "healthzPort": ports["kubelet_healthz"],
                "authentication": {
                    "anonymous": {"enabled": False},
                    "webhook": {"enabled": True},
                    "x509": {"clientCAFile": str(pki.ca_cert)},
                },
                "authorization": {"mode": "Webhook"},
                "tlsCertFile": str(pki.client_cert("kubelet-serving")),
                "tlsPrivateKeyFile": str(pki.client_key("kubelet-serving")),
                "clusterDomain": DNS_DOMAIN,
                "clusterDNS": [ip],
                "failSwapOn": False,
                "resolvConf": "/etc/resolv.conf",
                "podCIDR": NODE_POD_CIDR,
                "maxPods": 60,
                "serializeImagePulls": False,
                "imageGCHighThresholdPercent": 100,
                "imageGCLowThresholdPercent": 99,
                "imageMinimumGCAge": "87600h",
                "evictionHard": {
                    "memory.available": "200Mi",
                    "nodefs.available": "1%",
                    "imagefs.available": "1%",
                },
                "localStorageCapacityIsolation": False,
                "nodeStatusReportFrequency": "20s",
                "syncFrequency": "10s",
                "fileCheckFrequency": "10s",
                "volumeStatsAggPeriod": "0s",
                "protectKernelDefaults": False,
            }
        )
    )
    argv = [
        str(bindir / "kubelet"),
        f"--config={config}",
        f"--kubeconfig={kubeconfig}",
        f"--root-dir={nl.root / 'kubelet'}",
        f"--cert-dir={nl.root / 'kubelet-certs'}",
        f"--hostname-override={name}",
        f"--node-ip={ip}",
        f"--node-labels={NODE_LABEL}=true",
        "--v=1",
    ]
    daemon = procs.start("kubelet", argv, log=layout.logs / "kubelet.log")
    state.daemons.append(daemon)
    state.save(layout)
    return daemon


DNS_DOMAIN = "cluster.local"


def coredns_binary() -> Path:
    """CoreDNS built from its Go module (cached per user by e2e/kind/build.sh)."""
    script = REPO / "e2e" / "kind" / "build.sh"
    # Its progress (minutes when cold) goes to our stderr; the path is its last line.
    out = subprocess.run([str(script), "--coredns"], stdout=subprocess.PIPE, text=True, check=False)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        raise ClusterError(f"{script} --coredns failed (exit {out.returncode}): see above")
    return Path(lines[-1])


def start_coredns(
    *, nl: NodeLayout, state: State, layout: ClusterDirs, binary: Path, ip: str
) -> None:
    """The cluster's DNS, as a process on the node's address (port 53): pods resolve
    ``<pod>.<service>.<namespace>.svc`` as on any cluster, which the operator's workers use
    to find rank 0 before it has an IP. It answers for the cluster domain only: other names
    are refused, so nothing is forwarded off this machine."""
    corefile = nl.etc / "Corefile"
    corefile.write_text(
        f"{DNS_DOMAIN}:53 {{\n"
        f"    bind {ip}\n"
        "    errors\n"
        f"    kubernetes {DNS_DOMAIN} {{\n"
        f"        kubeconfig {layout.kubeconfig}\n"
        "        ttl 5\n"
        "    }\n"
        "}\n"
    )
    argv = [str(binary), "-conf", str(corefile)]
    daemon = procs.start("coredns", argv, log=layout.logs / "coredns.log")
    state.daemons.append(daemon)
    state.save(layout)


def start_kube_proxy(
    *,
    nl: NodeLayout,
    state: State,
    layout: ClusterDirs,
    bindir: Path,
    ip: str,
    ports: dict[str, int],
) -> procs.Daemon:
    pki = layout.pki
    ensure_client_cert(pki, "kube-proxy", "system:kube-proxy", None)
    kubeconfig = nl.etc / "kube-proxy.kubeconfig"
    write_kubeconfig(kubeconfig, server=state.server, pki=pki, user="kube-proxy")
    config = nl.etc / "kube-proxy.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
                "kind": "KubeProxyConfiguration",
                "mode": "iptables",
                "clientConnection": {"kubeconfig": str(kubeconfig)},
                "hostnameOverride": node_name(),
                "bindAddress": ip,
                "clusterCIDR": POD_CIDR,
                "healthzBindAddress": f"127.0.0.1:{ports['proxy_healthz']}",
                "metricsBindAddress": f"127.0.0.1:{ports['proxy_metrics']}",
                "conntrack": {"maxPerCore": 0},
                "iptables": {"masqueradeAll": False, "syncPeriod": "10s"},
            }
        )
    )
    argv = [str(bindir / "kube-proxy"), f"--config={config}", "--v=1"]
    daemon = procs.start("kube-proxy", argv, log=layout.logs / "kube-proxy.log")
    state.daemons.append(daemon)
    state.save(layout)
    return daemon


def _node_ready(api: Api, name: str) -> bool:
    try:
        node = api.get(f"/api/v1/nodes/{name}")
    except ApiStatusError as err:
        if err.status == 404:
            return False
        raise
    return has_condition(node, "Ready")


def start(layout: ClusterDirs, state: State, bindir: Path, *, images: list[str]) -> dict[str, Any]:
    """Start containerd, import images, start kubelet + kube-proxy; wait for the node Ready."""
    if os.geteuid() != 0:
        raise ClusterError("a real node needs root (containerd, iptables, routes, cgroups)")
    nl = NodeLayout(layout.root / "node")
    nl.etc.mkdir(parents=True, exist_ok=True)
    unknown = sorted(set(images) - set(BUILDERS))
    if unknown:
        raise ClusterError(f"unknown image(s) {', '.join(unknown)}; known: {', '.join(BUILDERS)}")
    for tool in hostpkgs.PACKAGES:  # everything a node needs, before anything uses one
        _need(tool)
    # Build (or find cached) every image before taking the machine's one real node.
    built = [BUILDERS[name]() for name in ["pause", *[i for i in images if i != "pause"]]]
    coredns = coredns_binary()
    claim(layout, wait=float(os.environ.get("ELASTRA_REAL_NODE_WAIT", "600")))
    ip = node_ip()
    info: dict[str, Any] = {"name": node_name(), "ip": ip, "root": str(nl.root)}
    state.real_node = info
    state.save(layout)
    guard_network(info)
    state.save(layout)
    started = time.monotonic()
    _record_claim(layout, start_containerd(nl, state, layout))
    say(f"containerd on {nl.sock}: ok ({time.monotonic() - started:.1f}s)")
    for image in built:
        import_image(image, address=str(nl.sock), store=str(nl.store))
    remove_orphans(address=str(nl.sock))
    names = ["kubelet", "kubelet_healthz", "proxy_healthz", "proxy_metrics"]
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    info["ports"] = ports
    state.save(layout)
    kwargs = {"nl": nl, "state": state, "layout": layout, "bindir": bindir, "ip": ip}
    start_coredns(nl=nl, state=state, layout=layout, binary=coredns, ip=ip)
    kubelet = start_kubelet(**kwargs, ports=ports)  # type: ignore[arg-type]
    start_kube_proxy(**kwargs, ports=ports)  # type: ignore[arg-type]
    api = admin_api(layout, state)

    def ready() -> bool:
        if not procs.is_running(kubelet):
            raise ClusterError(f"kubelet exited; last lines of {kubelet.log}:\n{tail(kubelet.log)}")
        return _node_ready(api, info["name"])

    try:
        wait_for(f"node {info['name']} to be Ready", ready, timeout=120, interval=0.5)
    except WaitTimeoutError as err:
        raise ClusterError(
            f"{err}; last lines of {kubelet.log}:\n{tail(kubelet.log, 25)}"
        ) from None
    say(f"real node {info['name']} ({ip}) Ready ({time.monotonic() - started:.1f}s)")
    return info


def _node_pods(api: Api, name: str) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = api.get(f"/api/v1/pods?fieldSelector=spec.nodeName%3D{name}")[
        "items"
    ]
    return pods


def _ctr(nl: NodeLayout, *args: str) -> subprocess.CompletedProcess[str]:
    return _sh(
        [shutil.which("ctr") or "ctr", f"--address={nl.sock}", "-n", "k8s.io", *args], check=False
    )


def teardown(layout: ClusterDirs, state: State) -> list[str]:
    """Remove the node's pods, stop its daemons, undo its network changes. Safe to repeat."""
    info = state.real_node
    if not info or "root" not in info:
        return []  # the node never claimed this machine: nothing of ours to undo
    nl = NodeLayout(Path(info["root"]))
    stopped: list[str] = []
    by_name = {d.name: d for d in state.daemons}
    kubelet, containerd = by_name.get("kubelet"), by_name.get("containerd")
    api = admin_api(layout, state)
    # 1. Pods go through the kubelet (CNI DEL, sandbox removal) while it still runs.
    if kubelet and procs.is_running(kubelet) and api.healthy():
        with contextlib.suppress(ApiStatusError):
            for pod in _node_pods(api, info["name"]):
                meta = pod["metadata"]
                with contextlib.suppress(ApiStatusError):
                    api.request(
                        "DELETE",
                        f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
                        "?gracePeriodSeconds=0",
                    )
        with contextlib.suppress(WaitTimeoutError):
            wait_for(
                "the real node's containers to stop",
                lambda: (
                    containerd is not None
                    and not [ln for ln in _ctr(nl, "tasks", "ls", "-q").stdout.splitlines() if ln]
                ),
                timeout=60,
                interval=0.5,
            )
    # 2. Daemons (kube-proxy, kubelet) stop; leftover tasks are killed while containerd runs.
    for daemon in reversed(state.daemons):
        if daemon.name in ("kube-proxy", "kubelet", "coredns") and procs.stop(daemon):
            stopped.append(f"{daemon.name} (pid {daemon.pid})")
    netns: set[str] = set()
    if containerd and procs.is_running(containerd):
        for cid in _ctr(nl, "containers", "ls", "-q").stdout.split():
            spec = _ctr(nl, "containers", "info", cid).stdout
            with contextlib.suppress(ValueError, KeyError, TypeError):
                for ns in json.loads(spec)["Spec"]["linux"]["namespaces"]:
                    if ns.get("type") == "network" and ns.get("path"):
                        netns.add(ns["path"])
            _ctr(nl, "tasks", "kill", "-s", "SIGKILL", cid)
        time.sleep(0.5)
        for cid in _ctr(nl, "containers", "ls", "-q").stdout.split():
            _ctr(nl, "tasks", "delete", "-f", cid)
            _ctr(nl, "containers", "delete", cid)
        if procs.stop(containerd):
            stopped.append(f"containerd (pid {containerd.pid})")
    for path in sorted(netns):
        _sh(["umount", path], check=False)
        with contextlib.suppress(OSError):
            os.unlink(path)
    # 3. kube-proxy's rules, the bridge, our guards.
    proxy = Path(state.bindir) / "kube-proxy"
    if proxy.exists():
        _sh([str(proxy), "--cleanup", "--v=0"], check=False)
    _sh(["ip", "link", "del", BRIDGE], check=False)
    _remove_kubelet_chains()
    _remove_kubepods_cgroups()
    unguard_network(info)
    shutil.rmtree(nl.root / "cni-ipam", ignore_errors=True)
    _unmount_under(nl.root)
    release(layout)
    return stopped


# Chains the kubelet itself adds (kube-proxy --cleanup leaves them).
KUBELET_CHAINS = {
    "filter": ("KUBE-FIREWALL", "KUBE-KUBELET-CANARY"),
    "nat": ("KUBE-KUBELET-CANARY",),
    "mangle": ("KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT"),
}


def _remove_kubelet_chains() -> None:
    for tool in ("iptables", "ip6tables"):
        if shutil.which(tool) is None:
            continue
        for table, chains in KUBELET_CHAINS.items():
            for parent in ("INPUT", "OUTPUT", "FORWARD"):
                for chain in chains:
                    jump = [tool, "-t", table, "-D", parent, "-j", chain]
                    while _sh(jump, check=False).returncode == 0:
                        pass
            for chain in chains:
                _sh([tool, "-t", table, "-F", chain], check=False)
                _sh([tool, "-t", table, "-X", chain], check=False)


def _remove_kubepods_cgroups() -> None:
    """rmdir the kubelet's (now empty) kubepods cgroups in every hierarchy, deepest first."""
    for top in Path("/sys/fs/cgroup").glob("*/kubepods"):
        for path in sorted(top.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if path.is_dir():
                with contextlib.suppress(OSError):
                    path.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


def _unmount_under(root: Path) -> None:
    """Unmount what the kubelet/containerd left mounted below root (deepest first)."""
    prefix = str(root.resolve()) + "/"
    mounts = [
        line.split()[1]
        for line in Path("/proc/self/mounts").read_text().splitlines()
        if line.split()[1].startswith(prefix)
    ]
    for target in sorted(mounts, key=len, reverse=True):
        _sh(["umount", "-l", target], check=False)
