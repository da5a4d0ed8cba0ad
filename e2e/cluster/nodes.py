"""Fake nodes on the API server: create, delete, list, wait until Ready.

Why: applying a fleet of a thousand nodes must take seconds, not minutes, and must converge:
nodes of other fleets go, missing ones are created, and the call returns only when kwok has
made every node Ready (or says how many are, and where to look, when it gives up).
"""

from __future__ import annotations

import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .api import Api, ApiStatusError, wait_for
from .components import has_condition
from .fleet import FLEET_LABEL, Fleet
from .state import ClusterError, say


def kube_version(bindir: Path) -> str:
    """The Kubernetes version the toolchain was built at (from its MANIFEST), or ''."""
    try:
        lines = (bindir.parent / "MANIFEST").read_text().splitlines()
    except FileNotFoundError:
        return ""
    return next((ln.split("=", 1)[1] for ln in lines if ln.startswith("kubernetes=")), "")


def node_ready(node: dict[str, Any]) -> bool:
    return has_condition(node, "Ready")


def list_nodes(api: Api, selector: str) -> list[dict[str, Any]]:
    query = urllib.parse.urlencode({"labelSelector": selector})
    items: list[dict[str, Any]] = api.get(f"/api/v1/nodes?{query}")["items"]
    return items


def create_nodes(api: Api, manifests: list[dict[str, Any]], existing: set[str]) -> int:
    """POST the nodes that do not exist yet, a few at a time (thousands take seconds)."""
    todo = [m for m in manifests if m["metadata"]["name"] not in existing]

    def create(node: dict[str, Any]) -> None:
        try:
            api.request("POST", "/api/v1/nodes", node)
        except ApiStatusError as err:
            if err.status != 409:
                raise ClusterError(f"creating node {node['metadata']['name']}: {err}") from None

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(create, todo))
    return len(todo)


def delete_nodes(api: Api, names: list[str]) -> None:
    """DELETE nodes a few at a time; ones already gone are fine."""

    def delete(name: str) -> None:
        try:
            api.request("DELETE", f"/api/v1/nodes/{name}")
        except ApiStatusError as err:
            if err.status != 404:
                raise ClusterError(f"deleting node {name}: {err}") from None

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(delete, names))


def sync_fleet(
    api: Api,
    fleet: Fleet,
    *,
    kubelet_version: str,
    replace: bool,
    timeout: float,
    kwok_log: Path,
) -> None:
    """Make the fake nodes match fleet (delete the others first) and wait until all are Ready."""
    wanted = {
        m["metadata"]["name"]: m for m in fleet.node_manifests(kubelet_version=kubelet_version)
    }
    stale = [
        n["metadata"]["name"]
        for n in list_nodes(api, FLEET_LABEL)
        if replace
        or n["metadata"]["name"] not in wanted
        or n["metadata"]["labels"].get(FLEET_LABEL) != fleet.name
    ]
    delete_nodes(api, stale)
    if stale:
        gone = set(stale)
        wait_for(
            f"{len(stale)} old nodes to go",
            lambda: not gone & {n["metadata"]["name"] for n in list_nodes(api, FLEET_LABEL)},
            timeout=120,
        )
    existing = {n["metadata"]["name"] for n in list_nodes(api, FLEET_LABEL)}
    created = create_nodes(api, list(wanted.values()), existing)
    say(f"  {created} nodes created, {len(stale)} removed; waiting for Ready")
    selector = f"{FLEET_LABEL}={fleet.name}"

    def all_ready() -> bool:
        nodes = list_nodes(api, selector)
        return len(nodes) == fleet.node_count and all(node_ready(n) for n in nodes)

    def not_ready() -> str:
        ready = sum(node_ready(n) for n in list_nodes(api, selector))
        return f"{ready}/{fleet.node_count} Ready (is kwok running? see {kwok_log})"

    wait_for(
        f"fleet {fleet.name} to be Ready",
        all_ready,
        timeout=timeout,
        interval=0.25,
        hint=not_ready,
    )
