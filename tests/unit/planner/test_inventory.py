"""Nodes as kubectl prints them become typed capacity; bad nodes are named in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from elastra.errors import UserError
from elastra.planner.catalog import by_name
from elastra.planner.inventory import (
    GPUS_NOT_ADVERTISED,
    MIG_PARTITIONED,
    UNKNOWN_GPU_TYPE,
    parse_inventory,
)

from .nodes import node, node_list, pod


def test_types_counts_topology_and_network() -> None:
    inventory = parse_inventory(
        node_list(
            node("b", product="NVIDIA-A100-SXM4-80GB", block="rack-2", zone="z1"),
            node("a", annotations={"elastra.dev/network-gbps": "3200"}),
        )
    )
    a, b = inventory.nodes
    assert (a.name, a.gpu_type.name, a.free_gpus, a.network_gbps) == ("a", "H100-SXM-80GB", 8, 3200)
    assert (b.gpu_type.name, b.zone, b.block) == ("A100-SXM-80GB", "z1", "rack-2")
    assert b.network_gbps == b.gpu_type.node_network_gbps


def test_plain_list_and_single_node_documents() -> None:
    assert len(parse_inventory([node("a"), node("b")]).nodes) == 2
    assert len(parse_inventory(node("a")).nodes) == 1


def test_gpu_type_label_overrides_product() -> None:
    inventory = parse_inventory(
        node_list(
            node("a", product="NVIDIA-H100-80GB-HBM3", labels={"elastra.dev/gpu-type": "L40S"})
        )
    )
    assert inventory.nodes[0].gpu_type.name == "L40S"


def test_unknown_type_is_not_capacity_and_says_why() -> None:
    inventory = parse_inventory(node_list(node("x", product="NVIDIA-RTX-9000"), node("y")))
    assert [n.name for n in inventory.nodes] == ["y"]
    (excluded,) = inventory.excluded
    assert (excluded.name, excluded.category) == ("x", UNKNOWN_GPU_TYPE)
    assert "nvidia.com/gpu.product='NVIDIA-RTX-9000'" in excluded.reason
    assert "elastra.dev/gpu-type" in excluded.reason and "elastra.dev/gpu-tflops" in excluded.reason


def test_an_unknown_own_label_is_not_looked_past() -> None:
    """The admin's ``elastra.dev/gpu-type`` is their word: a typo there is not overruled by
    the product label."""
    labels = {"elastra.dev/gpu-type": "H100-SMX"}
    (excluded,) = parse_inventory(node_list(node("x", labels=labels))).excluded
    assert "unknown GPU type 'H100-SMX' in label elastra.dev/gpu-type" in excluded.reason


def test_unknown_type_with_own_figures_is_accepted() -> None:
    figures = {"elastra.dev/gpu-tflops": "400", "elastra.dev/gpu-memory-gib": "96"}
    inventory = parse_inventory(
        node_list(node("x", product="NVIDIA-RTX-9000", annotations=figures))
    )
    gpu = inventory.nodes[0].gpu_type
    assert (gpu.name, gpu.bf16_tflops, gpu.memory_gib) == ("NVIDIA-RTX-9000", 400.0, 96.0)


def test_figures_override_catalog_and_must_agree_per_type() -> None:
    fast = {"elastra.dev/gpu-interconnect-gbps": "800"}
    inventory = parse_inventory(node_list(node("a", annotations=fast)))
    assert inventory.nodes[0].gpu_type.interconnect_gbs == 100.0
    with pytest.raises(UserError, match="node b: its figures for GPU type H100-SXM-80GB differ"):
        parse_inventory(node_list(node("a", annotations=fast), node("b")))


def test_gpus_without_any_type_label_are_not_capacity() -> None:
    (excluded,) = parse_inventory(node_list(node("g", product=None))).excluded
    assert excluded.category == UNKNOWN_GPU_TYPE
    assert excluded.reason.startswith("8 nvidia.com/gpu but none of the labels elastra.dev/")


@pytest.mark.parametrize(
    ("labels", "resource", "reason"),
    [
        # An AMD part labelled on a node whose device plugin is NVIDIA's: its pods would ask
        # for amd.com/gpu there and never be scheduled.
        (
            {"elastra.dev/gpu-type": "MI300X"},
            "nvidia.com/gpu",
            "its GPUs are nvidia.com/gpu, but pods of GPU type MI300X request amd.com/gpu",
        ),
        ({"amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM"}, "amd.com/gpu", ""),
        # An AMD GPU the catalog lacks, declared by its figures: pods could not name its resource.
        (
            {
                "amd.com/gpu.product-name": "AMD_Instinct_MI325X_OAM",
                "elastra.dev/gpu-tflops": "1307",
                "elastra.dev/gpu-memory-gib": "256",
            },
            "amd.com/gpu",
            "a type declared by a node's own figures is requested as nvidia.com/gpu",
        ),
    ],
)
def test_a_type_is_planned_only_where_the_node_advertises_its_resource(
    labels: dict[str, str], resource: str, reason: str
) -> None:
    inventory = parse_inventory(
        node_list(node("x", product=None, labels=labels, resource=resource))
    )
    if reason:
        assert inventory.nodes == () and reason in inventory.excluded[0].reason
    else:
        (parsed,) = inventory.nodes
        assert (parsed.gpu_type.name, parsed.gpu_type.resource) == ("MI300X", "amd.com/gpu")


def test_both_vendors_on_one_node_is_not_capacity() -> None:
    both = node(
        "x", product=None, labels={"elastra.dev/gpu-type": "MI300X"}, resource="amd.com/gpu"
    )
    both["status"]["allocatable"]["nvidia.com/gpu"] = "2"
    (excluded,) = parse_inventory(node_list(both)).excluded
    assert "advertises 2 nvidia.com/gpu and 8 amd.com/gpu" in excluded.reason


def test_cpu_node() -> None:
    cpu = parse_inventory(node_list(node("c", product=None, gpus=0, cpu="63500m"))).nodes[0]
    assert cpu.gpu_type.is_cpu and cpu.free_gpus == 0 and cpu.free_cpu_millis == 63500


def test_not_ready_is_not_capacity() -> None:
    inventory = parse_inventory(node_list(node("x", ready=False)))
    assert inventory.nodes == ()
    assert "NotReady" in inventory.excluded[0].reason


@pytest.mark.parametrize(
    ("kwargs", "cordoned", "taints", "pool"),
    [
        ({"cordoned": True}, True, 0, None),
        (
            {"taints": [{"key": "maintenance", "value": "yes", "effect": "NoSchedule"}]},
            False,
            1,
            None,
        ),
        ({"labels": {"pool": "ml"}}, False, 0, "ml"),
    ],
)
def test_what_the_scheduler_reads_rides_along(
    kwargs: dict[str, Any], cordoned: bool, taints: int, pool: str | None
) -> None:
    """Whether a job's pods may use a node is asked per job (``eligibility``), so the
    inventory keeps cordoned and tainted nodes, with what the scheduler reads of them."""
    (parsed,) = parse_inventory(node_list(node("x", **kwargs))).nodes
    assert parsed.facts is not None
    assert parsed.facts.unschedulable == cordoned and len(parsed.facts.taints) == taints
    assert parsed.facts.labels.get("pool") == pool
    assert parsed.facts.allocatable.get("memory") == 512 * 1024**3


def test_running_pods_are_subtracted_finished_ones_not() -> None:
    pods = [
        pod("p1", "a", gpus=3),
        pod("p2", "a", gpus=2, phase="Succeeded"),
        pod("p3", "b", gpus=8),
    ]
    inventory = parse_inventory(node_list(node("a"), node("b")), pods)
    assert [n.free_gpus for n in inventory.nodes] == [5, 0]


def test_bad_numbers_name_the_node() -> None:
    with pytest.raises(
        UserError, match=r"node a: elastra\.dev/network-gbps='fast' is not a number"
    ):
        parse_inventory(node_list(node("a", annotations={"elastra.dev/network-gbps": "fast"})))
    with pytest.raises(UserError, match="expected kind Node or NodeList"):
        parse_inventory({"kind": "Pod"})


FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "clusters"
EKS = ".us-west-2.compute.internal"
GKE = "gke-train-{}-3f9c2a71-{}"
AKS = "aks-{}-27418803-vmss00000{}"


def gke(pool: str, suffix: str) -> str:
    return GKE.format(pool, suffix)


def aks(pool: str, index: int) -> str:
    return AKS.format(pool, index)


CLUSTERS: list[tuple[str, dict[str, tuple[str, int]], dict[str, str]]] = [
    # (fixture, {node: (GPU type, GPUs)} of the capacity, {node: category} of the excluded)
    (
        "eks-p4d.yaml",
        {
            f"ip-10-0-129-47{EKS}": ("A100-SXM-40GB", 8),
            f"ip-10-0-131-201{EKS}": ("A100-SXM-40GB", 7),
        },
        {},
    ),
    (
        "eks-p5.yaml",
        {
            f"ip-10-0-12-9{EKS}": ("CPU", 0),
            f"ip-10-0-140-18{EKS}": ("H100-SXM-80GB", 8),
            f"ip-10-0-141-77{EKS}": ("H100-SXM-80GB", 8),
        },
        {},
    ),
    (
        "eks-g5-gfd.yaml",
        {
            f"ip-10-0-70-11{EKS}": ("A10G", 4),
            f"ip-10-0-70-95{EKS}": ("A10G", 4),
            f"ip-10-0-71-3{EKS}": ("A10G", 8),
        },
        {},
    ),
    (
        "eks-g5-nogfd.yaml",
        {
            f"ip-10-0-80-14{EKS}": ("A10G", 4),
            f"ip-10-0-80-202{EKS}": ("A10G", 4),
            f"ip-10-0-81-66{EKS}": ("A10G", 1),
        },
        {},
    ),
    (
        "gke-a2.yaml",
        {
            gke("default-pool", "b2kx"): ("CPU", 0),
            gke("a100-40", "x7kq"): ("A100-SXM-40GB", 8),
            gke("a100-40", "p3mz"): ("A100-SXM-40GB", 8),
            gke("a100-80", "c9dw"): ("A100-SXM-80GB", 8),
        },
        {},
    ),
    (
        "gke-a3.yaml",
        {
            gke("h100", "k2vn"): ("H100-SXM-80GB", 8),
            gke("h100", "r8tq"): ("H100-SXM-80GB", 8),
            gke("h100-mega", "w4jd"): ("H100-SXM-80GB", 8),
        },
        {gke("b200", "m1zs"): UNKNOWN_GPU_TYPE},
    ),
    (
        "gke-g2.yaml",
        {
            gke("l4-2", "d5fh"): ("L4", 2),
            gke("l4-2", "q0lb"): ("L4", 2),
            gke("l4-8", "z6ye"): ("L4", 8),
            gke("t4", "h3ga"): ("T4", 2),
        },
        {},
    ),
    (
        "aks-nd-a100-v4.yaml",
        {
            aks("system", 0): ("CPU", 0),
            aks("ndasr", 0): ("A100-SXM-40GB", 8),
            aks("ndasr", 1): ("A100-SXM-40GB", 8),
            aks("nca100", 0): ("A100-PCIe-80GB", 1),
        },
        {},
    ),
    (
        "aks-nd-h100-v5.yaml",
        {
            aks("ndh100", 0): ("H100-SXM-80GB", 8),
            aks("ndh100", 1): ("H100-SXM-80GB", 8),
            aks("nch100", 0): ("H100-NVL-94GB", 2),
            aks("mi300x", 0): ("MI300X", 8),
        },
        {},
    ),
    (
        "karpenter.yaml",
        {
            f"ip-10-0-160-21{EKS}": ("A100-SXM-80GB", 8),
            f"ip-10-0-160-88{EKS}": ("A100-SXM-40GB", 8),
            f"ip-10-0-161-5{EKS}": ("L40S", 4),
            f"ip-10-0-161-130{EKS}": ("A10G", 1),
        },
        {f"ip-10-0-162-40{EKS}": UNKNOWN_GPU_TYPE},
    ),
    (
        "mixed.yaml",
        {
            "dgx-h100-0": ("H100-SXM-80GB", 8),
            "dgx-h100-1": ("H100-SXM-80GB", 8),
            "mi300x-0": ("MI300X", 8),
            "cpu-0": ("CPU", 0),
        },
        {
            "dgx-a100-mig-0": MIG_PARTITIONED,
            "dgx-a100-mig-1": MIG_PARTITIONED,
            "ws-rtx4090-0": UNKNOWN_GPU_TYPE,
            "gpu-unlabelled-0": UNKNOWN_GPU_TYPE,
            "ip-10-9-4-17.ec2.internal": GPUS_NOT_ADVERTISED,
            "dgx-h100-2": "",
        },
    ),
]


@pytest.mark.parametrize(("fixture", "capacity", "excluded"), CLUSTERS)
def test_provider_node_fixtures(
    fixture: str, capacity: dict[str, tuple[str, int]], excluded: dict[str, str]
) -> None:
    """Nodes shaped as each provider documents them: the type and count of every node, and
    every node that is not capacity with its category."""
    inventory = parse_inventory(yaml.safe_load((FIXTURES / fixture).read_text()))
    assert {n.name: (n.gpu_type.name, n.free_gpus) for n in inventory.nodes} == capacity
    assert {n.name: n.category for n in inventory.excluded} == excluded
    for gpu_node in (n for n in inventory.nodes if not n.gpu_type.is_cpu):
        resource = gpu_node.gpu_type.resource
        assert gpu_node.facts is None or gpu_node.facts.allocatable.get(resource) > 0


def test_fixture_reasons_say_what_was_read_and_what_to_do() -> None:
    inventory = parse_inventory(yaml.safe_load((FIXTURES / "mixed.yaml").read_text()))
    reasons = {str(n.name): n.reason for n in inventory.excluded}
    assert "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb" in reasons["dgx-a100-mig-0"]
    assert "nvidia.com/mig-1g.10gb, nvidia.com/mig-3g.40gb" in reasons["dgx-a100-mig-1"]
    assert "nvidia.com/mig.config=all-disabled" in reasons["dgx-a100-mig-1"]
    assert "nvidia.com/gpu.product='NVIDIA-GeForce-RTX-4090'" in reasons["ws-rtx4090-0"]
    assert "the device plugin has not registered" in reasons["ip-10-9-4-17.ec2.internal"]


def test_instance_type_count_and_allocatable_disagree_allocatable_wins() -> None:
    inventory = parse_inventory(yaml.safe_load((FIXTURES / "eks-p4d.yaml").read_text()))
    (note,) = inventory.notes
    assert note.name == f"ip-10-0-131-201{EKS}"
    assert note.message == (
        "node.kubernetes.io/instance-type=p4d.24xlarge has 8 GPUs but status.allocatable "
        "nvidia.com/gpu is 7: planned with 7, the device plugin's count"
    )


@pytest.mark.parametrize(
    ("fixture", "node_name", "gbps"),
    [
        ("eks-p4d.yaml", f"ip-10-0-129-47{EKS}", 400.0),  # 4x 100 Gbit/s EFA, not a DGX's 1,600
        ("eks-p5.yaml", f"ip-10-0-140-18{EKS}", 3200.0),
        ("eks-g5-nogfd.yaml", f"ip-10-0-81-66{EKS}", 5.0),
        ("aks-nd-a100-v4.yaml", "aks-ndasr-27418803-vmss000000", 1600.0),
        ("aks-nd-a100-v4.yaml", "aks-nca100-27418803-vmss000000", 20.0),
        ("aks-nd-h100-v5.yaml", "aks-mi300x-27418803-vmss000000", 3200.0),
        ("gke-a2.yaml", "gke-train-a100-40-3f9c2a71-x7kq", 100.0),
        ("gke-a3.yaml", "gke-train-h100-mega-3f9c2a71-w4jd", 1800.0),
        ("gke-g2.yaml", "gke-train-l4-8-3f9c2a71-z6ye", 100.0),
        # no instance type the table knows: the catalog's default for the type
        ("mixed.yaml", "dgx-h100-0", by_name("H100-SXM-80GB").node_network_gbps),
    ],
)
def test_a_node_without_the_annotation_has_its_instance_types_network(
    fixture: str, node_name: str, gbps: float
) -> None:
    inventory = parse_inventory(yaml.safe_load((FIXTURES / fixture).read_text()))
    networks = {str(n.name): n.network_gbps for n in inventory.nodes}
    assert networks[node_name] == gbps


def test_the_annotation_wins_over_the_instance_type() -> None:
    labels = {"node.kubernetes.io/instance-type": "p4d.24xlarge"}
    annotations = {"elastra.dev/network-gbps": "50"}
    listed = node("a", product="NVIDIA-A100-SXM4-40GB", labels=labels, annotations=annotations)
    (only,) = parse_inventory(node_list(listed)).nodes
    assert only.network_gbps == 50.0


def test_karpenter_network_label_is_the_nodes_network() -> None:
    inventory = parse_inventory(yaml.safe_load((FIXTURES / "karpenter.yaml").read_text()))
    networks = {str(n.name): n.network_gbps for n in inventory.nodes}
    assert networks[f"ip-10-0-160-21{EKS}"] == 400.0 and networks[f"ip-10-0-161-130{EKS}"] == 2.5
