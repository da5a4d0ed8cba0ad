"""The one road from the planner's plan to the workers': ``JobPlan`` -> ``PlanStatus`` ->
``ParallelPlan``.

The operator records the plan a world runs in ``status.plan`` (``plan_status``) and builds
every assignment of that world from the record (``assignment_plan``), so a later pass, or a
new operator after a restart, writes the same assignments without planning again.
``elastra plan -o json`` prints its layout fields through the same two functions
(``plan_to_dict``), so what the command shows is what the workers are told, by construction
rather than by a test that two translations agree.

The record needs neither the rank list nor the stages' layers: the planner numbers ranks in
the default order (``elastra.planner.placement``) and splits layers with ``split_layers``,
so both follow from the degrees and the model's layer count. The assignment leaves the rank
list out (the worker reads an empty one as that same order): listing 64 ranks made 4 KB of
every pod, which every watcher of pods receives on each change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

# ``elastra.api.status``, not ``elastra.api``: the API package imports the GPU catalog, so a
# planner module the planner package loads must not start the API package's __init__.
from elastra.api.status import PlanStatus
from elastra.errors import UserError
from elastra_worker.assignment import (
    RECOMPUTES,
    SCHEDULES,
    SHARDINGS,
    ParallelPlan,
    default_schedule,
    split_layers,
)

if TYPE_CHECKING:
    from elastra.planner.plan import JobPlan

Choice = TypeVar("Choice", bound=str)


def plan_status(plan: JobPlan) -> PlanStatus:
    """The plan as ``status.plan`` records it (integers only, as API conventions ask)."""
    return PlanStatus(
        dp=plan.dp,
        tp=plan.tp,
        pp=plan.pp,
        shape=f"{plan.dp}x{plan.tp}x{plan.pp}",
        micro_batch_size=plan.micro_batch,
        virtual_stages=plan.interleave,
        schedule=default_schedule(plan.pp, plan.interleave),
        sharding=plan.sharding,
        recompute=plan.recompute,
        gpu_types={str(t.gpu_type): t.gpus for t in plan.types},
        gpu_summary=",".join(f"{t.gpu_type}:{t.gpus}" for t in plan.types),
        batch_shares={str(t.gpu_type): t.batch_share for t in plan.types},
        dp_shares=list(plan.batch_shares),
        predicted_step_millis=round(plan.predicted.step_time_s * 1000),
        predicted_tokens_per_second=round(plan.predicted.tokens_per_s),
        bottleneck=plan.predicted.bottleneck,
    )


def assignment_plan(recorded: PlanStatus, *, layers: int) -> ParallelPlan:
    """The plan every assignment of the world recorded as ``recorded`` carries, for a model
    of ``layers`` transformer layers (0: no model, no stage list)."""
    stages = recorded.pp * recorded.virtual_stages
    return ParallelPlan(
        dp=recorded.dp,
        tp=recorded.tp,
        pp=recorded.pp,
        micro_batch_size=recorded.micro_batch_size,
        batch_shares=tuple(recorded.dp_shares),
        virtual_stages=recorded.virtual_stages,
        schedule=_literal(recorded.schedule, SCHEDULES),
        sharding=_literal(recorded.sharding, SHARDINGS),
        recompute=_literal(recorded.recompute, RECOMPUTES),
        ranks=(),
        stages=split_layers(layers, stages) if layers else (),
    )


def _literal(value: str, allowed: tuple[Choice, ...]) -> Choice:
    """``value`` as one of ``allowed`` (the status holds plain strings the planner wrote)."""
    for option in allowed:
        if option == value:
            return option
    raise UserError(f"status.plan: {value!r} is not one of {', '.join(allowed)}")
