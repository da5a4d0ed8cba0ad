"""Kubeconfig files and an exec plugin, written by tests into their tmp_path."""

from __future__ import annotations

import base64
import stat
import sys
from pathlib import Path
from typing import Any

import yaml

PLUGIN_SOURCE = Path(__file__).with_name("plugin.py")


def kubeconfig(
    path: Path,
    *,
    clusters: dict[str, str] | None = None,
    users: dict[str, dict[str, Any]] | None = None,
    contexts: dict[str, dict[str, str]] | None = None,
    current: str | None = None,
) -> Path:
    """Write a kubeconfig; ``clusters`` maps names to servers."""
    config: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": n, "cluster": {"server": s}} for n, s in (clusters or {}).items()],
        "users": [{"name": n, "user": u} for n, u in (users or {}).items()],
        "contexts": [{"name": n, "context": c} for n, c in (contexts or {}).items()],
    }
    if current is not None:
        config["current-context"] = current
    path.write_text(yaml.safe_dump(config))
    return path


def plugin(directory: Path) -> Path:
    """The fake plugin as an executable script run by this test's Python."""
    script = directory / "fake-plugin"
    script.write_text(f"#!{sys.executable}\n" + PLUGIN_SOURCE.read_text())
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
