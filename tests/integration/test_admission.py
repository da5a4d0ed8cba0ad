"""The API server itself rejects invalid TrainingJobs (422) and accepts valid ones.

The cases come from the shared table in tests/cases/specs.py, which the unit tests also feed
to the pydantic models: one table, two judges. Requests go through the Python kubernetes
client, the library the operator uses, so the status code and message are what the operator
and kubectl users see.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cases.specs import INVALID_SPECS, VALID_SPECS, InvalidCase, ValidCase
from tests.integration.conftest import Cluster, fresh_namespace

GROUP, VERSION, PLURAL = "elastra.dev", "v1alpha1", "trainingjobs"


@pytest.fixture(scope="module")
def custom(cluster: Cluster) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(cluster.api_client())


@pytest.fixture(scope="module")
def admission_ns(cluster: Cluster) -> Iterator[str]:
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
