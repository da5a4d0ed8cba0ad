"""One reconcile pass, decided: from what exists to what to write, as data.

``plan_pass`` is pure. It takes the job, its pods, the nodes and the cluster's pods, asks the
resize policy and the planner, and returns a ``PassWrites``: the status to record, the events
to emit, and the pod creates, patches and deletes that make the children match the recorded
world. The reconciler applies it; tests read it like a transcript.

Order of effects (level-triggered): a new world is recorded in status (with a resourceVersion
precondition, so two operators cannot both bump the version) before any pod acts on it:
assignments are patched and gates removed only after the status write. A first world's new
pods are created gated, carrying their ranks (two writes per pod: the create and the gate's
removal), and the status is written together with the batch's last (ungated) create. A pass
interrupted anywhere is repaired by the next, which derives the same assignments from the
recorded world (or forms the world of the gated pods it finds, or creates a member of a world
not yet started whose create failed).

The steps of a pass, top to bottom: the job's pods reduced to facts; a job that ended stays
ended, and one past its deadline with no pods fails. Otherwise (``_running``) a permanent
failure fails it; one ``planning.JobPlanner`` (the job's requirements derived once, each set
of pods planned once) says where new pods could go; ``sharing`` says how many workers the job
may have; a full world may move to faster GPUs; the resize policy decides; and ``_act``
records the world it decided (``_record_world``), reports the conditions (``verdicts``) and
writes the pods (``children``). ``_settle`` then adds the job's clock and its Kueue Workload,
and ``_pace`` holds back a status that only counts pods, written moments ago (``pacing``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from elastra.api import (
    CapacityRequestState,
    Condition,
    ConditionStatus,
    ConditionType,
    Phase,
    PodPlacementStatus,
    ProgressStatus,
    ResizeRecord,
    TrainingJob,
    TrainingJobStatus,
    WorldStatus,
)
from elastra.api.reasons import FAILURE_REASONS, Reason
from elastra.controller.decide import admission, capacity_requests, lifetime, sharing
from elastra.controller.decide.admission import Gate, Hold
from elastra.controller.decide.capacity import cluster_inventory
from elastra.controller.decide.capacity_requests import Requests, Want, read_placeholders
from elastra.controller.decide.children import children, planned_pods
from elastra.controller.decide.conditions import (
    condition,
    is_true,
    merge_conditions,
    phase_of,
)
from elastra.controller.decide.manifests import selector, worker_constraints, worker_pod
from elastra.controller.decide.observe import (
    PodFacts,
    WorkerProgress,
    format_time,
    newest_node,
    node_health,
    parse_time,
    pod_facts,
)
from elastra.controller.decide.pacing import status_wait
from elastra.controller.decide.placeholders import capacity_request_pod
from elastra.controller.decide.planning import (
    JobPlanner,
    NewPod,
    Placement,
    RankedWorld,
    micro_batch_note,
    type_mismatch,
)
from elastra.controller.decide.verdicts import Findings, failure, running_verdicts
from elastra.controller.settings import OperatorSettings
from elastra.elastic.resize import (
    GrowthEstimate,
    Move,
    ResizeDecision,
    ResizeInput,
    decide,
)
from elastra.elastic.share import NO_CLASSES, Priorities
from elastra.elastic.workers import NodeName, PodName, WorkerState, WorkerView
from elastra.errors import UserError
from elastra.planner.scheduling import PodConstraints
from elastra.requeue import Requeue

JsonDict = Mapping[str, Any]
MAX_RESIZE_HISTORY = 20


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
    priorities: Priorities = NO_CLASSES
    """The cluster's PriorityClass values, for sharing."""
    workload: JsonDict | None = None
    """The job's Kueue Workload, read only for a job with the queue-name label."""
    status_written: datetime | None = None
    """When this operator last wrote the job's status (see ``pacing``)."""
    requests: Sequence[JsonDict] = ()
    """The job's capacity-request pods (``placeholders``), and those being created."""


class EventType(StrEnum):
    """Kubernetes' two Event types."""

    NORMAL = "Normal"
    WARNING = "Warning"


