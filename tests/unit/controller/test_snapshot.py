"""The shared cluster snapshot's reservations: concurrent job loops never plan the same GPUs.

The lister here is an in-memory list of dicts standing in for list responses; the real API
server is exercised by tests/integration and bench/bench_operator_scale.py.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

from elastra.controller.observe import _node_health, slim_node, slim_pod
from elastra.controller.planning import cluster_inventory
from elastra.controller.reconcile import Cluster, ClusterSnapshot
from elastra.controller.sharing import _live_pods
from elastra.kube.client import Kube
from tests.unit.controller.fakecluster import node


class Listing:
    """Answers ``list`` from in-memory nodes and pods, counting calls."""

    def __init__(self) -> None:
        self.nodes: list[dict[str, Any]] = [node("n1", gpus=8)]
        self.pods: list[dict[str, Any]] = []
        self.calls = 0

    async def list(self, path: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        self.calls += 1
        if path == "/api/v1/nodes":
            return list(self.nodes)
        if path == "/api/v1/pods":
            return list(self.pods)
        return []


def gated_pod(name: str, *, node_name: str = "n1", gpus: int = 4) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "labels": {"elastra.dev/job": name.split("-", maxsplit=1)[0]},
            "annotations": {"elastra.dev/node": node_name},
        },
        "spec": {
            "schedulingGates": [{"name": "elastra.dev/gang"}],
            "containers": [{"name": "w", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
        },
        "status": {"phase": "Pending"},
    }


def free_gpus(cluster: Cluster) -> int:
    inventory = cluster_inventory(cluster.nodes, cluster.pods, extra=cluster.reserved)
    return sum(n.free_gpus for n in inventory.nodes)


def snapshot(listing: Listing, ttl_s: float = 1000.0) -> ClusterSnapshot:
    return ClusterSnapshot(cast(Kube, listing), ttl_s=ttl_s)


def test_a_reserved_pod_holds_its_gpus_before_any_listing_shows_it() -> None:
    listing = Listing()
    snap = snapshot(listing)

    async def run() -> None:
        first = await snap.read()
        assert free_gpus(first) == 8
        snap.reserve([gated_pod("a-0")])
        second = await snap.read()
        assert listing.calls == 3, "the reservation must not need a fresh listing"
        assert free_gpus(second) == 4

    asyncio.run(run())


def test_a_reservation_ends_only_with_a_listing_started_after_its_create_returned() -> None:
    listing = Listing()
    snap = snapshot(listing)
    pod = gated_pod("a-0")

    async def fresh() -> int:
        snap.invalidate()
        return free_gpus(await snap.read())

    async def run() -> None:
        snap.reserve([pod])
        # In flight: a fresh listing without the pod still counts it.
        assert await fresh() == 4
        # The create failed (nothing listed): once settled, the next listing frees the GPUs.
        snap.settle([pod])
        assert await fresh() == 8
        assert listing.calls == 6

    asyncio.run(run())


def test_a_listed_pod_is_not_counted_twice() -> None:
    listing = Listing()
    snap = snapshot(listing)
    pod = gated_pod("a-0")

    async def run() -> None:
        snap.reserve([pod])
        listing.pods.append(pod)
        snap.invalidate()
        cluster = await snap.read()
        assert len(cluster.pods) == 1 and not cluster.reserved
        assert free_gpus(cluster) == 4

    asyncio.run(run())


def test_slim_listings_give_the_same_capacity_health_and_counts() -> None:
    nodes = [node("n1", gpus=8), node("n2", gpus=8)]
    nodes[1]["spec"] = {"unschedulable": True}
    for n in nodes:
        n["status"]["images"] = [{"names": ["big"], "sizeBytes": 1}] * 50
        n["status"]["conditions"][0]["message"] = "kubelet is posting ready status"
    bound = gated_pod("a-0")
    bound["spec"].pop("schedulingGates")
    bound["spec"]["nodeName"] = "n1"
    bound["metadata"]["annotations"]["elastra.dev/assignment"] = "x" * 2000
    finished = gated_pod("b-0")
    finished["status"]["phase"] = "Succeeded"
    deleting = gated_pod("c-0")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    pods = [bound, gated_pod("d-0"), finished, deleting]
    slim_nodes = [slim_node(n) for n in nodes]
    slim_pods = [slim_pod(p) for p in pods]
    for own in (None, "a", "d"):
        assert cluster_inventory(slim_nodes, slim_pods, own_job=own) == cluster_inventory(
            nodes, pods, own_job=own
        )
    assert _node_health(slim_nodes) == _node_health(nodes)
    assert _live_pods(slim_pods) == _live_pods(pods)
    assert len(json.dumps(slim_pods)) < len(json.dumps(pods)) / 2


def test_a_listing_invalidated_while_in_flight_is_not_taken_as_fresh() -> None:
    listing = Listing()
    snap = snapshot(listing)

    class Slow(Listing):
        async def list(self, path: str, label_selector: str | None = None) -> list[dict[str, Any]]:
            if path == "/api/v1/nodes":
                snap.invalidate()  # a node was deleted while this listing was on the wire
            return await super().list(path, label_selector)

    slow = Slow()
    snap.kube = cast(Kube, slow)

    async def run() -> None:
        await snap.read()
        await snap.read()
        assert slow.calls == 6, "the second read lists again"

    asyncio.run(run())
