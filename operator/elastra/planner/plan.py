"""Plans as immutable data, and their JSON form (the contract `elastra plan --output json`
prints and external checks read).

A ``JobPlan`` says which GPU types the job uses and how many, the parallel degrees, the
micro-batch, sharding and recomputation, each data-parallel replica's batch share, the
predicted step, the rank -> pod -> node map and each pipeline stage's layers. A
``PlanResult`` ranks plans best first and says why the rest were rejected. Everything is
frozen: the controller, simulator and CLI share plans as values.

``plan_to_dict`` prints the layout fields the workers are told, through the one road from a
placed plan to the worker's ``ParallelPlan`` (``elastra.planner.record``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from elastra.planner.catalog import GpuTypeName
from elastra.planner.inventory import NodeName
from elastra.planner.job import Recompute, Sharding
from elastra.planner.perfmodel import StepPrediction
from elastra.planner.record import assignment_plan, plan_status
from elastra_worker.assignment import StageLayers, plan_to_wire


@dataclass(frozen=True)
class TypeShare:
    """One GPU type in a plan: its GPUs, pods, data-parallel replicas and batch share."""

    gpu_type: GpuTypeName
    gpus: int
    pods: int
    replicas: int
    batch_share: int
    """Sequences per step of this type's most loaded replica (all of them, when even)."""
    hourly_usd: float
    shares: tuple[int, ...] = ()
    """Sequences per step of each replica of this type, in data-parallel order; empty: every
    replica takes ``batch_share``. Replicas of one type differ by at most one micro-batch
    (one round of ``pp`` micro-batches with interleaving) when the batch does not divide."""
    peak_memory_gib: float = 0.0
    """Predicted peak memory of this type's most loaded GPU, GiB (0 without a model). In a mix
    it differs by type: a replica running fewer micro-batches than ``pp`` holds fewer in
    flight; the plan's ``predicted.peak_memory_gib`` is the largest of them."""

    @property
    def replica_shares(self) -> tuple[int, ...]:
        """Sequences per step of each replica of this type, in data-parallel order."""
        return self.shares or (self.batch_share,) * self.replicas


@dataclass(frozen=True)
class RankPlacement:
    """Where one rank runs and which part of the model it holds."""

    rank: int
    node: NodeName
    gpu_type: GpuTypeName
    dp_rank: int
    tp_rank: int
    pp_stage: int
    pod: int


@dataclass(frozen=True)
class PodPlacement:
    """One worker pod: its index (the pod ordinal), node, type and its first global rank."""

    index: int
    node: NodeName
    gpu_type: GpuTypeName
    first_rank: int


@dataclass(frozen=True)
class JobPlan:
    """A ranked plan. ``types`` are ordered as data-parallel ranks are: fastest type first."""

    types: tuple[TypeShare, ...]
    dp: int
    tp: int
    pp: int
    micro_batch: int
    sharding: Sharding
    recompute: Recompute
    predicted: StepPrediction
    pods: tuple[PodPlacement, ...] = ()
    ranks: tuple[RankPlacement, ...] = ()
    interleave: int = 1
    """Virtual pipeline stages per GPU (Megatron's interleaved 1F1B schedule)."""
    stages: tuple[StageLayers, ...] = ()
    """The layers of each of the ``pp * interleave`` (virtual) stages; empty without a model."""

    @property
    def batch_shares(self) -> tuple[int, ...]:
        """Sequences per step of every data-parallel replica, in dp-rank order."""
        return tuple(s for share in self.types for s in share.replica_shares)

    @property
    def gpus(self) -> int:
        """GPUs (ranks, for a CPU job) the plan uses."""
        return sum(share.gpus for share in self.types)

    @property
    def hourly_usd(self) -> float:
        """What the plan's GPUs cost per hour at catalog prices."""
        return sum(share.gpus * share.hourly_usd for share in self.types)

    @property
    def tokens_per_dollar(self) -> float:
        """Tokens (samples, for a job without a model) per dollar."""
        cost = self.hourly_usd
        return self.predicted.tokens_per_s * 3600.0 / cost if cost > 0 else 0.0

    def summary(self) -> str:
        """One line such as ``4x8 H100-SXM-80GB + 4x8 A100-SXM-80GB dp=16 tp=2 pp=2``."""
        kinds = " + ".join(f"{s.gpus} {s.gpu_type}" for s in self.types)
        return (
            f"{kinds}: dp={self.dp} tp={self.tp} pp={self.pp}"
            + (f"x{self.interleave}" if self.interleave > 1 else "")
            + f" mb={self.micro_batch} "
            f"sharding={self.sharding} recompute={self.recompute}"
        )


