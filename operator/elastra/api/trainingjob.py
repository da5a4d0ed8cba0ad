"""The TrainingJob spec (elastra.dev/v1alpha1): the single source of truth for the API.

The CRD in ``crds/`` is generated from these models, and the same models parse the object in
the operator and in ``elastra plan``; so a field, its bounds, its default and its
documentation are written here once. Field names are a contract: examples, tests,
``docs/api.md`` (generated from these models) and external checks use them.

Bounds are deliberately generous but finite: every string has a maximum length and every list
a maximum size so that the API server can estimate the cost of CEL rules and so that one bad
object cannot bloat etcd.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, ClassVar

from pydantic import Field, StringConstraints

from elastra.api.base import ApiModel
from elastra.api.formats import (
    ABSOLUTE_PATH,
    DNS_SUBDOMAIN,
    URI,
    Arg,
    EnvName,
    GpuTypeName,
    PositiveSize,
    Size,
)
from elastra.api.podtemplate import (
    CACHE_DIR,
    DEFAULT_CACHE_SIZE,
    RESERVED_ENV,
    RESERVED_VOLUMES,
    PodSecurity,
    PodTemplate,
    ResourceRequirements,
    spelled,
)
from elastra.api.rules import Rule, immutable

MAX_REPLICAS = 4096
"""Upper bound on worker pods per job; far above any plan the planner can rank quickly."""

MAX_LIFETIME_SECONDS = 31_536_000
"""Bound of ttlSecondsAfterFinished and activeDeadlineSeconds: 365 days."""

MAX_GPUS_PER_WORKER = 16
"""The largest GPU count of one node that ships today (16 x V100 in a DGX-2)."""


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


class Launch(StrEnum):
    """How the agent runs the worker command: the Session API, or a plain torchrun script."""

    ELASTRA = "elastra"
    TORCHRUN = "torchrun"


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

    name: EnvName = Field(description="Name of the environment variable.")
    value: Annotated[str, StringConstraints(max_length=32768)] = Field(
        default="", description="Literal value; for a Secret, use worker.template instead."
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
    command: list[Arg] = Field(
        default_factory=list,
        max_length=64,
        description=(
            "The worker container's command (its entrypoint). The agent must run first: "
            "[python3, -m, elastra_worker.cli, run, --], with the trainer in args. Empty: the "
            "image's entrypoint (the worker images' entrypoint is that agent)."
        ),
    )
    args: list[Arg] = Field(
        default_factory=list,
        max_length=256,
        description=(
            "The worker container's args: after the agent's --, the trainer it runs in every "
            "world (e.g. python3 -m elastra_worker.train). Empty: the image's default."
        ),
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=128,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
        description=(
            "Literal environment variables of the worker container (and so of the trainer). "
            "For a Secret or ConfigMap value use worker.template. Elastra's own "
            f"({', '.join(RESERVED_ENV)}) come after these and win."
        ),
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description=(
            "CPU, memory and other resources of the worker container; the GPUs come from "
            "gpus, which Elastra requests by the planned node's GPU resource (nvidia.com/gpu, "
            "or amd.com/gpu on AMD nodes)."
        ),
    )
    cpu_ranks: int = Field(
        default=1,
        ge=1,
        le=64,
        description=(
            "Trainer processes (ranks) per pod of a CPU job (gpus: 0), as torchrun's "
            "--nproc-per-node: a tensor-parallel group stays inside one pod, so a CPU job "
            "with parallelism.tensor 2 needs cpuRanks 2. A GPU pod runs one rank per GPU and "
            "keeps 1 here."
        ),
    )
    launch: Launch = Field(
        default=Launch.ELASTRA,
        description=(
            "How the worker agent runs the command. elastra (default): a script using the "
            "elastra_worker Session API, which stops at a step boundary and checkpoints on a "
            "resize. torchrun: an unmodified torchrun script, started once per world with "
            "torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR ...) plus "
            "ELASTRA_CHECKPOINT_DIR; on a resize it gets SIGTERM, the grace period to "
            "checkpoint itself, and a restart in the new world (docs/torchrun.md)."
        ),
    )
    shm_size: Size = Field(
        default="1Gi",
        description=(
            "Size of the memory-backed emptyDir mounted at /dev/shm in the worker container "
            "(DataLoader workers and NCCL use shared memory; a container runtime gives 64Mi). "
            "It counts against the pod's memory limit. 0 mounts none."
        ),
    )
    cache_size: PositiveSize | None = Field(
        default=None,
        description=(
            f"sizeLimit of the emptyDir mounted at {CACHE_DIR} in the worker container, "
            "where HF_HOME and TORCH_HOME point (Hugging Face and torch hub downloads; the "
            "root file system is read-only and /tmp small). Unset: the operator's default "
            f"(Helm value workerCacheSize, else {DEFAULT_CACHE_SIZE}). A pod that writes more "
            "is evicted. The job's env may set HF_HOME or TORCH_HOME, and the template may "
            f"mount a volume of its own at {CACHE_DIR}: theirs win."
        ),
    )
    pod_security: PodSecurity = Field(
        default=PodSecurity.RESTRICTED,
        description=(
            "Pod Security level the pods are built for. restricted (default): every container "
            "runs non-root, without privilege escalation, with all capabilities dropped and "
            "the RuntimeDefault seccomp profile. baseline: the worker container stays so, but "
            "Elastra sets nothing on the pod's and the other containers' security contexts, "
            "so a sidecar that runs as root can run in a namespace whose policy is baseline."
        ),
    )
    template: PodTemplate | None = Field(
        default=None,
        description=(
            "Additions to every worker pod, shaped like a PodTemplateSpec, merged with what "
            "Elastra owns. Allowed: metadata.labels and annotations (not under elastra.dev/); "
            "spec.volumes (configMap, secret, persistentVolumeClaim, emptyDir, projected, csi, "
            "ephemeral, downwardAPI); spec.containers, where an entry named worker adds env "
            "(value or valueFrom secretKeyRef, configMapKeyRef, fieldRef), envFrom and "
            "volumeMounts to the worker container and any other entry is a sidecar; "
            "spec.initContainers; nodeSelector and node affinity (ANDed with Elastra's pin to "
            "the planned node); tolerations and pod affinity (added to Elastra's); "
            "priorityClassName; serviceAccountName; imagePullSecrets. Elastra owns, and the "
            "API server rejects: nodeName, schedulingGates, hostNetwork, hostPID, hostIPC, "
            "securityContext (see podSecurity), the worker container's image, command, args "
            "and resources (set in spec.worker), and the volumes "
            f"{spelled(RESERVED_VOLUMES, 'and')}. Other PodSpec fields are not part of the "
            "template."
        ),
    )

    @property
    def ranks_per_pod(self) -> int:
        """Trainer processes in each pod: one per GPU, or ``cpuRanks`` for a CPU pod."""
        return self.gpus if self.gpus > 0 else self.cpu_ranks

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="self.gpus == 0 || !has(self.cpuRanks) || self.cpuRanks == 1",
            message="cpuRanks is for CPU jobs (gpus: 0): a GPU pod runs one rank per GPU",
            check=lambda w: w.gpus == 0 or w.cpu_ranks == 1,
            field=".cpuRanks",
        ),
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
    hidden_size: int = Field(ge=1, le=131072, description="Width of the residual stream.")
    ffn_hidden_size: int = Field(ge=1, le=524288, description="Width of the MLP.")
    attention_heads: int = Field(ge=1, le=1024, description="Attention (query) heads.")
    kv_heads: int | None = Field(
        default=None, ge=1, le=1024, description="Grouped-query KV heads; default: heads."
    )
    vocab_size: int = Field(ge=1, le=4194304, description="Tokens in the vocabulary.")
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
    micro_batch_size: int | None = Field(
        default=None,
        ge=1,
        le=65536,
        description=(
            "Sequences per forward and backward pass on one rank. Unset: the planner chooses "
            "it from spec.model (memory and speed); without a model it uses 1 and the job's "
            "world event says so. A bitwise job keeps the size its first world ran with."
        ),
    )

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="!has(self.microBatchSize) || self.globalBatchSize % self.microBatchSize == 0",
            message="globalBatchSize must be a multiple of microBatchSize (a step is whole "
            "micro-batches)",
            check=lambda t: (
                t.micro_batch_size is None or t.global_batch_size % t.micro_batch_size == 0
            ),
            field=".microBatchSize",
        ),
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

    ``volume`` names a PersistentVolumeClaim every worker mounts at ``path``; ``uri`` names an
    object store prefix (``s3://``) every worker writes to through the network. Neither: each
    pod gets an emptyDir of its own, which does not survive the pod (a restart, a resize or a
    lost node starts again from step 0); so only a job of one replica may leave both unset.
    """

    volume: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description=(
            "PersistentVolumeClaim holding the checkpoints, mounted by every worker: "
            "ReadWriteMany when workers span nodes."
        ),
    )
    uri: str | None = Field(
        default=None,
        max_length=2048,
        pattern=URI,
        description=(
            "Object storage for the checkpoints, s3://BUCKET[/PREFIX] (S3 or an S3-compatible "
            "server): elastra_worker's Session and the reference trainer write each job under "
            "PREFIX/JOB (the job's name) and resume from there, instead of path; in torchrun "
            "mode the agents upload the script's local folder there (docs/torchrun.md). "
            "Credentials and "
            "endpoint come from the worker's environment: AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (e.g. from a Secret through spec.worker.template env or "
            "envFrom), AWS_ENDPOINT_URL for a server other than AWS. Other schemes, a missing "
            "bucket or missing credentials fail the job at start (exit 2)."
        ),
    )
    path: str = Field(
        default="/checkpoints",
        min_length=1,
        max_length=1024,
        pattern=ABSOLUTE_PATH,
        description="Absolute path of the checkpoint root inside the worker.",
    )
    interval_seconds: int = Field(
        default=600,
        ge=10,
        le=86400,
        description=(
            "Seconds between periodic checkpoints (a resize also checkpoints first, or, where "
            "a staying worker carries the state into the next world, that world does)."
        ),
    )
    keep: int = Field(default=3, ge=1, le=100, description="Committed checkpoints kept.")
    asynchronous: bool = Field(
        default=True,
        description=(
            "Write periodic checkpoints in the background: training stops only while the state "
            "is copied to host memory (about one copy of the worker's model and optimizer "
            "state), then a thread writes and commits it. A checkpoint due while the previous "
            "one is still being written waits for it. The checkpoint before a stop or SIGTERM "
            "is complete and committed before the worker exits; at a resize where a staying "
            "worker carries the whole state into the next world in memory, nobody saves at the "
            "stop and the new world writes that step in the background. Set false where host "
            "memory cannot hold that copy, or to block training for every save (a resize then "
            "commits its step before the old world ends)."
        ),
    )

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="!(has(self.volume) && has(self.uri))",
            message="set volume or uri, not both",
            check=lambda c: not (c.volume is not None and c.uri is not None),
            field=".uri",
        ),
        Rule(
            cel="!has(self.uri) || self.uri.startsWith('s3://')",
            message="uri must be s3://BUCKET[/PREFIX]: the worker image has an S3 client only",
            check=lambda c: c.uri is None or c.uri.startswith("s3://"),
            field=".uri",
        ),
        immutable("volume", "the running world's checkpoints live there", parent="checkpoint."),
        immutable("uri", "the running world's checkpoints live there", parent="checkpoint."),
        immutable("path", "the running world's checkpoints live there", parent="checkpoint."),
    )


