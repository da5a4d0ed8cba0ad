"""The resize policy, as transcripts: (workers, spec bounds, clock) -> decision."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elastra.api.reasons import Reason
from elastra.elastic.resize import (
    GrowthEstimate,
    Move,
    ResizeInput,
    ResizePolicy,
    decide,
)
from elastra.elastic.workers import NodeHealth, PodName, WorkerState, WorkerView, classify
from elastra.requeue import Requeue

T0 = datetime(2026, 1, 1, tzinfo=UTC)
POLICY = ResizePolicy(
    settle=timedelta(seconds=2),
    pending_grace=timedelta(seconds=30),
    cooldown=timedelta(seconds=20),
    retire_timeout=timedelta(seconds=60),
    join_timeout=timedelta(seconds=90),
)


def pod(slot: int) -> PodName:
    return PodName(f"job-w{slot}")


def worker(
    slot: int,
    state: WorkerState = WorkerState.READY,
    *,
    since: datetime = T0,
    unschedulable: bool = False,
    retiring_since: datetime | None = None,
) -> WorkerView:
    return WorkerView(
        pod=pod(slot),
        slot=slot,
        state=state,
        since=since,
        unschedulable=unschedulable,
        retiring_since=retiring_since,
    )


def world(*slots: int) -> tuple[PodName, ...]:
    return tuple(pod(s) for s in slots)


def run(
    workers: list[WorkerView],
    *,
    desired: int,
    minimum: int = 1,
    current: tuple[PodName, ...] = (),
    placeable: int = 0,
    now: datetime = T0 + timedelta(minutes=5),
    last_resize: datetime | None = None,
    last_reason: Reason | None = None,
    suspended: bool = False,
    growth: GrowthEstimate | None = None,
    node_lost_at: datetime | None = None,
) -> object:
    return decide(
        ResizeInput(
            desired=desired,
            minimum=minimum,
            world=current,
            workers=tuple(workers),
            placeable=placeable,
            now=now,
            last_resize=last_resize,
            last_reason=last_reason,
            suspended=suspended,
            growth=growth,
            node_lost_at=node_lost_at,
        ),
        POLICY,
    )


def test_fresh_job_forms_its_first_world_of_the_pods_it_creates() -> None:
    d = run([], desired=8, minimum=2, placeable=4)
    assert d.world == () and d.create == 4 and d.joins
    assert d.reason is Reason.WORLD_FORMED and not d.degraded


def test_fresh_job_below_minimum_waits_degraded() -> None:
    d = run([], desired=8, minimum=4, placeable=2)
    assert d.world is None and d.degraded
    assert d.reason is Reason.INSUFFICIENT_CAPACITY
    assert "minReplicas" in d.message


def test_a_first_world_takes_starting_pods_and_waits_for_them_to_run() -> None:
    running_since = T0 + timedelta(minutes=4, seconds=50)
    starting = [
        worker(0, since=running_since),
        worker(1, WorkerState.GATED),
        worker(2, WorkerState.PENDING),
    ]
    formed = run(starting, desired=3, placeable=0)
    assert formed.world == world(0, 1, 2) and not formed.joins
    assert formed.reason is Reason.WORLD_FORMED
    forming = run(starting, desired=3, current=world(0, 1, 2), placeable=3)
    assert forming.world is None and forming.create == 0
    assert "1 of 3 workers running" in forming.message


def test_a_starting_world_that_loses_a_member_keeps_the_members_still_starting() -> None:
    starting = [worker(0, WorkerState.PENDING), worker(1, WorkerState.LOST), worker(2)]
    d = run(starting, desired=3, current=world(0, 1, 2), now=T0 + timedelta(minutes=5))
    assert d.world == world(0, 2) and d.reason is Reason.WORKER_LOST
    assert d.delete == {pod(1)}


def test_a_member_that_never_starts_is_dropped_before_its_peers_rendezvous_gives_up() -> None:
    formed = T0 + timedelta(seconds=5)
    workers = [
        worker(0, since=formed + timedelta(seconds=10)),
        worker(1, since=formed + timedelta(seconds=20)),
        worker(2, WorkerState.PENDING, since=formed),  # placed, its image never pulls
    ]
    waiting, dropped = (
        run(workers, desired=3, current=world(0, 1, 2), last_resize=formed, now=formed + after)
        for after in (timedelta(seconds=99), timedelta(seconds=100))
    )
    assert waiting.world is None and "2 of 3 workers running" in waiting.message
    assert waiting.recheck_after == Requeue.after(timedelta(seconds=1)), (
        "looks again when 0 has waited 90 s"
    )
    assert dropped.world == world(0, 1) and dropped.reason is Reason.JOIN_TIMED_OUT
    assert dropped.delete == {pod(2)}
    assert "job-w2 did not start while the world waited 90s" in dropped.message


def test_a_world_where_no_member_runs_yet_keeps_waiting() -> None:
    slow = [worker(i, WorkerState.PENDING, since=T0) for i in range(3)]
    d = run(slow, desired=3, current=world(0, 1, 2), last_resize=T0, now=T0 + timedelta(hours=1))
    assert d.world is None and not d.delete, "a slow pull on every node is not a failure"


def test_a_reformed_world_waits_from_its_formation_not_from_when_members_turned_ready() -> None:
    reformed = T0 + timedelta(minutes=30)
    workers = [worker(0, since=T0), worker(1, WorkerState.PENDING, since=T0)]
    before, at = reformed + timedelta(seconds=60), reformed + timedelta(seconds=90)
    kept = run(workers, desired=2, current=world(0, 1), last_resize=reformed, now=before)
    assert kept.world is None
    late = run(workers, desired=2, current=world(0, 1), last_resize=reformed, now=at)
    assert late.world == world(0) and late.delete == {pod(1)}


def test_dropping_late_members_below_minimum_stops_the_world_and_keeps_checkpoints() -> None:
    workers = [worker(0), worker(1, WorkerState.PENDING), worker(2, WorkerState.PENDING)]
    d = run(workers, desired=3, minimum=2, current=world(0, 1, 2), last_resize=T0)
    assert d.world == () and d.degraded and d.reason is Reason.JOIN_TIMED_OUT
    assert d.delete == {pod(1), pod(2)} and "below minReplicas 2" in d.message


def test_running_world_takes_only_ready_pods() -> None:
    d = run(
        [worker(0), worker(1), worker(2, WorkerState.PENDING)],
        desired=3,
        current=world(0, 1),
    )
    assert d.world is None and d.reason is Reason.STEADY


def test_runs_at_four_of_eight_then_grows_when_pods_ready() -> None:
    steady = run([worker(i) for i in range(4)], desired=8, current=world(0, 1, 2, 3))
    assert steady.world is None and steady.create == 0
    more = run([worker(i) for i in range(4)], desired=8, current=world(0, 1, 2, 3), placeable=4)
    assert more.world is None and more.create == 4
    grown = run([worker(i) for i in range(8)], desired=8, current=world(0, 1, 2, 3))
    assert grown.world == world(*range(8))
    assert grown.reason is Reason.SCALED_UP


@pytest.mark.parametrize(
    ("last_reason", "grows"),
    [
        (Reason.WORKER_FAILED, False),  # capacity came back: it may go again, wait
        (Reason.SCALED_UP, False),
        (None, False),
        (Reason.SCALED_DOWN, True),  # the world matched a lowered size: this grow was asked for
    ],
)
def test_growth_waits_for_cooldown_and_says_when_to_look_again(
    last_reason: Reason | None, grows: bool
) -> None:
    now = T0 + timedelta(minutes=5)
    d = run(
        [worker(i) for i in range(4)],
        desired=4,
        current=world(0, 1),
        now=now,
        last_resize=now - timedelta(seconds=5),
        last_reason=last_reason,
    )
    if grows:
        assert d.world == world(0, 1, 2, 3) and d.reason is Reason.SCALED_UP
    else:
        assert d.world is None
        assert d.recheck_after == Requeue.after(timedelta(seconds=15))


def test_growth_skipped_when_gain_is_below_restart_cost() -> None:
    not_worth = GrowthEstimate(speedup=1.1, remaining_seconds=60, restart_seconds=30)
    d = run([worker(i) for i in range(4)], desired=4, current=world(0, 1), growth=not_worth)
    assert d.world is None
    assert pod(2) in d.delete and pod(3) in d.delete
    worth = GrowthEstimate(speedup=2.0, remaining_seconds=3600, restart_seconds=30)
    assert run([worker(i) for i in range(4)], desired=4, current=world(0, 1), growth=worth).world


def test_scale_down_keeps_lowest_slots_and_retires_the_rest() -> None:
    d = run([worker(i) for i in range(6)], desired=3, current=world(*range(6)))
    assert d.world == world(0, 1, 2)
    assert d.retire == frozenset(world(3, 4, 5))
    assert d.reason is Reason.SCALED_DOWN


def test_burst_of_failures_waits_for_settle_then_one_resize() -> None:
    now = T0 + timedelta(minutes=5)
    workers = [worker(i) for i in range(10)]
    for i in (1, 4, 7):
        workers[i] = worker(i, WorkerState.LOST, since=now - timedelta(seconds=1))
    early = run(workers, desired=10, minimum=2, current=world(*range(10)), now=now)
    assert early.world is None and early.recheck_after == Requeue.after(timedelta(seconds=1))
    later = run(
        workers, desired=10, minimum=2, current=world(*range(10)), now=now + timedelta(seconds=1)
    )
    assert later.world == world(0, 2, 3, 5, 6, 8, 9)
    assert later.reason is Reason.WORKER_LOST
    assert later.delete == frozenset(world(1, 4, 7))


def test_a_member_whose_pod_vanished_with_its_node_waits_for_the_rest_of_the_rack() -> None:
    """The pod garbage collector removed the pod of a deleted node (it has no time of its own)
    while the rack's other nodes are still being deleted: the settle window counts from the
    last node deletion the operator saw, so the rack is one resize."""
    now = T0 + timedelta(minutes=5)
    workers = [worker(i) for i in (0, 2, 3, 4, 5)]  # job-w1 vanished
    current = world(*range(6))
    early = run(workers, desired=6, minimum=2, current=current, now=now,
                node_lost_at=now - timedelta(seconds=0.5))  # fmt: skip
    assert early.world is None and early.recheck_after == Requeue.after(timedelta(seconds=1.5))
    later = run(workers, desired=6, minimum=2, current=current, now=now,
                node_lost_at=now - timedelta(seconds=3))  # fmt: skip
    assert later.world == world(0, 2, 3, 4, 5) and later.reason is Reason.WORKER_LOST


def test_failed_worker_is_dropped_and_replaced() -> None:
    workers = [worker(0), worker(1, WorkerState.FAILED), worker(2)]
    d = run(workers, desired=3, current=world(0, 1, 2))
    assert d.world == world(0, 2) and d.reason is Reason.WORKER_FAILED
    after = run([worker(0), worker(2)], desired=3, current=world(0, 2), placeable=5)
    assert after.create == 1


def test_losing_below_minimum_forms_an_empty_world_degraded() -> None:
    workers = [worker(0), worker(1, WorkerState.LOST), worker(2, WorkerState.LOST)]
    d = run(workers, desired=3, minimum=2, current=world(0, 1, 2))
    assert d.world == () and d.degraded
    assert "below minReplicas" in d.message


GATED, PENDING, READY = WorkerState.GATED, WorkerState.PENDING, WorkerState.READY


@pytest.mark.parametrize(
    ("states", "placeable", "recreated"),
    [
        ((GATED, GATED), 1, True),  # the batch's last create failed as the world was recorded
        ((GATED, PENDING), 1, True),  # ungated since: still nobody waits on a rendezvous
        ((GATED, GATED), 0, False),  # no room left for it: lost, a smaller world forms
        ((READY, GATED), 1, False),  # a member ran: the world started, the pod was lost
        ((), 1, False),  # nothing of the world is left
    ],
)
def test_a_member_of_a_world_that_has_not_started_is_created_again_when_it_fits(
    states: tuple[WorkerState, ...], placeable: int, recreated: bool
) -> None:
    workers = [worker(slot, state) for slot, state in enumerate(states)]
    d = run(workers, desired=3, current=world(0, 1, 2), placeable=placeable)
    if recreated:
        assert d.world is None and d.create == 1 and d.reason is Reason.STEADY
    else:
        assert d.reason is Reason.WORKER_LOST and pod(2) not in (d.world or ())


def test_pod_vanished_from_the_world_counts_as_lost() -> None:
    d = run([worker(0), worker(1)], desired=3, current=world(0, 1, 2))
    assert d.world == world(0, 1) and d.reason is Reason.WORKER_LOST


@pytest.mark.parametrize(
    ("dropped", "peers_lost"),
    [
        (WorkerState.FAILED, True),  # its trainers exited
        (WorkerState.LOST, True),  # its node is gone or NotReady, or it was evicted
        (WorkerState.TERMINATING, False),  # deleted gracefully: it checkpoints with its world
        ("terminating on a node that is down", True),
        ("vanished", True),  # the pod is gone (a force delete)
    ],
)
def test_the_new_world_says_whether_the_one_before_can_stop_together(
    dropped: WorkerState | str, peers_lost: bool
) -> None:
    """``peers_lost`` (the survivors end their trainers at once) only when a dropped member
    cannot take part in the old world's stop."""
    workers = [worker(0), worker(1)]
    if isinstance(dropped, WorkerState):
        workers.append(worker(2, dropped))
    elif dropped.startswith("terminating"):
        workers.append(replace(worker(2, WorkerState.TERMINATING), node_down=True))
    d = run(workers, desired=3, current=world(0, 1, 2))
    assert d.world == world(0, 1)
    assert d.peers_lost is peers_lost


