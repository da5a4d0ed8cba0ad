"""The chart's RBAC in both modes, and what it passes the operator for the jobs' NetworkPolicies.

Why: with ``watchNamespace`` set, an operator that could still create, patch and delete pods in
every namespace would be one stolen token away from running anything anywhere. The writes in
the jobs' namespaces (pods, each job's Service and NetworkPolicy) move to a Role in the watched
namespace; the reads capacity needs (every Node, every Pod) stay cluster-wide. And the
NetworkPolicy lets the operator read its workers' metrics only if the labels the chart hands
the operator are the labels its pod carries: checked here through ``elastra run``'s own parser.
The chart's other two ClusterRoles are for people, not the operator: aggregated into the
built-in ``admin``/``edit`` and ``view`` roles, they let a namespace's editors run TrainingJobs
and its viewers read them (the API server's answer: tests/integration/test_helm_install.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
from e2e.cluster.controlplane import toolchain_bindir

from elastra.commands import run
from elastra.controller.settings import PodPeer
from elastra.errors import UserError
from tests.unit.test_helm_chart import (
    NAMESPACE,
    RELEASE,
    HelmError,
    Manifest,
    canonical,
    container,
    golden,
    one,
    render,
)

WATCHED = "team-a"
# What the operator writes in a job's namespace, as (apiGroup, resource, verb).
JOB_WRITES = {
    ("", "pods", "create"),
    ("", "pods", "patch"),
    ("", "pods", "delete"),
    ("", "services", "create"),
    ("networking.k8s.io", "networkpolicies", "create"),
}
CAPACITY_READS = {("", "pods", "list"), ("", "pods", "watch"), ("", "nodes", "list")}


@pytest.fixture(scope="module")
def helm() -> Path:
    return toolchain_bindir(build=True) / "helm"


@pytest.fixture(scope="module")
def everywhere(helm: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Manifest]:
    return render(helm, tmp_path_factory.mktemp("everywhere"))


@pytest.fixture(scope="module")
def watched(helm: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Manifest]:
    return render(helm, tmp_path_factory.mktemp("watched"), {"watchNamespace": WATCHED})


def grants(rules: list[Manifest]) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) for every rule that names no particular object."""
    return {
        (group, resource, verb)
        for rule in rules
        if not rule.get("resourceNames")
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def jobs_role(manifests: list[Manifest]) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == "Role" and m["metadata"]["name"].endswith("-jobs")]


def test_every_namespace_watched_the_cluster_role_holds_the_job_writes(
    everywhere: list[Manifest],
) -> None:
    assert grants(one(everywhere, "ClusterRole", RELEASE)["rules"]) >= JOB_WRITES | CAPACITY_READS
    assert jobs_role(everywhere) == []
    golden_writes = grants(golden()["jobNamespaceRole"])
    assert golden_writes == JOB_WRITES


def test_one_namespace_watched_the_writes_are_in_a_role_there(watched: list[Manifest]) -> None:
    cluster = grants(one(watched, "ClusterRole", RELEASE)["rules"])
    assert not cluster & JOB_WRITES, "pod writes granted cluster-wide with watchNamespace set"
    assert cluster >= CAPACITY_READS, "capacity reads must stay cluster-wide"
    (role,) = jobs_role(watched)
    assert role["metadata"]["namespace"] == WATCHED
    assert canonical(role["rules"]) == canonical(golden()["jobNamespaceRole"])
    binding = one(watched, "RoleBinding", "-jobs")
    assert binding["metadata"]["namespace"] == WATCHED
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    account = one(watched, "ServiceAccount")["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
    ]


def test_both_modes_grant_the_same_verbs_only_scoped_differently(
    everywhere: list[Manifest], watched: list[Manifest]
) -> None:
    """Nothing the operator needs is lost by watching one namespace. Kopf's peering objects
    differ (cluster-wide vs. in the namespace: test_helm_chart checks those)."""
    (role,) = jobs_role(watched)
    scoped = grants(one(watched, "ClusterRole", RELEASE)["rules"]) | grants(role["rules"])
    needed = {
        g for g in grants(one(everywhere, "ClusterRole", RELEASE)["rules"]) if g[0] != "kopf.dev"
    }
    assert needed <= scoped


