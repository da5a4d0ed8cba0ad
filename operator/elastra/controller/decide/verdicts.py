"""What one pass says about each condition: one small function per condition.

A running pass gathers what it found (``Findings``) and asks each condition's function for
its ``Verdict``; ``conditions.merge_conditions`` turns them into the status's conditions.
A job that fails gets ``failure``'s verdicts instead. Every reason is an
``elastra.api.Reason`` (the resize decision's and a hold's too).

Pure: values in, verdicts out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from elastra.api import Condition, ConditionType
from elastra.api.reasons import Reason
from elastra.controller.decide.admission import Hold
from elastra.controller.decide.conditions import Verdict
from elastra.controller.decide.observe import PodFacts
from elastra.controller.decide.planning import Placement
from elastra.elastic.resize import ResizeDecision
from elastra.elastic.workers import WorkerState

PLANNED_MESSAGE = "the planner found a plan"


@dataclass(frozen=True)
class Findings:
    """What a running pass found and decided, as the conditions read it."""

    replicas: int
    """The workers the job asks for (``spec.replicas``)."""
    decision: ResizeDecision
    members: Sequence[PodFacts]
    """The pods of the world this pass records that exist."""
    world_size: int
    """Pods in the world this pass records (members or not)."""
    live: Sequence[PodFacts]
    """Pods neither retiring nor broken: the ones that should be, or get, bound."""
    placement: Placement
    creating: int = 0
    """Pods this pass creates: live from now on, and not bound yet."""
    forming: tuple[str, str] | None = None
    """The reason and message of the resize whose world is still forming (recorded by an
    earlier pass; not every member is Ready yet), if one is."""
    impossible: str | None = None
    """Why waiting cannot help (no node of an allowed GPU type), if so."""
    plan_problem: str | None = None
    """Why the world the decision asked for cannot train, if it cannot."""
    hold: Hold | None = None
    note: tuple[str, str] | None = None
    """Admission's reason and message for Admitted (Kueue), if it gave one."""
    capacity: tuple[str, str] | None = None
    """The reason and message of the job's request for nodes (``capacity_requests``), while
    it asks or once it went unanswered."""


def admitted(found: Findings) -> Verdict:
    """Admitted: False only when no node could ever run the job."""
    if found.impossible is not None:
        return Verdict(ConditionType.ADMITTED, False, Reason.UNPLACEABLE, found.impossible)
    reason, message = found.note or (Reason.PLANNED, PLANNED_MESSAGE)
    return Verdict(ConditionType.ADMITTED, True, reason, message)


def placed(found: Findings) -> Verdict:
    """Placed: every live pod (and every pod the pass creates) is bound to a node."""
    unbound = [f for f in found.live if not f.bound]
    live = len(found.live) + found.creating
    true = live > 0 and not unbound and not found.creating
    reason: str = Reason.PLACED
    message = f"{len(found.live) - len(unbound)} of {live} bound"
    if found.impossible is not None:
        reason, message = Reason.UNPLACEABLE, found.impossible
    elif not live and found.capacity is not None:
        reason, message = found.capacity
    elif not live and found.placement.reason:
        reason, message = Reason.INSUFFICIENT_CAPACITY, found.placement.reason
    elif unbound or found.creating:
        stuck = any(f.view.unschedulable for f in unbound)
        reason = Reason.UNSCHEDULABLE if stuck else Reason.BINDING
    return Verdict(ConditionType.PLACED, true, reason, message)


def running(found: Findings) -> Verdict:
    """Running: the world has pods and every one of them is Ready."""
    members = found.members
    if members and all(f.view.state is WorkerState.READY for f in members):
        message = f"{found.world_size} workers in the world"
        return Verdict(ConditionType.RUNNING, True, Reason.WORLD_RUNNING, message)
    return Verdict(ConditionType.RUNNING, False, Reason.NOT_RUNNING, found.decision.message)


