"""A Warning Event on each Node whose GPUs Elastra cannot plan with, recorded once.

A node with GPUs of no known type (no label names one the catalog has) or split into MIG
partitions is not capacity (``planner.inventory``); without a word, a cluster admin would see
GPU nodes sit idle while jobs wait. The Event goes on the Node, not on the jobs: the cause is
the node's labels or MIG layout and the fix is the admin's, ``kubectl describe node`` shows it
beside those labels, and one node would otherwise put the same Event on every waiting job.
A job's owner sees the same nodes in ``elastra status``.

Once: the operator remembers the reason it warned each node with and warns again only when
the reason changes (labels corrected to another unknown type, another MIG layout). The Event's
name is derived from the node and what it says, so an operator that restarts (or a new leader)
creates nothing while the API server keeps the Event (its event TTL, about an hour); after
that it records it once more. Only the leader warns.

A node whose labels name a GPU type its device plugin does not advertise yet
(``GPUS_NOT_ADVERTISED``) gets no Event: every GPU node that joins is in that state until its
device plugin registers, which is no news; ``elastra plan`` and ``elastra status`` list it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from elastra.controller.decide.capacity import node_inventory
from elastra.controller.decide.passplan import EventType
from elastra.controller.engine.leader import LeaderElector
from elastra.controller.engine.snapshot import ClusterSnapshot
from elastra.kube import events
from elastra.kube.client import ApiError, JsonDict, Kube
from elastra.kube.informer import key_of
from elastra.planner.inventory import MIG_PARTITIONED, UNKNOWN_GPU_TYPE, ExcludedNode

log = logging.getLogger("elastra.operator")

WARNED = frozenset({UNKNOWN_GPU_TYPE, MIG_PARTITIONED})
"""The exclusions a Node gets a Warning Event for; their category is the Event's reason."""


def to_warn(excluded: Iterable[ExcludedNode], warned: Mapping[str, str]) -> list[ExcludedNode]:
    """The nodes of ``excluded`` to warn about: left out for their GPUs, and not warned about
    with this reason yet (``warned``: node -> the reason it was warned with)."""
    return [n for n in excluded if n.category in WARNED and warned.get(n.name) != n.reason]


async def warn(kube: Kube, excluded: Iterable[ExcludedNode], *, warned: dict[str, str]) -> int:
    """Record the Warning Event of each node ``to_warn`` names; returns how many were due.
    ``warned`` learns each one recorded (or found recorded)."""
    due = to_warn(excluded, warned)
    for node in due:
        await events.record_node_event(
            kube, node.name, kind=EventType.WARNING, reason=node.category, message=node.reason
        )
        warned[node.name] = node.reason
    return len(due)


@dataclass
class NodeWarnings:
    """The operator's task that warns about nodes as the nodes informer changes them."""

    kube: Kube
    snapshot: ClusterSnapshot
    leader: LeaderElector
    warned: dict[str, str] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def listen(self) -> None:
        """Be woken by every change of a node as the planner reads it."""
        self.snapshot.nodes.listeners.append(self.on_node)

    def on_node(self, kind: str, old: JsonDict | None, new: JsonDict | None) -> None:
        """A node changed or left: a node that comes back under its name is warned again."""
        if kind == "DELETED":
            self.warned.pop(key_of(old or {})[1], None)
        self.wake.set()

    async def run(self) -> None:
        """Warn after the caches' first lists, then on node changes; a new leader catches up
        within a lease renewal."""
        await self.snapshot.wait_synced()
        while True:
            self.wake.clear()
            if self.leader.leading:
                await self._round()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.leader.renew.total_seconds())

    async def _round(self) -> None:
        excluded = node_inventory(self.snapshot.read().nodes).excluded
        try:
            await warn(self.kube, excluded, warned=self.warned)
        except ApiError as err:  # retried on the next change or renewal, never raised
            log.warning("could not record a Warning Event on a node: %s", err)
