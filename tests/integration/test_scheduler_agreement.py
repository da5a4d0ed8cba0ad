"""The planner and kube-scheduler agree on where a pod fits, case by case.

Why: Elastra pins each worker pod to a node the planner chose and lets the real scheduler
bind it; a node the planner counts but the scheduler refuses leaves a pod Pending, one the
scheduler accepts but the planner refuses is capacity lost. So the planner's rules
(``elastra.planner.scheduling``, ``resources``, ``eligibility``) are checked against the real
kube-scheduler: 200 seeded random cases (``scheduling_cases``), each a fresh kwok node with
its own labels, taints, cordon, allocatable and bound pods, and one unbound pod that may only
go there. The scheduler binds it or reports it Unschedulable; the planner's verdict on the
same objects, as listed from the API server (the pod as admitted, the node as the scheduler
sees it), must be the same in every case. Disagreements are printed in full.

``ELASTRA_AGREEMENT_SEEDS=1,2,3`` runs other seeds (200 cases each) for a wider search.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from e2e.cluster.api import wait_for
from e2e.cluster.components import has_condition

from elastra.planner.eligibility import fit_reason
from elastra.planner.inventory import parse_inventory
from elastra.planner.scheduling import PodConstraints
from tests.integration.conftest import LocalCluster
from tests.integration.scheduling_cases import ROLE_LABEL, RUN_LABEL, Case, cases

CASES = 200
SEEDS = tuple(int(s) for s in os.environ.get("ELASTRA_AGREEMENT_SEEDS", "31").split(","))
TRANSIENT_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
"""Taints the node lifecycle controller puts on a node until kwok reports it Ready."""


@pytest.fixture
def run(cluster: LocalCluster) -> Iterator[str]:
    """A run id for node names and labels; the run's nodes are deleted afterwards."""
    run_id = uuid.uuid4().hex[:6]
    try:
        yield run_id
    finally:
        # The deletes without kubectl's wait, then one list until none is left: `kubectl
        # delete -l` waiting deletes and then waits for each node in turn, 39 s here.
        selector = f"{RUN_LABEL}={run_id}"
        cluster.kubectl("delete", "nodes", "-l", selector, "--wait=false", check=False)
        wait_for("this run's nodes gone", lambda: not _listed(cluster, "nodes", selector),
                 timeout=60)  # fmt: skip


def _create(cluster: LocalCluster, objects: list[dict[str, Any]], *, namespace: str = "") -> None:
    where = ["-n", namespace] if namespace else []
    for start in range(0, len(objects), 100):
        batch = {"apiVersion": "v1", "kind": "List", "items": objects[start : start + 100]}
        cluster.kubectl("create", *where, "-f", "-", stdin=json.dumps(batch))


def _listed(cluster: LocalCluster, kind: str, selector: str, namespace: str = "") -> list[Any]:
    where = ["-n", namespace] if namespace else []
    return list(cluster.get(kind, *where, "-l", selector)["items"])


def _settled(node: dict[str, Any]) -> bool:
    ready = has_condition(node, "Ready")
    taints = node.get("spec", {}).get("taints") or []
    return ready and not any(t["key"] in TRANSIENT_TAINTS for t in taints)


def _verdict(pod: dict[str, Any]) -> str | None:
    """ "bound", the scheduler's Unschedulable message, or ``None`` while it decides."""
    if pod["spec"].get("nodeName"):
        return "bound"
    for condition in pod.get("status", {}).get("conditions") or []:
        if condition["type"] == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return f"Unschedulable: {condition.get('message', '')}"
    return None


def _show(case: Case, scheduler: str, planner: str, node: dict[str, Any]) -> str:
    spec = case.pod["spec"]
    return "\n".join(
        [
            f"case {case.index} ({case.node_name}): scheduler {scheduler!r}, planner "
            f"{planner or 'fits'!r}",
            f"  node labels {node['metadata'].get('labels')}",
            f"  node taints {node['spec'].get('taints')} unschedulable "
            f"{node['spec'].get('unschedulable')}",
            f"  node allocatable {node['status'].get('allocatable')}",
            f"  bound pods {[p['spec']['containers'][0]['resources'] for p in case.bound]}",
            f"  pod tolerations {spec.get('tolerations')}",
            f"  pod nodeSelector {spec.get('nodeSelector')}",
            f"  pod affinity {json.dumps(spec['affinity'])}",
            f"  pod containers {[c['resources'] for c in spec['containers']]} init "
            f"{spec.get('initContainers')}",
        ]
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_planner_fits_exactly_where_kube_scheduler_binds(
    cluster: LocalCluster, namespace: str, run: str, seed: int
) -> None:
    generated = cases(seed, CASES, run=run)
    _create(cluster, [c.node for c in generated])
    selector = f"{RUN_LABEL}={run}"
    wait_for(
        f"{CASES} case nodes Ready without not-ready taints",
        lambda: (n := _listed(cluster, "nodes", selector)) and len(n) == CASES
        and all(_settled(x) for x in n),
        timeout=120,
        interval=1.0,
    )  # fmt: skip
    bound = [p for c in generated for p in c.bound]
    _create(cluster, bound, namespace=namespace)
    wait_for(
        f"{len(bound)} bound pods Running",
        lambda: all(
            p.get("status", {}).get("phase") == "Running"
            for p in _listed(cluster, "pods", f"{ROLE_LABEL}=bound", namespace)
        ),
        timeout=120,
        interval=1.0,
    )
    _create(cluster, [c.pod for c in generated], namespace=namespace)

    def decided() -> list[dict[str, Any]] | None:
        pods = _listed(cluster, "pods", f"{ROLE_LABEL}=case", namespace)
        return pods if len(pods) == CASES and all(_verdict(p) for p in pods) else None

    pods = {p["metadata"]["name"]: p for p in wait_for("every case pod decided", decided,
                                                        timeout=180, interval=1.0)}  # fmt: skip
    nodes = {n["metadata"]["name"]: n for n in _listed(cluster, "nodes", selector)}
    inventory = parse_inventory(
        [{**n, "kind": "Node"} for n in nodes.values()],
        _listed(cluster, "pods", f"{ROLE_LABEL}=bound", namespace),
    )
    assert not inventory.excluded, f"case nodes left out of the inventory: {inventory.excluded}"
    capacity = {str(n.name): n for n in inventory.nodes}
    disagreements = []
    fits = 0
    for case in generated:
        scheduler = _verdict(pods[case.node_name]) or ""
        constraints = PodConstraints.of_pod_spec(pods[case.node_name]["spec"])
        planner = fit_reason(constraints, capacity[case.node_name])
        fits += planner == ""
        if (scheduler == "bound") != (planner == ""):
            disagreements.append(_show(case, scheduler, planner, nodes[case.node_name]))
    print(f"seed {seed}: {CASES} cases, {fits} fit, {len(disagreements)} disagreements")
    assert not disagreements, "\n".join(disagreements)
    assert 0.2 * CASES < fits < 0.8 * CASES, f"{fits} of {CASES} fit: the cases test too little"
