"""End to end: a pod given a GPU it cannot use stops, and the job says why in one line.

The real node advertises one fake ``nvidia.com/gpu`` (a node status patch, as the Kubernetes
docs advertise an extended resource) and carries a catalog GPU type, so the planner places a
``worker.gpus: 1`` job there and the real scheduler and kubelet admit its pod. The container
has CUDA torch but no driver and no ``/dev/nvidia*``: the trainer must not train on the CPU; it
exits with the permanent code, its one line becomes the container's termination message, and
the job ends Failed with that line in its condition. The node is given back as it was.

Why: a GPU job that silently trains on the CPU is the failure a user with GPUs meets first.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from e2e.elasticjob import Elastra, JobRun, example_job
from e2e.kube import Kubectl, KubeError, wait_for
from e2e.node.node import NODE_LABEL

pytestmark = pytest.mark.timeout(900)

JOB = "gpu-check"
GPU = "nvidia.com/gpu"
GPU_TYPE_LABEL = "elastra.dev/gpu-type"
GPU_TYPE = "H100-SXM-80GB"  # any catalog type: nothing here runs on it
FAIL_S = 420.0  # the pod's start (the 5 GB image, torch's CUDA import) on two busy cores
CAUSE = "no GPU driver is visible in the container"


def real_node(kube: Kubectl) -> str:
    (node,) = kube.items("nodes", "-l", f"{NODE_LABEL}=true")
    name: str = node["metadata"]["name"]
    return name


def _status_patch(kube: Kubectl, node: str, ops: list[dict[str, Any]]) -> None:
    kube.kubectl("patch", "node", node, "--subresource=status", "--type=json",
                 "-p", json.dumps(ops))  # fmt: skip


@pytest.fixture
def fake_gpu_node(elastra: Elastra) -> Iterator[str]:
    """The real node with one fake GPU of a catalog type, for the test only."""
    kube = elastra.kube
    elastra.job.delete()  # the cpu-tiny chapters are over: leave the two cores to this one
    node = real_node(kube)
    key = GPU.replace("/", "~1")  # a JSON pointer's escape for "/"
    add = [{"op": "add", "path": f"/status/{part}/{key}", "value": "1"}
           for part in ("capacity", "allocatable")]  # fmt: skip
    _status_patch(kube, node, add)
    kube.kubectl("label", "node", node, f"{GPU_TYPE_LABEL}={GPU_TYPE}", "--overwrite")
    try:
        yield node
    finally:
        with contextlib.suppress(KubeError, TimeoutError):
            JobRun(kube, elastra.setup.job_namespace, JOB).delete(timeout=240)
        with contextlib.suppress(KubeError):
            kube.kubectl("label", "node", node, f"{GPU_TYPE_LABEL}-")
        with contextlib.suppress(KubeError):
            _status_patch(kube, node, [{"op": "remove", "path": f"/status/{part}/{key}"}
                                       for part in ("capacity", "allocatable")])  # fmt: skip


def gpu_job(namespace: str) -> dict[str, Any]:
    """The cpu-tiny example as one pod asking for one GPU, pinned to the real node."""
    job = copy.deepcopy(example_job(namespace))
    job["metadata"]["name"] = JOB
    spec = job["spec"]
    spec.update(replicas=1, minReplicas=1, maxReplicas=1)
    spec["checkpoint"] = {"path": "/checkpoints"}  # one pod: its own emptyDir
    spec["worker"]["gpus"] = 1
    spec["worker"]["env"] = []
    spec["worker"]["template"] = {"spec": {"nodeSelector": {NODE_LABEL: "true"}}}
    spec["training"]["precision"] = "bf16"
    spec["failurePolicy"] = {"maxRestarts": 5, "backoffSeconds": 2}
    return job


def _failed(job: JobRun) -> dict[str, Any] | None:
    conditions = job.status().get("conditions") or []
    return next(
        (c for c in conditions if c.get("type") == "Failed" and c.get("status") == "True"), None
    )


def test_a_gpu_pod_without_a_usable_gpu_fails_the_job_with_the_reason(
    elastra: Elastra, fake_gpu_node: str
) -> None:
    kube, namespace = elastra.kube, elastra.setup.job_namespace
    job = JobRun(kube, namespace, JOB, operator=elastra.setup.operator)
    kube.apply(gpu_job(namespace))
    failed = wait_for(
        f"{JOB} to fail with the worker's reason", lambda: _failed(job),
        timeout=FAIL_S, interval=2, hint=job.describe,
    )  # fmt: skip
    message = failed["message"]
    print(f"Failed condition: {failed.get('reason')}: {message}")
    assert failed["reason"] == "PermanentFailure", failed
    assert message.startswith(f"worker {JOB}-w0 exited with permanent code 2: worker.gpus is 1 "
                              f"but {CAUSE}"), message  # fmt: skip
    assert "\n" not in message
    for pod in job.pods():  # the failed pod stays (only live ones are deleted)
        assert pod["spec"]["nodeName"] == fake_gpu_node
        (worker,) = [c for c in pod["spec"]["containers"] if c["name"] == "worker"]
        assert worker["resources"]["limits"][GPU] == "1"
        (state,) = [s["state"] for s in pod["status"]["containerStatuses"]
                    if s["name"] == "worker"]  # fmt: skip
        assert state["terminated"]["exitCode"] == 2, state
        assert CAUSE in state["terminated"]["message"], state
    status = job.status()
    assert int(status.get("restarts") or 0) == 0, "a permanent error is not retried"
