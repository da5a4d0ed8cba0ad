"""The GPU catalog: what each accelerator type can do, with a cited source for every figure.

The planner never guesses hardware: a node's GPU type is resolved to one ``GpuType`` here (or
to figures the node declares itself, see ``inventory``), and the performance model reads only
these fields. Figures are datasheet values (dense, i.e. without 2:4 sparsity); ``gemm
efficiency`` is not a datasheet value but a model constant, calibrated as ``calibration``
describes. Prices are approximate on-demand list prices per GPU-hour, used only to rank plans
under the cost objective.

Conventions:
- ``fp32`` is the TF32 tensor-core rate where the GPU has one (what PyTorch uses for fp32
  matmuls with ``torch.backends.cuda.matmul.allow_tf32``), else the plain FP32 rate.
- ``None`` for a precision means the GPU has no hardware support for it (V100/T4 and bf16);
  the planner rejects such a type for such a job rather than predicting an emulated rate.
- ``interconnect_gbs`` is the per-GPU, per-direction bandwidth to the other GPUs of its node
  in GB/s (NVLink total bandwidth is quoted bidirectional; we halve it).
- ``node_network_gbps`` is a node's total NIC bandwidth in Gbit/s, used when a node lacks the
  ``elastra.dev/network-gbps`` annotation.

Sources (abbreviated in the entries):
  [H200]   NVIDIA H200 Tensor Core GPU datasheet (2024).
  [H100]   NVIDIA H100 Tensor Core GPU datasheet (2023), SXM5, PCIe and NVL columns.
  [A100]   NVIDIA A100 Tensor Core GPU datasheet (2021), 40GB/80GB, SXM4/PCIe columns.
  [L40S]   NVIDIA L40S datasheet (2023).  [L4] NVIDIA L4 datasheet (2023).
  [A10]    NVIDIA A10 datasheet (2021); AWS's A10G is the A10 part in g5 instances.
  [V100]   NVIDIA V100 Tensor Core GPU datasheet (2020), SXM2 column.
  [T4]     NVIDIA T4 datasheet (2019).
  [MI300X] AMD Instinct MI300X data sheet (2023).
  [DGX]    NVIDIA DGX H100 / DGX A100 user guides: 8 GPUs, 8x400 Gb/s resp. 8x200 Gb/s
           compute NICs per node; DGX-1 (V100): 4x100 Gb/s.
  [AWS]    AWS EC2 on-demand prices, us-east-1, 2024, for g6e/g6/g5/g4dn.xlarge (one GPU);
           node networking from the same instance pages (g5/g6 48xlarge: 100 Gb/s).
  [LAMBDA] Lambda on-demand cloud prices per GPU-hour, 2024 (H100 SXM $2.99, H100 PCIe
           $2.49, A100 SXM 80GB $1.79, A100 40GB $1.29, V100 16GB $0.50); H200 approximate.
  [AMD-CLOUD] public MI300X on-demand offers, 2024 (about $2.5/GPU-hour).
  [AZURE]  Azure NC H100 v5 size series: H100 NVL 94GB, 1 GPU per NC40ads (40 Gb/s), 2 per
           NC80adis (80 Gb/s), the pair NVLink-bridged; pay-as-you-go list price, East US,
           2024, about $7 per GPU-hour (approximate).
  [CPU]    Intel Xeon (Sapphire Rapids) AVX-512: 2 FMA units x 16 fp32 lanes x 2 FLOP
           x ~3 GHz = ~0.19 TFLOP/s per core; AWS c7i at $0.0446 per vCPU-hour.
  [CAL]    model constant calibrated against the published runs in ``validation`` (A100,
           H100 SXM). For other types ``gemm_efficiency`` is an uncalibrated guess: fit it
           from measured steps with ``calibration`` before trusting absolute predictions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, NewType

GpuTypeName = NewType("GpuTypeName", str)
"""A catalog name such as ``H100-SXM-80GB``; always contains the marketing name."""

Precision = Literal["bf16", "fp16", "fp32"]

NVIDIA_GPU = "nvidia.com/gpu"
"""The extended resource NVIDIA's device plugin advertises and GPU pods request."""
AMD_GPU = "amd.com/gpu"
"""The extended resource AMD's device plugin (ROCm k8s-device-plugin) advertises."""
GPU_RESOURCES = (NVIDIA_GPU, AMD_GPU)