def test_unschedulable_past_grace_is_deleted() -> None:
    now = T0 + timedelta(minutes=5)
    stuck = worker(3, WorkerState.PENDING, since=now - timedelta(seconds=31), unschedulable=True)
    fresh = worker(4, WorkerState.PENDING, since=now - timedelta(seconds=10), unschedulable=True)
    d = run(
        [worker(0), worker(1), worker(2), stuck, fresh],
        desired=5,
        current=world(0, 1, 2),
        now=now,
    )
    assert d.world is None
    assert pod(3) in d.delete and pod(4) not in d.delete
    assert d.recheck_after == Requeue.after(timedelta(seconds=20))


def test_suspend_retires_the_world_then_deletes_what_stopped() -> None:
    d = run([worker(0), worker(1)], desired=2, current=world(0, 1), suspended=True)
    assert d.world == () and d.retire == frozenset(world(0, 1))
    now = T0 + timedelta(minutes=5)
    stopped = [
        worker(0, WorkerState.SUCCEEDED, retiring_since=now - timedelta(seconds=5)),
        worker(1, WorkerState.READY, retiring_since=now - timedelta(seconds=5)),
    ]
    after = run(stopped, desired=2, current=(), suspended=True, now=now)
    assert after.world is None and after.delete == frozenset({pod(0)})
    late = run(stopped, desired=2, current=(), suspended=True, now=now + timedelta(seconds=60))
    assert late.delete == frozenset(world(0, 1))


