"""A job's view of the inventory: nodes its pods' placement rules refuse are excluded with the
reason; the others offer as many pods' worth of GPUs (or CPU) as every resource allows."""

from __future__ import annotations

from typing import Any

import pytest

from elastra.planner.eligibility import eligible, fit_reason, pods_that_fit
from elastra.planner.inventory import gpus, parse_inventory
from elastra.planner.scheduling import PodConstraints
from tests.unit.planner.nodes import node, node_list

KWOK = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def worker(*, gpus: int = 1, cpu: str = "1", memory: str = "8Gi", **spec: Any) -> PodConstraints:
    requests = {"cpu": cpu, "memory": memory}
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
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


def test_gpus_are_counted_in_the_resource_the_node_advertises() -> None:
    amd = node("m", product=None, gpus=0, labels={"elastra.dev/gpu-type": "MI300X"})
    amd["status"]["allocatable"]["amd.com/gpu"] = "8"
    (only,) = eligible(parse_inventory(node_list(amd)), worker(gpus=4)).nodes
    assert only.free_gpus == 8 and fit_reason(worker(gpus=4), only) == ""


def test_excluded_keep_their_order_and_earlier_exclusions() -> None:
    nodes = [node("b", taints=[KWOK]), node("a", ready=False), node("c")]
    inventory = eligible(parse_inventory(node_list(*nodes)), worker())
    assert [n.name for n in inventory.nodes] == ["c"]
    assert [(n.name, n.reason.split(" ")[0]) for n in inventory.excluded] == [
        ("a", "NotReady"),
        ("b", "taint"),
    ]
