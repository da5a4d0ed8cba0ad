"""The Helm chart: it lints, renders, grants exactly the reviewed permissions, runs the operator
under Pod Security "restricted", rejects bad values with a clear message, and ships the CRD
that `elastra crds` generates.

Why: the chart is how users install Elastra, and its RBAC is what they have to trust. Helm
comes from the toolchain that `make test` builds (a warm cache answers in well under a second),
so these checks never skip; `helm template` renders without a cluster.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e.cluster.controlplane import toolchain_bindir

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "elastra"
GOLDEN_RBAC = Path(__file__).parent / "golden" / "operator-rbac.yaml"
RELEASE = "elastra"
NAMESPACE = "elastra-system"

Manifest = dict[str, Any]


@pytest.fixture(scope="module")
def helm() -> Path:
    return toolchain_bindir(build=True) / "helm"


def _helm(helm: Path, *args: str, values: dict[str, Any] | None, tmp: Path) -> str:
    """Run helm on the chart with ``values`` as a values file; raise with stderr on failure."""
    cmd = [str(helm), *args]
    if values is not None:
        values_file = tmp / "values.yaml"
        values_file.write_text(yaml.safe_dump(values))
        cmd += ["--values", str(values_file)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise HelmError(out.stderr.strip() or out.stdout.strip())
    return out.stdout


class HelmError(Exception):
    """helm exited non-zero; the message is its output."""


def render(helm: Path, tmp: Path, values: dict[str, Any] | None = None) -> list[Manifest]:
    """`helm template` of the chart (CRDs excluded, as `helm install` applies them apart)."""
    text = _helm(
        helm,
        "template",
        RELEASE,
        str(CHART),
        f"--namespace={NAMESPACE}",
        values=values,
        tmp=tmp,
    )
    return [doc for doc in yaml.safe_load_all(text) if doc]


def one(manifests: Iterable[Manifest], kind: str, name_suffix: str = "") -> Manifest:
    """The only object of ``kind`` (whose name ends with ``name_suffix``)."""
    (found,) = [
        m for m in manifests if m["kind"] == kind and m["metadata"]["name"].endswith(name_suffix)
    ]
    return found


def golden() -> dict[str, list[Manifest]]:
    """The reviewed rules: ``clusterRole`` and ``leaseRole`` (release namespace)."""
    found: dict[str, list[Manifest]] = yaml.safe_load(GOLDEN_RBAC.read_text())
    return found


@pytest.fixture(scope="module")
def default(helm: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Manifest]:
    return render(helm, tmp_path_factory.mktemp("default"))


@pytest.fixture(scope="module")
def namespaced(helm: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Manifest]:
    values = {
        "watchNamespace": "team-a",
        "workerTolerations": [
            {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"},
            {"key": "elastra.dev/training"},
        ],
    }
    return render(helm, tmp_path_factory.mktemp("namespaced"), values)


@pytest.fixture(scope="module")
def bare(helm: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Manifest]:
    """Peering and metrics off."""
    values = {"peering": {"enabled": False}, "metrics": {"enabled": False}}
    return render(helm, tmp_path_factory.mktemp("bare"), values)


def canonical(rules: Iterable[Manifest]) -> list[tuple[tuple[str, ...], ...]]:
    """Rules as sorted tuples, so that key and list order do not matter."""
    keys = ("apiGroups", "resources", "resourceNames", "nonResourceURLs", "verbs")
    return sorted(tuple(tuple(sorted(rule.get(k) or [])) for k in keys) for rule in rules)


def roles(*renders: list[Manifest]) -> list[Manifest]:
    return [m for r in renders for m in r if m["kind"] in ("ClusterRole", "Role")]


def container(deployment: Manifest) -> Manifest:
    (found,) = deployment["spec"]["template"]["spec"]["containers"]
    return found  # type: ignore[no-any-return]


# --- lint and render ------------------------------------------------------------------------


def test_helm_lint_strict(helm: Path, tmp_path: Path) -> None:
    out = _helm(helm, "lint", "--strict", str(CHART), values=None, tmp=tmp_path)
    assert "0 chart(s) failed" in out
    _helm(helm, "lint", "--strict", str(CHART), values={"watchNamespace": "ns"}, tmp=tmp_path)


def test_default_render_holds_the_operator_and_its_rbac(default: list[Manifest]) -> None:
    kinds = sorted(m["kind"] for m in default)
    assert kinds == sorted(
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "Service",
            "Deployment",
            "ClusterKopfPeering",
            "Lease",
        ]
    )
    namespaced_kinds = {"ServiceAccount", "Service", "Deployment", "Role", "RoleBinding"}
    for m in default:
        if m["kind"] in namespaced_kinds:
            assert m["metadata"]["namespace"] == NAMESPACE, m["kind"]
    binding = one(default, "ClusterRoleBinding")
    account = one(default, "ServiceAccount")["metadata"]["name"]
    assert binding["roleRef"]["name"] == one(default, "ClusterRole")["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
    ]
    lease_binding = one(default, "RoleBinding")
    assert lease_binding["roleRef"]["name"] == one(default, "Role")["metadata"]["name"]
    assert lease_binding["subjects"] == binding["subjects"]
    spec = one(default, "Deployment")["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == account


# --- RBAC -----------------------------------------------------------------------------------


def test_rbac_has_no_wildcards(
    default: list[Manifest], namespaced: list[Manifest], bare: list[Manifest]
) -> None:
    for role in roles(default, namespaced, bare):
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "resourceNames", "verbs"):
                assert all("*" not in item for item in rule.get(key) or []), (key, rule)
            assert "nonResourceURLs" not in rule, rule


def test_rbac_grants_no_secrets_exec_or_node_writes(
    default: list[Manifest], namespaced: list[Manifest], bare: list[Manifest]
) -> None:
    read_only = {"get", "list", "watch"}
    for role in roles(default, namespaced, bare):
        for rule in role["rules"]:
            resources = set(rule["resources"])
            verbs = set(rule["verbs"])
            assert "secrets" not in resources, rule
            assert not resources & {"pods/exec", "pods/attach", "pods/portforward"}, rule
            assert not {r for r in resources if r.startswith("nodes")} or verbs <= read_only, rule
            assert not verbs & {"escalate", "bind", "impersonate", "deletecollection"}, rule
            assert not resources & {"roles", "clusterroles", "rolebindings"}, rule


def test_rbac_equals_the_reviewed_golden_list(default: list[Manifest]) -> None:
    hint = (
        "differs from tests/unit/golden/operator-rbac.yaml: review why the operator needs "
        "the change, then update the golden list"
    )
    rendered = one(default, "ClusterRole")["rules"]
    assert canonical(rendered) == canonical(golden()["clusterRole"]), f"ClusterRole {hint}"
    lease_role = one(default, "Role", "-lease")
    assert lease_role["metadata"]["namespace"] == NAMESPACE
    assert canonical(lease_role["rules"]) == canonical(golden()["leaseRole"]), f"Role {hint}"


def test_namespaced_operator_gets_namespace_watch_and_a_namespaced_peering(
    namespaced: list[Manifest],
) -> None:
    cluster_wide = [
        r for r in golden()["clusterRole"] if "clusterkopfpeerings" not in r["resources"]
    ]
    watch_namespaces = {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]}
    assert canonical(one(namespaced, "ClusterRole")["rules"]) == canonical(
        [*cluster_wide, watch_namespaces]
    )
    role = one(namespaced, "Role", "-peering")
    assert role["metadata"]["namespace"] == "team-a"
    assert canonical(role["rules"]) == canonical(
        [
            {"apiGroups": ["kopf.dev"], "resources": ["kopfpeerings"], "verbs": ["list", "watch"]},
            {
                "apiGroups": ["kopf.dev"],
                "resources": ["kopfpeerings"],
                "resourceNames": [RELEASE],
                "verbs": ["patch"],
            },
        ]
    )
    binding = one(namespaced, "RoleBinding", "-peering")
    assert binding["metadata"]["namespace"] == "team-a"
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    peering = one(namespaced, "KopfPeering")
    assert peering["metadata"] == {**peering["metadata"], "name": RELEASE, "namespace": "team-a"}
    assert not [m for m in namespaced if m["kind"] == "ClusterKopfPeering"]


def test_without_peering_there_is_no_peering_permission_or_object(bare: list[Manifest]) -> None:
    assert not [m for m in bare if m["kind"] in ("ClusterKopfPeering", "KopfPeering")]
    assert [m["metadata"]["name"] for m in roles(bare)] == [f"{RELEASE}", f"{RELEASE}-lease"]
    rules = one(bare, "ClusterRole")["rules"]
    assert not [r for r in rules if "kopf.dev" in r["apiGroups"]]
    args = container(one(bare, "Deployment"))["args"]
    assert not [a for a in args if a.startswith(("--peering", "--priority"))]


# --- the operator Deployment ----------------------------------------------------------------


def test_deployment_runs_one_operator_with_probes_and_resources(default: list[Manifest]) -> None:
    deployment = one(default, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    c = container(deployment)
    assert c["image"] == "elastra.local/elastra-operator:dev"
    assert c["imagePullPolicy"] == "IfNotPresent"
    assert c["command"] == ["elastra", "run"]
    assert c["args"] == [
        "--log-format=json",
        "--metrics-port=8080",
        "--health-port=8081",
        "--grace-seconds=120",
        f"--peering={RELEASE}",
        "--priority=100",
    ]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"metrics": 8080, "health": 8081}
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "health"}, probe
    assert set(c["resources"]["requests"]) == {"cpu", "memory"}
    assert "memory" in c["resources"]["limits"]
    peering = one(default, "ClusterKopfPeering")
    assert peering["apiVersion"] == "kopf.dev/v1"
    assert peering["metadata"]["name"] == RELEASE


def test_metrics_service_selects_the_operator_pod(default: list[Manifest]) -> None:
    service = one(default, "Service")
    pod_labels = one(default, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}
    ]


def test_metrics_off_means_no_service_and_port_zero(bare: list[Manifest]) -> None:
    assert not [m for m in bare if m["kind"] == "Service"]
    assert "--metrics-port=0" in container(one(bare, "Deployment"))["args"]


def test_values_reach_the_operator_flags(namespaced: list[Manifest]) -> None:
    args = container(one(namespaced, "Deployment"))["args"]
    assert "--namespace=team-a" in args
    assert [a for a in args if a.startswith("--toleration")] == [
        "--toleration=kwok.x-k8s.io/node=fake:NoSchedule",
        "--toleration=elastra.dev/training",
    ]


RESTRICTED_VOLUME_TYPES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def restricted_violations(pod: Manifest) -> list[str]:
    """What the Pod Security "restricted" profile (latest) would reject in a pod spec."""
    problems = []
    psc = pod.get("securityContext") or {}
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(host):
            problems.append(f"{host} is set")
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUME_TYPES:
            problems.append(f"volume {volume['name']} is {kinds}")
    containers = [*(pod.get("initContainers") or []), *pod["containers"]]
    for c in containers:
        sc = c.get("securityContext") or {}
        name = c["name"]
        if sc.get("privileged"):
            problems.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation is not false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            problems.append(f"{name}: capabilities do not drop ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            problems.append(f"{name}: adds capabilities {caps['add']}")
        if sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is not True:
            problems.append(f"{name}: runAsNonRoot is not true")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            problems.append(f"{name}: runs as user 0")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: seccompProfile is {seccomp}")
        if any(p.get("hostPort") for p in c.get("ports") or []):
            problems.append(f"{name}: uses a hostPort")
    return problems


def test_operator_pod_passes_pod_security_restricted(
    default: list[Manifest], namespaced: list[Manifest]
) -> None:
    for manifests in (default, namespaced):
        pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
        assert restricted_violations(pod) == []
        sc = container(one(manifests, "Deployment"))["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert pod["securityContext"]["runAsUser"] != 0


def test_restricted_check_catches_a_root_pod() -> None:
    pod = {"hostNetwork": True, "containers": [{"name": "x", "securityContext": {"runAsUser": 0}}]}
    assert len(restricted_violations(pod)) == 6


# --- values.schema.json ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (
            {"image": {"pullPolicy": "Sometimes"}},
            ["/image/pullPolicy", "must be one of", "IfNotPresent"],
        ),
        ({"replicaCount": 2}, ["additional properties 'replicaCount' not allowed"]),
        (
            {"workerTolerations": [{"key": "gpu", "effect": "NoRun"}]},
            ["/workerTolerations/0/effect", "NoSchedule"],
        ),
        ({"peering": {"priority": "high"}}, ["/peering/priority", "want integer"]),
        ({"runAsUser": 0}, ["/runAsUser", "minimum"]),
        ({"watchNamespace": "Team_A"}, ["/watchNamespace", "does not match pattern"]),
        (
            {"resources": {"requests": {"memory": "lots"}}},
            ["/resources/requests/memory", "'lots' does not match"],
        ),
        (
            {"resources": {"requests": {"cpu": None}}},
            ["/resources/requests", "missing property 'cpu'"],
        ),
        ({"healthPort": 8080}, ["metrics.port and healthPort are both 8080"]),
    ],
    ids=[
        "pull-policy",
        "unknown-key",
        "toleration-effect",
        "priority-type",
        "root",
        "namespace",
        "quantity",
        "no-cpu-request",
        "port-clash",
    ],
)
def test_bad_values_fail_with_a_clear_message(
    helm: Path, tmp_path: Path, values: dict[str, Any], expected: list[str]
) -> None:
    with pytest.raises(HelmError) as failure:
        render(helm, tmp_path, values)
    message = str(failure.value)
    for fragment in expected:
        assert fragment in message, message


# --- CRDs -----------------------------------------------------------------------------------


def test_chart_ships_the_generated_crd() -> None:
    generated = ROOT / "crds" / "trainingjobs.elastra.dev.yaml"
    shipped = CHART / "crds" / generated.name
    assert shipped.read_bytes() == generated.read_bytes(), "run `make crds` and commit both"


def test_chart_ships_the_kopf_peering_crds() -> None:
    crds = {
        doc["spec"]["names"]["kind"]: doc
        for doc in yaml.safe_load_all((CHART / "crds" / "kopf-peering.yaml").read_text())
    }
    assert set(crds) == {"ClusterKopfPeering", "KopfPeering"}
    assert crds["ClusterKopfPeering"]["spec"]["scope"] == "Cluster"
    assert crds["KopfPeering"]["spec"]["scope"] == "Namespaced"
    for crd in crds.values():
        assert crd["spec"]["group"] == "kopf.dev"
        (version,) = crd["spec"]["versions"]
        assert (version["name"], version["served"], version["storage"]) == ("v1", True, True)
        assert "subresources" not in version  # Kopf patches status on the object itself
        status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
        assert status["x-kubernetes-preserve-unknown-fields"] is True
