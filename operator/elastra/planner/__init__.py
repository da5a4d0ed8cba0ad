"""The placement planner: pure code from (job requirements, cluster inventory) to ranked plans.

It imports nothing from Kubernetes or Kopf (an import-linter contract enforces it), so the
operator, the simulator and ``elastra plan`` share it and tests run without a cluster.
Modules: ``catalog`` (GPU figures), ``inventory`` (Nodes -> capacity), ``job`` (what the
planner needs to know about a job), ``perfmodel`` (step time and memory), ``search`` (the
ranked search), ``placement`` (rank -> node), ``plan`` (result types and their JSON form),
``record`` (the plan as status records it and assignments carry it), ``calibration``
(fitting the model to measured steps), ``validation`` (published runs).
"""

from elastra.planner.inventory import Inventory, parse_inventory
from elastra.planner.job import JobRequirements, ModelShape
from elastra.planner.plan import JobPlan, PlanResult, plan_to_dict, result_to_dict
from elastra.planner.search import plan_job

__all__ = [
    "Inventory",
    "JobPlan",
    "JobRequirements",
    "ModelShape",
    "PlanResult",
    "parse_inventory",
    "plan_job",
    "plan_to_dict",
    "result_to_dict",
]
