"""conditions: transition times move only on a flip; the phase is the weightiest true condition."""

from __future__ import annotations

from datetime import timedelta

import pytest

from elastra.api import Condition, ConditionType, Phase, Reason, TrainingJobStatus
from elastra.controller.decide.conditions import (
    Verdict,
    invalid_spec_status,
    is_true,
    merge_conditions,
    phase_of,
)
from elastra.controller.decide.observe import format_time
from tests.unit.controller.fakecluster import T0

C = ConditionType
LATER = T0 + timedelta(minutes=5)


def cond(kind: ConditionType, status: str, reason: str = "R") -> Condition:
    return Condition(type=kind, status=status, reason=reason, last_transition_time=format_time(T0))


@pytest.mark.parametrize(
    ("previous", "verdict", "stamp"),
    [
        ([], Verdict(C.RUNNING, True, "WorldRunning"), LATER),  # new: now
        ([cond(C.RUNNING, "False")], Verdict(C.RUNNING, True, "WorldRunning"), LATER),  # flip
        ([cond(C.RUNNING, "True")], Verdict(C.RUNNING, True, "Other", "new words"), T0),  # same
    ],
    ids=["new", "flipped", "same-status-new-reason"],
)
def test_transition_time_moves_only_when_the_status_flips(
    previous: list[Condition], verdict: Verdict, stamp: object
) -> None:
    (merged,) = merge_conditions(previous, [verdict], now=LATER, generation=4)
    assert merged.last_transition_time == format_time(stamp)  # type: ignore[arg-type]
    assert (merged.reason, merged.message, merged.observed_generation) == (
        verdict.reason,
        verdict.message,
        4,
    )


def test_an_unchanged_pass_yields_identical_conditions() -> None:
    """What lets a steady job's pass write nothing."""
    verdicts = [Verdict(C.RUNNING, True, "WorldRunning"), Verdict(C.DEGRADED, False, "AtDesired")]
    first = merge_conditions([], verdicts, now=T0, generation=1)
    assert merge_conditions(first, verdicts, now=LATER, generation=1) == first


@pytest.mark.parametrize(
    ("true", "phase"),
    [
        ((), Phase.PENDING),
        ((C.PLACED,), Phase.PLACING),
        ((C.PLACED, C.RUNNING), Phase.RUNNING),
        ((C.RUNNING, C.DEGRADED), Phase.DEGRADED),
        ((C.RUNNING, C.DEGRADED, C.RESIZING), Phase.RESIZING),
        ((C.RESIZING, C.SUSPENDED), Phase.SUSPENDED),
        ((C.SUSPENDED, C.SUCCEEDED), Phase.SUCCEEDED),
        ((C.SUCCEEDED, C.FAILED), Phase.FAILED),
        ((C.FAILED,), Phase.FAILED),
    ],
)
def test_phase_is_the_weightiest_true_condition(
    true: tuple[ConditionType, ...], phase: Phase
) -> None:
    conditions = [cond(kind, "True") for kind in true] + [cond(C.ADMITTED, "False")]
    assert phase_of(conditions) is phase


def test_is_true_reads_one_condition() -> None:
    status = TrainingJobStatus(conditions=[cond(C.RUNNING, "True"), cond(C.PLACED, "False")])
    assert (is_true(status, C.RUNNING), is_true(status, C.PLACED), is_true(status, C.FAILED)) == (
        True,
        False,
        False,
    )


RUNNING = {"type": "Running", "status": "True", "reason": "WorldRunning"}
ADMITTED = {
    "type": "Admitted",
    "status": "False",
    "reason": "InvalidSpec",
    "message": "spec.replicas: old words",
    "lastTransitionTime": format_time(T0),
}


@pytest.mark.parametrize(
    ("status", "conditions", "phase", "stamp"),
    [
        ({}, [], "Failed", LATER),  # never had a phase: Failed
        ({"phase": "Running", "conditions": [RUNNING]}, [RUNNING], "Running", LATER),
        # already False for another message: new words, the transition time kept
        ({"phase": "Running", "conditions": [ADMITTED, RUNNING]}, [RUNNING], "Running", T0),
    ],
    ids=["new-job", "running-job", "new-message"],
)
def test_an_unreadable_spec_turns_admitted_false_and_keeps_the_rest(
    status: dict[str, object], conditions: list[object], phase: str, stamp: object
) -> None:
    got = invalid_spec_status(status, "spec.replicas: new words", now=LATER, generation=3)
    assert got is not None
    *others, admitted = got["conditions"]
    assert others == conditions and got["phase"] == phase
    assert admitted == {
        "type": "Admitted",
        "status": "False",
        "reason": Reason.INVALID_SPEC,
        "message": "spec.replicas: new words",
        "lastTransitionTime": format_time(stamp),  # type: ignore[arg-type]
        "observedGeneration": 3,
    }


def test_an_unreadable_spec_already_reported_writes_nothing() -> None:
    status = {"phase": "Running", "conditions": [ADMITTED, RUNNING]}
    assert invalid_spec_status(status, ADMITTED["message"], now=LATER, generation=3) is None
