"""Calibration recovers a GPU type's efficiency from step times the model itself produced."""

from __future__ import annotations

import dataclasses

import pytest

from elastra.errors import UserError
from elastra.planner.calibration import Measurement, fit, parse_measurements, predict_step_s
from elastra.planner.job import ModelShape
from elastra.planner.perfmodel import DEFAULT_CONSTANTS

MODEL = {
    "layers": 32,
    "hiddenSize": 4096,
    "ffnHiddenSize": 11008,
    "attentionHeads": 32,
    "vocabSize": 32000,
    "sequenceLength": 4096,
}


def measurement(**overrides: object) -> Measurement:
    fields: dict[str, object] = {
        "gpu_type": "L40S",
        "gpus": 16,
        "model": ModelShape(32, 4096, 11008, 32, 32, 32000, 4096),
        "global_batch_size": 64,
        "tp": 4,
        "pp": 2,
        "micro_batch": 1,
        "sharding": "optimizer",
        "recompute": "full",
        "step_time_s": 1.0,
    }
    fields.update(overrides)
    return Measurement(**fields)  # type: ignore[arg-type]


def test_fit_recovers_a_known_efficiency() -> None:
    truth = dataclasses.replace(DEFAULT_CONSTANTS, efficiency=(("L40S", 0.41),))
    measured = []
    for tp, micro_batch in ((4, 1), (8, 2)):
        m = measurement(tp=tp, micro_batch=micro_batch)
        step = predict_step_s(m, truth)
        assert step is not None
        measured.append(dataclasses.replace(m, step_time_s=step))
    fitted = fit(measured)
    assert dict(fitted.efficiency)["L40S"] == pytest.approx(0.41, abs=0.005)


def test_parse_the_documented_format() -> None:
    entry = {
        "gpuType": "NVIDIA-L40S",
        "gpus": 16,
        "model": MODEL,
        "globalBatchSize": 64,
        "tp": 4,
        "pp": 2,
        "microBatchSize": 1,
        "sharding": "optimizer",
        "recompute": "full",
        "stepTimeSeconds": 3.5,
    }
    (parsed,) = parse_measurements({"measurements": [entry]})
    assert parsed.gpu_type == "L40S" and parsed.step_time_s == 3.5


def test_missing_field_names_the_entry() -> None:
    with pytest.raises(UserError, match=r"measurements\[0\]: missing field model"):
        parse_measurements({"measurements": [{"gpuType": "L4"}]})
