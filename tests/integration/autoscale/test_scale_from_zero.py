"""Elastra on an autoscaled GPU pool that starts empty, with Karpenter as the autoscaler.

Why: workers are created gated and pinned to nodes that exist, which no autoscaler acts on.
A job short of nodes asks with capacity-request pods (``controller/decide/placeholders.py``); these
tests check, against Karpenter itself and the real ``elastra run``, that the requests bring
nodes, that the job forms and grows on them, that nothing is left pending when it shrinks or
goes (and Karpenter removes the nodes), that a pool of two GPU types gives a mixed plan, and
that a request no pool can answer is withdrawn and said once.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from e2e.cluster.api import wait_for

from elastra.controller.decide.placeholders import LABEL_CAPACITY_REQUEST
from tests.integration.autoscale.conftest import Karpenter, NodePools, Pool
from tests.integration.conftest import LocalCluster
from tests.integration.operator.conftest import Jobs, OperatorProcess

SKIP_METRICS = {"type": "kwok"}
"""On every pool's nodes: the operator reads no metrics from pods kwok only pretends to run."""


@pytest.fixture
def start_operator(
    cluster: LocalCluster, namespace: str, request: pytest.FixtureRequest
) -> Iterator[Callable[..., OperatorProcess]]:
    """Starts the real ``elastra run`` for this test's namespace, with extra flags; prints
    its log's tail when the test failed."""
    started: list[OperatorProcess] = []
    failed_before = request.session.testsfailed

    def start(*extra: str) -> OperatorProcess:
        proc = OperatorProcess(cluster, namespace, extra_args=extra)
        proc.start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()
        if request.session.testsfailed > failed_before:
            sys.stderr.write("\n--- operator log (last 80 lines) ---\n")
            sys.stderr.write("\n".join(proc.lines[-80:]) + "\n")


@dataclass(frozen=True)
class Scene:
    """What each test here works with: the cluster, Karpenter and its pools, the test's
    namespace, its jobs, and a way to start the operator."""

    cluster: LocalCluster
    karpenter: Karpenter
    pools: NodePools
    namespace: str
    jobs: Jobs
    start_operator: Callable[..., OperatorProcess]


@pytest.fixture
def scene(
    cluster: LocalCluster,
    karpenter: Karpenter,
    node_pools: NodePools,
    namespace: str,
    start_operator: Callable[..., OperatorProcess],
) -> Scene:
    jobs = Jobs(cluster, namespace)
    return Scene(cluster, karpenter, node_pools, namespace, jobs, start_operator)


def job_manifest(
    name: str,
    pool: Pool,
    *,
    replicas: int,
    gpu_types: list[str],
    heterogeneous: bool = False,
) -> dict[str, Any]:
    """A one-GPU-per-worker job that tolerates ``pool``'s taint and selects its nodes, so its
    capacity requests are the pool's to answer and its workers land only there."""
    return {
        "apiVersion": "elastra.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "minReplicas": 2,
            "maxReplicas": 4,
            "worker": {
                "gpus": 1,
                "gpuTypes": gpu_types,
                "image": "elastra-worker:dev",
                "template": {
                    "spec": {
                        "tolerations": [pool.toleration],
                        "nodeSelector": pool.node_selector,
                    }
                },
            },
            "placement": {"heterogeneous": heterogeneous},
            "training": {"globalBatchSize": 13440},
            "checkpoint": {"uri": f"s3://elastra-test/{name}"},
            "failurePolicy": {"maxRestarts": 5, "backoffSeconds": 0},
        },
    }


def requests_of(cluster: LocalCluster, namespace: str) -> list[dict[str, Any]]:
    """The capacity-request pods of the namespace."""
    found = cluster.get("pods", "-n", namespace, "-l", LABEL_CAPACITY_REQUEST)["items"]
    return list(found)


def pending(cluster: LocalCluster, namespace: str) -> list[str]:
    """Pods of the namespace not bound to a node (or Pending)."""
    pods = cluster.get("pods", "-n", namespace)["items"]
    return [
        p["metadata"]["name"]
        for p in pods
        if not p["spec"].get("nodeName") or p["status"].get("phase") == "Pending"
    ]


def world(status: dict[str, Any]) -> dict[str, Any]:
    return dict(status.get("world") or {})


