"""The cluster an e2e run uses: the one ELASTRA_E2E_KUBECONFIG names, or a local one it starts.

Why: the same suite runs on kind (or any cluster that can pull or load the images) and here,
where the only way to real pods is the local control plane with this machine's real node. A
cluster this run starts is stopped when the run ends, failed or not (``down`` stops exactly
the PIDs ``up`` recorded); a cluster it finds already running in the same folder is borrowed
and left running. KUBECONFIG itself is deliberately not read: a shell that sourced
``.cluster/env`` (a kwok-only cluster) must not turn `make test` into a run against it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from e2e.cluster import ClusterDirs, down, toolchain_bindir, up
from e2e.kube import Kubectl

REPO = Path(__file__).resolve().parents[1]
EXTERNAL_ENV = "ELASTRA_E2E_KUBECONFIG"
SHARED_ENV = "ELASTRA_E2E_SHARED_VOLUMES"
"""External cluster: "HOST:NODE", a folder of this machine that every node mounts at NODE
(e2e/kind/cluster.py sets it); checkpoint volumes are then static hostPath volumes there, as
on the local cluster, and the workers of a job on different nodes see the same files."""
DIR_ENV = "ELASTRA_E2E_CLUSTER_DIR"
IMAGES = ("worker", "operator")


@dataclass(frozen=True)
class SharedFolder:
    """A folder of this machine that the nodes see too: a static hostPath checkpoint volume."""

    host: Path
    """Where this machine reads it (step logs) and removes it."""
    node: Path
    """The same folder as the nodes see it: the PersistentVolume's hostPath."""


@dataclass(frozen=True)
class Target:
    kube: Kubectl
    local_root: Path | None
    """The local cluster's folder; None: external."""
    shared: SharedFolder | None
    """The root of the checkpoint volumes (a folder under local_root, or SHARED_ENV's);
    None: the cluster's default StorageClass provides the claims."""

    def volume(self, name: str) -> SharedFolder | None:
        """The checkpoint volume ``name`` under ``shared``."""
        if self.shared is None:
            return None
        return SharedFolder(self.shared.host / name, self.shared.node / name)


def shared_from_env() -> SharedFolder | None:
    value = os.environ.get(SHARED_ENV, "")
    if not value:
        return None
    host, sep, node = value.partition(":")
    if not sep or not Path(host).is_dir():
        raise SystemExit(f"{SHARED_ENV}={value}: expected HOST:NODE with HOST an existing folder")
    return SharedFolder(Path(host), Path(node))


@contextlib.contextmanager
def target_cluster(*, keep: bool = False) -> Iterator[Target]:
    """The cluster to use; ``keep`` leaves a local cluster it starts running, owned by no run."""
    external = os.environ.get(EXTERNAL_ENV)
    if external:
        path = Path(external)
        if not path.is_file():
            raise SystemExit(f"{EXTERNAL_ENV}={external}: no such kubeconfig file")
        yield Target(Kubectl(path, toolchain_bindir(build=True)), None, shared_from_env())
        return
    layout = ClusterDirs(Path(os.environ.get(DIR_ENV) or REPO / ".cluster-e2e").resolve())
    owner = "" if keep else f"pid:{os.getpid()}"
    started = up(layout, fleet=None, owner=owner, real_node=True, images=IMAGES)
    try:
        volumes = layout.root / "volumes"
        kube = Kubectl(layout.kubeconfig, toolchain_bindir(build=False))
        yield Target(kube, layout.root, SharedFolder(volumes, volumes))
    finally:
        if started and not keep:
            down(layout)
