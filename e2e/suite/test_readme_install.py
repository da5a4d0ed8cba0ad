"""The README's "Install on your cluster", run as written, until the example job has finished.

Why: that section is what a platform team follows first; a flag renamed in the chart or a step
missing there is found here, not by a user. The test takes the section's ``sh`` blocks from
README.md and runs them with bash against the local cluster, with only the substitutions the
README itself names for a machine without docker: ``REG=elastra.local TAG=dev`` (what `make
images` builds and the e2e run imported into the node), the ``docker`` lines left out, and
``kubectl get tj -w`` replaced by waiting for the job to succeed. The local cluster has no
StorageClass, so a hostPath PersistentVolume stands in for one; on a cluster with a default
StorageClass (``ELASTRA_E2E_KUBECONFIG``) the claim is provisioned as the README assumes.

It runs after the suite's own release is uninstalled (conftest orders it last) because it
installs the chart under the README's names.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e.install import fresh_folder
from e2e.kube import Kubectl, KubeError, wait_for
from e2e.target import REPO, Target

pytestmark = pytest.mark.timeout(1800)

SECTION = "## Install on your cluster"
LOCAL = {"REG": "elastra.local", "TAG": "dev"}
NAMESPACE, JOB, CLAIM = "demo", "cpu-tiny", "cpu-tiny-checkpoints"
RELEASE, OPERATOR_NAMESPACE = "elastra", "elastra-system"
VOLUME = "elastra-readme-demo"
FINISH_S = 1200.0  # pod start (the 5 GB image, torch import) and 400 steps on 2 busy cores


def section_blocks(readme: str) -> list[str]:
    """The ``sh`` code blocks of the README's install section, in order."""
    start = readme.index(SECTION)
    end = readme.find("\n## ", start + len(SECTION))
    section = readme[start : end if end != -1 else None]
    return re.findall(r"```sh\n(.*?)```", section, flags=re.DOTALL)


def local_script(blocks: list[str]) -> str:
    """The blocks as one bash script for this machine (see the module docstring)."""
    kept: list[str] = []
    for line in "".join(blocks).splitlines():
        if line.startswith(("REG=", "docker ")) or line.endswith("get tj -w"):
            continue
        kept.append(line)
    return "\n".join(kept) + "\n"


def test_the_section_reads_as_this_test_expects() -> None:
    """The substitutions above still match the README (else the test below runs nothing)."""
    blocks = section_blocks((REPO / "README.md").read_text())
    assert len(blocks) == 2, blocks
    script = local_script(blocks)
    assert "helm install elastra helm/elastra" in script
    assert "$REG/elastra-worker:$TAG" in script
    assert "docker" not in script and "REG=registry" not in script


def test_install_section_runs_cpu_tiny_to_completion(readme_volume: None, target: Target) -> None:
    kube = target.kube
    assert not _release_exists(kube), "release elastra exists: the suite's uninstall failed"
    script = local_script(section_blocks((REPO / "README.md").read_text()))
    env = {
        **os.environ,
        **LOCAL,
        "KUBECONFIG": str(kube.kubeconfig),
        "PATH": f"{kube.bindir}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    ran = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, f"the README's commands failed:\n{ran.stdout}\n{ran.stderr}"
    job = wait_for(
        f"{NAMESPACE}/{JOB} to succeed",
        lambda: _finished(kube),
        timeout=FINISH_S,
        interval=5,
        hint=lambda: _describe(kube),
    )
    assert job["status"]["phase"] == "Succeeded", _describe(kube)
    pods = kube.items("pods", "-n", NAMESPACE, "-l", f"elastra.dev/job={JOB}")
    assert pods and all(p["status"]["phase"] == "Succeeded" for p in pods), _describe(kube)


@pytest.fixture
def readme_volume(target: Target) -> Iterator[None]:
    """A hostPath volume the README's claim binds to (local cluster); the clean-up after."""
    volume = target.volume(VOLUME)
    if volume is not None:
        fresh_folder(volume.host)
        target.kube.apply(_volume(volume.node))
    try:
        yield
    finally:
        _clean_up(target.kube, volume.host if volume else None)


def _volume(node_dir: Path) -> dict[str, Any]:
    """No storageClassName: binds to a claim that names none when no default class exists."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": VOLUME},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "claimRef": {"namespace": NAMESPACE, "name": CLAIM},
            "hostPath": {"path": str(node_dir), "type": "Directory"},
        },
    }


def _release_exists(kube: Kubectl) -> bool:
    try:
        kube.helm("status", RELEASE, f"--namespace={OPERATOR_NAMESPACE}")
    except KubeError:
        return False
    return True


def _finished(kube: Kubectl) -> dict[str, Any] | None:
    job: dict[str, Any] = kube.get("trainingjob", JOB, "-n", NAMESPACE)
    conditions = {c["type"]: c["status"] for c in job.get("status", {}).get("conditions", [])}
    return job if conditions.get("Succeeded") == "True" else None


def _describe(kube: Kubectl) -> str:
    try:
        status = kube.get("trainingjob", JOB, "-n", NAMESPACE).get("status", {})
        pods = kube.items("pods", "-n", NAMESPACE)
    except KubeError as err:
        return f"(cannot read the job: {err})"
    phases = [f"{p['metadata']['name']}:{p['status'].get('phase')}" for p in pods]
    return f"status={status} pods={phases}"[:4000]


def _clean_up(kube: Kubectl, host_dir: Path | None) -> None:
    """Job, release, namespace, volume: each step on its own (one failure stops nothing)."""
    steps = [
        ("delete", "trainingjob", JOB, "-n", NAMESPACE, "--ignore-not-found", "--timeout=240s"),
        ("delete", "namespace", NAMESPACE, "--ignore-not-found", "--timeout=240s"),
        ("delete", "pv", VOLUME, "--ignore-not-found"),
    ]
    for args in steps:
        with contextlib.suppress(KubeError):
            kube.kubectl(*args, timeout=300)
    if _release_exists(kube):
        with contextlib.suppress(KubeError):
            kube.helm("uninstall", RELEASE, f"--namespace={OPERATOR_NAMESPACE}", "--wait")
    if host_dir is not None:
        shutil.rmtree(host_dir, ignore_errors=True)
