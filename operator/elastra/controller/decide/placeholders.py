"""Capacity-request pods: how a job asks the cluster's autoscaler for the nodes it lacks.

Elastra creates worker pods only for capacity that exists (gated, pinned to a planned node),
and autoscalers act only on pods the scheduler marks ``Unschedulable``: Cluster Autoscaler,
Karpenter and GKE's node auto-provisioning never see a gated pod, nor a pod pinned to a node
by ``matchFields`` (Karpenter refuses the field outright). So a job short of capacity also
gets one of these per missing worker: an ungated, unpinned pod shaped like one worker as the
scheduler sees it, which every autoscaler provisions a node for. Karpenter does not serve the
ProvisioningRequest API (only Cluster Autoscaler does); a pending pod is what they all read.

Shaped like a worker, from the worker pod itself (``manifests.worker_pod``) so the two cannot
disagree: the same requests in all (containers, native sidecars and init containers summed as
the scheduler sums them, GPUs included), tolerations, ``nodeSelector``, required node affinity
(without the pin), pod (anti-)affinity, pull secrets and security context. With
``worker.gpuTypes`` set, a required node affinity names those types in each label a
provider writes (``gpu_type_terms``). Of several types, a job that may mix them
(``placement.heterogeneous``) spreads its requests over them with a preferred affinity:
stock-outs are per type, and a pool of two types then gives a mixed plan rather than waiting
on one; any other job prefers the first it lists, so that its nodes come as one type.

What they must never do: evict anyone, or count as workers. Their PriorityClass
(``priority_class``: value -1, ``preemptionPolicy: Never``) is the operator's own, not the
template's: the API server's priority admission refuses a pod that sets a preemption policy
differing from its class's, and a placeholder with the workers' priority could preempt
running pods for a node that does not exist yet. They carry ``LABEL_CAPACITY_REQUEST`` and
not the worker label, so nothing that lists a job's workers (the controller, the scale
subresource's selector, the NetworkPolicy) sees them. The job owns them (deleted with it).

Their container is the worker image (which the new node then has pulled when the worker
comes) waiting for SIGTERM; ``restartPolicy: Always`` keeps a pod whose command cannot start
bound to its node, rather than ending it and asking for another.

Pure: values in, pod bodies out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from elastra.api import TrainingJob
from elastra.controller.decide.manifests import owner_reference, worker_pod
from elastra.controller.settings import OperatorSettings
from elastra.planner import providers
from elastra.planner.catalog import AMD_GPU, NVIDIA_GPU, GpuType, GpuTypeName, selected
from elastra.planner.resources import CPU, pod_requests

LABEL_CAPACITY_REQUEST = "elastra.dev/capacity-request"
"""The job a capacity-request pod asks nodes for (never the worker label ``elastra.dev/job``)."""
CONTAINER = "capacity-request"
KARPENTER_DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
"""Karpenter leaves a node with such a pod alone (no consolidation while the job waits)."""
PRIORITY_VALUE = -1
"""Below every pod of the default priority (0), so any pod that needs the node may preempt a
placeholder; above Cluster Autoscaler's cutoff (pods below -10 never trigger a scale-up)."""
GRACE_SECONDS = 1
WAIT_FOR_SIGTERM = (
    "import signal; signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM}); "
    "signal.sigwait({signal.SIGTERM})"
)
"""PID 1 ignores a signal it has no handler for: blocked and waited for, SIGTERM ends it."""
PREFERRED_WEIGHT = 100
_STANDARD = frozenset({CPU, "memory", "ephemeral-storage"})
"""Resources that take a request without a limit; extended ones (GPUs) need both, equal."""
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_PIN_FIELD = "metadata.name"


def request_name(job: str, index: int) -> str:
    """The name of a job's ``index``-th capacity-request pod."""
    return f"{job}-cr{index}"


def index_of(job: str, pod: str) -> int | None:
    """``request_name``'s inverse (``None``: not one of the job's)."""
    tail = pod.removeprefix(f"{job}-cr")
    return int(tail) if tail != pod and tail.isdigit() else None


