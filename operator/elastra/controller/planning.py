"""The operator's two questions to the planner, asked in the planner's terms.

1. *Where do new pods go?* Plan the whole job on the capacity it could have (free GPUs plus
   the GPUs its own live pods hold), keep existing pods where they are, and give new pods the
   plan's remaining slots. Planning the whole job, not just the new pods, keeps the plan the
   operator places equal to the one ``elastra plan`` prints for the same cluster.
2. *How does this set of pods train?* Plan exactly the world's pods (their nodes and GPU
   types, nothing else) to get dp/tp/pp, the micro-batch and the batch shares of each
   data-parallel rank, which go into the assignments.

Pure: it reads node and pod dicts and returns values. A node the planner cannot understand
(an unknown GPU type) is left out with its reason instead of failing every job's plan.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from elastra.api import PlanStatus, TrainingJob
from elastra.controller.manifests import ANNOTATION_NODE, LABEL_JOB
from elastra.controller.memo import LastOf
from elastra.controller.observe import PodFacts
from elastra.errors import UserError
from elastra.planner import Inventory, JobRequirements, Plan, parse_inventory, plan_job
from elastra.planner.catalog import matches
from elastra.planner.fromspec import requirements_from_spec
from elastra.planner.inventory import ExcludedNode, NodeCapacity, NodeName, pod_usage

JsonDict = Mapping[str, Any]


@dataclass(frozen=True)
class NewPod:
    """Where the planner puts one new pod."""

    node: str
    gpu_type: str


@dataclass(frozen=True)
class Placement:
    """New pods' places, or why none could be found."""

    pods: tuple[NewPod, ...]
    reason: str | None = None
    target: int | None = None
    """Pods the best plan uses (``None``: not planned this pass)."""
    limited: bool = False
    """The best plan is smaller than asked because capacity is short, not by preference."""


@dataclass(frozen=True)
class WorldPlan:
    """How a set of pods trains: ranks per pod and the plan to record in status."""

    order: tuple[str, ...]
    """Pod names in rank order."""
    first_rank: Mapping[str, int]
    gpu_type: Mapping[str, str]
    size: int
    status: PlanStatus
    tokens_per_second: float


def cluster_inventory(
    nodes: Sequence[JsonDict],
    pods: Sequence[JsonDict],
    *,
    own_job: str | None = None,
    extra: Sequence[JsonDict] = (),
) -> Inventory:
    """Capacity left by every pod except ``own_job``'s, counting pods not yet bound.

    Elastra's gated pods are not bound yet but will be: they count against the node named in
    their ``elastra.dev/node`` annotation, so two jobs never plan onto the same free GPUs.
    ``extra`` are pods being created that no listing shows yet (the operator's reservations).

    Every job's pass asks this of the same listing, so when ``nodes`` and ``pods`` are tuples
    (immutable: the snapshot's listings) the parsed nodes and the usage of the listed pods are
    computed once per listing and each pass only subtracts its own job's share: on a cluster
    of a thousand nodes and thousands of pods, parsing them per pass was most of the
    operator's CPU. Lists, which callers may change, are parsed every time.
    """
    base = _NODES.get(nodes, _parse_nodes)
    usage = _USAGE.get(pods, _usage_by_job)
    used_gpus = dict(usage.gpus)
    used_cpu = dict(usage.cpu)
    if own_job:
        for node, (gpus, cpu) in usage.by_job.get(own_job, {}).items():
            used_gpus[node] -= gpus
            used_cpu[node] -= cpu
    for pod in extra:
        if own_job and _labels(pod).get(LABEL_JOB) == own_job:
            continue
        node, gpus, cpu = _usage_of(pod)
        if node:
            used_gpus[node] = used_gpus.get(node, 0) + gpus
            used_cpu[node] = used_cpu.get(node, 0) + cpu
    return Inventory(
        nodes=tuple(
            dataclasses.replace(
                n,
                free_gpus=max(0, n.free_gpus - used_gpus.get(n.name, 0)),
                free_cpu_millis=max(0, n.free_cpu_millis - used_cpu.get(n.name, 0)),
            )
            if used_gpus.get(n.name) or used_cpu.get(n.name)
            else n
            for n in base.nodes
        ),
        excluded=base.excluded,
    )


