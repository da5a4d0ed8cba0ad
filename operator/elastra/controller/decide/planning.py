"""The operator's questions to the planner, asked in the planner's terms.

1. *Where do new pods go?* Plan the whole job on the capacity it could have (free GPUs plus
   the GPUs its own live pods hold), keep existing pods where they are, and give new pods the
   plan's remaining slots. Planning the whole job, not just the new pods, keeps the plan the
   operator places equal to the one ``elastra plan`` prints for the same cluster.
2. *Would the running world be faster elsewhere?* The best plan of the world's size on that
   capacity, matched to the pods the job has (``relocate``).
3. *How does this set of pods train?* Plan exactly the world's pods (their nodes and GPU
   types, nothing else) to get dp/tp/pp, the micro-batch, the schedule and the batch shares
   of each data-parallel rank. ``elastra.planner.record`` records it in status and reads the
   record back as the plan every assignment of the world carries (the one road from a
   planner's plan to the workers', which ``elastra plan -o json`` prints too), so a later
   pass writes the same assignments without planning again.

A pass asks these through one ``JobPlanner``: the job's requirements are derived once per
pass and each question bounds them to the pod count it asks about, and a set of pods is
planned once however many steps of the pass ask how it trains.

A ``consistency: bitwise`` job keeps the micro-batch size its first world ran with (the
logical share: changing it would change the gradient sum's order) and plans data parallel
only.

Pure: it reads an ``Inventory`` (see ``capacity``) and pod facts and returns values; nothing
outlives the ``JobPlanner`` of one pass.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from elastra.api import PlanStatus, TrainingJob
from elastra.controller.decide.capacity import cluster_inventory
from elastra.controller.decide.observe import PodFacts
from elastra.errors import UserError
from elastra.planner import Inventory, JobPlan, JobRequirements, plan_job
from elastra.planner.catalog import matches
from elastra.planner.fromspec import requirements_from_spec
from elastra.planner.inventory import NodeCapacity, NodeName
from elastra.planner.record import plan_status

__all__ = [
    "JobPlanner",
    "NewPod",
    "Placement",
    "RankedWorld",
    "Relocation",
    "bounded",
    "cluster_inventory",  # lives in ``capacity``; still imported from here by a few tests
    "job_requirements",
    "micro_batch_note",
    "requirements",
    "type_mismatch",
]


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
    short_reason: str | None = None
    """When ``limited``: why the planner cannot form a world of the asked size."""
    unformable: bool = False
    """When ``limited``: not for lack of free GPUs but because no world of the asked size
    can train (the batch does not split that far, memory): waiting will not help."""


@dataclass(frozen=True)
class RankedWorld:
    """How a set of pods trains: ranks per pod and the plan to record in status."""

    order: tuple[str, ...]
    """Pod names in rank order."""
    first_rank: Mapping[str, int]
    gpu_type: Mapping[str, str]
    size: int
    status: PlanStatus
    tokens_per_second: float


@dataclass(frozen=True)
class Relocation:
    """A better plan of the same size than the world runs: where it wants pods the job lacks."""

    pods: tuple[NewPod, ...]
    """Slots of the better plan no held pod fills: new pods go there."""
    leave: tuple[str, ...]
    """World members the better plan does not use: they retire once the new pods are Ready."""
    tokens_per_second: float


def job_requirements(job: TrainingJob) -> JobRequirements:
    """The job's requirements: the micro-batch size is ``training.microBatchSize`` (``None``:
    the planner chooses), pinned to the recorded plan's for a ``consistency: bitwise`` job;
    ``bounded`` sets the pod count each question asks about."""
    needs = requirements_from_spec(job.spec)
    recorded = job.status.plan
    if job.spec.training.consistency == "bitwise" and recorded is not None:
        return dataclasses.replace(needs, micro_batch=recorded.micro_batch_size)
    return needs


def micro_batch_note(job: TrainingJob) -> str:
    """What a world's event adds when the micro-batch size is a default, not a choice: without
    ``spec.model`` the planner cannot size it and uses 1 (slow on a GPU), which the user should
    hear of rather than find in ``status.plan``."""
    if job.spec.model is not None or job.spec.training.micro_batch_size is not None:
        return ""
    return (
        "micro-batch 1 by default: set training.microBatchSize, or spec.model for the "
        "planner to size it"
    )


def bounded(needs: JobRequirements, *, replicas: int, minimum: int) -> JobRequirements:
    """``needs`` with the pod count bounded to ``minimum..replicas``."""
    return dataclasses.replace(needs, replicas=replicas, min_replicas=min(minimum, replicas))


def requirements(job: TrainingJob, *, replicas: int, minimum: int) -> JobRequirements:
    """The job's requirements for ``minimum..replicas`` pods (``job_requirements``, bounded)."""
    return bounded(job_requirements(job), replicas=replicas, minimum=minimum)


