"""checkov, the scanner cluster admins run on charts, on what Elastra puts into a cluster.

Why: an admin who scans `helm template` of the chart, or the pods Elastra creates, and finds
failures nobody explained has to guess whether each is a hole or a choice. Here checkov scans
the chart as `helm template` renders it and, for each example TrainingJob, a worker pod as the
operator builds it with the job's headless Service and NetworkPolicy. Every finding left is
listed with its reason in docs/clusters.md ("Security scan"): a new finding fails, and so does
a listed one that no longer occurs (the table would mislead). checkov pins boto3, packaging
and networkx below what constraints.txt holds, so `make venv` installs it into a venv of its
own, .venv/checkov (pins in constraints-checkov.txt).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml
from e2e.cluster.controlplane import toolchain_bindir

from elastra.api import parse_trainingjob
from elastra.controller.decide.manifests import headless_service, network_policy, worker_pod
from elastra.controller.settings import OperatorSettings
from tests.unit.test_helm_chart import render

ROOT = Path(__file__).resolve().parents[2]
CHECKOV = ROOT / ".venv" / "checkov" / "bin" / "checkov"
DOC = ROOT / "docs" / "clusters.md"
SECTION = "## Security scan"
EXAMPLES = ROOT / "examples"


class Finding(NamedTuple):
    """A failed check on one kind of object: ``where`` is "chart" or "worker"."""

    check: str
    where: str
    kind: str

    @property
    def object(self) -> str:
        return f"{self.where} {self.kind}"


def listed_findings(text: str) -> dict[tuple[str, str], str]:
    """(check id, object) -> why it stays, from the table of the "Security scan" section."""
    _, found, rest = text.partition(f"\n{SECTION}")
    if not found:
        raise ValueError(f"docs/clusters.md has no section starting {SECTION!r}")
    section = rest.split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `CKV")]
    listed: dict[tuple[str, str], str] = {}
    for row in rows:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[2]:
            raise ValueError(f"expected | `CHECK` | object | why it stays |, got: {row}")
        check, obj = (re.sub(r"[`*]", "", c) for c in cells[:2])
        listed[(check, obj)] = cells[2]
    if not listed:
        raise ValueError(f"the {SECTION!r} section of docs/clusters.md lists no finding")
    return listed


def example_jobs() -> list[dict[str, Any]]:
    jobs = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        jobs += [d for d in yaml.safe_load_all(path.read_text()) if d.get("kind") == "TrainingJob"]
    return jobs


def worker_objects(body: dict[str, Any]) -> list[dict[str, Any]]:
    """A job's first worker pod with its Service and NetworkPolicy, as the operator makes them."""
    body = {**body, "metadata": {**body["metadata"], "namespace": "team-a", "uid": "u-1"}}
    job = parse_trainingjob(body)
    settings = OperatorSettings()
    gpu_types = job.spec.worker.gpu_types or ["CPU"]
    pod = worker_pod(
        job, slot=0, node="n1", gpu_type=gpu_types[0], assignment="{}", version=1,
        settings=settings,
    )  # fmt: skip
    service = headless_service(job)
    policy = network_policy(service, settings)
    assert policy is not None, "the operator makes a NetworkPolicy by default"
    return [pod, service, policy]


def checkov_report(folder: Path) -> dict[str, Any]:
    if not CHECKOV.exists():
        pytest.fail(f"{CHECKOV} is missing: `make venv` installs checkov there")
    out = subprocess.run(
        [str(CHECKOV), "--directory", str(folder), "--framework", "kubernetes",
         "--output", "json", "--skip-download"],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    if out.returncode not in (0, 1):  # 1: some check failed
        pytest.fail(f"checkov exited {out.returncode}: {out.stderr[-2000:]}")
    report: dict[str, Any] = json.loads(out.stdout)
    assert report["summary"]["parsing_errors"] == 0, report["summary"]
    return report


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    helm = toolchain_bindir(build=True) / "helm"
    folder = tmp_path_factory.mktemp("scan")
    chart = render(helm, tmp_path_factory.mktemp("render"))
    (folder / "chart.yaml").write_text(yaml.safe_dump_all(chart))
    workers = [obj for body in example_jobs() for obj in worker_objects(body)]
    (folder / "worker.yaml").write_text(yaml.safe_dump_all(workers))
    return checkov_report(folder)


def findings(results: list[dict[str, Any]]) -> set[Finding]:
    return {
        Finding(r["check_id"], Path(r["file_path"]).stem, r["resource"].split(".", 1)[0])
        for r in results
    }


def test_every_finding_is_listed_with_its_reason(report: dict[str, Any]) -> None:
    found = findings(report["results"]["failed_checks"])
    listed = listed_findings(DOC.read_text())
    names = {r["check_id"]: r["check_name"] for r in report["results"]["failed_checks"]}
    new = sorted(f"{f.check} on {f.object}: {names[f.check]}" for f in found
                 if (f.check, f.object) not in listed)  # fmt: skip
    assert new == [], f"fix these or list them with the reason in docs/clusters.md: {new}"
    gone = sorted(set(listed) - {(f.check, f.object) for f in found})
    assert gone == [], f"listed in docs/clusters.md but no longer found: remove them: {gone}"


def test_the_scan_saw_the_operator_and_every_worker_pod(report: dict[str, Any]) -> None:
    results = report["results"]
    checked = [*results["passed_checks"], *results["failed_checks"]]
    resources = {r["resource"] for r in checked}
    assert "Deployment.elastra-system.elastra" in resources
    pods = {f"Pod.team-a.{job['metadata']['name']}-w0" for job in example_jobs()}
    assert len(pods) >= 3 and pods <= resources, resources
    # The policies were matched to the pods they select: the operator's from the chart (checkov
    # names the Deployment's pod template "Pod"), each job's from the operator.
    passed = {(f.check, f.object) for f in findings(results["passed_checks"])}
    assert {("CKV2_K8S_6", "chart Pod"), ("CKV2_K8S_6", "worker Pod")} <= passed


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("# Clusters\n", "no section"),
        (f"{SECTION} (checkov)\n\nNothing left.\n", "lists no finding"),
        (f"{SECTION}\n\n| `CKV_K8S_8` | worker Pod | |\n", "why it stays"),
        (f"{SECTION}\n\n| `CKV_K8S_8` | worker Pod |\n", "why it stays"),
    ],
)
def test_a_table_without_reasons_is_refused(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        listed_findings("\n" + text)


def test_the_table_is_read_by_check_and_object() -> None:
    text = f"\n{SECTION} (checkov)\n\n| Check | Object | Why |\n|--|--|--|\n"
    text += "| `CKV_K8S_8` | worker `Pod` | a blocked collective is not a dead pod |\n"
    text += "\n## Next\n\n| `CKV_K8S_9` | worker Pod | not this section |\n"
    assert listed_findings(text) == {
        ("CKV_K8S_8", "worker Pod"): "a blocked collective is not a dead pod"
    }
