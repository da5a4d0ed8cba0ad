"""Debian packages the local cluster, the real node and the image builds need on the host.

A fresh machine has none of them, and `make demo`/`make test` promise to start from nothing,
so every host tool is looked up through :func:`require`, which installs the package that
provides it first. Looking a tool up any other way (``shutil.which`` before the install) is how
`make demo` once stopped on a fresh machine with "'iptables' missing" although the install
step came a few lines later; ``tests/unit/test_hostpkgs.py`` keeps it from coming back.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

# Debian packages by the command or file that shows each is installed.
PACKAGES = {
    "containerd": "containerd",
    "runc": "runc",
    "/usr/lib/cni/bridge": "containernetworking-plugins",
    "iptables": "iptables",
    "conntrack": "conntrack",
    "socat": "socat",
    "gcc": "gcc",
    "debootstrap": "debootstrap",
}


class HostPackageError(RuntimeError):
    """A package could not be installed (no apt-get, or apt-get failed)."""


def _present(probe: str) -> str | None:
    if probe.startswith("/"):
        return probe if Path(probe).exists() else None
    return shutil.which(probe)


def ensure(*probes: str) -> None:
    """Install (apt-get) the packages of ``probes`` that are missing; all known ones if none."""
    unknown = sorted(set(probes) - set(PACKAGES))
    if unknown:
        raise KeyError(f"no Debian package known for {', '.join(unknown)}")
    wanted = probes or tuple(PACKAGES)
    missing = sorted({PACKAGES[p] for p in wanted if _present(p) is None})
    if not missing:
        return
    if shutil.which("apt-get") is None:
        raise HostPackageError(
            f"missing packages {' '.join(missing)} and no apt-get to install them"
        )
    print(f"host: installing {' '.join(missing)} (apt-get) ...", file=sys.stderr, flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    argv = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
    if subprocess.run(argv, env=env, check=False).returncode != 0:
        # A fresh machine may have no package lists yet: update once and try again.
        subprocess.run(["apt-get", "update", "-q"], env=env, check=False)
        if subprocess.run(argv, env=env, check=False).returncode != 0:
            raise HostPackageError(f"apt-get install {' '.join(missing)} failed (see above)")


def require(probe: str) -> str:
    """The path of a host tool (or file), installing its package first when it is missing."""
    ensure(probe)
    found = _present(probe)
    if found is None:
        raise HostPackageError(
            f"'{probe}' is still missing after installing {PACKAGES[probe]}: "
            f"apt-get install -y {PACKAGES[probe]} and look at its output"
        )
    return found