@pytest.mark.parametrize("namespace", ["", WATCHED])
def test_network_policy_off_grants_no_network_policy_and_tells_the_operator(
    helm: Path, tmp_path: Path, namespace: str
) -> None:
    values = {"watchNamespace": namespace, "networkPolicy": {"enabled": False}}
    manifests = render(helm, tmp_path, values)
    rules = [r for m in manifests if m["kind"] in ("ClusterRole", "Role") for r in m["rules"]]
    assert not [r for r in rules if "networkpolicies" in r["resources"]]
    assert "--no-network-policy" in container(one(manifests, "Deployment"))["args"]


def operator_settings(
    deployment: Manifest, monkeypatch: pytest.MonkeyPatch
) -> tuple[argparse.Namespace, tuple[PodPeer, ...]]:
    """The chart's args and env for the operator container, read by ``elastra run``'s parser."""
    c = container(deployment)
    for env in c["env"]:
        if "value" in env:
            monkeypatch.setenv(env["name"], env["value"])
    args = parse_run(*c["args"])
    return args, run.metrics_peers(args, deployment["metadata"]["namespace"])


def test_the_operators_own_pod_is_let_in_to_the_metrics_port(
    everywhere: list[Manifest], monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment = one(everywhere, "Deployment")
    args, peers = operator_settings(deployment, monkeypatch)
    assert args.network_policy is True
    assert (args.worker_tmp_size, args.worker_cache_size) == ("1Gi", "20Gi")
    (own,) = peers
    assert own.namespace == NAMESPACE
    pod_labels: dict[str, Any] = deployment["spec"]["template"]["metadata"]["labels"]
    assert own.labels, "an empty selector would let in every pod of the namespace"
    assert dict(own.labels).items() <= pod_labels.items()
    assert dict(own.labels) == deployment["spec"]["selector"]["matchLabels"]


def test_metrics_from_tmp_and_cache_sizes_reach_the_operator(
    helm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = {
        "workerTmpSize": "4Gi",
        "workerCacheSize": "100Gi",
        "networkPolicy": {
            "metricsFrom": [
                {"namespace": "monitoring", "podLabels": {"app.kubernetes.io/name": "prometheus"}},
                {"namespace": "scrapers"},
            ]
        },
    }
    args, peers = operator_settings(one(render(helm, tmp_path, values), "Deployment"), monkeypatch)
    assert (args.worker_tmp_size, args.worker_cache_size) == ("4Gi", "100Gi")
    assert peers[1:] == (
        PodPeer(namespace="monitoring", labels=(("app.kubernetes.io/name", "prometheus"),)),
        PodPeer(namespace="scrapers"),
    )
    assert peers[0].namespace == NAMESPACE and dict(peers[0].labels)["app.kubernetes.io/instance"]


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"workerTmpSize": "1GB"}, "workerTmpSize"),
        ({"workerCacheSize": "0"}, "workerCacheSize"),
        ({"networkPolicy": {"metricsFrom": [{"podLabels": {"a": "b"}}]}}, "namespace"),
        ({"networkPolicy": {"enabled": "yes"}}, "enabled"),
    ],
)
def test_bad_values_are_refused_naming_the_value(
    helm: Path, tmp_path: Path, values: dict[str, Any], named: str
) -> None:
    with pytest.raises(HelmError, match=named):
        render(helm, tmp_path, values)


def test_release_name_reaches_the_operator_labels(everywhere: list[Manifest]) -> None:
    env = {e["name"]: e.get("value") for e in container(one(everywhere, "Deployment"))["env"]}
    assert f"app.kubernetes.io/instance={RELEASE}" in env["ELASTRA_OPERATOR_POD_LABELS"].split(",")


