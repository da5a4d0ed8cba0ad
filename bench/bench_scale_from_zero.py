"""Scale from zero with Karpenter on kwok: from ``kubectl apply`` to a training-ready world.

Twenty jobs (2 workers of one L4 GPU each) are created at once, once the operator holds its
Lease, on a cluster whose only GPU pool is an empty Karpenter NodePool of g6.xlarge nodes.
Each job's time to a training-ready world (phase Running) splits into parts, from the
benchmark's own watches on pods, nodes and jobs (each moment is when the watch reported it,
the same way for every one):

- Elastra, asking: from the job's create to its first capacity-request pod;
- the autoscaler: from that pod to the last of the nodes the world runs on being Ready with
  its start-up taints gone (``karpenter.sh/unregistered``, ``node.kubernetes.io/not-ready``):
  Karpenter's batching, launch and registration, kwok making the node Ready;
- Elastra, placing: from those nodes schedulable to the world formed (recorded in the job's
  status with every member created): the scheduler binding the requests there, the pass that
  sees them bound, plans, deletes them and creates the workers;
- the pods starting: from the world formed to Running (kwok starts pods at once; a real node
  adds its image pull and the trainer's start here), then the status write that says so.

Target: Elastra's two parts together at most 5 s at p95 over the 20 jobs. The operator runs
as ``elastra run`` with its default settings; the control plane, kwok, Karpenter, the operator
and this benchmark share the machine's cores, whose load shows in every part.

Environment: ELASTRA_BENCH_JOBS (20), ELASTRA_BENCH_CLUSTER_DIR (a private cluster folder).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from e2e.cluster import karpenter as kp  # noqa: E402
from e2e.cluster.api import wait_for  # noqa: E402
from e2e.cluster.components import has_condition  # noqa: E402
from e2e.cluster.controlplane import down, up  # noqa: E402
from e2e.cluster.state import ClusterDirs, State  # noqa: E402

from elastra.controller.decide.placeholders import requester  # noqa: E402
from elastra.controller.engine.leader import LEASE_NAME  # noqa: E402
from elastra.kube import resources  # noqa: E402
from elastra.kube.client import JsonDict, Kube  # noqa: E402
from elastra.kube.config import load_connection  # noqa: E402
from elastra.kube.informer import Informer  # noqa: E402

JOBS = int(os.environ.get("ELASTRA_BENCH_JOBS", "20"))
WORKERS = 2
NAMESPACE = "from-zero"
POOL = "bench-l4"
POOL_TAINT = {"key": "elastra.dev/karpenter-pool", "value": POOL, "effect": "NoSchedule"}
TARGET_S = 5.0
STARTUP_TAINTS = frozenset({"karpenter.sh/unregistered", "node.kubernetes.io/not-ready"})
TIMEOUT_S = 600.0


def say(message: str) -> None:
    print(f"bench_scale_from_zero: {message}", flush=True)


@dataclass
class Moments:
    """When the watches saw each step of one job (monotonic seconds)."""

    applied: float = math.nan
    requested: float = math.nan
    world: float = math.nan
    """When its status first named a world."""
    members: tuple[str, ...] = ()
    running: float = math.nan
    nodes: tuple[str, ...] = ()


@dataclass
class Watch:
    """What the pod, node and job watches saw, as they saw it."""

    jobs: dict[str, Moments] = field(default_factory=dict)
    node_ready: dict[str, float] = field(default_factory=dict)
    pods: dict[str, float] = field(default_factory=dict)
    """When each pod of the namespace was first seen."""

    def formed(self, m: Moments) -> float:
        """When the job's world was formed: named in its status, every member created."""
        return max(m.world, *(self.pods[p] for p in m.members))

    def on_pod(self, kind: str, old: JsonDict | None, new: JsonDict | None) -> None:
        self.pods.setdefault(
            str(((new or old or {}).get("metadata") or {}).get("name")), time.monotonic()
        )
        job = requester(new or {})
        moments = self.jobs.get(job or "")
        if moments is not None and math.isnan(moments.requested):
            moments.requested = time.monotonic()

    def on_node(self, kind: str, old: JsonDict | None, new: JsonDict | None) -> None:
        name = ((new or {}).get("metadata") or {}).get("name")
        ready = has_condition(new or {}, "Ready")
        taints = {t.get("key") for t in ((new or {}).get("spec") or {}).get("taints") or []}
        if name and ready and not taints & STARTUP_TAINTS and name not in self.node_ready:
            self.node_ready[name] = time.monotonic()

    def on_job(self, kind: str, old: JsonDict | None, new: JsonDict | None) -> None:
        meta, status = (new or {}).get("metadata") or {}, (new or {}).get("status") or {}
        moments = self.jobs.get(meta.get("name", ""))
        if moments is None or not math.isnan(moments.running):
            return
        ranks = (status.get("world") or {}).get("ranks") or []
        if math.isnan(moments.world) and ranks:
            moments.world, moments.members = time.monotonic(), tuple(ranks)
        if status.get("phase") == "Running":
            moments.running = time.monotonic()
            moments.nodes = tuple(p["node"] for p in status.get("placement") or [])


async def operator_ready(kube: Kube) -> None:
    """Return once the operator holds its Lease: it has started and writes."""
    path = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{LEASE_NAME}"
    deadline = time.monotonic() + 120
    while not ((await kube.get(path)) or {}).get("spec", {}).get("holderIdentity"):
        if time.monotonic() > deadline:
            raise TimeoutError("the operator did not take its Lease in 120 s")
        await asyncio.sleep(0.2)


