"""The operator's task that declares a node lost from its Lease, its workers' heartbeats and
its worlds' failed collectives.

The rule is ``elastra.elastic.liveness``'s; this module feeds it. Once a second it reads the
node Leases (an informer over ``kube-node-lease``), notes when it saw each one renewed (its
own clock, so a node whose clock is off is judged as fairly as the others), and reads one
worker's metrics page per job (its sentinel: the first pod by name; when it is silent, the
first on another node too). A job whose sentinel says its world lost a member is shaken:
every node with a worker of it is asked this round, as is every node whose Lease is overdue
(each worker's page; any HTTP answer counts as a heartbeat). Then it
applies the verdict: a lost node is read as NotReady by every pass
(``ClusterSnapshot.declare_unresponsive``), its jobs are woken, and a Warning Event
``NodeUnresponsive`` on the Node says why. A declared node whose Lease is renewed after the
declaration is read as it is at once. Only the leader asks and declares; every operator keeps
its Lease times.

Worker pods on nodes labelled with one of ``settings.skip_metrics_labels`` (kwok's simulated
nodes, whose pod addresses belong to nobody) are never asked, so such a node is never declared
lost here: the node controller's condition decides, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import aiohttp

from elastra.controller.decide.manifests import LABEL_JOB
from elastra.controller.decide.observe import simulated
from elastra.controller.decide.passplan import EventType
from elastra.controller.engine.agents import AgentClient, deadline
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
    peers_lost_version,
    silence,
)
from elastra.kube import events, resources
from elastra.kube.client import ApiError, JsonDict, Kube
from elastra.kube.informer import Informer

log = logging.getLogger("elastra.operator")

MAX_PAGE_BYTES = 64 << 10
"""Read of a worker's page: the few hundred bytes of an agent's metrics, never more."""


def slim_lease(lease: JsonDict) -> JsonDict:
    """What the Leases cache keeps: the node's name, the renewal and its duration."""
    spec = lease.get("spec") or {}
    meta = lease.get("metadata") or {}
    return {
        "metadata": {k: meta[k] for k in ("name", "namespace", "resourceVersion") if k in meta},
        "spec": {k: spec[k] for k in ("renewTime", "leaseDurationSeconds") if k in spec},
    }


@dataclass(frozen=True)
class Worker:
    """A Running worker pod the operator can ask."""

    job: str
    """``namespace/name`` of its job (its label)."""
    pod: str
    ip: str
    node: str


def workers_by_node(
    pods: Iterable[Mapping[str, Any]], nodes: Iterable[Mapping[str, Any]], skip: Sequence[str]
) -> dict[str, list[Worker]]:
    """Node -> the Running worker pods on it, nodes with a skip label left out."""
    skipped = {str((n.get("metadata") or {}).get("name")) for n in nodes if simulated(n, skip)}
    found: dict[str, list[Worker]] = {}
    for pod in pods:
        meta, spec, status = (
            pod.get("metadata") or {},
            pod.get("spec") or {},
            pod.get("status") or {},
        )
        node, ip = spec.get("nodeName"), status.get("podIP")
        job = (meta.get("labels") or {}).get(LABEL_JOB)
        if not job or not node or not ip:
            continue
        if status.get("phase") != "Running" or meta.get("deletionTimestamp") or node in skipped:
            continue
        worker = Worker(f"{meta.get('namespace')}/{job}", str(meta.get("name")), str(ip), str(node))
        found.setdefault(str(node), []).append(worker)
    return found


def sentinels(workers: Mapping[str, Sequence[Worker]]) -> dict[str, list[Worker]]:
    """Job -> the workers asked every round whether its world lost a member: the first pod by
    name (the same each round), then the first on another node, asked only when the first
    is silent (its node may be the lost one)."""
    chosen: dict[str, list[Worker]] = {}
    for worker in sorted((w for on_node in workers.values() for w in on_node), key=_by_pod):
        picked = chosen.setdefault(worker.job, [])
        if not picked or (len(picked) == 1 and worker.node != picked[0].node):
            picked.append(worker)
    return chosen


def _by_pod(worker: Worker) -> str:
    return worker.pod


@dataclass
class _Seen:
    """One node's Lease as this operator saw it."""

    renew_time: str
    seen: datetime
    """When this operator first saw ``renew_time`` (its own clock)."""
    duration: timedelta | None
    silent_since: datetime | None = None
    declared: datetime | None = None
    """When this operator declared the node lost (``None``: it did not)."""


@dataclass
class _Round:
    """What one round learnt from the workers it asked."""

    pages: dict[str, str | None] = field(default_factory=dict)
    """Worker IP -> its page, ``None``: no answer."""
    broken: set[str] = field(default_factory=set)
    """Jobs a worker of which reported a failed collective (a member gone)."""

    def learn(self, worker: Worker, page: str | None) -> None:
        self.pages[worker.ip] = page
        if page is not None and peers_lost_version(page) is not None:
            self.broken.add(worker.job)


