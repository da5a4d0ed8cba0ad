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

import contextlib
import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from e2e.node import node as real_node_mod

from . import procs
from .api import Api, ApiStatusError, wait_for
from .components import (
    FIRST_SERVICE_IP,
    REAL_FIRST_SERVICE_IP,
    Ctx,
    crd_established,
    free_ports,
    kubectl,
    start_apiserver,
    start_controllers,
    start_etcd,
    write_env,
    write_kubeconfig,
)
from .fleet import Fleet, load_fleet, resolve_fleet_path
from .nodes import kube_version, list_nodes, node_ready, sync_fleet
from .pki import ensure_pki
from .state import REPO, ClusterDirs, ClusterError, State, admin_api, default_layout, say

BUILD_SCRIPT = REPO / "e2e" / "toolchain" / "build.sh"
# ELASTRA_CRDS_DIR installs CRDs from elsewhere (a chart, a candidate generation) instead.
CRDS_DIR = Path(os.environ.get("ELASTRA_CRDS_DIR", REPO / "crds"))
FLEETS_DIR = REPO / "e2e" / "fleets"
DEFAULT_FLEET = "hetero-small"


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


# --- public operations -----------------------------------------------------------------------


def orphaned(layout: ClusterDirs) -> bool:
    """True when the recorded owner was a test run whose process is gone."""
    state = State.load(layout)
    if state is None or not state.owner.startswith("pid:"):
        return False
    return not Path(f"/proc/{state.owner.removeprefix('pid:')}").exists()


def is_up(layout: ClusterDirs) -> bool:
    state = State.load(layout)
    if state is None or not state.daemons:
        return False
    if not all(procs.is_running(d) for d in state.daemons):
        return False
    return admin_api(layout, state).healthy()


@contextlib.contextmanager
def _locked(layout: ClusterDirs) -> Iterator[None]:
    """One up/down/apply-fleet at a time per cluster folder (two terminals, make -j)."""
    layout.root.mkdir(parents=True, exist_ok=True)
    with (layout.root / ".lock").open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"another cluster command holds {layout.root / '.lock'}; waiting")
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


@contextlib.contextmanager
def _step(what: str) -> Iterator[None]:
    started = time.monotonic()
    say(f"{what} ...")
    yield
    say(f"{what}: ok ({time.monotonic() - started:.1f}s)")


def up(
    layout: ClusterDirs | None = None,
    *,
    fleet: str | None = DEFAULT_FLEET,
    owner: str = "",
    real_node: bool = False,
    images: tuple[str, ...] = (),
    without_controllers: tuple[str, ...] = (),
) -> bool:
    """Start the cluster (or find it running). Returns True when this call started it.

    owner is recorded in state.json (a test run passes "pid:<its pid>" so that a later run can
    tell a cluster left behind by a killed run from one a person started). real_node also
    starts a real node on this machine (e2e/node: containerd, kubelet, kube-proxy) with the
    pause image and `images` (names known to e2e/images) imported into its containerd.
    without_controllers: controller-manager controllers a new cluster does not run (a running
    one is found as it is).
    """
    layout = layout or default_layout()
    with _locked(layout):
        return _up(layout, fleet, owner, real_node, images, without_controllers=without_controllers)


def _up(
    layout: ClusterDirs,
    fleet: str | None,
    owner: str,
    real_node: bool,
    images: tuple[str, ...],
    *,
    without_controllers: tuple[str, ...],
) -> bool:
    if is_up(layout):
        state = State.load(layout)
        assert state is not None
        say(f"already running at {state.server} (kubeconfig {layout.kubeconfig})")
        if real_node and not state.real_node:
            raise ClusterError(
                "the running cluster has no real node; stop it (down) and start it again"
            )
        if state.real_node and images:
            real_node_mod.import_images(
                real_node_mod.NodeLayout(Path(state.real_node["root"])), list(images)
            )
        if fleet and fleet != state.fleet:
            _apply_fleet(fleet, layout, replace=False, timeout=300)
        return False
    if State.load(layout) is not None:
        say("found a stopped or half-running cluster; cleaning it up first")
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
        owner=owner,
    )
    if real_node:
        holder = real_node_mod.claim_holder()
        if holder is not None and holder != layout.root and orphaned(ClusterDirs(holder)):
            say(f"stopping the real node a killed test run left in {holder}")
            down(ClusterDirs(holder))
        # Recorded before the API server starts: it then listens on the node's address too.
        state.real_node = {"ip": real_node_mod.node_ip(), "pending": True}
    state.save(layout)
    try:
        _bring_up(Ctx(layout, state, bindir, without_controllers), fleet, images)
    except BaseException:
        say(f"start-up failed; stopping what was started (logs stay in {layout.logs})")
        _down(layout, keep_logs=True)
        raise
    say(f"up in {time.monotonic() - started:.1f}s: . {layout.env}  (then kubectl get nodes)")
    return True


