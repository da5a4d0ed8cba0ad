"""Plans as immutable data, and their JSON form (the contract `elastra plan --output json`
prints and external checks read).

A ``Plan`` says which GPU types the job uses and how many, the parallel degrees, the
micro-batch, sharding and recomputation, each type's batch share, the predicted step and the
rank -> pod -> node map. A ``PlanResult`` ranks plans best first and says why the rest were
rejected. Everything is frozen: the controller, simulator and CLI share plans as values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from elastra.planner.catalog import GpuTypeName
from elastra.planner.inventory import NodeName
from elastra.planner.job import Recompute, Sharding
from elastra.planner.perfmodel import StepPrediction


@dataclass(frozen=True)
class TypeShare:
    """One GPU type in a plan: its GPUs, pods, data-parallel replicas and batch share."""

    gpu_type: GpuTypeName
    gpus: int
    pods: int
    replicas: int
    batch_share: int
    """Sequences per step for each data-parallel replica of this type."""
    hourly_usd: float


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
class Plan:
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

    plans: tuple[Plan, ...]
    reason: str | None
    rejections: tuple[Rejection, ...]
    candidates: int
    """How many complete candidates the model evaluated."""

    @property
    def feasible(self) -> bool:
        """Whether any plan fits."""
        return bool(self.plans)


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """One plan in the JSON contract's shape."""
    predicted = plan.predicted
    return {
        "gpuTypes": {share.gpu_type: share.gpus for share in plan.types},
        "dp": plan.dp,
        "tp": plan.tp,
        "pp": plan.pp,
        "microBatchSize": plan.micro_batch,
        "sharding": plan.sharding,
        "recompute": plan.recompute,
        "batchShares": {share.gpu_type: share.batch_share for share in plan.types},
        "predicted": {
            "stepTimeSeconds": predicted.step_time_s,
            "tokensPerSecond": predicted.tokens_per_s,
            "tflopsPerGpu": predicted.tflops_per_gpu,
            "mfu": predicted.mfu,
            "peakMemoryGiB": predicted.peak_memory_gib,
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
