"""`helm install` of the chart on the real control plane.

Why: the unit tests read the rendered chart; here the API server itself judges it. It admits
the operator pod into a namespace that enforces Pod Security "restricted", its authorizer
grants the operator's service account exactly the reviewed golden permissions (and denies
secrets, exec and node writes), an operator running with that service account's token does
its job without a single "forbidden", a namespace's `edit` users may run TrainingJobs and its
`view` users only read them (the chart's aggregated roles), and `helm uninstall` leaves
nothing behind. No image exists and no real node runs the operator pod, so the installed pod
stays Pending: the operator runs as a local process that logs in as the chart's service
account instead.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e.cluster.api import wait_for

from tests.integration.conftest import FAKE_NODE_TOLERATION, LocalCluster, fresh_namespace

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "elastra"
GOLDEN_RBAC = ROOT / "tests" / "unit" / "golden" / "operator-rbac.yaml"
LEASE = "elastra-operator"
# What `helm uninstall` must remove, by kind (cluster-scoped kinds are listed without -A).
RELEASE_KINDS = (
    "deployments,replicasets,pods,services,serviceaccounts,roles,rolebindings,kopfpeerings,"
    "networkpolicies,secrets",
    "clusterroles,clusterrolebindings,clusterkopfpeerings,priorityclasses",
)


@dataclass(frozen=True)
class Release:
    """One installed release: its name, namespace, the objects' full name, the SA."""

    name: str
    namespace: str

    @property
    def fullname(self) -> str:
        return f"{self.name}-elastra"

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.fullname}"


def helm(cluster: LocalCluster, *args: str) -> str:
    out = subprocess.run(
        [str(cluster.bindir / "helm"), f"--kubeconfig={cluster.kubeconfig}", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed: {out.stderr.strip()}")
    return out.stdout


def restricted_namespace(cluster: LocalCluster) -> contextlib.AbstractContextManager[str]:
    """A fresh namespace that enforces Pod Security "restricted" (latest)."""
    return _labelled(cluster, {"pod-security.kubernetes.io/enforce": "restricted"})


@contextlib.contextmanager
def _labelled(cluster: LocalCluster, labels: dict[str, str]) -> Iterator[str]:
    with fresh_namespace(cluster) as name:
        cluster.kubectl("label", "namespace", name, *(f"{k}={v}" for k, v in labels.items()))
        yield name


@contextlib.contextmanager
def installed(cluster: LocalCluster, namespace: str, *sets: str) -> Iterator[Release]:
    """`helm install` a release with a unique name; uninstalled afterwards if still there."""
    release = Release(name=f"it{uuid.uuid4().hex[:6]}", namespace=namespace)
    # The installed operator pod must never run (a real node may have the image): it would
    # reconcile other tests' jobs. It only has to be admitted.
    set_args = [f"--set={s}" for s in (*sets, "nodeSelector.elastra\\.dev/helm-test=never")]
    helm(cluster, "install", release.name, str(CHART), f"--namespace={namespace}", *set_args)
    try:
        yield release
    finally:
        names = helm(cluster, "list", f"--namespace={namespace}", "--short")
        if release.name in names.split():
            helm(cluster, "uninstall", release.name, f"--namespace={namespace}", "--wait")


def leftovers(cluster: LocalCluster, release: Release) -> list[str]:
    """Objects labelled with the release, in any namespace or cluster-wide."""
    selector = f"app.kubernetes.io/instance={release.name}"
    found = []
    for kinds, scope in zip(RELEASE_KINDS, (["-A"], []), strict=True):
        out = cluster.kubectl("get", kinds, *scope, "-l", selector, "-o", "name")
        found += out.stdout.split()
    return found


def access_reviews(
    cluster: LocalCluster, release: Release, attributes: list[dict[str, str]]
) -> list[bool]:
    """One SubjectAccessReview per attribute set, as the release's service account; allowed?"""
    groups = [
        "system:serviceaccounts",
        f"system:serviceaccounts:{release.namespace}",
        "system:authenticated",
    ]
    reviews = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {"user": release.user, "groups": groups, "resourceAttributes": attrs},
            }
            for attrs in attributes
        ],
    }
    out = cluster.kubectl("create", "-f", "-", "-o", "json", stdin=json.dumps(reviews)).stdout
    decoder, answers, pos = json.JSONDecoder(), [], 0
    while pos < len(out):
        if out[pos].isspace():
            pos += 1
            continue
        review, pos = decoder.raw_decode(out, pos)
        answers.append(bool(review["status"].get("allowed")))
    assert len(answers) == len(attributes)
    return answers


