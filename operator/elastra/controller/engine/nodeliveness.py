"""The operator's task that declares a node lost from its Lease and its workers' heartbeats.

The rule is ``elastra.elastic.liveness``'s; this module feeds it. Once a second it reads the
node Leases (an informer over ``kube-node-lease``), notes when it saw each one renewed (its
own clock, so a node whose clock is off is judged as fairly as the others), asks the worker
pods of every node whose Lease is overdue for a heartbeat (the agent's metrics page, any HTTP
answer counts), and applies the verdict: a lost node is read as NotReady by every pass
(``ClusterSnapshot.declare_unresponsive``), its jobs are woken, and a Warning Event
``NodeUnresponsive`` on the Node says why. A node whose Lease is renewed again is read as it
is at once. Only the leader asks and declares; every operator keeps its Lease times.

Worker pods on nodes labelled with one of ``settings.skip_metrics_labels`` (kwok's simulated
nodes, whose pod addresses belong to nobody) are never asked, so such a node is never declared
lost here: the node controller's condition decides, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import aiohttp

from elastra.controller.decide.manifests import LABEL_JOB
from elastra.controller.decide.observe import simulated
from elastra.controller.decide.passplan import EventType
from elastra.controller.engine.leader import LeaderElector
from elastra.controller.engine.reconcile import utc_now
from elastra.controller.engine.snapshot import ClusterSnapshot
from elastra.controller.settings import OperatorSettings
from elastra.elastic.liveness import (
    NODE_UNRESPONSIVE,
    PROBE_INTERVAL,
    PROBE_TIMEOUT,
    NodeSignals,
    lease_overdue,
    node_lost,
    silence,
)
from elastra.kube import events, resources
from elastra.kube.client import ApiError, JsonDict, Kube
from elastra.kube.informer import Informer

log = logging.getLogger("elastra.operator")

Probe = Callable[[str], Awaitable[bool]]
"""Asks one worker address (``ip:port``) for a heartbeat: True if it answered."""


def slim_lease(lease: JsonDict) -> JsonDict:
    """What the Leases cache keeps: the node's name, the renewal and its duration."""
    spec = lease.get("spec") or {}
    meta = lease.get("metadata") or {}
    return {
        "metadata": {k: meta[k] for k in ("name", "namespace", "resourceVersion") if k in meta},
        "spec": {k: spec[k] for k in ("renewTime", "leaseDurationSeconds") if k in spec},
    }


def workers_by_node(
    pods: Iterable[Mapping[str, Any]], nodes: Iterable[Mapping[str, Any]], skip: Sequence[str]
) -> dict[str, list[str]]:
    """Node -> the pod IPs of the Running worker pods on it, nodes with a skip label left out."""
    skipped = {str((n.get("metadata") or {}).get("name")) for n in nodes if simulated(n, skip)}
    found: dict[str, list[str]] = {}
    for pod in pods:
        meta, spec, status = (
            pod.get("metadata") or {},
            pod.get("spec") or {},
            pod.get("status") or {},
        )
        node, ip = spec.get("nodeName"), status.get("podIP")
        if not (meta.get("labels") or {}).get(LABEL_JOB) or not node or not ip:
            continue
        if status.get("phase") != "Running" or meta.get("deletionTimestamp") or node in skipped:
            continue
        found.setdefault(str(node), []).append(str(ip))
    return found


@dataclass
class _Seen:
    """One node's Lease as this operator saw it."""

    renew_time: str
    seen: datetime
    """When this operator first saw ``renew_time`` (its own clock)."""
    duration: timedelta | None
    silent_since: datetime | None = None


