"""The capacity-request decision: how many requests, which go, timeout and hysteresis."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from elastra.api import CapacityRequestState, CapacityRequestStatus
from elastra.api.reasons import Reason
from elastra.controller.decide.capacity_requests import (
    HOLD_RECHECK,
    Placeholder,
    Want,
    contested,
    decide,
    read_placeholders,
)
from elastra.controller.decide.manifests import ANNOTATION_NODE, LABEL_JOB

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
TIMEOUT = timedelta(seconds=600)
REQUESTED = CapacityRequestState.REQUESTED
UNSATISFIED = CapacityRequestState.UNSATISFIED
DECLINED = CapacityRequestState.DECLINED


def held(index: int, node: str | None = None, age: float = 10, **kw: bool) -> Placeholder:
    """The job's ``index``-th request, ``age`` seconds old, bound to ``node`` (None: pending)."""
    return Placeholder(
        name=f"gpt-cr{index}", index=index, node=node, created=NOW - timedelta(seconds=age), **kw
    )


def record(
    state: CapacityRequestState, *, workers: int = 0, since: float = 60, gen: int = 1
) -> CapacityRequestStatus:
    return CapacityRequestStatus(
        state=state,
        workers=workers,
        since=(NOW - timedelta(seconds=since)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        observed_generation=gen,
        message="earlier",
    )


def want(desired: int = 4, have: int = 0, short: bool | None = True, **kw: object) -> Want:
    return Want(desired=desired, have=have, short=short, generation=1, **kw)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Case:
    name: str
    want: Want
    existing: tuple[Placeholder, ...] = ()
    recorded: CapacityRequestStatus | None = None
    create: tuple[int, ...] = ()
    delete: tuple[str, ...] = ()
    state: CapacityRequestState | None = None
    workers: int | None = None
    event: bool = False
    extra: dict[str, object] = field(default_factory=dict)


CASES = [
    Case("short of 4 with none: ask for 4", want(), create=(0, 1, 2, 3), state=REQUESTED,
         workers=4),
    Case("short of 4 with 4 out: nothing to write", want(),
         existing=tuple(held(i) for i in range(4)), recorded=record(REQUESTED, workers=4),
         state=REQUESTED, workers=4),
    Case("nodes came for 2: the workers created there take their room",
         want(have=2, waiting={"n1": 1, "n2": 1}),
         existing=(held(0, "n1"), held(1, "n2"), held(2), held(3)),
         recorded=record(REQUESTED, workers=4), delete=("gpt-cr0", "gpt-cr1"), state=REQUESTED,
         workers=2),
    Case("a worker still unbound on a request's node: it goes (a pass before the cache)",
         want(have=2, waiting={"n1": 1}), existing=(held(0, "n1"), held(2), held(3)),
         recorded=record(REQUESTED, workers=2), delete=("gpt-cr0",), state=REQUESTED,
         workers=2),
    Case("fewer wanted: pending ones go first, newest first", want(have=2),
         existing=(held(0, "n1"), held(1, "n2"), held(2), held(3)),
         recorded=record(REQUESTED, workers=4), delete=("gpt-cr3", "gpt-cr2"),
         state=REQUESTED, workers=2),
    Case("more wanted: the lowest free indices", want(have=1),
         existing=(held(1),), recorded=record(REQUESTED, workers=1), create=(0, 2),
         state=REQUESTED, workers=3),
    Case("a name still being deleted is not reused", want(desired=2),
         existing=(held(0, deleting=True),), create=(1, 2), state=REQUESTED, workers=2),
    Case("capacity enough: all go, no record", want(short=False),
         existing=(held(0), held(1)), recorded=record(REQUESTED, workers=2),
         delete=("gpt-cr0", "gpt-cr1")),
    Case("at its size: all go, a closed record is forgotten", want(have=4),
         existing=(held(0, "n1"),), recorded=record(UNSATISFIED, workers=0),
         delete=("gpt-cr0",)),
    Case("held (suspended, Kueue, finished): all go, the open request ends",
         want(held=True), existing=(held(0), held(1)), recorded=record(REQUESTED, workers=2),
         delete=("gpt-cr0", "gpt-cr1")),
    Case("held keeps what a closed request learnt", want(held=True),
         recorded=record(UNSATISFIED, workers=0), state=UNSATISFIED, workers=0),
    Case("the planner prefers fewer on the nodes that came: declined",
         want(have=3, short=False, prefers_fewer=True), existing=(held(3, "n4"),),
         recorded=record(REQUESTED, workers=1), delete=("gpt-cr3",), state=DECLINED,
         workers=3),
    Case("declined stays declined although short again without that node",
         want(have=3), recorded=record(DECLINED, workers=3), state=DECLINED, workers=3),
    Case("declined asks again once the job lost a worker", want(have=2),
         recorded=record(DECLINED, workers=3), create=(0, 1), state=REQUESTED, workers=2),
    Case("declined asks again for a new spec", want(have=3),
         recorded=record(DECLINED, workers=3, gen=0), create=(0,), state=REQUESTED, workers=1),
    Case("declined does not ask again for a new node", want(have=3, newest_node=NOW),
         recorded=record(DECLINED, workers=3), state=DECLINED, workers=3),
    Case("prefers fewer without a request: nothing", want(have=3, short=False,
         prefers_fewer=True)),
    Case("a request older than the timeout: all withdrawn, said once",
         want(have=0), existing=(held(0, "n1", age=601), held(1, age=601)),
         recorded=record(REQUESTED, workers=2, since=601),
         delete=("gpt-cr0", "gpt-cr1"), state=UNSATISFIED, workers=0, event=True),
    Case("a request consumed this pass does not time out",
         want(have=1, desired=2, waiting={"n1": 1}), existing=(held(0, "n1", age=900),),
         recorded=record(REQUESTED, workers=2), create=(1,), delete=("gpt-cr0",),
         state=REQUESTED, workers=1),
    Case("unsatisfied, nothing changed: not asked again", want(),
         recorded=record(UNSATISFIED, workers=0), state=UNSATISFIED, workers=0),
    Case("unsatisfied, a node added since: asked again",
         want(newest_node=NOW - timedelta(seconds=5)),
         recorded=record(UNSATISFIED, workers=0, since=60), create=(0, 1, 2, 3),
         state=REQUESTED, workers=4),
    Case("unsatisfied, only older nodes: not asked again",
         want(newest_node=NOW - timedelta(seconds=120)),
         recorded=record(UNSATISFIED, workers=0, since=60), state=UNSATISFIED, workers=0),
    Case("unsatisfied, a new spec: asked again", want(),
         recorded=record(UNSATISFIED, workers=0, gen=0), create=(0, 1, 2, 3), state=REQUESTED,
         workers=4),
    Case("unsatisfied, the job lost workers: asked again", want(have=1),
         recorded=record(UNSATISFIED, workers=2), create=(0, 1, 2), state=REQUESTED,
         workers=3),
    Case("backoff (not judged): requests stay", want(short=None),
         existing=(held(0), held(1, "n2")), recorded=record(REQUESTED, workers=2),
         state=REQUESTED, workers=2),
    Case("backoff still makes way for waiting workers", want(short=None, waiting={"n2": 1}),
         existing=(held(0), held(1, "n2")), recorded=record(REQUESTED, workers=2),
         delete=("gpt-cr1",), state=REQUESTED, workers=2),
    Case("another job's worker waits where a request is bound: it gives way, none replaces it",
         want(contested={"n1": 1}, hold_new=True), existing=(held(0, "n1"), held(1)),
         recorded=record(REQUESTED, workers=4), delete=("gpt-cr0",), state=REQUESTED,
         workers=4),
    Case("another job's worker waits for a usable node: no new request yet",
         want(hold_new=True), existing=(held(0),), recorded=record(REQUESTED, workers=4),
         state=REQUESTED, workers=4),
    Case("another job's worker elsewhere: asked as usual", want(contested={"n9": 2}),
         create=(0, 1, 2, 3), state=REQUESTED, workers=4),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_decide(case: Case) -> None:
    out = decide(case.want, case.existing, recorded=case.recorded, timeout=TIMEOUT, now=NOW)
    assert out.create == case.create
    assert out.delete == case.delete
    state = out.record.state if out.record is not None else None
    assert state == case.state
    if case.workers is not None:
        assert out.record is not None and out.record.workers == case.workers
    assert (out.event is not None) == case.event


def test_an_open_request_keeps_its_start_and_says_when_it_times_out() -> None:
    existing = (held(0, age=100), held(1, age=40))
    out = decide(want(desired=2), existing, recorded=record(REQUESTED, workers=2, since=100),
                 timeout=TIMEOUT, now=NOW)  # fmt: skip
    assert out.record is not None and out.record.since == "2026-01-01T11:58:20Z"
    assert out.recheck == timedelta(seconds=500), "the oldest request's deadline"
    assert out.condition() == (Reason.CAPACITY_REQUESTED, out.record.message)
    assert "2 more workers" in out.record.message


def test_a_new_request_starts_now() -> None:
    out = decide(want(desired=1), (), recorded=None, timeout=TIMEOUT, now=NOW)
    assert out.record is not None and out.record.since == "2026-01-01T12:00:00Z"
    assert out.record.message.endswith("nodes for 1 more worker (capacity-request pods)")


@pytest.mark.parametrize(
    ("existing", "why"),
    [
        ((held(0, age=700), held(1, "n2", age=700)), "no autoscaler gave nodes for 1 of 2"),
        ((held(0, "n1", age=700),), "could not use the nodes that came"),
    ],
)
def test_the_withdrawal_says_why(existing: tuple[Placeholder, ...], why: str) -> None:
    out = decide(want(), existing, recorded=record(REQUESTED), timeout=TIMEOUT, now=NOW)
    assert out.event is not None and why in out.event and "600s" in out.event
    assert out.condition() == (Reason.CAPACITY_UNSATISFIED, out.event)


def test_no_flapping_over_passes() -> None:
    """Each pass fed what the last one left: the requests settle and nothing is rewritten."""
    existing: tuple[Placeholder, ...] = ()
    recorded = None
    writes = []
    for step in range(5):
        out = decide(
            want(), existing, recorded=recorded, timeout=TIMEOUT, now=NOW + timedelta(seconds=step)
        )
        kept = tuple(p for p in existing if p.name not in out.delete)
        existing = kept + tuple(held(i, age=-step) for i in out.create)
        recorded = out.record
        writes.append(len(out.create) + len(out.delete))
    assert writes == [4, 0, 0, 0, 0]


def test_read_placeholders_takes_the_jobs_requests_only() -> None:
    pods = [
        {"metadata": {"name": "gpt-cr1", "creationTimestamp": "2026-01-01T11:59:00Z"},
         "spec": {"nodeName": "n1"}},
        {"metadata": {"name": "gpt-cr0", "deletionTimestamp": "2026-01-01T12:00:00Z"},
         "spec": {}},
        {"metadata": {"name": "gpt-w0"}, "spec": {}},
        {"metadata": {"name": "other-cr0"}, "spec": {}},
    ]  # fmt: skip
    found = read_placeholders("gpt", pods, now=NOW)
    assert [(p.name, p.index, p.node, p.deleting) for p in found] == [
        ("gpt-cr0", 0, None, True),
        ("gpt-cr1", 1, "n1", False),
    ]
    assert found[0].created == NOW, "not created yet (a reservation): as old as now"
    assert found[1].created == NOW - timedelta(seconds=60)


def test_a_request_held_back_looks_again_soon() -> None:
    out = decide(want(hold_new=True), (), recorded=None, timeout=TIMEOUT, now=NOW)
    assert out.create == () and out.recheck == HOLD_RECHECK


def pod(name: str, job: str, *, node: str | None = None, bound: bool = False,
        namespace: str = "ns", **meta: str) -> dict[str, object]:  # fmt: skip
    annotations = {ANNOTATION_NODE: node} if node else {}
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": {LABEL_JOB: job},
                     "annotations": annotations, **meta},
        "spec": {"nodeName": node if bound else None},
        "status": {"phase": "Running" if bound else "Pending"},
    }  # fmt: skip


def test_contested_counts_other_jobs_workers_waiting_for_their_planned_node() -> None:
    pods = (
        pod("gpt-w0", "gpt", node="n1"),  # the job's own: not contested
        pod("bert-w0", "bert", node="n1"),
        pod("bert-w1", "bert", node="n2", bound=True),  # bound: waits for nothing
        pod("bert-w2", "bert", node="n3", deletionTimestamp="2026-01-01T00:00:00Z"),
        pod("gpt-w0", "gpt", node="n4", namespace="other"),  # same name, another namespace
        pod("plain", "", node="n5"),
    )
    reserved = (pod("bert-w0", "bert", node="n1"), pod("bert-w3", "bert", node="n6"))
    found = contested(pods, reserved, namespace="ns", job="gpt")
    assert found == {"n1": 1, "n4": 1, "n6": 1}, "a pod both listed and reserved counts once"
