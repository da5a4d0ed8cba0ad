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
from elastra.controller.memo import LastOf, PerObject
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

    Listings passed as tuples are parsed once per listing (see the module docstring); lists,
    which callers may change, are parsed every time.
    """
    base = _NODES.get(nodes, _parse_nodes)
    used_gpus, used_cpu = _held(_USAGE.get(pods, _usage_by_job), own_job=own_job, extra=extra)
    return Inventory(
        nodes=tuple(
            dataclasses.replace(
                n,
                free_gpus=max(0, n.free_gpus - used_gpus.get(n.name, 0)),
                free_cpu_millis=max(0, n.free_cpu_millis - used_cpu.get(n.name, 0)),
            )
            if used_gpus.get(n.name) or used_cpu.get(n.name)
            else n
            for n in base.nodes
        ),
        excluded=base.excluded,
    )


def _held(
    usage: _Usage, *, own_job: str | None, extra: Sequence[JsonDict]
) -> tuple[dict[str, int], dict[str, int]]:
    """GPUs and CPU held per node by the listed pods and ``extra``, less ``own_job``'s."""
    used_gpus = dict(usage.gpus)
    used_cpu = dict(usage.cpu)
    own = usage.by_job.get(own_job, {}) if own_job else {}
    for node, (gpus, cpu) in own.items():
        used_gpus[node] -= gpus
        used_cpu[node] -= cpu
    for pod in extra:
        if own_job and _labels(pod).get(LABEL_JOB) == own_job:
            continue
        node, gpus, cpu = _usage_of(pod)
        if node:
            used_gpus[node] = used_gpus.get(node, 0) + gpus
            used_cpu[node] = used_cpu.get(node, 0) + cpu
    return used_gpus, used_cpu


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
    for pod, (node, pod_gpus, pod_cpu) in zip(pods, _POD_USAGE.map(pods), strict=True):
        if not node:
            continue
        gpus[node] += pod_gpus
        cpu[node] += pod_cpu
        job = _labels(pod).get(LABEL_JOB)
        # A job's own pods are capacity it may plan with again, except pods being deleted:
        # they hold their node's CPU and GPUs until they are gone, so the scheduler would
        # refuse their replacements (a grown world then retried forever, "Insufficient cpu").
        if job and not (pod.get("metadata") or {}).get("deletionTimestamp"):
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


_NODES: LastOf[Sequence[JsonDict], Inventory] = LastOf()
_USAGE: LastOf[Sequence[JsonDict], _Usage] = LastOf()
_POD_USAGE: PerObject[JsonDict, tuple[str, int, int]] = PerObject(_usage_of)
"""A new listing mostly holds the pods of the last one: their quantities are parsed once."""


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
