"""The job loops, and what wakes them: the informers' changes and Kopf's Workload events.

Each job gets one asyncio task that runs reconcile passes one after another, so passes over
the same job never overlap; changes only wake it, and every change that arrives while a pass
runs is coalesced into one next pass. The task is started from the TrainingJobs informer
(its first list after a restart included), not with ``@kopf.daemon``: Kopf puts a finalizer
on any resource with daemons or timers, and a finalizer makes deleting a job wait for the
operator. Nothing here adds a finalizer to a TrainingJob or a Pod, or writes to a Node.

A pass runs only when something it reads changed or a timer it asked for fires (plus the
``resync`` safety net, which reads the caches and so costs no request):

- a job's own spec (its generation) changed;
- one of its pods changed;
- capacity changed: a node as the planner reads it (``slim_node``: readiness, cordon,
  allocatable GPUs, labels, taints, Elastra's annotations; heartbeats are dropped by the
  informer), or a pod went away or finished, which wakes every job;
- Kueue admitted or evicted its Workload (a Kopf handler, watched only where Kueue's CRD is).

A job's loop never ends on an error: a pass that fails is logged with the job's name (with
the traceback when the error is not a plain API or network failure) and retried after a
backoff that doubles from ``ERROR_BACKOFF_MIN`` to ``ERROR_BACKOFF_MAX``; a pass that succeeds
resets it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import aiohttp
import kopf

from elastra.controller.decide.admission import WORKLOAD_GROUP
from elastra.controller.decide.manifests import LABEL_JOB
from elastra.controller.engine import metrics
from elastra.controller.engine.leader import LeaderElector
from elastra.controller.engine.progress import ProgressReader
from elastra.controller.engine.push import AssignmentPusher
from elastra.controller.engine.reconcile import reconcile, utc_now
from elastra.controller.engine.snapshot import ClusterSnapshot, job_of
from elastra.controller.settings import OperatorSettings
from elastra.kube.client import ApiError, JsonDict, Kube
from elastra.kube.informer import key_of
from elastra.requeue import Requeue

log = logging.getLogger("elastra.operator")

JobKey = tuple[str, str]
ERROR_BACKOFF_MIN = timedelta(seconds=1)
ERROR_BACKOFF_MAX = timedelta(minutes=5)
TRANSIENT_ERRORS = (ApiError, aiohttp.ClientError, TimeoutError)
"""Failures of the API or the network: expected now and then, logged without a traceback."""


def error_backoff(failures: int) -> timedelta:
    """How long to wait after ``failures`` passes in a row failed: 1 s, 2 s, 4 s ... 5 min."""
    doubled = ERROR_BACKOFF_MIN * (1 << min(max(failures - 1, 0), 30))
    return min(doubled, ERROR_BACKOFF_MAX)


@dataclass
class JobLoop:
    """The task running passes over one job, and the event that wakes it early."""

    task: asyncio.Task[None]
    wake: asyncio.Event


@dataclass
class Runtime:
    """Per-operator state, kept in Kopf's memo: the API session and the job loops."""

    kube: Kube
    settings: OperatorSettings
    snapshot: ClusterSnapshot
    leader: LeaderElector
    progress: ProgressReader | None = None
    pusher: AssignmentPusher | None = None
    loops: dict[JobKey, JobLoop] = field(default_factory=dict)
    background: list[asyncio.Task[Any]] = field(default_factory=list)
    """The operator's own long-running tasks (informers, leader election, node checks)."""
    stopping: bool = False
    """Set by ``stop_all``: no job loop starts after it (an informer's event would start one
    that plans from caches no longer fed, where silent leases read as lost nodes)."""
    passes: asyncio.Semaphore = field(init=False)
    """Taken by every pass (``settings.passes_at_once`` of them)."""

    def __post_init__(self) -> None:
        self.passes = asyncio.Semaphore(self.settings.passes_at_once)

    def listen(self) -> None:
        """Let the snapshot's informers start, wake and stop the job loops."""
        self.snapshot.jobs.listeners.append(self.on_job)
        self.snapshot.pods.listeners.append(self.on_pod)
        self.snapshot.nodes.listeners.append(self.on_node)
        if self.snapshot.classes is not None:  # a job's priority may have changed
            self.snapshot.classes.listeners.append(lambda *_: self.poke_all())

    def on_job(self, kind: str, old: JsonDict | None, new: JsonDict | None) -> None:
        """A TrainingJob appeared, changed or went away: start, wake or stop its loop."""
        key = key_of(new or old or {})
        if self.settings.namespace and key[0] != self.settings.namespace:
            return  # another namespace's job: read for sharing, reconciled by its own operator
        if kind == "DELETED" or new is None:
            self.forget(key)
            return
        meta, status = new.get("metadata") or {}, new.get("status") or {}
        if key not in self.loops or meta.get("generation") != status.get("observedGeneration"):
            self.ensure(key)

    def on_pod(self, kind: str, old: JsonDict | None, new: JsonDict | None) -> None:
        """A worker pod changed: wake its job; a pod gone or finished frees capacity for all."""
        job = job_of(new or old or {})
        if job is not None:
            self.poke(job)
        if kind == "DELETED" or (_finished(new) and not _finished(old)):
            self.poke_all()

    def on_node(self, kind: str, old: JsonDict | None, new: JsonDict | None) -> None:
        """A node changed as the planner reads it (the informer keeps only that), or left."""
        if kind == "DELETED":
            self.snapshot.node_lost(key_of(old or {})[1], utc_now())
        self.poke_all()

    def ensure(self, key: JobKey) -> None:
        """Start the job's loop if it is not running, and wake it (not once stopping)."""
        if self.stopping:
            return
        loop = self.loops.get(key)
        if loop is None or loop.task.done():
            wake = asyncio.Event()
            task = asyncio.create_task(self._run(key, wake), name=f"job {key[0]}/{key[1]}")
            self.loops[key] = JobLoop(task=task, wake=wake)
        self.loops[key].wake.set()

    def poke(self, key: JobKey) -> None:
        """Wake a job's loop if it runs."""
        loop = self.loops.get(key)
        if loop is not None:
            loop.wake.set()

    def poke_all(self) -> None:
        """Wake every job (capacity changed)."""
        for loop in self.loops.values():
            loop.wake.set()

    async def stop_all(self) -> None:
        """Stop every job's loop, then the background tasks, and wait until they have ended
        (the operator shuts down). Kopf gives tasks started after its own a grace period of
        5 s before it cancels them, and ours only end when cancelled (a ``wait_for`` inside
        one of them is such a task): without this every SIGTERM took 5 s."""
        self.stopping = True
        tasks = [loop.task for loop in self.loops.values()]
        for key in list(self.loops):
            self.forget(key)
        await asyncio.gather(*tasks, return_exceptions=True)
        for task in self.background:
            task.cancel()
        await asyncio.gather(*self.background, return_exceptions=True)

    def forget(self, key: JobKey) -> None:
        """Stop a deleted job's loop and drop what was kept about it."""
        loop = self.loops.pop(key, None)
        if loop is not None:
            loop.task.cancel()
        if self.progress is not None:
            self.progress.forget(*key)
        if self.pusher is not None:
            self.pusher.forget(*key)
        metrics.forget_job(*key)

    async def _run(self, key: JobKey, wake: asyncio.Event) -> None:
        await self.snapshot.wait_synced()  # never plan from a half-filled cache
        failures = 0
        while True:
            wake.clear()
            if not self.leader.leading:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), timeout=self.leader.renew.total_seconds())
                continue
            async with self.passes:
                requeue = await self._pass(key, failures)
            failures = 0 if requeue is not None else failures + 1
            if requeue is None:  # failed: back off, and let no event shorten the wait
                await asyncio.sleep(error_backoff(failures).total_seconds())
                continue
            wait = requeue.within(self.settings.resync)  # a requeue of zero: the next pass now
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=wait.total_seconds())

    async def _pass(self, key: JobKey, failures: int) -> Requeue | None:
        """One reconcile pass: when it asks for the next one, None when it failed.

        Any exception is caught here, on purpose: an unexpected one (a bug, a hostile object)
        must not end the job's loop silently; it is logged with the traceback and retried.
        """
        namespace, name = key
        try:
            requeue = await reconcile(
                self.kube,
                self.snapshot,
                namespace,
                name,
                settings=self.settings,
                progress=self.progress,
                pusher=self.pusher,
            )
        except TRANSIENT_ERRORS as err:
            log.warning(
                "job %s/%s: pass failed (%d in a row), retrying in %s: %s",
                namespace, name, failures + 1, error_backoff(failures + 1), err,
            )  # fmt: skip
            return None
        except Exception:
            log.exception(
                "job %s/%s: pass failed unexpectedly (%d in a row), retrying in %s",
                namespace, name, failures + 1, error_backoff(failures + 1),
            )  # fmt: skip
            return None
        return requeue


