"""A node is declared lost from its real Lease and its worker's real heartbeat, and only then.

The node is a plain Node object (no kubelet, no kwok): the test plays its kubelet by writing
the node's Lease in ``kube-node-lease`` itself, and its worker pod by binding a pod to it and
setting its status Running with a loopback address, where a real HTTP server answers as the
agent's metrics page does. The operator's liveness task runs as in ``elastra run``: informers
over the real API server, the leader's rounds, the Node's Warning Event.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from elastra.controller.decide.manifests import LABEL_JOB
from elastra.controller.engine.agents import AgentClient
from elastra.controller.engine.leader import LeaderElector
from elastra.controller.engine.nodeliveness import NodeLiveness
from elastra.controller.engine.snapshot import ClusterSnapshot
from elastra.controller.settings import OperatorSettings
from elastra.elastic.liveness import (
    NODE_UNRESPONSIVE,
    PEERS_LOST_METRIC,
    PROBE_INTERVAL,
    SILENT_AFTER_PEERS_LOST,
)
from elastra.kube.client import Kube
from elastra.kube.config import load_connection
from elastra.kube.resources import NODE_LEASE_NAMESPACE
from tests.integration.conftest import LocalCluster

LEASE_S = 10
"""The test's Lease duration: overdue 3 s after a renewal (a kubelet's default is 40 s)."""
DEADLINE_S = 30.0


def micro(moment: datetime) -> str:
    """A Lease's MicroTime."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def renew(cluster: LocalCluster, node: str, lease_s: int = LEASE_S) -> None:
    """Renew the node's Lease (of ``lease_s`` s) now, as its kubelet would."""
    cluster.apply(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": node, "namespace": NODE_LEASE_NAMESPACE},
            "spec": {
                "holderIdentity": node,
                "leaseDurationSeconds": lease_s,
                "renewTime": micro(datetime.now(UTC)),
            },
        }
    )


class Heartbeat:
    """A loopback HTTP server that answers as a worker's metrics page (``page``), until
    stopped."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.page = b"elastra_worker_step 1\n"
        heartbeat = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = heartbeat.page
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                return

        self.server = http.server.ThreadingHTTPServer((host, port), Handler)
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def add_node(
    cluster: LocalCluster, namespace: str, name: str, *, ip: str, lease_s: int = LEASE_S
) -> None:
    """A Node with a fresh Lease and one Running worker pod of the job ``liveness`` at ``ip``."""
    cluster.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    renew(cluster, name, lease_s)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{name}-w0", "labels": {LABEL_JOB: "liveness"}},
        "spec": {
            "nodeName": name,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "worker", "image": "elastra-worker:dev"}],
        },
    }
    cluster.apply(pod, namespace=namespace)
    status = {"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}}
    cluster.kubectl(
        "patch", "pod", f"{name}-w0", "-n", namespace, "--subresource=status",
        "--type=merge", "-p", json.dumps(status),
    )  # fmt: skip


def remove_node(cluster: LocalCluster, namespace: str, name: str) -> None:
    """The node, its Lease, its pod and its Events gone."""
    cluster.kubectl("delete", "pod", f"{name}-w0", "-n", namespace, "--force", "--wait=false")
    cluster.kubectl("delete", "lease", name, "-n", NODE_LEASE_NAMESPACE, "--ignore-not-found")
    cluster.kubectl("delete", "node", name, "--ignore-not-found", "--wait=false")
    cluster.kubectl(
        "delete", "events", "-n", "default", "--ignore-not-found",
        f"--field-selector=involvedObject.kind=Node,involvedObject.name={name}",
    )  # fmt: skip


@pytest.fixture
def node(cluster: LocalCluster, namespace: str) -> Iterator[str]:
    """A Node with a fresh Lease and one Running worker pod on it at 127.0.0.1."""
    name = f"liveness-{uuid.uuid4().hex[:6]}"
    add_node(cluster, namespace, name, ip="127.0.0.1")
    try:
        yield name
    finally:
        remove_node(cluster, namespace, name)


def ready_as_read(snapshot: ClusterSnapshot, node: str) -> dict[str, Any] | None:
    """The node's Ready condition as every pass reads it."""
    for found in snapshot.read().nodes:
        if found["metadata"]["name"] == node:
            conditions = (found.get("status") or {}).get("conditions") or []
            return next((c for c in conditions if c.get("type") == "Ready"), None)
    return None