@pytest.mark.parametrize(
    ("retiring_for", "lost_for", "recheck"),
    [
        (5, None, Requeue.after(timedelta(seconds=55))),  # when its retire timeout runs out
        (5, 1, Requeue.after(timedelta(seconds=1))),  # the settle window ends first
        (60, 1, Requeue.after(timedelta(seconds=1))),  # out of time: deleted now, not rechecked
        (60, None, Requeue.NEVER),  # its deletion's event wakes the job
    ],
)
def test_a_retiring_pod_that_still_runs_is_looked_at_again_when_its_time_runs_out(
    retiring_for: int, lost_for: int | None, recheck: Requeue
) -> None:
    now = T0 + timedelta(minutes=5)
    workers = [
        worker(0),
        worker(1),
        worker(2, retiring_since=now - timedelta(seconds=retiring_for)),
    ]
    if lost_for is not None:
        workers[1] = worker(1, WorkerState.LOST, since=now - timedelta(seconds=lost_for))
    d = run(workers, desired=2, current=world(0, 1), now=now)
    assert d.recheck_after == recheck
    assert (pod(2) in d.delete) == (retiring_for >= 60)


def test_all_members_exited_zero_completes() -> None:
    d = run(
        [worker(0, WorkerState.SUCCEEDED), worker(1, WorkerState.SUCCEEDED)],
        desired=2,
        current=world(0, 1),
    )
    assert d.completed and d.world is None


