"""The Helm chart: it lints, renders, grants exactly the reviewed permissions, runs the operator
under Pod Security "restricted", rejects bad values with a clear message, and ships the CRD
that `elastra crds` generates.

Why: the chart is how users install Elastra, and its RBAC is what they have to trust. Helm
comes from the toolchain that `make test` builds (a warm cache answers in well under a second),
so these checks never skip; `helm template` renders without a cluster.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e.cluster.controlplane import toolchain_bindir
from prometheus_client.metrics import MetricWrapperBase

from elastra.api import parse_trainingjob
from elastra.api.podtemplate import WORKER_CONTAINER
from elastra.controller.decide.manifests import LABEL_JOB, worker_pod
from elastra.controller.engine import metrics as operator_metrics
from elastra.controller.settings import OperatorSettings
from elastra.elastic.share import Scope
from elastra.kube import client as kube_client
from elastra_worker.metrics import DEFAULT_METRICS_PORT, WorkerCollector
from tests.cases.specs import base_manifest

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "elastra"
GOLDEN_RBAC = Path(__file__).parent / "golden" / "operator-rbac.yaml"
RELEASE = "elastra"
NAMESPACE = "elastra-system"
USER_ROLES = (f"{RELEASE}-edit", f"{RELEASE}-view")
"""The ClusterRoles for the people who run jobs (rbac.userRoles), beside the operator's."""

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


def render(
    helm: Path,
    tmp: Path,
    values: dict[str, Any] | None = None,
    *,
    api_versions: Iterable[str] = (),
) -> list[Manifest]:
    """`helm template` of the chart (CRDs excluded, as `helm install` applies them apart);
    ``api_versions``: what the cluster is to serve beyond the built-in kinds."""
    text = _helm(
        helm,
        "template",
        RELEASE,
        str(CHART),
        f"--namespace={NAMESPACE}",
        *(f"--api-versions={v}" for v in api_versions),
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
            "ClusterRole",  # -edit, aggregated (tests/unit/test_helm_rbac.py)
            "ClusterRole",  # -view
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "Service",
            "Deployment",
            "ClusterKopfPeering",
            "Lease",
            "Secret",  # the key of pushed assignments (templates/assignment-key.yaml)
            "NetworkPolicy",
            "PriorityClass",  # of capacity-request pods (templates/priorityclass.yaml)
        ]
    )
    namespaced_kinds = {
        "ServiceAccount",
        "Service",
        "Deployment",
        "Role",
        "RoleBinding",
        "NetworkPolicy",
    }
    for m in default:
        if m["kind"] in namespaced_kinds:
            assert m["metadata"]["namespace"] == NAMESPACE, m["kind"]
    binding = one(default, "ClusterRoleBinding")
    account = one(default, "ServiceAccount")["metadata"]["name"]
    assert binding["roleRef"]["name"] == one(default, "ClusterRole", RELEASE)["metadata"]["name"]
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
    rendered = one(default, "ClusterRole", RELEASE)["rules"]
    assert canonical(rendered) == canonical(golden()["clusterRole"]), f"ClusterRole {hint}"
    lease_role = one(default, "Role", "-lease")
    assert lease_role["metadata"]["namespace"] == NAMESPACE
    assert canonical(lease_role["rules"]) == canonical(golden()["leaseRole"]), f"Role {hint}"