@dataclass(frozen=True)
class Rejection:
    """Candidates rejected for one reason category, with one representative example."""

    category: str
    count: int
    example: str


@dataclass(frozen=True)
class PlanResult:
    """The outcome of planning: ranked plans (best first) or the reason none fits."""

    plans: tuple[JobPlan, ...]
    reason: str | None
    rejections: tuple[Rejection, ...]
    candidates: int
    """How many complete candidates the model evaluated."""
    short_of_capacity: bool = False
    """No plan because too few pod slots of the allowed types are free: more capacity would
    help. Otherwise the job cannot run at this size on any capacity like this (divisibility,
    memory) and the reason says why."""

    @property
    def feasible(self) -> bool:
        """Whether any plan fits."""
        return bool(self.plans)


def plan_to_dict(plan: JobPlan) -> dict[str, Any]:
    """One plan in the JSON contract's shape.

    ``batchShares`` is per GPU type (its most loaded replica), ``replicaBatchShares`` per
    data-parallel replica; ``predicted.peakMemoryGiB`` is the most any GPU needs and
    ``predicted.peakMemoryGiBByType`` what a GPU of each type needs; ``placement`` extends the
    assignment's ``ranks`` with nodes and types. The other layout fields are the assignment's
    ``plan`` fields, through the road the operator takes (``elastra.planner.record``).
    """
    predicted = plan.predicted
    layers = plan.stages[-1].stop if plan.stages else 0
    wire = plan_to_wire(assignment_plan(plan_status(plan), layers=layers))
    return {
        "gpuTypes": {share.gpu_type: share.gpus for share in plan.types},
        "dp": wire["dp"],
        "tp": wire["tp"],
        "pp": wire["pp"],
        "microBatchSize": wire["microBatchSize"],
        "sharding": wire["sharding"],
        "recompute": wire["recompute"],
        "virtualStages": wire["virtualStages"],
        "schedule": wire["schedule"],
        "stages": wire["stages"],
        "batchShares": {share.gpu_type: share.batch_share for share in plan.types},
        "replicaBatchShares": wire["batchShares"],
        "predicted": {
            "stepTimeSeconds": predicted.step_time_s,
            "tokensPerSecond": predicted.tokens_per_s,
            "tflopsPerGpu": predicted.tflops_per_gpu,
            "mfu": predicted.mfu,
            "peakMemoryGiB": predicted.peak_memory_gib,
            "peakMemoryGiBByType": {share.gpu_type: share.peak_memory_gib for share in plan.types},
            "bottleneck": predicted.bottleneck,
        },
        "placement": [
            {
                "rank": r.rank,
                "node": r.node,
                "gpuType": r.gpu_type,
                "dpRank": r.dp_rank,
                "tpRank": r.tp_rank,
                "ppStage": r.pp_stage,
            }
            for r in plan.ranks
        ],
    }


def result_to_dict(result: PlanResult) -> dict[str, Any]:
    """The whole result in the JSON contract's shape."""
    return {
        "feasible": result.feasible,
        "reason": result.reason,
        "plans": [plan_to_dict(plan) for plan in result.plans],
    }
