"""The operator at cluster scale: 300 TrainingJobs of 8 workers on the 1,000-node fleet.

Prints, measured in one run on the same local control plane:
- the time until every worker pod of every job is Running, as a ratio to the time a plain
  client needs to create the same pods directly (same API server, scheduler and kwok);
- API requests per job, the operator's (its own Prometheus counter; Kopf's few watch streams
  are not counted) against the plain client's (its creates: both phases learn which pods run
  from one watch the run opens first), and the operator's by verb and resource;
- CPU seconds, the operator process's against the plain client's (this process during the
  baseline), and the operator's resident memory (at the end and its peak);
- the operator's passes: how many, and their mean duration (API waits included);
- the CPU seconds of each control-plane process (API server, etcd, scheduler, controller-
  manager, kwok) in each phase, until every pod runs: on this 2-core machine they share the
  cores with the operator;
- the API server's own count of writes per job in each phase, by resource, from every client
  (scheduler binds, kwok's status updates, the controller-manager's EndpointSlices): what a
  phase costs the server beyond the requests its client makes;
- per job, the seconds from its create call returning to its first world in status
  (p50, p99): what a user waits before the first assignment (the run waits for the worlds
  of every job whose pods fit, after the pods run); beside it the plain client's counterpart,
  from the start of its burst to a job's last pod created (its pods carry no gate and no
  assignment: created is all it does).

The jobs are created once the operator is up (it holds its Lease and its caches have their
first list, from its own metrics), as on a cluster where it already runs: the plain client
starts no process either. How long the start took is printed apart (``operatorStartSeconds``).

When the jobs ask for more GPUs than the fleet has (ELASTRA_BENCH_JOBS=3000: 24,000 workers
for 6,656 GPUs), both sides stop at what fits: the plain client creates only the pods the fleet
can run, and the operator's run ends when as many pods run or the count stops growing for
STALL_S; the rest of the jobs wait for capacity, as on a full cluster.

The cluster's controller-manager runs without its endpoint controllers unless
ELASTRA_BENCH_ENDPOINT_CONTROLLERS=on. kwok's pods have loopback addresses (this machine's rule
for fake pods), which Endpoints and EndpointSlices may not hold, so here those controllers can
only retry refused writes for every job's headless Service, with backoff, all run long: with
them on, the operator's phase also paid about 6 refused writes per job and 17 s more API-server
CPU (and 9 s of the controller-manager's), which a cluster with routable pod addresses does not
pay; it pays about four accepted writes per job (the Service's Endpoints and EndpointSlice,
created and given rank 0's address), which the default run leaves out.

Absolute seconds are printed for context only: these machines are shared and noisy.
Environment: ELASTRA_BENCH_JOBS (300), ELASTRA_BENCH_WORKERS (8), ELASTRA_BENCH_FLEET
(hetero-large), ELASTRA_BENCH_CLUSTER_DIR (a private cluster folder, created and removed),
ELASTRA_BENCH_WORLDS_WAIT_S (600: longest wait for worlds once the pods run),
ELASTRA_BENCH_OPERATOR_ARGS (more options for the operator, as a shell would split them),
ELASTRA_BENCH_OPERATOR_LOG (a file for the operator's output, discarded when unset; with
ELASTRA_BENCH_OPERATOR_ARGS=--verbose it names the fields each status write changed),
ELASTRA_BENCH_ENDPOINT_CONTROLLERS (off), ELASTRA_BENCH_SAME_PODS (off).

With ELASTRA_BENCH_SAME_PODS=on a third phase runs between the two: a plain client creates the
operator's own worker pods (built by ``elastra.controller.decide.manifests``, ungated, each
pinned to a node with a free GPU, carrying rank r's assignment, without the owner reference: no
TrainingJob exists then and the garbage collector would delete them). The plain client's pods
are minimal; the worker pods carry what a worker needs (security contexts, volumes,
environment, the assignment), which every write, watch event and status update of a pod pays
for. The JSON line then adds ``samePodsSeconds`` and ``ratioOperatorToSamePods``: what the
operator's protocol costs over creating its pods directly, apart from what the pods' content
costs."""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from e2e.cluster.components import ENDPOINT_CONTROLLERS  # noqa: E402
from e2e.cluster.controlplane import ClusterDirs, apply_fleet, down, up  # noqa: E402
from e2e.cluster.state import State  # noqa: E402