def golden_attributes(release: Release) -> list[dict[str, str]]:
    """Every (verb, resource, name) the golden list grants, for this release."""
    golden = yaml.safe_load(GOLDEN_RBAC.read_text())
    scoped = [(rule, "other-namespace") for rule in golden["clusterRole"]]
    scoped += [(rule, release.namespace) for rule in golden["leaseRole"]]
    attributes = []
    for rule, namespace in scoped:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                kind, _, sub = resource.partition("/")
                for verb in rule["verbs"]:
                    for listed in rule.get("resourceNames") or [""]:
                        # The peering object is named after the release ("elastra" there).
                        name = release.fullname if listed == "elastra" else listed
                        attrs = {"verb": verb, "group": group, "resource": kind}
                        attrs |= {"subresource": sub} if sub else {}
                        attrs |= {"name": name} if name else {}
                        attrs |= {"namespace": namespace}
                        attributes.append(attrs)
    return attributes


DENIED = [
    {"verb": "get", "resource": "secrets", "namespace": "kube-system"},
    {"verb": "list", "resource": "secrets"},
    {"verb": "create", "resource": "secrets", "namespace": "default"},
    {"verb": "create", "resource": "pods", "subresource": "exec", "namespace": "default"},
    {"verb": "get", "resource": "pods", "subresource": "log", "namespace": "default"},
    {"verb": "update", "resource": "pods", "namespace": "default"},
    {"verb": "patch", "resource": "nodes"},
    {"verb": "delete", "resource": "nodes"},
    {"verb": "update", "resource": "nodes", "subresource": "status"},
    {"verb": "update", "group": "elastra.dev", "resource": "trainingjobs"},
    {"verb": "patch", "group": "elastra.dev", "resource": "trainingjobs", "subresource": "scale"},
    {"verb": "get", "resource": "configmaps", "namespace": "default"},
    {"verb": "delete", "resource": "services", "namespace": "default"},
    {"verb": "create", "group": "rbac.authorization.k8s.io", "resource": "clusterroles"},
    {"verb": "impersonate", "resource": "serviceaccounts"},
    {"verb": "create", "group": "apiextensions.k8s.io", "resource": "customresourcedefinitions"},
    {"verb": "patch", "group": "kopf.dev", "resource": "clusterkopfpeerings", "name": "other"},
    {
        "verb": "update",
        "group": "coordination.k8s.io",
        "resource": "leases",
        "name": "other",
        "namespace": "kube-system",
    },
]


@pytest.fixture(scope="module")
def release(cluster: LocalCluster) -> Iterator[Release]:
    """The chart with default values, in a namespace enforcing Pod Security "restricted"."""
    with restricted_namespace(cluster) as namespace, installed(cluster, namespace) as found:
        yield found


def test_install_creates_the_operator_its_rbac_and_crds(
    cluster: LocalCluster, release: Release
) -> None:
    ns = ["-n", release.namespace]
    deployment = cluster.get("deployment", release.fullname, *ns)
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    cluster.get("serviceaccount", release.fullname, *ns)
    cluster.get("service", f"{release.fullname}-metrics", *ns)
    cluster.get("role,rolebinding", f"{release.fullname}-lease", *ns)
    cluster.get("clusterrole,clusterrolebinding", release.fullname)
    cluster.get("networkpolicy", release.fullname, *ns)  # the operator pod's own
    cluster.get("clusterrole", f"{release.fullname}-edit", f"{release.fullname}-view")
    cluster.get("clusterkopfpeering", release.fullname)
    for crd in (
        "trainingjobs.elastra.dev",
        "clusterkopfpeerings.kopf.dev",
        "kopfpeerings.kopf.dev",
    ):
        cluster.get("crd", crd)


