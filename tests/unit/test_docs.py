"""The documentation stays true: the generated reference, descriptions, links, no outside files.

``docs/api.md`` is generated from the models, so a stale copy is a failure, not a nuisance;
every spec field must say what it does (``kubectl explain`` shows the same text); and the
repository must stand alone: no file may point at notes that live outside it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from elastra.api import TrainingJobSpec, TrainingJobStatus
from elastra.api.crd import structural_schema
from elastra.api.reference import render_reference, undocumented

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "trainingjobs.elastra.dev.yaml"
DOCS = REPO / "docs"
# Spelt in pieces so that this file does not match itself.
OUTSIDE_NOTES = ("DESIGN" + ".md", "STYLE" + ".md", "shared" + "/notes")


def test_api_reference_is_current() -> None:
    committed = (DOCS / "api.md").read_text()
    assert committed == render_reference(), "docs/api.md is stale: run `make docs`"


def test_every_spec_field_of_the_models_has_a_description() -> None:
    assert undocumented(structural_schema(TrainingJobSpec), "spec") == []


def test_every_status_field_has_a_description() -> None:
    assert undocumented(structural_schema(TrainingJobStatus), "status") == []


def _explain(node: dict[str, Any], path: str) -> list[str]:
    """What ``kubectl explain --recursive`` walks: properties, list items and map values."""
    missing: list[str] = []
    for name, sub in node.get("properties", {}).items():
        if not sub.get("description"):
            missing.append(f"{path}.{name}")
        missing += _explain(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        missing += _explain(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        missing += _explain(node["additionalProperties"], f"{path}{{}}")
    return missing


def test_every_property_under_spec_in_the_crd_has_a_description() -> None:
    crd = yaml.safe_load(CRD.read_text())
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = root["properties"]["spec"]
    assert len(spec["properties"]) >= 10  # the walk reaches the real schema
    assert _explain(spec, "spec") == []


def test_the_explain_walk_finds_a_missing_description() -> None:
    node = {"properties": {"a": {"description": "x", "items": {"properties": {"b": {}}}}}}
    assert _explain(node, "spec") == ["spec.a[].b"]


def _tracked_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.decode()
    return [REPO / name for name in listed.split("\0") if name]


def test_no_tracked_file_points_outside_the_repository() -> None:
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    offenders = []
    for path in _tracked_files():
        if not path.is_file():
            continue  # deleted in the work tree, not yet committed
        text = path.read_bytes().decode("utf-8", errors="replace")
        offenders += [f"{path.relative_to(REPO)}: {n}" for n in OUTSIDE_NOTES if n in text]
    assert offenders == []


LINK = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)


@pytest.mark.parametrize(
    "page", sorted([*DOCS.glob("*.md"), REPO / "README.md"]), ids=lambda p: p.name
)
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target, _ in LINK.findall(CODE.sub("", page.read_text())):
        if "://" in target or target.startswith("mailto:"):
            continue
        if not (page.parent / target).exists():
            broken.append(target)
    assert broken == []


@pytest.mark.parametrize("page", ["architecture.md", "operations.md", "troubleshooting.md"])
def test_the_guides_exist(page: str) -> None:
    assert (DOCS / page).read_text().startswith("# ")