from elastra.api import parse_trainingjob  # noqa: E402
from elastra.api.resource import PLURAL  # noqa: E402
from elastra.commands.run import parse_toleration  # noqa: E402
from elastra.controller.decide.manifests import (  # noqa: E402
    RankSpec,
    assignment_json,
    pod_name,
    worker_pod,
)
from elastra.controller.settings import OperatorSettings  # noqa: E402
from elastra.kube import resources  # noqa: E402
from elastra.kube.client import API_REQUESTS, Kube, RetryPolicy, gather_limited  # noqa: E402
from elastra.kube.config import load_connection  # noqa: E402
from elastra.kube.informer import Informer  # noqa: E402
from elastra_worker.assignment import ParallelPlan  # noqa: E402

JOBS = int(os.environ.get("ELASTRA_BENCH_JOBS", "300"))
WORKERS = int(os.environ.get("ELASTRA_BENCH_WORKERS", "8"))
FLEET = os.environ.get("ELASTRA_BENCH_FLEET", "hetero-large")
TYPES = ("H100", "A100", "V100", "T4")
GPUS_PER_WORKER = 1
PRODUCTS = {
    "H100": "NVIDIA-H100-80GB-HBM3",
    "A100": "NVIDIA-A100-SXM4-80GB",
    "V100": "Tesla-V100-SXM2-16GB",
    "T4": "Tesla-T4",
}
STALL_S = 120.0
WORLDS_WAIT_S = float(os.environ.get("ELASTRA_BENCH_WORLDS_WAIT_S", "600"))
"""A capacity-bound run ends when the number of Running pods has not grown for this long."""
ENDPOINTS = os.environ.get("ELASTRA_BENCH_ENDPOINT_CONTROLLERS", "off")
"""``on``: run the controller-manager's endpoint controllers too (see the module docstring)."""
SAME_PODS = os.environ.get("ELASTRA_BENCH_SAME_PODS", "off")
"""``on``: also time a plain client creating the operator's own worker pods (module docstring)."""
OPERATOR_ARGS = shlex.split(os.environ.get("ELASTRA_BENCH_OPERATOR_ARGS", ""))
"""More ``elastra run`` options, to compare settings (``--passes-at-once 16``)."""
OPERATOR_LOG = os.environ.get("ELASTRA_BENCH_OPERATOR_LOG", "")
"""A file the operator's output is appended to (``""``: discarded)."""
NAMESPACE = "bench"
TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}
OPERATOR_TOLERATION = "kwok.x-k8s.io/node=fake:NoSchedule"
"""The operator's ``--toleration`` for the kwok fleet (the same-pods phase builds with it too)."""
SAME_POD_SETTINGS = OperatorSettings(tolerations=(parse_toleration(OPERATOR_TOLERATION),))
"""The settings the operator runs with here, as far as its worker pods show them."""
PATIENT = RetryPolicy(attempts=10, max_delay_s=30.0, budget_s=300.0)
"""The benchmark's own client waits out an API server busy with 2,400 pods (429, 503, 504 such as
"Too large resource version" while listing) instead of dying; retries count as requests."""


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
            "checkpoint": {"uri": f"s3://bench/job-{index:04d}"},  # kwok pods never save
        },
    }


def plain_pod(index: int, worker: int) -> dict[str, Any]:
    gpus = str(GPUS_PER_WORKER)
    product = PRODUCTS[TYPES[index % len(TYPES)]]
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


