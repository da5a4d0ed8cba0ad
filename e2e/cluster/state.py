"""Where a local cluster keeps its files, and what it records about itself.

Why: `up`, `down`, `status` and the test fixture may run in different processes (or after a
crash); everything they need to find and stop a cluster lives in <dir>/state.json, written
atomically, so a cluster can always be found and stopped by the PIDs it recorded.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import procs
from .api import Api
from .pki import Pki

REPO = Path(__file__).resolve().parents[2]


class ClusterError(RuntimeError):
    """Bringing the cluster up failed; the message says what and where to look."""


def say(msg: str) -> None:
    """Progress for people, on stderr (stdout stays for data such as `status`)."""
    print(f"cluster: {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class ClusterDirs:
    """Where one cluster keeps its files (default: <repo>/.cluster)."""

    root: Path

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def env(self) -> Path:
        return self.root / "env"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pki(self) -> Pki:
        return Pki(self.root / "pki")

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    def component_kubeconfig(self, name: str) -> Path:
        return self.etc / f"{name}.kubeconfig"

    def data_dir(self) -> Path:
        """etcd's data on tmpfs when /dev/shm is usable (one folder per cluster dir)."""
        tag = hashlib.sha256(str(self.root.resolve()).encode()).hexdigest()[:10]
        shm = Path("/dev/shm")
        if shm.is_dir() and os.access(shm, os.W_OK):
            return shm / f"elastra-{os.getuid()}-{tag}"
        return self.root / "data"


def default_layout() -> ClusterDirs:
    return ClusterDirs(Path(os.environ.get("ELASTRA_CLUSTER_DIR", REPO / ".cluster")).resolve())


# --- state -----------------------------------------------------------------------------------


@dataclass
class State:
    ports: dict[str, int]
    daemons: list[procs.Daemon]
    data_dir: str
    bindir: str
    fleet: str | None = None
    # Who started the cluster: "pid:<n>" of a test run that will stop it again, or "" for a
    # person (make cluster-up). A test run that died leaves an owner whose pid is gone.
    owner: str = ""
    # The real node (e2e/node) when `up --real-node` started one: name, ip, ports, its folder
    # and what it changed on the machine (routes, iptables rule, sysctls) so down can undo it.
    real_node: dict[str, Any] | None = None

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    def save(self, layout: ClusterDirs) -> None:
        body = {
            "ports": self.ports,
            "daemons": [d.to_json() for d in self.daemons],
            "data_dir": self.data_dir,
            "bindir": self.bindir,
            "fleet": self.fleet,
            "owner": self.owner,
            "real_node": self.real_node,
        }
        tmp = layout.state.with_suffix(".tmp")
        tmp.write_text(json.dumps(body, indent=2) + "\n")
        tmp.replace(layout.state)

    @staticmethod
    def load(layout: ClusterDirs) -> State | None:
        try:
            raw = json.loads(layout.state.read_text())
        except FileNotFoundError:
            return None
        return State(
            ports={str(k): int(v) for k, v in raw["ports"].items()},
            daemons=[procs.Daemon.from_json(d) for d in raw["daemons"]],
            data_dir=str(raw["data_dir"]),
            bindir=str(raw["bindir"]),
            fleet=raw.get("fleet"),
            owner=str(raw.get("owner") or ""),
            real_node=raw.get("real_node"),
        )


def admin_api(layout: ClusterDirs, state: State) -> Api:
    pki = layout.pki
    return Api(
        state.server,
        ca=pki.ca_cert,
        cert=pki.client_cert("admin"),
        key=pki.client_key("admin"),
    )
