"""Install Elastra the way a user does, and check what the API server then holds.

Why: the e2e suite and `make demo` share one install path (namespaces that enforce Pod
Security "restricted", a checkpoint volume, `helm install`), and the suite judges the result
against the API server itself: the RBAC it stores equals the reviewed golden list, nothing was
denied admission, and `helm uninstall` leaves no object of the release behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from e2e.kube import Kubectl, KubeError, wait_for
from e2e.target import SharedFolder

from elastra.controller.decide.manifests import WORKER_UID

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "helm" / "elastra"
EXAMPLE = REPO / "examples" / "cpu-tiny.yaml"
GOLDEN_RBAC = REPO / "tests" / "unit" / "golden" / "operator-rbac.yaml"
OPERATOR_IMAGE = "elastra.local/elastra-operator"
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
    "pod-security.kubernetes.io/warn": "restricted",
    "pod-security.kubernetes.io/audit": "restricted",
}
# Everything a release could leave behind, namespaced kinds then cluster-scoped ones.
NAMESPACED_KINDS = (
    "deployments,replicasets,pods,services,endpoints,serviceaccounts,configmaps,"
    "roles,rolebindings,leases,kopfpeerings,networkpolicies,secrets"
)
CLUSTER_KINDS = "clusterroles,clusterrolebindings,clusterkopfpeerings"


@dataclass(frozen=True)
class Setup:
    """Where Elastra and the job live in this run."""

    release: str = "elastra"
    operator_namespace: str = "elastra-system"
    job_namespace: str = "elastra-e2e"
    claim: str = "cpu-tiny-checkpoints"
    volume: SharedFolder | None = None
    """The checkpoint folder (a static hostPath volume, Target.volume); None: the cluster's
    default StorageClass provides the claim."""

    @property
    def operator(self) -> str:
        """The operator's "namespace/deployment" (the chart names it after the release)."""
        return f"{self.operator_namespace}/{self.release}"

    @property
    def volume_name(self) -> str:
        return f"{self.job_namespace}-{self.claim}"


def restricted_namespace(kube: Kubectl, name: str) -> None:
    """Create (or relabel) a namespace that enforces Pod Security "restricted"."""
    kube.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": RESTRICTED}}
    )


def checkpoint_storage(kube: Kubectl, setup: Setup) -> None:
    """The claim every worker of cpu-tiny mounts (ReadWriteMany on one node).

    Pod Security "restricted" forbids hostPath volumes in pods, but not a claim bound to a
    hostPath PersistentVolume that an administrator (here: this setup) made; the directory
    must belong to the worker's uid because fsGroup does not apply to hostPath.
    """
    claim: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": setup.claim, "namespace": setup.job_namespace},
        "spec": {"resources": {"requests": {"storage": "1Gi"}}},
    }
    if setup.volume is None:
        claim["spec"]["accessModes"] = ["ReadWriteOnce"]  # one node: every worker mounts it
        kube.apply(claim)
        return
    fresh_folder(setup.volume.host)
    claim["spec"] |= {
        "accessModes": ["ReadWriteMany"],
        "storageClassName": "elastra-e2e-static",
        "volumeName": setup.volume_name,
    }
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": setup.volume_name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "elastra-e2e-static",
            "claimRef": {"namespace": setup.job_namespace, "name": setup.claim},
            "hostPath": {"path": str(setup.volume.node), "type": "Directory"},
        },
    }
    kube.apply([volume, claim])


def remove_checkpoint_storage(kube: Kubectl, setup: Setup) -> None:
    """Undo checkpoint_storage: the claim, its static volume and the folder (best effort)."""
    for args in (
        ("delete", "pvc", setup.claim, "-n", setup.job_namespace, "--ignore-not-found"),
        ("delete", "pv", setup.volume_name, "--ignore-not-found"),
    ):
        with contextlib.suppress(KubeError):
            kube.kubectl(*args)
    if setup.volume is not None:
        shutil.rmtree(setup.volume.host, ignore_errors=True)


def fresh_folder(path: Path) -> None:
    """An empty folder the worker's user owns: a fresh run starts from no checkpoint."""
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    os.chown(path, WORKER_UID, WORKER_UID)