@dataclass(frozen=True)
class EventSpec:
    """A Kubernetes Event to record on the job."""

    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class PassWrites:
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
    requeue: Requeue = Requeue.NEVER
    status_wait: timedelta | None = None
    """The status differs from the stored one only in counts: it is written by the pass this
    long from now, not by this one (see ``pacing``)."""
    decision: ResizeDecision | None = field(default=None, compare=False)
    workload_create: dict[str, Any] | None = None
    """The job's Kueue Workload to create (after the status write)."""
    workload_delete: str | None = None
    """The job's Kueue Workload to delete: finished, evicted and stopped, or resized."""
    delete_job: bool = False
    """Delete the TrainingJob itself: ttlSecondsAfterFinished has passed."""
    request_creates: tuple[dict[str, Any], ...] = ()
    """Capacity-request pods to create (``capacity_requests``), with the pass's first writes."""
    request_deletes: tuple[str, ...] = ()
    """Capacity-request pods to delete, without grace, with the pass's first writes: the
    workers this pass creates on their nodes need their room."""


def plan_pass(obs: Observation, settings: OperatorSettings, now: datetime) -> PassWrites:
    """Decide this pass (see the module docstring)."""
    job = obs.job
    facts = _facts(obs, now)
    gate = admission.read_gate(job, obs.workload)
    late = lifetime.deadline(job, job.status.start_time, now)
    if is_true(job.status, ConditionType.FAILED) or is_true(job.status, ConditionType.SUCCEEDED):
        plan = _terminal(job, facts)
    elif late.exceeded and not facts:
        plan = _fail(job, facts, now, reason=Reason.DEADLINE_EXCEEDED, message=late.message)
    else:
        hold = _hold(job, gate, late)
        plan = _running(obs, facts, gate=gate, hold=hold, settings=settings, now=now)
    plan = _settle(plan, obs, gate=gate, has_pods=bool(facts), settings=settings, now=now)
    return _pace(_ended(plan, obs, now=now), obs, now)


def _facts(obs: Observation, now: datetime) -> dict[str, PodFacts]:
    """The job's pods, by name, reduced to what a pass uses."""
    health = node_health(obs.nodes)
    found = (pod_facts(p, health, now=now, lost_nodes=obs.lost_nodes) for p in obs.pods)
    return {str(f.name): f for f in found}


def _hold(job: TrainingJob, gate: Gate | None, late: lifetime.Deadline) -> Hold | None:
    """What keeps the job from running: admission's hold, else a passed deadline."""
    hold = admission.hold_of(job, gate)
    if hold is None and late.exceeded:
        return Hold(Reason.DEADLINE_EXCEEDED, late.message + "; every worker checkpoints and stops")
    return hold


@dataclass(frozen=True)
class _Pass:
    """What every step of a running pass reads: the job (capped to what Kueue admitted), its
    pods, the planner on the capacity it could have, and the pass's settings and clock."""

    job: TrainingJob
    facts: Mapping[str, PodFacts]
    planner: JobPlanner
    settings: OperatorSettings
    now: datetime
    hold: Hold | None
    note: tuple[str, str] | None
    """Admission's word for the Admitted condition (see ``admission.admitted_note``)."""
    progress: WorkerProgress | None
    node_lost_at: datetime | None
    """When a node was last seen deleted (``ResizeInput.node_lost_at``)."""


def _own_node_lost_at(
    job: TrainingJob, facts: Mapping[str, PodFacts], lost_nodes: Mapping[str, datetime]
) -> datetime | None:
    """When a node this job's pods run or ran on was last seen deleted: its world's placement
    (a vanished pod's node is known only there) and its pods' nodes. Another job's node going
    away is no break of this job's world and must not hold its resize back."""
    nodes = {p.node for p in job.status.placement}
    nodes.update(f.view.node for f in facts.values() if f.view.node)
    return max((t for n, t in lost_nodes.items() if n in nodes), default=None)


