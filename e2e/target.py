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

from e2e.cluster import Layout, down, toolchain_bindir, up
from e2e.kube import Kube

REPO = Path(__file__).resolve().parents[1]
EXTERNAL_ENV = "ELASTRA_E2E_KUBECONFIG"
DIR_ENV = "ELASTRA_E2E_CLUSTER_DIR"
IMAGES = ("worker", "operator")


@dataclass(frozen=True)
class Target:
    kube: Kube
    local_root: Path | None
    """The local cluster's folder (the checkpoint volume lives under it); None: external."""


@contextlib.contextmanager
def target_cluster(*, keep: bool = False) -> Iterator[Target]:
    """The cluster to use; ``keep`` leaves a local cluster it starts running, owned by no run."""
    external = os.environ.get(EXTERNAL_ENV)
    if external:
        path = Path(external)
        if not path.is_file():
            raise SystemExit(f"{EXTERNAL_ENV}={external}: no such kubeconfig file")
        yield Target(Kube(path, toolchain_bindir(build=True)), None)
        return
    layout = Layout(Path(os.environ.get(DIR_ENV) or REPO / ".cluster-e2e").resolve())
    owner = "" if keep else f"pid:{os.getpid()}"
    started = up(layout, fleet=None, owner=owner, real_node=True, images=IMAGES)
    try:
        yield Target(Kube(layout.kubeconfig, toolchain_bindir(build=False)), layout.root)
    finally:
        if started and not keep:
            down(layout)
