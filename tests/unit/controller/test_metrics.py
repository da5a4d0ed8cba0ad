"""The job gauges: each job counted once, under its latest phase, with its restarts and goodput,
and no more once deleted."""

from __future__ import annotations

from prometheus_client import REGISTRY

from elastra.api import Phase, ProgressStatus, TrainingJobStatus
from elastra.controller.engine import metrics


def jobs_in(phase: Phase) -> float:
    return REGISTRY.get_sample_value("elastra_jobs", {"phase": str(phase)}) or 0.0


def restarts_of(job: str) -> float | None:
    return REGISTRY.get_sample_value("elastra_job_restarts", {"namespace": "m", "job": job})


def goodput_of(job: str) -> float | None:
    return REGISTRY.get_sample_value("elastra_job_goodput_ratio", {"namespace": "m", "job": job})


def test_a_job_moves_between_phases_and_leaves_the_count_when_deleted() -> None:
    before = {phase: jobs_in(phase) for phase in Phase}
    metrics.observe_job("m", "a", TrainingJobStatus(phase=Phase.PLACING))
    measured = ProgressStatus(step=9, goodput_percent=87)
    metrics.observe_job(
        "m", "b", TrainingJobStatus(phase=Phase.RUNNING, restarts=2, progress=measured)
    )
    metrics.observe_job("m", "a", TrainingJobStatus(phase=Phase.RUNNING))
    assert jobs_in(Phase.RUNNING) == before[Phase.RUNNING] + 2
    assert jobs_in(Phase.PLACING) == before[Phase.PLACING]
    assert restarts_of("b") == 2
    assert goodput_of("b") == 0.87
    assert goodput_of("a") is None, "not measured yet: nothing exported"

    metrics.forget_job("m", "a")
    metrics.forget_job("m", "b")
    assert {phase: jobs_in(phase) for phase in Phase} == before
    assert restarts_of("b") is None
    assert goodput_of("b") is None


def test_a_job_without_a_phase_yet_counts_as_pending() -> None:
    before = jobs_in(Phase.PENDING)
    metrics.observe_job("m", "new", TrainingJobStatus())
    assert jobs_in(Phase.PENDING) == before + 1
    metrics.forget_job("m", "new")
    assert jobs_in(Phase.PENDING) == before


def test_forgetting_an_unknown_job_changes_nothing() -> None:
    before = {phase: jobs_in(phase) for phase in Phase}
    metrics.forget_job("m", "never-seen")
    assert {phase: jobs_in(phase) for phase in Phase} == before