def test_namespaced_operator_gets_namespace_watch_and_a_namespaced_peering(
    namespaced: list[Manifest],
) -> None:
    cluster_wide = [
        r
        for r in golden()["clusterRole"]
        if "clusterkopfpeerings" not in r["resources"] and r not in golden()["jobNamespaceRole"]
    ]  # the job-namespace writes are in a Role there (tests/unit/test_helm_rbac.py)
    watch_namespaces = {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]}
    assert canonical(one(namespaced, "ClusterRole", RELEASE)["rules"]) == canonical(
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
    names = [m["metadata"]["name"] for m in roles(bare)]
    assert sorted(names) == sorted([RELEASE, f"{RELEASE}-lease", *USER_ROLES])
    rules = one(bare, "ClusterRole", RELEASE)["rules"]
    assert not [r for r in rules if "kopf.dev" in r["apiGroups"]]
    args = container(one(bare, "Deployment"))["args"]
    assert not [a for a in args if a.startswith(("--peering", "--priority"))]


# --- the operator Deployment ----------------------------------------------------------------


def test_deployment_runs_one_operator_with_probes_and_resources(default: list[Manifest]) -> None:
    deployment = one(default, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    c = container(deployment)
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert c["image"] == f"elastra/elastra-operator:{chart['appVersion']}"
    assert c["imagePullPolicy"] == "IfNotPresent"
    assert c["command"] == ["elastra", "run"]
    assert c["args"] == [
        "--log-format=json",
        "--metrics-port=8080",
        "--health-port=8081",
        "--grace-seconds=120",
        "--assignment-key-file=/etc/elastra-operator/assignment-key",
        "--no-create-lease",  # the chart owns the Lease (templates/lease.yaml)
        f"--peering={RELEASE}",
        "--priority=100",
        "--sharing=namespace",
        "--capacity-requests=on",
        "--capacity-request-timeout-seconds=600",
        f"--capacity-request-priority-class={RELEASE}-capacity-request",  # the chart's own
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


def test_the_operator_leaves_a_lost_node_after_30s_not_300(default: list[Manifest]) -> None:
    pod = one(default, "Deployment")["spec"]["template"]["spec"]
    lost = {t["key"]: t for t in pod["tolerations"] if t.get("effect") == "NoExecute"}
    assert set(lost) == {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}
    assert {t["tolerationSeconds"] for t in lost.values()} == {30}


def test_the_operator_reads_its_assignment_key_from_the_charts_secret(
    default: list[Manifest],
) -> None:
    """The flag names the file the Secret's volume holds; the key is random, 48 characters."""
    secret = one(default, "Secret")
    key = base64.b64decode(secret["data"]["assignment-key"])
    assert len(key) == 48 and key.isalnum()
    pod = one(default, "Deployment")["spec"]["template"]["spec"]
    (flag,) = [a for a in container(one(default, "Deployment"))["args"] if "assignment-key" in a]
    path = Path(flag.partition("=")[2])
    (mount,) = [
        m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == str(path.parent)
    ]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mount["readOnly"] is True
    assert volumes[mount["name"]]["secret"]["secretName"] == secret["metadata"]["name"]
    # The operator runs as a user that is not root: the file is its group's, readable by it.
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
    assert volumes[mount["name"]]["secret"]["defaultMode"] & 0o040
    assert path.name in secret["data"]


def test_local_image_is_set_explicitly(helm: Path, tmp_path: Path) -> None:
    """The offline images (`make images`) are named by flags, as e2e/install.py does."""
    values = {"image": {"repository": "elastra.local/elastra-operator", "tag": "dev"}}
    deployment = one(render(helm, tmp_path, values), "Deployment")
    assert container(deployment)["image"] == "elastra.local/elastra-operator:dev"


def test_a_digest_pins_the_image_and_a_bad_one_is_refused(helm: Path, tmp_path: Path) -> None:
    """What scanners ask (checkov CKV_K8S_43, docs/clusters.md): repository@digest, no tag."""
    digest = "sha256:" + "0123456789abcdef" * 4
    values = {"image": {"tag": "0.1.0", "digest": digest}}
    deployment = one(render(helm, tmp_path, values), "Deployment")
    assert container(deployment)["image"] == f"elastra/elastra-operator@{digest}"
    with pytest.raises(HelmError, match="digest"):
        render(helm, tmp_path, {"image": {"digest": "sha256:abc"}})


def test_notes_create_the_example_claim_before_the_example() -> None:
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    example = yaml.safe_load((ROOT / "examples" / "cpu-tiny.yaml").read_text())
    claim = example["spec"]["checkpoint"]["volume"]
    assert f"name: {claim}" in notes
    assert notes.index(f"name: {claim}") < notes.index("kubectl apply -f examples/cpu-tiny.yaml")


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


@pytest.mark.parametrize("scope", ["off", "cluster"])
def test_sharing_reaches_the_operator_flag(helm: Path, tmp_path: Path, scope: str) -> None:
    args = container(one(render(helm, tmp_path, {"sharing": scope}), "Deployment"))["args"]
    assert [a for a in args if a.startswith("--sharing")] == [f"--sharing={scope}"]


def test_capacity_requests_reach_the_operator_and_bring_their_priority_class(
    helm: Path, tmp_path: Path, default: list[Manifest]
) -> None:
    """On by default, with a class of the release's own that the operator names (value -1,
    never preempting; two releases never share it); a class of the user's: the chart makes
    none; off: neither the class nor the requests."""
    klass = one(default, "PriorityClass")
    args = container(one(default, "Deployment"))["args"]
    assert f"--capacity-request-priority-class={klass['metadata']['name']}" in args
    assert klass["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    assert klass["preemptionPolicy"] == "Never" and klass["value"] == -1
    assert not klass["globalDefault"]
    mine = render(helm, tmp_path, {"capacityRequests": {"priorityClassName": "team-requests"}})
    assert not [m for m in mine if m["kind"] == "PriorityClass"]
    assert (
        "--capacity-request-priority-class=team-requests"
        in container(one(mine, "Deployment"))["args"]
    )
    off = render(helm, tmp_path, {"capacityRequests": {"enabled": False}})
    assert not [m for m in off if m["kind"] == "PriorityClass"]
    assert "--capacity-requests=off" in container(one(off, "Deployment"))["args"]


def test_sharing_values_are_the_operator_scopes(helm: Path, tmp_path: Path) -> None:
    """The schema allows exactly what `elastra run --sharing` takes, and names the value."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["properties"]["sharing"]["enum"] == [scope.value for scope in Scope]
    with pytest.raises(HelmError) as failure:
        render(helm, tmp_path, {"sharing": "everywhere"})
    assert "/sharing" in str(failure.value) and "namespace" in str(failure.value)


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


# --- Prometheus Operator monitors -----------------------------------------------------------

POD_MONITOR_API = "monitoring.coreos.com/v1/PodMonitor"
MONITOR_VALUES = ("metrics.podMonitor.enabled", "metrics.workerPodMonitor.enabled")
ENDPOINT_FIELDS = {"port", "path", "interval", "scrapeTimeout", "relabelings", "metricRelabelings"}
RELABEL_FIELDS = {"sourceLabels", "separator", "targetLabel", "regex", "replacement", "action"}
RELABEL_ACTIONS = {"replace", "keep", "drop", "labeldrop", "labelkeep", "labelmap", "hashmod"}
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
DURATION = re.compile(r"^([0-9]+(ms|s|m|h))+$")


def nested(dotted: str, value: Any) -> dict[str, Any]:
    """``a.b.c`` -> ``{"a": {"b": {"c": value}}}``."""
    for key in reversed(dotted.split(".")):
        value = {key: value}
    return value  # type: ignore[no-any-return]


def meta_label(pod_label: str) -> str:
    """The label Prometheus's pod discovery gives a pod label (non-alphanumerics become _)."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", pod_label)


def monitor_problems(monitor: Manifest) -> list[str]:
    """What the PodMonitor CRD (monitoring.coreos.com/v1) or Prometheus would reject."""
    problems = []
    if (monitor["apiVersion"], monitor["kind"]) != ("monitoring.coreos.com/v1", "PodMonitor"):
        problems.append(f"{monitor['apiVersion']}/{monitor['kind']} is not a v1 PodMonitor")
    spec = monitor["spec"]
    if not set(spec) <= {"selector", "namespaceSelector", "podMetricsEndpoints", "jobLabel"}:
        problems.append(f"unknown spec fields {set(spec)}")
    selector = spec.get("namespaceSelector") or {}
    if not set(selector) <= {"any", "matchNames"} or not selector:
        problems.append(f"namespaceSelector {selector}")
    if not spec.get("selector", {}).get("matchLabels"):
        problems.append("selects no pods by label")
    for endpoint in spec.get("podMetricsEndpoints") or [{}]:
        if not set(endpoint) <= ENDPOINT_FIELDS or "port" not in endpoint:
            problems.append(f"endpoint fields {sorted(endpoint)}")
        for key in ("interval", "scrapeTimeout"):
            if not DURATION.match(str(endpoint.get(key, ""))):
                problems.append(f"{key} {endpoint.get(key)!r}")
        for rule in [*endpoint.get("relabelings", []), *endpoint.get("metricRelabelings", [])]:
            problems += relabel_problems(rule)
    return problems


def relabel_problems(rule: Manifest) -> list[str]:
    problems = []
    if not set(rule) <= RELABEL_FIELDS:
        problems.append(f"relabel fields {sorted(rule)}")
    action = rule.get("action", "replace")
    if action not in RELABEL_ACTIONS:
        problems.append(f"relabel action {action}")
    if action == "replace" and not LABEL_NAME.match(str(rule.get("targetLabel", ""))):
        problems.append(f"replace without a valid targetLabel: {rule}")
    for name in rule.get("sourceLabels", []):
        if not LABEL_NAME.match(name):
            problems.append(f"source label {name!r}")
    try:
        re.compile(str(rule.get("regex", "(.*)")))
    except re.error as err:
        problems.append(f"regex {rule.get('regex')!r}: {err}")
    return problems


@pytest.fixture(scope="module")
def monitored(helm: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Manifest]:
    """Both monitors and the dashboard on, on a cluster that serves PodMonitor."""
    values = {
        "metrics": {
            "podMonitor": {"enabled": True, "labels": {"release": "kps"}},
            "workerPodMonitor": {"enabled": True, "interval": "15s", "scrapeTimeout": "5s"},
            "dashboard": {"enabled": True, "annotations": {"grafana_folder": "Training"}},
        }
    }
    return render(
        helm, tmp_path_factory.mktemp("monitored"), values, api_versions=[POD_MONITOR_API]
    )


def test_monitors_and_dashboard_are_off_by_default(
    default: list[Manifest], namespaced: list[Manifest]
) -> None:
    for manifests in (default, namespaced):
        assert not [m for m in manifests if m["kind"] in ("PodMonitor", "ConfigMap")]
    values = yaml.safe_load((CHART / "values.yaml").read_text())["metrics"]
    assert [values[k]["enabled"] for k in ("podMonitor", "workerPodMonitor", "dashboard")] == [
        False,
        False,
        False,
    ]


@pytest.mark.parametrize("value", MONITOR_VALUES)
def test_a_monitor_without_its_crd_fails_naming_what_to_install(
    helm: Path, tmp_path: Path, value: str
) -> None:
    with pytest.raises(HelmError) as failure:
        render(helm, tmp_path, nested(value, True))
    message = str(failure.value)
    for fragment in (
        f"{value} is true",
        "does not serve monitoring.coreos.com/v1 PodMonitor",
        "install the Prometheus Operator's CRDs",
        f"--api-versions {POD_MONITOR_API}",
    ):
        assert fragment in message, message


def test_the_operator_monitor_needs_the_operator_metrics(helm: Path, tmp_path: Path) -> None:
    values = {"metrics": {"enabled": False, "podMonitor": {"enabled": True}}}
    with pytest.raises(HelmError, match=r"metrics\.enabled is false"):
        render(helm, tmp_path, values, api_versions=[POD_MONITOR_API])


def test_bad_monitor_values_fail_the_schema(helm: Path, tmp_path: Path) -> None:
    for values, where in (
        ({"metrics": {"podMonitor": {"interval": 30}}}, "/metrics/podMonitor/interval"),
        ({"metrics": {"workerPodMonitor": {"scrapeTimeout": "soon"}}}, "scrapeTimeout"),
        ({"metrics": {"workerPodMonitor": {"namespaceSelector": {"all": True}}}}, "'all'"),
        ({"metrics": {"dashboard": {"labels": {"grafana_dashboard": 1}}}}, "grafana_dashboard"),
    ):
        with pytest.raises(HelmError) as failure:
            render(helm, tmp_path, values)
        assert where in str(failure.value), failure.value


def test_operator_monitor_scrapes_the_operator_pod(monitored: list[Manifest]) -> None:
    monitor = one(monitored, "PodMonitor", RELEASE)
    assert monitor_problems(monitor) == []
    assert monitor["metadata"]["namespace"] == NAMESPACE
    assert monitor["metadata"]["labels"]["release"] == "kps"
    spec = monitor["spec"]
    deployment = one(monitored, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= pod_labels.items()
    assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = spec["podMetricsEndpoints"]
    assert endpoint["port"] in {p["name"] for p in container(deployment)["ports"]}
    assert (endpoint["path"], endpoint["interval"], endpoint["scrapeTimeout"]) == (
        "/metrics",
        "30s",
        "10s",
    )
    # Per-job series name the job as the workers' series do (see the dashboard tests).
    renamed = {r["sourceLabels"][0]: r["targetLabel"] for r in endpoint["metricRelabelings"][:2]}
    assert renamed == {"exported_job": "trainingjob", "exported_namespace": "namespace"}
    assert all(r["regex"] == "(.+)" for r in endpoint["metricRelabelings"][:2])


def a_worker_pod() -> Manifest:
    """A worker pod exactly as the operator builds it."""
    body = base_manifest("gpt")
    body["metadata"].update(namespace="team-a", uid="u-1")
    return worker_pod(
        parse_trainingjob(body),
        slot=0,
        node="n1",
        gpu_type="H100",
        assignment="{}",
        version=1,
        settings=OperatorSettings(),
    )


def test_worker_monitor_scrapes_the_pods_the_operator_makes(monitored: list[Manifest]) -> None:
    monitor = one(monitored, "PodMonitor", "-workers")
    assert monitor_problems(monitor) == []
    spec = monitor["spec"]
    pod = a_worker_pod()
    labels = pod["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    for expression in spec["selector"]["matchExpressions"]:
        assert expression["operator"] == "Exists" and expression["key"] in labels
    assert spec["namespaceSelector"] == {"any": True}
    (endpoint,) = spec["podMetricsEndpoints"]
    (worker,) = [c for c in pod["spec"]["containers"] if c["name"] == WORKER_CONTAINER]
    (port,) = [p for p in worker["ports"] if p["name"] == endpoint["port"]]
    assert port["containerPort"] == DEFAULT_METRICS_PORT
    assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("15s", "5s")
    (job_label,) = endpoint["relabelings"]
    assert job_label == {"sourceLabels": [meta_label(LABEL_JOB)], "targetLabel": "trainingjob"}


def test_worker_monitor_namespaces(helm: Path, tmp_path: Path) -> None:
    """watchNamespace narrows it; an explicit namespaceSelector wins."""

    def selector(**monitor: Any) -> Any:
        values = {
            "watchNamespace": "team-a",
            "metrics": {"workerPodMonitor": {"enabled": True, **monitor}},
        }
        rendered = render(helm, tmp_path, values, api_versions=[POD_MONITOR_API])
        return one(rendered, "PodMonitor")["spec"]["namespaceSelector"]

    assert selector() == {"matchNames": ["team-a"]}
    explicit = {"matchNames": ["ml-1", "ml-2"]}
    assert selector(namespaceSelector=explicit) == explicit
    assert selector(namespaceSelector={"any": True}) == {"any": True}


def test_monitor_check_catches_a_bad_monitor() -> None:
    bad = {
        "apiVersion": "monitoring.coreos.com/v1beta1",
        "kind": "PodMonitor",
        "spec": {
            "selector": {},
            "namespaceSelector": {"all": True},
            "podMetricsEndpoints": [
                {
                    "targetPort": 9400,
                    "interval": "30",
                    "relabelings": [{"sourceLabels": ["elastra.dev/job"], "action": "rename"}],
                }
            ],
        },
    }
    problems = monitor_problems(bad)
    assert len(problems) == 8, problems  # api, namespaces, selector, endpoint x3, relabel x2


# --- the Grafana dashboard ------------------------------------------------------------------

DASHBOARD = CHART / "dashboards" / "elastra.json"
TARGET_LABELS = {"namespace", "pod", "instance", "trainingjob"}
"""Labels a scrape through the chart's PodMonitors adds (trainingjob by its relabelings)."""
RENAMED_BY_MONITOR = {"job": "trainingjob"}
"""Metric labels the operator PodMonitor renames (see podmonitor.yaml)."""
PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
}


def operator_series() -> dict[str, set[str]]:
    """Every series name the operator exports, with its label names: read from the metric
    objects its modules register (a counter ``x`` is sampled as ``x_total``, a histogram as
    ``x_bucket``/``x_sum``/``x_count``; ``_created`` samples are left out on purpose)."""
    suffixes = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
    series: dict[str, set[str]] = {}
    for module in (operator_metrics, kube_client):
        for value in vars(module).values():
            if not isinstance(value, MetricWrapperBase):
                continue
            labels = {RENAMED_BY_MONITOR.get(n, n) for n in value._labelnames}
            for family in value.describe():
                for suffix in suffixes[family.type]:
                    extra = {"le"} if suffix == "_bucket" else set()
                    series[family.name + suffix] = labels | extra
    return series


def worker_series() -> dict[str, set[str]]:
    """Every series a worker's agent exports once it knows every value."""
    progress = {
        "step": 3,
        "loss": 2.5,
        "samplesPerSecond": 10.0,
        "stepSeconds": 0.5,
        "tokensPerSecond": 100.0,
        "lastCheckpointStep": 2,
        "resizeDowntimeSeconds": 4.5,  # a resumed world's first step reported it
        "stateFrom": "storage",
        "goodput": 0.9,
    }
    state = {"worldVersion": 2, "worldSize": 4, "rank": 0, "trainerStarts": 2}
    collector = WorkerCollector(lambda: progress, lambda: state)
    return {s.name: set(s.labels) for family in collector.collect() for s in family.samples}


def exported() -> dict[str, set[str]]:
    series = {**operator_series(), **worker_series()}
    return {name: labels | TARGET_LABELS for name, labels in series.items()}


def promql_names(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) an expression reads: string literals and range durations
    are dropped, label names are taken from selectors and by/without/on/ignoring lists, and
    what remains that is not a function call or a PromQL keyword is a metric name."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\[[^\]]*\]", "", text)
    labels: set[str] = set()
    for selector in re.findall(r"\{([^}]*)\}", text):
        labels |= set(re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)", selector))
    text = re.sub(r"\{[^}]*\}", " ", text)
    for group in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", text):
        labels |= {name.strip() for name in group.split(",") if name.strip()}
    text = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", text)
    words = {
        m.group()
        for m in re.finditer(r"(?<![\w.$])[a-zA-Z_:][\w:]*", text)
        if not text[m.end() :].lstrip().startswith("(")  # a function call
    }
    return words - PROMQL_WORDS, labels


def dashboard_queries(dashboard: Manifest) -> list[str]:
    """Every PromQL expression: the panels' targets and the variables' label_values queries."""
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            ((inner, label),) = re.findall(
                r"^label_values\((.*),\s*(\w+)\)$", variable["definition"]
            )
            exprs.append(f"group by ({label}) ({inner})")  # the label must be carried too
    return exprs


def unknown_names(exprs: Iterable[str], known: dict[str, set[str]]) -> list[str]:
    """Metric names no Elastra code exports, and label names those series do not carry."""
    problems = []
    for expr in exprs:
        metrics, labels = promql_names(expr)
        problems += [f"metric {m} in {expr}" for m in sorted(metrics - set(known))]
        carried = set().union(*(known[m] for m in metrics if m in known))
        problems += [f"label {n} in {expr}" for n in sorted(labels - carried - {"le"})]
    return problems


@pytest.fixture(scope="module")
def dashboard() -> Manifest:
    found: Manifest = json.loads(DASHBOARD.read_text())
    return found


def test_dashboard_reads_only_metrics_and_labels_the_code_exports(dashboard: Manifest) -> None:
    queries = dashboard_queries(dashboard)
    assert len(queries) >= 15
    assert unknown_names(queries, exported()) == []


def test_the_name_check_catches_misspelled_metrics_and_labels() -> None:
    known = exported()
    assert "elastra_resizes_total" in known and "elastra_worker_trainer_starts_total" in known
    assert "elastra_reconcile_duration_seconds_bucket" in known
    assert promql_names(
        'histogram_quantile(0.9, sum by (le) (rate(elastra_x_bucket{a="b"}[5m]))) / on (pod) y'
    ) == ({"elastra_x_bucket", "y"}, {"le", "a", "pod"})
    assert unknown_names(["sum(rate(elastra_api_request_total[5m]))"], known) == [
        "metric elastra_api_request_total in sum(rate(elastra_api_request_total[5m]))"
    ]
    assert unknown_names(["elastra_worker_trainer_starts"], known)  # a counter without _total
    assert unknown_names(["sum by (reasons) (elastra_resizes_total)"], known)
    assert unknown_names(['elastra_jobs{job="x"}'], known)  # renamed to trainingjob


def test_dashboard_covers_what_operators_ask_for(dashboard: Manifest) -> None:
    read = set().union(*(promql_names(q)[0] for q in dashboard_queries(dashboard)))
    assert {
        "elastra_jobs",  # jobs by phase
        "elastra_worker_world_size",  # world size per job
        "elastra_worker_samples_per_second",  # step rate
        "elastra_worker_step_seconds",
        "elastra_resizes_total",  # resizes by reason
        "elastra_worker_last_checkpoint_step",  # checkpoint age
        "elastra_reconcile_duration_seconds_bucket",  # reconcile latency
        "elastra_api_requests_total",  # API requests
    } <= read


def test_dashboard_panels_are_well_formed(dashboard: Manifest) -> None:
    assert dashboard["uid"] and dashboard["title"] == "Elastra"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        assert panel["description"], panel["title"]


def test_dashboard_configmap_holds_the_json_for_the_sidecar(monitored: list[Manifest]) -> None:
    config_map = one(monitored, "ConfigMap", "-dashboard")
    assert config_map["metadata"]["namespace"] == NAMESPACE
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "Training"}
    assert config_map["data"] == {"elastra.json": DASHBOARD.read_text()}
