"""The TrainingJob spec (elastra.dev/v1alpha1): the single source of truth for the API.

The CRD in ``crds/`` is generated from these models, and the same models parse the object in
the operator and in ``elastra plan``; so a field, its bounds, its default and its
documentation are written here once. Field names are a contract (DESIGN.md section 2):
examples, tests and external checks use them.

Bounds are deliberately generous but finite: every string has a maximum length and every list
a maximum size so that the API server can estimate the cost of CEL rules and so that one bad
object cannot bloat etcd.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, ClassVar

from pydantic import Field, StringConstraints

from elastra.api.base import ApiModel
from elastra.api.rules import Rule, immutable

MAX_REPLICAS = 4096
"""Upper bound on worker pods per job; far above any plan the planner can rank quickly."""

MAX_GPUS_PER_WORKER = 16
"""The largest GPU count of one node that ships today (16 x V100 in a DGX-2)."""

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
QUANTITY = r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[numkMGTPE]i?|Ki)?$"
URI = r"^[a-z][a-z0-9+.-]*://.+$"
GPU_TYPE = r"^[A-Za-z0-9][-A-Za-z0-9_.]*$"
ABSOLUTE_PATH = r"^/"

PATTERN_HINTS = {
    DNS_LABEL: "a DNS label: lowercase letters, digits and '-'",
    DNS_SUBDOMAIN: "a DNS name: lowercase letters, digits, '-' and '.'",
    ENV_NAME: "an environment variable name: letters, digits, '_', '-', '.', not a digit first",
    QUANTITY: "a Kubernetes quantity such as 500m, 2, 4Gi",
    URI: "a URI with a scheme, such as s3://bucket/prefix",
    GPU_TYPE: "a GPU type: letters, digits, '-', '_', '.' (e.g. H100, NVIDIA-A100-SXM4-80GB)",
    ABSOLUTE_PATH: "an absolute path (starting with /)",
}
"""What each pattern means, for error messages: a regex is not an explanation."""

ShortText = Annotated[str, StringConstraints(min_length=1, max_length=253)]
Arg = Annotated[str, StringConstraints(max_length=4096)]
GpuTypeName = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=GPU_TYPE)]
Quantity = Annotated[str, StringConstraints(max_length=64, pattern=QUANTITY)]
ResourceName = Annotated[str, StringConstraints(min_length=1, max_length=253)]


class Precision(StrEnum):
    """Arithmetic the trainer uses; the planner reads the matching peak FLOP/s per GPU type."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"


class Consistency(StrEnum):
    """What a resized run keeps equal to a static run.

    ``none``: nothing beyond convergence. ``data``: the same samples in every global step.
    ``bitwise``: also a fixed reduction order, so parameters match bit for bit on CPU.
    """

    NONE = "none"
    DATA = "data"
    BITWISE = "bitwise"


class ParallelismMode(StrEnum):
    """``auto``: the planner picks tensor/pipeline degrees; ``manual``: the spec fixes them."""

    AUTO = "auto"
    MANUAL = "manual"


class Sharding(StrEnum):
    """How data-parallel replicas share state: ZeRO-style optimizer or full (FSDP) sharding."""

    NONE = "none"
    OPTIMIZER = "optimizer"
    FULL = "full"


class Objective(StrEnum):
    """What the planner maximises: tokens per second, or tokens per dollar."""

    THROUGHPUT = "throughput"
    COST = "cost"


