"""End to end: the reference trainer runs a tensor x pipeline plan in real pods, and a resize
that changes the plan (dp=1 tp=2 pp=2 on 2 pods -> dp=2 tp=2 pp=2 on 4) carries on from the
checkpoint resharded into the new layout, with no step lost and the static run's samples.

Why: the planner plans tensor and pipeline parallelism; this is the proof that pods run it.
It follows the cpu-tiny chapters (whose job it deletes first, to free the machine's cores) and
comes before the uninstall chapter (conftest.py orders it last).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace

import pytest
from e2e.elasticjob import Elastra, JobRun, example_job
from e2e.install import REPO, checkpoint_storage, remove_checkpoint_storage
from e2e.kube import KubeError
from e2e.target import Target
from e2e.trainlog import check_contiguous, check_resumes, resumes, world_spans

pytestmark = pytest.mark.timeout(1500)

EXAMPLE = REPO / "examples" / "llama-tiny-3d.yaml"
STEPS_PER_WORLD = 3
DATASET_SIZE = 1 << 20  # elastra_worker.train's default --dataset-size


@pytest.fixture
def job3d(elastra: Elastra, target: Target) -> Iterator[JobRun]:
    kube = elastra.kube
    elastra.job.delete()  # the cpu-tiny chapters are over
    volume = target.volume("llama-tiny-3d")
    storage = replace(elastra.setup, claim="llama-tiny-3d-checkpoints", volume=volume)
    checkpoint_storage(kube, storage)
    job = JobRun(kube, storage.job_namespace, "llama-tiny-3d", operator=storage.operator)
    try:
        yield job
    finally:
        with contextlib.suppress(KubeError, TimeoutError, OSError):
            job.delete(timeout=240)
        remove_checkpoint_storage(kube, storage)


def test_a_3d_plan_trains_and_a_resize_changes_the_plan(elastra: Elastra, job3d: JobRun) -> None:
    elastra.kube.apply(example_job(job3d.namespace, EXAMPLE))
    first = job3d.wait_world(4, after=0)  # 2 pods x 2 ranks
    job3d.wait_trained(first, STEPS_PER_WORLD)
    before = job3d.status()["plan"]
    job3d.scale(4)
    second = job3d.wait_world(8, after=first)
    job3d.wait_trained(second, STEPS_PER_WORLD)
    after = job3d.status()["plan"]
    assert (before["dp"], before["tp"], before["pp"]) == (1, 2, 2), before
    assert (after["dp"], after["tp"], after["pp"]) == (2, 2, 2), after

    records = job3d.step_log()
    check_contiguous(records)
    assert [s.size for s in world_spans(records)][:2] == [4, 8]
    assert job3d.check_data_order(records, dataset_size=DATASET_SIZE) == len(records)
    found = resumes(job3d.log_lines())
    assert found, "the second world restored a checkpoint"
    check_resumes(found)
