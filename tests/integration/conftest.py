"""The real local cluster for integration tests, started once per test run.

Why: integration tests must talk to a real API server, scheduler and controller-manager (no
mocks). The session fixture `cluster` starts the e2e/cluster control plane with the
hetero-small fleet, or reuses the one already running in the same cluster folder
(`make cluster-up`), or uses the cluster that ELASTRA_TEST_KUBECONFIG points at (which must
already have the CRDs and a hetero-small fleet). It stops only what it started.

The toolchain (a 20-30 minute build on a cold 2-core machine) is built while tests are being
collected, outside any per-test timeout; `make test` builds it even earlier.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from e2e.cluster import default_layout, down, up
from e2e.cluster.api import wait_for
from e2e.cluster.controlplane import orphaned, toolchain_bindir

FLEET = "hetero-small"
FAKE_NODE_TOLERATION = {
    "key": "kwok.x-k8s.io/node",
    "operator": "Equal",
    "value": "fake",
    "effect": "NoSchedule",
}


@dataclass(frozen=True)
class LocalCluster:
    """How tests reach the cluster: a kubeconfig and the toolchain's kubectl."""

    kubeconfig: Path
    bindir: Path

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against the test cluster; raise with its stderr when check fails."""
        cmd = [str(self.bindir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args]
        out = subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=False)
        if check and out.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {out.stderr.strip()}")
        return out

    def get(self, *args: str) -> Any:
        """kubectl get ... -o json, parsed."""
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def apply(self, manifest: dict[str, Any], *, namespace: str | None = None) -> None:
        ns = [f"--namespace={namespace}"] if namespace else []
        self.kubectl("apply", *ns, "-f", "-", stdin=json.dumps(manifest))

    def api_client(self) -> Any:
        """A kubernetes.client.ApiClient for this cluster (the library the operator uses)."""
        from kubernetes import config  # noqa: PLC0415 - only tests that need it pay the import

        return config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(self.kubeconfig)
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test here as integration; build the toolchain before any test starts."""
    here = Path(__file__).parent
    selected = [item for item in items if here in Path(str(item.path)).parents]
    for item in selected:
        item.add_marker(pytest.mark.integration)
    if selected and not os.environ.get("ELASTRA_TEST_KUBECONFIG"):
        toolchain_bindir(build=True)


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    external = os.environ.get("ELASTRA_TEST_KUBECONFIG")
    if external:
        yield LocalCluster(kubeconfig=Path(external), bindir=toolchain_bindir(build=True))
        return
    layout = default_layout()
    # A cluster left behind by a killed test run is adopted (and stopped at the end); one that
    # a person started with `make cluster-up`, or another live run, is only borrowed.
    adopted = orphaned(layout)
    started = up(layout, fleet=FLEET, owner=f"pid:{os.getpid()}") or adopted
    try:
        yield LocalCluster(kubeconfig=layout.kubeconfig, bindir=toolchain_bindir(build=False))
    finally:
        if started:
            down(layout)


@contextlib.contextmanager
def fresh_namespace(cluster: LocalCluster) -> Iterator[str]:
    """A new namespace with its default service account (pods need it), deleted afterwards."""
    name = f"it-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    wait_for(
        f"service account default in {name}",
        lambda: (
            cluster.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode
            == 0
        ),
        timeout=30,
    )
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def namespace(cluster: LocalCluster) -> Iterator[str]:
    with fresh_namespace(cluster) as name:
        yield name


def gpu_pod(name: str, *, gpus: int, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A plain pod asking for GPUs that tolerates the fake-node taint."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "restartPolicy": "Never",
            "tolerations": [FAKE_NODE_TOLERATION],
            "containers": [
                {
                    "name": "worker",
                    "image": "elastra-worker:dev",
                    "resources": {
                        "limits": {"nvidia.com/gpu": str(gpus)} if gpus else {},
                        "requests": {"cpu": "1", "memory": "1Gi"},
                    },
                }
            ],
        },
    }
