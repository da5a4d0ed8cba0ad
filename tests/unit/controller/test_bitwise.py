"""``consistency: bitwise`` stays data parallel and keeps its micro-batch across worlds.

The micro-batch is the logical share whose order fixes the gradient sum, so every world
version of a bitwise job must use the one its first world used; other jobs let the planner
choose again.
"""

from __future__ import annotations

from typing import Any

import pytest

from elastra.api import parse_trainingjob
from elastra.controller.decide.planning import requirements
from elastra.planner import plan_job
from elastra_worker.assignment import parse_assignment
from tests.unit.controller.fakecluster import FakeCluster, gpt_job, node
from tests.unit.controller.test_passplan import SETTINGS, assignment
from tests.unit.planner.nodes import fleet

MODEL = {  # about 1B parameters: whole replicas fit an 80 GB GPU
    "layers": 16,
    "hiddenSize": 2048,
    "ffnHiddenSize": 5504,
    "attentionHeads": 16,
    "vocabSize": 32000,
    "sequenceLength": 2048,
}


def job(consistency: str, replicas: int = 4) -> dict[str, Any]:
    training = {"globalBatchSize": 512, "consistency": consistency}
    return gpt_job(replicas, model=MODEL, training=training)


@pytest.mark.parametrize(("consistency", "data_parallel"), [("bitwise", True), ("data", False)])
def test_auto_plans_of_a_bitwise_job_are_data_parallel(
    consistency: str, data_parallel: bool
) -> None:
    # Other jobs get sharding (or tensor/pipeline degrees) where they pay; bitwise plans
    # tp = pp = 1 and whole replicas (no sharding) only.
    body = job(consistency)
    parsed = parse_trainingjob(body)
    result = plan_job(requirements(parsed, replicas=4, minimum=1), fleet(h100=4), top_k=5)
    assert result.feasible, result.reason
    layouts = {(p.tp, p.pp, p.sharding) for p in result.plans}
    assert (layouts == {(1, 1, "none")}) is data_parallel


@pytest.mark.parametrize(("consistency", "pinned"), [("bitwise", True), ("data", False)])
def test_bitwise_keeps_the_micro_batch_of_its_first_world(consistency: str, pinned: bool) -> None:
    cluster = FakeCluster(job(consistency), [node(f"h100-{i}") for i in range(5)], SETTINGS)
    cluster.converge()
    plan = cluster.job.status.plan
    assert plan is not None
    chosen = plan.micro_batch_size
    # Record a micro-batch the planner would not choose, as if the first world had used it.
    other = 1 if chosen > 1 else 2
    cluster.job_body["status"]["plan"]["microBatchSize"] = other
    cluster.fail("gpt-w1", 75)
    cluster.converge()
    status = cluster.job.status
    assert status.world.version == 3 and status.plan is not None
    expected = other if pinned else chosen
    assert status.plan.micro_batch_size == expected
    assert all(s % expected == 0 for s in status.plan.dp_shares)
    sizes = {parse_assignment(assignment(cluster, p)).plan.micro_batch_size for p in cluster.pods}
    assert sizes == {expected}