class EnvVar(ApiModel):
    """A literal environment variable for the trainer process."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=ENV_NAME)]
    value: Annotated[str, StringConstraints(max_length=32768)] = ""


class ResourceRequirements(ApiModel):
    """CPU/memory (and other non-GPU) requests and limits of each worker pod.

    GPUs are not set here: ``worker.gpus`` is the only place, so the planner and the pod
    spec cannot disagree.
    """

    requests: dict[ResourceName, Quantity] = Field(default_factory=dict, max_length=16)
    limits: dict[ResourceName, Quantity] = Field(default_factory=dict, max_length=16)

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel=(
                "(!has(self.requests) || !('nvidia.com/gpu' in self.requests)) && "
                "(!has(self.limits) || !('nvidia.com/gpu' in self.limits))"
            ),
            message="set GPUs with worker.gpus, not in worker.resources",
            check=lambda r: "nvidia.com/gpu" not in r.requests and "nvidia.com/gpu" not in r.limits,
        ),
    )


class WorkerSpec(ApiModel):
    """What every worker pod runs and needs."""

    gpus: int = Field(
        default=0,
        ge=0,
        le=MAX_GPUS_PER_WORKER,
        description="GPUs per worker pod; 0 makes a CPU job. One trainer process per GPU.",
    )
    gpu_types: list[GpuTypeName] = Field(
        default_factory=list,
        max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "set"},
        description=(
            "GPU types the job may use, as catalog names (H100, A100-80GB) or GPU Feature "
            "Discovery product labels (NVIDIA-H100-80GB-HBM3). Empty: any type."
        ),
    )
    image: Annotated[str, StringConstraints(min_length=1, max_length=512)] = Field(
        description="Container image of the worker (python, torch and elastra_worker)."
    )
    command: list[Arg] = Field(default_factory=list, max_length=64)
    args: list[Arg] = Field(default_factory=list, max_length=256)
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=128,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="self.gpus > 0 || !has(self.gpuTypes) || size(self.gpuTypes) == 0",
            message="gpuTypes needs gpus > 0: a CPU job (gpus: 0) cannot ask for GPU types",
            check=lambda w: w.gpus > 0 or not w.gpu_types,
            field=".gpuTypes",
        ),
    )


class ModelSpec(ApiModel):
    """A decoder-only transformer profile; the planner's performance model reads it."""

    layers: int = Field(ge=1, le=1024, description="Transformer blocks.")
    hidden_size: int = Field(ge=1, le=131072)
    ffn_hidden_size: int = Field(ge=1, le=524288, description="Width of the MLP.")
    attention_heads: int = Field(ge=1, le=1024)
    kv_heads: int | None = Field(
        default=None, ge=1, le=1024, description="Grouped-query KV heads; default: heads."
    )
    vocab_size: int = Field(ge=1, le=4194304)
    sequence_length: int = Field(ge=1, le=1048576, description="Tokens per sequence.")

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="self.hiddenSize % self.attentionHeads == 0",
            message="hiddenSize must be a multiple of attentionHeads",
            check=lambda m: m.hidden_size % m.attention_heads == 0,
            field=".hiddenSize",
        ),
        Rule(
            cel="!has(self.kvHeads) || self.attentionHeads % self.kvHeads == 0",
            message="kvHeads must divide attentionHeads (grouped-query attention)",
            check=lambda m: m.kv_heads is None or m.attention_heads % m.kv_heads == 0,
            field=".kvHeads",
        ),
    )


class TrainingSpec(ApiModel):
    """The optimisation semantics a resize must preserve."""

    global_batch_size: int = Field(
        ge=1,
        le=16777216,
        description="Sequences per optimizer step; fixed across resizes, whatever the world.",
    )
    precision: Precision = Precision.BF16
    consistency: Consistency = Field(
        default=Consistency.DATA,
        description="What a resized run keeps equal to a static run (none, data, bitwise).",
    )
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed of the data order.")
    total_steps: int | None = Field(
        default=None,
        ge=1,
        le=2**40,
        description="Optimizer steps of the whole run, when known; weighs resize gains.",
    )

    RULES: ClassVar[tuple[Rule, ...]] = (
        immutable(
            "globalBatchSize",
            parent="training.",
            why="the data order and the step semantics depend on it",
        ),
        immutable("seed", parent="training.", why="the data order of every step derives from it"),
    )


class ParallelismSpec(ApiModel):
    """How the model is split; in auto mode the planner decides."""

    mode: ParallelismMode = ParallelismMode.AUTO
    tensor: int | None = Field(
        default=None, ge=1, le=MAX_GPUS_PER_WORKER, description="Tensor-parallel degree."
    )
    pipeline: int | None = Field(default=None, ge=1, le=1024, description="Pipeline stages.")
    sharding: Sharding | None = Field(
        default=None, description="Data-parallel state sharding; unset: the planner chooses."
    )

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="self.mode != 'manual' || (has(self.tensor) && has(self.pipeline))",
            message="mode: manual needs both tensor and pipeline",
            check=lambda p: p.mode != "manual" or (p.tensor is not None and p.pipeline is not None),
            field=".mode",
        ),
        Rule(
            cel="self.mode == 'manual' || (!has(self.tensor) && !has(self.pipeline))",
            message="tensor and pipeline are honoured only with mode: manual",
            check=lambda p: p.mode == "manual" or (p.tensor is None and p.pipeline is None),
            field=".mode",
        ),
    )


class PlacementSpec(ApiModel):
    """Where the job may run and what the planner optimises."""

    objective: Objective = Objective.THROUGHPUT
    heterogeneous: bool = Field(
        default=False,
        description="May one job mix GPU types (per-type data-parallel replicas)?",
    )


