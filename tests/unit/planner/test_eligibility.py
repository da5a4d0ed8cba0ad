"""A job's view of the inventory: nodes its pods' placement rules refuse are excluded with the
reason; the others offer as many pods' worth of GPUs (or CPU) as every resource allows."""

from __future__ import annotations

from typing import Any

import pytest

from elastra.planner.eligibility import (
    WorkerConstraints,
    eligible,
    fit_reason,
    is_extended,
    pods_that_fit,
)
from elastra.planner.inventory import gpus, parse_inventory
from elastra.planner.scheduling import PodConstraints
from tests.unit.planner.nodes import node, node_list

KWOK = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def worker(
    *,
    gpus: int = 1,
    cpu: str = "1",
    memory: str = "8Gi",
    resource: str = "nvidia.com/gpu",
    **spec: Any,
) -> PodConstraints:
    requests = {"cpu": cpu, "memory": memory}
    limits = {resource: str(gpus)} if gpus else {}
    container = {"name": "worker", "resources": {"requests": requests, "limits": limits}}
    return PodConstraints.of_pod_spec({"containers": [container], **spec})


@pytest.mark.parametrize(
    ("kwargs", "pod", "reason"),
    [
        ({"cordoned": True}, worker(), "cordoned (spec.unschedulable)"),
        ({"taints": [KWOK]}, worker(), "taint kwok.x-k8s.io/node=fake:NoSchedule not tolerated"),
        ({"taints": [KWOK]}, worker(tolerations=[{**KWOK, "operator": "Equal"}]), ""),
        ({"taints": [GPU_TAINT]}, worker(tolerations=[{"key": "nvidia.com/gpu"}]), "taint"),
        (
            {"taints": [GPU_TAINT]},
            worker(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}]),
            "",
        ),
        ({"taints": [{"key": "soft", "effect": "PreferNoSchedule"}]}, worker(), ""),
        ({"labels": {"pool": "ml"}}, worker(nodeSelector={"pool": "ml"}), ""),
        ({}, worker(nodeSelector={"pool": "ml"}), "nodeSelector pool=ml (node: no such label)"),
    ],
)
def test_refused_nodes_are_excluded_with_the_reason(
    kwargs: dict[str, Any], pod: PodConstraints, reason: str
) -> None:
    inventory = eligible(parse_inventory(node_list(node("x", **kwargs))), pod)
    if reason:
        assert inventory.nodes == ()
        assert inventory.excluded[0].name == "x" and reason in inventory.excluded[0].reason
    else:
        assert [n.name for n in inventory.nodes] == ["x"] and inventory.excluded == ()


def bound(name: str, node_name: str, **requests: str) -> dict[str, Any]:
    container = {"name": "c", "resources": {"requests": requests}}
    return {"metadata": {"name": name}, "spec": {"nodeName": node_name, "containers": [container]}}


@pytest.mark.parametrize(
    ("pods", "pod", "free_gpus", "reason"),
    [
        ([], worker(gpus=2), 8, ""),
        # 24Gi of memory left: three pods of 8Gi, six GPUs' worth
        ([bound("m", "x", memory="488Gi")], worker(gpus=2), 6, ""),
        ([bound("m", "x", memory="510Gi")], worker(gpus=2), 0, "Insufficient memory"),
        ([bound("c", "x", cpu="63")], worker(gpus=1, cpu="2"), 0, "Insufficient cpu"),
        ([bound("g", "x", **{"nvidia.com/gpu": "7"})], worker(gpus=2), 0, "nvidia.com/gpu"),
    ],
)
def test_free_gpus_are_capped_to_the_pods_every_resource_allows(
    pods: list[dict[str, Any]], pod: PodConstraints, free_gpus: int, reason: str
) -> None:
    inventory = eligible(parse_inventory(node_list(node("x")), pods), pod)
    (only,) = inventory.nodes
    assert only.free_gpus == free_gpus
    assert pods_that_fit(pod, only) == free_gpus // gpus(pod.requests)
    found = fit_reason(pod, only)
    assert (reason in found) if reason else found == ""
    assert bool(found) == (free_gpus == 0)


def test_pod_count_limits_cpu_jobs_too() -> None:
    listed = node("c", product=None, gpus=0, cpu="64")
    listed["status"]["allocatable"]["pods"] = "3"
    pods = [bound(f"p{i}", "c", cpu="1") for i in range(2)]
    pod = worker(gpus=0, cpu="4")
    (only,) = eligible(parse_inventory(node_list(listed), pods), pod).nodes
    assert pods_that_fit(pod, only) == 1 and only.free_cpu_millis == 4000
    assert fit_reason(pod, only) == ""
    pods.append(bound("p2", "c", cpu="1"))
    (full,) = eligible(parse_inventory(node_list(listed), pods), pod).nodes
    assert fit_reason(pod, full) == "Too many pods: 3 of 3 allowed" and full.free_cpu_millis == 0


