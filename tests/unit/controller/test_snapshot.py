"""The snapshot over the informers' caches: reservations keep concurrent job loops off the same
GPUs and keep a pass from taking a pod it just created for a lost one, and end without leaking.

The informers here are fed by hand (``replace``, ``apply``) as their watches would feed them;
the real list and watch are tested in tests/unit/kube/test_informer.py and the whole operator
against the real API server in tests/integration.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from elastra.controller.decide.observe import _node_health, slim_node, slim_pod
from elastra.controller.decide.planning import cluster_inventory
from elastra.controller.decide.sharing import _live_pods
from elastra.controller.engine import snapshot as snapshot_module
from elastra.controller.engine.snapshot import ClusterSnapshot, ClusterState, job_of, keep_pod
from elastra.kube.informer import Informer
from tests.unit.controller.fakecluster import T0, node


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


def answered(pod: dict[str, Any], version: str = "7") -> dict[str, Any]:
    """The pod as the API server answers a create: with a resourceVersion."""
    return {**pod, "metadata": {**pod["metadata"], "resourceVersion": version}}


def synced_snapshot(pods: list[dict[str, Any]] | None = None) -> ClusterSnapshot:
    snap = ClusterSnapshot(
        nodes=Informer(None, "/api/v1/nodes", transform=slim_node),
        pods=Informer(None, "/api/v1/pods", transform=keep_pod, index=job_of),
        jobs=Informer(None, "/apis/elastra.dev/v1alpha1/trainingjobs"),
    )
    snap.nodes.replace([node("n1", gpus=8)], "1")
    snap.pods.replace(pods or [], "1")
    snap.jobs.replace([], "1")
    return snap


def free_gpus(cluster: ClusterState) -> int:
    inventory = cluster_inventory(cluster.nodes, cluster.pods, extra=cluster.reserved)
    return sum(n.free_gpus for n in inventory.nodes)


def names(pods: list[dict[str, Any]]) -> list[str]:
    return [p["metadata"]["name"] for p in pods]


def test_a_reserved_pod_holds_its_gpus_and_is_the_jobs_until_the_cache_shows_it() -> None:
    snap = synced_snapshot()
    pod = gated_pod("a-0")
    assert free_gpus(snap.read()) == 8
    snap.reserve([pod])
    assert free_gpus(snap.read()) == 4
    assert names(snap.job_pods("ns", "a")) == ["a-0"], "a pod in flight is not a lost pod"
    snap.created(pod, answered(pod))
    assert snap.job_pods("ns", "a")[0]["metadata"]["resourceVersion"] == "7"
    snap.pods.apply({"type": "ADDED", "object": answered(pod, "8")})
    cluster = snap.read()
    assert not cluster.reserved and free_gpus(cluster) == 4, "not counted twice"
    assert snap.job_pods("ns", "a")[0]["metadata"]["resourceVersion"] == "8"
    assert snap.job_pods("ns", "b") == []


def test_a_pod_the_watch_reports_before_the_create_returns_ends_its_reservation() -> None:
    snap = synced_snapshot()
    pod = gated_pod("a-0")
    snap.reserve([pod])
    snap.pods.apply({"type": "ADDED", "object": answered(pod)})
    snap.pods.apply({"type": "DELETED", "object": answered(pod, "9")})
    snap.created(pod, answered(pod))
    assert free_gpus(snap.read()) == 8 and snap.job_pods("ns", "a") == []


def test_reservations_end_when_the_create_fails_or_was_never_sent() -> None:
    snap = synced_snapshot()
    failed, unsent, sent = gated_pod("a-0"), gated_pod("a-1"), gated_pod("b-0", gpus=2)
    snap.reserve([failed, unsent, sent])
    snap.unreserve(failed)
    snap.created(sent, answered(sent))
    snap.release([failed, unsent, sent])  # the pass is over: a-1 was never created
    assert names(list(snap.read().reserved)) == ["b-0"]
    assert free_gpus(snap.read()) == 6


def test_a_reservation_the_watch_never_reports_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(snapshot_module.time, "monotonic", lambda: clock[0])
    snap = synced_snapshot()
    pod = gated_pod("a-0")
    snap.reserve([pod])
    clock[0] += 10 * snapshot_module.RESERVATION_TTL_S
    assert free_gpus(snap.read()) == 4, "a create still in flight never expires"
    snap.created(pod, None)
    clock[0] += snapshot_module.RESERVATION_TTL_S - 1
    assert free_gpus(snap.read()) == 4
    clock[0] += 2
    assert free_gpus(snap.read()) == 8


def test_tuples_are_rebuilt_only_for_the_informer_that_changed() -> None:
    snap = synced_snapshot([gated_pod("a-0")])
    first = snap.read()
    assert snap.read() is first
    beat = node("n1", gpus=8)
    beat["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-01-01T00:00:01Z"
    snap.nodes.apply({"type": "MODIFIED", "object": beat})
    assert snap.read() is first, "a heartbeat changes nothing the planner reads"
    snap.pods.apply({"type": "ADDED", "object": gated_pod("b-0")})
    second = snap.read()
    assert second.nodes is first.nodes and second.jobs is first.jobs
    assert second.pods is not first.pods and len(second.pods) == 2


def test_a_read_slims_again_only_the_pod_that_changed() -> None:
    """The listing, capacity and counts follow a changed pod and reuse the others."""
    snap = synced_snapshot([gated_pod("a-0"), gated_pod("b-0", gpus=1)])
    first = {p["metadata"]["name"]: p for p in snap.read().pods}
    assert free_gpus(snap.read()) == 8 - 4 - 1
    snap.pods.apply({"type": "MODIFIED", "object": gated_pod("b-0", gpus=2)})
    second = {p["metadata"]["name"]: p for p in snap.read().pods}
    assert second["a-0"] is first["a-0"]
    assert second["b-0"] == slim_pod(gated_pod("b-0", gpus=2))
    assert free_gpus(snap.read()) == 8 - 4 - 2
    ended = gated_pod("b-0", gpus=2)
    ended["status"]["phase"] = "Succeeded"
    snap.pods.apply({"type": "MODIFIED", "object": ended})
    assert _live_pods(snap.read().pods) == {"ns/a": 1}


def test_a_status_write_is_in_the_cache_at_once_unless_the_watch_was_faster() -> None:
    snap = synced_snapshot()
    job = {"metadata": {"name": "j", "namespace": "ns", "resourceVersion": "3"}, "status": {}}
    snap.jobs.apply({"type": "ADDED", "object": job})
    written = {**job, "metadata": {**job["metadata"], "resourceVersion": "4"}, "status": {"a": 1}}
    snap.wrote_job(job, written, at=T0)
    assert snap.job("ns", "j") == written
    newer = {**written, "metadata": {**written["metadata"], "resourceVersion": "6"}}
    snap.jobs.apply({"type": "MODIFIED", "object": newer})
    snap.wrote_job(job, {**written, "status": {"stale": True}}, at=T0)
    assert snap.job("ns", "j") == newer


def test_the_time_of_a_jobs_last_status_write_is_kept_until_the_job_goes() -> None:
    snap = synced_snapshot()
    job = {"metadata": {"name": "j", "namespace": "ns", "resourceVersion": "3"}, "status": {}}
    snap.jobs.apply({"type": "ADDED", "object": job})
    assert snap.status_written("ns", "j") is None
    written = {**job, "metadata": {**job["metadata"], "resourceVersion": "4"}}
    snap.wrote_job(job, written, at=T0)
    later = T0 + timedelta(seconds=3)
    snap.wrote_job(
        written, {**written, "metadata": {**job["metadata"], "resourceVersion": "5"}}, at=later
    )
    assert snap.status_written("ns", "j") == later
    assert snap.status_written("ns", "other") is None
    snap.jobs.apply({"type": "DELETED", "object": written})
    assert snap.status_written("ns", "j") is None


def test_a_patch_answer_updates_the_cache_or_the_reservation() -> None:
    listed = answered(gated_pod("a-0"), "5")
    snap = synced_snapshot([listed])
    patched = answered(gated_pod("a-0"), "6")
    patched["spec"].pop("schedulingGates")
    snap.wrote_pod(snap.current_pod("ns", "a-0"), patched)
    assert snap.job_pods("ns", "a") == [patched]
    fresh = gated_pod("a-1")
    snap.reserve([fresh])
    snap.created(fresh, answered(fresh, "7"))
    ungated = answered(gated_pod("a-1"), "8")
    snap.wrote_pod(snap.current_pod("ns", "a-1"), ungated)
    assert snap.job_pods("ns", "a")[1] == ungated


def test_other_tenants_pods_are_kept_slim_and_worker_pods_whole() -> None:
    worker = answered(gated_pod("a-0"))
    worker["metadata"]["managedFields"] = [{"manager": "elastra"}]
    other = {**answered(gated_pod("x-0")), "metadata": {"name": "x-0", "namespace": "ns"}}
    other["spec"]["volumes"] = [{"name": "big"}]
    assert keep_pod(other) == slim_pod(other)
    kept = keep_pod(worker)
    assert "managedFields" not in kept["metadata"] and kept["spec"] == worker["spec"]


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
    for own in (None, "ns/a", "ns/d"):
        assert cluster_inventory(slim_nodes, slim_pods, own_job=own) == cluster_inventory(
            nodes, pods, own_job=own
        )
    assert _node_health(slim_nodes) == _node_health(nodes)
    assert _live_pods(slim_pods) == _live_pods(pods)
    assert len(json.dumps(slim_pods)) < len(json.dumps(pods)) / 2


def test_priority_classes_reach_every_pass_as_numbers_and_follow_their_watch() -> None:
    snap = synced_snapshot()
    assert snap.read().priorities.of("high") is None, "no classes informer: none known"
    snap.classes = Informer(None, "/apis/scheduling.k8s.io/v1/priorityclasses")
    assert snap.classes in snap.informers and not snap.synced
    high = {"metadata": {"name": "high", "resourceVersion": "1"}, "value": 1000}
    snap.classes.replace([high], "1")
    assert snap.synced
    first = snap.read()
    assert (first.priorities.of("high"), first.priorities.of(None)) == (1000, 0)
    assert snap.read() is first, "nothing changed: the same cluster"
    base = {"metadata": {"name": "base", "resourceVersion": "2"}, "value": 5, "globalDefault": True}
    snap.classes.apply({"type": "ADDED", "object": base})
    assert snap.read().priorities.of(None) == 5
    assert snap.read().nodes is first.nodes, "the other listings are kept"


def test_a_node_declared_unresponsive_is_read_not_ready_until_cleared() -> None:
    """``nodeliveness`` marks a node: every pass reads it NotReady (its pods lost, no capacity)
    with the reason and message, and as it is once the mark is cleared."""
    snap = synced_snapshot()
    before = snap.read().nodes
    assert _node_health(before)["n1"].ready and free_gpus(snap.read()) == 8
    assert snap.declare_unresponsive("n1", "node n1: Lease not renewed for 13 s ...")
    assert not snap.declare_unresponsive("n1", "again"), "declared once"
    (marked,) = snap.read().nodes
    ready = [c for c in marked["status"]["conditions"] if c["type"] == "Ready"]
    assert ready == [
        {
            "type": "Ready",
            "status": "Unknown",
            "reason": "NodeUnresponsive",
            "message": "node n1: Lease not renewed for 13 s ...",
        }
    ]
    assert not _node_health(snap.read().nodes)["n1"].ready and free_gpus(snap.read()) == 0
    assert snap.clear_unresponsive("n1") and not snap.clear_unresponsive("n1")
    assert snap.read().nodes == before
