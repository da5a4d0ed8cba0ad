"""A real local Kubernetes control plane with kwok-simulated GPU fleets, for tests.

Why: Elastra is tested against the real API server, scheduler and controller-manager (built
from the official Go modules by e2e/toolchain/build.sh), never a mock. This package starts and
stops that cluster, generates its PKI, and turns fleet files (e2e/fleets/*.yaml) into simulated
nodes. It depends on the standard library, PyYAML and cryptography only, and never imports
the operator (`elastra`), so it can test any build of it.

    python -m e2e.cluster up [--fleet hetero-small]   # start (or find running), apply a fleet
    python -m e2e.cluster down                        # stop exactly what up started
    python -m e2e.cluster status | apply-fleet NAME | bindir
"""

from .controlplane import (
    apiserver_frozen,
    apply_fleet,
    down,
    is_up,
    status,
    toolchain_bindir,
    up,
)
from .fleet import Fleet, FleetError, NodeGroup, load_fleet
from .state import ClusterDirs, ClusterError, default_layout

__all__ = [
    "ClusterDirs",
    "ClusterError",
    "Fleet",
    "FleetError",
    "NodeGroup",
    "apiserver_frozen",
    "apply_fleet",
    "default_layout",
    "down",
    "is_up",
    "load_fleet",
    "status",
    "toolchain_bindir",
    "up",
]