def _running(
    obs: Observation,
    facts: Mapping[str, PodFacts],
    *,
    gate: Gate | None,
    hold: Hold | None,
    settings: OperatorSettings,
    now: datetime,
) -> PassWrites:
    """A pass over a job that has not ended: fail it, or resize and place its workers.

    Steps: a permanent failure ends the job; otherwise find where new pods could go, how many
    workers the job may have now (``sharing``), whether a full world should move to faster
    GPUs, ask the resize policy, and act on its decision.
    """
    job = admission.capped(obs.job, gate)
    permanent = _permanent_failure(job, facts)
    if permanent is not None:
        return _fail(job, facts, now, reason=Reason.PERMANENT_FAILURE, message=permanent)
    constraints = worker_constraints(job, settings)
    inventory = cluster_inventory(
        obs.nodes, obs.cluster_pods, own_job=f"{job.metadata.namespace}/{job.metadata.name}",
        extra=obs.reserved,
        pod=constraints,
    )  # fmt: skip
    ctx = _Pass(
        job=job,
        facts=facts,
        planner=JobPlanner(job, inventory),
        settings=settings,
        now=now,
        hold=hold,
        note=admission.admitted_note(obs.job, gate),
        progress=obs.progress,
        node_lost_at=_own_node_lost_at(job, facts, obs.lost_nodes),
    )
    placement, backoff_left = _placement(ctx)
    impossible = (
        _impossible(job, obs.nodes, constraints=constraints)
        if placement.reason and not facts
        else None
    )
    desired = sharing.desired(
        job,
        facts,
        obs.jobs,
        obs.cluster_pods,
        free=sharing.free_for_starved((p.node for p in placement.pods), facts),
        reserved=obs.reserved,
        priorities=obs.priorities,
        scope=settings.sharing,
    )
    move = _move(ctx, desired) if not placement.pods else None
    if move is not None:
        placement = Placement(pods=move[1], target=placement.target)
    decision = decide(_resize_input(ctx, desired, placement, move), settings.policy)
    requests = _requests(
        ctx, obs, decision=decision, placement=placement, desired=desired, backoff=backoff_left
    )
    return _act(
        ctx,
        decision,
        placement,
        impossible=impossible,
        backoff_left=backoff_left,
        requests=requests,
    )


def _permanent_failure(job: TrainingJob, facts: Mapping[str, PodFacts]) -> str | None:
    """Why the job cannot go on: a world member exited with a permanent code, and the one line
    it left as its termination message (or ``None``)."""
    codes = job.spec.failure_policy.permanent_exit_codes
    for name in job.status.world.ranks:
        fact = facts.get(name)
        if fact is not None and fact.view.state is WorkerState.FAILED and fact.exit_code in codes:
            why = f": {fact.exit_message}" if fact.exit_message else ""
            return f"worker {fact.name} exited with permanent code {fact.exit_code}{why}"
    return None


def _resize_input(
    ctx: _Pass,
    desired: int,
    placement: Placement,
    move: tuple[Move, tuple[NewPod, ...]] | None,
) -> ResizeInput:
    """What the resize policy decides from."""
    status = ctx.job.status
    last = status.last_resize_time
    return ResizeInput(
        desired=desired,
        minimum=ctx.job.spec.min_replicas,
        world=tuple(PodName(p) for p in status.world.ranks),
        workers=tuple(f.view for f in ctx.facts.values()),
        placeable=len(placement.pods),
        now=ctx.now,
        last_resize=parse_time(last, ctx.now) if last else None,
        last_reason=_last_reason(status.resizes),
        suspended=ctx.hold is not None,
        growth=_growth(ctx) if len(status.world.ranks) < desired else None,
        move=move[0] if move else None,
        node_lost_at=ctx.node_lost_at,
    )


def _last_reason(resizes: Sequence[ResizeRecord]) -> Reason | None:
    """The newest resize's reason, if it is one of ours (a record from another version of the
    operator may carry any text)."""
    if not resizes:
        return None
    try:
        return Reason(resizes[-1].reason)
    except ValueError:
        return None


def _act(
    ctx: _Pass,
    decision: ResizeDecision,
    placement: Placement,
    *,
    impossible: str | None,
    backoff_left: timedelta | None,
    requests: Requests,
) -> PassWrites:
    """Carry out the decision: record its world, report the conditions, write the pods and
    the job's capacity requests."""
    job = ctx.job
    if _restarts_exhausted(job, decision):
        return _fail(
            job,
            ctx.facts,
            ctx.now,
            reason=Reason.BACKOFF_LIMIT_EXCEEDED,
            message=(
                f"{job.status.restarts + 1} restarts exceed failurePolicy.maxRestarts "
                f"{job.spec.failure_policy.max_restarts}; last: {decision.message}"
            ),
        )
    step = _record_world(ctx, decision, placement)
    status = _report(ctx, step, decision, placement, impossible=impossible, requests=requests)
    pods = children(
        job,
        status,
        facts=ctx.facts,
        decision=decision,
        placement=placement,
        settings=ctx.settings,
        now=ctx.now,
    )
    soon = timedelta(seconds=1) if pods.creates or pods.ungate or step.changed else None
    transitions = _transition_events(job.status, status)
    return PassWrites(
        status=status,
        world_changed=step.changed,
        events=(*step.events, *transitions, *_withdrawn(requests, transitions)),
        creates=pods.creates,
        patches=pods.patches,
        deletes=pods.deletes,
        force_deletes=tuple(p for p in pods.deletes if ctx.facts[p].node_gone),
        ungate=pods.ungate,
        requeue=min(decision.recheck_after, Requeue.earliest(backoff_left, requests.recheck, soon)),
        decision=decision,
        request_creates=tuple(
            capacity_request_pod(job, index=i, settings=ctx.settings) for i in requests.create
        ),
        request_deletes=requests.delete,
    )