@dataclass(frozen=True)
class _Usage:
    """GPUs and CPU millicores the listed pods hold per node, in all and per Elastra job."""

    gpus: Mapping[str, int]
    cpu: Mapping[str, int]
    by_job: Mapping[str, Mapping[str, tuple[int, int]]]


def _parse_nodes(nodes: Sequence[JsonDict]) -> Inventory:
    # Items of a list response carry no ``kind``; the planner's parser wants one.
    node_list = [{**node, "kind": "Node"} for node in nodes]
    try:
        return parse_inventory(node_list)
    except UserError:
        return _inventory_node_by_node(node_list)


def _usage_by_job(pods: Sequence[JsonDict]) -> _Usage:
    gpus: Counter[str] = Counter()
    cpu: Counter[str] = Counter()
    by_job: dict[str, dict[str, tuple[int, int]]] = {}
    for pod in pods:
        node, pod_gpus, pod_cpu = _usage_of(pod)
        if not node:
            continue
        gpus[node] += pod_gpus
        cpu[node] += pod_cpu
        job = _labels(pod).get(LABEL_JOB)
        if job:
            held = by_job.setdefault(job, {})
            before = held.get(node, (0, 0))
            held[node] = (before[0] + pod_gpus, before[1] + pod_cpu)
    return _Usage(gpus=gpus, cpu=cpu, by_job=by_job)


def _usage_of(pod: JsonDict) -> tuple[str, int, int]:
    """A pod's (node, GPUs, CPU), with a gated pod counted on its planned node."""
    try:
        return pod_usage(_as_bound(pod))
    except UserError:
        return "", 0, 0  # a pod with an unreadable quantity: the scheduler rejects it too


_NODES: LastOf[Sequence[JsonDict], Inventory] = LastOf()
_USAGE: LastOf[Sequence[JsonDict], _Usage] = LastOf()


def _inventory_node_by_node(nodes: Sequence[JsonDict]) -> Inventory:
    good: list[NodeCapacity] = []
    excluded: list[ExcludedNode] = []
    for node in nodes:
        try:
            parsed = parse_inventory([node])
        except UserError as err:
            name = str((node.get("metadata") or {}).get("name", "?"))
            excluded.append(ExcludedNode(NodeName(name), str(err)))
            continue
        good.extend(parsed.nodes)
        excluded.extend(parsed.excluded)
    return Inventory(
        nodes=tuple(sorted(good, key=lambda n: n.name)),
        excluded=tuple(sorted(excluded, key=lambda n: n.name)),
    )


def _labels(pod: JsonDict) -> Mapping[str, str]:
    return (pod.get("metadata") or {}).get("labels") or {}


def _as_bound(pod: JsonDict) -> JsonDict:
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return pod
    planned = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_NODE)
    if not planned:
        return pod
    return {**pod, "spec": {**spec, "nodeName": planned}}


def requirements(job: TrainingJob, *, replicas: int, minimum: int) -> JobRequirements:
    """The job's requirements with the pod count bounded to ``minimum..replicas``."""
    base = requirements_from_spec(job.spec)
    return dataclasses.replace(base, replicas=replicas, min_replicas=min(minimum, replicas))


