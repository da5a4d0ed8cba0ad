"""The performance model against published large-scale runs (sources in
``elastra.planner.validation``): manual mode with the published layout predicts the achieved
TFLOP/s per GPU within +-25%; auto mode never picks a plan its own model rates worse."""

from __future__ import annotations

import pytest

from elastra.planner.validation import (
    PUBLISHED_RUNS,
    PublishedRun,
    plan_auto,
    predict_published,
    predicted_tflops,
)

TOLERANCE = 0.25


def test_at_least_three_independent_sources() -> None:
    sources = {run.source.split()[0] for run in PUBLISHED_RUNS}
    assert len(sources) >= 3
    assert {run.gpu_type for run in PUBLISHED_RUNS} >= {"A100-SXM-80GB", "H100-SXM-80GB"}


@pytest.mark.parametrize("run", PUBLISHED_RUNS, ids=lambda run: run.name)
def test_published_layout_is_predicted_within_tolerance(run: PublishedRun) -> None:
    result = predict_published(run)
    assert result.feasible, result.reason  # the published layout fits memory under the model
    predicted = predicted_tflops(run, result)
    error = predicted / run.tflops_per_gpu - 1.0
    assert abs(error) <= TOLERANCE, f"{run.name}: {predicted:.0f} vs {run.tflops_per_gpu:.0f}"


AUTO_RUNS = [run for run in PUBLISHED_RUNS if run.gpus <= 4096]


@pytest.mark.parametrize("run", AUTO_RUNS, ids=lambda run: run.name)
def test_auto_mode_never_picks_worse_than_published(run: PublishedRun) -> None:
    published = predict_published(run).plans[0].predicted.tokens_per_s
    chosen = plan_auto(run).plans[0].predicted.tokens_per_s
    assert chosen >= published * (1 - 1e-9)