def _withdrawn(requests: Requests, said: Sequence[EventSpec]) -> tuple[EventSpec, ...]:
    """The Warning of a capacity request withdrawn unanswered, unless a condition's Event of
    the pass says it already (Admitted turning False for a type no node has)."""
    if requests.event is None or any(requests.event in e.message for e in said):
        return ()
    return (EventSpec(EventType.WARNING, Reason.CAPACITY_UNSATISFIED, requests.event),)


def _restarts_exhausted(job: TrainingJob, decision: ResizeDecision) -> bool:
    """A world replaced for a failure would be one restart more than the policy allows."""
    replaced = decision.world is not None and decision.reason in FAILURE_REASONS
    return replaced and job.status.restarts + 1 > job.spec.failure_policy.max_restarts


@dataclass(frozen=True)
class _WorldStep:
    """The job's status with the world this pass records, and what that took."""

    status: TrainingJobStatus
    problem: str | None = None
    """Why the world the decision asked for cannot train, if it cannot."""
    events: tuple[EventSpec, ...] = ()
    """The Event of a new world; none when the world stays."""

    @property
    def changed(self) -> bool:
        """Whether a new world is recorded."""
        return bool(self.events)


def _record_world(ctx: _Pass, decision: ResizeDecision, placement: Placement) -> _WorldStep:
    """The world the decision asks for, planned and recorded with its resize, if it changes."""
    status = ctx.job.status
    if decision.world is None:
        return _WorldStep(status)
    failed = decision.reason in FAILURE_REASONS
    pods: tuple[str, ...] = decision.world
    members = {**{p: ctx.facts[p] for p in pods}, **_joining(ctx, decision, placement)}
    problem = None
    try:
        formed = _form(ctx.planner, list(members.values()))
    except UserError as err:
        problem = str(err)
        # A broken world cannot go on: stop it and wait for a set of pods that can
        # train. A healthy world that cannot grow or shrink that way keeps running.
        formed, pods = None, () if failed else tuple(status.world.ranks)
    if formed is None and pods == tuple(status.world.ranks):
        return _WorldStep(status, problem=problem)
    recorded = _with_world(ctx, formed, decision, members, failed=failed)
    warn = failed or decision.degraded or problem is not None
    message = f"world v{recorded.world.version}: {problem or decision.message}"
    if formed is not None and (note := micro_batch_note(ctx.job)):
        message += f"; {note}"
    event = EventSpec(
        EventType.WARNING if warn else EventType.NORMAL, decision.reason.value, message
    )
    return _WorldStep(recorded, problem=problem, events=(event,))


def _joining(ctx: _Pass, decision: ResizeDecision, placement: Placement) -> dict[str, PodFacts]:
    """The pods this pass creates as members of a first world, as the facts they will have:
    gated, on their planned nodes, in the slots ``children`` gives them."""
    if not decision.joins:
        return {}
    joining: dict[str, PodFacts] = {}
    for name, slot, new in planned_pods(
        ctx.job.metadata.name, ctx.facts, placement, count=decision.create
    ):
        pod = PodName(name)
        view = WorkerView(
            pod=pod,
            slot=slot,
            state=WorkerState.GATED,
            since=ctx.now,
            node=NodeName(new.node),
            gpu_type=new.gpu_type,
        )
        joining[pod] = PodFacts(
            view=view,
            raw={},
            assignment="",
            assignment_version=0,
            ip=None,
            bound=False,
            node_gone=False,
            gated=True,
            exit_code=None,
        )
    return joining


def _form(planner: JobPlanner, members: list[PodFacts]) -> RankedWorld | None:
    """How ``members`` train (``None``: no members, no world)."""
    return planner.plan_world(members) if members else None