CPU_TYPE = GpuTypeName("CPU")
"""The pseudo-type of CPU-only nodes; one "device" is one core."""


@dataclass(frozen=True)
class GpuType:
    """One accelerator type. Frozen and hashable: node capacities and plans refer to it."""

    name: GpuTypeName
    family: str
    bf16_tflops: float | None
    fp16_tflops: float | None
    fp32_tflops: float | None
    memory_gib: float
    memory_bandwidth_gbs: float
    interconnect_gbs: float
    gpus_per_node: int
    node_network_gbps: float
    hourly_usd: float
    gemm_efficiency: float
    product_labels: tuple[str, ...] = ()
    is_cpu: bool = False
    resource: str = NVIDIA_GPU
    """The extended resource a pod requests one of these GPUs by (``amd.com/gpu`` for AMD)."""

    def peak_tflops(self, precision: str) -> float | None:
        """Dense peak TFLOP/s at ``precision``; ``None`` when the hardware lacks it."""
        if precision == "bf16":
            return self.bf16_tflops
        if precision == "fp16":
            return self.fp16_tflops
        return self.fp32_tflops


def _gpu(
    name: str,
    family: str,
    *,
    tflops: tuple[float | None, float | None, float | None],
    memory_gib: float,
    hbm_gbs: float,
    link_gbs: float,
    per_node: int,
    nic_gbps: float,
    usd: float,
    eff: float,
    labels: tuple[str, ...],
    resource: str = NVIDIA_GPU,
) -> GpuType:
    bf16, fp16, fp32 = tflops
    return GpuType(
        name=GpuTypeName(name),
        family=family,
        bf16_tflops=bf16,
        fp16_tflops=fp16,
        fp32_tflops=fp32,
        memory_gib=memory_gib,
        memory_bandwidth_gbs=hbm_gbs,
        interconnect_gbs=link_gbs,
        gpus_per_node=per_node,
        node_network_gbps=nic_gbps,
        hourly_usd=usd,
        gemm_efficiency=eff,
        product_labels=labels,
        resource=resource,
    )