def test_operator_pod_is_admitted_under_pod_security_restricted(
    cluster: LocalCluster, release: Release
) -> None:
    selector = f"app.kubernetes.io/instance={release.name}"

    def pod() -> str | None:
        pods = cluster.get("pods", "-n", release.namespace, "-l", selector)["items"]
        return pods[0]["metadata"]["name"] if pods else None

    def why() -> str:
        return cluster.kubectl(
            "get", "events", "-n", release.namespace, "--field-selector=type=Warning"
        ).stdout

    wait_for("the operator pod to be created", pod, timeout=60, interval=0.5, hint=why)


def test_service_account_holds_exactly_the_golden_permissions(
    cluster: LocalCluster, release: Release
) -> None:
    granted = golden_attributes(release)
    allowed = access_reviews(cluster, release, granted + DENIED)
    missing = [a for a, ok in zip(granted, allowed, strict=False) if not ok]
    extra = [a for a, ok in zip(DENIED, allowed[len(granted) :], strict=True) if ok]
    assert missing == [], "golden permissions not granted"
    assert extra == [], "permissions granted beyond the golden list"
    can_i = cluster.kubectl(
        "auth", "can-i", "get", "secrets", "-A", f"--as={release.user}", check=False
    )
    assert can_i.stdout.strip() == "no"


# What a person bound to a built-in role in a namespace may do with TrainingJobs there, once
# the controller manager has aggregated the chart's <fullname>-edit and -view into it:
# {role: {(verb, subresource): allowed}}.
USER_ACCESS = {
    "edit": {
        ("create", ""): True,
        ("update", ""): True,
        ("delete", ""): True,
        ("patch", "scale"): True,
        ("get", "status"): True,
        ("update", "status"): False,  # the operator's alone
    },
    "view": {
        ("get", ""): True,
        ("list", ""): True,
        ("watch", ""): True,
        ("get", "scale"): True,
        ("create", ""): False,
        ("delete", ""): False,
        ("patch", "scale"): False,
    },
}


def can_i(cluster: LocalCluster, user: str, namespace: str, verb: str, subresource: str) -> bool:
    """`kubectl auth can-i` on trainingjobs as ``user``: the API server's authorizer answers."""
    sub = [f"--subresource={subresource}"] if subresource else []
    out = cluster.kubectl(
        "auth", "can-i", verb, "trainingjobs.elastra.dev", *sub,
        f"--namespace={namespace}", f"--as={user}", check=False,
    )  # fmt: skip
    return out.stdout.strip() == "yes"


def test_namespace_editors_run_trainingjobs_and_viewers_read_them(
    cluster: LocalCluster, release: Release
) -> None:
    """The chart's user roles reach the built-in edit/view roles through aggregation."""
    with fresh_namespace(cluster) as namespace:
        users = {role: f"{role}-user-{namespace}" for role in USER_ACCESS}
        for role, user in users.items():
            cluster.kubectl(
                "create", "rolebinding", f"{role}-user", f"--clusterrole={role}",
                f"--user={user}", f"--namespace={namespace}",
            )  # fmt: skip
        for role, user in users.items():
            first = next(a for a, allowed in USER_ACCESS[role].items() if allowed)
            wait_for(
                f"{role} to be aggregated with TrainingJobs",
                lambda user=user, first=first: can_i(cluster, user, namespace, *first),
                timeout=60,
                interval=0.5,
            )
        answers = {
            (role, verb, sub): can_i(cluster, users[role], namespace, verb, sub)
            for role, access in USER_ACCESS.items()
            for verb, sub in access
        }
        expected = {
            (role, verb, sub): allowed
            for role, access in USER_ACCESS.items()
            for (verb, sub), allowed in access.items()
        }
        assert answers == expected
        elsewhere = f"{namespace}-other"  # a RoleBinding grants its own namespace only
        assert not can_i(cluster, users["edit"], elsewhere, "create", "")


