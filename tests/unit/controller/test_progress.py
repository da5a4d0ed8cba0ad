"""status.progress from rank 0's metrics: parsing, whom to ask, and what gets recorded."""

from __future__ import annotations

from typing import Any

from elastra.controller.observe import WorkerProgress, parse_metrics, rank0_address
from elastra.controller.passplan import Observation, plan_pass
from tests.unit.controller.fakecluster import FakeCluster, node
from tests.unit.controller.test_passplan import SETTINGS, h100s, job

PAGE = """# HELP elastra_worker_step Optimizer steps completed
# TYPE elastra_worker_step gauge
elastra_worker_step 42.0
elastra_worker_loss 3.2
elastra_worker_samples_per_second 117.6
elastra_worker_last_checkpoint_step 40.0
elastra_worker_world_version 1.0
elastra_worker_trainer_starts_total 2.0
"""


def test_parse_reads_the_progress_gauges() -> None:
    assert parse_metrics(PAGE) == WorkerProgress(
        step=42, samples_per_second=117.6, last_checkpoint_step=40, world_version=1
    )
    assert parse_metrics("# nothing yet\nelastra_worker_world_version 1.0\n") is None
    assert parse_metrics("elastra_worker_step not-a-number\n") is None


def running() -> FakeCluster:
    cluster = FakeCluster(job(replicas=2), h100s(2), SETTINGS)
    cluster.converge()
    assert cluster.job.status.world.version == 1
    return cluster


def test_rank0_of_a_real_node_is_asked_and_a_simulated_one_never() -> None:
    cluster = running()
    pods: list[dict[str, Any]] = list(cluster.pods.values())
    leader = next(p.pod for p in cluster.job.status.placement if p.rank == 0)
    ip = cluster.pods[leader]["status"]["podIP"]
    assert rank0_address(cluster.job, pods, cluster.nodes, ("type=kwok",)) == ip
    kwok = [node(n["metadata"]["name"]) for n in cluster.nodes]
    for n in kwok:
        n["metadata"]["labels"]["type"] = "kwok"
    assert rank0_address(cluster.job, pods, kwok, ("type=kwok",)) is None


def pass_with(cluster: FakeCluster, report: WorkerProgress) -> Any:
    pods = list(cluster.pods.values())
    obs = Observation(cluster.job, pods, cluster.nodes, pods, progress=report)
    return plan_pass(obs, SETTINGS, cluster.now).status.progress


def test_the_current_worlds_report_is_recorded_and_an_old_worlds_ignored() -> None:
    cluster = running()
    now = WorkerProgress(
        step=42, samples_per_second=117.6, last_checkpoint_step=40, world_version=1
    )
    recorded = pass_with(cluster, now)
    assert (recorded.step, recorded.samples_per_second, recorded.last_checkpoint_step) == (
        42,
        118,
        40,
    )
    stale = WorkerProgress(step=7, samples_per_second=1.0, last_checkpoint_step=5, world_version=0)
    assert pass_with(cluster, stale) == cluster.job.status.progress
