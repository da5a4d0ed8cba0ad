"""What a job's pass may plan with: capacity left by every other pod, and by its own that stay.

A job's own live pods are capacity it may place again (it is replanning them), but its pods
being deleted are not: they hold their node until they are gone, and the scheduler refuses
replacements until then. Counting them as free made a grown CPU world on a full node retry
forever with "Insufficient cpu" (seen in the e2e suite with examples/llama-tiny-3d.yaml).
"""

from __future__ import annotations

from typing import Any

import pytest

from elastra.controller.decide.capacity import cluster_inventory
from elastra.planner.scheduling import PodConstraints
from tests.unit.controller.fakecluster import node


def bound_pod(
    name: str, job: str, *, gpus: int, deleting: bool = False, namespace: str = "ns"
) -> dict[str, Any]:
    labels = {"elastra.dev/job": job}
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    limits = {"nvidia.com/gpu": str(gpus)}
    return {
        "metadata": meta,
        "spec": {"nodeName": "n1", "containers": [{"name": "w", "resources": {"limits": limits}}]},
        "status": {"phase": "Running"},
    }


@pytest.mark.parametrize(
    ("pods", "own_job", "free"),
    [
        ([bound_pod("a-w0", "a", gpus=4)], None, 4),
        ([bound_pod("a-w0", "a", gpus=4)], "ns/a", 8),  # its own live pod: replannable
        ([bound_pod("b-w0", "b", gpus=4)], "ns/a", 4),  # another job's pod: taken
        ([bound_pod("a-w0", "a", gpus=4, deleting=True)], "ns/a", 4),  # its pod going away: taken
        (
            [bound_pod("a-w0", "a", gpus=2), bound_pod("a-w1", "a", gpus=2, deleting=True)],
            "ns/a",
            6,
        ),
        ([bound_pod("a-w0", "a", gpus=4, namespace="other")], "ns/a", 4),  # a namesake's: taken
    ],
)
def test_a_pass_plans_with_its_live_pods_but_not_its_deleting_ones(
    pods: list[dict[str, Any]], own_job: str | None, free: int
) -> None:
    inventory = cluster_inventory((node("n1", gpus=8),), tuple(pods), own_job=own_job)
    assert sum(n.free_gpus for n in inventory.nodes) == free


def gated_pod(name: str, job: str, *, node_name: str, gpus: int) -> dict[str, Any]:
    """A pod not bound yet, planned onto ``node_name`` (Elastra's gated pods)."""
    pod = bound_pod(name, job, gpus=gpus)
    del pod["spec"]["nodeName"]
    pod["metadata"]["annotations"] = {"elastra.dev/node": node_name}
    return pod


@pytest.mark.parametrize(
    ("pods", "extra", "own_job", "free"),
    [
        ([gated_pod("b-w0", "b", node_name="n1", gpus=4)], [], "ns/a", 4),  # on its planned node
        ([], [gated_pod("b-w0", "b", node_name="n1", gpus=2)], "ns/a", 6),  # reserved, not listed
        ([], [gated_pod("a-w0", "a", node_name="n1", gpus=2)], "ns/a", 8),  # its own reservation
    ],
)
def test_pods_not_bound_yet_count_on_their_planned_node(
    pods: list[dict[str, Any]], extra: list[dict[str, Any]], own_job: str, free: int
) -> None:
    inventory = cluster_inventory((node("n1", gpus=8),), tuple(pods), own_job=own_job, extra=extra)
    assert sum(n.free_gpus for n in inventory.nodes) == free


def test_a_listing_passed_as_tuples_is_parsed_once_and_lists_every_time() -> None:
    nodes: tuple[dict[str, Any], ...] = (node("n1", gpus=8),)
    first = cluster_inventory(nodes, ())
    assert cluster_inventory(nodes, ()).nodes[0] is first.nodes[0]
    again = cluster_inventory(list(nodes), [])
    assert again == first and again.nodes[0] is not first.nodes[0]


def pod_on(name: str, job: str, node_name: str, gpus: int) -> dict[str, Any]:
    pod = bound_pod(name, job, gpus=gpus)
    pod["spec"]["nodeName"] = node_name
    return pod