class CheckpointSpec(ApiModel):
    """Where and how often workers checkpoint.

    ``volume`` names a PersistentVolumeClaim mounted at ``path``; ``uri`` is for storage the
    trainer reaches itself. Neither: an emptyDir, which survives a resize but not the loss
    of a node.
    """

    volume: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="PersistentVolumeClaim holding the checkpoints.",
    )
    uri: str | None = Field(default=None, max_length=2048, pattern=URI)
    path: str = Field(
        default="/checkpoints",
        min_length=1,
        max_length=1024,
        pattern=ABSOLUTE_PATH,
        description="Absolute path of the checkpoint root inside the worker.",
    )
    interval_seconds: int = Field(default=600, ge=10, le=86400)
    keep: int = Field(default=3, ge=1, le=100, description="Committed checkpoints kept.")

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="!(has(self.volume) && has(self.uri))",
            message="set volume or uri, not both",
            check=lambda c: not (c.volume is not None and c.uri is not None),
            field=".uri",
        ),
        immutable("volume", "the running world's checkpoints live there", parent="checkpoint."),
        immutable("uri", "the running world's checkpoints live there", parent="checkpoint."),
        immutable("path", "the running world's checkpoints live there", parent="checkpoint."),
    )


class FailurePolicySpec(ApiModel):
    """How worker failures are retried before the job is Failed."""

    max_restarts: int = Field(default=10, ge=0, le=10000)
    backoff_seconds: int = Field(default=10, ge=0, le=3600)
    permanent_exit_codes: list[Annotated[int, Field(ge=1, le=255)]] = Field(
        default_factory=lambda: [2],
        max_length=32,
        description="Worker exit codes that fail the job at once (bad configuration).",
    )


def _tensor_fits_worker(spec: TrainingJobSpec) -> bool:
    tensor = spec.parallelism.tensor
    if tensor is None:
        return True
    if spec.worker.gpus == 0:
        return tensor == 1
    return spec.worker.gpus % tensor == 0


class TrainingJobSpec(ApiModel):
    """The desired state of a TrainingJob."""

    replicas: int = Field(ge=1, le=MAX_REPLICAS, description="Desired worker pods.")
    min_replicas: int = Field(
        default=1, ge=1, le=MAX_REPLICAS, description="Fewest pods the job runs on."
    )
    max_replicas: int | None = Field(
        default=None,
        ge=1,
        le=MAX_REPLICAS,
        description="Most pods kubectl scale or an HPA may ask for; unset: no bound.",
    )
    worker: WorkerSpec
    model: ModelSpec | None = Field(
        default=None, description="Transformer profile; without it: pure data parallel."
    )
    training: TrainingSpec
    parallelism: ParallelismSpec = Field(default_factory=ParallelismSpec)
    placement: PlacementSpec = Field(default_factory=PlacementSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    failure_policy: FailurePolicySpec = Field(default_factory=FailurePolicySpec)
    suspend: bool = Field(default=False, description="Checkpoint and stop every worker.")

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="self.minReplicas <= self.replicas",
            message="minReplicas must be <= replicas",
            check=lambda s: s.min_replicas <= s.replicas,
            field=".minReplicas",
        ),
        Rule(
            cel="!has(self.maxReplicas) || self.replicas <= self.maxReplicas",
            message="replicas must be <= maxReplicas",
            check=lambda s: s.max_replicas is None or s.replicas <= s.max_replicas,
            field=".replicas",
        ),
        Rule(
            cel=(
                "!has(self.parallelism.tensor) || "
                "(self.worker.gpus == 0 ? self.parallelism.tensor == 1 : "
                "self.worker.gpus % self.parallelism.tensor == 0)"
            ),
            message=(
                "parallelism.tensor must divide worker.gpus (a tensor-parallel group stays "
                "inside one pod); a CPU job allows only tensor: 1"
            ),
            check=_tensor_fits_worker,
            field=".parallelism.tensor",
        ),
        Rule(
            cel=(
                "!has(self.parallelism.tensor) || !has(self.model) || "
                "self.model.attentionHeads % self.parallelism.tensor == 0"
            ),
            message="parallelism.tensor must divide model.attentionHeads",
            check=lambda s: (
                s.parallelism.tensor is None
                or s.model is None
                or s.model.attention_heads % s.parallelism.tensor == 0
            ),
            field=".parallelism.tensor",
        ),
        Rule(
            cel=(
                "!has(self.parallelism.pipeline) || !has(self.model) || "
                "self.parallelism.pipeline <= self.model.layers"
            ),
            message="parallelism.pipeline must be <= model.layers (each stage needs a layer)",
            check=lambda s: (
                s.parallelism.pipeline is None
                or s.model is None
                or s.parallelism.pipeline <= s.model.layers
            ),
            field=".parallelism.pipeline",
        ),
        immutable(
            "model",
            "a checkpoint of one architecture cannot load into another; create a new job",
        ),
    )
