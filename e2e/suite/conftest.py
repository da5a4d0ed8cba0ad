"""Fixtures of the e2e suite: a cluster with real pods, Elastra installed with Helm, the job.

Why one session-wide install: bringing up the cluster, importing the 5 GB worker image and
starting torch in every worker pod costs minutes, so the suite's tests are the chapters of one
story (train, shrink, grow, lose a worker, lose the operator, uninstall) told in file order,
each asserting on the cluster and on what the workers recorded. Whatever happens, the fixture
removes the job, the release, the namespaces and the volume, and stops a cluster it started.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
from collections.abc import Callable, Iterator
from types import FrameType

import pytest
from e2e.elasticjob import Elastra, JobRun, example_job
from e2e.install import (
    Setup,
    checkpoint_storage,
    helm_install,
    helm_uninstall,
    restricted_namespace,
)
from e2e.kube import KubeError
from e2e.target import Target, target_cluster


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: real pods on a real cluster (e2e/suite)")
    # A CI timeout sends SIGTERM: turn it into an interrupt so that the fixtures' clean-up
    # (job, release, namespaces, and `down` of a cluster this run started) still runs.
    signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


ON_THE_CLUSTER = (
    "test_cpu_tiny.py",
    "test_gpu_check.py",
    "test_llama_3d.py",
    "test_node_lost.py",
    "test_torchrun.py",
    "test_object_storage.py",
    "test_readme_install.py",
)  # the others judge checks offline
LAST_CHAPTER = "test_helm_uninstall_leaves_nothing_behind"
AFTER_UNINSTALL = "test_readme_install.py"
"""Installs the chart itself under the README's names: after the suite's release is gone."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in ON_THE_CLUSTER:
            item.add_marker(pytest.mark.e2e)
    # Every job's chapter runs before the release is uninstalled, whatever file it is in.
    items.sort(key=lambda item: (item.path.name == AFTER_UNINSTALL, item.name == LAST_CHAPTER))


@pytest.fixture(scope="session")
def target() -> Iterator[Target]:
    with target_cluster() as found:
        yield found


@pytest.fixture(scope="session")
def elastra(target: Target) -> Iterator[Elastra]:
    kube = target.kube
    setup = Setup(volume=target.volume("cpu-tiny"))
    job = JobRun(
        kube,
        setup.job_namespace,
        example_job(setup.job_namespace)["metadata"]["name"],
        operator=setup.operator,
    )
    state = Elastra(kube, setup, job)
    try:
        for namespace in (setup.operator_namespace, setup.job_namespace):
            restricted_namespace(kube, namespace)
        checkpoint_storage(kube, setup)
        state.install_warnings = helm_install(kube, setup)
        yield state
    finally:
        cleanup(state)


def cleanup(state: Elastra) -> None:
    """Best effort, each step on its own: one failure must not keep the rest from running."""
    kube, setup = state.kube, state.setup
    steps: list[Callable[[], object]] = [
        lambda: state.job.delete(timeout=240),
        lambda: helm_uninstall(kube, setup) if state.installed else None,
        lambda: kube.kubectl("delete", "namespace", setup.job_namespace, "--ignore-not-found"),
        lambda: kube.kubectl("delete", "namespace", setup.operator_namespace, "--ignore-not-found"),
        lambda: kube.kubectl("delete", "pv", setup.volume_name, "--ignore-not-found"),
        lambda: shutil.rmtree(setup.volume.host) if setup.volume else None,
    ]
    for step in steps:
        with contextlib.suppress(KubeError, TimeoutError, OSError):
            step()
