"""sharing.desired: the user's size, lowered only to give GPUs to a starved job it may give
to (by priority and namespace, as the operator's --sharing says)."""

from __future__ import annotations

import inspect
from datetime import UTC, datetime
from typing import Any

import pytest

from elastra.api import TrainingJob
from elastra.controller.decide import sharing
from elastra.controller.decide.observe import PodFacts
from elastra.elastic.share import Priorities, Scope
from elastra.elastic.workers import NodeName, PodName, WorkerState, WorkerView
from tests.unit.controller.test_passplan import job

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def held(count: int, *, terminating: int = 0) -> dict[str, PodFacts]:
    """``count`` workers of this job, the last ``terminating`` of them being deleted (only
    their state matters here)."""
    return on_nodes(*(
        (f"n{i}", WorkerState.TERMINATING if i >= count - terminating else WorkerState.READY, False)
        for i in range(count)
    ))  # fmt: skip


def starved(
    name: str, minimum: int, *, namespace: str = "default", priority_class: str | None = None
) -> dict[str, Any]:
    worker: dict[str, Any] = {"gpuTypes": []}
    if priority_class:
        worker["template"] = {"spec": {"priorityClassName": priority_class}}
    return {
        "metadata": {"namespace": namespace, "name": name},
        "spec": {"minReplicas": minimum, "worker": worker},
        "status": {
            "conditions": [{"type": "Degraded", "status": "True", "reason": "InsufficientCapacity"}]
        },
    }


@pytest.mark.parametrize(
    ("replicas", "holding", "others", "free", "want"),
    [
        (4, 4, [], 0, 4),  # nobody waits: the user's size
        (6, 3, [], 0, 6),  # short of capacity: still the user's size, not what was placed
        (4, 4, [starved("other", 2)], 0, 2),  # gives down to its minimum (2)
        (4, 4, [starved("other", 1)], 0, 3),
        (4, 4, [starved("other", 2)], 2, 4),  # free capacity covers the starved job
    ],
)
def test_desired_is_replicas_lowered_for_starved_jobs(
    replicas: int, holding: int, others: list[dict[str, Any]], free: int, want: int
) -> None:
    me = TrainingJob.model_validate(job(replicas=replicas))
    assert sharing.desired(me, held(holding), others, [], free=free) == want


def test_desired_takes_no_planned_size() -> None:
    """Before: it took ``wanted`` and ignored it; now no caller can think it matters."""
    assert "wanted" not in inspect.signature(sharing.desired).parameters


def test_a_donated_pod_still_terminating_is_not_given_twice() -> None:
    """3 pods, one already given (deleted, still shutting down, so the starved job cannot use
    its GPUs yet): before, the donor counted 2 held and gave another, ending at 1."""
    me = TrainingJob.model_validate(job(replicas=3, minReplicas=1))
    assert sharing.desired(me, held(3, terminating=1), [starved("other", 1)], [], free=0) == 2


def on_nodes(*pods: tuple[str, WorkerState, bool]) -> dict[str, PodFacts]:
    """Workers of this job as (node, state, retiring)."""
    facts: dict[str, PodFacts] = {}
    for i, (node, state, retiring) in enumerate(pods):
        view = WorkerView(
            pod=PodName(f"gpt-w-{i}"), slot=i, state=state, since=NOW,
            node=NodeName(node), retiring_since=NOW if retiring else None,
        )  # fmt: skip
        facts[view.pod] = PodFacts(
            view=view, raw={}, assignment="", assignment_version=0, ip=None, bound=True,
            node_gone=False, gated=False, exit_code=None,
        )  # fmt: skip
    return facts


READY, GONE = WorkerState.READY, WorkerState.TERMINATING
DONOR = on_nodes(("n1", READY, False), ("n2", READY, False), ("n3", READY, True))


@pytest.mark.parametrize(
    ("new_pods", "facts", "want"),
    [
        ((), DONOR, 0),
        (("n4",), DONOR, 1),  # a node nobody holds
        # where its donated pod still stops: the gift, not free (before: counted 1, and the
        # donor then aimed for the 3 it held and placed a pod there again)
        (("n3",), DONOR, 0),
        (("n3", "n3"), DONOR, 1),  # room for two there: one is the retiring pod's
        (("n3", "n4"), DONOR, 1),
        # a retiring pod being deleted is not given back to the job's placement at all
        (("n3",), on_nodes(("n1", READY, False), ("n3", GONE, True)), 1),
        (("n3",), on_nodes(("n3", READY, False)), 1),  # a staying pod is the placement's keep
    ],
)
def test_free_for_starved_leaves_out_the_donors_retiring_pods(
    new_pods: tuple[str, ...], facts: dict[str, PodFacts], want: int
) -> None:
    assert sharing.free_for_starved(new_pods, facts) == want


def test_a_donor_whose_gift_is_still_stopping_keeps_its_lower_size() -> None:
    """The pass right after the shrink: 2 staying, 1 retiring on n3, and the placement finds
    n3 for a new pod. The donor's size stays 2 (before: 3, and it re-placed the pod)."""
    me = TrainingJob.model_validate(job(replicas=3, minReplicas=1))
    free = sharing.free_for_starved(["n3"], DONOR)
    assert sharing.desired(me, DONOR, [starved("other", 1)], [], free=free) == 2


def test_other_jobs_terminating_pods_count_as_held() -> None:
    pod = {
        "metadata": {
            "namespace": "default",
            "labels": {"elastra.dev/job": "a"},
            "deletionTimestamp": "2030-01-01T00:00:00Z",
        },
        "status": {"phase": "Running"},
    }
    done = {**pod, "status": {"phase": "Succeeded"}}
    assert sharing._live_pods([pod, done]) == {"default/a": 1}


