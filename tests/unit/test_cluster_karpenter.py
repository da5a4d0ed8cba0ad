"""The Karpenter harness's pure parts: instance types as the kwok provider reads them, NodePools.

The kwok provider copies to a node only the single-valued ``In`` requirements of the offering
it launched, so every label an EKS node carries must be one; and a NodePool that names an
instance type the file lacks would never launch, so it is refused with the known names.
"""

from __future__ import annotations

import pytest
from e2e.cluster import karpenter as kp
from e2e.cluster.state import ClusterError

AWS = "karpenter.k8s.aws"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "p4d.24xlarge",
            {"instance-category": "p", "instance-family": "p4d", "instance-generation": "4",
             "instance-size": "24xlarge", "instance-gpu-name": "a100", "instance-gpu-count": "8",
             "instance-gpu-memory": "40960", "instance-cpu": "96"},
        ),
        (
            "p5.48xlarge",
            {"instance-family": "p5", "instance-generation": "5", "instance-gpu-name": "h100",
             "instance-gpu-count": "8", "instance-gpu-memory": "81920"},
        ),
        (
            "g5.12xlarge",
            {"instance-category": "g", "instance-gpu-name": "a10g", "instance-gpu-count": "4"},
        ),
        (
            "g6e.xlarge",
            {"instance-family": "g6e", "instance-generation": "6", "instance-gpu-name": "l40s"},
        ),
    ],
)  # fmt: skip
def test_instance_type_labels_are_the_aws_providers(name: str, expected: dict[str, str]) -> None:
    labels = kp.INSTANCE_TYPES[name].labels()
    assert {k: labels[f"{AWS}/{k}"] for k in expected} == expected
    assert labels[f"{AWS}/instance-gpu-manufacturer"] == "nvidia"


def test_every_offering_label_is_a_single_value_the_provider_copies_to_the_node() -> None:
    document = kp.instance_types_document(zones=("us-east-1a", "us-east-1b"))
    assert [t["name"] for t in document] == list(kp.INSTANCE_TYPES)
    for entry in document:
        instance = kp.INSTANCE_TYPES[entry["name"]]
        assert entry["resources"]["nvidia.com/gpu"] == str(instance.gpus)
        zones = []
        for offering in entry["offerings"]:
            requirements = {r["key"]: r for r in offering["Requirements"]}
            assert all(
                r["operator"] == "In" and len(r["values"]) == 1 for r in requirements.values()
            )
            labels = {k: r["values"][0] for k, r in requirements.items()}
            assert labels.items() >= instance.labels().items()
            zones.append(labels["topology.kubernetes.io/zone"])
        assert zones == ["us-east-1a", "us-east-1b"]


def test_a_node_pool_is_tainted_bounded_and_removes_empty_nodes() -> None:
    taint = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
    pool = kp.node_pool(
        "ml", instance_types=["g6.xlarge"], taint=taint, labels={"team": "a"}, gpu_limit=4
    )
    spec = pool["spec"]
    assert spec["template"]["spec"]["taints"] == [taint]
    assert spec["template"]["metadata"]["labels"] == {"team": "a"}
    assert spec["template"]["spec"]["requirements"][0]["values"] == ["g6.xlarge"]
    assert spec["limits"] == {"nvidia.com/gpu": "4"}
    assert spec["disruption"]["consolidationPolicy"] == "WhenEmpty"
    assert "limits" not in kp.node_pool("x", instance_types=["g6.xlarge"], taint=taint)["spec"]


@pytest.mark.parametrize("types", [["g6.xlarge", "x9.huge"], []])
def test_a_node_pool_of_unknown_instance_types_is_refused_with_the_known_ones(
    types: list[str],
) -> None:
    with pytest.raises(ClusterError, match=r"NodePool bad: .*p5\.48xlarge"):
        kp.node_pool("bad", instance_types=types, taint={"key": "k", "effect": "NoSchedule"})


@pytest.mark.parametrize(
    ("status", "ready"),
    [
        (None, False),  # just applied: Karpenter has not looked at it yet
        ({"conditions": None}, False),
        ({"conditions": [{"type": "ValidationSucceeded", "status": "True"}]}, False),
        (
            {"conditions": [{"type": "Ready", "status": "False", "reason": "NodeClassNotReady"}]},
            False,
        ),
        ({"conditions": [{"type": "Ready", "status": "True"}]}, True),
    ],
)
def test_a_node_pool_is_ready_only_when_karpenter_says_ready(
    status: dict[str, object] | None, ready: bool
) -> None:
    pool = kp.node_pool(
        "p", instance_types=["g6.xlarge"], taint={"key": "k", "effect": "NoSchedule"}
    )
    if status is not None:
        pool["status"] = status
    assert kp.node_pool_ready(pool) is ready