@pytest.mark.parametrize(
    ("own_job", "free"),
    [
        (None, {"n1": 2, "n2": 4, "n3": 7}),
        ("ns/a", {"n1": 8, "n2": 8, "n3": 7}),  # a's pods given back, b's reservation taken
        ("ns/b", {"n1": 2, "n2": 4, "n3": 8}),  # its own reservation is not counted
    ],
)
def test_each_pass_adjusts_only_its_own_nodes_of_the_capacity_shared_by_all(
    own_job: str | None, free: dict[str, int]
) -> None:
    nodes = tuple(node(f"n{i}", gpus=8) for i in (1, 2, 3))
    pods = (pod_on("a-w0", "a", "n1", 6), pod_on("a-w1", "a", "n2", 4))
    reserved = [gated_pod("b-w0", "b", node_name="n3", gpus=1)]
    everyone = cluster_inventory(nodes, pods)
    inventory = cluster_inventory(nodes, pods, own_job=own_job, extra=reserved)
    assert {n.name: n.free_gpus for n in inventory.nodes} == free
    untouched = [n for n, before in zip(inventory.nodes, everyone.nodes, strict=True)
                 if n.free_gpus == before.free_gpus]  # fmt: skip
    assert all(any(n is e for e in everyone.nodes) for n in untouched), "shared, not copied"
    assert cluster_inventory(nodes, pods).nodes[2] is everyone.nodes[2], "shared, not rebuilt"


def constraints(*, gpus: int, memory: str = "1Gi", **spec: Any) -> PodConstraints:
    requests = {"cpu": "1", "memory": memory, "nvidia.com/gpu": str(gpus)}
    container = {"name": "worker", "resources": {"requests": requests}}
    return PodConstraints.of_pod_spec({"containers": [container], **spec})


def test_a_job_sees_only_the_nodes_its_pods_may_use_with_the_reason_for_the_rest() -> None:
    tainted = node("n2", gpus=8)
    tainted["spec"] = {"taints": [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]}
    labelled = node("n3", gpus=8)
    labelled["metadata"]["labels"]["pool"] = "ml"
    nodes = (node("n1", gpus=8), tainted, labelled)
    plain = cluster_inventory(nodes, (), pod=constraints(gpus=1))
    assert [n.name for n in plain.nodes] == ["n1", "n3"]
    assert [(e.name, e.reason) for e in plain.excluded] == [
        ("n2", "taint dedicated=ml:NoSchedule not tolerated")
    ]
    toleration = {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
    ml = constraints(gpus=1, tolerations=[toleration], nodeSelector={"pool": "ml"})
    dedicated = cluster_inventory(nodes, (), pod=ml)
    assert [n.name for n in dedicated.nodes] == ["n3"]
    assert {e.name: e.reason.split(" ")[0] for e in dedicated.excluded} == {
        "n1": "nodeSelector",
        "n2": "nodeSelector",
    }
    assert [n.name for n in cluster_inventory(nodes, ()).nodes] == ["n1", "n2", "n3"]


def test_each_job_view_is_built_once_per_listing_and_adjusted_per_pass() -> None:
    nodes = tuple(node(f"n{i}", gpus=8) for i in (1, 2, 3))
    pods = (pod_on("a-w0", "a", "n1", 6),)
    pod = constraints(gpus=2, memory="200Gi")  # two such pods fill a node's 512Gi
    first = cluster_inventory(nodes, pods, pod=pod)
    again = cluster_inventory(nodes, pods, pod=constraints(gpus=2, memory="200Gi"))
    assert all(a is b for a, b in zip(first.nodes, again.nodes, strict=True)), "shared"
    assert {n.name: n.free_gpus for n in first.nodes} == {"n1": 2, "n2": 4, "n3": 4}
    own = cluster_inventory(nodes, pods, own_job="ns/a", pod=pod)
    assert {n.name: n.free_gpus for n in own.nodes} == {"n1": 4, "n2": 4, "n3": 4}
    assert own.nodes[1] is first.nodes[1], "only the job's own nodes are rebuilt"


def test_a_node_that_does_not_parse_is_left_out_alone_with_the_others_notes_kept() -> None:
    short = node("a", gpus=4)
    short["metadata"]["labels"] = {"node.kubernetes.io/instance-type": "p5.48xlarge"}
    broken = node("b")
    broken["status"]["allocatable"]["cpu"] = "lots"
    inventory = cluster_inventory([short, broken], [])
    assert [n.name for n in inventory.nodes] == ["a"]
    assert [(e.name, "cpu='lots'" in e.reason) for e in inventory.excluded] == [("b", True)]
    assert [n.name for n in inventory.notes] == ["a"]