def same_pod(index: int, worker: int, node: str) -> dict[str, Any]:
    """Rank ``worker`` of job ``index``'s first world as the operator builds it, created
    directly: ungated, pinned to ``node``, no owner reference (see the module docstring)."""
    body = job_manifest(index)
    body["metadata"]["uid"] = f"bench-{index}"
    job = parse_trainingjob(body)
    settings = SAME_POD_SETTINGS
    leader = f"{pod_name(job.metadata.name, 0)}.{job.metadata.name}.{NAMESPACE}.svc"
    rank = RankSpec(
        rank=worker, world_size=WORKERS, master_addr=leader, plan=ParallelPlan(dp=WORKERS)
    )
    assignment = assignment_json(job, version=1, rank=rank, stop=False, settings=settings)
    pod = worker_pod(
        job, slot=worker, node=node, gpu_type=TYPES[index % len(TYPES)], assignment=assignment,
        version=1, settings=settings, gated=False, leader=worker == 0,
    )  # fmt: skip
    name = f"same-{index:04d}-{worker}"
    pod["metadata"].pop("ownerReferences")
    pod["metadata"]["name"] = pod["spec"]["hostname"] = name
    pod["metadata"]["labels"]["bench"] = SAME
    return pod


async def gpu_slots(kube: Kube) -> dict[str, list[str]]:
    """The fleet's allocatable GPUs by product label: a node's name once per GPU."""
    found: dict[str, list[str]] = {}
    for node in await resources.list_nodes(kube):
        product = ((node.get("metadata") or {}).get("labels") or {}).get("nvidia.com/gpu.product")
        gpus = ((node.get("status") or {}).get("allocatable") or {}).get("nvidia.com/gpu", "0")
        if product:
            found.setdefault(product, []).extend([node["metadata"]["name"]] * int(gpus))
    return found