def helm_install(kube: Kubectl, setup: Setup, *extra: str) -> str:
    """`helm install` the chart with the local operator image; waits for the Deployment.

    Returns helm's stderr: the API server's warnings (a namespace labelled ``warn:
    restricted`` answers with "would violate PodSecurity" there) for the caller to judge.
    """
    return kube.helm_run(
        "install", setup.release, str(CHART),
        f"--namespace={setup.operator_namespace}",
        f"--set=image.repository={OPERATOR_IMAGE}", "--set=image.tag=dev",
        "--set=image.pullPolicy=Never", "--set=logFormat=plain",
        *extra, "--wait", "--timeout=5m",
    ).stderr  # fmt: skip


def leftovers(kube: Kubectl, setup: Setup) -> list[str]:
    """Objects of the release, by its instance label or the names the operator gives them."""
    selector = f"app.kubernetes.io/instance={setup.release}"
    found = kube.kubectl("get", NAMESPACED_KINDS, "-A", "-l", selector, "-o", "name").split()
    found += kube.kubectl("get", CLUSTER_KINDS, "-l", selector, "-o", "name").split()
    # The operator's Lease is made by the operator, not by Helm: look for it by name.
    lease = kube.kubectl(
        "get", "lease", "elastra-operator", "-n", setup.operator_namespace,
        "-o", "name", "--ignore-not-found",
    ).split()  # fmt: skip
    return sorted(set(found + lease))


def helm_uninstall(kube: Kubectl, setup: Setup) -> None:
    kube.helm("uninstall", setup.release, f"--namespace={setup.operator_namespace}", "--wait")


def wait_nothing_left(kube: Kubectl, setup: Setup, timeout: float = 120) -> None:
    wait_for(
        f"nothing left of release {setup.release}",
        lambda: leftovers(kube, setup) == [],
        timeout=timeout,
        interval=1,
        hint=lambda: " ".join(leftovers(kube, setup)),
    )


Rule = tuple[str, str, str, str]  # (apiGroup, resource, resourceName or "", verb)


def expand_rules(rules: Iterable[dict[str, Any]]) -> set[Rule]:
    """RBAC rules as the set of single permissions they grant (order and grouping ignored)."""
    out: set[Rule] = set()
    for rule in rules:
        for group in rule.get("apiGroups") or [""]:
            for resource in rule.get("resources") or []:
                for name in rule.get("resourceNames") or [""]:
                    for verb in rule.get("verbs") or []:
                        out.add((group, resource, name, verb))
    return out


def rbac_against_golden(kube: Kubectl, setup: Setup) -> dict[str, tuple[set[Rule], set[Rule]]]:
    """Per role, (granted but not golden, golden but not granted), read from the API server.

    The golden list names the peering object "elastra": the release's full name.
    """
    golden = yaml.safe_load(GOLDEN_RBAC.read_text())
    fullname = setup.release if setup.release.startswith("elastra") else f"{setup.release}-elastra"

    def named(rules: Iterable[dict[str, Any]]) -> set[Rule]:
        return {(g, r, fullname if n == "elastra" else n, v) for g, r, n, v in expand_rules(rules)}

    cluster_role = kube.get("clusterrole", fullname)
    lease_role = kube.get("role", f"{fullname}-lease", "-n", setup.operator_namespace)
    diffs = {}
    for what, held, want in (
        ("ClusterRole", cluster_role, golden["clusterRole"]),
        ("Role (lease)", lease_role, golden["leaseRole"]),
    ):
        granted, expected = expand_rules(held.get("rules") or []), named(want)
        diffs[what] = (granted - expected, expected - granted)
    return diffs


DENIAL_WORDS = ("forbidden", "violates podsecurity", "would violate", "denied")


def denials(text: str) -> list[str]:
    """Lines of a log or of helm's warnings that say the API server refused something."""
    return [line for line in text.splitlines() if any(w in line.lower() for w in DENIAL_WORDS)]


def denied_events(kube: Kubectl, namespaces: Iterable[str]) -> list[str]:
    """Warnings that mean the API server or a controller refused something we asked for."""
    refused = (*DENIAL_WORDS, "failedcreate")
    found = []
    for ns in namespaces:
        for event in kube.items("events", "-n", ns, "--field-selector=type=Warning"):
            text = f"{event.get('reason', '')} {event.get('message', '')}"
            if any(word in text.lower() for word in refused):
                obj = event.get("involvedObject") or {}
                found.append(f"{ns}/{obj.get('kind')}/{obj.get('name')}: {text}")
    return found
