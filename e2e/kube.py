"""kubectl and helm against one cluster, for the e2e suite and `make demo`.

Why: both drive a cluster they did not necessarily start (the local one with the real node,
or kind, or any cluster a kubeconfig names) exactly as a user would, with the toolchain's
kubectl and helm, and must fail with the command's own error message when a call fails.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.cluster.api import wait_for

__all__ = ["KubeError", "Kubectl", "wait_for"]


class KubeError(AssertionError):
    """A kubectl or helm command failed; the message carries its stderr."""


@dataclass(frozen=True)
class Kubectl:
    """One cluster: its kubeconfig and the folder holding kubectl and helm."""

    kubeconfig: Path
    bindir: Path

    def _run(
        self, tool: str, args: tuple[str, ...], stdin: str | None, check: bool, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bindir / tool), f"--kubeconfig={self.kubeconfig}", *args]
        try:
            out = subprocess.run(
                cmd, input=stdin, capture_output=True, text=True, check=False, timeout=timeout
            )
        except subprocess.TimeoutExpired as err:
            raise KubeError(f"{tool} {' '.join(args)} took more than {timeout:.0f}s") from err
        if check and out.returncode != 0:
            raise KubeError(f"{tool} {' '.join(args)} failed: {out.stderr.strip()[-2000:]}")
        return out

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 120
    ) -> str:
        """kubectl's stdout; raises KubeError with its stderr when it fails and check is set."""
        return self._run("kubectl", args, stdin, check, timeout).stdout

    def helm(self, *args: str, timeout: float = 600) -> str:
        return self.helm_run(*args, timeout=timeout).stdout

    def helm_run(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """helm, with its stderr too (where the API server's admission warnings show)."""
        return self._run("helm", args, None, True, timeout)

    def get(self, *args: str) -> Any:
        """kubectl get ... -o json, parsed."""
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def items(self, *args: str) -> list[dict[str, Any]]:
        """The items of a kubectl get list."""
        found: list[dict[str, Any]] = self.get(*args)["items"]
        return found

    def apply(self, manifest: dict[str, Any] | list[dict[str, Any]]) -> None:
        docs = manifest if isinstance(manifest, list) else [manifest]
        body = {"apiVersion": "v1", "kind": "List", "items": docs}
        self.kubectl("apply", "-f", "-", stdin=json.dumps(body))
