"""Rank -> pod -> node assignment for a chosen layout.

Ranks are numbered tensor-parallel rank fastest, then pipeline stage, then data-parallel
replica: ``rank = (dp_rank · pp + pp_stage) · tp + tp_rank``. Data-parallel replicas are
numbered type by type in plan order. Pod ``p`` holds ranks ``[p·g, (p+1)·g)`` for ``g`` GPUs
per pod, so a tensor-parallel group (tp divides g) never leaves a pod, hence a node.

Pods go to nodes one replica at a time (a replica spans ``tp·pp/g`` pods, or several replicas
share a pod): a replica stays in the topology block (zone, ``elastra.dev/block``) of the
previous replica while it fits, else moves to the block that fits it most tightly, and only
spills across blocks when no block can hold it whole. Guarantees: no node gets more pods than
its free slots (the caller counted them), and the result depends only on the inputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from elastra.planner.inventory import NodeCapacity, NodeName
from elastra.planner.plan import PodPlacement, RankPlacement, TypeShare

BlockKey = tuple[str, str]


def place(
    shares: Sequence[TypeShare],
    nodes_by_type: Mapping[str, Sequence[NodeCapacity]],
    *,
    slots: Mapping[NodeName, int],
    tp: int,
    pp: int,
    devices_per_pod: int,
) -> tuple[tuple[PodPlacement, ...], tuple[RankPlacement, ...]]:
    """Assign every pod and rank of a plan to a node (see the module docstring)."""
    remaining = dict(slots)
    replica_devices = tp * pp
    pods_per_unit = max(1, replica_devices // devices_per_pod)
    pods: list[PodPlacement] = []
    ranks: list[RankPlacement] = []
    for share in shares:
        nodes = nodes_by_type[share.gpu_type]
        current: BlockKey | None = None
        for _unit in range(share.pods // pods_per_unit):
            chosen, current = _take_unit(nodes, remaining, pods_per_unit, current)
            for node in chosen:
                index = len(pods)
                pods.append(PodPlacement(index, node, share.gpu_type, index * devices_per_pod))
    for pod in pods:
        for offset in range(devices_per_pod):
            rank = pod.first_rank + offset
            tp_rank = rank % tp
            stage = (rank // tp) % pp
            dp_rank = rank // replica_devices
            ranks.append(
                RankPlacement(rank, pod.node, pod.gpu_type, dp_rank, tp_rank, stage, pod.index)
            )
    return tuple(pods), tuple(ranks)


def _block(node: NodeCapacity) -> BlockKey:
    return (node.zone, node.block)


def _take_unit(
    nodes: Sequence[NodeCapacity],
    remaining: dict[NodeName, int],
    wanted: int,
    current: BlockKey | None,
) -> tuple[list[NodeName], BlockKey | None]:
    free: dict[BlockKey, int] = {}
    for node in nodes:
        free[_block(node)] = free.get(_block(node), 0) + remaining.get(node.name, 0)
    if current is not None and free.get(current, 0) >= wanted:
        order = [current]
    else:
        fitting = sorted((count, key) for key, count in free.items() if count >= wanted)
        if fitting:
            order = [fitting[0][1]]
        else:
            order = [key for _, key in sorted(((-c, k) for k, c in free.items() if c > 0))]
    chosen: list[NodeName] = []
    for key in order:
        for node in nodes:
            if _block(node) != key:
                continue
            while remaining.get(node.name, 0) > 0 and len(chosen) < wanted:
                remaining[node.name] -= 1
                chosen.append(node.name)
        if len(chosen) == wanted:
            return chosen, key
    raise AssertionError("placement asked for more pods than the counted slots")
