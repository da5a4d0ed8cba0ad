"""Karpenter, a real node autoscaler, on the local control plane (its kwok provider).

Why: GPU pools on managed clusters scale from zero, and Elastra must ask for nodes the way
autoscalers understand. Karpenter's kwok provider (``sigs.k8s.io/karpenter/kwok``, built by
e2e/toolchain/build.sh --karpenter) runs Karpenter's own provisioning and disruption
controllers and creates a Node object for each NodeClaim instead of a cloud instance; our kwok
(`--manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake`, an annotation the provider
puts on every node it makes) then makes those nodes Ready and runs their pods, as it does for
the fleets.

This module installs Karpenter's CRDs, a KWOKNodeClass and the GPU instance types below (shaped
as Karpenter's AWS provider labels EKS nodes), builds NodePool manifests, and starts and stops
the controller by PID, recorded in the cluster's state.json like the other daemons (so `down`
stops it too).

Instance types: the kwok provider reads them from a JSON file (``--instance-types-file-path``).
It labels a node with its instance type, architecture, OS, its own
``karpenter.kwok.sh/instance-{family,size,cpu,memory}`` and every single-valued requirement of
the offering it launched; the AWS labels (``karpenter.k8s.aws/instance-gpu-name`` and the rest)
therefore go into each offering's requirements, which also makes them keys a NodePool or a
pod's nodeSelector can select on.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import procs
from .api import WaitTimeoutError, probe_http_health, wait_for
from .components import (
    free_ports,
    has_condition,
    kubectl,
    tail,
    wait_crds_established,
    write_kubeconfig,
)
from .controlplane import BUILD_SCRIPT
from .controlplane import _locked as cluster_lock
from .pki import ensure_client_cert
from .state import ClusterDirs, ClusterError, State, say

DAEMON = "karpenter"
NODE_CLASS = "elastra"
NODE_CLASS_REF = {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": NODE_CLASS}
NODEPOOL_LABEL = "karpenter.sh/nodepool"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
AWS_LABELS = "karpenter.k8s.aws"
REGION = "us-east-1"
DEFAULT_ZONES = ("us-east-1a",)
DEFAULT_POOL = "gpu"
DEFAULT_POOL_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
CRDS = ("nodepools.karpenter.sh", "nodeclaims.karpenter.sh", "kwoknodeclasses.karpenter.kwok.sh")


# --- instance types --------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuInstanceType:
    """An EC2 GPU instance type as Karpenter's AWS provider describes it.

    Figures from the AWS provider's instance-types reference (``karpenter.k8s.aws/*`` label
    values, GPU memory per GPU in MiB, EKS's max pods) and its on-demand price list for
    us-east-1 (only the order of prices matters: Karpenter launches the cheapest type that
    fits).
    """

    name: str
    gpu_name: str
    gpus: int
    gpu_memory_mib: int
    cpus: int
    memory_mib: int
    max_pods: int
    cpu_manufacturer: str
    price: float

    @property
    def family(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def size(self) -> str:
        return self.name.split(".", 1)[1]

    def labels(self) -> dict[str, str]:
        """The ``karpenter.k8s.aws/*`` labels an EKS node of this type carries."""
        generation = re.search(r"\d+", self.family)
        return {
            f"{AWS_LABELS}/instance-category": self.family[0],
            f"{AWS_LABELS}/instance-family": self.family,
            f"{AWS_LABELS}/instance-generation": generation.group() if generation else "",
            f"{AWS_LABELS}/instance-size": self.size,
            f"{AWS_LABELS}/instance-cpu": str(self.cpus),
            f"{AWS_LABELS}/instance-cpu-manufacturer": self.cpu_manufacturer,
            f"{AWS_LABELS}/instance-memory": str(self.memory_mib),
            f"{AWS_LABELS}/instance-hypervisor": "nitro",
            f"{AWS_LABELS}/instance-gpu-name": self.gpu_name,
            f"{AWS_LABELS}/instance-gpu-count": str(self.gpus),
            f"{AWS_LABELS}/instance-gpu-manufacturer": "nvidia",
            f"{AWS_LABELS}/instance-gpu-memory": str(self.gpu_memory_mib),
        }

    def resources(self) -> dict[str, str]:
        return {
            "cpu": str(self.cpus),
            "memory": f"{self.memory_mib}Mi",
            "ephemeral-storage": "20Gi",
            "pods": str(self.max_pods),
            "nvidia.com/gpu": str(self.gpus),
        }


INSTANCE_TYPES: dict[str, GpuInstanceType] = {
    t.name: t
    for t in (
        GpuInstanceType("g6.xlarge", "l4", 1, 22888, 4, 16384, 58, "amd", 0.8048),
        GpuInstanceType("g5.xlarge", "a10g", 1, 22888, 4, 16384, 58, "amd", 1.006),
        GpuInstanceType("g6e.xlarge", "l40s", 1, 45776, 4, 32768, 58, "amd", 1.861),
        GpuInstanceType("g5.12xlarge", "a10g", 4, 22888, 48, 196608, 737, "amd", 5.672),
        GpuInstanceType("p4d.24xlarge", "a100", 8, 40960, 96, 1179648, 737, "intel", 21.957642),
        GpuInstanceType("p4de.24xlarge", "a100", 8, 81920, 96, 1179648, 737, "intel", 27.44705),
        GpuInstanceType("p5.48xlarge", "h100", 8, 81920, 192, 2097152, 100, "amd", 55.04),
    )
}


def _single(key: str, value: str) -> dict[str, Any]:
    return {"key": key, "operator": "In", "values": [value]}


def instance_types_document(
    types: Iterable[GpuInstanceType] = INSTANCE_TYPES.values(),
    *,
    zones: tuple[str, ...] = DEFAULT_ZONES,
) -> list[dict[str, Any]]:
    """The kwok provider's instance-types JSON: one on-demand offering per zone."""
    return [
        {
            "name": t.name,
            "architecture": "amd64",
            "operatingSystems": ["linux"],
            "resources": t.resources(),
            "offerings": [
                {
                    "Price": t.price,
                    "Available": True,
                    "Requirements": [
                        _single("karpenter.sh/capacity-type", "on-demand"),
                        _single("topology.kubernetes.io/zone", zone),
                        _single("topology.kubernetes.io/region", REGION),
                        *(_single(k, v) for k, v in t.labels().items()),
                    ],
                }
                for zone in zones
            ],
        }
        for t in types
    ]


# --- NodePools -------------------------------------------------------------------------------


def node_pool(
    name: str,
    *,
    instance_types: Iterable[str],
    taint: Mapping[str, str],
    labels: Mapping[str, str] | None = None,
    consolidate_after: str = "5s",
    gpu_limit: int | None = None,
) -> dict[str, Any]:
    """A NodePool of the given instance types, tainted, that removes empty nodes quickly.

    Only pods that tolerate ``taint`` make Karpenter launch nodes for this pool (so pending
    pods of other tests never do). ``consolidate_after``: how long a node stays empty before
    Karpenter removes it. ``gpu_limit``: at most this many GPUs in the pool (None: no limit).
    """
    names = list(instance_types)
    unknown = sorted(set(names) - set(INSTANCE_TYPES))
    if unknown or not names:
        wrong = (
            f"instance types {', '.join(unknown)} are unknown" if unknown else "no instance types"
        )
        raise ClusterError(f"NodePool {name}: {wrong}; choose from {', '.join(INSTANCE_TYPES)}")
    spec: dict[str, Any] = {
        "template": {
            "metadata": {"labels": dict(labels or {})},
            "spec": {
                "nodeClassRef": dict(NODE_CLASS_REF),
                "requirements": [
                    {"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": names},
                    {
                        "key": "karpenter.sh/capacity-type",
                        "operator": "In",
                        "values": ["on-demand"],
                    },
                ],
                "taints": [dict(taint)],
                "expireAfter": "Never",
            },
        },
        "disruption": {
            "consolidationPolicy": "WhenEmpty",
            "consolidateAfter": consolidate_after,
            "budgets": [{"nodes": "100%"}],
        },
    }
    if gpu_limit is not None:
        spec["limits"] = {"nvidia.com/gpu": str(gpu_limit)}
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": name},
        "spec": spec,
    }


def node_pool_ready(pool: Mapping[str, Any]) -> bool:
    """Whether Karpenter reports a NodePool Ready: it makes nodes for a pool only then, and a
    pool just applied has no conditions at all until Karpenter's first look at it."""
    return has_condition(pool, "Ready")


def node_class() -> dict[str, Any]:
    """The KWOKNodeClass every NodePool here refers to (nodes register at once)."""
    return {
        "apiVersion": "karpenter.kwok.sh/v1alpha1",
        "kind": "KWOKNodeClass",
        "metadata": {"name": NODE_CLASS},
        "spec": {},
    }


# --- build and install -----------------------------------------------------------------------


def karpenter_dir(*, build: bool = True) -> Path:
    """Karpenter's folder in the toolchain cache (bin/karpenter, crds/), built when cold."""
    args = [str(BUILD_SCRIPT), "--karpenter" if build else "--print-karpenter-dir"]
    out = subprocess.run(args, check=False, stdout=subprocess.PIPE, text=True)
    if out.returncode != 0:
        raise ClusterError(f"building Karpenter failed (exit {out.returncode}); see above")
    found = Path(out.stdout.strip().splitlines()[-1])
    if not (found / "bin" / "karpenter").is_file():
        raise ClusterError(f"Karpenter is not built in {found}: run {BUILD_SCRIPT} --karpenter")
    return found


@dataclass(frozen=True)
class Target:
    """The cluster Karpenter runs against: the toolchain (kubectl) and an admin kubeconfig."""

    bindir: Path
    kubeconfig: Path

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        return kubectl(self.bindir, self.kubeconfig, *args, stdin=stdin)

    def apply(self, manifest: Mapping[str, Any]) -> None:
        self.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=json.dumps(manifest)
        )


def install(target: Target, crds_dir: Path) -> None:
    """Karpenter's CRDs (Established) and the KWOKNodeClass, marked Ready.

    The kwok provider has no controller for its node class, and Karpenter uses a NodePool only
    once its NodeClass reports Ready (a cloud provider's NodeClass controller sets that after
    checking subnets and images); here there is nothing to check, so the harness sets it.
    """
    for path in sorted(crds_dir.glob("*.yaml")):
        target.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    wait_crds_established(target.kubectl, *(f"crd/{c}" for c in CRDS))
    target.apply(node_class())
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "Ready",
        "message": "",
        "lastTransitionTime": "2000-01-01T00:00:00Z",
        "observedGeneration": 1,
    }
    target.kubectl(
        "patch",
        "kwoknodeclass",
        NODE_CLASS,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"conditions": [ready]}}),
    )


# --- the controller process ------------------------------------------------------------------


def launch(
    target: Target,
    *,
    built: Path,
    workdir: Path,
    log: Path,
    zones: tuple[str, ...] = DEFAULT_ZONES,
) -> procs.Daemon:
    """Install what Karpenter needs, start it detached and wait until it is ready.

    Leader election is off (one replica); metrics and health listen on free ports (Karpenter
    binds them on every address, it has no flag for one); the instance types are written to
    ``workdir``. Raises ClusterError with the log's tail when it exits or never gets ready.
    """
    install(target, built / "crds")
    workdir.mkdir(parents=True, exist_ok=True)
    types_file = workdir / "karpenter-instance-types.json"
    types_file.write_text(json.dumps(instance_types_document(zones=zones), indent=1) + "\n")
    metrics, health = free_ports(2)
    argv = [
        str(built / "bin" / "karpenter"),
        f"--instance-types-file-path={types_file}",
        "--disable-leader-election",
        f"--metrics-port={metrics}",
        f"--health-probe-port={health}",
        "--log-level=info",
    ]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "KUBECONFIG": str(target.kubeconfig)}
    daemon = procs.start(DAEMON, argv, log=log, env=env)

    def ready() -> bool:
        if not procs.is_running(daemon):
            raise ClusterError(
                f"Karpenter exited during start-up; last lines of {log}:\n{tail(log)}"
            )
        return probe_http_health(f"http://127.0.0.1:{health}/readyz")

    try:
        wait_for("Karpenter to become ready", ready, timeout=90, interval=0.2)
    except (WaitTimeoutError, ClusterError):
        procs.stop(daemon)
        raise
    return daemon


def running(layout: ClusterDirs) -> procs.Daemon | None:
    """The Karpenter this cluster folder recorded, when it still runs."""
    state = State.load(layout)
    found = [d for d in state.daemons if d.name == DAEMON] if state else []
    return found[0] if found and procs.is_running(found[0]) else None


def start(layout: ClusterDirs, *, default_pool: bool = False) -> bool:
    """Start Karpenter on the running cluster in ``layout`` (True), or find it running (False).

    It runs as client ``karpenter`` (group system:masters) and is recorded in state.json, so
    ``stop`` and the cluster's ``down`` stop it by PID. ``default_pool`` also applies the
    NodePool ``gpu`` (every instance type, tainted nvidia.com/gpu=true:NoSchedule as EKS GPU
    pools often are) for `up --autoscaler karpenter`.
    """
    built = karpenter_dir(build=True)
    with cluster_lock(layout):
        state = State.load(layout)
        if state is None or not state.daemons:
            raise ClusterError(f"no cluster is running in {layout.root}; start one with `up`")
        started = _start_locked(layout, state, built)
    if default_pool:
        target = Target(Path(state.bindir), layout.kubeconfig)
        names = list(INSTANCE_TYPES)
        target.apply(node_pool(DEFAULT_POOL, instance_types=names, taint=DEFAULT_POOL_TAINT))
        say(f"NodePool {DEFAULT_POOL}: {', '.join(names)}, taint nvidia.com/gpu=true:NoSchedule")
    return started


def _start_locked(layout: ClusterDirs, state: State, built: Path) -> bool:
    recorded = [d for d in state.daemons if d.name == DAEMON]
    if recorded and procs.is_running(recorded[0]):
        say(f"Karpenter already runs (pid {recorded[0].pid})")
        return False
    state.daemons = [d for d in state.daemons if d.name != DAEMON]
    ensure_client_cert(layout.pki, DAEMON, DAEMON, "system:masters")
    kubeconfig = layout.component_kubeconfig(DAEMON)
    write_kubeconfig(kubeconfig, server=state.server, pki=layout.pki, user=DAEMON)
    say(f"Karpenter ({built.name}) ...")
    daemon = launch(
        Target(Path(state.bindir), kubeconfig),
        built=built,
        workdir=layout.etc,
        log=layout.logs / f"{DAEMON}.log",
    )
    state.daemons.append(daemon)
    state.save(layout)
    say(f"Karpenter: ok (pid {daemon.pid}, log {daemon.log})")
    return True


def stop(layout: ClusterDirs) -> bool:
    """Stop the Karpenter recorded in ``layout`` by PID and forget it; False if none ran."""
    with cluster_lock(layout):
        state = State.load(layout)
        if state is None:
            return False
        recorded = [d for d in state.daemons if d.name == DAEMON]
        stopped = [d.pid for d in recorded if procs.stop(d)]
        state.daemons = [d for d in state.daemons if d.name != DAEMON]
        state.save(layout)
    return bool(stopped)
