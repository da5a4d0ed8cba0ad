"""Resize latency on the local control plane: from a trigger to the new assignments written.

For each trigger (``kubectl scale``-style replicas change, a worker failing, a node lost) the
benchmark records when the event reached the API server and when every pod of the new world
carried an assignment of the new world version, repeated several times, and prints the
distribution. Target: under 2 s on the kwok cluster. The failure and node-loss figures
include the policy's settle window (the time it waits to fold a burst into one resize), set
here to 0.5 s and printed with the results.

Environment: ELASTRA_BENCH_REPEATS (5), ELASTRA_BENCH_CLUSTER_DIR (a private cluster folder).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from e2e.cluster.controlplane import ClusterDirs, down, up  # noqa: E402
from e2e.cluster.fleet import parse_fleet  # noqa: E402

from elastra.kube import resources  # noqa: E402
from elastra.kube.client import Kube  # noqa: E402
from elastra.kube.config import load_connection  # noqa: E402

REPEATS = int(os.environ.get("ELASTRA_BENCH_REPEATS", "5"))
NAMESPACE = "latency"
JOB = "lat"
SETTLE_S = 0.5


def say(message: str) -> None:
    print(f"bench_resize_latency: {message}", flush=True)


def nodes(prefix: str, count: int) -> list[dict[str, Any]]:
    fleet = parse_fleet(
        {
            "kind": "Fleet",
            "name": "latency",
            "groups": [
                {
                    "prefix": prefix,
                    "count": count,
                    "gpu": {"product": "NVIDIA-H200", "count": 8},
                    "cpu": "96",
                    "memory": "1Ti",
                }
            ],
        }
    )
    return fleet.node_manifests()


async def job_state(kube: Kube) -> tuple[int, list[str], dict[str, int]]:
    job = await resources.get_job(kube, NAMESPACE, JOB) or {}
    world = (job.get("status") or {}).get("world") or {}
    pods = await resources.list_pods(kube, NAMESPACE, selector=f"elastra.dev/job={JOB}")
    versions = {}
    for pod in pods:
        text = ((pod.get("metadata") or {}).get("annotations") or {}).get(
            "elastra.dev/assignment", "{}"
        )
        versions[pod["metadata"]["name"]] = int(json.loads(text).get("worldVersion", 0))
    return int(world.get("version", 0)), list(world.get("ranks") or []), versions


async def wait_new_world(kube: Kube, after: int, *, timeout: float = 120) -> float:
    """Poll until a world newer than ``after`` exists and all its pods carry it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        version, ranks, versions = await job_state(kube)
        if version > after and ranks and all(versions.get(p) == version for p in ranks):
            return time.monotonic()
        await asyncio.sleep(0.05)
    raise TimeoutError(f"no world newer than v{after} within {timeout}s")


async def wait_steady(kube: Kube, replicas: int, *, timeout: float = 180) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = await resources.get_job(kube, NAMESPACE, JOB) or {}
        status = job.get("status") or {}
        if status.get("phase") == "Running" and status.get("world", {}).get("replicas") == replicas:
            return int(status["world"]["version"])
        await asyncio.sleep(0.2)
    raise TimeoutError(f"job not Running at {replicas} within {timeout}s")


async def scale(kube: Kube, replicas: int) -> None:
    await kube.patch(resources.job_path(NAMESPACE, JOB), {"spec": {"replicas": replicas}})


async def fail_one(kube: Kube) -> float:
    """Make kwok fail one world member; returns when the API server shows it Failed."""
    _, ranks, _ = await job_state(kube)
    victim = ranks[-1]
    await resources.patch_pod(
        kube,
        NAMESPACE,
        victim,
        {
            "metadata": {
                "labels": {"sim.elastra.dev/fail": "true"},
                "annotations": {"sim.elastra.dev/exit-code": "75"},
            }
        },
    )
    while True:
        pod = await kube.get(f"{resources.pods_path(NAMESPACE)}/{victim}")
        if pod is None or (pod.get("status") or {}).get("phase") == "Failed":
            return time.monotonic()
        await asyncio.sleep(0.02)


async def lose_node(kube: Kube) -> float:
    job = await resources.get_job(kube, NAMESPACE, JOB) or {}
    node = ((job.get("status") or {}).get("placement") or [])[-1]["node"]
    await kube.delete(f"/api/v1/nodes/{node}", grace_seconds=0)
    return time.monotonic()


async def measure(
    kube: Kube, trigger: Callable[[], Awaitable[float | None]], restore: int
) -> float:
    version = await wait_steady(kube, restore)
    started = time.monotonic()
    reached = await trigger()
    done = await wait_new_world(kube, version)
    return done - (reached if reached is not None else started)


async def run(kubeconfig: Path) -> dict[str, list[float]]:
    async with Kube(load_connection(str(kubeconfig))) as kube:
        await kube.create(
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        )
        for node in nodes("lat", 6 + REPEATS):
            await kube.create("/api/v1/nodes", node)
        job = {
            "apiVersion": "elastra.dev/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": JOB, "namespace": NAMESPACE},
            "spec": {
                "replicas": 4,
                "minReplicas": 1,
                "worker": {"gpus": 8, "gpuTypes": ["H200"], "image": "elastra-worker:dev"},
                "training": {"globalBatchSize": 13440},
                "checkpoint": {"uri": f"s3://bench/{JOB}"},  # kwok pods never save
                "failurePolicy": {"maxRestarts": 1000, "backoffSeconds": 0},
            },
        }
        await kube.create(f"{resources.JOBS}/namespaces/{NAMESPACE}/trainingjobs", job)
        results: dict[str, list[float]] = {"scale": [], "failure": [], "node-lost": []}
        for i in range(REPEATS):
            say(f"round {i + 1}/{REPEATS}")

            async def shrink() -> None:
                await scale(kube, 3)

            results["scale"].append(await measure(kube, shrink, 4))
            await scale(kube, 4)
            results["failure"].append(await measure(kube, lambda: fail_one(kube), 4))
            results["node-lost"].append(await measure(kube, lambda: lose_node(kube), 4))
        return results


def main() -> int:
    layout = ClusterDirs(
        Path(os.environ.get("ELASTRA_BENCH_CLUSTER_DIR", "/tmp/elastra-bench-lat"))
    )
    started = up(layout, fleet="hetero-small")
    operator = subprocess.Popen(
        [sys.executable, "-m", "elastra.cli", "run", f"--kubeconfig={layout.kubeconfig}",
         f"--namespace={NAMESPACE}", f"--lease-namespace={NAMESPACE}",
         "--toleration=kwok.x-k8s.io/node=fake:NoSchedule", "--metrics-port=0",
         "--health-port=0", f"--settle-seconds={SETTLE_S}", "--cooldown-seconds=0",
         "--grace-seconds=1", "--log-format=plain"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        results = asyncio.run(run(layout.kubeconfig))
    finally:
        operator.terminate()
        operator.wait(timeout=30)
        if started:
            down(layout)
    say(f"event on the API server -> new assignments written (settle window {SETTLE_S} s):")
    for trigger, values in results.items():
        ordered = sorted(values)
        say(
            f"  {trigger:<10} n={len(values)} median {statistics.median(values):.2f}s "
            f"min {ordered[0]:.2f}s max {ordered[-1]:.2f}s "
            f"({sum(v < 2.0 for v in values)}/{len(values)} under the 2 s target)"
        )
    print(json.dumps({k: [round(v, 3) for v in vs] for k, vs in results.items()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
