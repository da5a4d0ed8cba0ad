"""kube-scheduler's placement filters as the planner asks them: tolerations against taints, the
node selector, required node affinity and the cordon, case by case (Kubernetes 1.36 semantics;
the integration test tests/integration/test_scheduler_agreement.py checks the same rules
against the real scheduler)."""

from __future__ import annotations

from typing import Any

import pytest

from elastra.planner.scheduling import (
    NodeFacts,
    PodConstraints,
    PodToleration,
    Taint,
    refusal,
)

NODE = NodeFacts(
    name="n1",
    labels={"zone": "a", "gpus": "8", "big": "99999999999999999999", "tier": "1.5", "pad": "007"},
)


def pod(**spec: Any) -> PodConstraints:
    return PodConstraints.of_pod_spec(spec)


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    required = {"nodeSelectorTerms": list(terms)}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    found: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        found["values"] = list(values)
    return found


@pytest.mark.parametrize(
    ("toleration", "taint", "tolerated"),
    [
        (PodToleration("k", "Equal", "v", "NoSchedule"), Taint("k", "v", "NoSchedule"), True),
        (PodToleration("k", "", "v", "NoSchedule"), Taint("k", "v", "NoSchedule"), True),  # Equal
        (PodToleration("k", "Equal", "v", "NoSchedule"), Taint("k", "w", "NoSchedule"), False),
        (PodToleration("k", "Equal", "", ""), Taint("k", "", "NoExecute"), True),
        (PodToleration("k", "Exists", "", "NoSchedule"), Taint("k", "any", "NoSchedule"), True),
        (PodToleration("k", "Exists", "", "NoSchedule"), Taint("k", "any", "NoExecute"), False),
        (PodToleration("k", "Exists", "", ""), Taint("k", "x", "NoExecute"), True),  # all effects
        (PodToleration("", "Exists", "", ""), Taint("any", "x", "NoExecute"), True),  # everything
        (PodToleration("", "Exists", "", "NoSchedule"), Taint("any", "", "NoExecute"), False),
        (PodToleration("j", "Exists", "", ""), Taint("k", "", "NoSchedule"), False),
        (PodToleration("k", "Gt", "1", ""), Taint("k", "5", "NoSchedule"), False),  # gate off
    ],
)
def test_toleration_matches_taint(toleration: PodToleration, taint: Taint, tolerated: bool) -> None:
    assert toleration.tolerates(taint) is tolerated


@pytest.mark.parametrize(
    ("toleration", "wire"),
    [
        (
            PodToleration("k", "Exists", "", "NoSchedule"),
            {"key": "k", "operator": "Exists", "effect": "NoSchedule"},
        ),
        (PodToleration("k", "", "v", ""), {"key": "k", "value": "v"}),
        (PodToleration("", "Exists", "", ""), {"operator": "Exists"}),
    ],
)
def test_a_toleration_written_to_a_pod_reads_back_the_same(
    toleration: PodToleration, wire: dict[str, str]
) -> None:
    assert toleration.to_wire() == wire
    assert PodConstraints.of_pod_spec({"tolerations": [wire]}).tolerations == (toleration,)


TAINTED = NodeFacts(
    name="t",
    taints=(
        Taint("dedicated", "ml", "NoSchedule"),
        Taint("soft", "", "PreferNoSchedule"),
        Taint("evict", "now", "NoExecute"),
    ),
)
TOLERATE_ALL_NAMED = [
    {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
    {"key": "evict", "operator": "Exists"},
]


@pytest.mark.parametrize(
    ("tolerations", "reason"),
    [
        (TOLERATE_ALL_NAMED, ""),  # PreferNoSchedule never refuses
        ([{"operator": "Exists"}], ""),
        (TOLERATE_ALL_NAMED[:1], "taint evict=now:NoExecute not tolerated"),
        ([], "taint dedicated=ml:NoSchedule not tolerated"),
        (
            [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}, TOLERATE_ALL_NAMED[1]],
            "taint dedicated=ml:NoSchedule not tolerated",
        ),
    ],
)
def test_taints_name_the_first_one_not_tolerated(
    tolerations: list[dict[str, str]], reason: str
) -> None:
    assert refusal(pod(tolerations=tolerations), TAINTED) == reason


@pytest.mark.parametrize(
    ("tolerations", "reason"),
    [
        ([], "cordoned (spec.unschedulable), and the pod does not tolerate "),
        ([{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}], ""),
        ([{"key": "node.kubernetes.io/unschedulable", "effect": "NoExecute"}], "cordoned"),
        ([{"operator": "Exists"}], ""),
    ],
)
def test_a_cordon_counts_as_the_unschedulable_taint(
    tolerations: list[dict[str, str]], reason: str
) -> None:
    found = refusal(pod(tolerations=tolerations), NodeFacts(name="c", unschedulable=True))
    assert found.startswith(reason) and bool(found) == bool(reason)


