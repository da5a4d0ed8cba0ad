"""One reconcile pass: observe (from the caches), decide (pure), apply.

The only module of the controller that sequences API calls for a job. It takes the job, its
pods, the nodes and the cluster's pods from the shared ``ClusterSnapshot`` (watch-fed caches:
a pass makes no read request, except a queued job's Kueue Workload), hands them to
``plan_pass`` and applies the result in the order the protocol needs: new pods first (gated:
they carry the assignments of the world about to be recorded, and run nothing until their gate
comes off), then the status (with a resourceVersion precondition, and only when it changed:
a change of counts alone waits out ``pacing.STATUS_PACE``), then deletes, pod patches and
ungates, then events. A steady job's pass therefore makes no request at all. A pass stopped
after its creates leaves only gated pods: the next pass forms its world of them (or tells
them otherwise) before it ungates them.

A 409 on the status write means another writer got there first, or the cache was behind:
the pass stops and the next one reads again. Nothing here swallows other errors; the caller
logs them and retries later.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from elastra.api import (
    TrainingJob,
    parse_trainingjob,
)
from elastra.api.reasons import Reason
from elastra.controller.decide import admission
from elastra.controller.decide.conditions import invalid_spec_status
from elastra.controller.decide.manifests import (
    ANNOTATION_ASSIGNMENT,
    headless_service,
    is_gated,
    network_policy,
)
from elastra.controller.decide.observe import WorkerProgress
from elastra.controller.decide.passplan import EventType, Observation, PassWrites, plan_pass
from elastra.controller.decide.status_changes import changed_fields
from elastra.controller.engine import metrics
from elastra.controller.engine.progress import ProgressReader
from elastra.controller.engine.push import AssignmentPusher, PodPush
from elastra.controller.engine.snapshot import ClusterSnapshot
from elastra.controller.settings import OperatorSettings
from elastra.errors import UserError
from elastra.kube import events, resources, workloads
from elastra.kube.client import ApiError, ConflictError, JsonDict, Kube, gather_limited
from elastra.requeue import Requeue

log = logging.getLogger("elastra.reconcile")

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    """The real clock; tests pass their own."""
    return datetime.now(UTC)


async def reconcile(
    kube: Kube,
    snapshot: ClusterSnapshot,
    namespace: str,
    name: str,
    *,
    settings: OperatorSettings,
    clock: Clock = utc_now,
    progress: ProgressReader | None = None,
    pusher: AssignmentPusher | None = None,
) -> Requeue:
    """Run one pass over a job; returns when the next pass is due.

    With a ``progress`` reader, a job whose rank 0 runs on a real node gets a pass at least
    every ``progress.interval_s`` so ``status.progress`` follows training. With a ``pusher``,
    each assignment patch is also pushed to its pod's agent.
    """
    started = time.monotonic()
    try:
        raw = snapshot.job(namespace, name)
        if raw is None or (raw.get("metadata") or {}).get("deletionTimestamp"):
            return Requeue.NEVER
        try:
            job = parse_trainingjob(raw, source=f"trainingjob {namespace}/{name}")
        except UserError as err:
            await _reject(kube, snapshot, raw, str(err), now=clock())
            return Requeue.NEVER
        workload = None
        if admission.queue_of(job) is not None:
            workload = await workloads.get_workload(kube, namespace, admission.workload_name(name))
        report, watched = None, False
        if progress is not None:
            pods = snapshot.job_pods(namespace, name)
            report, watched = await progress.read(job, pods, snapshot.read().nodes)
        # No await between observing and ``reserve``: see ClusterSnapshot.
        now = clock()
        observed = _observe(snapshot, job, report=report, workload=workload)
        plan = plan_pass(observed, settings, now)
        snapshot.reserve((*plan.creates, *plan.request_creates))
        await _apply(
            kube,
            snapshot,
            raw,
            plan,
            service=headless_service(job),
            settings=settings,
            now=now,
            push=pusher.to_pods(lambda node: snapshot.nodes.get("", node)) if pusher else None,
        )
        _log_pass(raw, _writes(raw, plan))
        metrics.observe_job(namespace, name, plan.status)
        if watched and progress is not None:
            return min(plan.requeue, Requeue.after(timedelta(seconds=progress.interval_s)))
        return plan.requeue
    except ConflictError:
        log.debug("status of %s/%s changed under us; reading again", namespace, name)
        return Requeue.after(timedelta(seconds=0.2))
    finally:
        metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)


def _observe(
    snapshot: ClusterSnapshot,
    job: TrainingJob,
    *,
    report: WorkerProgress | None,
    workload: JsonDict | None,
) -> Observation:
    """What the pass decides on, from the caches and reservations (never awaits)."""
    cluster = snapshot.read()  # first: it also ends expired reservations
    namespace, name = job.metadata.namespace or "", job.metadata.name
    return Observation(
        job,
        snapshot.job_pods(namespace, name),
        cluster.nodes,
        cluster.pods,
        jobs=cluster.jobs,
        reserved=cluster.reserved,
        progress=report,
        lost_nodes=cluster.lost_nodes,
        priorities=cluster.priorities,
        workload=workload,
        status_written=snapshot.status_written(namespace, name),
        requests=snapshot.capacity_requests(namespace, name),
    )


def _log_pass(raw: JsonDict, writes: int) -> None:
    """One debug line per pass with its writes (the integration tests count quiet passes)."""
    if not log.isEnabledFor(logging.DEBUG):
        return
    meta = raw["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    log.debug(
        "job %s/%s: pass done, writes=%d",
        namespace,
        name,
        writes,
        extra={"job": f"{namespace}/{name}", "writes": writes},
    )


async def _apply(
    kube: Kube,
    snapshot: ClusterSnapshot,
    raw: JsonDict,
    plan: PassWrites,
    *,
    service: dict[str, Any],
    settings: OperatorSettings,
    now: datetime,
    push: PodPush | None,
) -> None:
    """Write the plan in the protocol's order; reservations of creates not made are dropped.

    Capacity requests are deleted (without grace: they run nothing) and created alongside the
    pass's first writes, a round trip sooner than in sequence: requests have no place in the
    protocol, and a worker the scheduler tries before the request on its node is gone is tried
    again when it goes. A worker create that a ResourceQuota refused because a request still
    counted is made again by the next pass, the request gone by then (``_together`` ends every
    write of the round before it raises).
    """
    meta = raw["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    try:
        await _together(
            _delete_requests(kube, namespace, names=plan.request_deletes, settings=settings),
            _create_pods(
                kube,
                snapshot,
                raw=raw,
                pods=plan.request_creates,
                kind=_CAPACITY_REQUESTS,
                settings=settings,
            ),
            _create_and_record(
                kube, snapshot, raw, plan, service=service, settings=settings, now=now
            ),
        )
        if plan.workload_delete:
            await workloads.delete_workload(kube, namespace, plan.workload_delete)
        if plan.workload_create:
            await workloads.create_workload(kube, namespace, plan.workload_create)
        await _delete_pods(kube, namespace, plan, settings)
        await _patch_pods(kube, snapshot, namespace, plan.patches, settings, push=push)
        ungate = tuple((p, {"spec": {"schedulingGates": None}}) for p in plan.ungate)
        await _together(
            _patch_pods(kube, snapshot, namespace, ungate, settings, push=None),
            *(
                events.record_event(kube, raw, kind=e.type, reason=e.reason, message=e.message)
                for e in plan.events
            ),
        )
    finally:
        snapshot.release((*plan.creates, *plan.request_creates))
    if plan.delete_job:
        log.info("job %s/%s: ttlSecondsAfterFinished has passed; deleting it", namespace, name)
        await workloads.delete_job(kube, namespace, name, uid=meta.get("uid"))


async def _create_and_record(
    kube: Kube,
    snapshot: ClusterSnapshot,
    raw: JsonDict,
    plan: PassWrites,
    *,
    service: dict[str, Any],
    settings: OperatorSettings,
    now: datetime,
) -> None:
    """The pass's new pods and its status, in two rounds of writes where a batch has gated pods.

    First the gated pods, with the Service and NetworkPolicy they need (wherever pods are
    created or ungated: no pod runs before its NetworkPolicy). Then, once all of them exist,
    the batch's last pod (created without a gate) together with the status that records the
    world: a failed create leaves nothing that can run, and a world recorded as its last create
    fails only lacks a member that never existed, which the next pass creates again (the
    resize policy does not count it lost while the world has not started). With no gated pod
    the last one is created before the status, so a recorded world always has a member.
    """
    namespace = raw["metadata"]["namespace"]
    gated = [p for p in plan.creates if is_gated(p)]
    last = [p for p in plan.creates if not is_gated(p)]
    policy = (
        [_ensure_service_and_policy(kube, namespace, service, settings)]
        if plan.creates or plan.ungate
        else []
    )
    await _together(
        *policy, _create_pods(kube, snapshot, raw=raw, pods=gated, kind=_WORKERS, settings=settings)
    )
    if gated:
        await _together(
            _create_pods(kube, snapshot, raw=raw, pods=last, kind=_WORKERS, settings=settings),
            _write_status(kube, snapshot, raw, plan, now),
        )
    else:
        await _create_pods(kube, snapshot, raw=raw, pods=last, kind=_WORKERS, settings=settings)
        await _write_status(kube, snapshot, raw, plan, now)


async def _ensure_service_and_policy(
    kube: Kube, namespace: str, service: dict[str, Any], settings: OperatorSettings
) -> None:
    await asyncio.gather(
        resources.ensure_service(kube, namespace, service),
        resources.ensure_network_policy(kube, namespace, network_policy(service, settings)),
    )


async def _together(*steps: Awaitable[object]) -> None:
    """Run ``steps`` at once; like every batch of writes, all end before a failure is raised."""
    await gather_limited(len(steps), *steps)


REFUSED = frozenset({403, 422})
"""Statuses of a pod create the cluster refused by its own rules (quota, admission), not a
fault: the job says so in a Warning Event."""


@dataclass(frozen=True)
class _PodKind:
    """What a create makes, as a refusal says it, and whether it counts as a placement."""

    noun: str
    after_refusal: str
    placement: bool


_WORKERS = _PodKind(
    noun="a worker pod",
    after_refusal=(
        "the pods created so far stay gated (none runs until the whole batch exists) and "
        "creation is retried"
    ),
    placement=True,
)
_CAPACITY_REQUESTS = _PodKind(
    noun="a capacity-request pod",
    after_refusal="the cluster's autoscaler is not asked for nodes until it accepts one",
    placement=False,
)


async def _refused(kube: Kube, raw: JsonDict, *, err: ApiError, kind: _PodKind) -> None:
    """Say on the job why its pods cannot be created: a quota, a webhook or a missing
    PriorityClass is the user's to change, and only the operator's log would tell otherwise."""
    await events.record_event(
        kube,
        raw,
        kind=EventType.WARNING,
        reason=Reason.FAILED_CREATE,
        message=f"the API server refused {kind.noun}: {err.message}; {kind.after_refusal}",
    )


async def _write_status(
    kube: Kube, snapshot: ClusterSnapshot, raw: JsonDict, plan: PassWrites, now: datetime
) -> None:
    """The status, once, when it changed and is due (``pacing``); the cache holds the answer
    at once, and the time of the pass, from which the next count-only change is paced."""
    new_status = plan.status.to_wire()
    if plan.status_wait is not None or new_status == (raw.get("status") or {}):
        return
    written = await resources.replace_job_status(kube, {**raw, "status": new_status})
    snapshot.wrote_job(raw, written, at=now)
    metrics.observe_downtime(raw.get("status") or {}, plan.status)
    if log.isEnabledFor(logging.DEBUG):
        job = f"{raw['metadata']['namespace']}/{raw['metadata']['name']}"
        changed = changed_fields(raw.get("status") or {}, new_status)
        log.debug("job %s: status written: %s", job, " ".join(changed),
                  extra={"job": job, "statusChanges": changed})  # fmt: skip
    if plan.world_changed:
        meta, world = raw["metadata"], plan.status.world
        log.info(
            "job %s/%s: world v%d of %d workers (%s)",
            meta["namespace"],
            meta["name"],
            world.version,
            world.replicas,
            plan.decision.reason if plan.decision else "",
        )
        reason = plan.decision.reason.value if plan.decision else "Resized"
        metrics.RESIZES.labels(reason=reason).inc()


async def _delete_pods(
    kube: Kube, namespace: str, plan: PassWrites, settings: OperatorSettings
) -> None:
    force = set(plan.force_deletes)
    await gather_limited(
        settings.concurrency,
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


async def _delete_requests(
    kube: Kube, namespace: str, *, names: Sequence[str], settings: OperatorSettings
) -> None:
    """Delete capacity-request pods at once: they hold a node's room for workers, run
    nothing, and the workers waiting for that room start only once they are gone."""
    await gather_limited(
        settings.concurrency,
        *(resources.delete_pod(kube, namespace, n, grace_seconds=0) for n in names),
    )


async def _patch_pods(
    kube: Kube,
    snapshot: ClusterSnapshot,
    namespace: str,
    patches: Sequence[tuple[str, JsonDict]],
    settings: OperatorSettings,
    *,
    push: PodPush | None,
) -> None:
    """Merge-patch pods; each answer goes into the cache (or the pod's reservation), and to
    ``push`` where the patch changed the pod's assignment."""

    async def patch(name: str, body: JsonDict) -> None:
        before = snapshot.current_pod(namespace, name)
        answer = await resources.patch_pod(kube, namespace, name, body)
        snapshot.wrote_pod(before, answer)
        if push is not None and ANNOTATION_ASSIGNMENT in (
            body.get("metadata", {}).get("annotations") or {}
        ):
            push(answer)

    await gather_limited(settings.concurrency, *(patch(p, body) for p, body in patches))


async def _create_pods(
    kube: Kube,
    snapshot: ClusterSnapshot,
    *,
    raw: JsonDict,
    pods: Sequence[JsonDict],
    kind: _PodKind,
    settings: OperatorSettings,
) -> None:
    """Create pods; each reservation then holds the server's answer. A create the cluster
    refuses by its own rules is said on the job (``_refused``) before the pass fails."""

    async def create(pod: JsonDict) -> None:
        try:
            answer = await resources.create_pod(kube, namespace, pod)
        except BaseException:
            snapshot.unreserve(pod)
            raise
        snapshot.created(pod, answer)
        if answer is not None and kind.placement:
            metrics.PODS_CREATED.inc()

    namespace = raw["metadata"]["namespace"]
    try:
        await gather_limited(settings.concurrency, *(create(pod) for pod in pods))
    except ApiError as err:
        if err.status in REFUSED:
            await _refused(kube, raw, err=err, kind=kind)
        raise


def _writes(raw: JsonDict, plan: PassWrites) -> int:
    """How many objects a pass changes (0 at steady state: a restarted operator is quiet)."""
    status_write = plan.status_wait is None and plan.status.to_wire() != (raw.get("status") or {})
    return (
        int(status_write)
        + len(plan.deletes)
        + len(plan.patches)
        + len(plan.creates)
        + len(plan.ungate)
        + len(plan.events)
        + len(plan.request_creates)
        + len(plan.request_deletes)
        + int(plan.workload_create is not None)
        + int(plan.workload_delete is not None)
        + int(plan.delete_job)
    )


async def _reject(
    kube: Kube, snapshot: ClusterSnapshot, raw: JsonDict, message: str, *, now: datetime
) -> None:
    """A spec the API server accepted but the operator cannot read: say so once
    (``invalid_spec_status``).

    Nothing else is touched: the pods keep running and the world stays recorded, so a
    corrected spec picks up where the job was.
    """
    message = message[:4096]
    generation = int((raw.get("metadata") or {}).get("generation") or 0)
    status = invalid_spec_status(raw.get("status") or {}, message, now=now, generation=generation)
    if status is None:
        _log_pass(raw, 0)
        return
    written = await resources.replace_job_status(kube, {**raw, "status": status})
    snapshot.wrote_job(raw, written, at=now)
    await events.record_event(
        kube, raw, kind=EventType.WARNING, reason=Reason.INVALID_SPEC, message=message
    )
    _log_pass(raw, 2)