def sa_kubeconfig(cluster: LocalCluster, release: Release, path: Path) -> Path:
    """A kubeconfig that logs in with a token of the release's service account."""
    token = cluster.kubectl(
        "create", "token", release.fullname, "-n", release.namespace, "--duration=10m"
    ).stdout.strip()
    view = yaml.safe_load(cluster.kubectl("config", "view", "--minify", "--raw").stdout)
    server = view["clusters"][0]["cluster"]
    ca = path.parent / "ca.crt"
    if "certificate-authority-data" in server:
        ca.write_bytes(base64.b64decode(server["certificate-authority-data"]))
    else:
        ca.write_bytes(Path(server["certificate-authority"]).read_bytes())
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "c", "cluster": {"server": server["server"], "certificate-authority": str(ca)}}
        ],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa"}}],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def cpu_job(name: str) -> dict[str, Any]:
    """A small CPU TrainingJob for the fake nodes."""
    return {
        "apiVersion": "elastra.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "replicas": 2,
            "minReplicas": 1,
            "maxReplicas": 2,
            "worker": {
                "gpus": 0,
                "image": "elastra-worker:dev",
                "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}},
            },
            "training": {"globalBatchSize": 8},
            "checkpoint": {"uri": f"s3://elastra-test/{name}"},  # kwok pods never save
        },
    }


@pytest.mark.slow
def test_operator_works_with_the_chart_rbac_and_uninstall_leaves_nothing(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    with (
        restricted_namespace(cluster) as home,
        fresh_namespace(cluster) as jobs,
        installed(cluster, home, f"watchNamespace={jobs}") as rel,
    ):
        kubeconfig = sa_kubeconfig(cluster, rel, tmp_path / "sa.kubeconfig")
        toleration = "{key}={value}:{effect}".format(**FAKE_NODE_TOLERATION)
        log = tmp_path / "operator.log"
        command = [
            sys.executable, "-m", "elastra.cli", "run",
            f"--kubeconfig={kubeconfig}", f"--namespace={jobs}",
            f"--peering={rel.fullname}", "--priority=100",
            f"--toleration={toleration}", "--metrics-port=0", "--health-port=0",
            "--log-format=plain", "--resync-seconds=2", "--grace-seconds=0",
            "--settle-seconds=0", "--cooldown-seconds=0", "--retire-timeout-seconds=1",
            f"--capacity-request-priority-class={rel.fullname}-capacity-request",  # the chart's
        ]  # fmt: skip
        with log.open("w") as out:
            operator = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "POD_NAMESPACE": home, "PYTHONUNBUFFERED": "1"},
            )
        try:
            cluster.apply(cpu_job("rbac"), namespace=jobs)

            def workers() -> int:
                pods = cluster.get("pods", "-n", jobs, "-l", "elastra.dev/job=rbac")["items"]
                return len([p for p in pods if not p["metadata"].get("deletionTimestamp")])

            wait_for("2 workers", lambda: workers() == 2, timeout=60, interval=0.5,
                     hint=lambda: log.read_text()[-3000:])  # fmt: skip
            cluster.kubectl("scale", "trainingjob/rbac", "-n", jobs, "--replicas=1")
            wait_for("1 worker", lambda: workers() == 1, timeout=60, interval=0.5,
                     hint=lambda: log.read_text()[-3000:])  # fmt: skip
            cluster.get("service", "rbac", "-n", jobs)
            status = cluster.get("trainingjob", "rbac", "-n", jobs).get("status") or {}
            assert status.get("world", {}).get("size") == 1, status
            peers = cluster.get("kopfpeering", rel.fullname, "-n", jobs).get("status") or {}
            assert [p["priority"] for p in peers.values()] == [100], peers
        finally:
            operator.terminate()
            operator.wait(timeout=30)
        text = log.read_text()
        assert "forbidden" not in text.lower() and " 403" not in text, text
        helm(cluster, "uninstall", rel.name, f"--namespace={home}", "--wait")
        wait_for(
            "nothing left of the release",
            lambda: leftovers(cluster, rel) == [],
            timeout=60,
            interval=0.5,
            hint=lambda: " ".join(leftovers(cluster, rel)),
        )