def _with_world(
    ctx: _Pass,
    formed: RankedWorld | None,
    decision: ResizeDecision,
    members: Mapping[str, PodFacts],
    *,
    failed: bool,
) -> TrainingJobStatus:
    """The job's status with ``formed`` as its next world (none: ``None``), and the resize
    that ``decision`` made."""
    status = ctx.job.status
    old = status.world
    world = WorldStatus(
        version=old.version + 1,
        size=formed.size if formed else 0,
        replicas=len(formed.order) if formed else 0,
        ranks=list(formed.order) if formed else [],
    )
    record = ResizeRecord(
        from_version=old.version,
        to_version=world.version,
        from_replicas=old.replicas,
        to_replicas=world.replicas,
        reason=decision.reason.value,
        time=format_time(ctx.now),
        peers_lost=True if decision.peers_lost else None,
    )
    return status.model_copy(
        update={
            "world": world,
            "plan": formed.status if formed else status.plan,
            "placement": _rank_placement(formed, members),
            "restarts": status.restarts + (1 if failed else 0),
            "resizes": [*status.resizes, record][-MAX_RESIZE_HISTORY:],
            "last_resize_time": format_time(ctx.now),
        }
    )


def _rank_placement(
    formed: RankedWorld | None, facts: Mapping[str, PodFacts]
) -> list[PodPlacementStatus]:
    if formed is None:
        return []
    return [
        PodPlacementStatus(
            rank=formed.first_rank[name],
            pod=name,
            node=str(facts[name].view.node or ""),
            gpu_type=formed.gpu_type[name],
        )
        for name in formed.order
    ]


def _report(
    ctx: _Pass,
    step: _WorldStep,
    decision: ResizeDecision,
    placement: Placement,
    *,
    impossible: str | None,
    requests: Requests,
) -> TrainingJobStatus:
    """The status to write: the recorded world, its conditions, counts and progress, and the
    job's capacity request."""
    job, facts = ctx.job, ctx.facts
    impossible, note = _unplaceable(ctx, impossible, requests=requests)
    recorded = step.status
    members = [facts[p] for p in recorded.world.ranks if p in facts]
    found = Findings(
        replicas=job.spec.replicas,
        decision=decision,
        members=members,
        world_size=len(recorded.world.ranks),
        live=[f for f in facts.values() if f.view.retiring_since is None and not f.view.broken],
        creating=decision.create,
        forming=None if ctx.hold is not None else _forming(job.status, recorded, members),
        placement=placement,
        impossible=impossible,
        plan_problem=step.problem,
        hold=ctx.hold,
        note=note,
        capacity=requests.condition(),
    )
    generation = job.metadata.generation
    status = recorded.model_copy(
        update={
            "observed_generation": generation,
            "conditions": merge_conditions(
                job.status.conditions,
                running_verdicts(found),
                now=ctx.now,
                generation=generation or 0,
            ),
            "replicas": len(recorded.world.ranks),
            "ready_replicas": sum(1 for f in members if f.view.state is WorkerState.READY),
            "selector": selector(job.metadata.name),
            "progress": _progress(job.status, ctx.progress, version=recorded.world.version),
            "resizes": _with_downtime(recorded.resizes, ctx.progress),
            "capacity_request": requests.record,
        }
    )
    return status.model_copy(update={"phase": phase_of(status.conditions)})


def _unplaceable(
    ctx: _Pass, impossible: str | None, *, requests: Requests
) -> tuple[str | None, tuple[str, str] | None]:
    """Why the job is not admitted, and admission's note, with its capacity requests: a job
    whose GPU type has no node yet is admitted while the autoscaler is asked for one, and
    refused once that request went unanswered (the message says so)."""
    if impossible is None:
        return None, ctx.note
    if requests.open:
        asked = f"{impossible}; asked the cluster's autoscaler for such nodes"
        return None, ctx.note or (Reason.CAPACITY_REQUESTED, asked)
    if requests.unsatisfied and requests.record is not None:
        return f"{impossible}; {requests.record.message}", ctx.note
    return impossible, ctx.note


def _forming(
    before: TrainingJobStatus, recorded: TrainingJobStatus, members: Sequence[PodFacts]
) -> tuple[str, str] | None:
    """The reason and message of the resize still in progress: Resizing was True, the world
    is the one it recorded, and not every member of it is Ready yet."""
    resize = condition(before, ConditionType.RESIZING)
    if resize is None or resize.status != ConditionStatus.TRUE:
        return None
    if recorded.world.version != before.world.version or not recorded.world.ranks:
        return None
    ready = [f for f in members if f.view.state is WorkerState.READY]
    if len(ready) == len(recorded.world.ranks):
        return None
    return resize.reason, resize.message


