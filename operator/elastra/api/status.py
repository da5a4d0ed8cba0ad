"""The TrainingJob status: what the operator observed and decided, for users and for itself.

The operator records decisions here before acting on them (STYLE.md item 3): the world version
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

Reason = Annotated[str, StringConstraints(max_length=128, pattern=r"^([A-Za-z][A-Za-z0-9_]*)?$")]
Message = Annotated[str, StringConstraints(max_length=4096)]
Name = Annotated[str, StringConstraints(max_length=253)]
Timestamp = Annotated[str, StringConstraints(max_length=64)]

MAX_RANKS = 65536
"""Ranks are pods x GPUs per pod: 4096 pods of 16 GPUs."""


class StatusModel(ApiModel):
    """Status parts: frozen and camelCase like the spec, tolerant of unknown fields."""

    model_config = ConfigDict(extra="ignore")


class ConditionType(StrEnum):
    """The conditions a TrainingJob reports (DESIGN.md section 2)."""

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
    reason: Reason = ""
    message: Message = ""
    last_transition_time: Timestamp | None = None
    observed_generation: int | None = Field(default=None, ge=0)


class WorldStatus(StatusModel):
    """The current world: a version that only grows, and the pods in rank order."""

    version: int = Field(default=0, ge=0)
    size: int = Field(default=0, ge=0, le=MAX_RANKS, description="Trainer ranks (WORLD_SIZE).")
    replicas: int = Field(default=0, ge=0, description="Worker pods in the world.")
    ranks: list[Name] = Field(
        default_factory=list, max_length=4096, description="Pod of each rank group, in order."
    )


class PlanStatus(StatusModel):
    """The plan the current world runs, as the planner chose it."""

    dp: int = Field(default=1, ge=1)
    tp: int = Field(default=1, ge=1)
    pp: int = Field(default=1, ge=1)
    shape: Annotated[str, StringConstraints(max_length=64)] = Field(
        default="", description="dp x tp x pp, for kubectl get."
    )
    micro_batch_size: int = Field(default=1, ge=1)
    sharding: Annotated[str, StringConstraints(max_length=16)] = "none"
    recompute: Annotated[str, StringConstraints(max_length=16)] = "none"
    gpu_types: dict[Name, int] = Field(default_factory=dict, max_length=16)
    gpu_summary: Annotated[str, StringConstraints(max_length=256)] = Field(
        default="", description="GPU types and counts, for kubectl get."
    )
    batch_shares: dict[Name, int] = Field(
        default_factory=dict,
        max_length=16,
        description="Sequences per step per data-parallel replica of each GPU type.",
    )
    dp_shares: list[int] = Field(
        default_factory=list,
        max_length=65536,
        description="Sequences per step of each data-parallel rank, in rank order.",
    )
    predicted_step_millis: int = Field(default=0, ge=0)
    predicted_tokens_per_second: int = Field(default=0, ge=0)
    bottleneck: Annotated[str, StringConstraints(max_length=32)] = ""


class RankPlacement(StatusModel):
    """Where one rank group (one pod) runs."""

    rank: int = Field(ge=0)
    pod: Name
    node: Name
    gpu_type: Annotated[str, StringConstraints(max_length=63)] = ""


class ProgressStatus(StatusModel):
    """Training progress reported by the workers."""

    step: int = Field(default=0, ge=0)
    samples_per_second: int = Field(default=0, ge=0)
    last_checkpoint_step: int | None = Field(default=None, ge=0)


class ResizeRecord(StatusModel):
    """One past resize: from which world to which, and why."""

    from_version: int = Field(ge=0)
    to_version: int = Field(ge=0)
    from_replicas: int = Field(ge=0)
    to_replicas: int = Field(ge=0)
    reason: Reason
    time: Timestamp


class TrainingJobStatus(StatusModel):
    """The observed state of a TrainingJob."""

    observed_generation: int | None = Field(default=None, ge=0)
    phase: Phase | None = None
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    replicas: int = Field(
        default=0, ge=0, description="Worker pods of the current world (scale subresource)."
    )
    ready_replicas: int = Field(default=0, ge=0)
    selector: Annotated[str, StringConstraints(max_length=1024)] = Field(
        default="", description="Label selector of the worker pods (scale subresource, HPA)."
    )
    world: WorldStatus = Field(default_factory=WorldStatus)
    plan: PlanStatus | None = None
    placement: list[RankPlacement] = Field(default_factory=list, max_length=4096)
    progress: ProgressStatus = Field(default_factory=ProgressStatus)
    restarts: int = Field(default=0, ge=0)
    last_resize_time: Timestamp | None = None
    resizes: list[ResizeRecord] = Field(
        default_factory=list, max_length=20, description="The latest resizes, oldest first."
    )
