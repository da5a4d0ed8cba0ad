"""Each condition a pass reports, from what the pass found: one table per condition.

The tables give the findings that differ from an ordinary running world of two Ready,
bound workers; the transcripts at the end run passes on the fake cluster for the Degraded
reasons users read when a world cannot reach ``replicas``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from elastra.api import Condition, ConditionType
from elastra.api.reasons import Reason
from elastra.controller.decide.admission import Hold
from elastra.controller.decide.conditions import Verdict
from elastra.controller.decide.observe import PodFacts
from elastra.controller.decide.planning import Placement
from elastra.controller.decide.verdicts import (
    RUNNING_CONDITIONS,
    Findings,
    admitted,
    degraded,
    failure,
    placed,
    resizing,
    running,
    running_verdicts,
    succeeded,
    suspended,
)
from elastra.elastic.resize import ResizeDecision
from elastra.elastic.workers import NodeName, PodName, WorkerState, WorkerView
from tests.unit.controller.fakecluster import T0, FakeCluster, gpt_job, node
from tests.unit.controller.test_passplan import SETTINGS

A100 = "NVIDIA-A100-SXM4-80GB"
STEADY = ResizeDecision(world=None, reason=Reason.STEADY, message="world steady")


def pod(
    slot: int,
    state: WorkerState = WorkerState.READY,
    *,
    bound: bool = True,
    unschedulable: bool = False,
) -> PodFacts:
    view = WorkerView(
        pod=PodName(f"gpt-w{slot}"),
        slot=slot,
        state=state,
        since=T0,
        node=NodeName(f"n{slot}") if bound else None,
        unschedulable=unschedulable,
    )
    return PodFacts(
        view=view,
        raw={},
        assignment="",
        assignment_version=0,
        ip=None,
        bound=bound,
        node_gone=False,
        gated=False,
        exit_code=None,
    )


TWO = [pod(0), pod(1)]
ORDINARY = Findings(
    replicas=2,
    decision=STEADY,
    members=TWO,
    world_size=2,
    live=TWO,
    placement=Placement(pods=(), target=2),
)
SHORT = {"replicas": 4, "placement": Placement(pods=(), target=2, limited=True)}
"""A world of 2 where 4 are asked for and capacity limits the plan."""


def found(**changes: Any) -> Findings:
    return dataclasses.replace(ORDINARY, **changes)


CASES: list[Any] = [
    # Admitted
    (admitted, {}, (True, "Planned", "the planner found a plan")),
    (
        admitted,
        {"note": ("AdmittedByKueue", "by queue q")},
        (True, "AdmittedByKueue", "by queue q"),
    ),
    (admitted, {"impossible": "no A100 node"}, (False, "Unplaceable", "no A100 node")),
    # Placed
    (placed, {}, (True, "Placed", "2 of 2 bound")),
    (placed, {"live": [pod(0), pod(1, bound=False)]}, (False, "Binding", "1 of 2 bound")),
    (
        placed,
        {"live": [pod(0, bound=False, unschedulable=True)]},
        (False, "Unschedulable", "0 of 1 bound"),
    ),
    (
        placed,
        {"live": [], "placement": Placement(pods=(), reason="no plan fits: x")},
        (False, "InsufficientCapacity", "no plan fits: x"),
    ),
    (placed, {"impossible": "no A100", "live": []}, (False, "Unplaceable", "no A100")),
    (placed, {"live": [], "creating": 2}, (False, "Binding", "0 of 2 bound")),
    (placed, {"live": [pod(0)], "creating": 1}, (False, "Binding", "1 of 2 bound")),
    # Running
    (running, {}, (True, "WorldRunning", "2 workers in the world")),
    (
        running,
        {"members": [pod(0), pod(1, WorkerState.PENDING)]},
        (False, "NotRunning", "world steady"),
    ),
    (running, {"members": []}, (False, "NotRunning", "world steady")),
    # Resizing
    (resizing, {}, (False, "Steady", "")),
    (
        resizing,
        {
            "decision": ResizeDecision(
                world=(PodName("gpt-w0"),), reason=Reason.SCALED_DOWN, message="m"
            )
        },
        (True, "ScaledDown", "m"),
    ),
    (
        resizing,
        {"forming": ("WorldFormed", "formed a world of 2 workers")},
        (True, "WorldFormed", "formed a world of 2 workers"),
    ),
    # Degraded
    (degraded, {}, (False, "AtDesired", "")),
    (
        degraded,
        {
            "decision": dataclasses.replace(
                STEADY, reason=Reason.INSUFFICIENT_CAPACITY, degraded=True
            )
        },
        (True, "InsufficientCapacity", "world steady"),
    ),
    (degraded, {"plan_problem": "cannot train"}, (True, "BelowDesired", "cannot train")),
    (degraded, SHORT, (True, "BelowDesired", "world has 2 of 4 desired workers")),
    (
        degraded,
        {**SHORT, "placement": Placement(pods=(), limited=True, short_reason="no room")},
        (True, "BelowDesired", "world has 2 of 4 desired workers; 4 cannot: no room"),
    ),
    (
        degraded,
        {**SHORT, "placement": Placement(pods=(), limited=True, unformable=True)},
        (True, "WorldSizeUnformable", "world has 2 of 4 desired workers"),
    ),
    # Forming, not short: every pod the job asks for exists.
    (degraded, {**SHORT, "live": [pod(i) for i in range(4)]}, (False, "AtDesired", "")),
    # A plan smaller by preference is not short.
    (degraded, {**SHORT, "placement": Placement(pods=(), target=2)}, (False, "AtDesired", "")),
    # Held: Suspended says so; Degraded keeps its reason but is not True.
    (
        degraded,
        {**SHORT, "hold": Hold("Suspended", "spec.suspend")},
        (False, "BelowDesired", "world has 2 of 4 desired workers"),
    ),
    (degraded, {**SHORT, "impossible": "no A100 node"}, (False, "AtDesired", "")),
    # Suspended
    (suspended, {}, (False, "Active", "")),
    (suspended, {"hold": Hold("Suspended", "spec.suspend")}, (True, "Suspended", "spec.suspend")),
    # Succeeded
    (succeeded, {}, (False, "NotFinished", "")),
    (
        succeeded,
        {"decision": dataclasses.replace(STEADY, reason=Reason.COMPLETED, completed=True)},
        (True, "AllWorkersSucceeded", "world steady"),
    ),
]


@pytest.mark.parametrize(("condition", "changes", "expected"), CASES)
def test_each_condition_from_what_the_pass_found(
    condition: Callable[[Findings], Verdict],
    changes: dict[str, Any],
    expected: tuple[bool, str, str],
) -> None:
    verdict = condition(found(**changes))
    assert (verdict.true, verdict.reason, verdict.message) == expected


def test_a_running_pass_reports_every_condition_once_in_order() -> None:
    types = [v.type for v in running_verdicts(ORDINARY)]
    assert types == [c(ORDINARY).type for c in RUNNING_CONDITIONS]
    assert types == [
        ConditionType.ADMITTED,
        ConditionType.PLACED,
        ConditionType.RUNNING,
        ConditionType.RESIZING,
        ConditionType.DEGRADED,
        ConditionType.SUSPENDED,
        ConditionType.SUCCEEDED,
    ]


def test_a_failure_turns_off_what_it_ends_and_leaves_the_rest() -> None:
    previous = [
        Condition(type=t, status="True", reason="x", last_transition_time="2026-01-01T00:00:00Z")
        for t in (ConditionType.PLACED, ConditionType.RUNNING, ConditionType.SUSPENDED)
    ]
    verdicts = failure(previous, Reason.PERMANENT_FAILURE, "code 2")
    assert [(v.type, v.true, v.reason) for v in verdicts] == [
        (ConditionType.FAILED, True, "PermanentFailure"),
        (ConditionType.RUNNING, False, "JobFailed"),
        (ConditionType.SUSPENDED, False, "JobFailed"),
    ]


def job(replicas: int, batch: int) -> dict[str, Any]:
    return gpt_job(replicas, training={"globalBatchSize": batch})


def degraded_condition(cluster: FakeCluster) -> tuple[str, str, str]:
    cond = next(c for c in cluster.job.status.conditions if c.type == "Degraded")
    return cond.status, cond.reason, cond.message


def test_a_size_no_world_can_train_says_why_in_the_condition_and_an_event() -> None:
    # 3 pods are 24 ranks, but 16 sequences give at most 16 replicas one each.
    cluster = FakeCluster(job(2, 16), [node(f"a100-{i}", product=A100) for i in range(4)], SETTINGS)
    cluster.converge()
    assert degraded_condition(cluster)[0] == "False"
    cluster.job_body["spec"]["replicas"] = 3
    cluster.converge()
    assert cluster.job.status.world.replicas == 2
    status, reason, message = degraded_condition(cluster)
    assert (status, reason) == ("True", Reason.SIZE_UNFORMABLE)
    assert message.startswith("world has 2 of 3 desired workers; 3 cannot: ")
    assert "dp=24 replicas exceed globalBatchSize=16" in message
    events = [m for r, m in cluster.events if r == Reason.SIZE_UNFORMABLE]
    assert events == [message], "one Event, when the condition took the reason"


def test_short_of_capacity_stays_below_desired_with_the_reason() -> None:
    cluster = FakeCluster(job(4, 64), [node(f"a100-{i}", product=A100) for i in range(2)], SETTINGS)
    cluster.converge()
    status, reason, message = degraded_condition(cluster)
    assert (status, reason) == ("True", Reason.BELOW_DESIRED)
    assert message.startswith("world has 2 of 4 desired workers; 4 cannot: not enough capacity")
