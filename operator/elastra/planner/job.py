"""What the planner needs to know about a job, independent of the CRD's shape.

The planner core reads ``JobRequirements`` only, so it can be driven by the TrainingJob spec
(``requirements_from_spec`` in ``fromspec``), by the simulator, by benchmarks and by tests
alike. Construction checks the invariants the search relies on and raises ``UserError``
naming the field, so a bad value never reaches the search as an exception deep inside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from elastra.errors import UserError
from elastra.planner.catalog import Precision

Sharding = Literal["none", "optimizer", "full"]
Recompute = Literal["none", "selective", "full"]
Objective = Literal["throughput", "cost"]

SHARDING_MODES: tuple[Sharding, ...] = ("none", "optimizer", "full")
RECOMPUTE_MODES: tuple[Recompute, ...] = ("none", "selective", "full")
"""Ordered cheapest first: under the model each later mode costs more time, less memory."""


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer.

    ``gated_mlp`` (SwiGLU-style, three MLP matrices) is inferred when unset: gated unless the
    MLP is exactly 4x the hidden size, which holds for GPT-2/3, OPT, BLOOM, MT-NLG (not gated)
    and the Llama family (gated).
    """

    layers: int
    hidden_size: int
    ffn_hidden_size: int
    attention_heads: int
    kv_heads: int
    vocab_size: int
    sequence_length: int
    gated_mlp: bool | None = None

    def __post_init__(self) -> None:
        for name in (
            "layers",
            "hidden_size",
            "ffn_hidden_size",
            "attention_heads",
            "kv_heads",
            "vocab_size",
            "sequence_length",
        ):
            if getattr(self, name) < 1:
                raise UserError(f"model.{name}: must be >= 1")
        if self.hidden_size % self.attention_heads:
            raise UserError("model.hiddenSize: must be a multiple of model.attentionHeads")
        if self.attention_heads % self.kv_heads:
            raise UserError("model.kvHeads: must divide model.attentionHeads")

    @property
    def gated(self) -> bool:
        """Whether the MLP has a gate matrix (three projections instead of two)."""
        if self.gated_mlp is not None:
            return self.gated_mlp
        return self.ffn_hidden_size != 4 * self.hidden_size


@dataclass(frozen=True)
class JobRequirements:
    """The planner's input about the job.

    ``gpus_per_worker`` GPUs come with each worker pod (0: a CPU job whose pods each take
    ``cpus_per_worker`` cores); the job uses between ``min_replicas`` and ``replicas`` pods.
    ``gpu_types`` are ``worker.gpuTypes`` patterns (catalog names, product labels, marketing
    names); empty allows any. ``tensor``/``pipeline`` are fixed in manual mode, ``None`` lets
    the planner choose; ``sharding`` lists the modes the planner may pick from.
    ``micro_batch`` pins the micro-batch size (``None``: the planner chooses): a
    ``consistency: bitwise`` job keeps the one its first world ran with, because it is the
    logical share whose order fixes the gradient sum.
    """

    global_batch_size: int
    replicas: int
    min_replicas: int = 1
    gpus_per_worker: int = 8
    precision: Precision = "bf16"
    model: ModelShape | None = None
    gpu_types: tuple[str, ...] = ()
    tensor: int | None = None
    pipeline: int | None = None
    sharding: tuple[Sharding, ...] = SHARDING_MODES
    objective: Objective = "throughput"
    heterogeneous: bool = False
    cpus_per_worker: float = 1.0
    micro_batch: int | None = None
    cpu_ranks: int = 1
    """Ranks in each pod of a CPU job (``worker.cpuRanks``)."""

    def __post_init__(self) -> None:
        if self.global_batch_size < 1:
            raise UserError("training.globalBatchSize: must be >= 1")
        if self.min_replicas < 1 or self.replicas < self.min_replicas:
            raise UserError("minReplicas/replicas: need 1 <= minReplicas <= replicas")
        if self.gpus_per_worker < 0:
            raise UserError("worker.gpus: must be >= 0")
        if self.tensor is not None and self.tensor < 1:
            raise UserError("parallelism.tensor: must be >= 1")
        if self.pipeline is not None and self.pipeline < 1:
            raise UserError("parallelism.pipeline: must be >= 1")
        if not self.sharding or not set(self.sharding) <= set(SHARDING_MODES):
            raise UserError(f"parallelism.sharding: one of {', '.join(SHARDING_MODES)}")
        if self.cpus_per_worker <= 0:
            raise UserError("worker.resources.requests.cpu: must be > 0")
        if self.micro_batch is not None and self.micro_batch < 1:
            raise UserError("microBatchSize: must be >= 1")

    @property
    def devices_per_worker(self) -> int:
        """Ranks per pod: its GPUs, or ``cpu_ranks`` for a CPU pod."""
        return self.gpus_per_worker if self.gpus_per_worker > 0 else self.cpu_ranks

    @property
    def is_cpu(self) -> bool:
        """A CPU job (``worker.gpus: 0``)."""
        return self.gpus_per_worker == 0