class JobPlanner:
    """One job's questions to the planner during one pass, on the capacity it could have.

    ``inventory`` counts the job's own live pods' GPUs as free (see
    ``capacity.cluster_inventory(own_job=...)``): plans are for the whole job, and the pods it
    has are matched to them by node.
    """

    def __init__(self, job: TrainingJob, inventory: Inventory) -> None:
        self.job = job
        self.inventory = inventory
        self.needs = job_requirements(job)
        self._worlds: dict[tuple[tuple[str, str, int], ...], RankedWorld | UserError] = {}

    def _best(self, *, replicas: int, minimum: int) -> tuple[JobPlan | None, str | None, bool]:
        """The best plan for ``minimum..replicas`` pods, or why none fits and whether for
        lack of capacity."""
        needs = bounded(self.needs, replicas=replicas, minimum=minimum)
        result = plan_job(needs, self.inventory, top_k=1)
        if not result.feasible:
            return None, result.reason, result.short_of_capacity
        return result.plans[0], None, False

    def place_new_pods(self, *, keep: Sequence[PodFacts], count: int, desired: int) -> Placement:
        """Nodes for up to ``count`` new pods, given the pods ``keep`` already holds.

        The planner chooses how many pods (between minReplicas and ``desired``) the job is
        fastest on, so a plan may use fewer pods than ``replicas`` asks for: ``target`` says
        how many.
        """
        if count <= 0:
            return Placement(pods=())
        plan, reason, _ = self._best(replicas=desired, minimum=self.job.spec.min_replicas)
        if plan is None:
            explained = _explain(self.job, self.inventory, reason)
            return Placement(pods=(), reason=explained, target=0, limited=True)
        target = len(plan.pods)
        limited, short_reason, unformable = False, None, False
        if target < desired:
            # Fewer pods than asked: is that the model's preference or all that fits?
            forced, short_reason, short_of_capacity = self._best(replicas=desired, minimum=desired)
            limited = forced is None
            unformable = limited and not short_of_capacity
        held = Counter(str(p.view.node) for p in keep)
        return Placement(
            pods=_unfilled(plan, held)[:count],
            target=target,
            limited=limited,
            short_reason=short_reason,
            unformable=unformable,
        )

    def faster_free(self, held: Sequence[PodFacts]) -> bool:
        """Whether GPUs nobody holds are faster than the slowest type ``held`` runs on.

        Only then can moving the job pay, so only then is a full world re-planned: a steady
        job costs no planner call per pass. ``held``'s GPUs count as free in the inventory,
        so they are subtracted here.
        """
        job = self.job
        devices = job.spec.worker.gpus
        if devices == 0 or job.spec.model is None:
            return (
                False  # without a model the planner cannot tell one GPU type's speed from another's
            )
        precision = job.spec.training.precision
        by_name = {str(n.name): n for n in self.inventory.nodes}
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
            for n in self.inventory.nodes
        )

    def relocate(
        self, *, members: Sequence[PodFacts], standby: Sequence[PodFacts], size: int
    ) -> Relocation | None:
        """The best plan of exactly ``size`` pods, matched to the job's pods.

        Members keep their node when the plan has a slot there; standby pods fill what is
        left; the plan's other slots are where new pods would go. ``None`` when the plan is
        what runs already.
        """
        plan, _, _ = self._best(replicas=size, minimum=size)
        if plan is None:
            return None
        leave, open_slots = _match(Counter(str(p.node) for p in plan.pods), members, standby)
        if not leave:
            return None
        return Relocation(
            pods=_open_slots(plan, open_slots),
            leave=leave,
            tokens_per_second=plan.predicted.tokens_per_s,
        )

    def plan_world(self, members: Sequence[PodFacts]) -> RankedWorld:
        """The plan for exactly ``members``; raises ``UserError`` when they cannot train.

        Asked once per set of pods in a pass: the growth estimate and the world it leads to
        plan the same pods.
        """
        key = tuple(sorted((str(p.name), str(p.view.node), p.view.slot) for p in members))
        if key not in self._worlds:
            try:
                self._worlds[key] = self._plan_world(members)
            except UserError as err:
                self._worlds[key] = err
        found = self._worlds[key]
        if isinstance(found, UserError):
            raise found
        return found

    def _plan_world(self, members: Sequence[PodFacts]) -> RankedWorld:
        n = len(members)
        only = Inventory(nodes=self._members_nodes(members))
        result = plan_job(bounded(self.needs, replicas=n, minimum=n), only, top_k=1)
        if not result.feasible:
            raise UserError(f"the {n} workers cannot train this job: {result.reason}")
        return _ranked(result.plans[0], members)

    def _members_nodes(self, members: Sequence[PodFacts]) -> tuple[NodeCapacity, ...]:
        """The members' nodes with exactly the members' GPUs and CPU as their capacity."""
        job = self.job
        per_node = Counter(str(p.view.node) for p in members)
        devices = max(job.spec.worker.gpus, 1)
        cpu = int(self.needs.cpus_per_worker * 1000)
        by_name = {node.name: node for node in self.inventory.nodes}
        nodes: list[NodeCapacity] = []
        for name, count in sorted(per_node.items()):
            node = by_name.get(NodeName(name))
            if node is None:
                raise UserError(f"node {name} of a world member is not schedulable capacity")
            nodes.append(
                dataclasses.replace(
                    node,
                    free_gpus=count * devices if job.spec.worker.gpus else 0,
                    free_cpu_millis=count * cpu,
                )
            )
        return tuple(nodes)