def test_from_an_empty_pool_a_job_forms_grows_shrinks_and_leaves_nothing(scene: Scene) -> None:
    cluster, namespace = scene.cluster, scene.namespace
    karpenter, jobs = scene.karpenter, scene.jobs
    pool = scene.pools.create(
        "from-zero", instance_types=["g6.xlarge"], labels=SKIP_METRICS, gpu_limit=2
    )
    scene.start_operator()
    jobs.apply(job_manifest("grow", pool, replicas=4, gpu_types=["L4"]))

    formed = jobs.wait(
        "a world of 2 on the nodes Karpenter made (the pool holds 2 GPUs)",
        lambda: (
            (s := jobs.status("grow")).get("phase") == "Degraded"
            and world(s).get("replicas") == 2
            and s
        ),
        timeout=120,
    )
    made = {n["metadata"]["name"] for n in karpenter.nodes(pool.name)}
    assert {p["node"] for p in formed["placement"]} <= made and len(made) == 2
    asking = formed["capacityRequest"]
    assert asking["state"] == "Requested" and asking["workers"] == 2, asking
    assert len(requests_of(cluster, namespace)) == 2, "the two the pool's limit holds back"

    limits = {"spec": {"limits": {"nvidia.com/gpu": "4"}}}
    cluster.kubectl("patch", "nodepool", pool.name, "--type=merge", "-p", json.dumps(limits))
    grown = jobs.wait(
        "the job to grow to 4 once the pool may hold 4",
        lambda: (
            (s := jobs.status("grow")).get("phase") == "Running"
            and world(s).get("replicas") == 4
            and s
        ),
        timeout=120,
    )
    assert "capacityRequest" not in grown
    assert {p["node"] for p in grown["placement"]} <= {
        n["metadata"]["name"] for n in karpenter.nodes(pool.name)
    }
    assert requests_of(cluster, namespace) == []

    scale = {"spec": {"replicas": 2}}
    cluster.kubectl(
        "patch", "trainingjob", "grow", "-n", namespace, "--type=merge", "-p", json.dumps(scale)
    )
    jobs.wait(
        "a world of 2 again, its retired workers gone",
        lambda: world(jobs.status("grow")).get("replicas") == 2 and len(jobs.pods("grow")) == 2,
        timeout=90,
    )
    assert requests_of(cluster, namespace) == [] and pending(cluster, namespace) == []
    wait_for(
        "Karpenter to remove the two empty nodes",
        lambda: len(karpenter.nodes(pool.name)) == 2,
        timeout=120,
        interval=1.0,
        hint=karpenter.log_tail,
    )

    cluster.kubectl("delete", "trainingjob", "grow", "-n", namespace, "--wait=false")
    wait_for(
        "every pod of the job to go",
        lambda: not cluster.get("pods", "-n", namespace)["items"],
        timeout=90,
        interval=1.0,
    )
    wait_for(
        "Karpenter to remove every node of the pool",
        lambda: not karpenter.nodes(pool.name),
        timeout=120,
        interval=1.0,
        hint=karpenter.log_tail,
    )


def test_a_pool_of_two_gpu_types_gives_a_mixed_plan(scene: Scene) -> None:
    karpenter, jobs = scene.karpenter, scene.jobs
    pool = scene.pools.create(
        "two-types", instance_types=["g6.xlarge", "g5.xlarge"], labels=SKIP_METRICS
    )
    scene.start_operator()
    jobs.apply(
        job_manifest("mixed", pool, replicas=2, gpu_types=["L4", "A10G"], heterogeneous=True)
    )
    running = jobs.wait(
        "a world of 2 running",
        lambda: (s := jobs.status("mixed")).get("phase") == "Running" and s,
        timeout=120,
    )
    assert sorted(running["plan"]["gpuTypes"]) == ["A10G", "L4"], running["plan"]
    # A request may take the first node that came, whichever type it prefers; Karpenter may
    # then add one more node, which it removes once it stays empty.
    made = {n["metadata"]["name"]: n["metadata"]["labels"] for n in karpenter.nodes(pool.name)}
    types = sorted(
        made[p["node"]]["node.kubernetes.io/instance-type"] for p in running["placement"]
    )
    assert types == ["g5.xlarge", "g6.xlarge"], "on one node of each type, which Karpenter made"


def test_a_request_no_pool_can_answer_is_withdrawn_and_said_once(scene: Scene) -> None:
    cluster, namespace = scene.cluster, scene.namespace
    karpenter, jobs = scene.karpenter, scene.jobs
    pool = scene.pools.create("no-h100", instance_types=["g6.xlarge"], labels=SKIP_METRICS)
    operator = scene.start_operator("--capacity-request-timeout-seconds=15")
    jobs.apply(job_manifest("wants-h100", pool, replicas=2, gpu_types=["H100"]))
    jobs.wait(
        "two capacity requests",
        lambda: len(requests_of(cluster, namespace)) == 2,
        timeout=30,
    )
    status = jobs.wait(
        "the request withdrawn after its timeout",
        lambda: (
            (s := jobs.status("wants-h100")).get("capacityRequest", {}).get("state")
            == "Unsatisfied"
            and s
        ),
        timeout=60,
    )
    admitted = next(c for c in status["conditions"] if c["type"] == "Admitted")
    assert admitted["status"] == "False" and "no autoscaler gave nodes" in admitted["message"]
    wait_for(
        "no pending pod",
        lambda: not requests_of(cluster, namespace) and not pending(cluster, namespace),
        timeout=30,
    )
    quiet_before = operator.quiet_passes("wants-h100")
    wait_for(
        "a few more passes",
        lambda: operator.quiet_passes("wants-h100") >= quiet_before + 2,
        timeout=30,
    )
    assert requests_of(cluster, namespace) == [], "not asked again: nothing changed"
    said = [e for e in jobs.events("wants-h100") if "no autoscaler" in e.get("message", "")]
    assert len(said) == 1 and said[0].get("count", 1) == 1, said
    assert said[0]["reason"] == "Unplaceable", "Admitted turning False says it, once"
    assert karpenter.nodes(pool.name) == [], "no pool offers an H100"
