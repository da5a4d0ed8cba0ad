"""Kopf wiring: watch TrainingJobs, their pods and the nodes; run one worker loop per job.

Each job gets one asyncio task that runs reconcile passes one after another, so passes over
the same job never overlap; watch events only wake it. The task is started from the job's
watch events (including the initial listing after a restart) rather than with
``@kopf.daemon``, because Kopf puts a finalizer on any resource with daemons or timers, and
a finalizer makes deleting a job wait for the operator. Nothing here adds a finalizer to a
TrainingJob or a Pod, and no handler writes to a Node.

Node events wake every job only when something the planner reads changes (readiness,
cordon, allocatable GPUs, labels, taints), not on every heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import aiohttp
import kopf

from elastra.api import GROUP, PLURAL, VERSION
from elastra.controller import metrics
from elastra.controller.leader import LeaderElector
from elastra.controller.manifests import LABEL_JOB
from elastra.controller.progress import ProgressReader
from elastra.controller.reconcile import ClusterSnapshot, reconcile, utc_now
from elastra.controller.settings import OperatorSettings
from elastra.kube.client import ApiError, Kube

log = logging.getLogger("elastra.operator")

JobKey = tuple[str, str]
RETRY_AFTER_ERROR = timedelta(seconds=5)


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
    loops: dict[JobKey, JobLoop] = field(default_factory=dict)
    node_prints: dict[str, str] = field(default_factory=dict)

    def ensure(self, key: JobKey) -> None:
        """Start the job's loop if it is not running, and wake it."""
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
        """Wake every job (capacity changed); their next pass lists the cluster afresh."""
        self.snapshot.invalidate()
        for loop in self.loops.values():
            loop.wake.set()

    async def stop(self, key: JobKey) -> None:
        """Stop a deleted job's loop."""
        loop = self.loops.pop(key, None)
        if loop is not None:
            loop.task.cancel()
        if self.progress is not None:
            self.progress.forget(*key)
        metrics.forget_job(*key)

    async def _run(self, key: JobKey, wake: asyncio.Event) -> None:
        namespace, name = key
        while True:
            wake.clear()
            if not self.leader.leading:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), timeout=self.leader.renew.total_seconds())
                continue
            try:
                delay = await reconcile(
                    self.kube,
                    self.snapshot,
                    namespace,
                    name,
                    settings=self.settings,
                    progress=self.progress,
                )
            except (ApiError, aiohttp.ClientError, TimeoutError) as err:
                log.warning("job %s/%s: pass failed, retrying: %s", namespace, name, err)
                delay = RETRY_AFTER_ERROR
            wait = min(delay or self.settings.resync, self.settings.resync)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=wait.total_seconds())


def runtime(memo: Any) -> Runtime:
    """The operator's runtime from Kopf's memo."""
    found: Runtime = memo.runtime
    return found


def register(registry: kopf.OperatorRegistry) -> None:
    """Add Elastra's handlers to a Kopf registry (a fresh one per operator run)."""
    kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)(job_event)
    kopf.on.event("", "v1", "pods", labels={LABEL_JOB: kopf.PRESENT}, registry=registry)(pod_event)
    kopf.on.event("", "v1", "nodes", registry=registry)(node_event)


async def job_event(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    """A TrainingJob appeared, changed or went away: start, wake or stop its loop."""
    body = event["object"]
    meta = body.get("metadata") or {}
    key = (meta.get("namespace", ""), meta.get("name", ""))
    rt = runtime(memo)
    if event.get("type") == "DELETED":
        await rt.stop(key)
        return
    status = body.get("status") or {}
    if key not in rt.loops or meta.get("generation") != status.get("observedGeneration"):
        rt.ensure(key)


async def pod_event(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    """A worker pod changed: wake its job; a pod gone frees capacity for every job."""
    body = event["object"]
    meta = body.get("metadata") or {}
    rt = runtime(memo)
    rt.poke((meta.get("namespace", ""), (meta.get("labels") or {}).get(LABEL_JOB, "")))
    if event.get("type") == "DELETED":
        rt.poke_all()


async def node_event(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    """Wake every job when a node's capacity-relevant facts change."""
    body = event["object"]
    name = (body.get("metadata") or {}).get("name", "")
    rt = runtime(memo)
    if event.get("type") == "DELETED":
        rt.node_prints.pop(name, None)
        rt.snapshot.node_lost(name, utc_now())
        rt.poke_all()
        return
    fingerprint = _node_fingerprint(body)
    if rt.node_prints.get(name) != fingerprint:
        rt.node_prints[name] = fingerprint
        rt.poke_all()


def _node_fingerprint(node: Mapping[str, Any]) -> str:
    meta = node.get("metadata") or {}
    status = node.get("status") or {}
    ready = [c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Ready"]
    facts = {
        "labels": meta.get("labels"),
        "unschedulable": (node.get("spec") or {}).get("unschedulable"),
        "taints": (node.get("spec") or {}).get("taints"),
        "allocatable": status.get("allocatable"),
        "ready": ready,
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()