def _unfilled(plan: JobPlan, held: Counter[str]) -> tuple[NewPod, ...]:
    """The plan's slots, in its order, that ``held`` pods (per node) do not fill."""
    held = held.copy()
    free: list[NewPod] = []
    for pod in plan.pods:
        if held[str(pod.node)] > 0:
            held[str(pod.node)] -= 1
        else:
            free.append(NewPod(node=str(pod.node), gpu_type=str(pod.gpu_type)))
    return tuple(free)


def _match(
    slots: Counter[str], members: Sequence[PodFacts], standby: Sequence[PodFacts]
) -> tuple[tuple[str, ...], Counter[str]]:
    """Members, then standby pods, take the slots (per node) on their node: the members left
    without one, and the slots left open."""
    slots = slots.copy()
    member_names = {p.name for p in members}
    leave: list[str] = []
    for pod in [*members, *standby]:
        node = str(pod.view.node)
        if slots[node] > 0:
            slots[node] -= 1
        elif pod.name in member_names:
            leave.append(str(pod.name))
    return tuple(leave), slots


def _open_slots(plan: JobPlan, slots: Counter[str]) -> tuple[NewPod, ...]:
    """New pods for the ``slots`` left open per node, first slots of the plan first."""
    left = slots.copy()
    new: list[NewPod] = []
    for slot in plan.pods:
        if left[str(slot.node)] > 0:
            left[str(slot.node)] -= 1
            new.append(NewPod(node=str(slot.node), gpu_type=str(slot.gpu_type)))
    return tuple(new)


def _ranked(plan: JobPlan, members: Sequence[PodFacts]) -> RankedWorld:
    """``plan`` with its slots given to ``members`` (per node, lowest slot first)."""
    remaining = {
        node: sorted((p for p in members if str(p.view.node) == node), key=lambda p: p.view.slot)
        for node in {str(p.view.node) for p in members}
    }
    order: list[str] = []
    first_rank: dict[str, int] = {}
    gpu_type: dict[str, str] = {}
    for slot in sorted(plan.pods, key=lambda p: p.first_rank):
        pod = remaining[str(slot.node)].pop(0)
        order.append(pod.name)
        first_rank[pod.name] = slot.first_rank
        gpu_type[pod.name] = str(slot.gpu_type)
    return RankedWorld(
        order=tuple(order),
        first_rank=first_rank,
        gpu_type=gpu_type,
        size=plan.gpus,
        status=plan_status(plan),
        tokens_per_second=plan.predicted.tokens_per_s,
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
