"""Fleet files and NodeLists become the planner's inventory; errors name line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from elastra.errors import UserError
from elastra.sim.fleet import load_cluster, parse_cluster
from elastra.sim.nodes import NodePool

REPO = Path(__file__).resolve().parents[3]


def test_committed_fleets_load() -> None:
    small = load_cluster(REPO / "e2e" / "fleets" / "hetero-small.yaml")
    assert small.name == "hetero-small" and small.gpus == 72
    types = {n.gpu_type.name for n in small.inventory.nodes if not n.gpu_type.is_cpu}
    assert types == {"H100-SXM-80GB", "A100-SXM-80GB", "T4"}
    large = load_cluster(REPO / "e2e" / "fleets" / "hetero-large.yaml")
    assert large.gpus == 6656


def test_node_list_is_accepted() -> None:
    text = """\
kind: NodeList
items:
  - metadata: {name: n1, labels: {nvidia.com/gpu.product: Tesla-T4}}
    status:
      allocatable: {nvidia.com/gpu: "4", cpu: "8"}
      conditions: [{type: Ready, status: "True"}]
"""
    cluster = parse_cluster(text, source="nodes.yaml")
    assert cluster.gpus == 4


def test_unknown_gpu_product_names_line_and_field() -> None:
    text = """\
kind: Fleet
name: bad
groups:
  - prefix: ok
    count: 1
    gpu: {product: Tesla-T4, count: 4}
    cpu: "8"
    memory: 1Gi
  - prefix: odd
    count: 1
    gpu:
      product: Voodoo-5
      count: 4
    cpu: "8"
    memory: 1Gi
"""
    with pytest.raises(UserError) as err:
        parse_cluster(text, source="f.yaml")
    assert str(err.value).startswith("f.yaml:12: groups[1].gpu.product: ")
    assert "Voodoo-5" in str(err.value)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("  - {prefix: a, count: -1, cpu: '1', memory: 1Gi}\n", "f.yaml:4: groups[0].count"),
        ("  - {prefix: a, count: 1, cpu: '1', memory: 1Gi, colour: red}\n", "groups[0].colour"),
        ("  - {prefix: a, count: 1, cpu: lots, memory: 1Gi}\n", "f.yaml:4: groups[0].cpu"),
    ],
)
def test_malformed_groups(body: str, expected: str) -> None:
    with pytest.raises(UserError, match=expected.replace("[", r"\[").replace("]", r"\]")):
        parse_cluster(f"kind: Fleet\nname: f\ngroups:\n{body}", source="f.yaml")


def test_best_fit_placement_packs_and_never_overcommits() -> None:
    cluster = load_cluster(REPO / "e2e" / "fleets" / "hetero-small.yaml")
    pool = NodePool(cluster.inventory)
    first = pool.place("H100-SXM-80GB", 2, 1)
    assert first is not None
    assert first[0][1] == 1
    node = first[0][0]
    pool.take(node, 2)
    again = pool.place("H100-SXM-80GB", 2, 1)
    assert again == ((node, 1),)  # best fit: the partly used node first
    assert pool.place("H100-SXM-80GB", 8, 4) is None  # only three whole nodes are left
    assert pool.place("H100-SXM-80GB", 8, 3) is not None
    assert pool.place("H100-SXM-80GB", 8, 4, extra={node: 2}) is not None  # what-if
    pool.set_up(node, False)
    assert pool.free_by_type["H100-SXM-80GB"] == 24
    with pytest.raises(ValueError):
        pool.give(node, 3)  # more than it ever had
