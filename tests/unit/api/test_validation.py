"""The pydantic models reject every invalid case with a message that blames the right field."""

from __future__ import annotations

import pytest

from elastra.api import parse_trainingjob
from elastra.errors import UserError
from tests.cases.specs import INVALID_SPECS, VALID_SPECS, InvalidCase, ValidCase


def test_the_table_is_large_enough() -> None:
    assert len(INVALID_SPECS) >= 25
    assert len(VALID_SPECS) >= 5
    assert len({case.id for case in INVALID_SPECS}) == len(INVALID_SPECS)


@pytest.mark.parametrize("case", INVALID_SPECS, ids=lambda c: c.id)
def test_invalid_spec_is_rejected_naming_the_field(case: InvalidCase) -> None:
    with pytest.raises(UserError) as caught:
        parse_trainingjob(case.manifest(), source="job.yaml")
    message = str(caught.value)
    assert message.startswith("job.yaml: ")
    assert f"{case.field}:" in message or f"{case.field}." in message, message
    assert case.local in message, message
    assert "\n" not in message


@pytest.mark.parametrize("case", VALID_SPECS, ids=lambda c: c.id)
def test_valid_spec_is_accepted(case: ValidCase) -> None:
    job = parse_trainingjob(case.manifest())
    assert job.spec.replicas == case.manifest()["spec"]["replicas"]


def test_defaults_are_filled() -> None:
    job = parse_trainingjob(VALID_SPECS[0].manifest())
    spec = job.spec
    assert spec.min_replicas == 2
    assert spec.parallelism.mode == "auto"
    assert spec.training.precision == "bf16"
    assert spec.training.consistency == "data"
    assert spec.checkpoint.path == "/checkpoints"
    assert spec.checkpoint.keep == 3
    assert spec.failure_policy.permanent_exit_codes == [2]
    assert spec.suspend is False


def test_wire_form_round_trips() -> None:
    job = parse_trainingjob(VALID_SPECS[-2].manifest())
    again = parse_trainingjob(
        {"apiVersion": job.api_version, "kind": job.kind, "spec": job.spec.to_wire()}
    )
    assert again.spec == job.spec
    assert "globalBatchSize" in job.spec.to_wire()["training"]