@dataclass
class NodeLiveness:
    """Declares nodes lost (see the module doc); ``run`` is the operator's task."""

    kube: Kube
    snapshot: ClusterSnapshot
    leader: LeaderElector
    settings: OperatorSettings
    leases: Informer
    wake_jobs: Callable[[], None]
    probe: Probe | None = None
    """Ask a worker (tests give their own); ``None``: an HTTP GET of its metrics page."""
    clock: Callable[[], datetime] = utc_now
    _seen: dict[str, _Seen] = field(default_factory=dict)
    _session: aiohttp.ClientSession | None = None

    @classmethod
    def watching(
        cls,
        kube: Kube,
        snapshot: ClusterSnapshot,
        *,
        leader: LeaderElector,
        settings: OperatorSettings,
        wake_jobs: Callable[[], None],
    ) -> NodeLiveness:
        """The task over an informer of every node's Lease."""
        leases = resources.node_leases_informer(
            kube, slim_lease, watch_timeout_s=settings.watch_timeout.total_seconds()
        )
        return cls(kube, snapshot, leader, settings, leases, wake_jobs)

    async def run(self) -> None:
        """Follow the Leases, and judge the nodes once per ``PROBE_INTERVAL``."""
        watching = asyncio.create_task(self.leases.run(), name="informer node leases")
        try:
            await self.leases.wait_synced()
            await self.snapshot.wait_synced()
            while True:
                await self.tick()
                await asyncio.sleep(PROBE_INTERVAL.total_seconds())
        finally:
            watching.cancel()
            if self._session is not None:
                await self._session.close()

    async def tick(self) -> list[str]:
        """One round: note renewals, ask the workers of overdue nodes, apply the verdicts;
        returns the nodes declared lost in this round."""
        now = self.clock()
        self._note_renewals(now)
        if not self.leader.leading:
            return []
        suspects: list[str] = []
        for node, seen in self._seen.items():
            if not lease_overdue(NodeSignals(seen.seen, seen.duration), now):
                seen.silent_since = None
                if self.snapshot.clear_unresponsive(node):
                    log.info("node %s renews its Lease again: read as it is", node)
                    self.wake_jobs()
            elif node not in self.snapshot.unresponsive_nodes:
                suspects.append(node)
        if not suspects:  # the usual round: no pod is looked at
            return []
        workers = workers_by_node(
            self.snapshot.pods.items(),
            self.snapshot.nodes.items(),
            self.settings.skip_metrics_labels,
        )
        overdue = {node: workers[node] for node in suspects if workers.get(node)}
        answers = await asyncio.gather(*(self._any_answers(a) for a in overdue.values()))
        declared = [
            node
            for (node, addresses), answered in zip(overdue.items(), answers, strict=True)
            if self._judge(node, len(addresses), answered=answered, probed_at=now)
        ]
        if declared:
            self.wake_jobs()
            for node in declared:
                await self._record(node)
        return declared

    def _judge(self, node: str, workers: int, *, answered: bool, probed_at: datetime) -> bool:
        """Apply one round's answer to the node's silence; True if it is declared lost now."""
        seen = self._seen[node]
        seen.silent_since = silence(seen.silent_since, answered=answered, probed_at=probed_at)
        signals = NodeSignals(seen.seen, seen.duration, workers, seen.silent_since)
        lost = node_lost(node, signals, self.clock())
        if lost is None or not self.snapshot.declare_unresponsive(node, lost.message):
            return False
        log.warning("%s", lost.message)
        return True

    def _note_renewals(self, now: datetime) -> None:
        current: dict[str, _Seen] = {}
        for lease in self.leases.items():
            name = str(lease["metadata"].get("name") or "")
            spec = lease.get("spec") or {}
            renew = str(spec.get("renewTime") or "")
            if not name or not renew:
                continue
            seconds = spec.get("leaseDurationSeconds")
            duration = timedelta(seconds=int(seconds)) if isinstance(seconds, int) else None
            was = self._seen.get(name)
            if was is not None and was.renew_time == renew:
                was.duration = duration
                current[name] = was
            else:
                current[name] = _Seen(renew, now, duration)
        for gone in set(self._seen) - set(current):
            if self.snapshot.clear_unresponsive(gone):
                self.wake_jobs()
        self._seen = current

    async def _any_answers(self, addresses: Sequence[str]) -> bool:
        port = self.settings.metrics_port
        probe = self.probe or self._http_probe
        answers = await asyncio.gather(*(probe(f"{ip}:{port}") for ip in addresses))
        return any(answers)

    async def _http_probe(self, address: str) -> bool:
        if self._session is None:
            timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT.total_seconds())
            self._session = aiohttp.ClientSession(timeout=timeout)
        try:
            async with self._session.get(f"http://{address}/metrics") as reply:
                return reply.status > 0
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    async def _record(self, node: str) -> None:
        why = self.snapshot.unresponsive_nodes.get(node, "")
        with contextlib.suppress(ApiError):
            await events.record_node_event(
                self.kube, node, kind=EventType.WARNING, reason=NODE_UNRESPONSIVE, message=why
            )