def _bring_up(ctx: Ctx, fleet: str | None, images: tuple[str, ...] = ()) -> None:
    layout, state = ctx.layout, ctx.state
    with _step("pki"):
        if state.real_node:
            pki = ensure_pki(
                layout.root / "pki",
                service_ip=REAL_FIRST_SERVICE_IP,
                extra_ips=(state.real_node["ip"],),
            )
        else:
            pki = ensure_pki(layout.root / "pki", service_ip=FIRST_SERVICE_IP)
    for user in ("controller-manager", "scheduler", "kwok"):
        write_kubeconfig(layout.component_kubeconfig(user), server=state.server, pki=pki, user=user)
    write_kubeconfig(layout.kubeconfig, server=state.server, pki=pki, user="admin")
    with _step(f"etcd on 127.0.0.1:{state.ports['etcd']} (data in {state.data_dir})"):
        start_etcd(ctx)
    with _step(f"kube-apiserver on {state.server}"):
        start_apiserver(ctx)
    with _step("kube-controller-manager, kube-scheduler, kwok"):
        start_controllers(ctx)
    write_env(layout, ctx.bindir)
    api = admin_api(layout, state)
    with _step("controller-manager creates service accounts"):
        wait_for(
            "the default service account (kube-controller-manager's serviceaccount controller)",
            lambda: _exists(api, "/api/v1/namespaces/default/serviceaccounts/default"),
            timeout=60,
        )
    install_crds(layout, state)
    # The real node before the fleet: _apply_fleet saves state.json from a fresh load.
    if state.real_node:
        with _step("real node (containerd, images, kubelet, kube-proxy, CoreDNS)"):
            real_node_mod.start(layout, state, ctx.bindir, images=list(images))
    if fleet:
        _apply_fleet(fleet, layout, replace=False, timeout=300)


def _exists(api: Api, path: str) -> bool:
    try:
        api.get(path)
    except ApiStatusError as err:
        if err.status == 404:
            return False
        raise
    return True


def install_crds(layout: ClusterDirs, state: State, crds_dir: Path = CRDS_DIR) -> list[str]:
    """Apply every YAML in crds/ and wait until each CRD is Established."""
    files = sorted(p for p in crds_dir.glob("*.yaml") if p.is_file()) if crds_dir.is_dir() else []
    if not files:
        say(f"no CRDs in {crds_dir}; skipping")
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
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
    return crd_established(api.get(path))


def apply_fleet(
    fleet_ref: str,
    *,
    layout: ClusterDirs | None = None,
    replace: bool = False,
    timeout: float = 300,
) -> Fleet:
    """Make the cluster's fake nodes match a fleet file and wait until they are all Ready."""
    layout = layout or default_layout()
    with _locked(layout):
        return _apply_fleet(fleet_ref, layout, replace=replace, timeout=timeout)


def _apply_fleet(fleet_ref: str, layout: ClusterDirs, *, replace: bool, timeout: float) -> Fleet:
    state = State.load(layout)
    if state is None or not is_up(layout):
        raise ClusterError("no cluster is running here; start one with `python -m e2e.cluster up`")
    fleet = load_fleet(resolve_fleet_path(fleet_ref, FLEETS_DIR))
    with _step(f"fleet {fleet.summary()}"):
        sync_fleet(
            admin_api(layout, state),
            fleet,
            kubelet_version=kube_version(Path(state.bindir)),
            replace=replace,
            timeout=timeout,
            kwok_log=layout.logs / "kwok.log",
        )
    state.fleet = fleet.name
    state.save(layout)
    return fleet


def down(layout: ClusterDirs | None = None, *, keep_logs: bool = True) -> list[str]:
    """Stop exactly the processes this cluster dir recorded; remove its state and data."""
    layout = layout or default_layout()
    if not layout.root.is_dir():
        say(f"no cluster folder {layout.root}; nothing to stop")
        return []
    with _locked(layout):
        return _down(layout, keep_logs=keep_logs)


def _down(layout: ClusterDirs, *, keep_logs: bool) -> list[str]:
    state = State.load(layout)
    stopped: list[str] = []
    if state is None:
        say(f"no cluster recorded in {layout.root}; nothing to stop")
        return stopped
    if state.real_node:
        # The node's pods go first (through its kubelet), then its daemons and network changes.
        stopped += real_node_mod.teardown(layout, state)
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
    say(f"stopped {', '.join(stopped) if stopped else 'nothing (all were already gone)'}")
    return stopped


@contextlib.contextmanager
def apiserver_frozen(layout: ClusterDirs) -> Iterator[None]:
    """The cluster's kube-apiserver frozen for the block (an outage; see ``procs.frozen``)."""
    state = State.load(layout)
    if state is None:
        raise ClusterError(f"no cluster in {layout.root}")
    (daemon,) = [d for d in state.daemons if d.name == "kube-apiserver"]
    with procs.frozen(daemon):
        yield


def status(layout: ClusterDirs | None = None) -> dict[str, Any]:
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
        nodes = list_nodes(admin_api(layout, state), "type=kwok")
        result["nodes"] = len(nodes)
        result["nodes_ready"] = sum(node_ready(n) for n in nodes)
    return result
