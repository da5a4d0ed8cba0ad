"""What a job's pass may plan with: the capacity every other pod leaves on the nodes its
worker pods may use.

Every job's pass asks this of the same listing, so when ``nodes`` and ``pods`` are tuples
(immutable: the snapshot's listings) the parsed nodes and the usage of the listed pods are
computed once per listing (``memo.LastOf``) and each pass only subtracts its own job's share:
on a cluster of a thousand nodes and thousands of pods, parsing them per pass was most of the
operator's CPU. That cache is why this lives apart from ``planning``, which is pure.

A pass that names its job's pod constraints (``manifests.worker_constraints``) gets only the
nodes those pods may use (``planner.eligibility``): the scheduler's placement filters are
judged once per node listing and set of constraints, the nodes' room once per listing and
constraints, so jobs that share constraints (most do) share the work, and a pass again only
adjusts the nodes its own pods and the reservations touch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from elastra.controller.decide.manifests import ANNOTATION_NODE, LABEL_JOB
from elastra.controller.decide.memo import LastOf, LastOfAll, PerKeyOf, PerObject
from elastra.controller.decide.placeholders import requester
from elastra.errors import UserError
from elastra.planner import Inventory, parse_inventory
from elastra.planner.eligibility import fitted, refused
from elastra.planner.inventory import ExcludedNode, NodeCapacity, NodeName, NodeNote
from elastra.planner.resources import NOTHING, Resources, held_by, total
from elastra.planner.scheduling import PodConstraints

JsonDict = Mapping[str, Any]


def cluster_inventory(
    nodes: Sequence[JsonDict],
    pods: Sequence[JsonDict],
    *,
    own_job: str | None = None,
    extra: Sequence[JsonDict] = (),
    pod: PodConstraints | None = None,
) -> Inventory:
    """Capacity left by every pod except ``own_job``'s (``namespace/name``), counting pods not
    yet bound, on the
    nodes a pod with constraints ``pod`` may use (every Ready node when ``None``).

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
    view = left
    if pod is not None:
        view = _VIEWS.get(
            (left,), pod, lambda: _Left.eligible(left, pod, refusals=_refusals(base, pod))
        )
    changes = _changes(usage, own_job=own_job, extra=extra)
    if not changes:
        return view.inventory
    adjusted = list(view.inventory.nodes)
    for name, change in changes.items():
        at = view.index.get(name)
        if at is not None:
            node = base.nodes[left.index[name]].holding(usage.per_node.get(name, NOTHING) + change)
            adjusted[at] = node if pod is None else fitted(pod, node)
    return dataclasses.replace(view.inventory, nodes=tuple(adjusted))


@dataclass(frozen=True)
class _Left:
    """Capacity on the nodes of one view (all, or one job's), and where each node is in it."""

    inventory: Inventory
    index: Mapping[str, int]

    @classmethod
    def of(cls, base: Inventory, usage: _Usage) -> _Left:
        """What every listed pod leaves of every parsed node."""
        nodes = tuple(_holding(n, usage.per_node.get(n.name)) for n in base.nodes)
        return cls(
            inventory=dataclasses.replace(base, nodes=nodes),
            index={n.name: i for i, n in enumerate(base.nodes)},
        )

    @classmethod
    def eligible(cls, left: _Left, pod: PodConstraints, *, refusals: Sequence[str]) -> _Left:
        """``left`` on the nodes ``pod`` may use (``refusals`` per node, in order), fitted."""
        nodes: list[NodeCapacity] = []
        excluded = list(left.inventory.excluded)
        for node, reason in zip(left.inventory.nodes, refusals, strict=True):
            if reason:
                excluded.append(ExcludedNode(node.name, reason))
            else:
                nodes.append(fitted(pod, node))
        return cls(
            inventory=dataclasses.replace(
                left.inventory,
                nodes=tuple(nodes),
                excluded=tuple(sorted(excluded, key=lambda n: n.name)),
            ),
            index={n.name: i for i, n in enumerate(nodes)},
        )


def _refusals(base: Inventory, pod: PodConstraints) -> tuple[str, ...]:
    """Why the scheduler's placement filters refuse each parsed node (in order; "" where
    they pass): judged once per node listing and placement, whatever the requests."""
    placement = pod.placement()
    return _REFUSALS.get(
        (base,), placement, lambda: tuple(refused(placement, n) for n in base.nodes)
    )


def _holding(node: NodeCapacity, used: Resources | None) -> NodeCapacity:
    return node.holding(used) if used else node


def _changes(
    usage: _Usage, *, own_job: str | None, extra: Sequence[JsonDict]
) -> dict[str, Resources]:
    """What to add per node to the listed pods' usage: ``own_job``'s pods given back
    (negative), ``extra`` (reservations of other jobs) taken."""
    changes: dict[str, Resources] = {}
    own = usage.by_job.get(own_job, {}) if own_job else {}
    for node, held in own.items():
        changes[node] = NOTHING - held
    for pod, (node, held) in zip(extra, _EXTRA_USAGE.map(extra), strict=True):
        if not node or (own_job and _job_of(pod) == own_job):
            continue
        changes[node] = changes.get(node, NOTHING) + held
    return changes