def place_new_pods(
    job: TrainingJob,
    inventory: Inventory,
    *,
    keep: Sequence[PodFacts],
    count: int,
    desired: int,
) -> Placement:
    """Nodes for up to ``count`` new pods, given the pods ``keep`` already holds.

    ``inventory`` must count ``keep``'s GPUs as free (see ``cluster_inventory(own_job=...)``):
    the plan is for the whole job and existing pods are matched to it by node. The planner
    chooses how many pods (between minReplicas and ``desired``) the job is fastest on, so a
    plan may use fewer pods than ``replicas`` asks for: ``target`` says how many.
    """
    if count <= 0:
        return Placement(pods=())
    minimum = min(job.spec.min_replicas, desired)
    result = plan_job(requirements(job, replicas=desired, minimum=minimum), inventory, top_k=1)
    if not result.feasible:
        return Placement(
            pods=(), reason=_explain(job, inventory, result.reason), target=0, limited=True
        )
    plan = result.plans[0]
    target = len(plan.pods)
    limited = False
    if target < desired:
        # Fewer pods than asked: is that the model's preference or all that fits?
        forced = plan_job(requirements(job, replicas=desired, minimum=desired), inventory, top_k=1)
        limited = not forced.feasible
    held = Counter(str(p.view.node) for p in keep)
    free: list[NewPod] = []
    for pod in plan.pods:
        if held[str(pod.node)] > 0:
            held[str(pod.node)] -= 1
        else:
            free.append(NewPod(node=str(pod.node), gpu_type=str(pod.gpu_type)))
    return Placement(pods=tuple(free[:count]), target=target, limited=limited)


@dataclass(frozen=True)
class Relocation:
    """A better plan of the same size than the world runs: where it wants pods the job lacks."""

    pods: tuple[NewPod, ...]
    """Slots of the better plan no held pod fills: new pods go there."""
    leave: tuple[str, ...]
    """World members the better plan does not use: they retire once the new pods are Ready."""
    tokens_per_second: float


def faster_free(job: TrainingJob, inventory: Inventory, held: Sequence[PodFacts]) -> bool:
    """Whether GPUs nobody holds are faster than the slowest type ``held`` runs on.

    Only then can moving the job pay, so only then is a full world re-planned: a steady job
    costs no planner call per pass. ``inventory`` counts ``held``'s GPUs as free (see
    ``cluster_inventory(own_job=...)``), so they are subtracted here.
    """
    devices = job.spec.worker.gpus
    if devices == 0 or job.spec.model is None:
        return False  # without a model the planner cannot tell one GPU type's speed from another's
    precision = job.spec.training.precision
    by_name = {str(n.name): n for n in inventory.nodes}
    used = Counter(str(p.view.node) for p in held)
    speeds = [
        by_name[node].gpu_type.peak_tflops(precision) or 0.0 for node in used if node in by_name
    ]
    if not speeds:
        return False
    slowest = min(speeds)
    wanted = job.spec.worker.gpu_types
    return any(
        (n.gpu_type.peak_tflops(precision) or 0.0) > slowest
        and n.free_gpus - used[str(n.name)] * devices >= devices
        and (not wanted or any(matches(w, n.gpu_type) for w in wanted))
        for n in inventory.nodes
    )


def relocate(
    job: TrainingJob,
    inventory: Inventory,
    *,
    members: Sequence[PodFacts],
    standby: Sequence[PodFacts],
    size: int,
) -> Relocation | None:
    """The best plan of exactly ``size`` pods on the job's possible capacity, matched to its pods.

    Members keep their node when the plan has a slot there; standby pods fill what is left; the
    plan's other slots are where new pods would go. ``None`` when the plan is what runs already.
    """
    result = plan_job(requirements(job, replicas=size, minimum=size), inventory, top_k=1)
    if not result.feasible:
        return None
    plan = result.plans[0]
    slots = Counter(str(p.node) for p in plan.pods)
    member_names = {p.name for p in members}
    leave: list[str] = []
    for pod in [*members, *standby]:
        node = str(pod.view.node)
        if slots[node] > 0:
            slots[node] -= 1
        elif pod.name in member_names:
            leave.append(str(pod.name))
    if not leave:
        return None
    new: list[NewPod] = []
    for slot in plan.pods:
        if slots[str(slot.node)] > 0:
            slots[str(slot.node)] -= 1
            new.append(NewPod(node=str(slot.node), gpu_type=str(slot.gpu_type)))
    return Relocation(
        pods=tuple(new), leave=tuple(leave), tokens_per_second=plan.predicted.tokens_per_s
    )


