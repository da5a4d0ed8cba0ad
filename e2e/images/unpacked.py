"""Where a containerd keeps an image's unpacked layers: one directory per layer.

Why: the same worker image is unpacked by every kind node that runs pods, 5.9 GiB each, all
on this machine's disk. Knowing which directory holds which layer lets later copies become
hard links to the first (e2e/kind/hardlinks.py).
The directories are asked of containerd (a read-only view of the image's top snapshot lists
them), not guessed from its store's layout.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from typing import Any


def chain_ids(diff_ids: list[str]) -> list[str]:
    """Each layer's ChainID (OCI image spec), lowest first: the key containerd gives the
    snapshot of the image unpacked up to that layer."""
    chain = diff_ids[:1]
    for diff_id in diff_ids[1:]:
        chain.append("sha256:" + hashlib.sha256(f"{chain[-1]} {diff_id}".encode()).hexdigest())
    return chain


def lower_dirs(mounts: list[dict[str, Any]]) -> list[str]:
    """The directories of a read-only view's mounts (``ctr snapshots view --mounts``), top
    first: overlayfs lists them in its lowerdir option, one layer is a bind mount of its own."""
    if len(mounts) != 1:
        raise ValueError(f"a view has one mount, not {len(mounts)}: {mounts}")
    (mount,) = mounts
    if mount.get("Type") == "bind":
        return [str(mount["Source"])]
    for option in mount.get("Options") or []:
        if option.startswith("lowerdir="):
            return str(option).removeprefix("lowerdir=").split(":")
    raise ValueError(f"not a read-only overlay or bind mount: {mount}")


def layer_dirs(
    ctr: list[str], diff_ids: list[str], *, env: dict[str, str] | None = None
) -> list[str]:
    """The unpacked layers of the image with these diff_ids, lowest first, as the containerd
    that ``ctr`` names sees them.

    ``ctr`` is the command up to the namespace (``ctr --address=... -n k8s.io``, or
    ``docker exec NODE ctr -n k8s.io``); the snapshotter is overlayfs. Raises
    CalledProcessError when containerd has no such snapshot.
    """
    top = chain_ids(diff_ids)[-1]
    probe = f"elastra-layers-{os.getpid()}"
    snapshots = [*ctr, "snapshots", "--snapshotter=overlayfs"]
    try:
        view = subprocess.run([*snapshots, "view", "--mounts", probe, top], env=env,
                              capture_output=True, text=True, check=True)  # fmt: skip
    finally:
        subprocess.run([*snapshots, "rm", probe], env=env, capture_output=True, check=False)
    return list(reversed(lower_dirs(json.loads(view.stdout))))
