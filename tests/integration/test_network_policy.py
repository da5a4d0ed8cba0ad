"""Each job's NetworkPolicy, and the chart's namespaced RBAC, on the real control plane.

Why: the unit tests build the policy and render the roles; here the API server accepts the
policy the operator creates (schema, owner reference), the garbage collector deletes it with
its job, the operator creates it once and leaves it alone afterwards, and the authorizer
holds the chart's promise that an operator limited to one namespace writes pods only there.
The local cluster's network does not enforce policies (kwok pods have no network at all), so
whether traffic is really blocked is for the e2e suite on a CNI that enforces them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from e2e.cluster.api import wait_for

from tests.integration.conftest import LocalCluster, fresh_namespace
from tests.integration.operator.conftest import OperatorProcess
from tests.integration.test_helm_install import (
    Release,
    access_reviews,
    cpu_job,
    installed,
    restricted_namespace,
)

OPERATOR_NAMESPACE = "elastra-system"
OPERATOR_LABELS = "app.kubernetes.io/name=elastra,app.kubernetes.io/component=operator"
METRICS_PORT = 9400  # OperatorSettings.metrics_port


@pytest.fixture
def start_operator(
    cluster: LocalCluster, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., OperatorProcess]]:
    """Starts ``elastra run`` on ``namespace``, told where its own pods run (as the chart tells
    it), with more arguments; stopped (its log printed) at the end."""
    monkeypatch.setenv("POD_NAMESPACE", OPERATOR_NAMESPACE)
    started: list[OperatorProcess] = []

    def start(*extra: str) -> OperatorProcess:
        args = (f"--operator-pod-labels={OPERATOR_LABELS}", *extra)
        proc = OperatorProcess(cluster, namespace, extra_args=args)
        proc.start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()
        print("\n".join(["--- operator log (last 40 lines) ---", *proc.lines[-40:]]))


def live_pods(cluster: LocalCluster, namespace: str, job: str) -> list[dict[str, Any]]:
    pods = cluster.get("pods", "-n", namespace, "-l", f"elastra.dev/job={job}")["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def policies(cluster: LocalCluster, namespace: str) -> list[dict[str, Any]]:
    return list(cluster.get("networkpolicies", "-n", namespace)["items"])


def test_the_job_gets_one_policy_owned_by_it_and_kept_across_resizes(
    cluster: LocalCluster, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    start_operator()
    cluster.apply(cpu_job("np"), namespace=namespace)
    policy = wait_for(
        "the job's NetworkPolicy",
        lambda: next(iter(policies(cluster, namespace)), None),
        timeout=60,
        interval=0.5,
    )
    job = cluster.get("trainingjob", "np", "-n", namespace)
    assert policy["metadata"]["name"] == "np"
    assert policy["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "elastra.dev/v1alpha1",
            "kind": "TrainingJob",
            "name": "np",
            "uid": job["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    spec = policy["spec"]
    workers = {"matchLabels": {"elastra.dev/job": "np"}}
    assert spec["podSelector"] == workers
    assert spec["policyTypes"] == ["Ingress"]
    operator = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": OPERATOR_NAMESPACE}},
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/name": "elastra",
                "app.kubernetes.io/component": "operator",
            }
        },
    }
    assert spec["ingress"] == [
        {"from": [{"podSelector": workers}]},
        {"from": [operator], "ports": [{"protocol": "TCP", "port": METRICS_PORT}]},
    ]
    wait_for(
        "2 workers",
        lambda: len(live_pods(cluster, namespace, "np")) == 2,
        timeout=60,
        interval=0.5,
    )
    for pod in live_pods(cluster, namespace, "np"):
        assert workers["matchLabels"].items() <= pod["metadata"]["labels"].items()

    # A user's change stays: the operator creates the policy once and never rewrites it,
    # though every pass that creates pods (here: the replacement of a deleted one) ensures it.
    cluster.kubectl("label", "networkpolicy", "np", "-n", namespace, "example.com/reviewed=yes")
    (before,) = [p["metadata"] for p in policies(cluster, namespace)]
    uids = {p["metadata"]["uid"] for p in live_pods(cluster, namespace, "np")}
    cluster.kubectl("delete", "pod", "np-w1", "-n", namespace, "--wait=false")

    def replaced() -> bool:
        live = live_pods(cluster, namespace, "np")
        return len(live) == 2 and {p["metadata"]["uid"] for p in live} != uids

    wait_for("the deleted worker replaced", replaced, timeout=90, interval=0.5)
    (after,) = policies(cluster, namespace)
    assert after["metadata"]["uid"] == before["uid"]
    assert after["metadata"]["resourceVersion"] == before["resourceVersion"]
    assert after["metadata"]["labels"]["example.com/reviewed"] == "yes"

    cluster.kubectl("delete", "trainingjob", "np", "-n", namespace, "--wait=true", "--timeout=30s")
    wait_for(
        "the policy garbage-collected with its job",
        lambda: not policies(cluster, namespace),
        timeout=60,
        interval=0.5,
    )


def test_switched_off_the_operator_creates_no_policy(
    cluster: LocalCluster, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    start_operator("--no-network-policy")
    cluster.apply(cpu_job("open"), namespace=namespace)
    wait_for("2 workers", lambda: len(live_pods(cluster, namespace, "open")) == 2, timeout=60)
    cluster.get("service", "open", "-n", namespace)  # created in the same step as a policy
    assert policies(cluster, namespace) == []


def namespaced_attributes(watched: str, other: str) -> list[tuple[dict[str, str], bool]]:
    """(attributes, allowed) for an operator limited to ``watched``."""
    writes = [
        ("", "pods", "create"),
        ("", "pods", "patch"),
        ("", "pods", "delete"),
        ("", "services", "create"),
        ("networking.k8s.io", "networkpolicies", "create"),
    ]
    cases = []
    for group, resource, verb in writes:
        attrs = {"verb": verb, "group": group, "resource": resource}
        cases += [({**attrs, "namespace": watched}, True), ({**attrs, "namespace": other}, False)]
    cases += [
        ({"verb": "list", "resource": "pods"}, True),  # capacity: every namespace's pods
        ({"verb": "watch", "resource": "pods", "namespace": other}, True),
        ({"verb": "list", "resource": "nodes"}, True),
        ({"verb": "delete", "resource": "networkpolicies", "group": "networking.k8s.io",
          "namespace": watched}, False),
        ({"verb": "update", "resource": "pods", "namespace": watched}, False),
        ({"verb": "get", "resource": "secrets", "namespace": watched}, False),
        ({"verb": "create", "resource": "secrets", "namespace": watched}, False),
    ]  # fmt: skip
    return cases


def test_an_operator_limited_to_one_namespace_writes_pods_only_there(cluster: LocalCluster) -> None:
    with (
        restricted_namespace(cluster) as home,
        fresh_namespace(cluster) as watched,
        installed(cluster, home, f"watchNamespace={watched}") as release,
    ):
        cases = namespaced_attributes(watched, other="default")
        allowed = access_reviews(cluster, release, [attrs for attrs, _ in cases])
        wrong = [
            (attrs, expected)
            for (attrs, expected), got in zip(cases, allowed, strict=True)
            if got != expected
        ]
        assert wrong == [], "the API server's answers differ from the chart's promise"
        assert _can_i(cluster, release, "create", "pods", watched) == "yes"
        assert _can_i(cluster, release, "create", "pods", "kube-system") == "no"


def _can_i(
    cluster: LocalCluster, release: Release, verb: str, resource: str, namespace: str
) -> str:
    """`kubectl auth can-i` as the release's service account: yes or no."""
    out = cluster.kubectl(
        "auth", "can-i", verb, resource, "-n", namespace, f"--as={release.user}", check=False
    )
    return out.stdout.strip()