def _staying(fact: PodFacts) -> bool:
    """Alive and not retiring: a pod the job keeps."""
    return fact.view.retiring_since is None and fact.view.state.alive


def _placement(ctx: _Pass) -> tuple[Placement, timedelta | None]:
    """Where new pods could go now, unless a failure backoff holds creation back."""
    backoff = _backoff_left(ctx.job, ctx.now)
    if backoff is not None:
        return Placement(pods=()), backoff
    keep = [f for f in ctx.facts.values() if _staying(f)]
    desired = ctx.job.spec.replicas
    return ctx.planner.place_new_pods(keep=keep, count=desired - len(keep), desired=desired), None


def _backoff_left(job: TrainingJob, now: datetime) -> timedelta | None:
    """How long creation waits after a resize for a failure (``failurePolicy.backoffSeconds``)."""
    last = job.status.resizes[-1] if job.status.resizes else None
    if last is None or last.reason not in FAILURE_REASONS:
        return None
    until = parse_time(last.time, now) + timedelta(seconds=job.spec.failure_policy.backoff_seconds)
    return until - now if now < until else None


def _growth(ctx: _Pass) -> GrowthEstimate | None:
    """Predicted speed-up of adding the Ready standby pods to the world, if any."""
    status, facts = ctx.job.status, ctx.facts
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
        grown = ctx.planner.plan_world(members + standby)
        current = ctx.planner.plan_world(members)
    except UserError:
        return None
    return GrowthEstimate(
        speedup=grown.tokens_per_second / max(current.tokens_per_second, 1e-9),
        remaining_seconds=_remaining_seconds(ctx.job),
        restart_seconds=ctx.settings.restart_seconds,
    )


def _move(ctx: _Pass, desired: int) -> tuple[Move, tuple[NewPod, ...]] | None:
    """A move of a full, running world to faster GPUs, and where its new pods go, if any.

    Planned only while faster GPUs are free or a move is under way (pods outside the world),
    so a steady job on the GPUs it prefers asks the planner nothing.
    """
    status = ctx.job.status
    plan, ranks = status.plan, status.world.ranks
    if plan is None or not ranks or len(ranks) != desired or not plan.predicted_tokens_per_second:
        return None
    members = [ctx.facts[p] for p in ranks if p in ctx.facts]
    if len(members) != len(ranks) or any(f.view.state is not WorkerState.READY for f in members):
        return None
    others = [f for f in ctx.facts.values() if f.name not in set(ranks) and _staying(f)]
    if not others and not ctx.planner.faster_free(members):
        return None
    found = ctx.planner.relocate(members=members, standby=others, size=desired)
    if found is None:
        return None
    gain = GrowthEstimate(
        speedup=found.tokens_per_second / plan.predicted_tokens_per_second,
        remaining_seconds=_remaining_seconds(ctx.job),
        restart_seconds=ctx.settings.restart_seconds,
    )
    move = Move(leave=frozenset(PodName(p) for p in found.leave), create=len(found.pods), gain=gain)
    return move, found.pods


def _requests(
    ctx: _Pass,
    obs: Observation,
    *,
    decision: ResizeDecision,
    placement: Placement,
    desired: int,
    backoff: timedelta | None,
) -> Requests:
    """The job's capacity requests this pass (see ``capacity_requests``); with the setting
    off, any left from when it was on go."""
    job, now = ctx.job, ctx.now
    existing = read_placeholders(job.metadata.name, obs.requests, now=now)
    if not ctx.settings.capacity_requests:
        return Requests(delete=tuple(p.name for p in existing if not p.deleting))
    gone = decision.delete | decision.retire
    kept = [f for f in ctx.facts.values() if _staying(f) and f.name not in gone]
    waiting = Counter(new.node for new in placement.pods[: decision.create])
    waiting.update(str(f.view.node) for f in kept if not f.bound and f.view.node)
    recorded = job.status.capacity_request
    unsatisfied = recorded is not None and recorded.state is CapacityRequestState.UNSATISFIED
    target = placement.target
    short = None if backoff is not None else placement.limited and not placement.unformable
    others: Counter[str] = Counter()
    if short or existing:  # only a job that asks, or may, reads whose workers wait where
        namespace = job.metadata.namespace or ""
        others = capacity_requests.contested(
            obs.cluster_pods, obs.reserved, namespace=namespace, job=job.metadata.name
        )
    usable = {str(n.name) for n in ctx.planner.inventory.nodes} if others else set()
    want = Want(
        desired=desired,
        have=len(kept) + decision.create,
        short=short,
        prefers_fewer=target is not None and not placement.limited and target < desired,
        held=ctx.hold is not None or decision.completed,
        waiting=waiting,
        contested=others,
        hold_new=any(node in usable for node in others),
        generation=job.metadata.generation or 0,
        newest_node=newest_node(obs.nodes) if unsatisfied else None,
    )
    timeout = ctx.settings.capacity_request_timeout
    return capacity_requests.decide(want, existing, recorded=recorded, timeout=timeout, now=now)