NVIDIA = "nvidia.com/gpu"
AMD = "amd.com/gpu"


def tolerating(resource: str) -> dict[str, str]:
    return {"key": resource, "operator": "Exists", "effect": "NoSchedule"}


def operators_pod(resource: str, *, added: bool = True, own: str = "") -> WorkerConstraints:
    """A job's worker constraints as ``manifests.worker_constraints`` gives them: 4 GPUs by
    ``resource``, its taint tolerated (by the operator where ``added``, else by the template,
    which may tolerate ``own`` too)."""
    tolerations = [tolerating(r) for r in (own, resource if not added else "") if r]
    if added:
        tolerations.append(tolerating(resource))
    pod = worker(gpus=4, resource=resource, tolerations=tolerations)
    return WorkerConstraints.of(pod, gpu_resource=resource, gpu_toleration_added=added)


def amd_node(**kwargs: Any) -> dict[str, Any]:
    labels = {"elastra.dev/gpu-type": "MI300X"}
    return node("m", product=None, resource=AMD, labels=labels, **kwargs)


@pytest.mark.parametrize(
    ("listed", "pod", "pods", "reason"),
    [
        # a pod as it is: the scheduler's own verdict (no nvidia.com/gpu on an AMD node)
        (amd_node(), worker(gpus=4), 0, "Insufficient nvidia.com/gpu"),
        (amd_node(), worker(gpus=4, resource=AMD), 2, ""),
        # the operator's pods request the node's GPU resource and tolerate its taint
        (amd_node(), operators_pod(NVIDIA), 2, ""),
        (amd_node(taints=[tolerating(AMD)]), operators_pod(NVIDIA), 2, ""),
        (node("x", taints=[tolerating(NVIDIA)]), operators_pod(AMD), 2, ""),
        # the toleration the operator added for one vendor is not on the other's pods
        (amd_node(taints=[tolerating(NVIDIA)]), operators_pod(NVIDIA), 0,
         "taint nvidia.com/gpu:NoSchedule not tolerated"),
        (node("x", taints=[tolerating(AMD)]), operators_pod(NVIDIA), 0,
         "taint amd.com/gpu:NoSchedule not tolerated"),
        # the template's own toleration stays on every node's pods
        (amd_node(taints=[tolerating(NVIDIA)]), operators_pod(NVIDIA, added=False), 2, ""),
        (node("x", taints=[tolerating(AMD)]), operators_pod(NVIDIA, own=AMD), 2, ""),
        # other resources are judged as they are
        (amd_node(), operators_pod(AMD), 2, ""),
        (amd_node(cpu="1"), operators_pod(NVIDIA), 1, ""),
    ],
)  # fmt: skip
def test_gpus_are_judged_in_the_resource_the_pod_built_for_the_node_requests(
    listed: dict[str, Any], pod: PodConstraints, pods: int, reason: str
) -> None:
    inventory = eligible(parse_inventory(node_list(listed)), pod)
    if not pods and reason.startswith("taint"):
        assert inventory.nodes == () and inventory.excluded[0].reason == reason
        return
    (only,) = inventory.nodes
    assert pods_that_fit(pod, only) == pods and only.free_gpus == pods * gpus(pod.requests)
    found = fit_reason(pod, only)
    assert (reason in found) if reason else found == ""


@pytest.mark.parametrize(
    ("resource", "extended"),
    [
        ("nvidia.com/gpu", True),
        ("amd.com/gpu", True),
        ("vpc.amazonaws.com/efa", True),
        ("cpu", False),
        ("hugepages-2Mi", False),
        ("ephemeral-storage", False),
        ("kubernetes.io/batch-cpu", False),
        ("example.kubernetes.io/thing", False),
        ("requests.nvidia.com/gpu", False),
    ],
)
def test_extended_resources_are_the_ones_kubernetes_counts_so(
    resource: str, extended: bool
) -> None:
    assert is_extended(resource) == extended


def test_excluded_keep_their_order_and_earlier_exclusions() -> None:
    nodes = [node("b", taints=[KWOK]), node("a", ready=False), node("c")]
    inventory = eligible(parse_inventory(node_list(*nodes)), worker())
    assert [n.name for n in inventory.nodes] == ["c"]
    assert [(n.name, n.reason.split(" ")[0]) for n in inventory.excluded] == [
        ("a", "NotReady"),
        ("b", "taint"),
    ]
