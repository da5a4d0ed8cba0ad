"""The one road from a planner's plan to the workers': what status records carries every
layout field the planner chose, and a record the planner could not have written is refused
with the field named."""

from __future__ import annotations

import pytest

from elastra.api import PlanStatus
from elastra.errors import UserError
from elastra.planner import JobPlan, plan_job
from elastra.planner.record import assignment_plan, plan_status
from elastra_worker.assignment import default_coords

from .nodes import fleet
from .test_search import job


def best(**fields: object) -> JobPlan:
    result = plan_job(job(**{"replicas": 4, **fields}), fleet(h100=2, a100=2))
    assert result.plans, result.reason
    return result.plans[0]


@pytest.mark.parametrize(
    "job",
    [
        {},  # the best plan of a mixed fleet, whatever its degrees
        {"model": None, "gpus_per_worker": 1},  # no model: no stages
        {"replicas": 1, "global_batch_size": 64},
    ],
)
def test_the_record_carries_what_the_planner_placed(job: dict[str, object]) -> None:
    plan = best(**job)
    layers = plan.stages[-1].stop if plan.stages else 0
    carried = assignment_plan(plan_status(plan), layers=layers)
    assert (carried.dp, carried.tp, carried.pp) == (plan.dp, plan.tp, plan.pp)
    assert carried.micro_batch_size == plan.micro_batch
    assert carried.virtual_stages == plan.interleave
    assert (carried.sharding, carried.recompute) == (plan.sharding, plan.recompute)
    assert carried.batch_shares == plan.batch_shares
    assert carried.stages == plan.stages
    placed = tuple((r.rank, r.dp_rank, r.tp_rank, r.pp_stage) for r in plan.ranks)
    worker = tuple((c.rank, c.dp_rank, c.tp_rank, c.pp_stage) for c in carried.ranks or
                   default_coords(carried.dp, carried.tp, carried.pp))  # fmt: skip
    assert worker == placed


@pytest.mark.parametrize(
    ("field", "value"),
    [("schedule", "zigzag"), ("sharding", "half"), ("recompute", "some")],
)
def test_a_record_the_planner_cannot_write_names_the_field(field: str, value: str) -> None:
    recorded = PlanStatus(dp=2, **{field: value})  # type: ignore[arg-type]
    with pytest.raises(UserError, match=f"status.plan: '{value}' is not one of"):
        assignment_plan(recorded, layers=0)