def _explain(job: TrainingJob, inventory: Inventory, reason: str | None) -> str:
    """The planner's reason, led by the user-level cause when it is a GPU type mismatch."""
    return type_mismatch(job, inventory) or f"no plan fits: {reason or 'unknown reason'}"


def type_mismatch(job: TrainingJob, inventory: Inventory) -> str | None:
    """Why no node can ever suit the job's ``worker.gpuTypes``, or ``None`` if some can."""
    wanted = job.spec.worker.gpu_types
    if not wanted or job.spec.worker.gpus == 0:
        return None
    if any(matches(w, t) for w in wanted for t in inventory.types()):
        return None
    types = ", ".join(sorted(str(t.name) for t in inventory.types())) or "no schedulable nodes"
    return (
        f"no schedulable node has a GPU type in worker.gpuTypes ({', '.join(wanted)}); "
        f"the cluster has {types}"
    )


def plan_world(job: TrainingJob, inventory: Inventory, members: Sequence[PodFacts]) -> WorldPlan:
    """The plan for exactly ``members``; raises ``UserError`` when they cannot train."""
    per_node = Counter(str(p.view.node) for p in members)
    devices = max(job.spec.worker.gpus, 1)
    by_name = {node.name: node for node in inventory.nodes}
    nodes: list[NodeCapacity] = []
    for name, count in sorted(per_node.items()):
        node = by_name.get(NodeName(name))
        if node is None:
            raise UserError(f"node {name} of a world member is not schedulable capacity")
        cpu = int(requirements_from_spec(job.spec).cpus_per_worker * 1000)
        nodes.append(
            dataclasses.replace(
                node,
                free_gpus=count * devices if job.spec.worker.gpus else 0,
                free_cpu_millis=count * cpu,
            )
        )
    n = len(members)
    result = plan_job(
        requirements(job, replicas=n, minimum=n), Inventory(nodes=tuple(nodes)), top_k=1
    )
    if not result.feasible:
        raise UserError(f"the {n} workers cannot train this job: {result.reason}")
    plan = result.plans[0]
    remaining = {
        name: sorted((p for p in members if p.view.node == name), key=lambda p: p.view.slot)
        for name in per_node
    }
    order: list[str] = []
    first_rank: dict[str, int] = {}
    gpu_type: dict[str, str] = {}
    for slot in sorted(plan.pods, key=lambda p: p.first_rank):
        pod = remaining[str(slot.node)].pop(0)
        order.append(pod.name)
        first_rank[pod.name] = slot.first_rank
        gpu_type[pod.name] = str(slot.gpu_type)
    return WorldPlan(
        order=tuple(order),
        first_rank=first_rank,
        gpu_type=gpu_type,
        size=plan.gpus,
        status=plan_status(plan),
        tokens_per_second=plan.predicted.tokens_per_s,
    )


def plan_status(plan: Plan) -> PlanStatus:
    """The plan as ``status.plan`` records it (integers only, as API conventions ask)."""
    shares = {str(t.gpu_type): t.batch_share for t in plan.types}
    dp_type: dict[int, str] = {}
    for rank in plan.ranks:
        dp_type.setdefault(rank.dp_rank, str(rank.gpu_type))
    return PlanStatus(
        dp=plan.dp,
        tp=plan.tp,
        pp=plan.pp,
        shape=f"{plan.dp}x{plan.tp}x{plan.pp}",
        micro_batch_size=plan.micro_batch,
        sharding=plan.sharding,
        recompute=plan.recompute,
        gpu_types={str(t.gpu_type): t.gpus for t in plan.types},
        gpu_summary=",".join(f"{t.gpu_type}:{t.gpus}" for t in plan.types),
        batch_shares=shares,
        dp_shares=[shares[dp_type[i]] for i in range(plan.dp)],
        predicted_step_millis=round(plan.predicted.step_time_s * 1000),
        predicted_tokens_per_second=round(plan.predicted.tokens_per_s),
        bottleneck=plan.predicted.bottleneck,
    )
