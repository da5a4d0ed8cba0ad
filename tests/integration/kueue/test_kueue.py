"""A queued TrainingJob waits, suspended, while its ClusterQueue has no quota, and runs once
Kueue admits it: the real Kueue manager, the real operator, the real control plane.

The waiting is observed on Kueue's own word (its Workload says QuotaReserved=False) rather
than for a fixed time: from then on Kueue has looked at the job and turned it down, and the
job must have no pod.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from e2e.cluster.api import wait_for

from tests.integration.conftest import LocalCluster
from tests.integration.kueue.conftest import KueueProcess
from tests.integration.operator.conftest import Jobs, gpu_job

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE = "kueue.x-k8s.io/v1beta2"
RESOURCES = ("cpu", "memory", "nvidia.com/gpu")


def cluster_queue(name: str, namespace: str, *, gpus: int) -> dict[str, Any]:
    """A ClusterQueue serving only ``namespace``, with ``gpus`` GPUs of one flavor."""
    quota = {"cpu": "1000", "memory": "10Ti", "nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": KUEUE,
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {
                "matchLabels": {"kubernetes.io/metadata.name": namespace},
            },
            "resourceGroups": [
                {
                    "coveredResources": list(RESOURCES),
                    "flavors": [
                        {
                            "name": name,
                            "resources": [
                                {"name": r, "nominalQuota": quota[r] if gpus else "0"}
                                for r in RESOURCES
                            ],
                        }
                    ],
                }
            ],
        },
    }


@pytest.fixture
def queue(cluster: LocalCluster, namespace: str, kueue: KueueProcess) -> Any:
    """A ResourceFlavor, a ClusterQueue with no quota and a LocalQueue ``team`` in the namespace;
    the cluster-scoped ones are deleted afterwards."""
    name = f"cq-{namespace}"
    cluster.apply({"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": name}})
    cluster.apply(cluster_queue(name, namespace, gpus=0))
    cluster.apply(
        {
            "apiVersion": KUEUE,
            "kind": "LocalQueue",
            "metadata": {"name": "team", "namespace": namespace},
            "spec": {"clusterQueue": name},
        }
    )
    yield name
    cluster.kubectl("delete", "localqueue", "team", "-n", namespace, "--wait=false", check=False)
    cluster.kubectl("delete", "clusterqueue", name, "--wait=false", check=False)
    cluster.kubectl("delete", "resourceflavor", name, "--wait=false", check=False)


def workload(cluster: LocalCluster, namespace: str, job: str) -> dict[str, Any] | None:
    out = cluster.kubectl(
        "get", "workloads.kueue.x-k8s.io", f"trainingjob-{job}", "-n", namespace, "-o", "json",
        check=False,
    )  # fmt: skip
    return json.loads(out.stdout) if out.returncode == 0 else None


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return {}


@pytest.mark.usefixtures("operator")
def test_a_job_waits_suspended_without_quota_and_runs_once_quota_is_added(
    cluster: LocalCluster, namespace: str, queue: str, jobs: Jobs, kueue: KueueProcess
) -> None:
    body = gpu_job("queued", replicas=2)
    body["metadata"]["labels"] = {QUEUE_LABEL: "team"}
    jobs.apply(body)

    refused = wait_for(
        "Kueue to refuse the job's Workload (QuotaReserved=False)",
        lambda: (
            (w := workload(cluster, namespace, "queued"))
            and condition(w, "QuotaReserved").get("status") == "False"
            and w
        ),
        timeout=90,
        interval=0.5,
        hint=lambda: "\n".join(kueue.lines[-20:]),
    )
    (podset,) = refused["spec"]["podSets"]
    assert podset["count"] == 2
    assert refused["metadata"]["ownerReferences"][0]["kind"] == "TrainingJob"
    assert not (refused.get("status") or {}).get("admission")
    status = jobs.wait(
        "the job suspended, awaiting admission",
        lambda: (
            (s := jobs.status("queued")).get("phase") == "Suspended"
            and condition({"status": s}, "Suspended").get("reason") == "AwaitingAdmission"
            and s
        ),
    )
    assert "team" in condition({"status": status}, "Suspended")["message"]
    assert jobs.pods("queued") == []
    assert "startTime" not in status

    cluster.apply(cluster_queue(queue, namespace, gpus=16))
    pods = jobs.wait("the job's two pods", lambda: len(p := jobs.pods("queued")) == 2 and p)
    assert {p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] for p in pods} == {
        "8"
    }
    admitted = workload(cluster, namespace, "queued")
    assert condition(admitted, "Admitted").get("status") == "True"
    running = jobs.wait_phase("queued", "Running")
    assert running["admittedReplicas"] == 2 and running["startTime"]


@pytest.mark.usefixtures("operator")
def test_an_evicted_job_stops_and_queues_again(
    cluster: LocalCluster, namespace: str, queue: str, jobs: Jobs, kueue: KueueProcess
) -> None:
    """Deactivating the Workload makes Kueue evict it: the job stops like a suspend (no pod
    left), and once the Workload is active again the job is admitted and runs again."""
    cluster.apply(cluster_queue(queue, namespace, gpus=16))
    body = gpu_job("evicted", replicas=2)
    body["metadata"]["labels"] = {QUEUE_LABEL: "team"}
    jobs.apply(body)
    jobs.wait("the job's two pods", lambda: len(jobs.pods("evicted")) == 2)
    jobs.wait_phase("evicted", "Running")
    name = "trainingjob-evicted"
    patch = {"spec": {"active": False}}
    cluster.kubectl(
        "patch", "workloads.kueue.x-k8s.io", name, "-n", namespace, "--type=merge",
        "-p", json.dumps(patch),
    )  # fmt: skip
    wait_for(
        "Kueue to evict the deactivated Workload",
        lambda: (
            condition(workload(cluster, namespace, "evicted"), "Evicted").get("status") == "True"
        ),
        timeout=60,
        interval=0.5,
        hint=lambda: "\n".join(kueue.lines[-20:]),
    )
    held = jobs.wait(
        "the job held with no pods",
        lambda: (
            (s := jobs.status("evicted")).get("phase") == "Suspended"
            and not jobs.pods("evicted")
            and s
        ),
        timeout=90,
    )
    assert "startTime" not in held and held["world"].get("ranks", []) == []
    patch = {"spec": {"active": True}}
    cluster.kubectl(
        "patch", "workloads.kueue.x-k8s.io", name, "-n", namespace, "--type=merge",
        "-p", json.dumps(patch),
    )  # fmt: skip
    jobs.wait("the job's pods again", lambda: len(jobs.pods("evicted")) == 2, timeout=90)
    running = jobs.wait_phase("evicted", "Running")
    assert running["admittedReplicas"] == 2
