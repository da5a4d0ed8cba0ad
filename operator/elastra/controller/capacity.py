"""What a job's pass may plan with: the capacity every other pod leaves on the cluster's nodes.

Every job's pass asks this of the same listing, so when ``nodes`` and ``pods`` are tuples
(immutable: the snapshot's listings) the parsed nodes and the usage of the listed pods are
computed once per listing (``memo.LastOf``) and each pass only subtracts its own job's share:
on a cluster of a thousand nodes and thousands of pods, parsing them per pass was most of the
operator's CPU. That cache is why this lives apart from ``planning``, which is pure.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from elastra.controller.manifests import ANNOTATION_NODE, LABEL_JOB
from elastra.controller.memo import LastOf, LastOfAll, PerObject
from elastra.errors import UserError
from elastra.planner import Inventory, parse_inventory
from elastra.planner.inventory import ExcludedNode, NodeCapacity, NodeName, pod_usage

JsonDict = Mapping[str, Any]


def cluster_inventory(
    nodes: Sequence[JsonDict],
    pods: Sequence[JsonDict],
    *,
    own_job: str | None = None,
    extra: Sequence[JsonDict] = (),
) -> Inventory:
    """Capacity left by every pod except ``own_job``'s, counting pods not yet bound.

    Elastra's gated pods are not bound yet but will be: they count against the node named in
    their ``elastra.dev/node`` annotation, so two jobs never plan onto the same free GPUs.
    ``extra`` are pods being created that no listing shows yet (the operator's reservations).

    Listings passed as tuples are parsed once per listing (see the module docstring), and so
    is the capacity every listed pod leaves; a pass then only gives back its own job's pods
    and takes the reservations' (a few nodes, not the thousand). Lists, which callers may
    change, are parsed every time.
    """
    base = _NODES.get(nodes, _parse_nodes)
    usage = _USAGE.get(pods, _usage_by_job)
    left = _LEFT.get((base, usage), lambda: _Left.of(base, usage))
    changes = _changes(usage, own_job=own_job, extra=extra)
    if not changes:
        return left.inventory
    adjusted = list(left.inventory.nodes)
    for name, (gpus, cpu) in changes.items():
        at = left.index.get(name)
        if at is not None:
            adjusted[at] = _less(
                base.nodes[at], usage.gpus.get(name, 0) + gpus, usage.cpu.get(name, 0) + cpu
            )
    return Inventory(nodes=tuple(adjusted), excluded=base.excluded)


@dataclass(frozen=True)
class _Left:
    """The capacity every listed pod leaves, and where each node is in it."""

    inventory: Inventory
    index: Mapping[str, int]

    @classmethod
    def of(cls, base: Inventory, usage: _Usage) -> _Left:
        nodes = tuple(
            _less(n, usage.gpus.get(n.name, 0), usage.cpu.get(n.name, 0)) for n in base.nodes
        )
        return cls(
            inventory=Inventory(nodes=nodes, excluded=base.excluded),
            index={n.name: i for i, n in enumerate(base.nodes)},
        )


def _less(node: NodeCapacity, gpus: int, cpu: int) -> NodeCapacity:
    """``node`` with ``gpus`` GPUs and ``cpu`` millicores taken."""
    if not gpus and not cpu:
        return node
    return dataclasses.replace(
        node,
        free_gpus=max(0, node.free_gpus - gpus),
        free_cpu_millis=max(0, node.free_cpu_millis - cpu),
    )


def _changes(
    usage: _Usage, *, own_job: str | None, extra: Sequence[JsonDict]
) -> dict[str, tuple[int, int]]:
    """GPUs and CPU per node to add to the listed pods' usage: ``own_job``'s pods given back
    (negative), ``extra`` (reservations of other jobs) taken."""
    changes: dict[str, tuple[int, int]] = {}
    own = usage.by_job.get(own_job, {}) if own_job else {}
    for node, (gpus, cpu) in own.items():
        changes[node] = (-gpus, -cpu)
    for pod, (node, gpus, cpu) in zip(extra, _EXTRA_USAGE.map(extra), strict=True):
        if not node or (own_job and _labels(pod).get(LABEL_JOB) == own_job):
            continue
        before = changes.get(node, (0, 0))
        changes[node] = (before[0] + gpus, before[1] + cpu)
    return changes


@dataclass(frozen=True)
class _Usage:
    """GPUs and CPU millicores the listed pods hold per node, in all and per Elastra job."""

    gpus: Mapping[str, int]
    cpu: Mapping[str, int]
    by_job: Mapping[str, Mapping[str, tuple[int, int]]]


def _parse_nodes(nodes: Sequence[JsonDict]) -> Inventory:
    # Items of a list response carry no ``kind``; the planner's parser wants one.
    node_list = [{**node, "kind": "Node"} for node in nodes]
    try:
        return parse_inventory(node_list)
    except UserError:
        return _inventory_node_by_node(node_list)


def _usage_by_job(pods: Sequence[JsonDict]) -> _Usage:
    gpus: Counter[str] = Counter()
    cpu: Counter[str] = Counter()
    by_job: dict[str, dict[str, tuple[int, int]]] = {}
    for node, pod_gpus, pod_cpu, job in _POD_USAGE.map(pods):
        if not node:
            continue
        gpus[node] += pod_gpus
        cpu[node] += pod_cpu
        if job:
            held = by_job.setdefault(job, {})
            before = held.get(node, (0, 0))
            held[node] = (before[0] + pod_gpus, before[1] + pod_cpu)
    return _Usage(gpus=gpus, cpu=cpu, by_job=by_job)


def _usage_of(pod: JsonDict) -> tuple[str, int, int]:
    """A pod's (node, GPUs, CPU), with a gated pod counted on its planned node."""
    try:
        return pod_usage(_as_bound(pod))
    except UserError:
        return "", 0, 0  # a pod with an unreadable quantity: the scheduler rejects it too


def _held_by(pod: JsonDict) -> tuple[str, int, int, str]:
    """``_usage_of`` and the Elastra job that may plan with it again ("" for none).

    A job's own pods are capacity it may plan with again, except pods being deleted: they
    hold their node's CPU and GPUs until they are gone, so the scheduler would refuse their
    replacements (a grown world then retried forever, "Insufficient cpu")."""
    deleting = (pod.get("metadata") or {}).get("deletionTimestamp")
    job = "" if deleting else _labels(pod).get(LABEL_JOB, "")
    return (*_usage_of(pod), job)


_NODES: LastOf[Sequence[JsonDict], Inventory] = LastOf()
_USAGE: LastOf[Sequence[JsonDict], _Usage] = LastOf()
_POD_USAGE: PerObject[JsonDict, tuple[str, int, int, str]] = PerObject(_held_by)
"""A new listing mostly holds the pods of the last one: each pod is read once, not per pass."""
_EXTRA_USAGE: PerObject[JsonDict, tuple[str, int, int]] = PerObject(_usage_of)
"""The same for the reservations, which every pass reads and which change slowly."""
_LEFT: LastOfAll[_Left] = LastOfAll()


def _inventory_node_by_node(nodes: Sequence[JsonDict]) -> Inventory:
    good: list[NodeCapacity] = []
    excluded: list[ExcludedNode] = []
    for node in nodes:
        try:
            parsed = parse_inventory([node])
        except UserError as err:
            name = str((node.get("metadata") or {}).get("name", "?"))
            excluded.append(ExcludedNode(NodeName(name), str(err)))
            continue
        good.extend(parsed.nodes)
        excluded.extend(parsed.excluded)
    return Inventory(
        nodes=tuple(sorted(good, key=lambda n: n.name)),
        excluded=tuple(sorted(excluded, key=lambda n: n.name)),
    )


def _labels(pod: JsonDict) -> Mapping[str, str]:
    return (pod.get("metadata") or {}).get("labels") or {}


def _as_bound(pod: JsonDict) -> JsonDict:
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return pod
    planned = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_NODE)
    if not planned:
        return pod
    return {**pod, "spec": {**spec, "nodeName": planned}}