def _ended(plan: PassWrites, obs: Observation, *, now: datetime) -> PassWrites:
    """A job that ended asks for no nodes: its capacity requests go, and so does their record."""
    if plan.status.phase not in (Phase.SUCCEEDED, Phase.FAILED):
        return plan
    existing = read_placeholders(obs.job.metadata.name, obs.requests, now=now)
    status = plan.status
    if status.capacity_request is not None:
        status = status.model_copy(update={"capacity_request": None})
    return replace(
        plan,
        status=status,
        request_creates=(),
        request_deletes=tuple(p.name for p in existing if not p.deleting),
    )


def _settle(
    plan: PassWrites,
    obs: Observation,
    *,
    gate: Gate | None,
    has_pods: bool,
    settings: OperatorSettings,
    now: datetime,
) -> PassWrites:
    """Add what the job's clock and its Kueue Workload ask of this pass to ``plan``.

    Start and completion times go into status (see ``lifetime``); a job that is due for
    deletion or has a deadline ahead asks for a pass then; the Workload is created, or
    deleted once it has served (see ``admission.workload_action``).
    """
    job, status = obs.job, plan.status
    finished = status.phase in (Phase.SUCCEEDED, Phase.FAILED)
    suspended = next((c for c in status.conditions if c.type is ConditionType.SUSPENDED), None)
    held = (
        suspended is not None
        and suspended.status == "True"
        and suspended.reason != Reason.DEADLINE_EXCEEDED
    )
    started = status.start_time if finished else lifetime.start_time(status, held=held, now=now)
    completed = lifetime.completion_time(status, finished=finished, now=now)
    admitted = gate.admitted if gate is not None and not finished else None
    status = status.model_copy(
        update={"start_time": started, "completion_time": completed, "admitted_replicas": admitted}
    )
    expiry = lifetime.expiry(job, completed, now)
    late = lifetime.deadline(job, started, now) if not finished else None
    needs_pod = gate is not None and gate.requested is None and not finished
    action = admission.workload_action(
        job,
        gate,
        pod=_template_pod(job, settings) if needs_pod else {},
        has_pods=has_pods,
        finished=finished,
    )
    return replace(
        plan,
        status=status,
        workload_create=action.create,
        workload_delete=action.delete,
        delete_job=expiry.delete,
        requeue=min(plan.requeue, Requeue.earliest(late.left if late else None, expiry.left)),
    )


def _pace(plan: PassWrites, obs: Observation, now: datetime) -> PassWrites:
    """Hold back a status that only reports progress, written moments ago (see ``pacing``).

    Not when the pass has Events: they come from the same change of status, and the next pass
    would find it again in the stored status and record them twice.
    """
    if plan.events:
        return plan
    wait = status_wait(obs.job.status, plan.status, written=obs.status_written, now=now)
    if wait is None:
        return plan
    return replace(plan, status_wait=wait, requeue=min(plan.requeue, Requeue.after(wait)))


def _template_pod(job: TrainingJob, settings: OperatorSettings) -> dict[str, Any]:
    """A worker pod as the job's pods will be, for the Workload's podSet (resources, priority)."""
    return worker_pod(
        job, slot=0, node="", gpu_type="", assignment="", version=0, settings=settings
    )