def worker_of(job_name: str, index: int, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "default",
            "name": f"{job_name}-w-{index}",
            "labels": {"elastra.dev/job": job_name},
        },
        "status": {"phase": phase},
    }


def request_of(
    job_name: str, index: int, *, node: str = "", deleting: bool = False
) -> dict[str, Any]:
    """A capacity-request pod of ``job_name``, bound to ``node`` when one is given."""
    meta: dict[str, Any] = {
        "namespace": "default",
        "name": f"{job_name}-cr{index}",
        "labels": {"elastra.dev/capacity-request": job_name},
    }
    if deleting:
        meta["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": node} if node else {}, "status": {}}


@pytest.mark.parametrize(
    ("listed", "reserved", "want"),
    [
        ((), (), 2),  # the starved job holds nothing: this one gives down to its minimum
        ((worker_of("other", 0),), (), 3),  # it holds one of the two it needs
        ((worker_of("other", 0),), (worker_of("other", 1),), 4),  # being created counts too
        ((worker_of("other", 0, "Failed"),), (), 2),  # an ended pod holds nothing
        # its capacity request bound to a node: about to be its worker (before, a donor gave
        # a second pod while the starved job's request sat on the node the first one freed)
        ((request_of("other", 0, node="n1"),), (), 3),
        ((request_of("other", 0),), (), 2),  # a pending request holds nothing
        ((request_of("other", 0, node="n1", deleting=True),), (), 2),  # nor one going away
        ((request_of("third", 0, node="n1"),), (), 2),  # not the starved job's request
    ],
)
def test_the_other_jobs_listed_and_reserved_pods_count_as_held(
    listed: tuple[dict[str, Any], ...], reserved: tuple[dict[str, Any], ...], want: int
) -> None:
    me = TrainingJob.model_validate(job(replicas=4, minReplicas=2))
    others = (starved("other", 2),)
    got = sharing.desired(me, held(4), others, listed, free=0, reserved=reserved)
    assert got == want


def test_a_donors_own_bound_request_counts_in_what_it_holds() -> None:
    """Every pass must compute the same gifts: the donor counts its bound request as the
    other jobs' passes count it: 3 workers and a bound request hold 4; it gives the starved
    job its 1 and aims for 3 (counting only its workers it would aim for 2)."""
    me = TrainingJob.model_validate(job(replicas=4, minReplicas=2))
    mine = request_of(me.metadata.name, 0, node="n1")
    assert sharing.desired(me, held(3), (starved("other", 1),), (mine,), free=0) == 3


def test_counts_follow_a_new_listing_that_shares_pods_with_the_last() -> None:
    """Listings are memoized per pod object: a pod replaced by its next version is read again."""
    running, other = worker_of("a", 0), worker_of("b", 0)
    assert sharing._live_pods((running, other)) == {"default/a": 1, "default/b": 1}
    assert sharing._live_pods((worker_of("a", 0, "Succeeded"), other)) == {"default/b": 1}


def priority_class(name: str, value: int, *, default: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name, "resourceVersion": "7"},
        "value": value,
    }
    if default:
        body["globalDefault"] = True
    return body


CLASSES = sharing.priorities(
    [priority_class("high", 1000), priority_class("low", 10), priority_class("normal", 100)]
)


def with_class(name: str | None, **spec: Any) -> TrainingJob:
    """This job (4 replicas, minimum 2, holding 4) with its pods in PriorityClass ``name``."""
    body = job(replicas=4, **spec)
    if name:
        body["spec"]["worker"]["template"] = {"spec": {"priorityClassName": name}}
    return TrainingJob.model_validate(body)


@pytest.mark.parametrize(
    ("mine", "theirs", "namespace", "scope", "want"),
    [
        ("low", "high", "default", Scope.NAMESPACE, 2),  # gives down to its minimum
        ("high", "low", "default", Scope.NAMESPACE, 4),  # never to a lower priority
        ("normal", "normal", "default", Scope.NAMESPACE, 2),  # equals share
        (None, "low", "default", Scope.NAMESPACE, 2),  # no class: 0, below "low"
        ("low", None, "default", Scope.NAMESPACE, 4),  # ... so "low" keeps its GPUs
        ("low", "high", "team-b", Scope.NAMESPACE, 4),  # another namespace
        ("low", "high", "team-b", Scope.CLUSTER, 2),
        ("low", "high", "default", Scope.OFF, 4),
        ("missing", "high", "default", Scope.NAMESPACE, 4),  # its pods would be refused
        ("low", "missing", "default", Scope.NAMESPACE, 4),  # so would the starved job's
    ],
)
def test_priority_classes_and_scope_decide_who_gives(
    mine: str | None, theirs: str | None, namespace: str, scope: Scope, want: int
) -> None:
    others = [starved("other", 2, namespace=namespace, priority_class=theirs)]
    got = sharing.desired(
        with_class(mine), held(4), others, [], free=0, priorities=CLASSES, scope=scope
    )
    assert got == want


def test_the_global_default_class_is_the_priority_of_a_job_naming_none() -> None:
    classes = sharing.priorities(
        [priority_class("high", 1000), priority_class("base", 50, default=True)]
    )
    assert classes == Priorities(values={"high": 1000, "base": 50}, default=50)
    others = [starved("other", 2, priority_class="base")]
    me = with_class(None)
    assert sharing.desired(me, held(4), others, [], free=0, priorities=classes) == 2, (
        "no class: the default's 50, equal to the starved job's: shares"
    )
    assert sharing.desired(me, held(4), others, [], free=0) == 4, (
        "without the classes the starved job names one that does not exist: no sharing"
    )
