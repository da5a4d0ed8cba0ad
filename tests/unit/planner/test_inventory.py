"""Nodes as kubectl prints them become typed capacity; bad nodes are named in one line."""

from __future__ import annotations

import pytest

from elastra.errors import UserError
from elastra.planner.inventory import parse_inventory

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


def test_unknown_type_names_node_and_label() -> None:
    with pytest.raises(
        UserError,
        match=r"node x: unknown GPU type 'NVIDIA-RTX-9000' in label nvidia.com/gpu.product",
    ):
        parse_inventory(node_list(node("x", product="NVIDIA-RTX-9000")))


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


def test_gpus_without_any_type_label_is_an_error() -> None:
    with pytest.raises(UserError, match=r"node g: has 8 nvidia\.com/gpu but no"):
        parse_inventory(node_list(node("g", product=None)))


def test_cpu_node() -> None:
    cpu = parse_inventory(node_list(node("c", product=None, gpus=0, cpu="63500m"))).nodes[0]
    assert cpu.gpu_type.is_cpu and cpu.free_gpus == 0 and cpu.free_cpu_millis == 63500


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"cordoned": True}, "cordoned"),
        ({"ready": False}, "NotReady"),
        ({"taints": [{"key": "maintenance", "value": "yes", "effect": "NoSchedule"}]}, "tainted"),
        ({"taints": [{"key": "gone", "effect": "NoExecute"}]}, "tainted gone:NoExecute"),
    ],
)
def test_not_capacity(kwargs: dict[str, object], reason: str) -> None:
    inventory = parse_inventory(node_list(node("x", **kwargs)))  # type: ignore[arg-type]
    assert inventory.nodes == ()
    assert reason in inventory.excluded[0].reason


@pytest.mark.parametrize(
    "taint",
    [
        {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
        {"key": "soft", "effect": "PreferNoSchedule"},
    ],
)
def test_tolerated_taints(taint: dict[str, str]) -> None:
    assert len(parse_inventory(node_list(node("x", taints=[taint]))).nodes) == 1


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
