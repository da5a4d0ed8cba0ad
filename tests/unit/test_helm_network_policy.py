"""The operator pod's own NetworkPolicy in the chart (templates/networkpolicy.yaml).

Why: the operator holds a token that creates pods in every namespace; on a cluster whose CNI
enforces policies, its pod should talk only to the API server, DNS and its workers' metrics
port, and take traffic only on its metrics and health ports. A policy that missed one of
those would cut the operator off (no API server: no jobs at all; no workers' port: resizes
judged without the step rate) on exactly the clusters that enforce it, and the local cluster
enforces none: so each port is tied here to what the Deployment and the operator really use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from e2e.cluster.controlplane import toolchain_bindir

from elastra.controller.decide.manifests import LABEL_JOB
from elastra.controller.settings import OperatorSettings
from tests.unit.test_helm_chart import (
    NAMESPACE,
    HelmError,
    Manifest,
    a_worker_pod,
    container,
    one,
    render,
)

DNS = [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]


@pytest.fixture(scope="module")
def helm() -> Path:
    return toolchain_bindir(build=True) / "helm"


@pytest.fixture(scope="module")
def default(helm: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Manifest]:
    return render(helm, tmp_path_factory.mktemp("default"))


def policy(manifests: list[Manifest]) -> dict[str, Any]:
    found: dict[str, Any] = one(manifests, "NetworkPolicy")
    return found


def egress_to_workers(spec: dict[str, Any]) -> dict[str, Any]:
    rules: list[dict[str, Any]] = spec["egress"]
    (rule,) = [r for r in rules if r.get("to") and "podSelector" in r["to"][0]]
    return rule


def test_the_policy_selects_the_operator_pod_and_lets_in_only_its_ports(
    default: list[Manifest],
) -> None:
    found = policy(default)
    assert found["metadata"]["namespace"] == NAMESPACE
    spec = found["spec"]
    pod_labels = one(default, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert spec["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    (ingress,) = spec["ingress"]
    assert "from" not in ingress  # Prometheus and the kubelet come from anywhere
    ports = {p["containerPort"] for p in container(one(default, "Deployment"))["ports"]}
    assert {p["port"] for p in ingress["ports"]} == ports == {8080, 8081}


def test_the_operator_reaches_the_api_server_dns_and_the_workers_metrics(
    default: list[Manifest],
) -> None:
    spec = policy(default)["spec"]
    api, dns, workers = spec["egress"]
    assert api == {"ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}]}
    assert dns == {"ports": DNS}
    assert workers["ports"] == [{"protocol": "TCP", "port": OperatorSettings().metrics_port}]
    (peer,) = workers["to"]
    assert peer["namespaceSelector"] == {}
    (expression,) = peer["podSelector"]["matchExpressions"]
    assert expression == {"key": LABEL_JOB, "operator": "Exists"}
    assert LABEL_JOB in a_worker_pod()["metadata"]["labels"]


def test_watching_one_namespace_reaches_workers_there_only(helm: Path, tmp_path: Path) -> None:
    spec = policy(render(helm, tmp_path, {"watchNamespace": "team-a"}))["spec"]
    (peer,) = egress_to_workers(spec)["to"]
    assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "team-a"}}


def test_api_server_addresses_and_ports_follow_the_values(helm: Path, tmp_path: Path) -> None:
    operator = {"apiServerPorts": [443], "apiServerCIDRs": ["10.0.0.1/32", "fd00::1/128"]}
    values = {"networkPolicy": {"operator": operator}, "metrics": {"enabled": False}}
    spec = policy(render(helm, tmp_path, values))["spec"]
    assert spec["egress"][0] == {
        "ports": [{"protocol": "TCP", "port": 443}],
        "to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}, {"ipBlock": {"cidr": "fd00::1/128"}}],
    }
    assert spec["ingress"] == [{"ports": [{"protocol": "TCP", "port": 8081}]}]  # health only


@pytest.mark.parametrize(
    "values",
    [{"networkPolicy": {"enabled": False}}, {"networkPolicy": {"operator": {"enabled": False}}}],
)
def test_no_operator_policy_when_switched_off(
    helm: Path, tmp_path: Path, values: dict[str, Any]
) -> None:
    assert not [m for m in render(helm, tmp_path, values) if m["kind"] == "NetworkPolicy"]


@pytest.mark.parametrize(
    ("operator", "named"),
    [
        ({"apiServerPorts": [0]}, "apiServerPorts"),
        ({"apiServerPorts": []}, "apiServerPorts"),
        ({"apiServerCIDRs": ["10.0.0.1"]}, "apiServerCIDRs"),
        ({"egress": "open"}, "egress"),
    ],
)
def test_bad_values_are_refused_naming_the_value(
    helm: Path, tmp_path: Path, operator: dict[str, Any], named: str
) -> None:
    with pytest.raises(HelmError, match=named):
        render(helm, tmp_path, {"networkPolicy": {"operator": operator}})