async def rounds_until(liveness: NodeLiveness, done: Any, *, timeout: float) -> float:
    """Run rounds every PROBE_INTERVAL until ``done()``; the seconds it took (raises past
    ``timeout``)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while not done():
        if loop.time() - started > timeout:
            raise TimeoutError(f"not within {timeout:.0f} s")
        await liveness.tick()
        await asyncio.sleep(PROBE_INTERVAL.total_seconds())
    return loop.time() - started


@contextlib.asynccontextmanager
async def liveness_running(
    cluster: LocalCluster, port: int, woken: list[int]
) -> AsyncIterator[tuple[NodeLiveness, ClusterSnapshot]]:
    """The leader's liveness task over the real API server's informers (rounds run by the
    test), asking workers on ``port``."""
    async with Kube(load_connection(str(cluster.kubeconfig))) as kube:
        snapshot = ClusterSnapshot.watching(kube, priority_classes=False)
        leader = LeaderElector(kube=kube, namespace="default", me="test", leading=True)
        settings = replace(OperatorSettings(), metrics_port=port)
        agents = AgentClient()
        liveness = NodeLiveness.watching(
            kube,
            snapshot,
            leader=leader,
            settings=settings,
            wake_jobs=lambda: woken.append(1),
            agents=agents,
        )
        tasks = [asyncio.create_task(i.run()) for i in (*snapshot.informers, liveness.leases)]
        try:
            await snapshot.wait_synced()
            await liveness.leases.wait_synced()
            yield liveness, snapshot
        finally:
            for task in tasks:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*tasks)
            await agents.close()


def seen(liveness: NodeLiveness, snapshot: ClusterSnapshot, namespace: str, node: str) -> bool:
    """The task sees the node's Lease and its worker pod's address."""
    pod = snapshot.pods.get(namespace, f"{node}-w0") or {}
    return liveness.leases.get(NODE_LEASE_NAMESPACE, node) is not None and bool(
        (pod.get("status") or {}).get("podIP")
    )


def test_a_slow_kubelet_is_kept_a_silent_node_is_lost_a_renewal_restores_it(
    cluster: LocalCluster, namespace: str, node: str
) -> None:
    heartbeat = Heartbeat()
    woken: list[int] = []

    async def scenario() -> tuple[float, float]:
        async with liveness_running(cluster, heartbeat.port, woken) as (liveness, snapshot):
            await rounds_until(
                liveness, lambda: seen(liveness, snapshot, namespace, node), timeout=DEADLINE_S
            )
            # A slow kubelet: the Lease goes overdue (after 3 s) and stays so for 15 s,
            # far past the workers' silence threshold, while the worker answers.
            slow = datetime.now(UTC) + timedelta(seconds=15)
            while datetime.now(UTC) < slow:
                assert await liveness.tick() == []
                await asyncio.sleep(PROBE_INTERVAL.total_seconds())
            assert (ready_as_read(snapshot, node) or {}).get("reason") != NODE_UNRESPONSIVE
            assert node not in snapshot.unresponsive_nodes
            # The worker falls silent too: declared lost within the silence threshold.
            heartbeat.stop()
            to_lost = await rounds_until(
                liveness, lambda: node in snapshot.unresponsive_nodes, timeout=DEADLINE_S
            )
            condition = ready_as_read(snapshot, node) or {}
            assert (condition.get("status"), condition.get("reason")) == (
                "Unknown",
                NODE_UNRESPONSIVE,
            )
            assert "Lease not renewed" in str(condition.get("message"))
            # Its kubelet renews the Lease again: read as it is within a round or two.
            renew(cluster, node)
            to_back = await rounds_until(
                liveness, lambda: node not in snapshot.unresponsive_nodes, timeout=DEADLINE_S
            )
            return to_lost, to_back

    to_lost, to_back = asyncio.run(scenario())
    assert to_lost <= 5.0, to_lost  # silent after 2 s, probes every second
    assert to_back <= 5.0, to_back
    assert len(woken) >= 2  # declared, then restored: the job loops were woken each time
    events = cluster.get(
        "events", "-n", "default",
        f"--field-selector=involvedObject.kind=Node,involvedObject.name={node}",
    )["items"]  # fmt: skip
    reasons = [(e["type"], e["reason"]) for e in events]
    assert ("Warning", NODE_UNRESPONSIVE) in reasons


@pytest.mark.parametrize("sentinel_lost", [False, True], ids=["survivor-asked", "sentinel-lost"])
def test_a_node_is_lost_in_seconds_when_a_world_there_reports_a_failed_collective(
    cluster: LocalCluster, namespace: str, sentinel_lost: bool
) -> None:
    """Two nodes with a worker of one job each, their Leases fresh (100 s: never overdue in
    the test). A worker silent alone is not enough; once the other worker's page says its
    world lost a member, the silent one's node is declared lost in seconds, whether the
    silent worker was the job's sentinel (the first pod by name: asked every round) or not."""
    first, second = (f"liveness-{uuid.uuid4().hex[:6]}-{i}" for i in "ab")
    survivor = Heartbeat("127.0.0.1")
    gone = Heartbeat("127.0.0.2", survivor.port)
    lost, kept = (first, second) if sentinel_lost else (second, first)
    addresses = {lost: "127.0.0.2", kept: "127.0.0.1"}
    woken: list[int] = []

    async def scenario() -> float:
        async with liveness_running(cluster, survivor.port, woken) as (liveness, snapshot):
            await rounds_until(
                liveness,
                lambda: all(seen(liveness, snapshot, namespace, n) for n in (lost, kept)),
                timeout=DEADLINE_S,
            )
            # The lost node's worker falls silent, its Lease fresh, no world reports a failed
            # collective: a network blip, not a lost node, for twice the threshold.
            gone.stop()
            blip = datetime.now(UTC) + 2 * SILENT_AFTER_PEERS_LOST
            while datetime.now(UTC) < blip:
                assert await liveness.tick() == []
                await asyncio.sleep(PROBE_INTERVAL.total_seconds())
            # The survivor's trainers end on a failed collective.
            survivor.page += f"{PEERS_LOST_METRIC} 1\n".encode()
            to_lost = await rounds_until(
                liveness, lambda: lost in snapshot.unresponsive_nodes, timeout=DEADLINE_S
            )
            assert kept not in snapshot.unresponsive_nodes, "the survivor's node answers"
            condition = ready_as_read(snapshot, lost) or {}
            assert condition.get("reason") == NODE_UNRESPONSIVE
            assert "reported a failed collective" in str(condition.get("message"))
            # Its Lease fresh all along: still lost until the kubelet renews it.
            for _ in range(3):
                await liveness.tick()
            assert lost in snapshot.unresponsive_nodes
            renew(cluster, lost, lease_s=100)
            await rounds_until(
                liveness, lambda: lost not in snapshot.unresponsive_nodes, timeout=DEADLINE_S
            )
            return to_lost

    for name in (lost, kept):
        add_node(cluster, namespace, name, ip=addresses[name], lease_s=100)
    try:
        to_lost = asyncio.run(scenario())
    finally:
        survivor.stop()
        for name in (lost, kept):
            remove_node(cluster, namespace, name)
    # Silent after 3 s of rounds once a round read the report; a silent sentinel costs a round.
    assert to_lost <= 6.0, to_lost
