"""Nodes whose GPUs cannot be planned with get one Warning Event each, on the real API server,
shown by ``kubectl describe node``; recording them again (the next round, an operator restart)
adds nothing.

The nodes are kwok's (Ready, with the GPU labels and allocatable given), the inventory is the
operator's own parse of the listed nodes, and what is asserted is read back with kubectl.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from e2e.cluster.api import wait_for
from e2e.cluster.components import has_condition

from elastra.controller.decide.capacity import node_inventory
from elastra.controller.engine.nodewarnings import warn
from elastra.kube.client import Kube
from elastra.kube.config import load_connection
from elastra.planner.inventory import MIG_PARTITIONED, UNKNOWN_GPU_TYPE
from tests.integration.conftest import LocalCluster

SETTLE_S = 60.0


def kwok_node(name: str, labels: dict[str, str], allocatable: dict[str, str]) -> dict[str, Any]:
    """A Node kwok keeps Ready with these labels and this allocatable."""
    resources = {"cpu": "96", "memory": "1Ti", "pods": "110", **allocatable}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "type": "kwok", **labels},
            "annotations": {"kwok.x-k8s.io/node": "fake"},
        },
        "spec": {
            "taints": [{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}]
        },
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }


@pytest.fixture
def nodes(cluster: LocalCluster) -> Iterator[dict[str, str]]:
    """An RTX node (no known type), a MIG node and an H100 node: name -> what they are."""
    tag = uuid.uuid4().hex[:6]
    made = {
        f"warn-rtx-{tag}": kwok_node(
            f"warn-rtx-{tag}",
            {"nvidia.com/gpu.product": "NVIDIA-GeForce-RTX-4090"},
            {"nvidia.com/gpu": "8"},
        ),
        f"warn-mig-{tag}": kwok_node(
            f"warn-mig-{tag}",
            {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"},
            {"nvidia.com/gpu": "56"},
        ),
        f"warn-h100-{tag}": kwok_node(
            f"warn-h100-{tag}",
            {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            {"nvidia.com/gpu": "8"},
        ),
    }
    for manifest in made.values():
        cluster.apply(manifest)
    try:
        wait_for(
            "the warned nodes Ready",
            lambda: all(ready(cluster.get("node", name)) for name in made),
            timeout=SETTLE_S,
        )
        yield {name: name.split("-")[1] for name in made}
    finally:
        cluster.kubectl("delete", "node", *made, "--ignore-not-found", "--wait=false")
        for name in made:
            cluster.kubectl(
                "delete", "events", "-n", "default", "--ignore-not-found",
                f"--field-selector=involvedObject.kind=Node,involvedObject.name={name}",
            )  # fmt: skip


def ready(node: dict[str, Any]) -> bool:
    return has_condition(node, "Ready")


def node_events(cluster: LocalCluster, name: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = cluster.get(
        "events",
        "-n",
        "default",
        f"--field-selector=involvedObject.kind=Node,involvedObject.name={name}",
    )["items"]
    return [e for e in found if e.get("source", {}).get("component") == "elastra-operator"]


def test_each_unplannable_node_is_warned_once(cluster: LocalCluster, nodes: dict[str, str]) -> None:
    listed = tuple({**n, "kind": "Node"} for n in cluster.get("nodes")["items"])
    excluded = [n for n in node_inventory(listed).excluded if n.name in nodes]
    assert {n.name: n.category for n in excluded} == {
        name: {"rtx": UNKNOWN_GPU_TYPE, "mig": MIG_PARTITIONED}[kind]
        for name, kind in nodes.items()
        if kind != "h100"
    }
    connection = load_connection(str(cluster.kubeconfig))

    async def rounds() -> list[int]:
        due = []
        warned: dict[str, str] = {}
        async with Kube(connection) as kube:
            due.append(await warn(kube, excluded, warned=warned))
            due.append(await warn(kube, excluded, warned=warned))  # the next round: nothing due
        async with Kube(connection) as restarted:  # a new operator remembers nothing
            due.append(await warn(restarted, excluded, warned={}))
        return due

    assert asyncio.run(rounds()) == [2, 0, 2]
    for name, kind in nodes.items():

        def probe(name: str = name) -> list[dict[str, Any]] | None:
            found = node_events(cluster, name)
            return found if found else None

        if kind == "h100":
            assert node_events(cluster, name) == []
            continue
        (event,) = wait_for(f"the Warning Event on {name}", probe, timeout=SETTLE_S)
        assert (event["type"], event["count"]) == ("Warning", 1)
        assert event["reason"] == (UNKNOWN_GPU_TYPE if kind == "rtx" else MIG_PARTITIONED)
        described = cluster.kubectl("describe", "node", name).stdout
        assert event["reason"] in described.split("Events:")[-1]
