"""The documentation stays true: the generated reference, descriptions, links, no outside files.

``docs/api.md`` is generated from the models, so a stale copy is a failure, not a nuisance;
every spec field must say what it does (``kubectl explain`` shows the same text); the
repository must stand alone: no file may point at notes that live outside it; and a figure is
dated by its date and commit (``docs/benchmarks.md``), never by the working sitting that
measured it, which a reader cannot look up.
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
PAGES = sorted([*DOCS.glob("*.md"), REPO / "README.md"])


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
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


# A numbered working sitting, in any spelling: "session 18", "sessions 15 and 16", "session-18",
# "sitting #3", "the 18th session", "session eighteen". "Session" alone is the worker's API.
_NUMBER_WORDS = "one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|" + (
    "fourteen|fifteen|sixteen|seventeen|eighteen|nineteen|twenty"
)
NUMBERED_SITTING = re.compile(
    r"\b(?:session|sitting)s?(?:\s+(?:no\.?|nr\.?|number))?(?:\s*#\s*|\s+|-)\d+"
    r"|\b\d+(?:st|nd|rd|th)\s+(?:working\s+|development\s+)?(?:session|sitting)\b"
    rf"|\b(?:session|sitting)\s+(?:{_NUMBER_WORDS})\b",
    re.IGNORECASE,
)
# In prose (Markdown) also a sitting named without its number: "this session's changes",
# "the previous sitting", "a development session". Code may say "an earlier session" of torch's
# own sessions, so this half applies to pages only.
RELATIVE_SITTING = re.compile(
    r"\b(?:this|that|last|previous|earlier|next|same)\s+(?:working\s+|development\s+)?"
    r"(?:session|sitting)s?\b"
    r"|\b(?:working|development)\s+(?:session|sitting)s?\b",
    re.IGNORECASE,
)


def sittings(text: str, *, prose: bool) -> list[str]:
    """Every mention of a working sitting in ``text`` (numbered only, unless ``prose``)."""
    found = [m.group(0) for m in NUMBERED_SITTING.finditer(text)]
    if prose:
        found += [m.group(0) for m in RELATIVE_SITTING.finditer(text)]
    return found


@pytest.mark.parametrize(
    ("text", "prose", "found"),
    [
        ("measured in session 18", False, ["session 18"]),
        ("Session 9 (same machine): 1.81x", False, ["Session 9"]),
        ("sessions 15 and 16", False, ["sessions 15"]),
        ("sessions 11-13", False, ["sessions 11"]),
        ("name the clone each session-18 row ran in", False, ["session-18"]),
        ("sitting 3", False, ["sitting 3"]),
        ("sitting #3", False, ["sitting #3"]),
        ("session no. 4", False, ["session no. 4"]),
        ("a figure of\nsession\n12", False, ["session\n12"]),
        ("the 18th session", False, ["18th session"]),
        ("session eighteen", False, ["session eighteen"]),
        ("this session's changes", True, ["this session"]),
        ("before last session's protocol", True, ["last session"]),
        ("the development session that measured it", True, ["development session"]),
        ("this session's changes", False, []),
        ("with Session.from_env() as sess:  # joins this world version", True, []),
        ("a GradScaler used by the session too", True, []),
        ("a run on 2026-12-03 at commit 4032375", True, []),
        ("the sessions' stores take ports below 32768", True, []),
    ],
)
def test_sittings_are_found_in_every_spelling(text: str, prose: bool, found: list[str]) -> None:
    assert sittings(text, prose=prose) == found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_pages_name_no_working_sitting(page: Path) -> None:
    """README.md and docs/ date a figure by date and commit: docs/benchmarks.md says how."""
    assert sittings(page.read_text(), prose=True) == []


def test_no_tracked_file_names_a_numbered_sitting() -> None:
    """Code comments, docstrings and every other page (e2e notes, worker README) too."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    this_file = Path(__file__).resolve()
    offenders = []
    for path in _tracked_files():
        if not path.is_file() or path.resolve() == this_file:
            continue  # deleted in the work tree; or this file, whose table names sittings
        text = path.read_bytes().decode("utf-8", errors="replace")
        offenders += [
            f"{path.relative_to(REPO)}: {hit!r}"
            for hit in sittings(text, prose=path.suffix == ".md")
        ]
    assert offenders == []