class FailurePolicySpec(ApiModel):
    """How worker failures are retried before the job is Failed."""

    max_restarts: int = Field(
        default=10,
        ge=0,
        le=10000,
        description="Worker failures retried (each a new world) before the job is Failed.",
    )
    backoff_seconds: int = Field(
        default=10,
        ge=0,
        le=3600,
        description="Seconds after a failure resize before new pods are created.",
    )
    permanent_exit_codes: list[Annotated[int, Field(ge=1, le=255)]] = Field(
        default_factory=lambda: [2],
        max_length=32,
        description="Worker exit codes that fail the job at once (bad configuration).",
    )


def _bitwise_is_data_parallel(spec: TrainingJobSpec) -> bool:
    if spec.training.consistency != Consistency.BITWISE:
        return True
    return spec.parallelism.tensor in {None, 1} and spec.parallelism.pipeline in {None, 1}


def _tensor_fits_worker(spec: TrainingJobSpec) -> bool:
    tensor = spec.parallelism.tensor
    if tensor is None:
        return True
    return spec.worker.ranks_per_pod % tensor == 0


def _mounts_clear_of_checkpoints(spec: TrainingJobSpec) -> bool:
    """The template's worker mounts stay off the checkpoint path (two mounts cannot share it)."""
    template = spec.worker.template
    worker = template.worker_additions() if template else None
    mounts = worker.volume_mounts or [] if worker else []
    return all(m.mount_path != spec.checkpoint.path for m in mounts)


