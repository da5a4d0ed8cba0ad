"""End to end: an unmodified torchrun script (examples/torchrun_ddp.py, mounted from a
ConfigMap through `worker.template`) trains in real pods in torchrun mode through a
3 -> 2 -> 3 resize, resuming from its own checkpoint each time, and the pod template's
Secret-backed env var, ConfigMap volume, toleration and priorityClassName are applied.

Why: platform teams bring torchrun scripts and pod templates; this is them on a real node.
It deletes the jobs of the chapters before it first (two cores) and runs before the
uninstall chapter (conftest.py orders that last).
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from e2e.elasticjob import Elastra, JobRun, example_job
from e2e.install import REPO, checkpoint_storage, remove_checkpoint_storage
from e2e.kube import KubeError, wait_for
from e2e.target import Target
from e2e.trainlog import check_contiguous, world_spans

pytestmark = pytest.mark.timeout(1500)

EXAMPLE = REPO / "examples" / "torchrun-ddp.yaml"
SCRIPT = REPO / "examples" / "torchrun_ddp.py"
PRIORITY_CLASS = "elastra-e2e-training"
TOLERATION = {"key": "example.com/dedicated", "operator": "Exists", "effect": "NoSchedule"}
STEPS_PER_WORLD = 5


@pytest.fixture
def torchrun_job(elastra: Elastra, target: Target) -> Iterator[JobRun]:
    kube, namespace = elastra.kube, elastra.setup.job_namespace
    elastra.job.delete()
    with contextlib.suppress(KubeError, TimeoutError):
        JobRun(kube, namespace, "llama-tiny-3d").delete(timeout=240)
    volume = target.volume("torchrun-ddp")
    storage = replace(elastra.setup, claim="torchrun-ddp-checkpoints", volume=volume)
    checkpoint_storage(kube, storage)
    kube.kubectl("create", "configmap", "torchrun-ddp-script", "-n", namespace,
                 f"--from-file={SCRIPT}")  # fmt: skip
    kube.kubectl("create", "secret", "generic", "torchrun-ddp-token", "-n", namespace,
                 "--from-literal=token=s3cret-from-a-secret")  # fmt: skip
    kube.apply(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": PRIORITY_CLASS},
            "value": 1000,
            "description": "Elastra e2e: a worker.template priorityClassName",
        }
    )
    job = JobRun(kube, namespace, "torchrun-ddp", operator=elastra.setup.operator)
    try:
        yield job
    finally:
        with contextlib.suppress(KubeError, TimeoutError, OSError):
            job.delete(timeout=240)
        remove_checkpoint_storage(kube, storage)
        for args in (
            ("delete", "configmap", "torchrun-ddp-script", "-n", namespace, "--ignore-not-found"),
            ("delete", "secret", "torchrun-ddp-token", "-n", namespace, "--ignore-not-found"),
            ("delete", "priorityclass", PRIORITY_CLASS, "--ignore-not-found"),
        ):
            with contextlib.suppress(KubeError):
                kube.kubectl(*args)


def with_template_additions(job: dict[str, Any]) -> dict[str, Any]:
    """The example plus a Secret-backed env var, a toleration and a priorityClassName."""
    job = copy.deepcopy(job)
    spec = job["spec"]["worker"]["template"]["spec"]
    (worker,) = [c for c in spec["containers"] if c["name"] == "worker"]
    secret = {"secretKeyRef": {"name": "torchrun-ddp-token", "key": "token"}}
    worker["env"] = [{"name": "RUN_TOKEN", "valueFrom": secret}]
    spec["tolerations"] = [TOLERATION]
    spec["priorityClassName"] = PRIORITY_CLASS
    return job


def _trained(job: JobRun, size: int, after: int) -> int:
    version = job.wait_world(size, after=after)
    job.wait_trained(version, STEPS_PER_WORLD)
    return version


def test_a_torchrun_script_resizes_3_2_3_with_the_pod_template_applied(
    elastra: Elastra, torchrun_job: JobRun
) -> None:
    kube, job = elastra.kube, torchrun_job
    kube.apply(with_template_additions(example_job(job.namespace, EXAMPLE)))
    first = _trained(job, 3, after=0)
    check_template_applied(elastra, job)
    check_progress_reported(job)
    job.scale(2)
    second = _trained(job, 2, after=first)
    job.scale(3)
    third = _trained(job, 3, after=second)
    assert first < second < third

    records = job.step_log()
    check_contiguous(records)  # every step once: none lost beyond a checkpoint, none twice
    assert [s.size for s in world_spans(records)][:3] == [3, 2, 3]
    raw = kube.kubectl(
        "exec", "-n", job.namespace, job.running_pods()[0]["metadata"]["name"], "-c", "worker",
        "--", "cat", "/checkpoints/steps.jsonl",
    )  # fmt: skip
    resumed = sorted({json.loads(line)["resumedFrom"] for line in raw.splitlines() if line})
    assert len(resumed) >= 3 and resumed[0] == 0, f"each world resumed from a checkpoint: {resumed}"


def check_progress_reported(job: JobRun) -> None:
    """The script's progress report ($ELASTRA_PROGRESS_FILE) reaches status.progress (the
    STEP column of `kubectl get tj`, `elastra status`) through rank 0's metrics."""

    def progress() -> dict[str, Any]:
        found: dict[str, Any] = job.status().get("progress") or {}
        return found

    wait_for(
        "status.progress.step from the script's report",
        lambda: int(progress().get("step") or 0) > 0,
        timeout=150,  # up to two reads 30 s apart
        interval=2,
        hint=job.describe,
    )
    assert progress()["samplesPerSecond"] > 0, progress()


def check_template_applied(elastra: Elastra, job: JobRun) -> None:
    """Every worker pod carries the template's additions, and the worker sees them."""
    pods = job.running_pods()
    assert pods
    for pod in pods:
        spec = pod["spec"]
        assert spec["priorityClassName"] == PRIORITY_CLASS
        assert TOLERATION in spec["tolerations"]
        assert any(v.get("configMap", {}).get("name") == "torchrun-ddp-script"
                   for v in spec["volumes"])  # fmt: skip
    name = pods[0]["metadata"]["name"]

    def in_pod(*argv: str) -> str:
        return elastra.kube.kubectl("exec", "-n", job.namespace, name, "-c", "worker", "--", *argv)

    assert in_pod("printenv", "RUN_TOKEN").strip() == "s3cret-from-a-secret"
    assert "def main()" in in_pod("cat", "/opt/user/torchrun_ddp.py")
    wait_for("the agent runs torchrun mode", lambda: "torchrun" in in_pod("printenv",
             "ELASTRA_LAUNCH") or None, timeout=30, interval=1)  # fmt: skip
