"""Conditions and phase: what a user reads in ``kubectl get tj`` and ``elastra status``.

Pure: from the job's previous status and what this pass observed and decided, compute the
next status. A condition keeps its ``lastTransitionTime`` unless its status flips, so a pass
that sees nothing new produces an identical status, and the reconciler writes nothing
(a restarted operator at steady state makes no writes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from elastra.api import (
    Condition,
    ConditionStatus,
    ConditionType,
    Phase,
    TrainingJobStatus,
)
from elastra.api.reasons import Reason
from elastra.controller.decide.observe import format_time


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


def invalid_spec_status(
    status: Mapping[str, Any], message: str, *, now: datetime, generation: int
) -> dict[str, Any] | None:
    """The raw status of a job whose spec the operator cannot read, or ``None`` when it says
    so already: Admitted False (``Reason.INVALID_SPEC``, ``message``), merged as every pass
    merges its conditions; the other conditions and the phase as they were (a running job
    still trains on its last readable spec, and tools that act on ``Failed`` must not clean
    it up); only a job that never had a phase reads ``Failed``.

    Raw in, raw out: the spec cannot be parsed, so neither can the job.
    """
    previous = [c for c in status.get("conditions") or [] if isinstance(c, Mapping)]
    admitted = [c for c in previous if c.get("type") == ConditionType.ADMITTED]
    if any(c.get("message") == message for c in admitted):
        return None
    try:
        before = [Condition.model_validate(c) for c in admitted]
    except ValidationError:
        before = []  # an Admitted condition nobody could have written: judged afresh
    verdict = Verdict(ConditionType.ADMITTED, False, Reason.INVALID_SPEC, message)
    (merged,) = merge_conditions(before, [verdict], now=now, generation=generation)
    others = [c for c in previous if c.get("type") != ConditionType.ADMITTED]
    return {
        **status,
        "conditions": [*others, merged.to_wire()],
        "phase": status.get("phase") or str(Phase.FAILED),
    }


def condition(status: TrainingJobStatus, kind: ConditionType) -> Condition | None:
    """The condition of that type, if the status has it."""
    return next((c for c in status.conditions if c.type == kind), None)


def is_true(status: TrainingJobStatus, kind: ConditionType) -> bool:
    """Whether the condition of that type is True."""
    found = condition(status, kind)
    return found is not None and found.status == ConditionStatus.TRUE
