"""Every reason Elastra gives a TrainingJob: its conditions' ``reason``, its Events' and its
``status.resizes`` records'.

One vocabulary in one module, as the API's other constants: users, alerts and dashboards
match on these strings, so they are API, and a reason spelled twice can drift apart. The
resize policy (``elastra.elastic.resize``), the controller's conditions, Kueue admission, the
deadline and capacity requests all take theirs from here.
"""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    """Why a job's world changed, why it waits, or how it ended."""

    # -- a world formed or changed (status.resizes, Resizing, Normal Events) ----------------
    WORLD_FORMED = "WorldFormed"
    """The job's first world (or the first after every worker was gone)."""
    SCALED_DOWN = "ScaledDown"
    SCALED_UP = "ScaledUp"
    WORKER_FAILED = "WorkerFailed"
    WORKER_LOST = "WorkerLost"
    JOIN_TIMED_OUT = "JoinTimedOut"
    """A member of a new world did not join within ``--join-timeout-seconds``."""
    RELOCATED = "Relocated"
    COMPLETED = "Completed"
    SUSPENDED = "Suspended"
    STEADY = "Steady"
    """Resizing False: nothing to change."""

    # -- Admitted ---------------------------------------------------------------------------
    PLANNED = "Planned"
    """The planner found a plan (unless admission gave its own note)."""
    UNPLACEABLE = "Unplaceable"
    """Admitted False and Placed False: no node has a GPU type the job allows."""
    INVALID_SPEC = "InvalidSpec"
    """Admitted False (and an Event): the operator cannot read a spec the API server accepted
    (usually a CRD older than the operator); the message names the field."""
    ADMITTED_BY_KUEUE = "AdmittedByKueue"
    """Kueue admitted the Workload and the planner found a plan."""
    CAPPED_BY_ADMISSION = "CappedByAdmission"
    """spec.replicas is above the admitted count; the world stays within it."""

    # -- Placed -----------------------------------------------------------------------------
    PLACED = "Placed"
    """Every live pod is bound (the message counts them)."""
    BINDING = "Binding"
    """Placed False: pods are on their way to their nodes."""
    UNSCHEDULABLE = "Unschedulable"
    """Placed False: the scheduler found no node for a pod."""
    INSUFFICIENT_CAPACITY = "InsufficientCapacity"
    """Placed False (no live pod, no plan fits the free capacity), and Degraded: the job is
    starved below its minimum (what ``--sharing`` looks for)."""
    CAPACITY_REQUESTED = "CapacityRequested"
    """Placed False (and Admitted True while no node of the job's GPU type exists yet): the
    job's capacity-request pods wait for the cluster's autoscaler."""
    CAPACITY_UNSATISFIED = "CapacityUnsatisfied"
    """A Warning Event, and Placed False (Admitted False while no node of the job's type
    exists): no autoscaler gave usable nodes within the timeout; the request was withdrawn."""

    # -- Running, Degraded ------------------------------------------------------------------
    WORLD_RUNNING = "WorldRunning"
    NOT_RUNNING = "NotRunning"
    AT_DESIRED = "AtDesired"
    """Degraded False."""
    BELOW_DESIRED = "BelowDesired"
    """Degraded: the world is smaller than ``replicas`` for lack of capacity."""
    SIZE_UNFORMABLE = "WorldSizeUnformable"
    """Degraded: no world of ``replicas`` pods can train this job, whatever the capacity (the
    global batch does not split over that many replicas, memory); the message says why."""

    # -- Suspended --------------------------------------------------------------------------
    ACTIVE = "Active"
    """Suspended False."""
    AWAITING_ADMISSION = "AwaitingAdmission"
    """The job's Workload waits for Kueue to admit it."""
    EVICTED_BY_KUEUE = "EvictedByKueue"
    """Kueue withdrew the admission; the job stops and queues again."""
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    """Suspended while the workers stop after ``activeDeadlineSeconds``, then Failed."""

    # -- Succeeded, Failed ------------------------------------------------------------------
    ALL_WORKERS_SUCCEEDED = "AllWorkersSucceeded"
    NOT_FINISHED = "NotFinished"
    PERMANENT_FAILURE = "PermanentFailure"
    """Failed: a worker exited with a code in ``failurePolicy.permanentExitCodes``."""
    BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
    """Failed: restarts would exceed ``failurePolicy.maxRestarts``."""
    JOB_FAILED = "JobFailed"
    """Running, Resizing and Suspended False once the job failed."""

    # -- Events only ------------------------------------------------------------------------
    FAILED_CREATE = "FailedCreate"
    """The API server refused a worker pod (a ResourceQuota, an admission webhook, a
    LimitRange); the batch waits gated and the pass is retried with backoff."""


FAILURE_REASONS = (Reason.WORKER_FAILED, Reason.WORKER_LOST, Reason.JOIN_TIMED_OUT)
"""The resizes that replace members which failed, were lost or never started: the
replacements count as restarts (``failurePolicy.maxRestarts``)."""
