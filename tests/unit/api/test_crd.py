"""The generated CRD: committed bytes match, and it is a Kubernetes-grade API."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from elastra.api.crd import PRINTER_COLUMNS, custom_resource_definition, render_crds

CRD_FILE = Path(__file__).resolve().parents[3] / "crds" / "trainingjobs.elastra.dev.yaml"


def _version() -> dict[str, Any]:
    crd = custom_resource_definition()
    (version,) = crd["spec"]["versions"]
    return version  # type: ignore[no-any-return]


def _walk(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if "items" in schema:
        yield from _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _walk(schema["additionalProperties"], f"{path}{{}}")


def test_committed_crd_matches_the_models() -> None:
    assert CRD_FILE.read_text() == render_crds(), "run `make crds` and commit crds/"


def test_names_and_version() -> None:
    crd = custom_resource_definition()
    assert crd["metadata"]["name"] == "trainingjobs.elastra.dev"
    names = crd["spec"]["names"]
    assert names["shortNames"] == ["tj"]
    assert names["categories"]
    version = _version()
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)


def test_status_and_scale_subresources() -> None:
    subresources = _version()["subresources"]
    assert subresources["status"] == {}
    assert subresources["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    status = _version()["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert status["replicas"]["type"] == "integer"
    assert status["selector"]["type"] == "string"


def test_printer_columns_point_at_existing_fields() -> None:
    names = [column["name"] for column in PRINTER_COLUMNS]
    assert names == ["Desired", "Ready", "World", "GPU-Types", "Plan", "Step", "Status", "Age"]
    root = _version()["schema"]["openAPIV3Schema"]
    for column in PRINTER_COLUMNS:
        node = root
        parts = column["jsonPath"].strip(".").split(".")
        if parts[0] == "metadata":
            continue
        for part in parts:
            node = node["properties"][part]
        expected = {"integer": "integer", "string": "string"}[column["type"]]
        assert node["type"] == expected, column


def test_schema_is_structural_and_bounded() -> None:
    root = _version()["schema"]["openAPIV3Schema"]
    text = yaml.safe_dump(root)
    assert "$ref" not in text and "anyOf" not in text and "title" not in text
    for path, node in _walk(root["properties"]["spec"], "spec"):
        assert "type" in node, path
        if node["type"] == "string" and "enum" not in node:
            assert "maxLength" in node, f"{path} has no maxLength"
        if node["type"] == "array":
            assert "maxItems" in node, f"{path} has no maxItems"
        if node["type"] == "object" and "additionalProperties" in node:
            assert "maxProperties" in node, f"{path} has no maxProperties"
        assert node["type"] != "number", f"{path} is a float: spec fields are integers"


def test_enums_and_cel_rules_are_present() -> None:
    spec = _version()["schema"]["openAPIV3Schema"]["properties"]["spec"]
    training = spec["properties"]["training"]["properties"]
    assert training["precision"]["enum"] == ["bf16", "fp16", "fp32"]
    rules = [rule["rule"] for rule in spec["x-kubernetes-validations"]]
    assert "self.minReplicas <= self.replicas" in rules
    assert any("oldSelf.model" in rule for rule in rules), "model must be immutable"
    parallelism = spec["properties"]["parallelism"]["x-kubernetes-validations"]
    assert any("manual" in rule["rule"] for rule in parallelism)


def test_optional_sections_default_to_their_model_defaults() -> None:
    spec = _version()["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert spec["parallelism"]["default"] == {"mode": "auto"}
    assert spec["placement"]["default"] == {"objective": "throughput", "heterogeneous": False}
    assert spec["checkpoint"]["default"]["path"] == "/checkpoints"
    assert spec["failurePolicy"]["default"]["permanentExitCodes"] == [2]
    assert "default" not in spec["model"]