def runtime(memo: Any) -> Runtime:
    """The operator's runtime from Kopf's memo."""
    found: Runtime = memo.runtime
    return found


def register(registry: kopf.OperatorRegistry) -> None:
    """Add Elastra's Kopf handlers to a registry (a fresh one per operator run).

    Jobs, pods and nodes are watched by the snapshot's informers; Kopf watches Kueue's
    Workloads, because it finds out whether their CRD is installed (and follows it if it is
    installed later), and it runs peering and the liveness endpoint.
    """
    kopf.on.event(WORKLOAD_GROUP, "workloads", labels={LABEL_JOB: kopf.PRESENT}, registry=registry)(
        workload_event
    )
    kopf.on.cleanup(registry=registry)(cleanup)


async def cleanup(memo: Any, **_: Any) -> None:
    """The operator is stopping: end the job loops first, so that the passes they would
    still run do not keep the event loop busy while Kopf closes its own tasks (at 3,000 jobs
    the operator outlived SIGTERM by more than 30 s)."""
    await runtime(memo).stop_all()


async def workload_event(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    """Kueue admitted, evicted or deleted a job's Workload: wake the job."""
    meta = event["object"].get("metadata") or {}
    rt = runtime(memo)
    rt.poke((meta.get("namespace", ""), (meta.get("labels") or {}).get(LABEL_JOB, "")))


def _finished(pod: JsonDict | None) -> bool:
    """The pod no longer holds its node's resources (it ended, or is being deleted)."""
    if pod is None:
        return False
    phase = (pod.get("status") or {}).get("phase")
    return phase in ("Succeeded", "Failed") or bool(
        (pod.get("metadata") or {}).get("deletionTimestamp")
    )