def requester(pod: Mapping[str, Any]) -> str | None:
    """The job a capacity-request pod asks for, or ``None`` for any other pod."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    job = labels.get(LABEL_CAPACITY_REQUEST)
    return str(job) if job else None


def priority_class(settings: OperatorSettings) -> dict[str, Any]:
    """The PriorityClass every capacity-request pod runs at (see the module docstring)."""
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {
            "name": settings.capacity_request_priority_class,
            "labels": {"app.kubernetes.io/managed-by": "elastra"},
        },
        "value": PRIORITY_VALUE,
        "preemptionPolicy": "Never",
        "globalDefault": False,
        "description": (
            "Elastra's capacity-request pods: they ask autoscalers for nodes for training "
            "jobs, never preempt, and give way to any pod of default priority."
        ),
    }


def capacity_request_pod(
    job: TrainingJob, *, index: int, settings: OperatorSettings
) -> dict[str, Any]:
    """The ``index``-th capacity-request pod of ``job`` (see the module docstring)."""
    patterns = list(job.spec.worker.gpu_types) if job.spec.worker.gpus else []
    prefer = _preferred(patterns, index=index, mixed=job.spec.placement.heterogeneous)
    worker = worker_pod(
        job,
        slot=0,
        node="",
        gpu_type=_first_type(prefer),
        assignment="",
        version=0,
        settings=settings,
    )
    spec = worker["spec"]
    name = job.metadata.name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": request_name(name, index),
            "namespace": job.metadata.namespace,
            "labels": {
                LABEL_CAPACITY_REQUEST: name,
                "app.kubernetes.io/name": "elastra-capacity-request",
                "app.kubernetes.io/managed-by": "elastra",
            },
            "annotations": {KARPENTER_DO_NOT_DISRUPT: "true"},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": _spec(spec, job, patterns=patterns, prefer=prefer, settings=settings),
    }


def _spec(
    worker: Mapping[str, Any],
    job: TrainingJob,
    *,
    patterns: Sequence[str],
    prefer: str | None,
    settings: OperatorSettings,
) -> dict[str, Any]:
    """The placeholder's spec: the worker's scheduling constraints, a container that waits."""
    container = worker["containers"][0]
    spec: dict[str, Any] = {
        "restartPolicy": "Always",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": GRACE_SECONDS,
        "priorityClassName": settings.capacity_request_priority_class,
        "tolerations": list(worker.get("tolerations") or []),
        "securityContext": worker.get("securityContext") or {},
        "containers": [
            {
                "name": CONTAINER,
                "image": container["image"],
                "imagePullPolicy": container.get("imagePullPolicy", "IfNotPresent"),
                "command": ["python3", "-c", WAIT_FOR_SIGTERM],
                "resources": _resources(worker, job),
                "securityContext": container.get("securityContext") or {},
            }
        ],
    }
    affinity = _affinity(worker.get("affinity") or {}, patterns=patterns, prefer=prefer)
    if affinity:
        spec["affinity"] = affinity
    for key in ("nodeSelector", "imagePullSecrets"):
        if worker.get(key):
            spec[key] = worker[key]
    return spec


def _resources(worker: Mapping[str, Any], job: TrainingJob) -> dict[str, dict[str, str]]:
    """What the whole worker pod requests, as one container's requests (and limits for the
    extended resources, which must equal them)."""
    total = pod_requests(worker, f"trainingjob {job.metadata.name}: worker pod")
    requests = {name: f"{value}m" if name == CPU else str(value) for name, value in total.amounts}
    limits = {name: value for name, value in requests.items() if name not in _STANDARD}
    return {"requests": requests, "limits": limits} if limits else {"requests": requests}


def _affinity(
    worker: Mapping[str, Any], *, patterns: Sequence[str], prefer: str | None
) -> dict[str, Any]:
    """The worker's affinity without its pin, ANDed with the GPU types' terms, and the
    preferred type of this placeholder."""
    affinity = {k: v for k, v in worker.items() if k != "nodeAffinity"}
    node = dict(worker.get("nodeAffinity") or {})
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = [_unpinned(t) for t in required.get("nodeSelectorTerms") or []]
    types = gpu_type_terms(patterns)
    if types:
        terms = [_and(t, u) for t in (terms or [{}]) for u in types]
    terms = [t for t in terms if t]
    if terms:
        node["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": terms}
    else:
        node.pop("requiredDuringSchedulingIgnoredDuringExecution", None)
    preferred = gpu_type_terms([prefer])[-1:] if prefer else []
    if preferred:
        node["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": PREFERRED_WEIGHT, "preference": preferred[0]},
            *node.get("preferredDuringSchedulingIgnoredDuringExecution", []),
        ]
    if node:
        affinity["nodeAffinity"] = node
    return affinity


def _unpinned(term: Mapping[str, Any]) -> dict[str, Any]:
    """A worker's node-selector term without the pin to its planned node."""
    fields = [f for f in term.get("matchFields") or [] if f.get("key") != _PIN_FIELD]
    out = {k: v for k, v in term.items() if k != "matchFields"}
    if fields:
        out["matchFields"] = fields
    return out