def job(name: str) -> dict[str, Any]:
    toleration = {"operator": "Equal", **POOL_TAINT}
    return {
        "apiVersion": "elastra.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": WORKERS,
            "minReplicas": WORKERS,
            "worker": {
                "gpus": 1,
                "gpuTypes": ["L4"],
                "image": "elastra-worker:dev",
                "template": {
                    "spec": {
                        "tolerations": [toleration],
                        "nodeSelector": {kp.NODEPOOL_LABEL: POOL},
                    }
                },
            },
            "training": {"globalBatchSize": 13440},
            "checkpoint": {"uri": f"s3://bench/{name}"},  # kwok pods never save
        },
    }


async def run(kubeconfig: Path) -> Watch:
    watch = Watch()
    async with Kube(load_connection(str(kubeconfig))) as kube:
        await kube.create(
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        )
        informers = [
            Informer(kube, f"/api/v1/namespaces/{NAMESPACE}/pods", listeners=[watch.on_pod]),
            Informer(kube, "/api/v1/nodes", listeners=[watch.on_node]),
            Informer(
                kube,
                f"{resources.JOBS}/namespaces/{NAMESPACE}/trainingjobs",
                listeners=[watch.on_job],
            ),
        ]
        tasks = [asyncio.create_task(i.run()) for i in informers]
        for informer in informers:
            await informer.wait_synced()
        await operator_ready(kube)
        names = [f"fz-{i:02d}" for i in range(JOBS)]
        for name in names:
            watch.jobs[name] = Moments()

        async def apply(name: str) -> None:
            watch.jobs[name].applied = time.monotonic()
            await kube.create(f"{resources.JOBS}/namespaces/{NAMESPACE}/trainingjobs", job(name))

        await asyncio.gather(*(apply(n) for n in names))
        deadline = time.monotonic() + TIMEOUT_S
        while any(math.isnan(m.running) for m in watch.jobs.values()):
            if time.monotonic() > deadline:
                late = [n for n, m in watch.jobs.items() if math.isnan(m.running)]
                raise TimeoutError(f"{len(late)} jobs not Running in {TIMEOUT_S:.0f}s: {late}")
            await asyncio.sleep(0.2)
        for task in tasks:
            task.cancel()
    return watch


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile (p95 of 20 values is the 19th)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def report(watch: Watch) -> dict[str, list[float]]:
    parts: dict[str, list[float]] = {
        "elastra_ask": [],
        "autoscaler": [],
        "elastra_place": [],
        "pods_start": [],
        "elastra": [],
        "total": [],
    }
    for name, m in sorted(watch.jobs.items()):
        ready = max(watch.node_ready[n] for n in m.nodes)
        formed = watch.formed(m)
        ask, place = m.requested - m.applied, formed - ready
        parts["elastra_ask"].append(ask)
        parts["autoscaler"].append(ready - m.requested)
        parts["elastra_place"].append(place)
        parts["pods_start"].append(m.running - formed)
        parts["elastra"].append(ask + place)
        parts["total"].append(m.running - m.applied)
        say(f"  {name}: ask {ask:.2f}s, autoscaler {ready - m.requested:.2f}s, place "
            f"{place:.2f}s, pods start {m.running - formed:.2f}s, total "
            f"{m.running - m.applied:.2f}s")  # fmt: skip
    say(f"{JOBS} jobs of {WORKERS} one-GPU workers, from an empty Karpenter NodePool:")
    for part, values in parts.items():
        say(
            f"  {part:<14} p50 {percentile(values, 50):6.2f}s  p95 {percentile(values, 95):6.2f}s"
            f"  max {max(values):6.2f}s"
        )
    p95 = percentile(parts["elastra"], 95)
    verdict = "within" if p95 <= TARGET_S else "OVER"
    say(f"Elastra's part at p95: {p95:.2f}s ({verdict} the {TARGET_S:.0f} s target)")
    return parts


def main() -> int:
    layout = ClusterDirs(Path(os.environ.get("ELASTRA_BENCH_CLUSTER_DIR", "/tmp/elastra-bench-fz")))
    started = up(layout, fleet=None)
    kp.start(layout)
    state = State.load(layout)
    assert state is not None
    target = kp.Target(Path(state.bindir), layout.kubeconfig)
    target.apply(
        kp.node_pool(
            POOL,
            instance_types=["g6.xlarge"],
            taint=POOL_TAINT,
            labels={"type": "kwok"},  # the operator reads no metrics from kwok's pods
            consolidate_after="60s",
        )
    )
    wait_for(
        f"NodePool {POOL} to be Ready",
        lambda: kp.node_pool_ready(json.loads(target.kubectl("get", "nodepool", POOL, "-ojson"))),
        timeout=60,
        interval=0.5,
    )
    log = (layout.root / "operator.log").open("w")
    operator = subprocess.Popen(
        [sys.executable, "-m", "elastra.cli", "run", f"--kubeconfig={layout.kubeconfig}",
         f"--namespace={NAMESPACE}", f"--lease-namespace={NAMESPACE}", "--metrics-port=0",
         "--health-port=0", "--verbose"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        watch = asyncio.run(run(layout.kubeconfig))
    finally:
        operator.terminate()
        operator.wait(timeout=30)
        log.close()
        say(f"operator log: {log.name}")
        if started:
            down(layout)
    parts = report(watch)
    print(json.dumps({k: [round(v, 3) for v in vs] for k, vs in parts.items()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