CATALOG: tuple[GpuType, ...] = (
    # [H200] 989 TFLOP/s dense bf16/fp16, 494 TF32, 141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s.
    # [DGX]-class HGX H200 nodes: 8 GPUs, 8x400 Gb/s. Price [LAMBDA]. Efficiency [CAL] as H100 SXM.
    _gpu(
        "H200-SXM-141GB",
        "H200",
        tflops=(989.0, 989.0, 494.0),
        memory_gib=141.0,
        hbm_gbs=4800.0,
        link_gbs=450.0,
        per_node=8,
        nic_gbps=3200.0,
        usd=3.80,
        eff=0.84,
        labels=("NVIDIA-H200", "NVIDIA-H200-141GB-HBM3e", "NVIDIA-H200-SXM-141GB"),
    ),
    # [H100] SXM5: 989/989/494 TFLOP/s, 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s.
    # [DGX] H100: 8 GPUs, 8x400 Gb/s. Price [LAMBDA] $2.99. Efficiency [CAL] (Llama 3).
    _gpu(
        "H100-SXM-80GB",
        "H100",
        tflops=(989.0, 989.0, 494.0),
        memory_gib=80.0,
        hbm_gbs=3350.0,
        link_gbs=450.0,
        per_node=8,
        nic_gbps=3200.0,
        usd=2.99,
        eff=0.84,
        labels=("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-SXM5-80GB", "NVIDIA-H100-SXM"),
    ),
    # [H100] PCIe: 756/756/378 TFLOP/s, 80 GB HBM2e at 2.0 TB/s, PCIe Gen5 128 GB/s bidir.
    # Typical 8-GPU PCIe servers with 2x200 Gb/s. Price [LAMBDA] $2.49. Efficiency: below
    # SXM for the lower clock and power limit (350 W), a guess until calibrated.
    _gpu(
        "H100-PCIe-80GB",
        "H100",
        tflops=(756.0, 756.0, 378.0),
        memory_gib=80.0,
        hbm_gbs=2000.0,
        link_gbs=64.0,
        per_node=8,
        nic_gbps=400.0,
        usd=2.49,
        eff=0.75,
        labels=("NVIDIA-H100-PCIe", "NVIDIA-H100-PCIE-80GB", "NVIDIA-H100-80GB-PCIe"),
    ),
    # [H100] NVL: 835/835/418 TFLOP/s dense (half the sparse 1671/835), 94 GB HBM3 at 3.9 TB/s,
    # NVLink bridge 600 GB/s bidir between a pair. [AZURE] NC H100 v5: at most 2 per VM,
    # 80 Gb/s; price approximate. Efficiency: between PCIe and SXM, a guess until calibrated.
    _gpu(
        "H100-NVL-94GB",
        "H100",
        tflops=(835.0, 835.0, 418.0),
        memory_gib=94.0,
        hbm_gbs=3900.0,
        link_gbs=300.0,
        per_node=2,
        nic_gbps=80.0,
        usd=7.0,
        eff=0.78,
        labels=("NVIDIA-H100-NVL", "NVIDIA-H100-NVL-94GB"),
    ),
    # [A100] SXM4 80GB: 312/312/156 TFLOP/s, 2.039 TB/s, NVLink 600 GB/s.
    # [DGX] A100: 8 GPUs, 8x200 Gb/s. Price [LAMBDA] $1.79. Efficiency [CAL] (Megatron, BLOOM).
    _gpu(
        "A100-SXM-80GB",
        "A100",
        tflops=(312.0, 312.0, 156.0),
        memory_gib=80.0,
        hbm_gbs=2039.0,
        link_gbs=300.0,
        per_node=8,
        nic_gbps=1600.0,
        usd=1.79,
        eff=0.64,
        labels=("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-SXM4"),
    ),
    # [A100] SXM4 40GB: 312/312/156 TFLOP/s, 1.555 TB/s, NVLink 600 GB/s.
    # [DGX] A100 (40GB): 8 GPUs, 8x200 Gb/s. Price [LAMBDA] $1.29.
    _gpu(
        "A100-SXM-40GB",
        "A100",
        tflops=(312.0, 312.0, 156.0),
        memory_gib=40.0,
        hbm_gbs=1555.0,
        link_gbs=300.0,
        per_node=8,
        nic_gbps=1600.0,
        usd=1.29,
        eff=0.64,
        labels=("NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-40GB-SXM4"),
    ),
    # [A100] PCIe 80GB: 312/312/156 TFLOP/s, 1.935 TB/s, PCIe Gen4 64 GB/s bidir.
    # 8-GPU PCIe servers with 2x100 Gb/s. Price approximate, between [LAMBDA]'s A100 entries.
    _gpu(
        "A100-PCIe-80GB",
        "A100",
        tflops=(312.0, 312.0, 156.0),
        memory_gib=80.0,
        hbm_gbs=1935.0,
        link_gbs=32.0,
        per_node=8,
        nic_gbps=200.0,
        usd=1.60,
        eff=0.64,
        labels=("NVIDIA-A100-80GB-PCIe", "NVIDIA-A100-PCIE-80GB"),
    ),
    # [A100] PCIe 40GB: 312/312/156 TFLOP/s, 1.555 TB/s, PCIe Gen4. Price [LAMBDA] ~$1.29.
    _gpu(
        "A100-PCIe-40GB",
        "A100",
        tflops=(312.0, 312.0, 156.0),
        memory_gib=40.0,
        hbm_gbs=1555.0,
        link_gbs=32.0,
        per_node=8,
        nic_gbps=200.0,
        usd=1.29,
        eff=0.64,
        labels=("NVIDIA-A100-PCIE-40GB", "NVIDIA-A100-40GB-PCIe"),
    ),
    # [L40S] 362/362/183 TFLOP/s dense, 48 GB GDDR6 at 864 GB/s, PCIe Gen4 (no NVLink).
    # Price and 8-GPU node networking [AWS] g6e ($1.861 for g6e.xlarge; 400 Gb/s g6e.48xlarge).
    _gpu(
        "L40S",
        "L40S",
        tflops=(362.0, 362.0, 183.0),
        memory_gib=48.0,
        hbm_gbs=864.0,
        link_gbs=32.0,
        per_node=8,
        nic_gbps=400.0,
        usd=1.86,
        eff=0.55,
        labels=("NVIDIA-L40S",),
    ),
    # [L4] 121/121/60 TFLOP/s dense, 24 GB GDDR6 at 300 GB/s, PCIe Gen4 x16.
    # Price and networking [AWS] g6 ($0.805 for g6.xlarge; 100 Gb/s g6.48xlarge, 8 GPUs).
    _gpu(
        "L4",
        "L4",
        tflops=(121.0, 121.0, 60.0),
        memory_gib=24.0,
        hbm_gbs=300.0,
        link_gbs=32.0,
        per_node=8,
        nic_gbps=100.0,
        usd=0.80,
        eff=0.50,
        labels=("NVIDIA-L4",),
    ),
    # [A10] 125/125/62.5 TFLOP/s dense, 24 GB GDDR6 at 600 GB/s, PCIe Gen4.
    # Price and networking [AWS] g5 ($1.006 for g5.xlarge; 100 Gb/s g5.48xlarge, 8 GPUs).
    _gpu(
        "A10G",
        "A10G",
        tflops=(125.0, 125.0, 62.5),
        memory_gib=24.0,
        hbm_gbs=600.0,
        link_gbs=32.0,
        per_node=8,
        nic_gbps=100.0,
        usd=1.01,
        eff=0.50,
        labels=("NVIDIA-A10G", "NVIDIA-A10"),
    ),
    # [V100] SXM2: 125 TFLOP/s fp16 tensor, no bf16, 15.7 fp32; 900 GB/s HBM2; NVLink 300 GB/s.
    # DGX-1: 8 GPUs, 4x100 Gb/s [DGX]. Price [LAMBDA] $0.50 (8x V100 16GB).
    _gpu(
        "V100-SXM2-16GB",
        "V100",
        tflops=(None, 125.0, 15.7),
        memory_gib=16.0,
        hbm_gbs=900.0,
        link_gbs=150.0,
        per_node=8,
        nic_gbps=400.0,
        usd=0.50,
        eff=0.55,
        labels=("Tesla-V100-SXM2-16GB", "NVIDIA-V100-SXM2-16GB"),
    ),
    # [V100] SXM2 32GB: as above with 32 GB. Price approximate ([LAMBDA] 16GB + 20%).
    _gpu(
        "V100-SXM2-32GB",
        "V100",
        tflops=(None, 125.0, 15.7),
        memory_gib=32.0,
        hbm_gbs=900.0,
        link_gbs=150.0,
        per_node=8,
        nic_gbps=400.0,
        usd=0.60,
        eff=0.55,
        labels=("Tesla-V100-SXM2-32GB", "NVIDIA-V100-SXM2-32GB"),
    ),
    # [T4] 65 TFLOP/s fp16 tensor, no bf16, 8.1 fp32; 16 GB GDDR6 at 320 GB/s; PCIe Gen3 x16.
    # Price [AWS] g4dn.xlarge $0.526; g4dn.12xlarge: 4 GPUs, 50 Gb/s.
    _gpu(
        "T4",
        "T4",
        tflops=(None, 65.0, 8.1),
        memory_gib=16.0,
        hbm_gbs=320.0,
        link_gbs=16.0,
        per_node=4,
        nic_gbps=50.0,
        usd=0.53,
        eff=0.45,
        labels=("Tesla-T4", "NVIDIA-T4"),
    ),
    # AMD's node labeller writes amd.com/gpu.product-name=AMD_Instinct_MI300X_OAM; pods request
    # amd.com/gpu (ROCm k8s-device-plugin).
    # [MI300X] 1307/1307/654 TFLOP/s dense, 192 GB HBM3 at 5.3 TB/s, Infinity Fabric
    # 7x128 GB/s = 896 GB/s bidir per GPU; 8-GPU platform with 8x400 Gb/s. Price [AMD-CLOUD].
    _gpu(
        "MI300X",
        "MI300X",
        tflops=(1307.0, 1307.0, 654.0),
        memory_gib=192.0,
        hbm_gbs=5300.0,
        link_gbs=448.0,
        per_node=8,
        nic_gbps=3200.0,
        usd=2.50,
        eff=0.45,
        labels=(
            "AMD_Instinct_MI300X_OAM",
            "AMD-Instinct-MI300X",
            "AMD-Instinct-MI300X-OAM",
            "MI300X-OAM",
        ),
        resource=AMD_GPU,
    ),
    # [CPU] one core: ~0.19 TFLOP/s fp32 (bf16 without AMX runs at the fp32 rate), a nominal
    # 4 GiB and ~5 GB/s of memory bandwidth per core; "interconnect" is shared memory.
    GpuType(
        name=CPU_TYPE,
        family="CPU",
        bf16_tflops=0.19,
        fp16_tflops=0.19,
        fp32_tflops=0.19,
        memory_gib=4.0,
        memory_bandwidth_gbs=5.0,
        interconnect_gbs=10.0,
        gpus_per_node=64,
        node_network_gbps=25.0,
        hourly_usd=0.045,
        gemm_efficiency=0.5,
        is_cpu=True,
    ),
)