def _and(left: Mapping[str, Any], right: Mapping[str, Any]) -> dict[str, Any]:
    """Two node-selector terms as one (their requirements ANDed)."""
    out = dict(left)
    expressions = [*left.get("matchExpressions", []), *right.get("matchExpressions", [])]
    if expressions:
        out["matchExpressions"] = expressions
    return out


def gpu_type_terms(patterns: Iterable[str]) -> list[dict[str, Any]]:
    """Node-selector terms (ORed) that select nodes of the ``worker.gpuTypes`` ``patterns``,
    one per label a provider writes, the instance type last.

    The scheduler takes a node matching any term. Karpenter reads one term at a time and
    drops the first when no instance type fits it, keeping the last: the instance type, which
    every Karpenter provider knows, so a term on a label the NodePool does not define costs
    one more try, never the request. Empty when no pattern names a catalog type (or none is
    given): the GPU count is then all that is asked.
    """
    types = selected(patterns)
    if not types:
        return []
    names: set[str] = {gpu.name for gpu in types}
    pairs = (
        (providers.LABEL_GPU_TYPE, [*sorted(names), *patterns]),
        (providers.LABEL_GFD_PRODUCT, _products(types, vendor=NVIDIA_GPU)),
        (providers.LABEL_AMD_PRODUCT, _products(types, vendor=AMD_GPU)),
        (providers.LABEL_GKE_ACCELERATOR, _keys(providers.GKE_ACCELERATORS, names)),
        (
            providers.LABEL_KARPENTER_GPU_NAME,
            [k for k, v in providers.KARPENTER_GPU_NAMES.items() if set(v) <= names],
        ),
        (
            providers.LABEL_INSTANCE_TYPE,
            [k for k, v in providers.INSTANCE_TYPES.items() if v.gpu in names],
        ),
    )
    terms = []
    for key, values in pairs:
        valid = sorted({v for v in values if len(v) <= 63 and _LABEL_VALUE.match(v)})
        if valid:
            terms.append({"matchExpressions": [{"key": key, "operator": "In", "values": valid}]})
    return terms


def _preferred(patterns: Sequence[str], *, index: int, mixed: bool) -> str | None:
    """The type the ``index``-th request prefers, of a job allowed several: in turn for a job
    that may mix types (a stock-out of one does not stall it, and a pool of both gives a mixed
    plan); else the first listed for all, so that they come as one type the job can use."""
    if len(patterns) < 2:
        return None
    return patterns[index % len(patterns)] if mixed else patterns[0]


def _first_type(pattern: str | None) -> str:
    """The first catalog type ``pattern`` selects ("" for none): its vendor's GPU resource is
    what a request preferring it asks for."""
    if pattern is None:
        return ""
    return next((gpu.name for gpu in selected([pattern])), "")


def _products(types: Sequence[GpuType], *, vendor: str) -> list[str]:
    """The product labels of the ``types`` whose GPUs are requested as ``vendor``'s resource:
    each vendor's labeller writes its own label (GFD for NVIDIA, AMD's node labeller)."""
    return [label for gpu in types if gpu.resource == vendor for label in gpu.product_labels]


def _keys(table: Mapping[str, GpuTypeName], names: set[str]) -> list[str]:
    return [key for key, value in table.items() if value in names]
