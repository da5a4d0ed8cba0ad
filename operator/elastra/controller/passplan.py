"""One reconcile pass, decided: from what exists to what to write, as data.

``plan_pass`` is pure. It takes the job, its pods, the nodes and the cluster's pods, asks the
resize policy and the planner, and returns a ``PassPlan``: the status to record, the events
to emit, and the pod creates, patches and deletes that make the children match the recorded
world. The reconciler applies it; tests read it like a transcript.

Order of effects (STYLE.md item 3): a new world is recorded in status first (with a
resourceVersion precondition, so two operators cannot both bump the version), and only then
are assignments written to the pods. A pass interrupted between the two is repaired by the
next, which derives the same assignments from the recorded world.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from elastra.api import (
    ConditionType,
    ProgressStatus,
    RankPlacement,
    ResizeRecord,
    TrainingJob,
    TrainingJobStatus,
    WorldStatus,
)
from elastra.controller import sharing
from elastra.controller.conditions import Verdict, is_true, merge_conditions, phase_of
from elastra.controller.manifests import (
    ANNOTATION_ASSIGNMENT,
    ANNOTATION_RETIRED,
    LABEL_WORLD,
    RankSpec,
    assignment_json,
    pod_name,
    selector,
    worker_pod,
)
from elastra.controller.observe import (
    PodFacts,
    WorkerProgress,
    format_time,
    node_health,
    parse_time,
    pod_facts,
)
from elastra.controller.planning import (
    NewPod,
    Placement,
    WorldPlan,
    cluster_inventory,
    faster_free,
    place_new_pods,
    plan_world,
    relocate,
    type_mismatch,
)
from elastra.controller.settings import OperatorSettings
from elastra.elastic.resize import (
    GrowthEstimate,
    Move,
    Reason,
    ResizeDecision,
    ResizeInput,
    decide,
)
from elastra.elastic.workers import PodName, WorkerState
from elastra.errors import UserError
from elastra.planner import Inventory
from elastra_worker.assignment import Plan

JsonDict = Mapping[str, Any]
MAX_RESIZE_HISTORY = 20
FAILURE_REASONS = (Reason.WORKER_FAILED, Reason.WORKER_LOST)


@dataclass(frozen=True)
class Observation:
    """What one pass read from the API server."""

    job: TrainingJob
    pods: Sequence[JsonDict]
    nodes: Sequence[JsonDict]
    cluster_pods: Sequence[JsonDict]
    jobs: Sequence[JsonDict] = ()
    """Every TrainingJob (raw), for sharing scarce GPUs with starved jobs."""
    reserved: Sequence[JsonDict] = ()
    """Pods being created (by any job's pass) that the listing does not show yet."""
    progress: WorkerProgress | None = None
    """What the world's rank 0 reported, when it was read this pass."""
    lost_nodes: Mapping[str, datetime] = field(default_factory=dict)
    """When this operator saw nodes deleted (see ``observe.pod_facts``)."""


@dataclass(frozen=True)
class EventSpec:
    """A Kubernetes Event to record on the job."""

    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class PassPlan:
    """Everything one pass will write, in the order it will write it."""

    status: TrainingJobStatus
    world_changed: bool = False
    events: tuple[EventSpec, ...] = ()
    creates: tuple[dict[str, Any], ...] = ()
    patches: tuple[tuple[str, dict[str, Any]], ...] = ()
    deletes: tuple[str, ...] = ()
    force_deletes: tuple[str, ...] = ()
    """Deletes without grace: pods whose node is gone (graceful deletion would never end)."""
    ungate: tuple[str, ...] = ()
    """Pods whose gates come off, after every create of the pass succeeded."""
    requeue: timedelta | None = None
    decision: ResizeDecision | None = field(default=None, compare=False)


def plan_pass(obs: Observation, settings: OperatorSettings, now: datetime) -> PassPlan:
    """Decide this pass (see the module docstring)."""
    job = obs.job
    health = node_health(obs.nodes)
    facts = {
        str(f.name): f
        for f in (pod_facts(p, health, now=now, lost_nodes=obs.lost_nodes) for p in obs.pods)
    }
    status = job.status
    if is_true(status, ConditionType.FAILED) or is_true(status, ConditionType.SUCCEEDED):
        return _terminal(job, facts)
    members = [facts[p] for p in status.world.ranks if p in facts]
    permanent = [
        f
        for f in members
        if f.view.state is WorkerState.FAILED
        and f.exit_code in job.spec.failure_policy.permanent_exit_codes
    ]
    if permanent:
        first = permanent[0]
        return _fail(
            job,
            facts,
            now,
            reason="PermanentFailure",
            message=f"worker {first.name} exited with permanent code {first.exit_code}",
        )

    own = cluster_inventory(
        obs.nodes, obs.cluster_pods, own_job=job.metadata.name, extra=obs.reserved
    )
    placement, backoff_left = _placement(job, own, facts, job.spec.replicas, now)
    impossible = _impossible(job, obs.nodes) if placement.reason and not facts else None
    planned = job.spec.replicas if not placement.target else placement.target
    desired = sharing.desired(
        job,
        facts,
        obs.jobs,
        obs.cluster_pods,
        wanted=min(job.spec.replicas, max(planned, len(status.world.ranks))),
        free=len(placement.pods),
        reserved=obs.reserved,
    )
    move = _move(job, own, facts, desired, settings) if not placement.pods else None
    if move is not None:
        placement = Placement(pods=move[1], target=placement.target)
    decision = decide(
        ResizeInput(
            desired=desired,
            minimum=job.spec.min_replicas,
            world=tuple(PodName(p) for p in status.world.ranks),
            workers=tuple(f.view for f in facts.values()),
            placeable=len(placement.pods),
            now=now,
            last_resize=parse_time(status.last_resize_time, now)
            if status.last_resize_time
            else None,
            suspended=job.spec.suspend,
            growth=_growth(job, own, facts, settings)
            if len(status.world.ranks) < desired
            else None,
            move=move[0] if move else None,
        ),
        settings.policy,
    )
    return _act(
        job,
        progress=obs.progress,
        facts=facts,
        impossible=impossible,
        inventory=own,
        decision=decision,
        placement=placement,
        backoff_left=backoff_left,
        settings=settings,
        now=now,
    )


def _impossible(job: TrainingJob, nodes: Sequence[JsonDict]) -> str | None:
    """Why waiting cannot help (no node of an allowed GPU type at all), or ``None``.

    A job whose types exist but whose GPUs are all taken, or that asks for more GPUs than
    exist, is admitted and waits Degraded: capacity may come (nodes added, jobs finishing,
    other elastic jobs giving back). One asking for a type the cluster has no node of is not
    admitted until such a node appears.
    """
    return type_mismatch(job, cluster_inventory(nodes, []))


def _act(
    job: TrainingJob,
    *,
    progress: WorkerProgress | None,
    facts: Mapping[str, PodFacts],
    impossible: str | None,
    inventory: Inventory,
    decision: ResizeDecision,
    placement: Placement,
    backoff_left: timedelta | None,
    settings: OperatorSettings,
    now: datetime,
) -> PassPlan:
    status = job.status
    events: list[EventSpec] = []
    world, plan, ranks = status.world, status.plan, status.placement
    restarts, resizes, last_resize = status.restarts, status.resizes, status.last_resize_time
    changed = False
    plan_problem: str | None = None
    if decision.world is not None:
        failure = decision.reason in FAILURE_REASONS
        if failure and restarts + 1 > job.spec.failure_policy.max_restarts:
            return _fail(
                job,
                facts,
                now,
                reason="BackoffLimitExceeded",
                message=(
                    f"{restarts + 1} restarts exceed failurePolicy.maxRestarts "
                    f"{job.spec.failure_policy.max_restarts}; last: {decision.message}"
                ),
            )
        pods: tuple[str, ...] = decision.world
        try:
            formed = _form(job, inventory, [facts[p] for p in pods])
        except UserError as err:
            plan_problem = str(err)
            # A broken world cannot go on: stop it and wait for a set of pods that can
            # train. A healthy world that cannot grow or shrink that way keeps running.
            formed, pods = None, ()
            if not failure:
                pods = tuple(world.ranks)
        if pods != tuple(world.ranks) or formed is not None:
            restarts += 1 if failure else 0
            world = WorldStatus(
                version=world.version + 1,
                size=formed.size if formed else 0,
                replicas=len(formed.order) if formed else 0,
                ranks=list(formed.order) if formed else [],
            )
            plan = formed.status if formed else plan
            ranks = _rank_placement(formed, facts)
            record = ResizeRecord(
                from_version=status.world.version,
                to_version=world.version,
                from_replicas=status.world.replicas,
                to_replicas=world.replicas,
                reason=decision.reason.value,
                time=format_time(now),
            )
            resizes = [*resizes, record][-MAX_RESIZE_HISTORY:]
            last_resize = format_time(now)
            changed = True
            warn = failure or decision.degraded or plan_problem is not None
            events.append(
                EventSpec(
                    "Warning" if warn else "Normal",
                    decision.reason.value,
                    f"world v{world.version}: {plan_problem or decision.message}",
                )
            )
    members = [facts[p] for p in world.ranks if p in facts]
    verdicts = _verdicts(
        job,
        decision=decision,
        members=members,
        facts=facts,
        impossible=impossible,
        placement=placement,
        plan_problem=plan_problem,
        world_size=len(world.ranks),
    )
    new_status = status.model_copy(
        update={
            "observed_generation": job.metadata.generation,
            "conditions": merge_conditions(
                status.conditions, verdicts, now=now, generation=job.metadata.generation or 0
            ),
            "replicas": len(world.ranks),
            "ready_replicas": sum(1 for f in members if f.view.state is WorkerState.READY),
            "selector": selector(job.metadata.name),
            "world": world,
            "plan": plan,
            "placement": ranks,
            "restarts": restarts,
            "resizes": resizes,
            "last_resize_time": last_resize,
            "progress": _progress(status, progress, version=world.version),
        }
    )
    new_status = new_status.model_copy(update={"phase": phase_of(new_status.conditions)})
    events.extend(_transition_events(status, new_status))
    children = _children(
        job,
        new_status,
        facts=facts,
        decision=decision,
        placement=placement,
        settings=settings,
        now=now,
    )
    waits = [t for t in (decision.recheck_after, backoff_left) if t is not None]
    if children.creates or children.ungate or changed:
        waits.append(timedelta(seconds=1))
    return PassPlan(
        status=new_status,
        world_changed=changed,
        events=tuple(events),
        creates=children.creates,
        patches=children.patches,
        deletes=children.deletes,
        force_deletes=tuple(p for p in children.deletes if facts[p].node_gone),
        ungate=children.ungate,
        requeue=min(waits, default=None),
        decision=decision,
    )


def _progress(
    status: TrainingJobStatus, read: WorkerProgress | None, *, version: int
) -> ProgressStatus:
    """Rank 0's report when it speaks for the current world; otherwise what was recorded."""
    if read is None or (read.world_version is not None and read.world_version != version):
        return status.progress
    return ProgressStatus(
        step=read.step,
        samples_per_second=round(read.samples_per_second),
        last_checkpoint_step=read.last_checkpoint_step,
    )


def _form(job: TrainingJob, inventory: Inventory, members: list[PodFacts]) -> WorldPlan | None:
    return plan_world(job, inventory, members) if members else None


def _rank_placement(formed: WorldPlan | None, facts: Mapping[str, PodFacts]) -> list[RankPlacement]:
    if formed is None:
        return []
    return [
        RankPlacement(
            rank=formed.first_rank[name],
            pod=name,
            node=str(facts[name].view.node or ""),
            gpu_type=formed.gpu_type[name],
        )
        for name in formed.order
    ]


def _placement(
    job: TrainingJob,
    inventory: Inventory,
    facts: Mapping[str, PodFacts],
    desired: int,
    now: datetime,
) -> tuple[Placement, timedelta | None]:
    """Where new pods could go now, unless a failure backoff holds creation back."""
    status = job.status
    last = status.resizes[-1] if status.resizes else None
    if last is not None and last.reason in {r.value for r in FAILURE_REASONS}:
        until = parse_time(last.time, now) + timedelta(
            seconds=job.spec.failure_policy.backoff_seconds
        )
        if now < until:
            return Placement(pods=()), until - now
    live = [
        f
        for f in facts.values()
        if f.view.retiring_since is None
        and f.view.state in (WorkerState.READY, WorkerState.PENDING, WorkerState.GATED)
    ]
    count = desired - len(live)
    return place_new_pods(job, inventory, keep=live, count=count, desired=desired), None


def _growth(
    job: TrainingJob,
    inventory: Inventory,
    facts: Mapping[str, PodFacts],
    settings: OperatorSettings,
) -> GrowthEstimate | None:
    """Predicted speed-up of adding the Ready standby pods to the world, if any."""
    status = job.status
    world = set(status.world.ranks)
    standby = [
        f
        for f in facts.values()
        if f.name not in world and f.view.healthy and f.view.retiring_since is None
    ]
    members = [facts[p] for p in status.world.ranks if p in facts and facts[p].view.healthy]
    if not standby or not members or status.plan is None:
        return None
    try:
        grown = plan_world(job, inventory, members + standby)
        current = plan_world(job, inventory, members)
    except UserError:
        return None
    return GrowthEstimate(
        speedup=grown.tokens_per_second / max(current.tokens_per_second, 1e-9),
        remaining_seconds=_remaining_seconds(job),
        restart_seconds=settings.restart_seconds,
    )


def _move(
    job: TrainingJob,
    inventory: Inventory,
    facts: Mapping[str, PodFacts],
    desired: int,
    settings: OperatorSettings,
) -> tuple[Move, tuple[NewPod, ...]] | None:
    """A move of a full, running world to faster GPUs, and where its new pods go, if any.

    Planned only while faster GPUs are free or a move is under way (pods outside the world),
    so a steady job on the GPUs it prefers asks the planner nothing.
    """
    status = job.status
    plan = status.plan
    ranks = status.world.ranks
    if plan is None or not ranks or len(ranks) != desired or not plan.predicted_tokens_per_second:
        return None
    members = [facts[p] for p in ranks if p in facts]
    if len(members) != len(ranks) or any(f.view.state is not WorkerState.READY for f in members):
        return None
    others = [
        f
        for f in facts.values()
        if f.name not in set(ranks)
        and f.view.retiring_since is None
        and f.view.state in (WorkerState.READY, WorkerState.PENDING, WorkerState.GATED)
    ]
    if not others and not faster_free(job, inventory, members):
        return None
    found = relocate(job, inventory, members=members, standby=others, size=desired)
    if found is None:
        return None
    gain = GrowthEstimate(
        speedup=found.tokens_per_second / plan.predicted_tokens_per_second,
        remaining_seconds=_remaining_seconds(job),
        restart_seconds=settings.restart_seconds,
    )
    move = Move(leave=frozenset(PodName(p) for p in found.leave), create=len(found.pods), gain=gain)
    return move, found.pods


def _remaining_seconds(job: TrainingJob) -> float | None:
    """The rest of the run at the recorded plan's predicted step time (``None``: no end set)."""
    total = job.spec.training.total_steps
    plan = job.status.plan
    if total is None or plan is None:
        return None
    return max(0, total - job.status.progress.step) * plan.predicted_step_millis / 1000


@dataclass(frozen=True)
class _Children:
    creates: tuple[dict[str, Any], ...]
    patches: tuple[tuple[str, dict[str, Any]], ...]
    deletes: tuple[str, ...]
    ungate: tuple[str, ...]


def _children(
    job: TrainingJob,
    status: TrainingJobStatus,
    *,
    facts: Mapping[str, PodFacts],
    decision: ResizeDecision,
    placement: Placement,
    settings: OperatorSettings,
    now: datetime,
) -> _Children:
    """Pod writes that make the children match the world recorded in ``status``."""
    version = status.world.version
    stuck = {n for n, f in facts.items() if f.node_gone and f.view.state is WorkerState.TERMINATING}
    deletes = sorted({p for p in decision.delete if p in facts} | stuck)
    patches: list[tuple[str, dict[str, Any]]] = []
    for name, fact in sorted(facts.items()):
        if name in decision.delete or fact.view.state is WorkerState.TERMINATING:
            continue
        retiring = fact.view.retiring_since is not None or name in decision.retire
        wanted = _assignment(job, status, name, facts, retiring=retiring, settings=settings)
        if wanted == fact.assignment and (fact.view.retiring_since is not None or not retiring):
            continue
        annotations = {ANNOTATION_ASSIGNMENT: wanted}
        if retiring and fact.view.retiring_since is None:
            annotations[ANNOTATION_RETIRED] = format_time(now)
        patches.append(
            (
                name,
                {"metadata": {"annotations": annotations, "labels": {LABEL_WORLD: str(version)}}},
            )
        )
    used = {f.view.slot for f in facts.values()}
    free_slots = (s for s in range(1 << 20) if s not in used)
    creates = tuple(
        worker_pod(
            job,
            slot=(slot := next(free_slots)),
            node=new.node,
            gpu_type=new.gpu_type,
            assignment=_assignment(
                job,
                status,
                pod_name(job.metadata.name, slot),
                facts,
                retiring=False,
                settings=settings,
            ),
            version=version,
            settings=settings,
        )
        for new in placement.pods[: decision.create]
    )
    gated = [name for name, f in facts.items() if f.gated and name not in decision.delete]
    # Gang admission: the batch is created gated and ungated only after every create of the
    # pass returned (the reconciler stops at the first failed create), so a batch that fails
    # halfway never holds GPUs, and one that succeeds needs no second pass to start.
    ungate = tuple(sorted([*gated, *(str(p["metadata"]["name"]) for p in creates)]))
    return _Children(creates=creates, patches=tuple(patches), deletes=tuple(deletes), ungate=ungate)


def _assignment(
    job: TrainingJob,
    status: TrainingJobStatus,
    name: str,
    facts: Mapping[str, PodFacts],
    *,
    retiring: bool,
    settings: OperatorSettings,
) -> str:
    world = status.world
    rank: RankSpec | None = None
    if not retiring and name in world.ranks and status.plan is not None:
        first = {p.pod: p.rank for p in status.placement}
        leader = next((p.pod for p in status.placement if p.rank == 0), world.ranks[0])
        leader_fact = facts.get(leader)
        address = (leader_fact.ip if leader_fact else None) or (
            f"{leader}.{job.metadata.name}.{job.metadata.namespace}.svc"
        )
        plan = status.plan
        rank = RankSpec(
            rank=first.get(name, 0),
            world_size=world.size,
            master_addr=address,
            plan=Plan(
                dp=plan.dp,
                tp=plan.tp,
                pp=plan.pp,
                micro_batch_size=plan.micro_batch_size,
                batch_shares=tuple(plan.dp_shares),
            ),
        )
    return assignment_json(job, version=world.version, rank=rank, stop=retiring, settings=settings)


def _verdicts(
    job: TrainingJob,
    *,
    decision: ResizeDecision,
    members: list[PodFacts],
    facts: Mapping[str, PodFacts],
    impossible: str | None,
    placement: Placement,
    plan_problem: str | None,
    world_size: int,
) -> list[Verdict]:
    live = [f for f in facts.values() if f.view.retiring_since is None and not f.view.broken]
    unbound = [f for f in live if not f.bound]
    running = bool(members) and all(f.view.state is WorkerState.READY for f in members)
    unplaceable = impossible is not None
    placed_reason, placed_message = "Placed", f"{len(live) - len(unbound)} of {len(live)} bound"
    if unplaceable:
        placed_reason, placed_message = "Unplaceable", str(impossible)
    elif not live and placement.reason:
        placed_reason, placed_message = "InsufficientCapacity", placement.reason
    elif unbound:
        placed_reason = "Unschedulable" if any(f.view.unschedulable for f in unbound) else "Binding"
    # Short of workers, not merely forming: a job whose pods all exist but are not Ready or
    # not in the world yet is starting or growing, which is no reason for a Warning.
    short = (
        world_size < job.spec.replicas
        and len(live) < job.spec.replicas
        and (placement.limited or placement.target is None)
    )
    degraded = not unplaceable and (decision.degraded or plan_problem is not None or short)
    degraded_message = plan_problem or decision.message
    if not decision.degraded and plan_problem is None and short:
        degraded_message = f"world has {world_size} of {job.spec.replicas} desired workers"
    return [
        Verdict(
            ConditionType.ADMITTED,
            not unplaceable,
            "Unplaceable" if unplaceable else "Planned",
            str(impossible) if unplaceable else "the planner found a plan",
        ),
        Verdict(ConditionType.PLACED, bool(live) and not unbound, placed_reason, placed_message),
        Verdict(
            ConditionType.RUNNING,
            running,
            "WorldRunning" if running else "NotRunning",
            f"{world_size} workers in the world" if running else decision.message,
        ),
        Verdict(
            ConditionType.RESIZING,
            decision.resizes,
            decision.reason.value if decision.resizes else "Steady",
            decision.message if decision.resizes else "",
        ),
        Verdict(
            ConditionType.DEGRADED,
            degraded and not job.spec.suspend,
            (decision.reason.value if decision.degraded else "BelowDesired")
            if degraded
            else "AtDesired",
            degraded_message if degraded else "",
        ),
        Verdict(
            ConditionType.SUSPENDED,
            job.spec.suspend,
            "Suspended" if job.spec.suspend else "Active",
            "spec.suspend is true" if job.spec.suspend else "",
        ),
        Verdict(
            ConditionType.SUCCEEDED,
            decision.completed,
            "AllWorkersSucceeded" if decision.completed else "NotFinished",
            decision.message if decision.completed else "",
        ),
    ]


WARN_WHEN_TRUE = frozenset({ConditionType.DEGRADED, ConditionType.FAILED})
WARN_WHEN_FALSE = frozenset({ConditionType.ADMITTED})


def _transition_events(before: TrainingJobStatus, after: TrainingJobStatus) -> list[EventSpec]:
    """An Event for each condition that flipped (world changes have their own Event)."""
    old = {c.type: c.status for c in before.conditions}
    events = []
    for cond in after.conditions:
        previous = old.get(cond.type)
        if previous == cond.status or cond.type is ConditionType.RESIZING:
            continue
        true = cond.status == "True"
        warn = (cond.type in WARN_WHEN_TRUE and true) or (cond.type in WARN_WHEN_FALSE and not true)
        if previous is None and not true and not warn:
            continue
        events.append(
            EventSpec("Warning" if warn else "Normal", cond.reason, cond.message or cond.reason)
        )
    return events


def _terminal(job: TrainingJob, facts: Mapping[str, PodFacts]) -> PassPlan:
    failed = is_true(job.status, ConditionType.FAILED)
    alive = (WorkerState.READY, WorkerState.PENDING, WorkerState.GATED)
    deletes = tuple(sorted(n for n, f in facts.items() if failed and f.view.state in alive))
    return PassPlan(status=job.status, deletes=deletes)


def _fail(
    job: TrainingJob,
    facts: Mapping[str, PodFacts],
    now: datetime,
    *,
    reason: str,
    message: str,
) -> PassPlan:
    """End the job Failed: record why, stop what still runs (its checkpoints stay)."""
    status = job.status
    verdicts = [Verdict(ConditionType.FAILED, True, reason, message)]
    verdicts += [
        Verdict(c.type, False, "JobFailed", message)
        for c in status.conditions
        if c.type in (ConditionType.RUNNING, ConditionType.RESIZING)
    ]
    kept = [c for c in status.conditions if c.type not in {v.type for v in verdicts}]
    conditions = [
        *kept,
        *merge_conditions(
            status.conditions, verdicts, now=now, generation=job.metadata.generation or 0
        ),
    ]
    failed = status.model_copy(
        update={"conditions": conditions, "observed_generation": job.metadata.generation}
    )
    failed = failed.model_copy(update={"phase": phase_of(failed.conditions)})
    alive = (WorkerState.READY, WorkerState.PENDING, WorkerState.GATED)
    return PassPlan(
        status=failed,
        events=(EventSpec("Warning", reason, message),),
        deletes=tuple(sorted(n for n, f in facts.items() if f.view.state in alive)),
    )