_BY_NAME: Mapping[str, GpuType] = {t.name: t for t in CATALOG}


def normalize(spelling: str) -> str:
    """Case- and separator-insensitive form of a type spelling (``Tesla T4`` == ``tesla-t4``).

    GPU Feature Discovery replaces spaces with ``-`` and appends ``-SHARED`` for time-sliced
    GPUs; both are folded away here.
    """
    text = re.sub(r"[\s_]+", "-", spelling.strip()).lower()
    return text.removesuffix("-shared")


def _tokens(spelling: str) -> tuple[str, ...]:
    return tuple(t for t in normalize(spelling).split("-") if t)


_BY_SPELLING: Mapping[str, GpuType] = {
    normalize(spelling): gpu for gpu in CATALOG for spelling in (gpu.name, *gpu.product_labels)
}


def by_name(name: str) -> GpuType:
    """The catalog entry called exactly ``name`` (KeyError otherwise)."""
    return _BY_NAME[name]


def lookup(spelling: str) -> GpuType | None:
    """The entry a catalog name or a GPU Feature Discovery product label denotes, or None."""
    return _BY_SPELLING.get(normalize(spelling))


def resource_of(name: str) -> str:
    """The extended resource a pod requests GPUs of catalog type ``name`` by.

    A type the catalog does not know (one a node declared with its own figures) is an NVIDIA
    GPU: the inventory excludes AMD nodes whose type is not in the catalog, so a pod never
    asks for the wrong vendor's resource.
    """
    gpu = _BY_NAME.get(name)
    return gpu.resource if gpu is not None else NVIDIA_GPU