@dataclass
class NodeLiveness:
    """Declares nodes lost (see the module doc); ``run`` is the operator's task."""

    kube: Kube
    snapshot: ClusterSnapshot
    leader: LeaderElector
    settings: OperatorSettings
    leases: Informer
    wake_jobs: Callable[[], None]
    agents: AgentClient
    """Whom a worker is asked through: an HTTP GET of its metrics page."""
    clock: Callable[[], datetime] = utc_now
    _seen: dict[str, _Seen] = field(default_factory=dict)

    @classmethod
    def watching(
        cls,
        kube: Kube,
        snapshot: ClusterSnapshot,
        *,
        leader: LeaderElector,
        settings: OperatorSettings,
        wake_jobs: Callable[[], None],
        agents: AgentClient,
    ) -> NodeLiveness:
        """The task over an informer of every node's Lease."""
        leases = resources.node_leases_informer(
            kube, slim_lease, watch_timeout_s=settings.watch_timeout.total_seconds()
        )
        return cls(kube, snapshot, leader, settings, leases, wake_jobs, agents)

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

    async def tick(self) -> list[str]:
        """One round: note renewals, ask each job's sentinel worker, ask the workers of the
        suspect nodes, apply the verdicts; returns the nodes declared lost in this round."""
        now = self.clock()
        self._note_renewals(now)
        if not self.leader.leading:
            return []
        workers = workers_by_node(
            self.snapshot.pods.items(),
            self.snapshot.nodes.items(),
            self.settings.skip_metrics_labels,
        )
        self._restore_renewed()
        learnt = _Round()
        shaken = await self._shaken_jobs(workers, learnt)
        suspects = self._suspects(workers, shaken, now)
        if not suspects:  # the usual round: one page per job was read
            return []
        asked = [w for node in suspects for w in workers[node] if w.ip not in learnt.pages]
        for worker, page in zip(asked, await self._ask(asked), strict=True):
            learnt.learn(worker, page)
        declared = [node for node in suspects if self._judge(node, workers[node], learnt, now)]
        if declared:
            self.wake_jobs()
            for node in declared:
                await self._record(node)
        return declared

    async def _shaken_jobs(
        self, workers: Mapping[str, Sequence[Worker]], learnt: _Round
    ) -> set[str]:
        """Ask each job's sentinels: the jobs one of which says its world lost a member
        (every worker of those is asked next). A job none of whose sentinels answers is not
        shaken: an operator cut off from the workers' port would otherwise ask every worker
        of every job each round, and hear nothing."""
        chosen = sentinels(workers)
        for turn in (0, 1):
            asked = [
                ws[turn]
                for ws in chosen.values()
                if len(ws) > turn and (turn == 0 or learnt.pages[ws[0].ip] is None)
            ]
            for worker, page in zip(asked, await self._ask(asked), strict=True):
                learnt.learn(worker, page)
        return set(learnt.broken)

    def _suspects(
        self, workers: Mapping[str, Sequence[Worker]], shaken: set[str], now: datetime
    ) -> list[str]:
        """Nodes whose workers are asked this round: those with an overdue Lease or a worker
        of a shaken job, not declared yet."""
        suspects: list[str] = []
        for node, seen in self._seen.items():
            if node in self.snapshot.unresponsive_nodes:
                continue
            overdue = lease_overdue(NodeSignals(seen.seen, seen.duration), now)
            if workers.get(node) and (overdue or any(w.job in shaken for w in workers[node])):
                suspects.append(node)
            else:
                seen.silent_since = None
        return suspects

    def _restore_renewed(self) -> None:
        """A declared node whose Lease was renewed since the declaration is read as it is
        again; one this operator did not declare (its predecessor did) at once, as there is
        no declaration to set its renewals against."""
        for node, seen in self._seen.items():
            if node in self.snapshot.unresponsive_nodes and (
                seen.declared is None or seen.seen > seen.declared
            ):
                self._restore(node, "renews its Lease again")

    def _judge(
        self, node: str, on_node: Sequence[Worker], learnt: _Round, probed_at: datetime
    ) -> bool:
        """Apply one round's answers to the node's silence; True if it is declared lost now."""
        seen = self._seen[node]
        answered = any(learnt.pages.get(w.ip) is not None for w in on_node)
        seen.silent_since = silence(seen.silent_since, answered=answered, probed_at=probed_at)
        peers_lost = any(w.job in learnt.broken for w in on_node)
        signals = NodeSignals(seen.seen, seen.duration, len(on_node), seen.silent_since, peers_lost)
        now = self.clock()
        lost = node_lost(node, signals, now)
        if lost is None or not self.snapshot.declare_unresponsive(node, lost.message):
            return False
        seen.declared = now
        log.warning("%s", lost.message)
        return True

    def _restore(self, node: str, why: str) -> None:
        if self.snapshot.clear_unresponsive(node):
            log.info("node %s %s: read as it is", node, why)
            self.wake_jobs()

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
                declared = None if was is None else was.declared
                current[name] = _Seen(renew, now, duration, declared=declared)
        for gone in set(self._seen) - set(current):
            self._restore(gone, "has no Lease any more")
        self._seen = current

    async def _ask(self, workers: Iterable[Worker]) -> list[str | None]:
        port = self.settings.metrics_port
        return list(await asyncio.gather(*(self._probe(f"{w.ip}:{port}") for w in workers)))

    async def _probe(self, address: str) -> str | None:
        """A heartbeat from one worker address (``ip:port``): its metrics page (any HTTP answer
        counts, an error page reads empty), or ``None`` when it did not answer in time."""
        timeout = deadline(PROBE_TIMEOUT.total_seconds())
        try:
            async with self.agents.session.get(
                f"http://{address}/metrics", timeout=timeout
            ) as reply:
                if reply.status != 200:
                    return ""
                body = await reply.content.read(MAX_PAGE_BYTES)
                return body.decode("utf-8", errors="replace")
        except (aiohttp.ClientError, TimeoutError, OSError):
            return None

    async def _record(self, node: str) -> None:
        why = self.snapshot.unresponsive_nodes.get(node, "")
        with contextlib.suppress(ApiError):
            await events.record_node_event(
                self.kube, node, kind=EventType.WARNING, reason=NODE_UNRESPONSIVE, message=why
            )
