"""The API paths and verbs Elastra uses, named for what they do.

Controllers and CLI commands call these instead of building URLs, so every request Elastra
can make is listed in one module (and matches the ClusterRole the Helm chart grants).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from elastra.api.resource import GROUP, PLURAL, VERSION
from elastra.kube.client import MERGE_PATCH, JsonDict, Kube
from elastra.kube.informer import Informer, without_managed_fields

JOBS = f"/apis/{GROUP}/{VERSION}"
NETWORK_POLICIES = "/apis/networking.k8s.io/v1"


def job_path(namespace: str, name: str) -> str:
    """Path of one TrainingJob."""
    return f"{JOBS}/namespaces/{namespace}/{PLURAL}/{name}"


def pods_path(namespace: str) -> str:
    """Collection path of Pods in a namespace."""
    return f"/api/v1/namespaces/{namespace}/pods"


async def get_job(kube: Kube, namespace: str, name: str) -> JsonDict | None:
    """One TrainingJob, or ``None`` if it is gone."""
    return await kube.get(job_path(namespace, name))


async def list_jobs(kube: Kube, namespace: str | None = None) -> list[JsonDict]:
    """TrainingJobs in one namespace or all."""
    where = f"/namespaces/{namespace}" if namespace else ""
    return await kube.list(f"{JOBS}{where}/{PLURAL}")


async def list_nodes(kube: Kube) -> list[JsonDict]:
    """Every Node."""
    return await kube.list("/api/v1/nodes")


async def list_pods(
    kube: Kube, namespace: str | None = None, *, selector: str | None = None
) -> list[JsonDict]:
    """Pods in one namespace or all, optionally by label selector."""
    path = pods_path(namespace) if namespace else "/api/v1/pods"
    return await kube.list(path, label_selector=selector)


def nodes_informer(
    kube: Kube, transform: Callable[[JsonDict], JsonDict], *, watch_timeout_s: float
) -> Informer:
    """Every Node, watched (``transform``: what of a node the cache keeps)."""
    return Informer(kube, "/api/v1/nodes", transform=transform, watch_timeout_s=watch_timeout_s)


NODE_LEASE_NAMESPACE = "kube-node-lease"
"""Where each kubelet keeps its node's Lease (named for the node), renewed every 10 s."""


def node_leases_informer(
    kube: Kube, transform: Callable[[JsonDict], JsonDict], *, watch_timeout_s: float
) -> Informer:
    """Every node's Lease, watched (``transform``: what of a Lease the cache keeps)."""
    return Informer(
        kube,
        lease_path(NODE_LEASE_NAMESPACE),
        transform=transform,
        watch_timeout_s=watch_timeout_s,
    )


def pods_informer(
    kube: Kube,
    transform: Callable[[JsonDict], JsonDict],
    *,
    index: Callable[[JsonDict], Hashable | None],
    watch_timeout_s: float,
) -> Informer:
    """Every Pod of the cluster, watched, grouped by ``index`` (a worker pod's job)."""
    return Informer(
        kube, "/api/v1/pods", transform=transform, index=index, watch_timeout_s=watch_timeout_s
    )


def jobs_informer(kube: Kube, *, watch_timeout_s: float) -> Informer:
    """Every TrainingJob of the cluster, watched."""
    return Informer(
        kube, f"{JOBS}/{PLURAL}", transform=without_managed_fields, watch_timeout_s=watch_timeout_s
    )


PRIORITY_CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"


def priority_classes_informer(kube: Kube, *, watch_timeout_s: float) -> Informer:
    """Every PriorityClass, watched (sharing compares the jobs' priorities)."""
    return Informer(
        kube, PRIORITY_CLASSES, transform=without_managed_fields, watch_timeout_s=watch_timeout_s
    )


async def ensure_priority_class(kube: Kube, body: JsonDict) -> None:
    """Create a PriorityClass unless one of that name exists (read first: a class the chart
    made needs no right to create one)."""
    if await kube.get(f"{PRIORITY_CLASSES}/{body['metadata']['name']}") is None:
        await kube.create(PRIORITY_CLASSES, body)


async def create_pod(kube: Kube, namespace: str, pod: JsonDict) -> JsonDict | None:
    """Create a pod; ``None`` when it already exists."""
    return await kube.create(pods_path(namespace), pod)


async def patch_pod(kube: Kube, namespace: str, name: str, patch: JsonDict) -> JsonDict | None:
    """Merge-patch a pod; ``None`` when it is gone."""
    return await kube.patch(f"{pods_path(namespace)}/{name}", patch, kind=MERGE_PATCH)


async def delete_pod(
    kube: Kube, namespace: str, name: str, *, grace_seconds: int | None = None
) -> bool:
    """Delete a pod (graceful unless told otherwise); ``False`` when it was already gone."""
    return await kube.delete(f"{pods_path(namespace)}/{name}", grace_seconds=grace_seconds)


async def ensure_service(kube: Kube, namespace: str, service: JsonDict) -> None:
    """Create a Service unless one of that name exists."""
    await kube.create(f"/api/v1/namespaces/{namespace}/services", service)


async def ensure_network_policy(kube: Kube, namespace: str, policy: JsonDict | None) -> None:
    """Create a NetworkPolicy unless one of that name exists; ``None``: the setting is off.

    Create-only, like the Service: a policy the user edited or replaced is theirs to keep.
    """
    if policy is not None:
        await kube.create(f"{NETWORK_POLICIES}/namespaces/{namespace}/networkpolicies", policy)


async def replace_job_status(kube: Kube, job: JsonDict) -> JsonDict:
    """Write status with the job's resourceVersion as precondition (raises ``ConflictError``)."""
    meta = job["metadata"]
    return await kube.replace(f"{job_path(meta['namespace'], meta['name'])}/status", job)


async def list_events(kube: Kube, namespace: str, name: str) -> list[JsonDict]:
    """Events about one TrainingJob, oldest first."""
    events = await kube.list(
        f"/api/v1/namespaces/{namespace}/events",
        field_selector=f"involvedObject.kind=TrainingJob,involvedObject.name={name}",
    )
    return sorted(events, key=lambda e: str(e.get("lastTimestamp") or ""))


def lease_path(namespace: str, name: str = "") -> str:
    """Path of the Leases collection, or of one Lease."""
    base = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
    return f"{base}/{name}" if name else base


async def get_lease(kube: Kube, namespace: str, name: str) -> JsonDict | None:
    """A Lease, or ``None``."""
    return await kube.get(lease_path(namespace, name))


async def create_lease(
    kube: Kube, namespace: str, name: str, spec: dict[str, Any]
) -> JsonDict | None:
    """Create a Lease; ``None`` when another operator created it first."""
    body = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
    return await kube.create(lease_path(namespace), body)


async def replace_lease(kube: Kube, lease: JsonDict) -> JsonDict:
    """Write a Lease with its resourceVersion as precondition (``ConflictError`` if stale)."""
    meta = lease["metadata"]
    return await kube.replace(lease_path(meta["namespace"], meta["name"]), lease)


async def server_version(kube: Kube) -> JsonDict:
    """``/version``: the cheapest request that proves the server is there and answers."""
    return await kube.request("GET", "/version")
