"""Builders for Node and Pod dicts shaped like ``kubectl get -o yaml`` output."""

from __future__ import annotations

from typing import Any

from elastra.planner.inventory import Inventory, parse_inventory


def node(
    name: str,
    *,
    product: str | None = "NVIDIA-H100-80GB-HBM3",
    gpus: int = 8,
    block: str = "b0",
    zone: str = "z0",
    ready: bool = True,
    cordoned: bool = False,
    taints: list[dict[str, str]] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    cpu: str = "64",
    resource: str = "nvidia.com/gpu",
) -> dict[str, Any]:
    """One Node; ``product=None`` leaves the GPU product label off; ``resource`` is what its
    device plugin advertises the GPUs as."""
    all_labels = {"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": zone}
    all_labels["elastra.dev/block"] = block
    if product is not None:
        all_labels["nvidia.com/gpu.product"] = product
    all_labels.update(labels or {})
    allocatable: dict[str, str] = {"cpu": cpu, "memory": "512Gi"}
    if gpus:
        allocatable[resource] = str(gpus)
    spec: dict[str, Any] = {}
    if cordoned:
        spec["unschedulable"] = True
    if taints:
        spec["taints"] = taints
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": all_labels, "annotations": annotations or {}},
        "spec": spec,
        "status": {
            "allocatable": allocatable,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def node_list(*nodes: dict[str, Any]) -> dict[str, Any]:
    """A NodeList as ``kubectl get nodes -o yaml`` prints it."""
    return {"apiVersion": "v1", "kind": "NodeList", "items": list(nodes)}


def pod(name: str, node_name: str, *, gpus: int, phase: str = "Running") -> dict[str, Any]:
    """A pod bound to ``node_name`` that requests ``gpus`` GPUs."""
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
        },
        "status": {"phase": phase},
    }


def fleet(**counts: int) -> Inventory:
    """An inventory of 8-GPU nodes per product label, e.g. ``fleet(h100=4, a100=2)``."""
    products = {
        "h100": "NVIDIA-H100-80GB-HBM3",
        "a100": "NVIDIA-A100-SXM4-80GB",
        "a100_40": "NVIDIA-A100-SXM4-40GB",
        "l40s": "NVIDIA-L40S",
        "v100": "Tesla-V100-SXM2-32GB",
        "mi300x": "AMD-Instinct-MI300X",
    }
    nodes = [
        node(
            f"{kind}-{i}",
            product=products[kind],
            block=f"{kind}-block",
            resource="amd.com/gpu" if kind == "mi300x" else "nvidia.com/gpu",
        )
        for kind, count in sorted(counts.items())
        for i in range(count)
    ]
    return parse_inventory(node_list(*nodes))