@pytest.mark.parametrize(
    ("selector", "reason"),
    [
        ({}, ""),
        ({"zone": "a", "gpus": "8"}, ""),
        ({"zone": "b"}, "nodeSelector zone=b (node: zone=a)"),
        ({"rack": "r1"}, "nodeSelector rack=r1 (node: no such label)"),
    ],
)
def test_node_selector_needs_every_label(selector: dict[str, str], reason: str) -> None:
    assert refusal(pod(nodeSelector=selector), NODE) == reason


@pytest.mark.parametrize(
    ("terms", "reason"),
    [
        ([{"matchExpressions": [expr("zone", "In", "a", "b")]}], ""),
        ([{"matchExpressions": [expr("zone", "In", "b")]}], "zone In [b] (node: zone=a)"),
        ([{"matchExpressions": [expr("zone", "NotIn", "b")]}], ""),
        ([{"matchExpressions": [expr("rack", "NotIn", "b")]}], ""),  # missing label passes
        ([{"matchExpressions": [expr("zone", "NotIn", "a")]}], "zone NotIn [a]"),
        ([{"matchExpressions": [expr("zone", "Exists")]}], ""),
        ([{"matchExpressions": [expr("rack", "Exists")]}], "rack Exists (node: no such label)"),
        ([{"matchExpressions": [expr("rack", "DoesNotExist")]}], ""),
        ([{"matchExpressions": [expr("zone", "DoesNotExist")]}], "zone DoesNotExist"),
        ([{"matchExpressions": [expr("gpus", "Gt", "4")]}], ""),
        ([{"matchExpressions": [expr("gpus", "Gt", "8")]}], "gpus Gt [8] (node: gpus=8)"),
        ([{"matchExpressions": [expr("gpus", "Lt", "+9")]}], ""),
        ([{"matchExpressions": [expr("pad", "Gt", "6")]}], ""),  # 007 reads as 7
        ([{"matchExpressions": [expr("gpus", "Lt", "-1")]}], "gpus Lt [-1]"),
        ([{"matchExpressions": [expr("tier", "Gt", "1")]}], "tier=1.5, not an integer"),
        ([{"matchExpressions": [expr("big", "Gt", "1")]}], "not an integer"),  # > int64
        ([{"matchExpressions": [expr("rack", "Lt", "1")]}], "rack Lt [1] (node: no such label)"),
        ([{"matchExpressions": [expr("gpus", "Gt", "four")]}], "Gt needs exactly one integer"),
        ([{"matchExpressions": [expr("gpus", "Gt", "1", "2")]}], "Gt needs exactly one integer"),
        ([{"matchExpressions": [expr("zone", "In")]}], "In needs values"),
        ([{"matchExpressions": [expr("zone", "Exists", "a")]}], "Exists takes no values"),
        ([{"matchExpressions": [expr("zone", "Near", "a")]}], "operator 'Near' is not one of"),
        ([{"matchFields": [expr("metadata.name", "In", "n1")]}], ""),
        ([{"matchFields": [expr("metadata.name", "NotIn", "n1")]}], "metadata.name NotIn [n1]"),
        ([{"matchFields": [expr("metadata.name", "NotIn", "n2")]}], ""),
        ([{"matchFields": [expr("metadata.name", "In", "n1", "n2")]}], "exactly one value"),
        ([{"matchFields": [expr("metadata.name", "Exists")]}], "operator 'Exists' is not"),
        ([{"matchFields": [expr("spec.other", "In", "x")]}], "spec.other In [x]"),
        # expressions and fields of one term are ANDed
        (
            [
                {
                    "matchExpressions": [expr("zone", "In", "a")],
                    "matchFields": [expr("metadata.name", "In", "n2")],
                }
            ],
            "matchFields metadata.name In [n2]",
        ),
        # terms are ORed; an empty term matches nothing
        ([{}, {"matchExpressions": [expr("zone", "In", "a")]}], ""),
        ([{}], "an empty term matches no node"),
        ([], "has no nodeSelectorTerms: it matches no node"),
        (
            [{"matchExpressions": [expr("zone", "In", "b")]}, {"matchExpressions": []}],
            "term 0: matchExpressions zone In [b] (node: zone=a); term 1: an empty term",
        ),
        # a malformed requirement spoils its term only
        (
            [
                {"matchExpressions": [expr("gpus", "Gt", "x")]},
                {"matchExpressions": [expr("gpus", "Gt", "1")]},
            ],
            "",
        ),
    ],
)
def test_required_node_affinity(terms: list[dict[str, Any]], reason: str) -> None:
    found = refusal(pod(affinity=affinity(*terms)), NODE)
    assert (reason in found) if reason else found == ""
    assert bool(found) == bool(reason)


def test_selector_and_affinity_are_anded() -> None:
    both = pod(nodeSelector={"zone": "a"}, affinity=affinity({"matchExpressions": []}))
    assert "an empty term" in refusal(both, NODE)
    assert refusal(pod(nodeSelector={"zone": "a"}, affinity={}), NODE) == ""


def test_placement_drops_the_requests_only() -> None:
    spec = {
        "tolerations": [{"operator": "Exists"}],
        "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
    }
    full = pod(**spec)
    assert full.requests and not full.placement().requests
    assert full.placement().tolerations == full.tolerations
