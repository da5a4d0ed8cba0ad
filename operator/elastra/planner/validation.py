"""Published large-scale training runs, to check the performance model against reality.

Each ``PublishedRun`` records what a paper or report states (model shape, GPU type and count,
tensor/pipeline degrees, batch, achieved TFLOP/s per GPU) and, separately marked, what we had
to assume where the source is silent (micro-batch, recomputation, sharding, NIC bandwidth).
``reported`` says which FLOPs the source counts: ``executed`` (recomputation included, the
Megatron-LM convention: ``tflops_per_gpu``) or ``model`` (MFU x peak: ``mfu``).
``tests/unit/planner/test_validation.py`` requires the model to predict each within +-25%
in manual mode, and auto mode never to choose a plan its own model rates below the
published layout. The GEMM efficiencies of A100 and H100 in ``catalog`` were calibrated on
these runs (one constant per type), so this is a consistency check across model sizes,
scales and layouts, not an independent hold-out.

Sources:
[MEGATRON] D. Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
    Using Megatron-LM", SC'21, arXiv:2104.04473, Table 1 (weak scaling, A100-SXM4-80GB on
    Selene, DGX A100 nodes with 8x200 Gb/s HDR InfiniBand; s=2048, V=51200; activation
    recomputation; the number of GPUs, t, p, batch size and achieved TFLOP/s per GPU are
    from the table; section 5.1: the interleaved schedule is used). Assumed: micro-batch 1
    with pipelining, else 4; 2 virtual stages per GPU; no optimizer sharding.
[LLAMA3] A. Dubey et al. (Meta), "The Llama 3 Herd of Models", arXiv:2407.21783, Table 3
    (405B: 126 layers, d=16384, FFN 53248, 128 heads, 8 KV heads, V=128256) and Table 4
    (8,192 GPUs: TP 8, CP 1, PP 16, DP 64, seq 8192, batch/DP 32, 430 TFLOP/s, 43% BF16 MFU;
    16,384 GPUs: DP 128, batch/DP 16, 400 TFLOP/s, 41%); H100 80GB HBM3, 400 Gb/s RoCE per
    GPU (section 3.3.1). The TFLOP/s match MFU x 989, i.e. model FLOPs. Assumed: micro-batch
    1, the interleaved schedule the paper describes with 4 virtual stages (2 layers each),
    FSDP without re-sharding weights (our ``optimizer`` mode) and full recomputation
    (with 16 micro-batches in flight on the first stage nothing less fits 80 GB under our
    memory model; MFU does not count recomputation either way).
[BLOOM] BigScience, "BLOOM: A 176B-Parameter Open-Access Multilingual Language Model",
    arXiv:2211.05100, section 3.4 (384 A100 80GB on Jean Zay, TP 4, PP 12, DP 8, ZeRO stage
    1, 70 layers, d=14336, 112 heads, V=250880, s=2048, global batch 2048) and the training
    chronicles (bigscience-workshop/bigscience, train/tr11-176B-ml/chronicles.md: micro-batch
    2, "149-150 TFLOPs per GPU" at GBS 2048, counted with activation checkpointing).
    Assumed: 4x100 Gb/s Omni-Path per node.
[OPT] S. Zhang et al. (Meta), "OPT: Open Pre-trained Transformer Language Models",
    arXiv:2205.01068, section 2.4 and Table 1 (992 A100 80GB, FSDP + Megatron tensor
    parallelism, "up to 147 TFLOP/s per GPU"; 175B: 96 layers, 96 heads, d=12288, batch
    2M tokens of s=2048). Assumed: TP 8 (Megatron's usual degree), so DP 124 and a batch of
    992 sequences (the multiple of 124 nearest to 2M tokens), one micro-batch of 8 per
    replica (FSDP re-gathers weights per micro-batch, so no accumulation), full
    recomputation, 8x200 Gb/s InfiniBand; counted as executed FLOPs.
[MTNLG] S. Smith et al., "Using DeepSpeed and Megatron to Train Megatron-Turing NLG 530B",
    arXiv:2201.11990, sections 2.3 and 3 (105 layers, d=20480, 128 heads, s=2048, global
    batch 1920, TP 8, PP 35, micro-batch 1, ZeRO-1 data parallelism, DGX A100 with 8x200
    Gb/s; 2240 GPUs: 126 TFLOP/s per GPU, 3360 GPUs: 113). Assumed: V=51200 (GPT-2 BPE
    padded), full recomputation.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

from elastra.planner.catalog import GpuType, Precision, by_name
from elastra.planner.inventory import Inventory, NodeCapacity, NodeName
from elastra.planner.job import JobRequirements, ModelShape, Recompute, Sharding
from elastra.planner.perfmodel import DEFAULT_CONSTANTS, Layout, ModelConstants
from elastra.planner.plan import PlanResult
from elastra.planner.search import evaluate_layout, plan_job


@dataclass(frozen=True)
class PublishedRun:
    """One published run: stated figures, and assumptions where the source is silent."""

    name: str
    source: str
    model: ModelShape
    gpu_type: str
    gpus: int
    tp: int
    pp: int
    global_batch_size: int
    tflops_per_gpu: float
    reported: Literal["executed", "model"]
    micro_batch: int
    recompute: Recompute
    sharding: Sharding
    node_network_gbps: float
    interleave: int = 1
    precision: Precision = "bf16"

    @property
    def dp(self) -> int:
        """Data-parallel replicas: GPUs / (tp * pp)."""
        return self.gpus // (self.tp * self.pp)


def _gpt(
    layers: int, hidden: int, heads: int, *, vocab: int = 51200, seq: int = 2048
) -> ModelShape:
    return ModelShape(layers, hidden, 4 * hidden, heads, heads, vocab, seq)


def _megatron(row: tuple[str, int, int, int, int, int, int, int, float]) -> PublishedRun:
    """A row of [MEGATRON] Table 1: size, heads, hidden, layers, t, p, GPUs, batch, TFLOP/s."""
    name, heads, hidden, layers, tp, pp, gpus, batch, tflops = row
    return PublishedRun(
        name=f"Megatron-LM {name}",
        source="MEGATRON Table 1",
        model=_gpt(layers, hidden, heads),
        gpu_type="A100-SXM-80GB",
        gpus=gpus,
        tp=tp,
        pp=pp,
        global_batch_size=batch,
        tflops_per_gpu=tflops,
        reported="executed",
        micro_batch=1 if pp > 1 else 4,
        interleave=2 if pp > 1 and (layers // pp) % 2 == 0 else 1,
        recompute="full",
        sharding="none",
        node_network_gbps=1600.0,
    )


LLAMA3_405B = ModelShape(126, 16384, 53248, 128, 8, 128256, 8192)

PUBLISHED_RUNS: tuple[PublishedRun, ...] = (
    _megatron(("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137.0)),
    _megatron(("3.6B", 32, 3072, 30, 2, 1, 64, 512, 138.0)),
    _megatron(("7.5B", 32, 4096, 36, 4, 1, 128, 512, 142.0)),
    _megatron(("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135.0)),
    _megatron(("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138.0)),
    _megatron(("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140.0)),
    _megatron(("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148.0)),
    _megatron(("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155.0)),
    _megatron(("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163.0)),
    _megatron(("1008B", 160, 25600, 128, 8, 64, 3072, 3072, 163.0)),
    PublishedRun(
        name="Llama 3 405B, 8K GPUs",
        source="LLAMA3 Table 4",
        model=LLAMA3_405B,
        gpu_type="H100-SXM-80GB",
        gpus=8192,
        tp=8,
        pp=16,
        global_batch_size=64 * 32,
        tflops_per_gpu=430.0,
        reported="model",
        micro_batch=1,
        recompute="full",
        sharding="optimizer",
        node_network_gbps=3200.0,
        interleave=4,
    ),
    PublishedRun(
        name="Llama 3 405B, 16K GPUs",
        source="LLAMA3 Table 4",
        model=LLAMA3_405B,
        gpu_type="H100-SXM-80GB",
        gpus=16384,
        tp=8,
        pp=16,
        global_batch_size=128 * 16,
        tflops_per_gpu=400.0,
        reported="model",
        micro_batch=1,
        recompute="full",
        sharding="optimizer",
        node_network_gbps=3200.0,
        interleave=4,
    ),
    PublishedRun(
        name="BLOOM 176B",
        source="BLOOM section 3.4, chronicles",
        model=ModelShape(70, 14336, 4 * 14336, 112, 112, 250880, 2048),
        gpu_type="A100-SXM-80GB",
        gpus=384,
        tp=4,
        pp=12,
        global_batch_size=2048,
        tflops_per_gpu=150.0,
        reported="executed",
        micro_batch=2,
        recompute="full",
        sharding="optimizer",
        node_network_gbps=400.0,
    ),
    PublishedRun(
        name="OPT 175B",
        source="OPT section 2.4",
        model=_gpt(96, 12288, 96, vocab=50272),
        gpu_type="A100-SXM-80GB",
        gpus=992,
        tp=8,
        pp=1,
        global_batch_size=992,
        tflops_per_gpu=147.0,
        reported="executed",
        micro_batch=8,
        recompute="full",
        sharding="full",
        node_network_gbps=1600.0,
    ),
    PublishedRun(
        name="MT-NLG 530B, 2240 GPUs",
        source="MTNLG section 3",
        model=_gpt(105, 20480, 128),
        gpu_type="A100-SXM-80GB",
        gpus=2240,
        tp=8,
        pp=35,
        global_batch_size=1920,
        tflops_per_gpu=126.0,
        reported="executed",
        micro_batch=1,
        recompute="full",
        sharding="optimizer",
        node_network_gbps=1600.0,
    ),
    PublishedRun(
        name="MT-NLG 530B, 3360 GPUs",
        source="MTNLG section 3",
        model=_gpt(105, 20480, 128),
        gpu_type="A100-SXM-80GB",
        gpus=3360,
        tp=8,
        pp=35,
        global_batch_size=1920,
        tflops_per_gpu=113.0,
        reported="executed",
        micro_batch=1,
        recompute="full",
        sharding="optimizer",
        node_network_gbps=1600.0,
    ),
)


@functools.lru_cache(maxsize=32)
def cluster_of(run: PublishedRun) -> Inventory:
    """The run's cluster as an inventory: nodes of 8 GPUs of its type."""
    gpu: GpuType = by_name(run.gpu_type)
    nodes = tuple(
        NodeCapacity(
            name=NodeName(f"node-{i:05d}"),
            gpu_type=gpu,
            free_gpus=8,
            free_cpu_millis=96_000,
            network_gbps=run.node_network_gbps,
            zone="",
            block=f"block-{i // 32:03d}",
        )
        for i in range(run.gpus // 8)
    )
    return Inventory(nodes=nodes)


def job_of(run: PublishedRun, *, manual: bool) -> JobRequirements:
    """The run as a job of 8-GPU pods; ``manual`` fixes the published tp/pp and sharding."""
    return JobRequirements(
        global_batch_size=run.global_batch_size,
        replicas=run.gpus // 8,
        min_replicas=1,
        gpus_per_worker=8,
        precision=run.precision,
        model=run.model,
        gpu_types=(run.gpu_type,),
        tensor=run.tp if manual else None,
        pipeline=run.pp if manual else None,
        sharding=(run.sharding,) if manual else ("none", "optimizer", "full"),
    )


def predict_published(
    run: PublishedRun, constants: ModelConstants = DEFAULT_CONSTANTS
) -> PlanResult:
    """The model's prediction for exactly the published layout."""
    return evaluate_layout(
        job_of(run, manual=True),
        cluster_of(run),
        Layout(
            run.tp,
            run.pp,
            run.micro_batch,
            run.sharding,
            run.recompute,
            run.precision,
            run.interleave,
        ),
        pods=((run.gpu_type, run.gpus // 8),),
        constants=constants,
    )


def predicted_tflops(run: PublishedRun, result: PlanResult) -> float:
    """The predicted figure comparable to the published one (executed or model FLOPs)."""
    predicted = result.plans[0].predicted
    if run.reported == "executed":
        return predicted.tflops_per_gpu
    peak = by_name(run.gpu_type).peak_tflops(run.precision) or 0.0
    return predicted.mfu * peak


def plan_auto(run: PublishedRun, constants: ModelConstants = DEFAULT_CONSTANTS) -> PlanResult:
    """The planner's own choice (auto mode) on the run's cluster."""
    return plan_job(job_of(run, manual=False), cluster_of(run), top_k=1, constants=constants)
