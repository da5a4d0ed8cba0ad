"""The worker pod template's API: every rule is exercised by the shared case table, the CRD
keeps its allow-list closed, and a full template survives parsing unchanged."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from elastra.api import parse_trainingjob
from elastra.api import podtemplate as pt
from elastra.api import trainingjob as tj
from elastra.api.base import ApiModel
from elastra.api.crd import custom_resource_definition
from elastra.api.formats import is_zero_size
from elastra.api.rules import Rule
from elastra.errors import UserError
from elastra.planner.catalog import GPU_RESOURCES
from tests.cases.specs import FULL_TEMPLATE, INVALID_SPECS, apply_edits, base_manifest

TEMPLATE_MODELS: tuple[type[ApiModel], ...] = (
    pt.ResourceRequirements,
    pt.TemplateMetadata,
    pt.EnvVarSource,
    pt.TemplateEnvVar,
    pt.TemplateContainer,
    pt.Volume,
    pt.TemplatePodSpec,
)
SPEC_MODELS: tuple[type[ApiModel], ...] = (
    tj.WorkerSpec,
    tj.ModelSpec,
    tj.TrainingSpec,
    tj.ParallelismSpec,
    tj.CheckpointSpec,
    tj.TrainingJobSpec,
)


def _rules() -> Iterator[tuple[str, Rule]]:
    """Every rule pydantic can check, of the template's models and of the spec's."""
    for model in (*TEMPLATE_MODELS, *SPEC_MODELS):
        for rule in model.RULES:
            if rule.check is not None:
                yield model.__name__, rule


RULES = list(_rules())


@pytest.mark.parametrize(("model", "rule"), RULES, ids=[f"{m}:{r.cel[:40]}" for m, r in RULES])
def test_every_rule_has_a_case_that_both_judges_see(model: str, rule: Rule) -> None:
    """A rule no case triggers could disagree with its CEL twin unnoticed."""
    cases = [case.id for case in INVALID_SPECS if case.local in rule.message]
    assert cases, f"{model}: no case in tests/cases/specs.py triggers {rule.message!r}"


def test_template_rules_all_have_a_python_twin() -> None:
    """Only transition rules may be server-only, and the template has none."""
    for model in TEMPLATE_MODELS:
        assert all(rule.check is not None for rule in model.RULES), model.__name__


def test_a_full_template_parses_and_goes_back_to_the_wire_unchanged() -> None:
    manifest = apply_edits(base_manifest(), {"spec.worker.template": copy.deepcopy(FULL_TEMPLATE)})
    job = parse_trainingjob(manifest)
    assert job.spec.worker.template is not None
    wire = job.spec.worker.template.to_wire()
    assert _without_empty(wire) == FULL_TEMPLATE


def _without_empty(node: Any) -> Any:
    """Drop the empty collections that defaults add, to compare with what a user wrote."""
    if isinstance(node, dict):
        return {k: _without_empty(v) for k, v in node.items() if v not in ({}, [])}
    if isinstance(node, list):
        return [_without_empty(v) for v in node]
    return node


def _template_schema() -> dict[str, Any]:
    (version,) = custom_resource_definition()["spec"]["versions"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return spec["properties"]["worker"]["properties"]["template"]  # type: ignore[no-any-return]


def test_the_pod_spec_allow_list_is_what_the_docs_say() -> None:
    properties = set(_template_schema()["properties"]["spec"]["properties"])
    allowed = {
        "volumes", "containers", "initContainers", "nodeSelector", "tolerations", "affinity",
        "priorityClassName", "serviceAccountName", "imagePullSecrets",
    }  # fmt: skip
    rejected = {
        "nodeName", "schedulingGates", "hostNetwork", "hostPID", "hostIPC", "securityContext",
    }  # fmt: skip
    assert properties == allowed | rejected


def _walk(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if "items" in schema:
        yield from _walk(schema["items"], f"{path}[]")


def test_unknown_fields_are_kept_only_in_opaque_inner_objects() -> None:
    opaque = [
        path
        for path, node in _walk(_template_schema(), "template")
        if node.get("x-kubernetes-preserve-unknown-fields")
    ]
    for path, node in _walk(_template_schema(), "template"):
        if node.get("x-kubernetes-preserve-unknown-fields"):
            assert "properties" not in node, f"{path} mixes declared and unknown fields"
    assert "template.spec.volumes[].secret" in opaque
    assert "template.spec.containers[].securityContext" in opaque
    assert not [p for p in opaque if p.endswith(("spec", "containers[]", "volumes[]"))]


def test_every_field_is_described() -> None:
    for path, node in _walk(_template_schema(), "template"):
        if not path.endswith("[]"):
            assert node.get("description"), f"{path} has no description"


def test_rule_field_paths_name_declared_members() -> None:
    """The API server refuses a CRD whose rule blames a member the schema does not declare."""
    for path, node in _walk(_template_schema(), "template"):
        for rule in node.get("x-kubernetes-validations", []):
            if "fieldPath" in rule:
                member = rule["fieldPath"].lstrip(".").split(".")[0]
                assert member in node["properties"], f"{path}: {rule['fieldPath']}"


@pytest.mark.parametrize(
    ("size", "zero"),
    [("0", True), ("0Gi", True), ("0.0", True), ("0e3", True), ("1Gi", False),
     ("0.5Gi", False), ("10", False), ("100m", False), ("1e3", False)],
)  # fmt: skip
def test_zero_size_switches_shm_off(size: str, zero: bool) -> None:
    assert is_zero_size(size) is zero


@pytest.mark.parametrize(
    ("resource", "refused"),
    [
        *((name, True) for name in GPU_RESOURCES),
        ("vpc.amazonaws.com/efa", False),
        ("cpu", False),
    ],
)
@pytest.mark.parametrize("part", ["requests", "limits"])
@pytest.mark.parametrize("where", ["spec.worker.resources", "sidecar"])
def test_no_gpu_resource_the_catalog_knows_is_set_in_resources(
    resource: str, refused: bool, part: str, where: str
) -> None:
    """GPUs come from worker.gpus only, whichever vendor's; other resources pass."""
    resources = {part: {resource: "1"}}
    edits: dict[str, Any] = (
        {where: resources}
        if where != "sidecar"
        else {"spec.worker.template": {"spec": {"containers": [
            {"name": "proxy", "image": "p:1", "resources": resources}]}}}
    )  # fmt: skip
    manifest = apply_edits(base_manifest(), edits)
    if not refused:
        parse_trainingjob(manifest)
        return
    with pytest.raises(UserError, match=r"set GPUs with worker\.gpus, not in resources"):
        parse_trainingjob(manifest)
    (rule,) = pt.ResourceRequirements.RULES
    assert f"'{resource}' in self.{part}" in rule.cel
