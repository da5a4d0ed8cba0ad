"""The TrainingJob status: what the operator observed and decided, for users and for itself.

The operator records decisions here before acting on them (level-triggered): the world version
and restart count in status are what the next pass reconciles toward, so a restarted operator
continues instead of starting over. Numbers are integers (milliseconds, tokens per second)
because Kubernetes API conventions avoid floats in stored objects.

Status models ignore unknown fields so that an older operator can read the status a newer
one wrote during an upgrade.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import ConfigDict, Field, StringConstraints

from elastra.api.base import ApiModel

ReasonText = Annotated[
    str, StringConstraints(max_length=128, pattern=r"^([A-Za-z][A-Za-z0-9_]*)?$")
]
Message = Annotated[str, StringConstraints(max_length=4096)]
Name = Annotated[str, StringConstraints(max_length=253)]
Timestamp = Annotated[str, StringConstraints(max_length=64)]

MAX_RANKS = 65536
"""Ranks are pods x GPUs per pod: 4096 pods of 16 GPUs."""


class StatusModel(ApiModel):
    """Status parts: frozen and camelCase like the spec, tolerant of unknown fields."""

    model_config = ConfigDict(extra="ignore")


class ConditionType(StrEnum):
    """The conditions a TrainingJob reports, each with a reason and a message."""

    ADMITTED = "Admitted"
    PLACED = "Placed"
    RUNNING = "Running"
    RESIZING = "Resizing"
    DEGRADED = "Degraded"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class ConditionStatus(StrEnum):
    """Kubernetes' tri-state condition status."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Phase(StrEnum):
    """A one-word summary of the conditions for ``kubectl get``."""

    PENDING = "Pending"
    PLACING = "Placing"
    RUNNING = "Running"
    RESIZING = "Resizing"
    DEGRADED = "Degraded"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class Condition(StatusModel):
    """A Kubernetes-style condition: machine-readable reason, human-readable message."""

    type: ConditionType
    status: ConditionStatus
    reason: ReasonText = Field(default="", description="Why, in one CamelCase word.")
    message: Message = Field(default="", description="Why, for people: the particulars.")
    last_transition_time: Timestamp | None = Field(
        default=None, description="When status last changed (RFC 3339)."
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation of the spec this was judged on."
    )


class WorldStatus(StatusModel):
    """The current world: a version that only grows, and the pods in rank order."""

    version: int = Field(
        default=0, ge=0, description="World version: grows by one with every new world."
    )
    size: int = Field(default=0, ge=0, le=MAX_RANKS, description="Trainer ranks (WORLD_SIZE).")
    replicas: int = Field(default=0, ge=0, description="Worker pods in the world.")
    ranks: list[Name] = Field(
        default_factory=list, max_length=4096, description="Pod of each rank group, in order."
    )


class PlanStatus(StatusModel):
    """The plan the current world runs, as the planner chose it."""

    dp: int = Field(default=1, ge=1, description="Data-parallel replicas.")
    tp: int = Field(default=1, ge=1, description="Tensor-parallel degree.")
    pp: int = Field(default=1, ge=1, description="Pipeline stages.")
    shape: Annotated[str, StringConstraints(max_length=64)] = Field(
        default="", description="dp x tp x pp, for kubectl get."
    )
    micro_batch_size: int = Field(
        default=1, ge=1, description="Sequences per micro-batch of one forward/backward."
    )
    virtual_stages: int = Field(
        default=1, ge=1, le=1024, description="Virtual pipeline stages per GPU (interleaving)."
    )
    schedule: Annotated[str, StringConstraints(max_length=32)] = Field(
        default="1f1b", description="Pipeline schedule: 1f1b or interleaved1f1b."
    )
    sharding: Annotated[str, StringConstraints(max_length=16)] = Field(
        default="none", description="Data-parallel state sharding: none, optimizer or full."
    )
    recompute: Annotated[str, StringConstraints(max_length=16)] = Field(
        default="none", description="Activation recomputation: none, selective or full."
    )
    gpu_types: dict[Name, int] = Field(
        default_factory=dict, max_length=16, description="GPUs the plan uses, by type."
    )
    gpu_summary: Annotated[str, StringConstraints(max_length=256)] = Field(
        default="", description="GPU types and counts, for kubectl get."
    )
    batch_shares: dict[Name, int] = Field(
        default_factory=dict,
        max_length=16,
        description="Sequences per step of the most loaded data-parallel replica of each type.",
    )
    dp_shares: list[int] = Field(
        default_factory=list,
        max_length=65536,
        description="Sequences per step of each data-parallel rank, in rank order.",
    )
    predicted_step_millis: int = Field(
        default=0, ge=0, description="Step time the performance model predicts, milliseconds."
    )
    predicted_tokens_per_second: int = Field(
        default=0, ge=0, description="Throughput the performance model predicts."
    )
    bottleneck: Annotated[str, StringConstraints(max_length=32)] = Field(
        default="",
        description=(
            "The largest part of the predicted step: compute, memory (recomputation), "
            "tp-comm, pp-bubble, dp-comm or optimizer."
        ),
    )


class PodPlacementStatus(StatusModel):
    """Where one rank group (one pod) runs."""

    rank: int = Field(ge=0, description="Global rank of the pod's first trainer.")
    pod: Name = Field(description="Worker pod.")
    node: Name = Field(description="Node the pod runs on.")
    gpu_type: Annotated[str, StringConstraints(max_length=63)] = Field(
        default="", description="GPU type of the node (catalog name)."
    )