def placeable(capacity: dict[str, int]) -> list[tuple[int, int]]:
    """The (job, worker) pairs the fleet can run: per GPU type, as many as its GPUs hold."""
    room = {t: capacity.get(PRODUCTS[t], 0) // GPUS_PER_WORKER for t in TYPES}
    pairs: list[tuple[int, int]] = []
    for index in range(JOBS):
        for worker in range(WORKERS):
            kind = TYPES[index % len(TYPES)]
            if room[kind] > 0:
                room[kind] -= 1
                pairs.append((index, worker))
    return pairs


PLAIN, SAME, OPERATED = "plain", "same", "operated"
"""The groups of pods the run counts: the plain client's, its copies of the operator's worker
pods (ELASTRA_BENCH_SAME_PODS) and the operator's workers."""


def slim_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """What the count needs of a pod: its name, labels and phase (not 3 KB of spec)."""
    meta = pod.get("metadata") or {}
    kept = {k: meta[k] for k in ("name", "namespace", "labels", "resourceVersion") if k in meta}
    return {"metadata": kept, "status": {"phase": (pod.get("status") or {}).get("phase")}}


def pod_group(pod: dict[str, Any]) -> str | None:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if labels.get("bench") in (PLAIN, SAME):
        return str(labels["bench"])
    return OPERATED if "elastra.dev/job" in labels else None


def pods_watched(kube: Kube) -> Informer:
    """The namespace's pods, followed by a watch. Polling a list every second (2,400 pods,
    megabytes of JSON each time) loaded the API server the run measures, and the operator's
    phase, longer and with larger pods, paid more of it than the plain client's."""
    return Informer(kube, resources.pods_path(NAMESPACE), transform=slim_pod, index=pod_group)


def running_pods(pods: Informer, group: str) -> int:
    return sum(1 for p in pods.indexed(group) if p["status"]["phase"] == "Running")


@dataclass(frozen=True)
class Placed:
    """When the pods stopped coming (monotonic) and how many ran then."""

    at: float
    running: int


async def wait_running(
    pods: Informer, group: str, want: int, *, timeout: float, stall_s: float | None = None
) -> Placed:
    """Until ``want`` pods run; with ``stall_s``, also once the count stops growing that long."""
    started = time.monotonic()
    said = started
    best, grew = -1, started
    while time.monotonic() - started < timeout:
        running = running_pods(pods, group)
        if running > best:
            best, grew = running, time.monotonic()
        if running >= want:
            return Placed(time.monotonic(), running)
        if stall_s is not None and time.monotonic() - grew >= stall_s:
            say(f"  {running} of {want} pods Running; none more for {stall_s:.0f}s")
            return Placed(grew, best)
        if time.monotonic() - said >= 30:
            said = time.monotonic()
            say(f"  {running} of {want} pods Running after {said - started:.0f}s")
        await asyncio.sleep(1.0)
    raise TimeoutError(f"{group}: fewer than {want} pods Running after {timeout:.0f}s")


@dataclass(frozen=True)
class Baseline:
    """What the plain client spent to get every pod Running."""

    seconds: float
    requests: float
    cpu_seconds: float
    job_pods_created: list[float]
    """Per job, seconds from the burst's start to its last pod's create returning (sorted):
    the plain client's counterpart of the operator's creation to first world."""
    control_plane_cpu: dict[str, float]
    """CPU seconds each control-plane process spent in the phase (see ``daemons_cpu``)."""


async def baseline(
    kube: Kube,
    pods_seen: Informer,
    pods: list[tuple[int, dict[str, Any]]],
    daemons: dict[str, int],
    group: str,
) -> Baseline:
    """A plain client creates ``pods`` (job index, pod) directly; seconds to all Running."""
    start = time.monotonic()
    cpu, daemons_before = time.process_time(), daemons_cpu(daemons)
    requests = client_requests()
    created: dict[int, float] = {}

    async def create(index: int, pod: dict[str, Any]) -> None:
        await resources.create_pod(kube, NAMESPACE, pod)
        created[index] = max(created.get(index, start), time.monotonic())

    await gather_limited(16, *(create(i, p) for i, p in pods))
    end = (await wait_running(pods_seen, group, len(pods), timeout=3600)).at
    spent = Baseline(
        seconds=end - start,
        requests=client_requests() - requests,
        cpu_seconds=time.process_time() - cpu,
        job_pods_created=sorted(t - start for t in created.values()),
        control_plane_cpu=cpu_spent(daemons_before, daemons_cpu(daemons)),
    )
    await gather_limited(
        16,
        *(
            resources.delete_pod(kube, NAMESPACE, p["metadata"]["name"], grace_seconds=0)
            for _, p in pods
        ),
    )
    deadline = time.monotonic() + 600
    while pods_seen.indexed(group):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the {group} pods were not gone 600 s after deletion")
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


def daemons_cpu(daemons: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far of each control-plane process (name -> pid): where the machine's
    two cores went in a phase, the API server's against kwok's and the operator's."""
    return {name: cpu_seconds(pid) for name, pid in daemons.items()}


def cpu_spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: round(after[name] - before[name], 1) for name in after}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class OperatorRun:
    """What the operator's side of the run measured."""

    seconds: float = 0.0
    running: int = 0
    created: dict[str, float] = field(default_factory=dict)
    """Job name -> when its create call returned (monotonic)."""
    first_world: dict[str, float] = field(default_factory=dict)
    """Job name -> when this client first saw a world in its status (monotonic)."""
    control_plane_cpu: dict[str, float] = field(default_factory=dict)
    """CPU seconds each control-plane process spent until every pod ran."""

    def first_world_seconds(self) -> list[float]:
        return sorted(self.first_world[n] - self.created[n] for n in self.first_world)


async def watch_worlds(kube: Kube, run: OperatorRun) -> None:
    """Note when each job's status first shows a world, from a watch on the jobs (a list every
    second would load the API server the operator is measured on)."""
    path = f"{resources.JOBS}/namespaces/{NAMESPACE}/{PLURAL}"

    def note(job: dict[str, Any]) -> None:
        name = job["metadata"]["name"]
        world = (job.get("status") or {}).get("world") or {}
        if name in run.created and name not in run.first_world and world.get("replicas"):
            run.first_world[name] = time.monotonic()

    jobs, version = await kube.list_versioned(path)
    for job in jobs:
        note(job)
    while True:
        params = {"watch": "1", "resourceVersion": version, "allowWatchBookmarks": "true"}
        async for event in kube.watch(path, params, read_timeout_s=120):
            job = event.get("object") or {}
            version = str((job.get("metadata") or {}).get("resourceVersion") or version)
            if event.get("type") in ("ADDED", "MODIFIED"):
                note(job)


async def worlds_formed(run: OperatorRun, count: int) -> None:
    """Wait until ``count`` jobs (as many as the fitting pods fill) have a world, none more
    came for STALL_S, or WORLDS_WAIT_S passed.

    Pods Running is not yet a world: the operator records it in status and writes the
    assignments after that, and the creation-to-first-world figures must cover every job.
    """
    start = time.monotonic()
    seen, since = len(run.first_world), start
    while len(run.first_world) < count:
        await asyncio.sleep(1.0)
        now = time.monotonic()
        if len(run.first_world) > seen:
            seen, since = len(run.first_world), now
        if now - since > STALL_S or now - start > WORLDS_WAIT_S:
            say(f"  {seen} of {count} jobs have a world after {now - start:.0f}s more; stopped")
            return


async def operator_ready(port: int, process: subprocess.Popen[bytes]) -> float:
    """Seconds until the operator leads and has synced its caches (its metrics say so)."""
    start = time.monotonic()
    while time.monotonic() - start < 300:
        if process.poll() is not None:
            raise SystemExit(f"the operator exited with {process.returncode} while starting")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
                text = reply.read().decode()
        except OSError:
            text = ""
        if "elastra_leader 1.0" in text and "elastra_caches_synced 1.0" in text:
            return time.monotonic() - start
        await asyncio.sleep(0.2)
    raise SystemExit("the operator was not ready (leading, caches synced) within 300 s")


async def with_operator(
    kube: Kube, pods: Informer, want: int, daemons: dict[str, int]
) -> OperatorRun:
    run = OperatorRun()
    start, daemons_before = time.monotonic(), daemons_cpu(daemons)

    async def create(index: int) -> None:
        manifest = job_manifest(index)
        await kube.create(f"{resources.JOBS}/namespaces/{NAMESPACE}/trainingjobs", manifest)
        run.created[manifest["metadata"]["name"]] = time.monotonic()

    watcher = asyncio.create_task(watch_worlds(kube, run))
    try:
        await gather_limited(16, *(create(i) for i in range(JOBS)))
        stall = STALL_S if want < JOBS * WORKERS else None
        placed = await wait_running(pods, OPERATED, want, timeout=3600, stall_s=stall)
        run.control_plane_cpu = cpu_spent(daemons_before, daemons_cpu(daemons))
        await worlds_formed(run, want // WORKERS)
    finally:
        watcher.cancel()
    run.seconds, run.running = placed.at - start, placed.running
    return run


def percentile(values: list[float], q: float) -> float:
    """The q-quantile of sorted values (nearest rank); NaN when there are none."""
    if not values:
        return float("nan")
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


def metric_sum(text: str, name: str) -> float:
    return sum(
        float(m.group(1))
        for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, flags=re.M)
    )


WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "DELETE", "APPLY"})
LABEL = re.compile(r'(\w+)="([^"]*)"')