def _checkpoints_shared(spec: TrainingJobSpec) -> bool:
    """Several pods must share their checkpoints, or a new world cannot load the last one."""
    if spec.checkpoint.volume is not None or spec.checkpoint.uri is not None:
        return True
    return spec.replicas == 1 and (spec.max_replicas is None or spec.max_replicas == 1)


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
    suspend: bool = Field(
        default=False,
        description=(
            "Checkpoint and stop every worker. A job labelled kueue.x-k8s.io/queue-name is held "
            "the same way until Kueue admits its Workload, and again while Kueue evicts it "
            "(docs/kueue.md)."
        ),
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        le=MAX_LIFETIME_SECONDS,
        description=(
            "Seconds after the job ends (Succeeded or Failed) when the operator deletes the "
            "TrainingJob, its pods and its Kueue Workload with it; checkpoints on volumes are "
            "never deleted. Unset: the job is kept until deleted by hand."
        ),
    )
    active_deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        le=MAX_LIFETIME_SECONDS,
        description=(
            "Seconds the job may run, counted from status.startTime (reset when it resumes "
            "from a suspension or a Kueue eviction, as for a Job). Past it every worker is "
            "told to checkpoint and stop, as for suspend, and the job ends Failed with reason "
            "DeadlineExceeded. Unset: no deadline."
        ),
    )

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
                "(self.worker.gpus == 0 ? "
                "(has(self.worker.cpuRanks) ? self.worker.cpuRanks : 1) : self.worker.gpus)"
                " % self.parallelism.tensor == 0"
            ),
            message=(
                "parallelism.tensor must divide worker.gpus (a tensor-parallel group stays "
                "inside one pod); a CPU job: it must divide worker.cpuRanks"
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
        Rule(
            cel=(
                "self.training.consistency != 'bitwise' || "
                "((!has(self.parallelism.tensor) || self.parallelism.tensor == 1) && "
                "(!has(self.parallelism.pipeline) || self.parallelism.pipeline == 1))"
            ),
            message=(
                "training.consistency: bitwise is data parallel only: parallelism.tensor and "
                "parallelism.pipeline must be 1"
            ),
            check=_bitwise_is_data_parallel,
            field=".parallelism",
        ),
        immutable(
            "model",
            "a checkpoint of one architecture cannot load into another; create a new job",
        ),
        Rule(
            cel=(
                "has(self.checkpoint.volume) || has(self.checkpoint.uri) || "
                "(self.replicas == 1 && (!has(self.maxReplicas) || self.maxReplicas == 1))"
            ),
            message=(
                "checkpoint.volume (a PersistentVolumeClaim every worker mounts) or "
                "checkpoint.uri is required when replicas or maxReplicas is above 1: without "
                "them each pod checkpoints to an emptyDir of its own, which the other pods "
                "cannot read and which is lost with the pod, so every resize restarts at step 0"
            ),
            check=_checkpoints_shared,
            field=".checkpoint",
        ),
        Rule(
            cel=(
                "!has(self.worker.template) || !has(self.worker.template.spec) || "
                "!has(self.worker.template.spec.containers) || "
                "self.worker.template.spec.containers.all(c, c.name != 'worker' || "
                "!has(c.volumeMounts) || "
                "c.volumeMounts.all(m, m.mountPath != self.checkpoint.path))"
            ),
            message=(
                "the worker container's volumeMounts may not use checkpoint.path: Elastra "
                "mounts the checkpoints there"
            ),
            check=_mounts_clear_of_checkpoints,
            field=".worker.template",
        ),
    )
