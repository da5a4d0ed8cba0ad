"""The calls for a job's admission and its end of life: its Kueue Workload, and deleting the
job once ``ttlSecondsAfterFinished`` has passed.

Beside ``resources`` because Kueue's API is optional: a cluster without Kueue never sees a
Workload call (only jobs labelled ``kueue.x-k8s.io/queue-name`` make them), and when such a
job meets a cluster that does not serve Workloads the error says so. The ClusterRole in the
Helm chart grants exactly these verbs.
"""

from __future__ import annotations

from elastra.controller.decide.admission import (
    WORKLOAD_GROUP,
    WORKLOAD_VERSION,
    priority_class_of,
    with_priority,
)
from elastra.kube.client import ApiError, JsonDict, Kube, NotFoundError
from elastra.kube.resources import job_path

WORKLOADS = f"/apis/{WORKLOAD_GROUP}/{WORKLOAD_VERSION}"


def workloads_path(namespace: str) -> str:
    """Collection path of Workloads in a namespace."""
    return f"{WORKLOADS}/namespaces/{namespace}/workloads"


async def get_workload(kube: Kube, namespace: str, name: str) -> JsonDict | None:
    """One Workload, or ``None`` when it does not exist (or Kueue is not installed)."""
    return await kube.get(f"{workloads_path(namespace)}/{name}")


async def create_workload(kube: Kube, namespace: str, workload: JsonDict) -> JsonDict | None:
    """Create the job's Workload; ``None`` when it exists already.

    When its pods name a PriorityClass that exists, the Workload gets that class and its value
    as priority (Kueue's queue order and preemption read it); a class that does not exist is
    left out (the pods then fail admission on their own, with the API server's message).
    """
    name = priority_class_of(workload)
    if name is not None:
        found = await kube.get(f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")
        if found is not None and isinstance(found.get("value"), int):
            workload = with_priority(workload, name=name, value=found["value"])
    try:
        return await kube.create(workloads_path(namespace), workload)
    except NotFoundError as err:
        raise ApiError(
            404,
            "NotFound",
            f"the API server does not serve {WORKLOAD_GROUP}/{WORKLOAD_VERSION} Workloads: "
            "install Kueue, or remove the kueue.x-k8s.io/queue-name label from the job",
        ) from err


async def delete_workload(kube: Kube, namespace: str, name: str) -> bool:
    """Delete a Workload (its quota goes back to the queue); ``False`` when already gone."""
    return await kube.delete(f"{workloads_path(namespace)}/{name}")


async def delete_job(kube: Kube, namespace: str, name: str, *, uid: str | None) -> bool:
    """Delete a TrainingJob, only the one with ``uid`` (not a namesake created since).

    Its pods, Service and Workload go with it (owner references); claims it mounts do not.
    """
    body: dict[str, object] = {
        "kind": "DeleteOptions",
        "apiVersion": "v1",
        "propagationPolicy": "Background",
    }
    if uid:
        body["preconditions"] = {"uid": uid}
    try:
        await kube.request("DELETE", job_path(namespace, name), body=body)
    except NotFoundError:
        return False
    return True
