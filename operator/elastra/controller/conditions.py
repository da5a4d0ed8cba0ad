"""Conditions and phase: what a user reads in ``kubectl get tj`` and ``elastra status``.

Pure: from the job's previous status and what this pass observed and decided, compute the
next status. A condition keeps its ``lastTransitionTime`` unless its status flips, so a pass
that sees nothing new produces an identical status, and the reconciler writes nothing
(a restarted operator at steady state makes no writes).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from elastra.api import (
    Condition,
    ConditionStatus,
    ConditionType,
    Phase,
    TrainingJobStatus,
)
from elastra.controller.observe import format_time


class ConditionReason(StrEnum):
    """Reasons the controller gives its conditions (and their Events), beyond the resize
    decision's own (``elastra.elastic.resize.Reason``), a hold's (``admission``) and the
    deadline's (``lifetime``). Users and alerts match on these strings: they are API."""

    PLANNED = "Planned"
    """Admitted: the planner found a plan (unless admission gave its own note)."""
    UNPLACEABLE = "Unplaceable"
    """Admitted False and Placed False: no node has a GPU type the job allows."""
    PLACED = "Placed"
    """Placed: every live pod is bound (the message counts them)."""
    INSUFFICIENT_CAPACITY = "InsufficientCapacity"
    """Placed False: no live pod, and no plan fits the free capacity."""
    UNSCHEDULABLE = "Unschedulable"
    """Placed False: the scheduler found no node for a pod."""
    BINDING = "Binding"
    """Placed False: pods are on their way to their nodes."""
    WORLD_RUNNING = "WorldRunning"
    NOT_RUNNING = "NotRunning"
    STEADY = "Steady"
    """Resizing False."""
    AT_DESIRED = "AtDesired"
    """Degraded False."""
    BELOW_DESIRED = "BelowDesired"
    """Degraded: the world is smaller than ``replicas`` for lack of capacity."""
    SIZE_UNFORMABLE = "WorldSizeUnformable"
    """Degraded: no world of ``replicas`` pods can train this job, whatever the capacity (the
    global batch does not split over that many replicas, memory); the message says why."""
    ACTIVE = "Active"
    """Suspended False."""
    ALL_WORKERS_SUCCEEDED = "AllWorkersSucceeded"
    NOT_FINISHED = "NotFinished"
    PERMANENT_FAILURE = "PermanentFailure"
    """Failed: a worker exited with a code in ``failurePolicy.permanentExitCodes``."""
    BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
    """Failed: restarts would exceed ``failurePolicy.maxRestarts``."""
    JOB_FAILED = "JobFailed"
    """Running, Resizing and Suspended False once the job failed."""
    INVALID_SPEC = "InvalidSpec"
    """Admitted False (and an Event): the operator cannot read a spec the API server accepted
    (usually a CRD older than the operator); the message names the field."""
    FAILED_CREATE = "FailedCreate"
    """Event only: the API server refused a worker pod (a ResourceQuota, an admission webhook,
    a LimitRange); the batch waits gated and the pass is retried with backoff."""


@dataclass(frozen=True)
class Verdict:
    """One condition as this pass sees it."""

    type: ConditionType
    true: bool
    reason: str
    message: str = ""


def merge_conditions(
    previous: Iterable[Condition], verdicts: Iterable[Verdict], *, now: datetime, generation: int
) -> list[Condition]:
    """The new condition list: transitions get ``now``, unchanged ones keep their time."""
    old = {c.type: c for c in previous}
    merged: list[Condition] = []
    for verdict in verdicts:
        status = ConditionStatus.TRUE if verdict.true else ConditionStatus.FALSE
        before = old.get(verdict.type)
        if before is not None and before.status == status:
            stamp = before.last_transition_time
        else:
            stamp = format_time(now)
        merged.append(
            Condition(
                type=verdict.type,
                status=status,
                reason=verdict.reason,
                message=verdict.message,
                last_transition_time=stamp,
                observed_generation=generation,
            )
        )
    return merged


def phase_of(conditions: Iterable[Condition]) -> Phase:
    """One word for ``kubectl get``: the most important true condition."""
    true = {c.type for c in conditions if c.status == ConditionStatus.TRUE}
    for kind, phase in (
        (ConditionType.FAILED, Phase.FAILED),
        (ConditionType.SUCCEEDED, Phase.SUCCEEDED),
        (ConditionType.SUSPENDED, Phase.SUSPENDED),
        (ConditionType.RESIZING, Phase.RESIZING),
        (ConditionType.DEGRADED, Phase.DEGRADED),
        (ConditionType.RUNNING, Phase.RUNNING),
        (ConditionType.PLACED, Phase.PLACING),
    ):
        if kind in true:
            return phase
    return Phase.PENDING


def condition(status: TrainingJobStatus, kind: ConditionType) -> Condition | None:
    """The condition of that type, if the status has it."""
    return next((c for c in status.conditions if c.type == kind), None)


def is_true(status: TrainingJobStatus, kind: ConditionType) -> bool:
    """Whether the condition of that type is True."""
    found = condition(status, kind)
    return found is not None and found.status == ConditionStatus.TRUE