def matches(pattern: str, gpu: GpuType) -> bool:
    """Whether a ``worker.gpuTypes`` entry selects ``gpu``.

    An entry selects a type when it is the type's name or one of its product labels, or when
    it starts with the type's marketing name and its other words all occur in the name:
    ``H100`` selects both H100 entries, ``A100-80GB`` selects SXM and PCIe 80 GB parts.
    """
    key = normalize(pattern)
    if key == normalize(gpu.name) or key in {normalize(label) for label in gpu.product_labels}:
        return True
    words = _tokens(pattern)
    name_words = set(_tokens(gpu.name))
    return bool(words) and words[0] == normalize(gpu.family) and set(words) <= name_words


def selected(patterns: Iterable[str]) -> tuple[GpuType, ...]:
    """The catalog's GPU types (never the CPU pseudo-type) that any of the ``worker.gpuTypes``
    entries ``patterns`` selects, in catalog order; none for no entry."""
    wanted = tuple(patterns)
    return tuple(gpu for gpu in CATALOG if not gpu.is_cpu and any(matches(p, gpu) for p in wanted))


def known_pattern(pattern: str, extra: Iterable[GpuType] = ()) -> bool:
    """Whether a ``worker.gpuTypes`` entry selects any catalog type or any of ``extra``."""
    return any(matches(pattern, gpu) for gpu in (*CATALOG, *extra))