class ProgressStatus(StatusModel):
    """Training progress reported by the workers."""

    step: int = Field(default=0, ge=0, description="Optimizer steps completed (rank 0).")
    samples_per_second: int = Field(
        default=0, ge=0, description="Global samples per second over the last step."
    )
    last_checkpoint_step: int | None = Field(
        default=None, ge=0, description="Step of the last committed checkpoint."
    )
    goodput_percent: int | None = Field(
        default=None,
        ge=0,
        le=100,
        description="Percent of wall time since the job's first step spent in steps it kept "
        "(resize gaps and steps lost to failures are not), as rank 0 measures it.",
    )


class ResizeRecord(StatusModel):
    """One past resize: from which world to which, and why."""

    from_version: int = Field(ge=0, description="World version before.")
    to_version: int = Field(ge=0, description="World version after.")
    from_replicas: int = Field(ge=0, description="Worker pods before.")
    to_replicas: int = Field(ge=0, description="Worker pods after.")
    reason: ReasonText = Field(
        description="Why: ScaledDown, ScaledUp, WorkerFailed, WorkerLost ..."
    )
    time: Timestamp = Field(description="When the new world was recorded (RFC 3339).")
    downtime_millis: int | None = Field(
        default=None,
        ge=0,
        description=(
            "Milliseconds from the end of the step the new world resumed from to the end of its "
            "first step, as its rank 0 measured them (unset until it reports)."
        ),
    )
    state_from: Annotated[str, StringConstraints(max_length=16)] | None = Field(
        default=None,
        description=(
            "Where the new world's rank 0 took its state from: memory (it kept it, moving in "
            "its own process), peers (members that held it in memory sent it), storage (the "
            "committed checkpoint: all of it, or a part that left with a member)."
        ),
    )
    peers_lost: bool | None = Field(
        default=None,
        description=(
            "True when the new world dropped members that could not stop with the world "
            "before (their trainers exited, their node or pod was gone, or they never "
            "started): its survivors ended their trainers without a checkpoint. Unset when "
            "the world before stopped together."
        ),
    )


class CapacityRequestState(StrEnum):
    """Where a job's request for nodes stands (see ``CapacityRequestStatus``)."""

    REQUESTED = "Requested"
    """Capacity-request pods are out: the cluster's autoscaler is asked for nodes."""
    UNSATISFIED = "Unsatisfied"
    """No autoscaler gave the job usable nodes in time: the request was withdrawn and is made
    again only when a node is added, the spec changes or the job loses workers."""
    DECLINED = "Declined"
    """Nodes came, and the planner prefers fewer workers than asked on them: the rest of the
    request was withdrawn, and is made again only when the spec changes or the job loses
    workers."""


class CapacityRequestStatus(StatusModel):
    """The job's request for more nodes: pending capacity-request pods, one per missing
    worker, that the cluster's autoscaler provisions nodes for (docs/autoscaling.md)."""

    state: CapacityRequestState = Field(description="Requested, Unsatisfied or Declined.")
    workers: int = Field(
        ge=0,
        le=4096,
        description=(
            "Requested: workers' worth of nodes asked for; Unsatisfied or Declined: the "
            "workers the job had when the request was withdrawn."
        ),
    )
    since: Timestamp = Field(description="When the request entered this state (RFC 3339).")
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation of the spec it was made for."
    )
    message: Message = Field(default="", description="What was asked for, or why it ended.")


class TrainingJobStatus(StatusModel):
    """The observed state of a TrainingJob."""

    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the operator last reconciled."
    )
    phase: Phase | None = None
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        description="Admitted, Placed, Running, Resizing, Degraded, Suspended, Succeeded, Failed.",
    )
    replicas: int = Field(
        default=0, ge=0, description="Worker pods of the current world (scale subresource)."
    )
    ready_replicas: int = Field(default=0, ge=0, description="Worker pods that are Ready.")
    selector: Annotated[str, StringConstraints(max_length=1024)] = Field(
        default="", description="Label selector of the worker pods (scale subresource, HPA)."
    )
    world: WorldStatus = Field(default_factory=WorldStatus)
    plan: PlanStatus | None = None
    placement: list[PodPlacementStatus] = Field(
        default_factory=list, max_length=4096, description="Where each rank group runs."
    )
    progress: ProgressStatus = Field(default_factory=ProgressStatus)
    restarts: int = Field(
        default=0, ge=0, description="Failure-driven restarts so far (failurePolicy.maxRestarts)."
    )
    last_resize_time: Timestamp | None = Field(
        default=None, description="When the last new world was recorded (RFC 3339)."
    )
    resizes: list[ResizeRecord] = Field(
        default_factory=list, max_length=20, description="The latest resizes, oldest first."
    )
    start_time: Timestamp | None = Field(
        default=None,
        description=(
            "When the job last started to run (RFC 3339): neither suspended nor waiting for "
            "Kueue. Cleared while it is held, so a resumed job starts afresh; "
            "spec.activeDeadlineSeconds counts from it."
        ),
    )
    completion_time: Timestamp | None = Field(
        default=None,
        description=(
            "When the job became Succeeded or Failed (RFC 3339); "
            "spec.ttlSecondsAfterFinished counts from it."
        ),
    )
    admitted_replicas: int | None = Field(
        default=None,
        ge=0,
        description=(
            "Worker pods Kueue admitted (the Workload's podSet count) for a job with the "
            "kueue.x-k8s.io/queue-name label; the world never grows past it. Unset: no Kueue "
            "admission in force."
        ),
    )
    capacity_request: CapacityRequestStatus | None = Field(
        default=None,
        description=(
            "The job's request for nodes from the cluster's autoscaler, while it wants more "
            "workers than the nodes hold (unset: none)."
        ),
    )
