"""The TrainingJob CRD on the real API server: installed, printed, scaled.

The expected printer columns are read from the CRD file itself, so this test checks that the
API server serves what crds/ declares rather than restating it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.cases.specs import base_manifest
from tests.integration.conftest import LocalCluster

CRD_FILE = Path(__file__).resolve().parents[2] / "crds" / "trainingjobs.elastra.dev.yaml"


def _crd() -> dict[str, Any]:
    crd: dict[str, Any] = yaml.safe_load(CRD_FILE.read_text())
    return crd


def test_crd_is_established(cluster: LocalCluster) -> None:
    crd = cluster.get("crd", "trainingjobs.elastra.dev")
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions["Established"] == "True"
    assert conditions["NamesAccepted"] == "True"
    assert "tj" in crd["spec"]["names"]["shortNames"]


def test_kubectl_get_tj_shows_printer_columns(cluster: LocalCluster, namespace: str) -> None:
    cluster.apply(base_manifest("printed"), namespace=namespace)
    out = cluster.kubectl("get", "tj", "printed", "-n", namespace).stdout.splitlines()
    header, row = out[0].split(), out[1].split()
    (version,) = _crd()["spec"]["versions"]
    expected = ["NAME"] + [c["name"].upper() for c in version["additionalPrinterColumns"]]
    assert header == expected
    assert row[0] == "printed"
    assert row[header.index("DESIRED")] == "4"


def test_kubectl_scale_goes_through_the_scale_subresource(
    cluster: LocalCluster, namespace: str
) -> None:
    cluster.apply(base_manifest("scaled"), namespace=namespace)  # min 2, replicas 4, max 8
    cluster.kubectl("scale", "tj/scaled", "--replicas=6", "-n", namespace)
    job = cluster.get("tj", "scaled", "-n", namespace)
    assert job["spec"]["replicas"] == 6
    raw = cluster.kubectl(
        "get",
        "--raw",
        f"/apis/elastra.dev/v1alpha1/namespaces/{namespace}/trainingjobs/scaled/scale",
    ).stdout
    scale = yaml.safe_load(raw)
    assert scale["kind"] == "Scale"
    assert scale["spec"]["replicas"] == 6


def test_scale_outside_min_max_is_rejected(cluster: LocalCluster, namespace: str) -> None:
    cluster.apply(base_manifest("bounded"), namespace=namespace)
    above = cluster.kubectl("scale", "tj/bounded", "--replicas=9", "-n", namespace, check=False)
    assert above.returncode != 0
    assert "replicas must be <= maxReplicas" in above.stderr
    below = cluster.kubectl("scale", "tj/bounded", "--replicas=1", "-n", namespace, check=False)
    assert below.returncode != 0
    assert "minReplicas must be <= replicas" in below.stderr
    assert cluster.get("tj", "bounded", "-n", namespace)["spec"]["replicas"] == 4