def apiserver_writes(kubectl: Path, kubeconfig: Path) -> Counter[str]:
    """The API server's own count of writes so far, by resource[/subresource], from every
    client: the scheduler's binds, kwok's pod status, the controller-manager's EndpointSlices.
    What a phase costs the server includes what its objects make other controllers write.

    Writes the server refused are counted apart ("endpoints refused 422"): kwok's pods have
    loopback addresses (this machine's rule for fake pods), which Endpoints and EndpointSlices
    may not hold, so the endpoint controllers retry the job's Service with backoff through the
    run; on a cluster with routable pod addresses that is one or two accepted writes per job."""
    text = subprocess.run(
        [str(kubectl), f"--kubeconfig={kubeconfig}", "get", "--raw", "/metrics"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    writes: Counter[str] = Counter()
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(LABEL.findall(line[: line.rindex("}")]))
        if labels.get("verb") in WRITE_VERBS:
            sub, code = labels.get("subresource"), labels.get("code", "")
            refused = f" refused {code}" if code.startswith("4") else ""
            writes[labels.get("resource", "") + (f"/{sub}" if sub else "") + refused] += float(
                line.split()[-1]
            )
    return writes


SETTLED_S = 5.0


async def fleet_settled(kubectl: Path, kubeconfig: Path, *, timeout: float = 300.0) -> float:
    """Seconds until no Node is written for SETTLED_S (its status heartbeats aside).

    A fleet just made Ready is still being written for a while (the controller-manager
    takes its not-ready taints off, about two writes per node): a phase that started then
    paid for the fleet's start as well as its own pods, and by how much varied from run to
    run, in the plain client's phase (the first) only."""
    start = time.monotonic()
    last, quiet_since = apiserver_writes(kubectl, kubeconfig)["nodes"], start
    while time.monotonic() - quiet_since < SETTLED_S:
        if time.monotonic() - start > timeout:
            say(f"the fleet was still being written after {timeout:.0f} s; measuring anyway")
            break
        await asyncio.sleep(1.0)
        now = apiserver_writes(kubectl, kubeconfig)["nodes"]
        if now != last:
            last, quiet_since = now, time.monotonic()
    return time.monotonic() - start


def per_job(after: Counter[str], before: Counter[str], jobs: int) -> dict[str, float]:
    """Writes per job between two counts, largest first (those above 0.05 per job)."""
    diff = {k: (after[k] - before[k]) / jobs for k in after}
    return {k: round(v, 2) for k, v in sorted(diff.items(), key=lambda kv: -kv[1]) if v >= 0.05}


def requests_by_kind(text: str, name: str, jobs: int) -> dict[str, float]:
    """Requests per job by verb and resource ("POST pods": 8.0), largest first."""
    found: dict[str, float] = {}
    pattern = rf'^{name}{{resource="([^"]*)",verb="([^"]*)"}} ([0-9.e+]+)$'
    for resource, verb, value in re.findall(pattern, text, flags=re.M):
        found[f"{verb} {resource}"] = found.get(f"{verb} {resource}", 0.0) + float(value)
    ranked = sorted(found.items(), key=lambda kv: -kv[1])
    return {kind: round(value / jobs, 2) for kind, value in ranked if value}


def dump_stacks(pid: int) -> None:
    """Print where a process that ignores SIGTERM is stuck: py-spy's dump, when installed."""
    spy = Path(sys.executable).with_name("py-spy")
    if not spy.exists():
        say("operator: install py-spy in this venv to see where it was stuck")
        return
    dump = subprocess.run(
        [str(spy), "dump", f"--pid={pid}"], check=False, capture_output=True, text=True
    )
    say(f"operator: stacks at the kill:\n{dump.stdout}{dump.stderr}")


def rss_mib(pid: int, field_name: str = "VmRSS") -> float:
    """Resident memory (VmRSS) or its peak (VmHWM) of a process, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field_name}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@dataclass(frozen=True)
class ControlPlane:
    """The local cluster the run measures: how to reach it and its processes (name -> pid)."""

    kubeconfig: Path
    kubectl: Path
    daemons: dict[str, int]


async def run(plane: ControlPlane) -> None:
    connection = load_connection(str(plane.kubeconfig))
    async with Kube(connection, retry=PATIENT) as kube:
        await kube.create(
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        )
        slots = await gpu_slots(kube)
        fits = placeable({product: len(nodes) for product, nodes in slots.items()})
        pods = pods_watched(kube)
        watching = asyncio.create_task(pods.run())
        await asyncio.wait_for(pods.wait_synced(), timeout=60)
        try:
            await measure(kube, plane, pods, fits, slots)
        finally:
            watching.cancel()


async def measure(
    kube: Kube,
    plane: ControlPlane,
    pods: Informer,
    fits: list[tuple[int, int]],
    slots: dict[str, list[str]],
) -> None:
    """The plain client's phase (and the same-pods one), then the operator's, and the JSON
    line comparing them."""
    kubeconfig, kubectl, daemons = plane.kubeconfig, plane.kubectl, plane.daemons
    settling = await fleet_settled(kubectl, kubeconfig)
    say(f"fleet settled (no Node written for {SETTLED_S:.0f} s) after {settling:.1f}s")
    say(f"baseline: a plain client creates {len(fits)} of {JOBS * WORKERS} pods (what fits)")
    before_plain = apiserver_writes(kubectl, kubeconfig)
    plain = await baseline(kube, pods, [(i, plain_pod(i, w)) for i, w in fits], daemons, PLAIN)
    after_plain = apiserver_writes(kubectl, kubeconfig)
    say(f"baseline: {plain.seconds:.1f}s, {plain.requests:.0f} requests")
    same = await same_pods(kube, pods, fits, slots, daemons) if SAME_PODS == "on" else None
    before_operator = apiserver_writes(kubectl, kubeconfig)
    ran, figures = await operator_phase(kube, plane, pods, len(fits))
    result = summary(len(fits), plain, ran, figures)
    result["apiServerWritesPerJobPlain"] = per_job(after_plain, before_plain, JOBS)
    result["apiServerWritesPerJobOperator"] = per_job(figures.writes, before_operator, JOBS)
    if same is not None:
        result["samePodsSeconds"] = round(same.seconds, 1)
        result["ratioOperatorToSamePods"] = round(ran.seconds / same.seconds, 2)
        result["controlPlaneCpuSecondsSamePods"] = same.control_plane_cpu
    report(result)


async def same_pods(
    kube: Kube,
    pods_seen: Informer,
    fits: list[tuple[int, int]],
    slots: dict[str, list[str]],
    daemons: dict[str, int],
) -> Baseline:
    """The plain client again, creating the operator's worker pods (ELASTRA_BENCH_SAME_PODS),
    each on a node with a GPU free."""
    free = {product: list(nodes) for product, nodes in slots.items()}
    pods = [(i, same_pod(i, w, free[PRODUCTS[TYPES[i % len(TYPES)]]].pop())) for i, w in fits]
    say(f"same pods: a plain client creates {len(pods)} worker pods as the operator builds them")
    spent = await baseline(kube, pods_seen, pods, daemons, SAME)
    say(f"same pods: {spent.seconds:.1f}s")
    return spent


@dataclass(frozen=True)
class OperatorFigures:
    """What the operator's metrics, /proc and the API server said at the end of its phase."""

    started: float
    """Seconds until it led and had synced its caches."""
    requests: float
    by_kind: dict[str, float]
    passes: float
    pass_seconds: float
    memory: float
    peak: float
    cpu: float
    writes: Counter[str]
    """The API server's count of writes when every pod ran (``apiserver_writes``)."""


async def operator_phase(
    kube: Kube, plane: ControlPlane, pods: Informer, want: int
) -> tuple[OperatorRun, OperatorFigures]:
    """Start the operator, create the jobs, wait for ``want`` pods and the worlds; stop it."""
    metrics_port = 18480
    operator = start_operator(plane.kubeconfig, metrics_port)
    try:
        say(f"operator: {JOBS} TrainingJobs of {WORKERS} workers ...")
        started = await operator_ready(metrics_port, operator)
        ran = await with_operator(kube, pods, want, plane.daemons)
        writes = apiserver_writes(plane.kubectl, plane.kubeconfig)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as reply:
            text = reply.read().decode()
        figures = OperatorFigures(
            started=started,
            requests=metric_sum(text, "elastra_api_requests_total"),
            by_kind=requests_by_kind(text, "elastra_api_requests_total", JOBS),
            passes=metric_sum(text, "elastra_reconcile_duration_seconds_count"),
            pass_seconds=metric_sum(text, "elastra_reconcile_duration_seconds_sum"),
            memory=rss_mib(operator.pid),
            peak=rss_mib(operator.pid, "VmHWM"),
            cpu=cpu_seconds(operator.pid),
            writes=writes,
        )
    finally:
        stop_operator(operator)
    return ran, figures


def summary(
    placeable_pods: int, plain: Baseline, ran: OperatorRun, figures: OperatorFigures
) -> dict[str, Any]:
    """The JSON line's figures comparing the operator's phase with the plain client's."""
    waits = ran.first_world_seconds()
    requests, cpu, passes = figures.requests, figures.cpu, figures.passes
    return {
        "jobs": JOBS,
        "workersPerJob": WORKERS,
        "placeablePods": placeable_pods,
        "operatorRunningPods": ran.running,
        "plainClientSeconds": round(plain.seconds, 1),
        "operatorSeconds": round(ran.seconds, 1),
        "operatorStartSeconds": round(figures.started, 1),
        "ratioOperatorToPlain": round(ran.seconds / plain.seconds, 2),
        "apiRequestsPerJob": round(requests / JOBS, 1),
        "plainRequestsPerJob": round(plain.requests / JOBS, 1),
        "requestRatio": round(requests / max(plain.requests, 1), 2),
        "apiRequestsPerJobByKind": figures.by_kind,
        "operatorCpuSeconds": round(cpu, 1),
        "plainClientCpuSeconds": round(plain.cpu_seconds, 1),
        "cpuRatio": round(cpu / max(plain.cpu_seconds, 1e-3), 2),
        "operatorRssMiB": round(figures.memory, 1),
        "operatorPeakRssMiB": round(figures.peak, 1),
        "operatorPasses": int(passes),
        "operatorPassSecondsMean": round(figures.pass_seconds / max(passes, 1), 3),
        "jobsWithWorld": len(waits),
        "firstWorldP50Seconds": round(percentile(waits, 0.50), 1),
        "firstWorldP99Seconds": round(percentile(waits, 0.99), 1),
        "plainJobPodsCreatedP50Seconds": round(percentile(plain.job_pods_created, 0.50), 1),
        "plainJobPodsCreatedP99Seconds": round(percentile(plain.job_pods_created, 0.99), 1),
        "controlPlaneCpuSecondsPlain": plain.control_plane_cpu,
        "controlPlaneCpuSecondsOperator": ran.control_plane_cpu,
        "endpointControllers": ENDPOINTS,
    }


def start_operator(kubeconfig: Path, metrics_port: int) -> subprocess.Popen[bytes]:
    """``elastra run`` for the bench namespace, as a process of its own (its CPU is its own)."""
    argv = [sys.executable, "-m", "elastra.cli", "run", f"--kubeconfig={kubeconfig}",
            f"--namespace={NAMESPACE}", f"--lease-namespace={NAMESPACE}",
            f"--toleration={OPERATOR_TOLERATION}",
            f"--metrics-port={metrics_port}", "--health-port=0", "--log-format=plain",
            "--capacity-requests=off",  # a fixed fleet: no autoscaler to ask for nodes
            *OPERATOR_ARGS]  # fmt: skip
    if not OPERATOR_LOG:
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(OPERATOR_LOG, "ab") as output:
        return subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT)


def stop_operator(operator: subprocess.Popen[bytes]) -> None:
    operator.terminate()
    try:
        operator.wait(timeout=30)
    except subprocess.TimeoutExpired:
        say("operator: still running 30 s after SIGTERM; killed")
        dump_stacks(operator.pid)
        operator.kill()
        operator.wait()


def report(result: dict[str, Any]) -> None:
    """The summary line for a person, then the JSON line."""
    say(
        f"time to place every pod: operator / plain client = {result['ratioOperatorToPlain']}x "
        f"(target < 2x); API requests per job {result['apiRequestsPerJob']} vs "
        f"{result['plainRequestsPerJob']} ({result['requestRatio']}x); CPU "
        f"{result['operatorCpuSeconds']} s vs {result['plainClientCpuSeconds']} s "
        f"({result['cpuRatio']}x); operator RSS {result['operatorRssMiB']} MiB (target < 300); "
        f"creation to first world p99 {result['firstWorldP99Seconds']} s over "
        f"{result['jobsWithWorld']} jobs (target <= 30 s at 300 jobs; the plain client's "
        f"p99 to a job's pods all created: {result['plainJobPodsCreatedP99Seconds']} s)"
    )
    print(json.dumps(result), flush=True)


def main() -> int:
    layout = ClusterDirs(
        Path(os.environ.get("ELASTRA_BENCH_CLUSTER_DIR", "/tmp/elastra-bench-scale"))
    )
    say(f"local control plane in {layout.root} with fleet {FLEET} ...")
    without = () if ENDPOINTS == "on" else ENDPOINT_CONTROLLERS
    started = up(layout, fleet="hetero-small", without_controllers=without)
    try:
        apply_fleet(FLEET, layout=layout, replace=True, timeout=900)
        state = State.load(layout)
        assert state is not None, f"no cluster state in {layout.root}"
        daemons = {d.name: d.pid for d in state.daemons}
        asyncio.run(run(ControlPlane(layout.kubeconfig, Path(state.bindir) / "kubectl", daemons)))
    finally:
        if started:
            down(layout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
