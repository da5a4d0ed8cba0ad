"""The operator's Prometheus metrics, served on ``/metrics`` by ``elastra run``.

Kopf has no exporter, so prometheus-client's default registry is used; each metric is
defined once here and updated where the event happens. ``jobs`` is recomputed from a small
map of job -> phase so that deleted jobs stop being counted.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Mapping
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from elastra.api import Phase, TrainingJobStatus

JOBS = Gauge("elastra_jobs", "TrainingJobs by phase", ["phase"])
RECONCILE_SECONDS = Histogram(
    "elastra_reconcile_duration_seconds",
    "Time of one reconcile pass over one job",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
PODS_CREATED = Counter("elastra_pods_created_total", "Worker pods created (placements)")
RESIZES = Counter("elastra_resizes_total", "New world versions formed", ["reason"])
ASSIGNMENT_PUSHES = Counter(
    "elastra_assignment_pushes_total",
    "Assignments pushed to worker agents ahead of the kubelet (engine/push.py), by how the "
    "agent answered: taken, stale (it knew that world version already), refused, unreachable",
    ["result"],
)
RESIZE_DOWNTIME = Histogram(
    "elastra_resize_downtime_seconds",
    "From the end of the step a new world resumed from to the end of its first step, as its "
    "rank 0 reported it (status.resizes[].downtimeMillis)",
    ["state_from"],
    buckets=(1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600),
)
RESTARTS = Gauge("elastra_job_restarts", "Failure-driven restarts per job", ["namespace", "job"])
GOODPUT = Gauge(
    "elastra_job_goodput_ratio",
    "Fraction of wall time since a job's first step spent in steps it kept, as its rank 0 "
    "measured it (status.progress.goodputPercent)",
    ["namespace", "job"],
)
LEADER = Gauge("elastra_leader", "1 while this operator holds the Lease and may write")
SYNCED = Gauge(
    "elastra_caches_synced", "1 once the node, pod and TrainingJob caches have their first list"
)

_phases: dict[tuple[str, str], Phase] = {}


def observe_job(namespace: str, name: str, status: TrainingJobStatus) -> None:
    """Record a job's phase, restarts and goodput after a pass."""
    _phases[(namespace, name)] = status.phase or Phase.PENDING
    RESTARTS.labels(namespace=namespace, job=name).set(status.restarts)
    if status.progress.goodput_percent is not None:
        GOODPUT.labels(namespace=namespace, job=name).set(status.progress.goodput_percent / 100)
    _publish()


def forget_job(namespace: str, name: str) -> None:
    """A job was deleted: stop counting it."""
    _phases.pop((namespace, name), None)
    for gauge in (RESTARTS, GOODPUT):
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, name)
    _publish()


def _publish() -> None:
    counts = collections.Counter(_phases.values())
    for phase in Phase:
        JOBS.labels(phase=str(phase)).set(counts[phase])


def observe_downtime(before: Mapping[str, Any], after: TrainingJobStatus) -> None:
    """Count the last resize's downtime in the histogram the pass it is first recorded."""
    last = after.resizes[-1] if after.resizes else None
    if last is None or last.downtime_millis is None:
        return
    recorded = (before.get("resizes") or [{}])[-1]
    if recorded.get("toVersion") == last.to_version and "downtimeMillis" in recorded:
        return
    RESIZE_DOWNTIME.labels(state_from=last.state_from or "").observe(last.downtime_millis / 1000)