def _impossible(
    job: TrainingJob, nodes: Sequence[JsonDict], *, constraints: PodConstraints
) -> str | None:
    """Why waiting cannot help (no node of an allowed GPU type among the nodes the job's pods
    may use), or ``None``.

    A job whose types exist but whose GPUs are all taken, or that asks for more GPUs than
    exist, is admitted and waits Degraded: capacity may come (nodes added, jobs finishing,
    other elastic jobs giving back). One asking for a type the cluster has no node of is not
    admitted until such a node appears.
    """
    return type_mismatch(job, cluster_inventory(nodes, [], pod=constraints))


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
        goodput_percent=None if read.goodput is None else round(read.goodput * 100),
    )


def _with_downtime(resizes: list[ResizeRecord], read: WorkerProgress | None) -> list[ResizeRecord]:
    """The last resize with the downtime its new world's rank 0 reported, once."""
    if not resizes or read is None or read.resize_downtime_s is None:
        return resizes
    last = resizes[-1]
    if last.downtime_millis is not None or read.world_version != last.to_version:
        return resizes
    measured = last.model_copy(
        update={
            "downtime_millis": round(read.resize_downtime_s * 1000),
            "state_from": read.state_from,
        }
    )
    return [*resizes[:-1], measured]


def _remaining_seconds(job: TrainingJob) -> float | None:
    """The rest of the run at the plan's predicted step time (``None``: no end set, or a CPU job).

    The performance model is calibrated for GPUs; for a CPU job it put a tiny model's step at
    11 ms against about 1 s measured, so a scaled-up CPU job was judged not worth growing, and
    its new pods were deleted and created again on every pass. A CPU job's rest is unknown,
    which the policy takes as long (an explicit scale-up then grows).
    """
    total = job.spec.training.total_steps
    plan = job.status.plan
    if total is None or plan is None or job.spec.worker.gpus == 0:
        return None
    return max(0, total - job.status.progress.step) * plan.predicted_step_millis / 1000


WARN_WHEN_TRUE = frozenset({ConditionType.DEGRADED, ConditionType.FAILED})
WARN_WHEN_FALSE = frozenset({ConditionType.ADMITTED})
PROGRESS = frozenset({ConditionType.ADMITTED, ConditionType.PLACED, ConditionType.RUNNING})
"""Conditions whose turning True on the way to a running world is no news: the conditions
show it, and the world's own Event says that it formed (an Event is a request per job)."""


def _warns(condition: Condition) -> bool:
    true = condition.status == "True"
    return (condition.type in WARN_WHEN_TRUE and true) or (
        condition.type in WARN_WHEN_FALSE and not true
    )


def _transition_events(before: TrainingJobStatus, after: TrainingJobStatus) -> list[EventSpec]:
    """An Event for each condition that flipped, and for a warning condition that stays true
    for a new reason (world changes have their own Event). Progress toward a running world
    (``PROGRESS``) makes an Event only when it clears a warning."""
    old = {c.type: c for c in before.conditions}
    events = []
    for cond in after.conditions:
        prior = old.get(cond.type)
        previous = prior.status if prior is not None else None
        true = cond.status == "True"
        new_reason = (
            prior is not None
            and prior.reason != cond.reason
            and true
            and cond.type in WARN_WHEN_TRUE
        )
        if (previous == cond.status and not new_reason) or cond.type is ConditionType.RESIZING:
            continue
        warn = _warns(cond)
        if previous is None and not true and not warn:
            continue
        cleared = prior is not None and _warns(prior)
        if cond.type in PROGRESS and not warn and not cleared:
            continue
        events.append(
            EventSpec(
                EventType.WARNING if warn else EventType.NORMAL,
                cond.reason,
                cond.message or cond.reason,
            )
        )
    return events


def _terminal(job: TrainingJob, facts: Mapping[str, PodFacts]) -> PassWrites:
    """A job that ended: a failed one keeps stopping what still runs; nothing else changes."""
    failed = is_true(job.status, ConditionType.FAILED)
    deletes = tuple(sorted(n for n, f in facts.items() if failed and f.view.state.alive))
    return PassWrites(status=job.status, deletes=deletes)


def _fail(
    job: TrainingJob,
    facts: Mapping[str, PodFacts],
    now: datetime,
    *,
    reason: str,
    message: str,
) -> PassWrites:
    """End the job Failed: record why, stop what still runs (its checkpoints stay)."""
    status = job.status
    verdicts = failure(status.conditions, reason, message)
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
    return PassWrites(
        status=failed,
        events=(EventSpec(EventType.WARNING, reason, message),),
        deletes=tuple(sorted(n for n, f in facts.items() if f.view.state.alive)),
    )