def test_one_member_finished_means_finishing_not_growing() -> None:
    d = run(
        [worker(0, WorkerState.SUCCEEDED), worker(1)], desired=2, current=world(0, 1), placeable=4
    )
    assert d.world is None and d.create == 0 and not d.completed


def test_classify() -> None:
    ok = NodeHealth(exists=True, ready=True, schedulable=True)
    gone = NodeHealth(exists=False, ready=False, schedulable=False)

    def state(phase: str, **kw: object) -> WorkerState:
        args: dict[str, object] = {
            "phase": phase,
            "ready": False,
            "gated": False,
            "deleting": False,
            "reason": None,
            "node": ok,
        }
        args.update(kw)
        return classify(**args)  # type: ignore[arg-type]

    assert state("Running", ready=True) is WorkerState.READY
    assert state("Running", ready=True, node=gone) is WorkerState.LOST
    assert state("Pending", gated=True, node=None) is WorkerState.GATED
    assert state("Failed", reason="Evicted") is WorkerState.LOST
    assert state("Failed") is WorkerState.FAILED
    assert state("Succeeded") is WorkerState.SUCCEEDED
    assert state("Running", ready=True, deleting=True) is WorkerState.TERMINATING


STATES = st.sampled_from(list(WorkerState))


@st.composite
def scenarios(draw: st.DrawFn) -> ResizeInput:
    n = draw(st.integers(0, 12))
    now = T0 + timedelta(minutes=10)
    workers = tuple(
        WorkerView(
            pod=pod(i),
            slot=i,
            state=draw(STATES),
            since=now - timedelta(seconds=draw(st.integers(0, 120))),
            unschedulable=draw(st.booleans()),
            retiring_since=(
                now - timedelta(seconds=draw(st.integers(0, 120)))
                if draw(st.integers(0, 5)) == 0
                else None
            ),
        )
        for i in range(n)
    )
    members = tuple(w.pod for w in workers if draw(st.booleans()) and w.retiring_since is None)
    desired = draw(st.integers(1, 12))
    return ResizeInput(
        desired=desired,
        minimum=draw(st.integers(1, desired)),
        world=members,
        workers=workers,
        placeable=draw(st.integers(0, 12)),
        now=now,
        last_resize=now - timedelta(seconds=draw(st.integers(0, 60))),
        suspended=draw(st.integers(0, 6)) == 0,
    )


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_properties(inp: ResizeInput) -> None:
    d = decide(inp, POLICY)
    by_pod = {w.pod: w for w in inp.workers}
    if d.world is not None:
        size = len(d.world) + (d.create if d.joins else 0)
        assert size <= inp.desired, "never above the desired size"
        assert len(set(d.world)) == len(d.world), "no pod twice"
        if size:
            assert size >= inp.minimum, "never a world below minReplicas"
        for name in d.world:
            starting = by_pod[name].state.waiting
            first = d.reason is Reason.WORLD_FORMED or name in inp.world
            assert by_pod[name].healthy or (starting and first), (
                "a running world takes only Ready pods; a first one takes starting pods too"
            )
            assert name not in d.delete and name not in d.retire
    assert not d.joins or d.reason is Reason.WORLD_FORMED, "created pods join only a first world"
    assert d.create <= inp.placeable, "never create more than fits"
    if d.create:
        keeps = [
            w
            for w in inp.workers
            if w.pod not in d.delete
            and w.retiring_since is None
            and w.state in (WorkerState.READY, WorkerState.PENDING, WorkerState.GATED)
        ]
        assert len(keeps) + d.create <= inp.desired, "never more live pods than desired"
    assert d.delete <= set(by_pod), "deletes only pods that exist"
    assert decide(inp, POLICY) == d, "deterministic"


