"""Free GPUs per node during a simulation, and where a gang of pods fits.

Placement is best fit: pods go to the nodes of the type with the fewest free GPUs that still
hold a pod, several pods per node when they fit, so large gangs find whole nodes. Nodes are
kept in buckets by free GPU count, so finding room costs the number of distinct free counts
plus the nodes used, not a scan of a thousand nodes. A node that is down (failed, preempted)
is in no bucket and offers nothing until it is back.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import chain

from elastra.planner.inventory import Inventory

Placement = tuple[tuple[int, int], ...]
"""(node index, pods on that node) pairs."""


class NodePool:
    """Mutable free-GPU bookkeeping of the simulated cluster (one instance per run)."""

    def __init__(self, inventory: Inventory) -> None:
        gpu_nodes = [n for n in inventory.nodes if not n.gpu_type.is_cpu and n.free_gpus > 0]
        self.names = [n.name for n in gpu_nodes]
        self.type_of = [n.gpu_type.name for n in gpu_nodes]
        self.capacity = [n.free_gpus for n in gpu_nodes]
        self.free = list(self.capacity)
        self.up = [True] * len(gpu_nodes)
        self.total = sum(self.capacity)
        self.free_by_type: dict[str, int] = {}
        self.total_by_type: dict[str, int] = {}
        self._buckets: dict[str, list[set[int]]] = {}
        for index, (kind, gpus) in enumerate(zip(self.type_of, self.capacity, strict=True)):
            self.total_by_type[kind] = self.total_by_type.get(kind, 0) + gpus
            self.free_by_type[kind] = self.free_by_type.get(kind, 0) + gpus
            levels = self._buckets.setdefault(kind, [])
            while len(levels) <= gpus:
                levels.append(set())
            levels[gpus].add(index)

    @property
    def free_total(self) -> int:
        """Free GPUs on nodes that are up."""
        return sum(self.free_by_type.values())

    def place(
        self, gpu_type: str, pod_gpus: int, pods: int, *, extra: Mapping[int, int] | None = None
    ) -> Placement | None:
        """Where ``pods`` pods of ``pod_gpus`` fit (best fit), or None. Changes nothing.

        ``extra`` adds GPUs that would be freed (node -> GPUs), for what-if questions.
        """
        if pods <= 0:
            return ()
        extra = extra or {}
        available = self.free_by_type.get(gpu_type, 0) + sum(extra.values())
        if available < pod_gpus * pods:
            return None
        levels = self._buckets.get(gpu_type, [])
        boosted: dict[int, list[int]] = {}
        for node, more in extra.items():
            if self.up[node]:
                boosted.setdefault(self.free[node] + more, []).append(node)
        chosen: list[tuple[int, int]] = []
        left = pods
        top = max(len(levels) - 1, max(boosted, default=0))
        for level in range(pod_gpus, top + 1):
            # Set iteration order is deterministic for the same operations: runs repeat.
            here = levels[level] if level < len(levels) else ()
            for node in chain((n for n in here if n not in extra), boosted.get(level, ())):
                take = min(level // pod_gpus, left)
                chosen.append((node, take))
                left -= take
                if left == 0:
                    return tuple(chosen)
        return None

    def room(self, gpu_type: str, pod_gpus: int) -> int:
        """How many pods of ``pod_gpus`` the free GPUs of ``gpu_type`` hold now."""
        levels = self._buckets.get(gpu_type, [])
        return sum(
            len(levels[level]) * (level // pod_gpus) for level in range(pod_gpus, len(levels))
        )

    def take(self, node: int, gpus: int) -> None:
        """Mark ``gpus`` GPUs of ``node`` used."""
        self._move(node, self.free[node] - gpus)

    def give(self, node: int, gpus: int) -> None:
        """Mark ``gpus`` GPUs of ``node`` free again."""
        self._move(node, self.free[node] + gpus)

    def set_up(self, node: int, up: bool) -> None:
        """Take a node out of (or back into) service; its free GPUs follow."""
        if self.up[node] == up:
            return
        kind = self.type_of[node]
        if up:
            self.up[node] = True
            self._buckets[kind][self.free[node]].add(node)
            self.free_by_type[kind] += self.free[node]
        else:
            self._buckets[kind][self.free[node]].discard(node)
            self.free_by_type[kind] -= self.free[node]
            self.up[node] = False

    def _move(self, node: int, free: int) -> None:
        if not 0 <= free <= self.capacity[node]:
            raise ValueError(f"node {self.names[node]}: {free} free GPUs is impossible")
        kind = self.type_of[node]
        if self.up[node]:
            self._buckets[kind][self.free[node]].discard(node)
            self._buckets[kind][free].add(node)
            self.free_by_type[kind] += free - self.free[node]
        self.free[node] = free
