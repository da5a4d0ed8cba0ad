"""The Dockerfiles and the offline builder make the same images; examples run what they hold.

Users build ``operator/Dockerfile`` and ``worker_image/Dockerfile`` with docker; the tests and
``make images`` build the same images offline (``e2e/images/build.py``). A package, a path, a
user or an entrypoint that differs between the two would pass every test here and fail on a
user's cluster, so both recipes are parsed and compared: Python packages by name, the files
under /opt/elastra, the uid (also the chart's and the worker pods'), entrypoint and command.
The operator image holds only packages the operator imports. Each example TrainingJob must
run a command its image holds.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import sys
import tomllib
from dataclasses import dataclass, field
from importlib.metadata import packages_distributions
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e.images import build
from packaging.utils import canonicalize_name

from elastra.controller.decide.manifests import WORKER_UID

REPO = Path(__file__).resolve().parents[2]
WORKER_DOCKERFILE = REPO / "worker_image" / "Dockerfile"
OPERATOR_DOCKERFILE = REPO / "operator" / "Dockerfile"
BASE = "python:3.11-slim-bookworm"
APP = "/" + build.APP_ROOT
PIP_OPTIONS_WITH_VALUE = {"-c", "--constraint", "-i", "--index-url", "--extra-index-url", "-r"}


@dataclass
class Stage:
    """One build stage of a Dockerfile, reduced to what the comparison reads."""

    base: str
    packages: list[str] = field(default_factory=list)
    copies: list[tuple[str, str]] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    user: str = ""
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    expose: list[str] = field(default_factory=list)
    args: list[str] = field(default_factory=list)


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    lines = [ln.strip() for ln in joined.splitlines()]
    out = []
    for line in lines:
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def pip_packages(run: str) -> list[str]:
    """Names a RUN line installs into the image's python3 with pip (``pip --python X install``,
    pip run from a throwaway venv): arguments that are neither options nor paths. Shell
    expansions (``${WHEELS:+...}``, ``"$(command -v python3)"``) are options, not names."""
    names: list[str] = []
    for command in run.split("&&"):
        words = shlex.split(re.sub(r'"?\$[({][^)}]*[)}]"?', "", command))
        if not words or not words[0].endswith("pip") or words[1:2] != ["--python"]:
            continue
        if words[2:3] != ["install"]:
            continue
        skip = False
        for word in words[3:]:
            if skip:
                skip = False
            elif word in PIP_OPTIONS_WITH_VALUE:
                skip = True
            elif not word.startswith(("-", "/", ".")):
                names.append(canonicalize_name(re.split(r"[<>=!~\[;]", word)[0]))
    return names


def parse_dockerfile(path: Path) -> list[Stage]:
    stages: list[Stage] = []
    args: dict[str, str] = {}  # ARGs before the first FROM: what FROM may name
    for word, rest in _instructions(path.read_text()):
        if word == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name] = default
            continue
        if word == "FROM":
            base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], rest.split()[0])
            stages.append(Stage(base=base))
            continue
        stage = stages[-1]
        if word == "ARG":
            stage.args.append(rest.partition("=")[0])
        elif word == "RUN":
            stage.runs.append(rest)
            stage.packages += pip_packages(rest)
        elif word == "COPY":
            parts = [p for p in rest.split() if not p.startswith("--")]
            stage.copies += [(src, parts[-1]) for src in parts[:-1]]
        elif word == "ENV":
            stage.env.update(dict(re.findall(r"(\w+)=(\S+)", rest)))
        elif word == "USER":
            stage.user = rest
        elif word in ("ENTRYPOINT", "CMD"):
            setattr(stage, word.lower(), json.loads(rest))
        elif word == "EXPOSE":
            stage.expose += rest.split()
    return stages


def _uid(stage: Stage) -> str:
    found = [m for run in stage.runs for m in re.findall(r"useradd --uid (\d+)", run)]
    assert len(found) == 1, found
    return found[0]


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(re.split(r"[<>=!~\[;]", r)[0]) for r in requirements}


def test_worker_dockerfile_matches_the_offline_build() -> None:
    stages = parse_dockerfile(WORKER_DOCKERFILE)
    assert len(stages) == 1
    final = stages[0]
    assert final.base == BASE
    assert sorted(final.packages) == sorted(canonicalize_name(n) for n in build.WORKER_REQUIREMENTS)
    expected = {(f"worker_image/{d}", f"{APP}/{d}") for d in build.WORKER_APP_DIRS}
    assert {c for c in final.copies if c[1].startswith(APP)} == expected
    assert final.env["PYTHONPATH"] == APP
    assert final.user == _uid(final) == build.IMAGE_USER
    assert final.entrypoint == build.WORKER_ENTRYPOINT
    assert final.cmd == build.WORKER_CMD
    assert final.expose == ["9400"]


def test_operator_dockerfile_matches_the_offline_build() -> None:
    *builders, final = parse_dockerfile(OPERATOR_DOCKERFILE)
    assert final.base == BASE and all(s.base == BASE for s in builders)
    assert sorted(final.packages) == sorted(
        canonicalize_name(n) for n in build.OPERATOR_REQUIREMENTS
    )
    assert not [c for c in final.copies if c[1].startswith(APP)]  # nothing under /opt/elastra
    assert final.user == _uid(final) == build.IMAGE_USER
    assert final.entrypoint == build.OPERATOR_ENTRYPOINT
    assert final.cmd is None  # the offline image has no cmd either
    assert final.expose == []


@pytest.mark.parametrize("dockerfile", [WORKER_DOCKERFILE, OPERATOR_DOCKERFILE])
def test_the_image_user_is_the_one_pods_and_the_chart_run_as(dockerfile: Path) -> None:
    """One uid everywhere: the worker pods' runAsUser/fsGroup, the chart's operator pod, the
    offline build and both Dockerfiles; above the host's login users (login.defs: at most
    60000), which is what scanners such as checkov ask (tests/unit/test_checkov.py)."""
    final = parse_dockerfile(dockerfile)[-1]
    (useradd,) = [shlex.split(run.rpartition("||")[2]) for run in final.runs if "useradd" in run]
    assert useradd == ["useradd", "--uid", build.IMAGE_USER, *build.USERADD_OPTIONS, "elastra"]
    values = yaml.safe_load((REPO / "helm" / "elastra" / "values.yaml").read_text())
    uid = int(build.IMAGE_USER)
    assert values["runAsUser"] == values["runAsGroup"] == WORKER_UID == uid
    assert uid > 60000


@pytest.mark.parametrize("dockerfile", [WORKER_DOCKERFILE, OPERATOR_DOCKERFILE])
def test_every_stage_that_runs_pip_takes_the_build_arguments_make_passes(dockerfile: Path) -> None:
    """e2e/images/docker.py builds with BASE (the offline base: it runs as uid 65532, so each
    stage starts as root) and WHEELS (the wheel cache); a stage without them would pull from a
    registry or an index that is not there, or run pip as a user who cannot write."""
    for stage in parse_dockerfile(dockerfile):
        if any("/tmp/pip/bin/pip" in run for run in stage.runs):
            assert "WHEELS" in stage.args
            assert any("${WHEELS:+--no-index --find-links" in run for run in stage.runs)
        assert stage.base == BASE  # FROM ${BASE}, its default the public image
    assert "USER root" in dockerfile.read_text()
    assert dockerfile.read_text().count("FROM ${BASE}") == len(parse_dockerfile(dockerfile))


def test_operator_wheel_stage_copies_every_package_of_the_wheel() -> None:
    builder = parse_dockerfile(OPERATOR_DOCKERFILE)[0]
    packages = _pyproject()["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    copied = {src for src, _ in builder.copies}
    assert set(packages) <= copied
    assert any("pip wheel" in run for run in builder.runs)


def test_requirement_lists_match_pyproject() -> None:
    project = _pyproject()["project"]
    assert _names(build.OPERATOR_REQUIREMENTS) == _names(project["dependencies"])
    worker_extra = _names(project["optional-dependencies"]["worker"])
    assert worker_extra <= _names(build.WORKER_REQUIREMENTS)


def _imported_by_the_operator() -> set[str]:
    """The top-level names of every package ``operator/elastra`` imports (in functions too)."""
    names: set[str] = set()
    for path in (REPO / "operator" / "elastra").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.partition(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.partition(".")[0])
    return names - set(sys.stdlib_module_names)


def test_every_runtime_dependency_is_imported_by_the_operator() -> None:
    """Before: the kubernetes client was a runtime dependency, in the operator image, that only
    the tests imported."""
    by_package = packages_distributions()
    imported = {
        canonicalize_name(dist)
        for name in _imported_by_the_operator()
        for dist in by_package.get(name, [])
    }
    runtime = _names(_pyproject()["project"]["dependencies"])
    assert runtime <= imported, f"not imported by operator/elastra: {sorted(runtime - imported)}"


def test_the_python_version_of_the_base_matches_the_offline_site_path() -> None:
    minor = re.search(r"python:(\d+\.\d+)", BASE)
    assert minor is not None
    assert f"python{minor.group(1)}/site-packages" in (REPO / "e2e/images/build.py").read_text()


def test_pip_packages_reads_names_not_options_or_paths() -> None:
    run = (
        'python3 -m venv /v && /v/bin/pip install ${W:+--find-links "$W"} --upgrade pip'
        ' && /v/bin/pip --python "$(command -v python3)" install ${W:+--no-index --find-links'
        ' "$W"} --index-url "$X" -c /c.txt torch "numpy>=1"'
        " && /v/bin/pip --python python3 install --no-deps /w/e.whl"
    )
    assert pip_packages(run) == ["torch", "numpy"]


# --- examples run what their image holds ----------------------------------------------------


def _examples() -> list[tuple[str, dict[str, Any]]]:
    jobs = []
    for path in sorted((REPO / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "TrainingJob":
                jobs.append((path.name, doc))
    return jobs


def problems_of(worker: dict[str, Any]) -> list[str]:
    """What in a worker spec the worker image cannot run (empty: all of it exists)."""
    words = [*worker.get("command", []), *worker.get("args", [])]
    problems = []
    for i, word in enumerate(words):
        if word in ("python", "elastra-worker", "elastra"):
            problems.append(f"{word}: not in the worker images (use python3 -m ...)")
        module = words[i + 1] if word == "-m" and i > 0 and words[i - 1] == "python3" else None
        if module is not None and not _importable(module):
            problems.append(f"python3 -m {module}: no such module in worker_image/")
        if word.startswith("/opt/elastra/") and not _in_worker_image(word):
            problems.append(f"{word}: not copied into the worker images")
    if words and words[0] != "python3":
        problems.append(f"{words[0]}: the command must start with python3")
    return problems


def _importable(module: str) -> bool:
    base = REPO / "worker_image" / Path(*module.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _in_worker_image(path: str) -> bool:
    rel = Path(path).relative_to(APP)
    return rel.parts[0] in build.WORKER_APP_DIRS and (REPO / "worker_image" / rel).exists()


def test_there_are_worker_image_examples() -> None:
    assert len([j for _, j in _examples() if _is_worker_image(j)]) >= 3


def _is_worker_image(job: dict[str, Any]) -> bool:
    image = str(job["spec"]["worker"]["image"])
    return image.rsplit(":", 1)[0].rsplit("/", 1)[-1] == "elastra-worker"


@pytest.mark.parametrize("name, job", _examples(), ids=[n for n, _ in _examples()])
def test_example_runs_a_command_its_image_holds(name: str, job: dict[str, Any]) -> None:
    if not _is_worker_image(job):
        pytest.skip(f"{name} names its own image")
    assert problems_of(job["spec"]["worker"]) == []


def test_the_example_check_finds_missing_commands() -> None:
    bad = {
        "command": ["elastra-worker", "run", "--"],
        "args": ["python3", "-m", "elastra_worker.nope", "/opt/elastra/examples/torchrun_ddp.py"],
    }
    assert len(problems_of(bad)) == 4
    good = {
        "command": ["python3", "-m", "elastra_worker.cli", "run", "--"],
        "args": ["python3", "/opt/elastra/examples/train_tiny_gpt.py"],
    }
    assert problems_of(good) == []


def _touch(path: Path, mtime: float, *, folder: bool = False) -> None:
    if folder:
        path.mkdir()
    else:
        path.write_text("x")
    os.utime(path, (mtime, mtime))


def test_prune_keeps_the_entry_in_use_and_the_newest_other(tmp_path: Path) -> None:
    keys = {"0" * 12: 100.0, "1" * 12: 300.0, "2" * 12: 200.0, "3" * 12: 50.0}
    for key, mtime in keys.items():
        _touch(tmp_path / f"worker-site-{key}.tar", mtime)
        _touch(tmp_path / f"worker-site-{key}.json", mtime)
    _touch(tmp_path / f"worker-site-{'3' * 12}.work", 60.0, folder=True)
    others = [tmp_path / "worker-app-aaaaaaaaaaaa.tar", tmp_path / "worker-site-notakey.tar"]
    for path in others:
        _touch(path, 1.0)

    gone = build.prune(tmp_path, "worker-site", "3" * 12)

    left = sorted(p.name for p in tmp_path.iterdir())
    assert {p.name for p in gone} == {
        f"worker-site-{k * 12}{ext}" for k in "02" for ext in (".tar", ".json")
    }
    assert left == sorted(
        [p.name for p in others]
        + [f"worker-site-{k * 12}{ext}" for k in "13" for ext in (".tar", ".json")]
        + [f"worker-site-{'3' * 12}.work"]
    )
    # the entry in use is marked used now: the next prune for key 1 keeps it
    assert build.prune(tmp_path, "worker-site", "1" * 12) == []


def test_prune_matches_whole_names(tmp_path: Path) -> None:
    _touch(tmp_path / "worker-aaaaaaaaaaaa", 10.0, folder=True)
    _touch(tmp_path / "worker-bbbbbbbbbbbb", 20.0, folder=True)
    _touch(tmp_path / "worker-app-cccccccccccc.tar", 5.0)
    assert build.prune(tmp_path, "worker", "d" * 12) == [tmp_path / "worker-aaaaaaaaaaaa"]
    assert (tmp_path / "worker-app-cccccccccccc.tar").exists()


MEDIA = "application/vnd.docker.distribution.manifest.v2+json"
CTR_LS = "\n".join(
    f"{ref} {MEDIA} {digest} 1GiB linux/amd64 -"
    for ref, digest in [
        ("REF TYPE", "DIGEST SIZE PLATFORMS LABELS"),
        ("elastra.local/elastra-worker:dev", "sha256:new"),
        ("elastra.local/elastra-worker@sha256:new", "sha256:new"),
        ("elastra.local/elastra-worker@sha256:old", "sha256:old"),
        ("sha256:cfgnew", "sha256:new"),
        ("sha256:cfgold", "sha256:old"),
        ("elastra.local/pause:1.0", "sha256:p"),
    ]
)


@pytest.mark.parametrize(
    "listing, orphans",
    [
        (CTR_LS, ["elastra.local/elastra-worker@sha256:old", "sha256:cfgold"]),
        ("REF TYPE DIGEST SIZE PLATFORMS LABELS\n", []),
        ("", []),
    ],
    ids=["replaced-build", "empty-store", "no-output"],
)
def test_orphan_refs_are_the_names_of_replaced_builds(listing: str, orphans: list[str]) -> None:
    assert build.orphan_refs(listing) == orphans