@dataclass(frozen=True)
class _Usage:
    """What the listed pods hold per node (``pods`` included), in all and per Elastra job."""

    per_node: Mapping[str, Resources]
    by_job: Mapping[str, Mapping[str, Resources]]


def node_inventory(nodes: Sequence[JsonDict]) -> Inventory:
    """Every listed node parsed, before any pod: the Ready nodes' capacity and why the others
    are left out (once per listing, the same parse every pass shares)."""
    return _NODES.get(nodes, _parse_nodes)


def _parse_nodes(nodes: Sequence[JsonDict]) -> Inventory:
    # Items of a list response carry no ``kind``; the planner's parser wants one.
    node_list = [{**node, "kind": "Node"} for node in nodes]
    try:
        return parse_inventory(node_list)
    except UserError:
        return _inventory_node_by_node(node_list)


def _usage_by_job(pods: Sequence[JsonDict]) -> _Usage:
    per_node: dict[str, list[Resources]] = {}
    by_job: dict[str, dict[str, list[Resources]]] = {}
    for node, held, job in _POD_USAGE.map(pods):
        if not node:
            continue
        per_node.setdefault(node, []).append(held)
        if job:
            by_job.setdefault(job, {}).setdefault(node, []).append(held)
    return _Usage(
        per_node={node: total(parts) for node, parts in per_node.items()},
        by_job={
            job: {node: total(parts) for node, parts in nodes.items()}
            for job, nodes in by_job.items()
        },
    )


def _usage_of(pod: JsonDict) -> tuple[str, Resources]:
    """A pod's node and what it holds there, with a gated pod counted on its planned node."""
    try:
        return held_by(_as_bound(pod))
    except UserError:
        return "", NOTHING  # a pod with an unreadable quantity: the scheduler rejects it too


def _held_by(pod: JsonDict) -> tuple[str, Resources, str]:
    """``_usage_of`` and the Elastra job that may plan with it again ("" for none).

    A job's own pods are capacity it may plan with again, except pods being deleted: they
    hold their node's CPU and GPUs until they are gone, so the scheduler would refuse their
    replacements (a grown world then retried forever, "Insufficient cpu"). So are the nodes
    its capacity-request pods hold (``placeholders``): they were asked for it."""
    deleting = (pod.get("metadata") or {}).get("deletionTimestamp")
    return (*_usage_of(pod), "" if deleting else _job_of(pod))


def _job_of(pod: JsonDict) -> str:
    """``namespace/name`` of the Elastra job a pod works or asks for ("" for none): job names
    are unique only within a namespace, so two jobs of one name never share capacity."""
    job = _labels(pod).get(LABEL_JOB) or requester(pod)
    if not job:
        return ""
    return f"{(pod.get('metadata') or {}).get('namespace', '')}/{job}"


_NODES: LastOf[Sequence[JsonDict], Inventory] = LastOf()
_USAGE: LastOf[Sequence[JsonDict], _Usage] = LastOf()
_POD_USAGE: PerObject[JsonDict, tuple[str, Resources, str]] = PerObject(_held_by)
"""A new listing mostly holds the pods of the last one: each pod is read once, not per pass."""
_EXTRA_USAGE: PerObject[JsonDict, tuple[str, Resources]] = PerObject(_usage_of)
"""The same for the reservations, which every pass reads and which change slowly."""
_LEFT: LastOfAll[_Left] = LastOfAll()
_REFUSALS: PerKeyOf[PodConstraints, tuple[str, ...]] = PerKeyOf()
"""Per node listing, the placement filters' verdicts per set of constraints."""
_VIEWS: PerKeyOf[PodConstraints, _Left] = PerKeyOf()
"""Per capacity left (a node or pod listing), each set of constraints' view of it."""


def _inventory_node_by_node(nodes: Sequence[JsonDict]) -> Inventory:
    good: list[NodeCapacity] = []
    excluded: list[ExcludedNode] = []
    notes: list[NodeNote] = []
    for node in nodes:
        try:
            parsed = parse_inventory([node])
        except UserError as err:
            name = str((node.get("metadata") or {}).get("name", "?"))
            excluded.append(ExcludedNode(NodeName(name), str(err)))
            continue
        good.extend(parsed.nodes)
        excluded.extend(parsed.excluded)
        notes.extend(parsed.notes)
    return Inventory(
        nodes=tuple(sorted(good, key=lambda n: n.name)),
        excluded=tuple(sorted(excluded, key=lambda n: n.name)),
        notes=tuple(sorted(notes, key=lambda n: n.name)),
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
