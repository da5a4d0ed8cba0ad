"""One reconcile pass against the API server: observe, decide (pure), apply.

The only module of the controller that sequences API calls for a job. It reads the job, its
pods, the nodes and the cluster's pods (through a short-lived shared snapshot, so a burst of
passes over many jobs costs one list of nodes and pods, not one per job), hands them to
``plan_pass`` and applies the result in the order the protocol needs: status first (with a
resourceVersion precondition), then deletes, pod patches, creates and ungates, then events.

A 409 on the status write means another writer got there first: the pass stops and the next
one re-reads. Nothing here swallows other errors; the caller logs them and retries later.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from elastra.api import parse_trainingjob
from elastra.controller import metrics
from elastra.controller.manifests import headless_service, selector
from elastra.controller.observe import slim_node, slim_pod
from elastra.controller.passplan import Observation, PassPlan, plan_pass
from elastra.controller.progress import ProgressReader
from elastra.controller.settings import OperatorSettings
from elastra.errors import UserError
from elastra.kube import resources
from elastra.kube.client import ConflictError, JsonDict, Kube, gather_limited

log = logging.getLogger("elastra.reconcile")

Clock = Callable[[], datetime]
LOST_NODE_MEMORY = timedelta(hours=1)
LIST_COST_FACTOR = 5.0
"""A snapshot lives at least this many times as long as listing it took, so on a big, busy
cluster the operator spends at most about a fifth of its time re-reading every node and pod."""


def utc_now() -> datetime:
    """The real clock; tests pass their own."""
    return datetime.now(UTC)


@dataclass(frozen=True)
class Cluster:
    """What every job's pass shares: all nodes, all pods, all TrainingJobs (as listed, in
    tuples so derived values can be cached per listing), and the pods being created that the
    listing does not show yet."""

    nodes: tuple[JsonDict, ...]
    pods: tuple[JsonDict, ...]
    jobs: tuple[JsonDict, ...]
    reserved: tuple[JsonDict, ...] = ()
    lost_nodes: Mapping[str, datetime] = dataclasses.field(default_factory=dict)


@dataclass
class _Reservation:
    """A pod this operator is creating, counted as holding its GPUs before any listing shows it."""

    pod: JsonDict
    settled: float | None = None
    """When its create call returned (monotonic); ``None`` while it is in flight."""


@dataclass
class ClusterSnapshot:
    """Nodes, pods and TrainingJobs, listed at most once per ``ttl`` and shared by every pass.

    Job loops plan concurrently from the same listing, so a listing alone would let two jobs
    pick the same free GPUs in the second before either's pods show up, and the scheduler would
    leave one gang Unschedulable. Each pass therefore ``reserve``s the pods it is about to
    create in the same event-loop step in which it planned them (no ``await`` between reading
    the snapshot and reserving), and every later read counts them as placed. A reservation ends
    once a listing that started after its create returned has been taken: from then on the
    listing itself shows the pod, or shows that the create failed.
    """

    kube: Kube
    ttl_s: float = 1.0
    _taken: float = -1e9
    _cluster: Cluster = field(default_factory=lambda: Cluster((), (), ()))
    _listed: frozenset[tuple[str, str]] = frozenset()
    _reserved: dict[tuple[str, str], _Reservation] = field(default_factory=dict)
    _list_cost: float = 0.0
    _lost_nodes: dict[str, datetime] = field(default_factory=dict)
    _generation: int = 0
    """Bumped by ``invalidate``: a listing in flight across it is stale when it returns."""
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def read(self) -> Cluster:
        """The cluster, fresh within ``ttl_s`` (or longer on a big cluster), plus reservations."""
        async with self._lock:
            if time.monotonic() - self._taken > max(self.ttl_s, self._list_cost * LIST_COST_FACTOR):
                started, generation = time.monotonic(), self._generation
                nodes, pods, jobs = await asyncio.gather(
                    resources.list_nodes(self.kube),
                    resources.list_pods(self.kube),
                    resources.list_jobs(self.kube),
                )
                self._cluster = Cluster(
                    nodes=tuple(slim_node(n) for n in nodes),
                    pods=tuple(slim_pod(p) for p in pods),
                    jobs=tuple(jobs),
                )
                self._listed = frozenset(_key(p) for p in pods)
                self._list_cost = time.monotonic() - started
                # Invalidated while listing (a node went away): use it once, list again next.
                self._taken = time.monotonic() if generation == self._generation else -1e9
                self._reserved = {
                    k: r
                    for k, r in self._reserved.items()
                    if r.settled is None or r.settled >= started
                }
        extra = tuple(r.pod for k, r in self._reserved.items() if k not in self._listed)
        if not extra and not self._lost_nodes:
            return self._cluster
        return dataclasses.replace(self._cluster, reserved=extra, lost_nodes=dict(self._lost_nodes))

    def node_lost(self, name: str, when: datetime) -> None:
        """A node was deleted: remember when (for an hour) and list afresh."""
        self._lost_nodes = {
            n: t for n, t in self._lost_nodes.items() if when - t < LOST_NODE_MEMORY
        }
        self._lost_nodes.setdefault(name, when)
        self.invalidate()

    def reserve(self, pods: Sequence[JsonDict]) -> None:
        """Count ``pods`` as placed from now on (call before awaiting anything after planning)."""
        for pod in pods:
            self._reserved[_key(pod)] = _Reservation(slim_pod(pod))

    def settle(self, pods: Sequence[JsonDict]) -> None:
        """The creates of ``pods`` returned: the next listing tells the truth about them."""
        now = time.monotonic()
        for pod in pods:
            found = self._reserved.get(_key(pod))
            if found is not None:
                found.settled = now

    def invalidate(self) -> None:
        """Forget the snapshot: capacity was freed (pods or nodes went away, nodes changed)."""
        self._taken = -1e9
        self._generation += 1


def _key(pod: JsonDict) -> tuple[str, str]:
    meta = pod.get("metadata") or {}
    return (str(meta.get("namespace", "")), str(meta.get("name", "")))


async def reconcile(
    kube: Kube,
    snapshot: ClusterSnapshot,
    namespace: str,
    name: str,
    *,
    settings: OperatorSettings,
    clock: Clock = utc_now,
    progress: ProgressReader | None = None,
) -> timedelta | None:
    """Run one pass over a job; returns when the next pass is due (``None``: on events only).

    With a ``progress`` reader, a job whose rank 0 runs on a real node gets a pass at least
    every ``progress.interval_s`` so ``status.progress`` follows training.
    """
    started = time.monotonic()
    try:
        raw = await resources.get_job(kube, namespace, name)
        if raw is None or (raw.get("metadata") or {}).get("deletionTimestamp"):
            return None
        try:
            job = parse_trainingjob(raw, source=f"trainingjob {namespace}/{name}")
        except UserError as err:
            await _reject(kube, raw, str(err))
            return None
        pods = await resources.list_pods(kube, namespace, selector=selector(name))
        report, watched = None, False
        if progress is not None:
            report, watched = await progress.read(job, pods, (await snapshot.read()).nodes)
        # No await between this read and ``reserve`` below: see ClusterSnapshot.
        cluster = await snapshot.read()
        observed = Observation(
            job,
            pods,
            cluster.nodes,
            cluster.pods,
            jobs=cluster.jobs,
            reserved=cluster.reserved,
            progress=report,
            lost_nodes=cluster.lost_nodes,
        )
        plan = plan_pass(observed, settings, clock())
        snapshot.reserve(plan.creates)
        try:
            await _apply(
                kube, snapshot, raw, plan, service=headless_service(job), settings=settings
            )
        finally:
            snapshot.settle(plan.creates)
        if log.isEnabledFor(logging.DEBUG):
            writes = _writes(raw, plan)
            log.debug(
                "job %s/%s: pass done, writes=%d",
                namespace,
                name,
                writes,
                extra={"job": f"{namespace}/{name}", "writes": writes},
            )
        metrics.observe_job(namespace, name, plan.status)
        if watched and progress is not None:
            every = timedelta(seconds=progress.interval_s)
            return min(plan.requeue, every) if plan.requeue else every
        return plan.requeue
    except ConflictError:
        log.debug("status of %s/%s changed under us; re-reading", namespace, name)
        return timedelta(seconds=0.2)
    finally:
        metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)


async def _apply(
    kube: Kube,
    snapshot: ClusterSnapshot,
    raw: JsonDict,
    plan: PassPlan,
    *,
    service: dict[str, Any],
    settings: OperatorSettings,
) -> None:
    meta = raw["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    new_status = plan.status.to_wire()
    if new_status != (raw.get("status") or {}):
        await resources.replace_job_status(kube, {**raw, "status": new_status})
        if plan.world_changed:
            world = plan.status.world
            log.info(
                "job %s/%s: world v%d of %d workers (%s)",
                namespace,
                name,
                world.version,
                world.replicas,
                plan.decision.reason if plan.decision else "",
            )
            reason = plan.decision.reason.value if plan.decision else "Resized"
            metrics.RESIZES.labels(reason=reason).inc()
    limit = settings.concurrency
    if plan.deletes:
        force = set(plan.force_deletes)
        await gather_limited(
            limit,
            *(
                resources.delete_pod(
                    kube,
                    namespace,
                    p,
                    grace_seconds=0 if p in force else settings.termination_grace_seconds,
                )
                for p in plan.deletes
            ),
        )
    if plan.patches:
        await gather_limited(
            limit, *(resources.patch_pod(kube, namespace, p, body) for p, body in plan.patches)
        )
    if plan.creates:
        await resources.ensure_service(kube, namespace, service)
        created = await gather_limited(
            limit, *(resources.create_pod(kube, namespace, pod) for pod in plan.creates)
        )
        metrics.PODS_CREATED.inc(sum(1 for c in created if c is not None))
    if plan.ungate:
        await gather_limited(
            limit,
            *(
                resources.patch_pod(kube, namespace, p, {"spec": {"schedulingGates": None}})
                for p in plan.ungate
            ),
        )
    if plan.deletes:
        snapshot.invalidate()  # capacity freed; creates need no fresh listing (reservations)
    for event in plan.events:
        await resources.record_event(
            kube, raw, kind=event.type, reason=event.reason, message=event.message
        )


def _writes(raw: JsonDict, plan: PassPlan) -> int:
    """How many objects a pass changes (0 at steady state: a restarted operator is quiet)."""
    status_write = plan.status.to_wire() != (raw.get("status") or {})
    return (
        int(status_write)
        + len(plan.deletes)
        + len(plan.patches)
        + len(plan.creates)
        + len(plan.ungate)
        + len(plan.events)
    )


async def _reject(kube: Kube, raw: JsonDict, message: str) -> None:
    """A spec the API server accepted but the operator cannot read: say so once."""
    status = dict(raw.get("status") or {})
    conditions = [c for c in status.get("conditions") or [] if c.get("type") != "Admitted"]
    admitted = {
        "type": "Admitted",
        "status": "False",
        "reason": "InvalidSpec",
        "message": message[:4096],
        "lastTransitionTime": utc_now().strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if any(
        c.get("type") == "Admitted" and c.get("message") == message
        for c in status.get("conditions") or []
    ):
        return
    status.update({"conditions": [*conditions, admitted], "phase": "Failed"})
    await resources.replace_job_status(kube, {**raw, "status": status})
    await resources.record_event(kube, raw, kind="Warning", reason="InvalidSpec", message=message)
