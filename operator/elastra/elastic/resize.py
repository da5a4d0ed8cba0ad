"""The resize policy: keep the world, or form a new one of which pods, and why.

A pure function of the spec's bounds, the current world, the state of every worker pod, the
free capacity and an injected clock, so cooldowns are tested exactly. The controller calls it
on every pass and applies what it returns; because it re-derives everything from the observed
state, a pass repeated after a crash decides the same thing.

The shape of the protocol it drives (docs/architecture.md, "Assignment protocol"):
- A job's first world is formed as its pods are created: each pod is created (gated) already
  carrying its rank, so forming it costs two writes per pod (the create and the gate's
  removal). The gang gate keeps a half-created world from holding GPUs, and a member the
  scheduler cannot place within the grace period is deleted, which forms a new world without it.
  A member whose create failed is created again while the world has not started.
- Once a world runs, new pods are created as *standby* (in no world) and join only when
  Ready, so a running world never stops to wait on an image pull.
- A world is a set of pods and a version; forming a new one is the only way membership
  changes, and the version only grows.
- Broken workers (failed, lost, terminating) are dropped at once, after a short settle window
  that folds a burst of failures (a rack going away) into one resize.
- A member that was placed but does not start (an image that cannot be pulled, a volume that
  does not mount) is dropped once a running member of its world has waited ``join_timeout``
  for it, before that member's rendezvous gives up. While no member runs, nobody waits and the
  world keeps waiting too (a slow image pull on every node is not a failure).
- Shrinking is immediate; growing waits for the new pods to be Ready, for a cooldown since
  the last resize (not after a scale-down: the desired size was raised since, which is no
  capacity flapping), and for the predicted gain to beat the restart cost.
- Never above the desired size, never below ``minimum``: with fewer healthy pods the job
  forms no world and waits (Degraded), keeping its checkpoints.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from elastra.api.reasons import Reason
from elastra.elastic.workers import PodName, WorkerState, WorkerView
from elastra.requeue import Requeue


@dataclass(frozen=True)
class ResizePolicy:
    """Tunables of the policy; defaults suit real clusters, tests pass smaller ones."""

    settle: timedelta = timedelta(seconds=2)
    """After a worker breaks, wait this long for others of the same burst."""
    pending_grace: timedelta = timedelta(seconds=60)
    """A pod pending (unschedulable) longer than this is given up and deleted."""
    cooldown: timedelta = timedelta(seconds=30)
    """No growth within this time of the previous resize."""
    retire_timeout: timedelta = timedelta(seconds=120)
    """A pod told to checkpoint and stop is deleted after this even if it did not exit."""
    join_timeout: timedelta = timedelta(seconds=240)
    """A member still starting this long after a running member of its world began waiting
    for it is dropped: below the workers' rendezvous timeout (300 s), so the running members
    move to a world without it instead of timing out and failing."""


@dataclass(frozen=True)
class GrowthEstimate:
    """The planner's view of growing: is the restart worth it?

    ``speedup`` is predicted throughput at the grown size over the current one;
    ``remaining_seconds`` the predicted rest of the run at the current size (``None``:
    unknown, treated as long); ``restart_seconds`` what a resize costs (stop, checkpoint,
    restart, load).
    """

    speedup: float
    remaining_seconds: float | None
    restart_seconds: float

    def worth_it(self) -> bool:
        """True when the time saved over the rest of the run exceeds the restart cost."""
        if self.speedup <= 1.0:
            return False
        if self.remaining_seconds is None:
            return True
        saved = self.remaining_seconds * (1.0 - 1.0 / self.speedup)
        return saved > self.restart_seconds


@dataclass(frozen=True)
class Move:
    """A better plan of the world's size on other GPUs (faster ones were freed).

    ``create`` new pods go where the better plan wants them; once they are Ready they join
    and ``leave`` (members the better plan does not use) retire. ``gain`` compares the better
    plan with the running one, so a move happens only when it beats the restart it costs.
    """

    leave: frozenset[PodName]
    create: int
    gain: GrowthEstimate


@dataclass(frozen=True)
class ResizeInput:
    """Everything the policy decides on."""

    desired: int
    minimum: int
    world: tuple[PodName, ...]
    workers: tuple[WorkerView, ...]
    placeable: int
    """How many more pods free capacity admits right now."""
    now: datetime
    last_resize: datetime | None = None
    last_reason: Reason | None = None
    """Why the last resize was made (``status.resizes``' newest): after a scale-down the world
    matched the desired size, so a grow since is one the user (or an HPA) asked for."""
    suspended: bool = False
    growth: GrowthEstimate | None = None
    move: Move | None = None
    node_lost_at: datetime | None = None
    """When the operator last saw a node deleted. A deleted node's pods may vanish (the pod
    garbage collector removes them) before the other nodes of the same rack are deleted, and
    a vanished pod has no time of its own: the settle window counts from this too."""


@dataclass(frozen=True)
class ResizeDecision:
    """What to do: ``world`` is the new world's pods in rank order, or ``None`` to keep it.

    ``create`` standby pods are to be placed by the planner; ``delete`` pods are gone for
    good; ``retire`` pods leave the world and must checkpoint before they are deleted.
    ``recheck_after`` says when the decision may change with no new event (settle window,
    grace period, cooldown expiring), so the controller can look again then.
    """

    world: tuple[PodName, ...] | None
    reason: Reason
    message: str
    create: int = 0
    joins: bool = False
    """The ``create`` new pods are members too, after ``world`` (a first world, formed as its
    pods are created)."""
    delete: frozenset[PodName] = field(default_factory=frozenset)
    retire: frozenset[PodName] = field(default_factory=frozenset)
    degraded: bool = False
    completed: bool = False
    recheck_after: Requeue = Requeue.NEVER
    peers_lost: bool = False
    """The new world drops members that cannot stop with the world before (their trainers
    exited, their node or pod is gone, or they never started): that world's stop is a
    collective with them, so its survivors end their trainers at once. A member deleted
    gracefully on a live node checkpoints with its world, and ``peers_lost`` stays False."""

    @property
    def resizes(self) -> bool:
        """True when a new world version is to be formed."""
        return self.world is not None


def decide(inp: ResizeInput, policy: ResizePolicy = ResizePolicy()) -> ResizeDecision:
    """Decide the next world (see the module docstring for the rules)."""
    decision = _decide(inp, policy)
    retire_left = _retire_left(inp, policy)
    if retire_left is None:
        return decision
    return replace(decision, recheck_after=min(decision.recheck_after, Requeue.after(retire_left)))


def _retire_left(inp: ResizeInput, policy: ResizePolicy) -> timedelta | None:
    """Until the first retiring pod that still works runs out of time (it is deleted then).

    One out of time already is deleted by this decision (``_finished_retiring``); the event
    of its deletion wakes the job, so it asks for no pass now (which, before the informer saw
    the delete, would delete it again).
    """
    left = [
        policy.retire_timeout - (inp.now - w.retiring_since)
        for w in inp.workers
        if w.retiring_since is not None and w.state.started
    ]
    return min((t for t in left if t > timedelta(0)), default=None)


def _decide(inp: ResizeInput, policy: ResizePolicy) -> ResizeDecision:
    done_retiring = _finished_retiring(inp, policy)
    retiring = {w.pod for w in inp.workers if w.retiring_since is not None}
    workers = [w for w in inp.workers if w.pod not in retiring]
    world = set(inp.world)
    members = [w for w in workers if w.pod in world]

    if inp.suspended:
        return _with_deletes(_suspend(inp, workers), done_retiring)
    if members and all(w.state is WorkerState.SUCCEEDED for w in members):
        return ResizeDecision(
            world=None,
            reason=Reason.COMPLETED,
            message=f"all {len(members)} workers of the world exited 0",
            delete=done_retiring | frozenset(w.pod for w in workers if w.pod not in world),
            completed=True,
        )

    broken = [w for w in members if w.broken]
    gone = _gone(inp, members, broken)
    late = _late_joiners(inp, members, policy) if not broken and not gone else []
    if late:
        return _with_deletes(_drop_late(inp, policy, workers, late), done_retiring)
    if broken or gone:
        latest = _last_break(inp, broken, policy)
        if inp.now - latest < policy.settle:
            return ResizeDecision(
                world=None,
                reason=Reason.STEADY,
                message=f"{len(broken)} worker(s) broke; waiting for the burst to settle",
                delete=done_retiring,
                recheck_after=Requeue.after(policy.settle - (inp.now - latest)),
            )
        return _with_deletes(_reform_without_broken(inp, workers, broken, gone), done_retiring)
    finished = [w for w in members if w.state is WorkerState.SUCCEEDED]
    if finished:
        return ResizeDecision(
            world=None,
            reason=Reason.STEADY,
            message=f"finishing: {len(finished)} of {len(members)} workers exited 0",
            delete=done_retiring,
        )

    return _with_deletes(_steady_or_resize(inp, policy, workers), done_retiring)


def _last_break(inp: ResizeInput, broken: list[WorkerView], policy: ResizePolicy) -> datetime:
    """When the latest break of the burst happened: a broken member's own time, or a node's
    deletion (a rack going away node by node; its pods may already have vanished)."""
    times = [w.since for w in broken]
    if inp.node_lost_at is not None:
        times.append(inp.node_lost_at)
    return max(times, default=inp.now - policy.settle)


def _gone(inp: ResizeInput, members: list[WorkerView], broken: list[WorkerView]) -> list[PodName]:
    """Members of the world whose pod does not exist, lost to it.

    Not while the world has not started (its other members are all still gated or pending,
    none broke) and room is left for the missing: a first world is recorded together with the
    create of its batch's last pod, so a create that failed (a quota, a webhook, the API
    server) leaves a member that never existed while the rest wait gated. The pass creates it
    again in its slot (``create`` counts it) instead of forming a smaller world and counting
    a restart. Without room, or with no member left at all, it is lost as any other.
    """
    present = {w.pod for w in inp.workers}
    gone = [p for p in inp.world if p not in present]
    not_started = bool(members) and not broken and all(w.state.waiting for w in members)
    if gone and not_started and len(gone) <= inp.placeable:
        return []
    return gone


def _steady_or_resize(
    inp: ResizeInput, policy: ResizePolicy, workers: list[WorkerView]
) -> ResizeDecision:
    """No member is broken: form a first world, shrink to the desired size, grow toward it,
    or keep."""
    world = set(inp.world)
    stuck = _stuck_pending(workers, inp.now, policy)
    ordered = sorted((w for w in workers if w.pod not in stuck), key=lambda w: w.slot)
    in_world = [w for w in ordered if w.pod in world]
    spare = [w for w in ordered if w.pod not in world and w.healthy]
    waiting = [w for w in ordered if w.pod not in world and w.state.waiting]
    broken_outside = frozenset(
        w.pod
        for w in workers
        if w.pod not in world and (w.broken or w.state is WorkerState.SUCCEEDED)
    )
    recheck = [
        policy.pending_grace - (inp.now - w.since)
        for w in ordered
        if w.state.waiting and w.unschedulable
    ]

    if len(in_world) > inp.desired:
        return ResizeDecision(
            world=tuple(w.pod for w in in_world[: inp.desired]),
            reason=Reason.SCALED_DOWN,
            message=f"scaled down from {len(in_world)} to {inp.desired} workers",
            retire=frozenset(w.pod for w in in_world[inp.desired :]),
            delete=frozenset(w.pod for w in spare) | stuck | broken_outside,
        )

    room = max(0, inp.desired - len(in_world))
    surplus = frozenset(w.pod for w in spare[room:])
    standby = spare[:room]
    live = len(in_world) + len(standby) + len(waiting)
    create = max(0, min(inp.desired - live, inp.placeable))
    delete = stuck | surplus | broken_outside

    if not inp.world:
        return _form_initial(
            inp, joining=standby + waiting, create=create, delete=delete, recheck=recheck
        )
    starting = [w for w in in_world if not w.healthy]
    if starting:
        join_left = _join_deadline(inp, in_world, policy)
        if join_left is not None:
            recheck.append(join_left - inp.now)
        return _keep(
            f"world forming: {len(in_world) - len(starting)} of {len(in_world)} workers running",
            create=create,
            delete=delete,
            recheck=recheck,
        )
    moved = _move(inp, policy, in_world=in_world, standby=spare, waiting=waiting)
    if moved is not None:
        return replace(moved, delete=moved.delete | stuck | broken_outside)
    if standby and not waiting:
        asked = inp.last_reason is Reason.SCALED_DOWN  # desired raised since: no flapping
        cooldown_left = None if asked else _cooldown_left(inp, policy)
        if cooldown_left is not None:
            recheck.append(cooldown_left)
        elif inp.growth is not None and not inp.growth.worth_it():
            return _keep(
                "growth not worth a restart: predicted gain below restart cost",
                create=0,
                delete=delete | frozenset(w.pod for w in standby),
                recheck=recheck,
            )
        elif len(in_world) + len(standby) >= inp.minimum:
            grown = tuple(w.pod for w in in_world + standby)
            return ResizeDecision(
                world=grown,
                reason=Reason.SCALED_UP,
                message=f"grew from {len(in_world)} to {len(grown)} workers",
                create=create,
                delete=delete,
            )
    return _keep("world steady", create=create, delete=delete, recheck=recheck)


def _move(
    inp: ResizeInput,
    policy: ResizePolicy,
    *,
    in_world: list[WorkerView],
    standby: list[WorkerView],
    waiting: list[WorkerView],
) -> ResizeDecision | None:
    """Move a full world onto faster GPUs when that pays, or ``None`` to decide as usual.

    New pods are created beside the running world (it keeps training meanwhile); only when
    all of them are Ready does one resize swap them in for ``move.leave``, so the job pays one
    restart, never waits on an image pull, and never holds fewer workers than before.
    """
    move = inp.move
    if move is None or len(in_world) < inp.desired or not move.gain.worth_it():
        return None
    staying = [w for w in in_world if w.pod not in move.leave]
    joining = standby[: inp.desired - len(staying)]
    extra = frozenset(w.pod for w in standby[len(joining) :])
    create = max(0, min(move.create, inp.placeable))
    if create or waiting or not joining:
        ready = len(joining)
        return _keep(
            f"moving {len(move.leave)} workers to faster GPUs: {ready} of "
            f"{ready + len(waiting) + create} new workers ready",
            create=create,
            delete=extra,
            recheck=(),
        )
    cooldown_left = _cooldown_left(inp, policy)
    if cooldown_left is not None:
        return _keep("move to faster GPUs waits for the cooldown", 0, extra, [cooldown_left])
    gain = move.gain
    saved = (gain.remaining_seconds or 0.0) * (1.0 - 1.0 / gain.speedup)
    return ResizeDecision(
        world=tuple(w.pod for w in staying + joining),
        reason=Reason.RELOCATED,
        message=(
            f"moved {len(move.leave)} workers to faster GPUs: predicted {gain.speedup:.2f}x"
            + (
                f", saving {saved:.0f}s of the remaining run against a "
                f"{gain.restart_seconds:.0f}s restart"
                if gain.remaining_seconds is not None
                else ""
            )
        ),
        retire=frozenset(w.pod for w in in_world if w.pod in move.leave),
        delete=extra,
    )


def _suspend(inp: ResizeInput, workers: list[WorkerView]) -> ResizeDecision:
    outside = frozenset(w.pod for w in workers if w.pod not in inp.world)
    if not inp.world:
        return ResizeDecision(
            world=None, reason=Reason.SUSPENDED, message="suspended", delete=outside
        )
    return ResizeDecision(
        world=(),
        reason=Reason.SUSPENDED,
        message="suspending: every worker checkpoints and stops",
        retire=frozenset(inp.world),
        delete=outside,
    )


def _with_deletes(decision: ResizeDecision, more: frozenset[PodName]) -> ResizeDecision:
    return replace(decision, delete=decision.delete | more) if more else decision


def _finished_retiring(inp: ResizeInput, policy: ResizePolicy) -> frozenset[PodName]:
    """Retiring pods that checkpointed and exited, died, or ran out of time."""
    finished: set[PodName] = set()
    for w in inp.workers:
        if w.retiring_since is None or w.state is WorkerState.TERMINATING:
            continue
        timed_out = inp.now - w.retiring_since >= policy.retire_timeout
        if not w.state.started or timed_out:
            finished.add(w.pod)
    return frozenset(finished)


def _reform_without_broken(
    inp: ResizeInput,
    workers: list[WorkerView],
    broken: list[WorkerView],
    gone: list[PodName],
) -> ResizeDecision:
    lost = [w for w in broken if w.state is not WorkerState.FAILED]
    reason = Reason.WORKER_LOST if lost or gone else Reason.WORKER_FAILED
    names = _listing(sorted([w.pod for w in broken] + gone))
    return _reform_without(
        inp,
        workers,
        broken,
        reason=reason,
        stopped=f"lost {names}",
        going_on=f"dropped {names}",
        peers_lost=bool(gone) or any(w.dead for w in broken),
    )


def _reform_without(
    inp: ResizeInput,
    workers: list[WorkerView],
    out: list[WorkerView],
    *,
    reason: Reason,
    stopped: str,
    going_on: str,
    peers_lost: bool,
) -> ResizeDecision:
    """A new world of the members left and the Ready standby pods, without ``out`` (deleted
    unless already going away); below ``minimum``, no world and Degraded.

    Members still starting stay: a first world loses only the pods that broke or timed out.
    ``stopped`` and ``going_on`` open the message of each outcome; ``peers_lost``: see
    ``ResizeDecision``.
    """
    removed = {w.pod for w in out}
    world = set(inp.world)
    ordered = sorted(workers, key=lambda w: w.slot)
    survivors = [
        w.pod
        for w in ordered
        if w.pod in world and w.pod not in removed and (w.healthy or w.state.waiting)
    ]
    standby = [w.pod for w in ordered if w.pod not in world and w.healthy]
    dead = frozenset(w.pod for w in out if w.state is not WorkerState.TERMINATING)
    if len(survivors) + len(standby) < inp.minimum:
        return ResizeDecision(
            world=(),
            reason=reason,
            message=(
                f"{stopped}; {len(survivors)} left, below minReplicas "
                f"{inp.minimum}: waiting for capacity, checkpoints kept"
            ),
            delete=dead,
            degraded=True,
        )
    pods = tuple((survivors + standby)[: inp.desired])
    return ResizeDecision(
        world=pods,
        reason=reason,
        message=f"{going_on}; continuing on {len(pods)} workers",
        delete=dead,
        peers_lost=peers_lost,
    )


def _join_deadline(
    inp: ResizeInput, members: list[WorkerView], policy: ResizePolicy
) -> datetime | None:
    """When the first running member's rendezvous wait runs out of patience, if one runs.

    A member waits from when it turned Ready or from when the world was recorded, whichever is
    later (a world re-formed around a still-starting member starts a new rendezvous)."""
    waits = [
        w.since if inp.last_resize is None else max(w.since, inp.last_resize)
        for w in members
        if w.healthy
    ]
    return min(waits) + policy.join_timeout if waits else None


def _late_joiners(
    inp: ResizeInput, members: list[WorkerView], policy: ResizePolicy
) -> list[WorkerView]:
    """Members still starting when a running member has waited ``join_timeout`` for them."""
    deadline = _join_deadline(inp, members, policy)
    if deadline is None or inp.now < deadline:
        return []
    return [w for w in members if w.state.waiting]


def _drop_late(
    inp: ResizeInput, policy: ResizePolicy, workers: list[WorkerView], late: list[WorkerView]
) -> ResizeDecision:
    """Form a world without the members that did not start, and delete them.

    Their replacements come as standby pods, which join only once Ready."""
    names = _listing(sorted(w.pod for w in late))
    waited = policy.join_timeout.total_seconds()
    why = f"{names} did not start while the world waited {waited:.0f}s for it"
    return _reform_without(
        inp,
        workers,
        late,
        reason=Reason.JOIN_TIMED_OUT,
        stopped=why,
        going_on=why,
        peers_lost=True,  # the members that are running wait for them in the rendezvous
    )


def _form_initial(
    inp: ResizeInput,
    *,
    joining: list[WorkerView],
    create: int,
    delete: frozenset[PodName],
    recheck: list[timedelta],
) -> ResizeDecision:
    """No world runs: form one at once of the pods the job has and those created now.

    Each created pod carries its rank from the start, so the world costs no write beyond the
    create and the gate's removal; it trains once its last member has started.
    """
    possible = len(joining) + create
    if possible < inp.minimum:
        return ResizeDecision(
            world=None,
            reason=Reason.INSUFFICIENT_CAPACITY,
            message=(
                f"capacity for {possible} of the {inp.minimum} workers minReplicas needs; "
                "waiting, checkpoints kept"
            ),
            create=create,
            delete=delete,
            degraded=True,
            recheck_after=Requeue.earliest(*recheck),
        )
    pods = tuple(w.pod for w in joining[: inp.desired])
    create = min(create, inp.desired - len(pods))
    return ResizeDecision(
        world=pods,
        reason=Reason.WORLD_FORMED,
        message=f"formed a world of {len(pods) + create} workers",
        create=create,
        joins=create > 0,
        delete=delete | frozenset(w.pod for w in joining[inp.desired :]),
        recheck_after=Requeue.earliest(*recheck),
    )


def _keep(
    message: str,
    create: int,
    delete: frozenset[PodName],
    recheck: Iterable[timedelta],
) -> ResizeDecision:
    return ResizeDecision(
        world=None,
        reason=Reason.STEADY,
        message=message,
        create=create,
        delete=delete,
        recheck_after=Requeue.earliest(*recheck),
    )


def _stuck_pending(
    workers: list[WorkerView], now: datetime, policy: ResizePolicy
) -> frozenset[PodName]:
    """Pods the scheduler could not place for longer than the grace period."""
    return frozenset(
        w.pod
        for w in workers
        if w.state is WorkerState.PENDING
        and w.unschedulable
        and now - w.since >= policy.pending_grace
    )


def _cooldown_left(inp: ResizeInput, policy: ResizePolicy) -> timedelta | None:
    if inp.last_resize is None:
        return None
    left = policy.cooldown - (inp.now - inp.last_resize)
    return left if left > timedelta(0) else None


def _listing(names: Sequence[str]) -> str:
    shown = ", ".join(names[:5])
    return shown if len(names) <= 5 else f"{shown} and {len(names) - 5} more"
