"""The local cluster is real: nodes, the scheduler, kwok's pod lifecycle, garbage collection.

Each test asserts on cluster state that only the real component could have produced: a
binding chosen by kube-scheduler from GPU capacity, a pod status written by kwok's stages, an
object removed by kube-controller-manager's garbage collector.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

from e2e.cluster.api import wait_for
from e2e.cluster.components import has_condition
from e2e.cluster.fleet import FLEET_LABEL, load_fleet

from tests.integration.conftest import FLEET, LocalCluster, gpu_pod

FLEET_FILE = Path(__file__).resolve().parents[2] / "e2e" / "fleets" / f"{FLEET}.yaml"


def _ready(node: dict[str, Any]) -> bool:
    return has_condition(node, "Ready")


def _pod(cluster: LocalCluster, namespace: str, name: str) -> dict[str, Any]:
    pod: dict[str, Any] = cluster.get("pod", name, "-n", namespace)
    return pod


def test_fleet_nodes_are_ready_with_gpu_allocatable(cluster: LocalCluster) -> None:
    fleet = load_fleet(FLEET_FILE)
    nodes = cluster.get("nodes", "-l", f"{FLEET_LABEL}={fleet.name}")["items"]
    by_name = {n["metadata"]["name"]: n for n in nodes}
    assert len(by_name) == fleet.node_count
    for group in fleet.groups:
        for name in group.node_names():
            node = by_name[name]
            assert _ready(node), f"{name} is not Ready"
            allocatable = node["status"]["allocatable"]
            labels = node["metadata"]["labels"]
            if group.gpus:
                assert allocatable["nvidia.com/gpu"] == str(group.gpus)
                assert labels["nvidia.com/gpu.product"] == group.gpu_product
            else:
                assert "nvidia.com/gpu" not in allocatable
            assert labels["topology.kubernetes.io/zone"] == group.zone
            assert "elastra.dev/block" in labels
            annotations = node["metadata"]["annotations"]
            assert annotations["elastra.dev/network-gbps"] == str(group.network_gbps)


def test_scheduler_binds_gpu_pod_to_a_fitting_node_and_kwok_runs_it(
    cluster: LocalCluster, namespace: str
) -> None:
    # 8 GPUs fit only the H100 and A100 nodes (T4 nodes have 4, CPU nodes none).
    cluster.apply(gpu_pod("eight-gpus", gpus=8), namespace=namespace)
    pod = wait_for(
        "eight-gpus to be Running",
        lambda: (
            (p := _pod(cluster, namespace, "eight-gpus"))["status"].get("phase") == "Running" and p
        ),
        timeout=60,
    )
    node = cluster.get("node", pod["spec"]["nodeName"])
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] in {
        "NVIDIA-H100-80GB-HBM3",
        "NVIDIA-A100-SXM4-80GB",
    }
    assert ipaddress.ip_address(pod["status"]["podIP"]).is_loopback
    ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert ready["Ready"] == "True"


def test_scheduler_respects_gpu_product_selector(cluster: LocalCluster, namespace: str) -> None:
    pod = gpu_pod("on-t4", gpus=4)
    pod["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "Tesla-T4"}
    cluster.apply(pod, namespace=namespace)
    running = wait_for(
        "on-t4 to be Running",
        lambda: (p := _pod(cluster, namespace, "on-t4"))["status"].get("phase") == "Running" and p,
        timeout=60,
    )
    assert running["spec"]["nodeName"].startswith("t4-")


def test_pod_asking_more_gpus_than_any_node_stays_pending(
    cluster: LocalCluster, namespace: str
) -> None:
    cluster.apply(gpu_pod("too-big", gpus=9), namespace=namespace)

    def unschedulable() -> dict[str, Any] | None:
        pod = _pod(cluster, namespace, "too-big")
        conditions: list[dict[str, Any]] = pod["status"].get("conditions") or []
        for c in conditions:
            if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable":
                return c
        return None

    condition = wait_for("too-big to be reported Unschedulable", unschedulable, timeout=60)
    assert "nvidia.com/gpu" in condition["message"]
    assert not _pod(cluster, namespace, "too-big")["spec"].get("nodeName")


def test_failure_stage_fails_pod_with_chosen_exit_code(
    cluster: LocalCluster, namespace: str
) -> None:
    pod = gpu_pod("doomed", gpus=1, labels={"sim.elastra.dev/fail": "true"})
    pod["metadata"]["annotations"] = {
        "sim.elastra.dev/exit-code": "42",
        "sim.elastra.dev/fail-after": "500ms",
    }
    cluster.apply(pod, namespace=namespace)
    failed = wait_for(
        "doomed to be Failed",
        lambda: (p := _pod(cluster, namespace, "doomed"))["status"].get("phase") == "Failed" and p,
        timeout=60,
    )
    (status,) = failed["status"]["containerStatuses"]
    assert status["state"]["terminated"]["exitCode"] == 42
    assert status["state"]["terminated"]["reason"] == "Error"


def test_deleting_owner_garbage_collects_owned_objects(
    cluster: LocalCluster, namespace: str
) -> None:
    cluster.kubectl("create", "configmap", "owner", "-n", namespace)
    owner = cluster.get("configmap", "owner", "-n", namespace)
    ref = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner["metadata"]["uid"],
    }
    owned_cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "owned", "ownerReferences": [ref]},
        "data": {"k": "v"},
    }
    owned_pod = gpu_pod("owned-pod", gpus=0)
    owned_pod["metadata"]["ownerReferences"] = [ref]
    cluster.apply(owned_cm, namespace=namespace)
    cluster.apply(owned_pod, namespace=namespace)
    cluster.kubectl("delete", "configmap", "owner", "-n", namespace, "--cascade=background")

    def gone() -> bool:
        out = cluster.kubectl(
            "get",
            "configmap/owned",
            "pod/owned-pod",
            "-n",
            namespace,
            "--ignore-not-found",
            "-o",
            "name",
        )
        return out.stdout.strip() == ""

    wait_for("the garbage collector to delete owned objects", gone, timeout=60)


def test_cluster_addresses_stay_on_loopback(cluster: LocalCluster) -> None:
    """Nothing the cluster hands out may lead traffic off this machine."""
    service = cluster.get("service", "kubernetes", "-n", "default")
    assert ipaddress.ip_address(service["spec"]["clusterIP"]).is_loopback
    for node in cluster.get("nodes", "-l", "type=kwok")["items"]:
        for address in node["status"]["addresses"]:
            if address["type"] == "InternalIP":
                assert ipaddress.ip_address(address["address"]).is_loopback
