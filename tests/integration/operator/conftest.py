"""The real operator, as a process, against the real local control plane.

Each test gets its own namespace and its own ``elastra run`` process watching only that
namespace, started with short resize timings so scenarios play out in seconds. The process
is real (the same entry point the Helm chart runs), so a test can kill it with SIGKILL in the
middle of a pass and start another. Its debug log is kept for the assertions on
"a pass that writes nothing" and is printed when a test fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from e2e.cluster.api import wait_for
from e2e.cluster.components import has_condition
from e2e.cluster.fleet import parse_fleet

from tests.integration.conftest import LocalCluster

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
KWOK_TOLERATION = "kwok.x-k8s.io/node=fake:NoSchedule"


@dataclass
class OperatorProcess:
    """One ``elastra run`` process and the log lines it printed."""

    cluster: LocalCluster
    namespace: str
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    """Added to the operator's environment (fault injection)."""
    process: subprocess.Popen[str] | None = None
    lines: list[str] = field(default_factory=list)

    def start(self) -> None:
        cmd = [
            sys.executable, "-m", "elastra.cli", "run",
            f"--kubeconfig={self.cluster.kubeconfig}",
            f"--namespace={self.namespace}",
            f"--lease-namespace={self.namespace}",
            f"--toleration={KWOK_TOLERATION}",
            "--metrics-port=0", "--health-port=0",
            "--resync-seconds=5", "--settle-seconds=2", "--pending-grace-seconds=10",
            "--join-timeout-seconds=20", "--cooldown-seconds=0", "--retire-timeout-seconds=10",
            "--grace-seconds=5",
            "--verbose", *self.extra_args,
        ]  # fmt: skip
        self.lines = []
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        self.process = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        threading.Thread(target=self._pump, args=(self.process,), daemon=True).start()

    def _pump(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            self.lines.append(line.rstrip())

    def kill(self) -> None:
        """SIGKILL: no cleanup, exactly like a node losing the operator pod."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def quiet_passes(self, job: str) -> int:
        """Passes over ``job`` that wrote nothing, from the debug log."""
        count = 0
        for line in list(self.lines):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("job") == f"{self.namespace}/{job}" and record.get("writes") == 0:
                count += 1
        return count


@pytest.fixture
def operator(
    cluster: LocalCluster, namespace: str, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[OperatorProcess]:
    proc = OperatorProcess(cluster, namespace)
    proc.start()
    yield proc
    proc.stop()
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        whole = tmp_path / "operator.log"
        whole.write_text("\n".join(proc.lines) + "\n")
        sys.stderr.write(f"\n--- operator log (last 80 lines; all of it: {whole}) ---\n")
        sys.stderr.write("\n".join(proc.lines[-80:]) + "\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, f"rep_{report.when}", report)


@dataclass
class Jobs:
    """Reading TrainingJobs and their pods in the test namespace."""

    cluster: LocalCluster
    namespace: str

    def apply(self, manifest: dict[str, Any]) -> None:
        self.cluster.apply(manifest, namespace=self.namespace)

    def get(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.cluster.get("trainingjob", name, "-n", self.namespace)
        return found

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.get(name).get("status") or {})

    def pods(self, name: str) -> list[dict[str, Any]]:
        listed = self.cluster.get("pods", "-n", self.namespace, "-l", f"elastra.dev/job={name}")
        return list(listed["items"])

    def wait(self, what: str, probe: Any, *, timeout: float = 90) -> Any:
        """Poll until ``probe()`` is truthy (an empty list counts as not yet)."""
        return wait_for(what, lambda: probe() or None, timeout=timeout, interval=0.5)

    def wait_phase(self, name: str, phase: str, *, timeout: float = 90) -> dict[str, Any]:
        return self.wait(  # type: ignore[no-any-return]
            f"{name} phase {phase}",
            lambda: (s := self.status(name)).get("phase") == phase and s,
            timeout=timeout,
        )

    def events(self, name: str) -> list[dict[str, Any]]:
        listed = self.cluster.get(
            "events", "-n", self.namespace,
            "--field-selector", f"involvedObject.kind=TrainingJob,involvedObject.name={name}",
        )  # fmt: skip
        return list(listed["items"])


@pytest.fixture
def jobs(cluster: LocalCluster, namespace: str) -> Jobs:
    return Jobs(cluster, namespace)


@dataclass
class NodePool:
    """Fake nodes only this test uses, removed at the end; H200 by default (not in the fleet)."""

    cluster: LocalCluster
    namespace: str
    names: list[str] = field(default_factory=list)

    def add(
        self, count: int, *, product: str = "NVIDIA-H200", gpus: int = 8, suffix: str = ""
    ) -> list[str]:
        """Create ``count`` more Ready fake nodes; returns their names.

        ``suffix`` ends their prefix: ``image-pull-fails`` makes kwok hold their pods in
        ImagePullBackOff (e2e/cluster/kwok-stages.yaml)."""
        tag = f"{self.namespace}-{len(self.names)}" + (f"-{suffix}" if suffix else "")
        fleet = parse_fleet(
            {
                "kind": "Fleet",
                "name": self.namespace,
                "groups": [
                    {
                        "prefix": tag,
                        "count": count,
                        "gpu": {"product": product, "count": gpus},
                        "cpu": "96",
                        "memory": "1Ti",
                    }
                ],
            }
        )
        manifests = fleet.node_manifests()
        for node in manifests:
            self.cluster.apply(node)
        names = [n["metadata"]["name"] for n in manifests]
        wait_for(
            f"{count} new nodes Ready",
            lambda: all(_ready(self.cluster.get("node", name)) for name in names),
            timeout=60,
        )
        self.names += names
        return names

    def remove(self, *names: str) -> None:
        self.cluster.kubectl("delete", "node", *names, "--ignore-not-found", "--wait=false")


@pytest.fixture
def pool(cluster: LocalCluster, namespace: str) -> Iterator[NodePool]:
    nodes = NodePool(cluster, namespace)
    yield nodes
    if nodes.names:
        nodes.remove(*nodes.names)


@pytest.fixture
def private_nodes(pool: NodePool) -> list[str]:
    """Three fake H200 nodes only this test uses (the shared fleet has no H200)."""
    return pool.add(3)


def _ready(node: dict[str, Any]) -> bool:
    return has_condition(node, "Ready")


def gpu_job(name: str, *, replicas: int, gpus: int = 8, **spec: Any) -> dict[str, Any]:
    """A small GPU job without a model section (pure data parallel).

    The global batch, 13440 = 2^6 * 3 * 5 * 7, divides evenly over every world size the
    scenarios form, so the planner never has to leave capacity unused for divisibility.
    Checkpoints go to a ``uri``: the API server wants shared checkpoint storage for a job of
    more than one pod, and a ``volume`` would need a PersistentVolumeClaim that exists and is
    bound, or the scheduler holds the pods Pending. Nothing reads the uri: kwok pods never run.
    """
    body: dict[str, Any] = {
        "apiVersion": "elastra.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "minReplicas": 1,
            "worker": {"gpus": gpus, "gpuTypes": ["H100"], "image": "elastra-worker:dev"},
            "training": {"globalBatchSize": 13440},
            "checkpoint": {"uri": f"s3://elastra-test/{name}"},
            "failurePolicy": {"maxRestarts": 5, "backoffSeconds": 0},
        },
    }
    body["spec"].update(spec)
    return body


def http_get(url: str) -> str | None:
    """The body at ``url``, or ``None`` when nothing answers yet."""
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            body: bytes = reply.read()
            return body.decode()
    except OSError:
        return None
