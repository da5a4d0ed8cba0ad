"""A job for a dedicated, tainted pool runs there and nowhere else, planned by the real operator.

Platform teams keep GPU pools for one use with a taint (``dedicated=ml:NoSchedule``) and a
label; a job opts in with a toleration and a ``nodeSelector`` in ``worker.template``. The
operator must plan on exactly the nodes such a pod can be scheduled on: the labelled nodes
whose taints it tolerates, not the tolerated but unlabelled ones, not the labelled ones with a
taint it does not tolerate, and not the shared fleet. This test adds its own fake nodes
(removed afterwards) beside the hetero-small fleet.
"""

from __future__ import annotations

from typing import Any

from tests.integration.conftest import LocalCluster
from tests.integration.operator.conftest import Jobs, NodePool, OperatorProcess, gpu_job

TAINT_KEY = "dedicated"


def _taint(cluster: LocalCluster, node: str, value: str) -> None:
    cluster.kubectl("taint", "nodes", node, f"{TAINT_KEY}={value}:NoSchedule")


def _world_nodes(jobs: Jobs, name: str, size: int) -> set[str] | None:
    """The nodes of a Running world of ``size`` pods, every one of them bound; else ``None``."""
    status = jobs.status(name)
    if status.get("world", {}).get("replicas") != size:
        return None
    pods = {p["metadata"]["name"]: p for p in jobs.pods(name)}
    members = [pods.get(rank) for rank in status["world"].get("ranks", [])]
    if len(members) != size or not all(
        p and p["status"].get("phase") == "Running" for p in members
    ):
        return None
    return {str(p["spec"]["nodeName"]) for p in members if p}


def test_a_tolerating_job_with_a_node_selector_runs_only_on_its_pool(
    cluster: LocalCluster, jobs: Jobs, operator: OperatorProcess, pool: NodePool
) -> None:
    ml_0, ml_1, other, unlabelled = pool.add(4)
    label = f"example.com/pool={jobs.namespace}"
    for node in (ml_0, ml_1, other):
        cluster.kubectl("label", "nodes", node, label)
    for node in (ml_0, ml_1, unlabelled):
        _taint(cluster, node, "ml")
    _taint(cluster, other, "batch")  # in the pool by label, but not a taint the job tolerates
    body = gpu_job("dedicated", replicas=3, gpus=8)
    del body["spec"]["worker"]["gpuTypes"]  # any type: the fleet's H100s would do, but for these
    body["spec"]["worker"]["template"] = {
        "spec": {
            "tolerations": [
                {"key": TAINT_KEY, "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
            ],
            "nodeSelector": {"example.com/pool": jobs.namespace},
        }
    }
    jobs.apply(body)

    placed = jobs.wait(
        "a world of 2 on the two tolerated, labelled nodes",
        lambda: _world_nodes(jobs, "dedicated", 2),
    )
    assert placed == {ml_0, ml_1}
    everywhere = {str(p["spec"].get("nodeName") or p["metadata"]["annotations"]["elastra.dev/node"])
                  for p in jobs.pods("dedicated")}  # fmt: skip
    assert everywhere <= {ml_0, ml_1}, f"pods planned outside the pool: {everywhere}"

    # The tolerated node joins the pool: the job grows onto it, and only onto it.
    cluster.kubectl("label", "nodes", unlabelled, label)
    grown = jobs.wait(
        "a world of 3 once the third node carries the label",
        lambda: _world_nodes(jobs, "dedicated", 3),
        timeout=120,
    )
    assert grown == {ml_0, ml_1, unlabelled}
    pods: list[dict[str, Any]] = jobs.pods("dedicated")
    assert all(p["spec"].get("nodeName") != other for p in pods)