def parse_run(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    run.register(parser.add_subparsers())
    return parser.parse_args(["run", *argv])


@pytest.mark.parametrize(
    "flag",
    [
        "--worker-tmp-size=0",  # every write would evict the pod
        "--worker-tmp-size=1GB",
        "--worker-cache-size=0",  # every download would evict the pod
        "--metrics-peer=Monitoring",  # not a namespace name
        "--metrics-peer=monitoring/app",  # a label without a value
        "--metrics-peer=/app=prometheus",
    ],
)
def test_flags_a_hand_written_install_gets_wrong_are_refused(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse_run(flag)
    assert flag.split("=", 1)[0] in capsys.readouterr().err


def test_operator_labels_without_values_are_a_user_error() -> None:
    args = parse_run("--operator-pod-labels=app.kubernetes.io/name")
    with pytest.raises(UserError, match="--operator-pod-labels"):
        run.metrics_peers(args, NAMESPACE)


def test_outside_the_cluster_only_the_listed_peers_are_let_in() -> None:
    """No POD_NAMESPACE: the operator is no pod, so its labels name nothing."""
    args = parse_run("--operator-pod-labels=a=b", "--metrics-peer=monitoring")
    assert run.metrics_peers(args, None) == (PodPeer(namespace="monitoring"),)


# --- the ClusterRoles for the people who run jobs (rbac.userRoles) ---------------------------

AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"
USER_ROLE_RULES = {
    # Whoever may edit a namespace's Deployments may run TrainingJobs there: create, change,
    # scale (kubectl scale, an HPA) and delete them, and read their status; never write it.
    "edit": {
        ("elastra.dev", "trainingjobs", verb)
        for verb in ("create", "delete", "get", "list", "patch", "update", "watch")
    }
    | {("elastra.dev", "trainingjobs/scale", verb) for verb in ("get", "patch", "update")}
    | {("elastra.dev", "trainingjobs/status", "get")},
    "view": {
        ("elastra.dev", resource, verb)
        for resource in ("trainingjobs", "trainingjobs/scale", "trainingjobs/status")
        for verb in ("get", "list", "watch")
    },
}
AGGREGATED_INTO = {"edit": {"admin", "edit"}, "view": {"view"}}
"""The built-in user-facing ClusterRoles each one's rules are copied into."""


def user_roles(manifests: list[Manifest]) -> dict[str, Manifest]:
    """The aggregated ClusterRoles, by what they aggregate as (edit, view)."""
    found = {}
    for m in manifests:
        labels = m["metadata"].get("labels") or {}
        if m["kind"] == "ClusterRole" and any(k.startswith(AGGREGATE) for k in labels):
            found[m["metadata"]["name"].removeprefix(f"{RELEASE}-")] = m
    return found


@pytest.mark.parametrize("values", [{}, {"watchNamespace": WATCHED}, {"rbac": {"create": False}}])
def test_user_roles_grant_trainingjobs_and_aggregate_into_the_built_in_roles(
    helm: Path, tmp_path: Path, values: dict[str, Any]
) -> None:
    """The same two roles whatever the operator's own RBAC: they are for the users."""
    roles = user_roles(render(helm, tmp_path, values))
    assert set(roles) == set(USER_ROLE_RULES)
    for name, role in roles.items():
        assert grants(role["rules"]) == USER_ROLE_RULES[name], name
        assert not [r for r in role["rules"] if r.get("resourceNames")], name
        labels = role["metadata"]["labels"]
        into = {k.removeprefix(AGGREGATE) for k, v in labels.items() if k.startswith(AGGREGATE)}
        assert into == AGGREGATED_INTO[name], labels
        assert {labels[f"{AGGREGATE}{built_in}"] for built_in in into} == {"true"}
        assert labels["app.kubernetes.io/instance"] == RELEASE  # helm uninstall finds them
        assert "aggregationRule" not in role


def test_user_roles_can_be_left_out(helm: Path, tmp_path: Path) -> None:
    manifests = render(helm, tmp_path, {"rbac": {"userRoles": False}})
    assert user_roles(manifests) == {}
    assert one(manifests, "ClusterRole")["metadata"]["name"] == RELEASE  # the operator's stays


def test_user_roles_value_must_be_a_boolean(helm: Path, tmp_path: Path) -> None:
    with pytest.raises(HelmError, match="userRoles"):
        render(helm, tmp_path, {"rbac": {"userRoles": "yes"}})
