"""The API server itself rejects invalid TrainingJobs (422) and accepts valid ones.

The cases come from the shared table in tests/cases/specs.py, which the unit tests also feed
to the pydantic models: one table, two judges. Requests go through the Python kubernetes
client, the library the operator uses, so the status code and message are what the operator
and kubectl users see.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from elastra.api import parse_trainingjob
from elastra.controller.decide.manifests import worker_pod
from elastra.controller.settings import OperatorSettings
from tests.cases.specs import (
    FULL_TEMPLATE,
    INVALID_SPECS,
    VALID_SPECS,
    InvalidCase,
    ValidCase,
    apply_edits,
    base_manifest,
)
from tests.integration.conftest import LocalCluster, fresh_namespace

GROUP, VERSION, PLURAL = "elastra.dev", "v1alpha1", "trainingjobs"


@pytest.fixture(scope="module")
def custom(cluster: LocalCluster) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(cluster.api_client())


@pytest.fixture(scope="module")
def admission_ns(cluster: LocalCluster) -> Iterator[str]:
    """One namespace for the whole table: every case gets its own object name."""
    with fresh_namespace(cluster) as name:
        yield name


def _create(api: client.CustomObjectsApi, namespace: str, body: dict[str, Any]) -> Any:
    return api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)


def test_table_has_at_least_25_invalid_cases() -> None:
    assert len(INVALID_SPECS) >= 25
    assert len({c.id for c in INVALID_SPECS}) == len(INVALID_SPECS)


@pytest.mark.parametrize("case", INVALID_SPECS, ids=lambda c: c.id)
def test_invalid_spec_is_rejected_by_the_api_server(
    custom: client.CustomObjectsApi, admission_ns: str, case: InvalidCase
) -> None:
    with pytest.raises(ApiException) as excinfo:
        _create(custom, admission_ns, case.manifest(f"bad-{case.id}"[:60]))
    err = excinfo.value
    assert err.status == 422, err.body
    status = json.loads(str(err.body))
    assert status["reason"] == "Invalid"
    assert case.server in status["message"], status["message"]
    causes = status.get("details", {}).get("causes", [])
    fields = {c.get("field", "") for c in causes}
    # The server blames the field itself or something inside it (a list item, a map key).
    within = (case.field + "[", case.field + ".")
    assert any(f == case.field or f.startswith(within) for f in fields), (
        f"expected a cause on {case.field}, got {sorted(fields)}: {status['message']}"
    )


@pytest.mark.parametrize("case", VALID_SPECS, ids=lambda c: c.id)
def test_valid_spec_is_accepted(
    custom: client.CustomObjectsApi, admission_ns: str, case: ValidCase
) -> None:
    created = _create(custom, admission_ns, case.manifest(f"ok-{case.id}"[:60]))
    assert created["metadata"]["uid"]
    assert created["spec"]["replicas"] == case.manifest()["spec"]["replicas"]


def test_scaling_past_one_pod_without_shared_checkpoints_is_rejected(
    cluster: LocalCluster, custom: client.CustomObjectsApi, admission_ns: str
) -> None:
    """A one-pod job may keep its emptyDir; ``kubectl scale`` to two must not lose progress."""
    (case,) = [c for c in VALID_SPECS if c.id == "single-replica-without-checkpoints"]
    _create(custom, admission_ns, case.manifest("one-pod-no-checkpoints"))
    scaled = cluster.kubectl(
        "scale", "tj/one-pod-no-checkpoints", "-n", admission_ns, "--replicas=2", check=False
    )
    assert scaled.returncode != 0
    assert "checkpoint.uri is required when replicas or maxReplicas is above 1" in scaled.stderr
    job = custom.get_namespaced_custom_object(
        GROUP, VERSION, admission_ns, PLURAL, "one-pod-no-checkpoints"
    )
    assert job["spec"]["replicas"] == 1


def _templated_pod(namespace: str, pod_security: str) -> dict[str, Any]:
    """The pod the operator would create for a job with the full template."""
    edits = {
        "spec.worker.template": copy.deepcopy(FULL_TEMPLATE),
        "spec.worker.podSecurity": pod_security,
    }
    manifest = apply_edits(base_manifest("templated"), edits)
    manifest["metadata"].update(namespace=namespace, uid="7c0f2a9e-0000-4000-8000-000000000001")
    return worker_pod(
        parse_trainingjob(manifest),
        slot=0,
        node="some-node",
        gpu_type="H100",
        assignment="{}",
        version=1,
        settings=OperatorSettings(),
    )


@pytest.fixture(scope="module")
def priority_class(cluster: LocalCluster) -> Iterator[str]:
    """The PriorityClass FULL_TEMPLATE names: pod admission refuses an unknown one."""
    name = FULL_TEMPLATE["spec"]["priorityClassName"]
    body = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": 1000}  # fmt: skip
    cluster.apply(body)
    yield name
    cluster.kubectl("delete", "priorityclass", name, "--ignore-not-found", check=False)


@pytest.mark.parametrize(
    ("enforce", "pod_security", "admitted"),
    [("restricted", "restricted", True), ("baseline", "baseline", True),
     ("restricted", "baseline", False)],
)  # fmt: skip
def test_a_templated_worker_pod_passes_pod_validation_and_pod_security(
    cluster: LocalCluster, priority_class: str, enforce: str, pod_security: str, admitted: bool
) -> None:
    """The merged pod is one the API server accepts (server-side dry run), under the level
    its podSecurity names; baseline's sidecars do not pass "restricted"."""
    with fresh_namespace(cluster) as namespace:
        cluster.kubectl(
            "label", "namespace", namespace, f"pod-security.kubernetes.io/enforce={enforce}"
        )
        account = FULL_TEMPLATE["spec"]["serviceAccountName"]
        cluster.kubectl("create", "serviceaccount", account, "-n", namespace)
        pod = _templated_pod(namespace, pod_security)
        created = cluster.kubectl(
            "create", "--dry-run=server", "-o", "json", "-f", "-",
            stdin=json.dumps(pod), check=False,
        )  # fmt: skip
    if admitted:
        assert created.returncode == 0, created.stderr
        spec = json.loads(created.stdout)["spec"]
        assert [c["name"] for c in spec["containers"]] == ["worker", "metrics-agent"]
        assert spec["priorityClassName"] == priority_class
    else:
        assert created.returncode != 0
        assert "violates PodSecurity" in created.stderr, created.stderr