def resizing(found: Findings) -> Verdict:
    """Resizing: the decision changes the world or its pods, or the world an earlier resize
    recorded is still forming (like a Deployment's Progressing: True until the change is
    done, with the resize's reason and message, so the passes in between write nothing)."""
    decision = found.decision
    if decision.resizes:
        return Verdict(ConditionType.RESIZING, True, decision.reason.value, decision.message)
    if found.forming is not None:
        return Verdict(ConditionType.RESIZING, True, *found.forming)
    return Verdict(ConditionType.RESIZING, False, Reason.STEADY)


def degraded(found: Findings) -> Verdict:
    """Degraded: the job trains below what it asks for, or cannot train the world it has.

    A held job is never Degraded (it is Suspended) but keeps the reason it would have.
    """
    why = _degradation(found)
    if why is None:
        return Verdict(ConditionType.DEGRADED, False, Reason.AT_DESIRED)
    reason, message = why
    return Verdict(ConditionType.DEGRADED, found.hold is None, reason, message)


def _degradation(found: Findings) -> tuple[str, str] | None:
    """Why the job is degraded (reason, message), or ``None``: it is not (or is unplaceable,
    which Admitted and Placed say)."""
    decision = found.decision
    if found.impossible is not None:
        return None
    if decision.degraded:
        return decision.reason.value, _asked(found.plan_problem or decision.message, found)
    if found.plan_problem is not None:
        return Reason.BELOW_DESIRED, found.plan_problem
    return _shortage(found) if _short(found) else None


def _shortage(found: Findings) -> tuple[str, str]:
    """A world short of ``replicas``: the planner's why, when it knows one."""
    placement = found.placement
    message = f"world has {found.world_size} of {found.replicas} desired workers"
    if placement.limited and placement.short_reason:
        message += f"; {found.replicas} cannot: {placement.short_reason}"
    if placement.unformable:
        return Reason.SIZE_UNFORMABLE, message
    return Reason.BELOW_DESIRED, _asked(message, found)


def _asked(message: str, found: Findings) -> str:
    """``message`` and what the job asked the autoscaler for, if it asks."""
    return f"{message}; {found.capacity[1]}" if found.capacity is not None else message


def _short(found: Findings) -> bool:
    """Short of workers, not merely forming: a job whose pods all exist but are not Ready or
    not in the world yet is starting or growing, which is no reason for a Warning."""
    placement = found.placement
    return (
        found.world_size < found.replicas
        and len(found.live) < found.replicas
        and (placement.limited or placement.target is None)
    )


def suspended(found: Findings) -> Verdict:
    """Suspended: something holds the job (``spec.suspend``, Kueue, the deadline)."""
    if found.hold is None:
        return Verdict(ConditionType.SUSPENDED, False, Reason.ACTIVE)
    return Verdict(ConditionType.SUSPENDED, True, found.hold.reason, found.hold.message)


def succeeded(found: Findings) -> Verdict:
    """Succeeded: every worker of the world exited 0."""
    decision = found.decision
    if decision.completed:
        reason = Reason.ALL_WORKERS_SUCCEEDED
        return Verdict(ConditionType.SUCCEEDED, True, reason, decision.message)
    return Verdict(ConditionType.SUCCEEDED, False, Reason.NOT_FINISHED)


RUNNING_CONDITIONS: tuple[Callable[[Findings], Verdict], ...] = (
    admitted,
    placed,
    running,
    resizing,
    degraded,
    suspended,
    succeeded,
)
"""A running pass's conditions, in the order the status lists them."""


def running_verdicts(found: Findings) -> list[Verdict]:
    """Every condition of a job that has not ended."""
    return [verdict(found) for verdict in RUNNING_CONDITIONS]


STOPPED_BY_FAILURE = (ConditionType.RUNNING, ConditionType.RESIZING, ConditionType.SUSPENDED)
"""Conditions a failed job turns False (when it has them)."""


def failure(previous: Iterable[Condition], reason: str, message: str) -> list[Verdict]:
    """Failed, and False for the conditions of ``previous`` that a failure ends."""
    return [
        Verdict(ConditionType.FAILED, True, reason, message),
        *(
            Verdict(c.type, False, Reason.JOB_FAILED, message)
            for c in previous
            if c.type in STOPPED_BY_FAILURE
        ),
    ]
