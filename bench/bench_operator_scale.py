"""The operator at cluster scale: 300 TrainingJobs of 8 workers on the 1,000-node fleet.

Prints, measured in one run on the same local control plane:
- the time until every worker pod of every job is Running, as a ratio to the time a plain
  client needs to create the same pods directly (same API server, scheduler and kwok);
- API requests per job, the operator's (its own Prometheus counter; Kopf's few watch streams
  are not counted) against the plain client's (creates and its polling);
- CPU seconds, the operator process's against the plain client's (this process during the
  baseline), and the operator's resident memory.

Absolute seconds are printed for context only: these machines are shared and noisy.
Environment: ELASTRA_BENCH_JOBS (300), ELASTRA_BENCH_WORKERS (8), ELASTRA_BENCH_FLEET
(hetero-large), ELASTRA_BENCH_CLUSTER_DIR (a private cluster folder, created and removed).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from e2e.cluster.controlplane import Layout, apply_fleet, down, up  # noqa: E402

from elastra.kube import resources  # noqa: E402
from elastra.kube.client import API_REQUESTS, Kube, gather_limited  # noqa: E402
from elastra.kube.config import load_connection  # noqa: E402

JOBS = int(os.environ.get("ELASTRA_BENCH_JOBS", "300"))
WORKERS = int(os.environ.get("ELASTRA_BENCH_WORKERS", "8"))
FLEET = os.environ.get("ELASTRA_BENCH_FLEET", "hetero-large")
TYPES = ("H100", "A100", "V100", "T4")
GPUS_PER_WORKER = 1
NAMESPACE = "bench"
TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}


def say(message: str) -> None:
    print(f"bench_operator_scale: {message}", flush=True)


def job_manifest(index: int) -> dict[str, Any]:
    return {
        "apiVersion": "elastra.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": f"job-{index:04d}", "namespace": NAMESPACE},
        "spec": {
            "replicas": WORKERS,
            "minReplicas": 1,
            "worker": {
                "gpus": GPUS_PER_WORKER,
                "gpuTypes": [TYPES[index % len(TYPES)]],
                "image": "elastra-worker:dev",
            },
            "training": {"globalBatchSize": 13440, "precision": "fp16"},
        },
    }


def plain_pod(index: int, worker: int) -> dict[str, Any]:
    gpus = str(GPUS_PER_WORKER)
    product = {
        "H100": "NVIDIA-H100-80GB-HBM3",
        "A100": "NVIDIA-A100-SXM4-80GB",
        "V100": "Tesla-V100-SXM2-16GB",
        "T4": "Tesla-T4",
    }[TYPES[index % len(TYPES)]]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"plain-{index:04d}-{worker}", "labels": {"bench": "plain"}},
        "spec": {
            "restartPolicy": "Never",
            "tolerations": [TOLERATION],
            "nodeSelector": {"nvidia.com/gpu.product": product},
            "containers": [
                {
                    "name": "worker",
                    "image": "elastra-worker:dev",
                    "resources": {"limits": {"nvidia.com/gpu": gpus}},
                }
            ],
        },
    }


async def running_pods(kube: Kube, selector: str) -> int:
    pods = await resources.list_pods(kube, NAMESPACE, selector=selector)
    return sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Running")


async def wait_running(kube: Kube, selector: str, want: int, *, timeout: float) -> float:
    started = time.monotonic()
    said = started
    while time.monotonic() - started < timeout:
        running = await running_pods(kube, selector)
        if running >= want:
            return time.monotonic()
        if time.monotonic() - said >= 30:
            said = time.monotonic()
            say(f"  {running} of {want} pods Running after {said - started:.0f}s")
        await asyncio.sleep(1.0)
    raise TimeoutError(f"{selector}: fewer than {want} pods Running after {timeout:.0f}s")


@dataclass(frozen=True)
class Baseline:
    """What the plain client spent to get every pod Running."""

    seconds: float
    requests: float
    cpu_seconds: float


async def baseline(kube: Kube) -> Baseline:
    """A plain client creates the same number of pods directly; seconds to all Running."""
    start = time.monotonic()
    cpu = time.process_time()
    requests = client_requests()
    pods = [plain_pod(i, w) for i in range(JOBS) for w in range(WORKERS)]
    await gather_limited(16, *(resources.create_pod(kube, NAMESPACE, p) for p in pods))
    end = await wait_running(kube, "bench=plain", len(pods), timeout=1800)
    spent = Baseline(
        seconds=end - start,
        requests=client_requests() - requests,
        cpu_seconds=time.process_time() - cpu,
    )
    await gather_limited(
        16,
        *(
            resources.delete_pod(kube, NAMESPACE, p["metadata"]["name"], grace_seconds=0)
            for p in pods
        ),
    )
    while await resources.list_pods(kube, NAMESPACE, selector="bench=plain"):
        await asyncio.sleep(1.0)
    return spent


def client_requests() -> float:
    """Requests this process's Kube clients made so far (the plain client's own counter)."""
    return sum(
        sample.value
        for metric in API_REQUESTS.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    )


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def with_operator(kube: Kube) -> float:
    start = time.monotonic()
    await gather_limited(
        16,
        *(
            kube.create(f"{resources.JOBS}/namespaces/{NAMESPACE}/trainingjobs", job_manifest(i))
            for i in range(JOBS)
        ),
    )
    end = await wait_running(kube, "elastra.dev/job", JOBS * WORKERS, timeout=3600)
    return end - start


def metric_sum(text: str, name: str) -> float:
    return sum(
        float(m.group(1))
        for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, flags=re.M)
    )


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def run(kubeconfig: Path) -> None:
    connection = load_connection(str(kubeconfig))
    async with Kube(connection) as kube:
        await kube.create(
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        )
        say(f"baseline: a plain client creates {JOBS * WORKERS} pods ...")
        plain = await baseline(kube)
        say(f"baseline: {plain.seconds:.1f}s, {plain.requests:.0f} requests")
        metrics_port = 18480
        operator = subprocess.Popen(
            [sys.executable, "-m", "elastra.cli", "run", f"--kubeconfig={kubeconfig}",
             f"--namespace={NAMESPACE}", f"--lease-namespace={NAMESPACE}",
             "--toleration=kwok.x-k8s.io/node=fake:NoSchedule",
             f"--metrics-port={metrics_port}", "--health-port=0", "--log-format=plain"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            say(f"operator: {JOBS} TrainingJobs of {WORKERS} workers ...")
            elastra_s = await with_operator(kube)
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as reply:
                text = reply.read().decode()
            requests = metric_sum(text, "elastra_api_requests_total")
            memory = rss_mib(operator.pid)
            cpu = cpu_seconds(operator.pid)
        finally:
            operator.terminate()
            operator.wait(timeout=30)
    result = {
        "jobs": JOBS,
        "workersPerJob": WORKERS,
        "plainClientSeconds": round(plain.seconds, 1),
        "operatorSeconds": round(elastra_s, 1),
        "ratioOperatorToPlain": round(elastra_s / plain.seconds, 2),
        "apiRequestsPerJob": round(requests / JOBS, 1),
        "plainRequestsPerJob": round(plain.requests / JOBS, 1),
        "requestRatio": round(requests / max(plain.requests, 1), 2),
        "operatorCpuSeconds": round(cpu, 1),
        "plainClientCpuSeconds": round(plain.cpu_seconds, 1),
        "cpuRatio": round(cpu / max(plain.cpu_seconds, 1e-3), 2),
        "operatorRssMiB": round(memory, 1),
    }
    say(
        f"time to place every pod: operator / plain client = {result['ratioOperatorToPlain']}x "
        f"(target < 2x); API requests per job {result['apiRequestsPerJob']} vs "
        f"{result['plainRequestsPerJob']} ({result['requestRatio']}x); CPU "
        f"{result['operatorCpuSeconds']} s vs {result['plainClientCpuSeconds']} s "
        f"({result['cpuRatio']}x); operator RSS {result['operatorRssMiB']} MiB (target < 300)"
    )
    print(json.dumps(result), flush=True)


def main() -> int:
    layout = Layout(Path(os.environ.get("ELASTRA_BENCH_CLUSTER_DIR", "/tmp/elastra-bench-scale")))
    say(f"local control plane in {layout.root} with fleet {FLEET} ...")
    started = up(layout, fleet="hetero-small")
    try:
        apply_fleet(FLEET, layout=layout, replace=True, timeout=900)
        asyncio.run(run(layout.kubeconfig))
    finally:
        if started:
            down(layout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