def moving(
    *, speedup: float = 2.0, remaining: float | None = 3600.0, create: int = 2
) -> ResizeInput:
    """A full world of 2 (slots 0, 1) whose better plan wants ``create`` pods elsewhere."""
    return ResizeInput(
        desired=2,
        minimum=1,
        world=world(0, 1),
        workers=(worker(0), worker(1)),
        placeable=2,
        now=T0 + timedelta(minutes=5),
        last_resize=T0,
        move=Move(
            leave=frozenset(world(0, 1)),
            create=create,
            gain=GrowthEstimate(speedup=speedup, remaining_seconds=remaining, restart_seconds=60),
        ),
    )


def test_a_paying_move_first_starts_new_pods_beside_the_running_world() -> None:
    d = decide(moving(), POLICY)
    assert d.world is None and d.create == 2 and not d.retire


def test_a_move_swaps_in_the_new_pods_once_all_are_ready_in_one_resize() -> None:
    inp = moving(create=0)
    d = decide(replace(inp, workers=(*inp.workers, worker(2), worker(3)), placeable=0), POLICY)
    assert d.world == world(2, 3) and d.reason is Reason.RELOCATED
    assert d.retire == frozenset(world(0, 1)) and not d.delete
    assert "2.00x" in d.message and "saving 1800s" in d.message


def test_a_move_waits_while_a_new_pod_is_pending() -> None:
    inp = moving(create=0)
    workers = (*inp.workers, worker(2), worker(3, WorkerState.PENDING))
    d = decide(replace(inp, workers=workers), POLICY)
    assert d.world is None and d.create == 0 and not d.delete


def test_no_move_when_the_gain_does_not_beat_the_restart() -> None:
    d = decide(moving(speedup=1.01, remaining=600.0), POLICY)
    assert d.world is None and d.create == 0
    inp = moving(speedup=1.01, remaining=600.0)
    d = decide(replace(inp, workers=(*inp.workers, worker(2))), POLICY)
    assert d.world is None and d.delete == frozenset(world(2)), "spare pods are given back"
