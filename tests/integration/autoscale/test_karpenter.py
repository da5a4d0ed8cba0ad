"""Karpenter on the test cluster scales a tainted GPU pool from zero and back (no Elastra).

Why: the scale-from-zero tests of this folder trust that a pending pod which tolerates a
pool's taint gets a node shaped as EKS labels it, and that an empty node goes away; this test
checks exactly that with a plain pod, so a failure there points at the harness or at Elastra.
"""

from __future__ import annotations

from typing import Any

from e2e.cluster import karpenter as kp
from e2e.cluster.api import wait_for

from tests.integration.autoscale.conftest import Karpenter, NodePools
from tests.integration.conftest import LocalCluster, gpu_pod

GPU_LABELS = "karpenter.k8s.aws/instance-gpu"


def _pod(cluster: LocalCluster, namespace: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = cluster.get("pod", name, "-n", namespace)
    return result


def test_a_pending_gpu_pod_gets_a_karpenter_node_that_goes_when_the_pod_does(
    cluster: LocalCluster, karpenter: Karpenter, node_pools: NodePools, namespace: str
) -> None:
    pool = node_pools.create("one-gpu", instance_types=["p4d.24xlarge", "g5.xlarge", "g6.xlarge"])
    assert karpenter.nodes(pool.name) == []
    pod = gpu_pod("wants-a-gpu", gpus=1)
    pod["spec"]["tolerations"] = [pool.toleration]  # the pool's taint only: no fleet node fits
    cluster.apply(pod, namespace=namespace)

    bound = wait_for(
        "the pod to be bound to a node",
        lambda: _pod(cluster, namespace, "wants-a-gpu")["spec"].get("nodeName"),
        timeout=120,
        interval=0.5,
        hint=karpenter.log_tail,
    )
    made = karpenter.nodes(pool.name)
    assert [n["metadata"]["name"] for n in made] == [bound]
    labels = made[0]["metadata"]["labels"]
    # The cheapest of the pool's types that holds one GPU, labelled as EKS labels it.
    assert labels[kp.INSTANCE_TYPE_LABEL] == "g6.xlarge"
    assert {k: v for k, v in labels.items() if k.startswith(GPU_LABELS)} == {
        f"{GPU_LABELS}-name": "l4",
        f"{GPU_LABELS}-count": "1",
        f"{GPU_LABELS}-manufacturer": "nvidia",
        f"{GPU_LABELS}-memory": "22888",
    }
    assert labels["topology.kubernetes.io/zone"] == kp.DEFAULT_ZONES[0]
    assert made[0]["status"]["allocatable"]["nvidia.com/gpu"] == "1"
    assert dict(pool.taint) in [
        {k: t[k] for k in ("key", "value", "effect")} for t in made[0]["spec"].get("taints", [])
    ]
    wait_for(
        "kwok to run the pod on the new node",
        lambda: _pod(cluster, namespace, "wants-a-gpu")["status"].get("phase") == "Running",
        timeout=60,
        interval=0.5,
    )

    cluster.kubectl("delete", "pod", "wants-a-gpu", "-n", namespace, "--wait=false")
    wait_for(
        "Karpenter to remove the empty node",
        lambda: not karpenter.nodes(pool.name) and not karpenter.node_claims(pool.name),
        timeout=180,
        interval=1.0,
        hint=karpenter.log_tail,
    )
