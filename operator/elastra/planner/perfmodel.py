"""An analytic model of one training step: time per GPU type, memory per GPU, bottleneck.

Pure arithmetic over the model shape, the GPU catalog and a few calibratable constants; no
I/O, no clock. The search calls it many times, so the pieces it reuses (FLOPs per token, time
of one micro-batch on one pipeline stage) are separate functions whose results it caches.

FLOPs (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", eq. 3, generalised to grouped-query attention and gated MLPs): per token
and layer the forward pass costs ``2h(h + 2·kv·d) + 2h²`` (QKV and output projections),
``4sh`` (attention scores and values, causal mask not discounted, as Megatron counts) and
``2·h·f`` per MLP matrix (two, or three when gated); the logits cost ``2hV``. Training is
forward + backward = 3x forward ("model FLOPs", what MFU counts). Recomputation adds a
forward of every layer (``full``) or of the attention core only (``selective``, Korthikanti et
al. 2022); ``tflops_per_gpu`` counts those too (executed FLOPs, Megatron's convention).

Time of one step on a replica of ``pp`` stages running ``m`` micro-batches with 1F1B:
``(m + (pp - 1)/v)·(t_compute + t_tp + 2·v·t_p2p)`` for the slowest stage (pipeline bubble
included; ``v`` virtual stages per GPU with Megatron's interleaved schedule); then
data-parallel collectives over the slowest link the group crosses (a ring that leaves the
pod shares the pod's part of the node's NIC among the ``min(gpus, tp·pp)`` rings through
that pod: ``search.dp_bandwidth``), of which the part that overlaps the last backward is
hidden; then the optimizer step, bound by HBM bandwidth. Collectives are ring collectives:
``2(n-1)/n · bytes / bandwidth`` for an all-reduce, half that for a reduce-scatter or
all-gather.

Memory per GPU (``memory_breakdown``; ZeRO, Rajbhandari et al. 2020, as FSDP2 implements it,
which is what the worker runs; activations from Korthikanti et al. 2022 with sequence
parallelism when tp > 1): at every precision the parameters (the master weights) are fp32, 4
bytes/param, their gradients 4 and Adam's moments 8; bf16 and fp16 compute on copies.
``optimizer`` and ``full`` sharding both hold a 1/dp shard of all three; ``optimizer`` keeps
the stage's weights gathered in the compute precision from forward to backward (2 bytes/param
in bf16, 4 in fp32), ``full`` only the layer being computed and the one prefetched; unsharded,
bf16 and fp16 autocast keeps its casts of the weights for backward (2 bytes/param, none under
full recomputation). A pipelined sharded stage (dp > 1) also accumulates its gradients whole,
in fp32, until the step's last backward (PyTorch's pipeline stage defers FSDP's reduction).
``tests/worker/test_memory_model.py`` checks parameters, gradients and optimizer state per rank
against the tensors of real runs. Activations per layer and micro-batch are
``s·b·h·(18 + c·f/h + 5·a·s/h)/tp`` bytes (``c`` = 4, or 6 when gated: 34 + 5as/h for a
4h MLP) without recomputation, without the ``5as/h`` score term for ``selective``, and the
layer input (``2sbh/tp``) plus one layer's working set for ``full``; the first stage holds
``min(pp, m)`` micro-batches in flight. The last stage adds fp32 logits. A GPU is usable up to
``(1 - headroom)·capacity - reserved`` (CUDA context, NCCL buffers, fragmentation).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from elastra.planner.catalog import GpuType, Precision
from elastra.planner.job import ModelShape, Recompute, Sharding

GIB = float(1 << 30)


@dataclass(frozen=True)
class ModelConstants:
    """The model's tunable constants; ``calibration`` fits ``efficiency`` from measurements.

    The defaults of the shape constants (``gemm_half_*``, ``elementwise_passes``) and the
    A100/H100 efficiencies in the catalog come from a grid search minimising the worst
    relative error over the published runs in ``validation``; the bandwidth efficiencies are
    typical NCCL bus-bandwidth fractions of the nominal link rate.

    ``efficiency`` overrides the catalog's ``gemm_efficiency`` per type name. GEMM efficiency
    falls off for narrow per-GPU matrices: the achieved rate is
    ``peak · efficiency · w/(w + gemm_half_width) · T/(T + gemm_half_tokens)`` with ``w`` the
    hidden size per tensor-parallel rank and ``T`` the tokens per micro-batch. Memory-bound
    element-wise work (norms, activation functions, residuals) costs ``elementwise_passes``
    reads or writes of each layer's ``s·b·h/tp`` activations per step of one micro-batch.
    """

    efficiency: tuple[tuple[str, float], ...] = ()
    gemm_half_width: float = 256.0
    gemm_half_tokens: float = 128.0
    elementwise_passes: float = 40.0
    link_efficiency: float = 0.75
    network_efficiency: float = 0.75
    collective_latency_s: float = 8e-6
    dp_overlap: float = 0.5
    fsdp_overlap: float = 0.8
    optimizer_bytes_per_param: float = 32.0
    memory_headroom: float = 0.05
    memory_reserved_gib: float = 2.0

    def efficiency_of(self, gpu: GpuType) -> float:
        """The GEMM efficiency of ``gpu``: calibrated if present, else the catalog default."""
        for name, value in self.efficiency:
            if name == gpu.name:
                return value
        return gpu.gemm_efficiency


DEFAULT_CONSTANTS = ModelConstants()


@dataclass(frozen=True)
class Layout:
    """How one data-parallel replica runs: what a step's time and a GPU's memory depend on
    besides the model and the GPU type.

    One value, passed whole from the search through every formula here, so that a formula
    cannot be handed the tensor degree of one layout and the micro-batch of another.
    """

    tp: int
    """Tensor-parallel degree (GPUs per layer)."""
    pp: int
    """Pipeline stages."""
    micro_batch: int
    """Sequences per micro-batch."""
    sharding: Sharding
    recompute: Recompute
    precision: Precision
    interleave: int = 1
    """Virtual pipeline stages per GPU (Megatron's interleaved schedule)."""

    @property
    def replica_gpus(self) -> int:
        """GPUs of one data-parallel replica."""
        return self.tp * self.pp


@dataclass(frozen=True)
class TokenFlops:
    """Forward FLOPs per token: one layer, its attention-score part, and the logits."""

    layer: float
    attention_core: float
    logits: float

    def model_per_token(self, layers: int) -> float:
        """Model FLOPs (forward + backward) per token of the whole model."""
        return 3.0 * (layers * self.layer + self.logits)

    def recompute_per_token(self, layers: int, recompute: Recompute) -> float:
        """Extra forward FLOPs per token that recomputation executes."""
        if recompute == "full":
            return layers * self.layer
        if recompute == "selective":
            return layers * self.attention_core
        return 0.0


@functools.lru_cache(maxsize=4096)
def token_flops(model: ModelShape) -> TokenFlops:
    """Forward FLOPs per token (see the module docstring for the formula)."""
    h, s = model.hidden_size, model.sequence_length
    head_dim = h // model.attention_heads
    projections = 2.0 * h * (h + 2 * model.kv_heads * head_dim) + 2.0 * h * h
    core = 4.0 * s * h
    mlp = 2.0 * (3 if model.gated else 2) * h * model.ffn_hidden_size
    return TokenFlops(
        layer=projections + core + mlp, attention_core=core, logits=2.0 * h * model.vocab_size
    )


@functools.lru_cache(maxsize=4096)
def layer_params(model: ModelShape) -> float:
    """Parameters of one transformer layer (projections, MLP, two norms)."""
    h = model.hidden_size
    head_dim = h // model.attention_heads
    attention = h * (h + 2 * model.kv_heads * head_dim) + h * h
    mlp = (3 if model.gated else 2) * h * model.ffn_hidden_size
    return attention + mlp + 2.0 * h


def total_params(model: ModelShape) -> float:
    """All parameters, with separate input embedding and output layer."""
    return model.layers * layer_params(model) + 2.0 * model.vocab_size * model.hidden_size


@functools.lru_cache(maxsize=4096)
def stage_layers(layers: int, pp: int) -> tuple[int, int]:
    """Layers on the first and on the last stage when ``layers`` are split as evenly as can be.

    The first ``layers % pp`` stages get one more; the last stage also computes the logits.
    """
    q, r = divmod(layers, pp)
    first = q + (1 if r else 0)
    return first, (q if pp > 1 else first)


@dataclass(frozen=True)
class MicroBatchTime:
    """Seconds one micro-batch spends on the slowest stage of one replica of one GPU type."""

    compute: float
    recompute: float
    tp_comm: float
    p2p: float
    interleave: int = 1
    """Virtual stages per GPU (Megatron's interleaved 1F1B): v times the transfers."""

    @property
    def per_slot(self) -> float:
        """One 1F1B slot: forward + backward on the stage, its TP collectives, the transfers."""
        return self.compute + self.tp_comm + 2.0 * self.interleave * self.p2p

    def bubble_slots(self, pp: int) -> float:
        """Slots of pipeline fill and drain: ``(pp - 1) / v``."""
        return (pp - 1) / self.interleave


def activation_bytes(precision: Precision) -> int:
    """Bytes per activation/weight element in the compute precision."""
    return 4 if precision == "fp32" else 2


def achieved_flops(
    gpu: GpuType,
    model: ModelShape,
    *,
    tp: int,
    micro_batch: int,
    precision: Precision,
    constants: ModelConstants,
) -> float:
    """FLOP/s ``gpu`` sustains in this layer's GEMMs (0 when the precision is unsupported)."""
    peak = gpu.peak_tflops(precision)
    if peak is None:
        return 0.0
    width = model.hidden_size / tp
    tokens = micro_batch * model.sequence_length
    shape = (
        width / (width + constants.gemm_half_width) * tokens / (tokens + constants.gemm_half_tokens)
    )
    return peak * 1e12 * constants.efficiency_of(gpu) * shape


def ring_allreduce_s(nbytes: float, ranks: int, bandwidth: float, latency: float) -> float:
    """Ring all-reduce of ``nbytes`` across ``ranks`` at ``bandwidth`` bytes/s per rank."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    return 2.0 * (ranks - 1) / ranks * nbytes / bandwidth + 2.0 * (ranks - 1) * latency


def micro_batch_time(
    gpu: GpuType,
    model: ModelShape,
    layout: Layout,
    *,
    p2p_gbs: float,
    constants: ModelConstants = DEFAULT_CONSTANTS,
) -> MicroBatchTime:
    """Time of one micro-batch (forward + backward) on the slowest pipeline stage.

    ``p2p_gbs`` is the bandwidth between consecutive stages (GB/s per GPU).
    """
    tp, pp, micro_batch = layout.tp, layout.pp, layout.micro_batch
    recompute, precision = layout.recompute, layout.precision
    flops = token_flops(model)
    first, last = stage_layers(model.layers, pp)
    per_layer = 3.0 * flops.layer + flops.recompute_per_token(1, recompute)
    first_work = first * per_layer + (3.0 * flops.logits if pp == 1 else 0.0)
    last_work = last * per_layer + 3.0 * flops.logits
    tokens = micro_batch * model.sequence_length
    rate = achieved_flops(
        gpu, model, tp=tp, micro_batch=micro_batch, precision=precision, constants=constants
    )
    if rate <= 0:
        return MicroBatchTime(math.inf, 0.0, 0.0, 0.0)
    stage_tokens_flops = max(first_work, last_work)
    gemm = stage_tokens_flops * tokens / tp / rate
    # Norms, activations, residuals, softmax: HBM-bound passes over s*b*h/tp elements.
    passes = constants.elementwise_passes * (4.0 / 3.0 if recompute == "full" else 1.0)
    element_bytes = passes * model.hidden_size / tp * activation_bytes(precision)
    elementwise = max(first, last) * element_bytes * tokens / (gpu.memory_bandwidth_gbs * 1e9)
    compute = gemm + elementwise
    recompute_flops = max(first, last) * flops.recompute_per_token(1, recompute)
    recompute_s = recompute_flops * tokens / tp / rate
    if recompute == "full":
        recompute_s += elementwise / 4.0
    message = tokens * model.hidden_size * activation_bytes(precision)
    collectives = (6 if recompute == "full" else 4) * max(first, last)
    link = gpu.interconnect_gbs * 1e9 * constants.link_efficiency
    tp_comm = collectives * ring_allreduce_s(message, tp, link, constants.collective_latency_s)
    p2p = 0.0
    if pp > 1:
        p2p = message / tp / (p2p_gbs * 1e9) + constants.collective_latency_s
    return MicroBatchTime(compute, recompute_s, tp_comm, p2p, layout.interleave)


@functools.lru_cache(maxsize=4096)
def stage_params(model: ModelShape, pp: int) -> float:
    """Parameters on the heaviest pipeline stage (embedding on the first, output on the last)."""
    first, last = stage_layers(model.layers, pp)
    embedding = float(model.vocab_size * model.hidden_size)
    per_layer = layer_params(model)
    if pp == 1:
        return first * per_layer + 2.0 * embedding
    return max(first * per_layer + embedding, last * per_layer + embedding)


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of the model one GPU holds for the whole step: the parameters (the
    weights the optimizer steps), their gradients and the optimizer state."""

    parameters: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        """All three."""
        return self.parameters + self.gradients + self.optimizer


def state_bytes(sharding: Sharding, dp: int) -> StateBytes:
    """Weights, gradients and optimizer state per parameter held by one GPU (module docstring).

    The same at every precision: the parameters (the master weights) are fp32, bf16 and fp16
    compute on copies (autocast's casts, FSDP's gathered weights: ``weight_copy_bytes``); their
    gradients are fp32 and so are Adam's two moments. ``optimizer`` and ``full`` sharding both
    keep a 1/dp shard of all three (FSDP2); they differ in what they gather for compute.
    """
    state = StateBytes(parameters=4.0, gradients=4.0, optimizer=8.0)
    if sharding == "none":
        return state
    return StateBytes(state.parameters / dp, state.gradients / dp, state.optimizer / dp)


def weight_copy_bytes(model: ModelShape, layout: Layout) -> float:
    """Copies of the weights in the compute precision that one GPU holds at its peak.

    Unsharded, bf16 and fp16 autocast casts every weight once per forward and keeps the casts
    for backward (the whole stage, the embedding counted too; under ``full`` recomputation
    only the layer being recomputed, which the working set already stands for). ``optimizer``
    sharding keeps every block's gathered weights from its forward to its backward (the whole
    stage, FSDP2 without resharding after forward); ``full`` holds the layer being computed
    and the one prefetched.
    """
    element = activation_bytes(layout.precision)
    stage = stage_params(model, layout.pp) / layout.tp
    if layout.sharding == "optimizer":
        return stage * element
    if layout.sharding == "full":
        return 2.0 * layer_params(model) / layout.tp * element
    if layout.precision == "fp32" or layout.recompute == "full":
        return 0.0
    return stage * element


def unsharded_gradient_bytes(model: ModelShape, layout: Layout, *, dp: int) -> float:
    """A pipelined, sharded stage's gradients, whole and fp32, held through its backwards.

    PyTorch's pipeline stage defers an FSDP module's reduce-scatter to the step's last
    backward (``set_requires_gradient_sync(False)`` before), so the stage accumulates
    unsharded gradients until then; over one data-parallel rank nothing is sharded to begin
    with.
    """
    if layout.pp == 1 or layout.sharding == "none" or dp == 1:
        return 0.0
    return stage_params(model, layout.pp) / layout.tp * 4.0


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes the heaviest GPU of a layout holds at its peak, by what holds them.

    ``parameters``, ``gradients`` and ``optimizer`` live through the whole step (this GPU's
    shard of them); ``weight_copies`` are the weights in the compute precision (gathered by
    sharding, cast by autocast: ``weight_copy_bytes``); ``unsharded_gradients`` what a pipelined
    sharded stage accumulates before reducing (``unsharded_gradient_bytes``); ``activations``
    are what the layers
    keep for backward for the micro-batches in flight, ``logits`` the last stage's fp32 logits
    of one micro-batch.
    """

    parameters: float
    gradients: float
    optimizer: float
    weight_copies: float
    unsharded_gradients: float
    activations: float
    logits: float

    @property
    def states(self) -> float:
        """Parameters, gradients and optimizer state: what lives through the whole step."""
        return self.parameters + self.gradients + self.optimizer

    @property
    def total(self) -> float:
        """Everything: the peak the search compares with a GPU's usable memory."""
        held = self.states + self.weight_copies + self.unsharded_gradients
        return held + self.activations + self.logits


def activation_bytes_per_gpu(model: ModelShape, layout: Layout, *, in_flight: float) -> float:
    """Bytes the first stage's layers keep for backward with ``in_flight`` micro-batches."""
    tp, micro_batch, recompute = layout.tp, layout.micro_batch, layout.recompute
    h, s, a = model.hidden_size, model.sequence_length, model.attention_heads
    scale = activation_bytes(layout.precision) / 2.0
    sbh = s * micro_batch * h * scale / tp
    mlp = (6.0 if model.gated else 4.0) * model.ffn_hidden_size / h
    working = sbh * (18.0 + mlp)
    score = sbh * 5.0 * a * s / h
    first, _ = stage_layers(model.layers, layout.pp)
    if recompute == "full":
        # Each layer keeps only its input; backward recomputes one layer's working set at a time.
        return first * 2.0 * sbh * max(1, in_flight) + working + score
    per_layer = working + (score if recompute == "none" else 0.0)
    return first * per_layer * max(1, in_flight)


def memory_breakdown(
    model: ModelShape, layout: Layout, *, dp: int, in_flight: float
) -> MemoryBreakdown:
    """Peak bytes of the heaviest GPU of ``layout`` by part (see the module docstring)."""
    params = stage_params(model, layout.pp) / layout.tp
    state = state_bytes(layout.sharding, dp)
    s, micro_batch = model.sequence_length, layout.micro_batch
    return MemoryBreakdown(
        parameters=params * state.parameters,
        gradients=params * state.gradients,
        optimizer=params * state.optimizer,
        weight_copies=weight_copy_bytes(model, layout),
        unsharded_gradients=unsharded_gradient_bytes(model, layout, dp=dp),
        activations=activation_bytes_per_gpu(model, layout, in_flight=in_flight),
        logits=4.0 * s * micro_batch * model.vocab_size / layout.tp,
    )


def memory_gib(model: ModelShape, layout: Layout, *, dp: int, in_flight: float) -> float:
    """Peak memory of the heaviest GPU in GiB (see the module docstring)."""
    return memory_breakdown(model, layout, dp=dp, in_flight=in_flight).total / GIB


def usable_memory_gib(gpu: GpuType, constants: ModelConstants = DEFAULT_CONSTANTS) -> float:
    """Memory a plan may fill on ``gpu`` after headroom."""
    return gpu.memory_gib * (1.0 - constants.memory_headroom) - constants.memory_reserved_gib


def dp_collective_s(
    model: ModelShape,
    layout: Layout,
    *,
    dp: int,
    micro_batches: int,
    bandwidth_gbs: float,
    constants: ModelConstants = DEFAULT_CONSTANTS,
) -> float:
    """Seconds of data-parallel communication per step, before overlap.

    ``none`` all-reduces gradients; ``optimizer`` reduce-scatters gradients and all-gathers
    weights (the same volume); ``full`` also gathers weights for the forward and the backward
    of every micro-batch.
    """
    if dp <= 1:
        return 0.0
    params = stage_params(model, layout.pp) / layout.tp
    element = activation_bytes(layout.precision)
    bandwidth = bandwidth_gbs * 1e9
    latency = constants.collective_latency_s
    if layout.sharding == "full":
        per_micro_batch = 1.5 * ring_allreduce_s(params * element, dp, bandwidth, latency)
        return per_micro_batch * micro_batches
    return ring_allreduce_s(params * element, dp, bandwidth, latency)


def optimizer_step_s(
    gpu: GpuType,
    model: ModelShape,
    layout: Layout,
    *,
    dp: int,
    constants: ModelConstants = DEFAULT_CONSTANTS,
) -> float:
    """The optimizer update, bound by HBM traffic over the parameters this GPU updates."""
    params = stage_params(model, layout.pp) / layout.tp
    if layout.sharding != "none":
        params /= dp
    return params * constants.optimizer_bytes_per_param / (gpu.memory_bandwidth_gbs * 1e9)


def effective_gbs(raw_gbs: float, *, intra_node: bool, constants: ModelConstants) -> float:
    """Bandwidth a collective achieves over a link quoted at ``raw_gbs`` GB/s."""
    factor = constants.link_efficiency if intra_node else constants.network_efficiency
    return raw_gbs * factor


@dataclass(frozen=True)
class TypeLoad:
    """One GPU type's part of a plan: its replicas, their micro-batches, one slot's time."""

    gpu: GpuType
    replicas: int
    micro_batches: int
    slot: MicroBatchTime


@dataclass(frozen=True)
class StepPrediction:
    """What the model predicts for one optimizer step of a plan."""

    step_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    mfu: float
    peak_memory_gib: float
    """The most memory any GPU of the plan needs, GiB; a mix's types each fit their own
    (``plan.TypeShare.peak_memory_gib``), which may be less."""
    bottleneck: str
    breakdown: tuple[tuple[str, float], ...]


def pipeline_s(slot: MicroBatchTime, *, micro_batches: int, pp: int) -> float:
    """1F1B time of one replica: ``m + (pp - 1) / v`` slots."""
    return (micro_batches + slot.bubble_slots(pp)) * slot.per_slot


def in_flight(pp: int, micro_batches: int, interleave: int) -> float:
    """Micro-batches whose activations the first stage holds at once (Korthikanti et al.
    2022: interleaving adds a factor ``1 + (pp - 1) / (pp · v)``)."""
    held = float(min(pp, micro_batches))
    if interleave > 1:
        held *= 1.0 + (pp - 1) / (pp * interleave)
    return held


def predict_step(
    model: ModelShape,
    loads: tuple[TypeLoad, ...],
    layout: Layout,
    *,
    dp_gbs: float,
    peak_memory: float,
    constants: ModelConstants = DEFAULT_CONSTANTS,
) -> StepPrediction:
    """Step time, throughput, utilisation and bottleneck of a plan.

    ``dp_gbs`` is the effective bandwidth of the slowest link the data-parallel group
    crosses. The slowest type sets the pace (batch shares are chosen to equalise types).
    """
    tp, pp, micro_batch = layout.tp, layout.pp, layout.micro_batch
    sharding, recompute, precision = layout.sharding, layout.recompute, layout.precision
    slowest = max(
        loads,
        key=lambda load: (
            pipeline_s(load.slot, micro_batches=load.micro_batches, pp=pp),
            load.gpu.name,
        ),
    )
    pipe = pipeline_s(slowest.slot, micro_batches=slowest.micro_batches, pp=pp)
    dp = sum(load.replicas for load in loads)
    most_micro_batches = max(load.micro_batches for load in loads)
    dp_raw = dp_collective_s(
        model,
        layout,
        dp=dp,
        micro_batches=most_micro_batches,
        bandwidth_gbs=dp_gbs,
        constants=constants,
    )
    if sharding == "full":
        hidden = constants.fsdp_overlap * slowest.micro_batches * slowest.slot.compute
    else:
        hidden = constants.dp_overlap * (2.0 / 3.0) * slowest.slot.compute
    dp_exposed = max(0.0, dp_raw - hidden)
    optimizer = max(
        optimizer_step_s(load.gpu, model, layout, dp=dp, constants=constants) for load in loads
    )
    step = pipe + dp_exposed + optimizer
    flops = token_flops(model)
    tokens = (
        sum(load.replicas * load.micro_batches for load in loads)
        * micro_batch
        * model.sequence_length
    )
    model_flops = tokens * flops.model_per_token(model.layers)
    executed = model_flops + tokens * flops.recompute_per_token(model.layers, recompute)
    gpus = sum(load.replicas for load in loads) * tp * pp
    peak = (
        sum(load.replicas * tp * pp * (load.gpu.peak_tflops(precision) or 0.0) for load in loads)
        * 1e12
    )
    m = slowest.micro_batches
    slot = slowest.slot
    breakdown = (
        ("compute", m * (slot.compute - slot.recompute)),
        ("memory", m * slot.recompute),
        ("tp-comm", m * slot.tp_comm),
        ("pp-bubble", slot.bubble_slots(pp) * slot.per_slot + m * 2.0 * slot.interleave * slot.p2p),
        ("dp-comm", dp_exposed),
        ("optimizer", optimizer),
    )
    bottleneck = max(breakdown, key=lambda item: item[1])[0]
    return StepPrediction(
        step_time_s=step,
        tokens_per_s=tokens / step,
        tflops_per_gpu=executed / step / gpus / 1e12,
        mfu=model_flops / step / peak if peak > 0 else 0.0,
        peak_memory_gib=peak_memory,
        bottleneck=bottleneck,
        breakdown=breakdown,
    )
