"""Which GPUs a node has, read from the labels clouds, autoscalers and device plugins write.

Elastra's own label and GPU Feature Discovery's product label are not on most managed
clusters' nodes: GKE names the accelerator, EKS and AKS only the instance type, Karpenter
the GPU's name and memory. This module holds those providers' facts in one table beside the
catalog (``catalog`` holds what each GPU type can do; this, which labels mean which type and
how many GPUs an instance type has) and reads a node's labels in a documented order:

1. ``elastra.dev/gpu-type``: the cluster admin's word; an unknown value is not looked past.
2. GPU Feature Discovery's ``nvidia.com/gpu.product`` (``NVIDIA-H100-80GB-HBM3``, ``Tesla-T4``,
   ...; ``catalog.lookup`` knows the spellings) and AMD's node labeller's
   ``amd.com/gpu.product-name`` (``AMD_Instinct_MI300X_OAM``; also its older
   ``beta.amd.com/`` prefix): the device's own name.
3. GKE's ``cloud.google.com/gke-accelerator`` (``nvidia-h100-80gb``).
4. Karpenter's ``karpenter.k8s.aws/instance-gpu-name`` (``a100``), with
   ``karpenter.k8s.aws/instance-gpu-memory`` (MiB per GPU) to tell memory variants apart.
5. AKS's ``kubernetes.azure.com/accelerator`` (``nvidia``: the vendor only) with the VM size
   in ``node.kubernetes.io/instance-type``.
6. The instance type alone (``node.kubernetes.io/instance-type``, or its ``beta.`` twin).

From 2 on, a label whose value the table does not know is passed over for the next one (a new
GFD spelling on a p5.48xlarge is still an H100), and named in the reason when none decides.
The instance type (or Karpenter's ``instance-gpu-count``) also says how many GPUs the node
should have; the inventory compares that with ``status.allocatable``, which wins. It also gives
the node's network bandwidth where the provider documents it (``InstanceGpus.network_gbps``):
the inventory takes it when the node has no ``elastra.dev/network-gbps`` annotation and no
Karpenter ``instance-network-bandwidth`` label, before the catalog's default for the GPU type
(a DGX's figure: 1,600 Gbit/s for an A100 node, where a p4d.24xlarge has 400).

Sources, each read for the entries it marks:
  [EC2]   AWS EC2 accelerated computing instance specifications (p3, p4d, p4de, p5, p5e,
          p5en, g4dn, g5, g6, g6e), and the generated instance-type reference of the
          Karpenter AWS provider (website/content/en/docs/reference/instance-types.md):
          its ``instance-gpu-*`` labels and ``nvidia.com/gpu`` capacity for the same sizes,
          and ``instance-network-bandwidth``, the baseline bandwidth EC2 reports for the
          type (Mbit/s; a size sold as "up to 10 Gigabit" has 2.5 Gbit/s sustained). Read
          from its release of 2026-08-21; p3, which that release no longer lists, from
          v1.12's.
  [AZURE] Microsoft Learn, Azure VM size series: ND A100 v4 (8x A100 40GB SXM), NDm A100 v4
          (8x A100 80GB SXM), NC A100 v4 (1/2/4x A100 80GB PCIe), ND H100 v5 (8x H100 SXM),
          ND H200 v5 (8x H200), NC H100 v5 (1/2x H100 NVL), ND MI300X v5 (8x MI300X),
          NCasT4_v3 (1/1/1/4x T4), NDv2 (8x V100 32GB SXM2). AKS labels GPU nodes
          ``kubernetes.azure.com/accelerator=nvidia``. Network: the ND sizes' InfiniBand, one
          link per GPU (A100 v4: 8x 200 Gbit/s HDR, 1.6 Tbit/s; H100, H200 and MI300X v5:
          8x 400 Gbit/s NDR, 3.2 Tbit/s; NDv2: 100 Gbit/s EDR), the NC sizes' "Max
          Bandwidth" of their Network tab (Ethernet, Mbit/s).
  [GCE]   Google Compute Engine, "GPU machine types": A2 Standard (a2-highgpu-1g..8g,
          a2-megagpu-16g: A100 40GB, ``nvidia-tesla-a100``), A2 Ultra (a2-ultragpu-1g..8g:
          A100 80GB, ``nvidia-a100-80gb``), A3 High/Edge (H100, ``nvidia-h100-80gb``), A3 Mega
          (H100, ``nvidia-h100-mega-80gb``), A3 Ultra (H200, ``nvidia-h200-141gb``), G2 (L4,
          ``nvidia-l4``: 1 GPU for -4/-8/-12/-16/-32, 2 for -24, 4 for -48, 8 for -96), N1 with
          ``nvidia-tesla-t4`` and ``nvidia-tesla-v100`` (16 GB, NVLink). GKE writes the
          accelerator in ``cloud.google.com/gke-accelerator``. Network: "Networking and GPU
          machines" (compute/docs/gpus/gpu-network-bandwidth), each series' maximum total
          bandwidth: A3 Ultra 3,600 Gbit/s, A3 Mega 1,800, A3 High 1,000, A3 Edge 600, A2 and
          G2 100. The page gives A2, G2 and A3 High as "up to", by machine type, without each
          type's figure: their smaller types are taken at the series' maximum too.
  [GFD]   NVIDIA GPU Feature Discovery: ``nvidia.com/gpu.product`` is the device name with
          spaces as ``-``, ``-SHARED`` appended when time-sliced, ``-MIG-<profile>`` with the
          single MIG strategy; the mixed strategy advertises ``nvidia.com/mig-<profile>``.
  [AMD]   ROCm k8s-device-plugin and its node labeller: ``amd.com/gpu`` resources,
          ``amd.com/gpu.product-name`` (MI300X: ``AMD_Instinct_MI300X_OAM``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from elastra.planner.catalog import CATALOG, GpuTypeName, lookup

LABEL_GPU_TYPE = "elastra.dev/gpu-type"
LABEL_GFD_PRODUCT = "nvidia.com/gpu.product"
LABEL_AMD_PRODUCT = "amd.com/gpu.product-name"
LABEL_AMD_PRODUCT_BETA = "beta.amd.com/gpu.product-name"
LABEL_GKE_ACCELERATOR = "cloud.google.com/gke-accelerator"
LABEL_KARPENTER_GPU_NAME = "karpenter.k8s.aws/instance-gpu-name"
LABEL_KARPENTER_GPU_MEMORY = "karpenter.k8s.aws/instance-gpu-memory"
LABEL_KARPENTER_GPU_COUNT = "karpenter.k8s.aws/instance-gpu-count"
LABEL_KARPENTER_GPU_MANUFACTURER = "karpenter.k8s.aws/instance-gpu-manufacturer"
LABEL_KARPENTER_NETWORK = "karpenter.k8s.aws/instance-network-bandwidth"
"""The instance's network bandwidth in Mbit/s, as Karpenter labels its AWS nodes."""
LABEL_AKS_ACCELERATOR = "kubernetes.azure.com/accelerator"
LABEL_INSTANCE_TYPE = "node.kubernetes.io/instance-type"
LABEL_INSTANCE_TYPE_BETA = "beta.kubernetes.io/instance-type"
LABEL_MIG_CONFIG = "nvidia.com/mig.config"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
MIG_PRODUCT_MARK = "-mig-"

PRODUCT_LABELS = (LABEL_GFD_PRODUCT, LABEL_AMD_PRODUCT, LABEL_AMD_PRODUCT_BETA)
"""Labels a device's own labeller writes, in the order they are read."""
GPU_LABELS = (
    LABEL_GPU_TYPE,
    *PRODUCT_LABELS,
    LABEL_GKE_ACCELERATOR,
    LABEL_KARPENTER_GPU_NAME,
    LABEL_AKS_ACCELERATOR,
    LABEL_INSTANCE_TYPE,
    LABEL_INSTANCE_TYPE_BETA,
)
"""Every label the GPU type is read from, in the order they are read (see the docstring)."""

H200 = GpuTypeName("H200-SXM-141GB")
H100 = GpuTypeName("H100-SXM-80GB")
H100_NVL = GpuTypeName("H100-NVL-94GB")
A100_80 = GpuTypeName("A100-SXM-80GB")
A100_40 = GpuTypeName("A100-SXM-40GB")
A100_PCIE_80 = GpuTypeName("A100-PCIe-80GB")
L40S = GpuTypeName("L40S")
L4 = GpuTypeName("L4")
A10G = GpuTypeName("A10G")
V100_16 = GpuTypeName("V100-SXM2-16GB")
V100_32 = GpuTypeName("V100-SXM2-32GB")
T4 = GpuTypeName("T4")
MI300X = GpuTypeName("MI300X")


@dataclass(frozen=True)
class InstanceGpus:
    """What an instance type (VM size, machine type) carries: its GPU type and count, and its
    network bandwidth in Gbit/s (all its NICs; ``None`` where the provider gives no figure)."""

    gpu: GpuTypeName
    count: int
    network_gbps: float | None = None


Size = tuple[int, float]
"""(GPUs, network Gbit/s) of one size of a family."""


def _sizes(gpu: GpuTypeName, prefix: str, sizes: Mapping[str, Size]) -> dict[str, InstanceGpus]:
    return {
        f"{prefix}{size}": InstanceGpus(gpu, count, network)
        for size, (count, network) in sizes.items()
    }


AWS_INSTANCE_TYPES: Mapping[str, InstanceGpus] = {
    **_sizes(A100_40, "p4d.", {"24xlarge": (8, 400)}),
    **_sizes(A100_80, "p4de.", {"24xlarge": (8, 400)}),
    **_sizes(H100, "p5.", {"4xlarge": (1, 100), "48xlarge": (8, 3200)}),
    **_sizes(H200, "p5e.", {"48xlarge": (8, 3200)}),
    **_sizes(H200, "p5en.", {"48xlarge": (8, 3200)}),
    **_sizes(V100_16, "p3.", {"2xlarge": (1, 2.5), "8xlarge": (4, 10), "16xlarge": (8, 25)}),
    **_sizes(V100_32, "p3dn.", {"24xlarge": (8, 100)}),
    **_sizes(T4, "g4dn.", {
        "xlarge": (1, 5), "2xlarge": (1, 10), "4xlarge": (1, 20), "8xlarge": (1, 50),
        "16xlarge": (1, 50), "12xlarge": (4, 50), "metal": (8, 100),
    }),
    **_sizes(A10G, "g5.", {
        "xlarge": (1, 2.5), "2xlarge": (1, 5), "4xlarge": (1, 10), "8xlarge": (1, 25),
        "16xlarge": (1, 25), "12xlarge": (4, 40), "24xlarge": (4, 50), "48xlarge": (8, 100),
    }),
    **_sizes(L4, "g6.", {
        "xlarge": (1, 2.5), "2xlarge": (1, 5), "4xlarge": (1, 10), "8xlarge": (1, 25),
        "16xlarge": (1, 25), "12xlarge": (4, 40), "24xlarge": (4, 50), "48xlarge": (8, 100),
    }),
    **_sizes(L40S, "g6e.", {
        "xlarge": (1, 2.5), "2xlarge": (1, 5), "4xlarge": (1, 20), "8xlarge": (1, 25),
        "16xlarge": (1, 35), "12xlarge": (4, 100), "24xlarge": (4, 200), "48xlarge": (8, 400),
    }),
}  # fmt: skip
"""[EC2] instance type -> GPUs, and the baseline network bandwidth."""

AZURE_VM_SIZES: Mapping[str, InstanceGpus] = {
    "Standard_ND96asr_v4": InstanceGpus(A100_40, 8, 1600),
    "Standard_ND96amsr_A100_v4": InstanceGpus(A100_80, 8, 1600),
    **_sizes(A100_PCIE_80, "Standard_NC", {
        "24ads_A100_v4": (1, 20), "48ads_A100_v4": (2, 40), "96ads_A100_v4": (4, 80),
    }),
    "Standard_ND96isr_H100_v5": InstanceGpus(H100, 8, 3200),
    "Standard_ND96isr_H200_v5": InstanceGpus(H200, 8, 3200),
    "Standard_NC40ads_H100_v5": InstanceGpus(H100_NVL, 1, 40),
    "Standard_NC80adis_H100_v5": InstanceGpus(H100_NVL, 2, 80),
    "Standard_ND96isr_MI300X_v5": InstanceGpus(MI300X, 8, 3200),
    **_sizes(T4, "Standard_NC", {
        "4as_T4_v3": (1, 8), "8as_T4_v3": (1, 8), "16as_T4_v3": (1, 8), "64as_T4_v3": (4, 32),
    }),
    "Standard_ND40rs_v2": InstanceGpus(V100_32, 8, 100),
}  # fmt: skip
"""[AZURE] VM size -> GPUs, and the network the GPUs train over (InfiniBand on ND sizes)."""

GCP_MACHINE_TYPES: Mapping[str, InstanceGpus] = {
    **_sizes(A100_40, "a2-", {
        "highgpu-1g": (1, 100), "highgpu-2g": (2, 100), "highgpu-4g": (4, 100),
        "highgpu-8g": (8, 100), "megagpu-16g": (16, 100),
    }),
    **_sizes(A100_80, "a2-ultragpu-", {
        "1g": (1, 100), "2g": (2, 100), "4g": (4, 100), "8g": (8, 100),
    }),
    **_sizes(H100, "a3-", {
        "highgpu-1g": (1, 1000), "highgpu-2g": (2, 1000), "highgpu-4g": (4, 1000),
        "highgpu-8g": (8, 1000), "megagpu-8g": (8, 1800), "edgegpu-8g": (8, 600),
    }),
    **_sizes(H200, "a3-ultragpu-", {"8g": (8, 3600)}),
    **_sizes(L4, "g2-standard-", {
        "4": (1, 100), "8": (1, 100), "12": (1, 100), "16": (1, 100), "32": (1, 100),
        "24": (2, 100), "48": (4, 100), "96": (8, 100),
    }),
}  # fmt: skip
"""[GCE] machine type -> GPUs, and its series' maximum network bandwidth."""

INSTANCE_TYPES: Mapping[str, InstanceGpus] = {
    **AWS_INSTANCE_TYPES,
    **AZURE_VM_SIZES,
    **GCP_MACHINE_TYPES,
}
"""Every instance type the table knows (the three providers' names do not collide)."""

GKE_ACCELERATORS: Mapping[str, GpuTypeName] = {
    "nvidia-h200-141gb": H200,
    "nvidia-h100-mega-80gb": H100,
    "nvidia-h100-80gb": H100,
    "nvidia-a100-80gb": A100_80,
    "nvidia-tesla-a100": A100_40,
    "nvidia-l4": L4,
    "nvidia-l4-vws": L4,
    "nvidia-tesla-t4": T4,
    "nvidia-tesla-t4-vws": T4,
    "nvidia-tesla-v100": V100_16,
}
"""[GCE] ``cloud.google.com/gke-accelerator`` -> type (B200, GB200, P100, P4 and RTX PRO 6000
are not in the catalog)."""

KARPENTER_GPU_NAMES: Mapping[str, tuple[GpuTypeName, ...]] = {
    "h200": (H200,),
    "h100": (H100,),
    "a100": (A100_40, A100_80),
    "a10g": (A10G,),
    "l4": (L4,),
    "l40s": (L40S,),
    "t4": (T4,),
    "v100": (V100_16, V100_32),
}
"""[EC2] ``karpenter.k8s.aws/instance-gpu-name`` -> the types it may be; where more than one,
``instance-gpu-memory`` picks the one whose memory is nearest (p4d's a100 reports 40960 MiB,
p4de's 81920)."""

AKS_VENDOR_ONLY = frozenset({"nvidia", "amd"})
"""Values of ``kubernetes.azure.com/accelerator``: the vendor, never the model."""

_MEMORY_GIB = {gpu.name: gpu.memory_gib for gpu in CATALOG}


@dataclass(frozen=True)
class Identified:
    """What a node's labels say about its GPUs.

    ``spelling`` is the type as the deciding label gives it (a catalog name, or a product
    label ``catalog.lookup`` resolves); ``None`` when no label decides, and then ``read`` lists
    the GPU labels the node has (``key=value``), ``custom`` the first one a node's own figures
    may name a type after (Elastra's or a device labeller's), and ``hint`` what would help.
    """

    spelling: str | None
    source: str = ""
    count: int | None = None
    """GPUs the instance type (or Karpenter's ``instance-gpu-count``) says the node has."""
    count_source: str = ""
    network_gbps: float | None = None
    """The node's network bandwidth as its labels give it, Gbit/s: Karpenter's label, else
    the instance type's documented figure; ``None`` when neither does."""
    read: tuple[str, ...] = ()
    custom: str | None = None
    hint: str = ""


def identify(labels: Mapping[str, str]) -> Identified:
    """The GPU type and count a node's labels give, in the order the module docstring lists."""
    count, count_source = _count_hint(labels)
    network = _network_hint(labels)
    found = _decide(labels)
    if found is not None:
        spelling, source = found
        return Identified(spelling, source, count, count_source, network)
    shown = [k for k in GPU_LABELS if k in labels]
    if LABEL_INSTANCE_TYPE in labels and LABEL_INSTANCE_TYPE_BETA in labels:
        shown.remove(LABEL_INSTANCE_TYPE_BETA)  # the same value under its deprecated name
    read = tuple(f"{key}={labels[key]!r}" for key in shown)
    custom = next((labels[k] for k in (LABEL_GPU_TYPE, *PRODUCT_LABELS) if k in labels), None)
    return Identified(
        None, count=count, count_source=count_source, read=read, custom=custom, hint=_hint(labels)
    )


def _decide(labels: Mapping[str, str]) -> tuple[str, str] | None:
    """(spelling, the label(s) read) of the first source that names a type, or None."""
    own = labels.get(LABEL_GPU_TYPE)
    if own is not None:
        return own, LABEL_GPU_TYPE  # the admin's word: never looked past, even when unknown
    for key in PRODUCT_LABELS:
        value = labels.get(key)
        if value is not None and lookup(value) is not None:
            return value, key
    accelerator = GKE_ACCELERATORS.get(labels.get(LABEL_GKE_ACCELERATOR, ""))
    if accelerator is not None:
        return accelerator, LABEL_GKE_ACCELERATOR
    karpenter = _karpenter_type(labels)
    if karpenter is not None:
        return karpenter
    instance, key = _instance(labels)
    if instance is None:
        return None
    if labels.get(LABEL_AKS_ACCELERATOR) in AKS_VENDOR_ONLY:
        return instance.gpu, f"{LABEL_AKS_ACCELERATOR} + {key}"
    return instance.gpu, key


def _karpenter_type(labels: Mapping[str, str]) -> tuple[str, str] | None:
    candidates = KARPENTER_GPU_NAMES.get(labels.get(LABEL_KARPENTER_GPU_NAME, "").lower())
    if not candidates:
        return None
    if len(candidates) == 1:
        return candidates[0], LABEL_KARPENTER_GPU_NAME
    memory_mib = _number(labels.get(LABEL_KARPENTER_GPU_MEMORY))
    if memory_mib is None:
        return None
    gib = memory_mib / 1024
    nearest = min(candidates, key=lambda name: abs(_MEMORY_GIB[name] - gib))
    return nearest, f"{LABEL_KARPENTER_GPU_NAME} + {LABEL_KARPENTER_GPU_MEMORY}"


def _instance(labels: Mapping[str, str]) -> tuple[InstanceGpus | None, str]:
    for key in (LABEL_INSTANCE_TYPE, LABEL_INSTANCE_TYPE_BETA):
        if key in labels:
            return INSTANCE_TYPES.get(labels[key]), key
    return None, LABEL_INSTANCE_TYPE


def _count_hint(labels: Mapping[str, str]) -> tuple[int | None, str]:
    instance, key = _instance(labels)
    if instance is not None:
        return instance.count, f"{key}={labels[key]}"
    count = _number(labels.get(LABEL_KARPENTER_GPU_COUNT))
    if count is not None and count == int(count):
        return int(count), f"{LABEL_KARPENTER_GPU_COUNT}={labels[LABEL_KARPENTER_GPU_COUNT]}"
    return None, ""


def _network_hint(labels: Mapping[str, str]) -> float | None:
    mbps = _number(labels.get(LABEL_KARPENTER_NETWORK))
    if mbps:
        return mbps / 1000
    instance, _ = _instance(labels)
    return instance.network_gbps if instance is not None else None


def _hint(labels: Mapping[str, str]) -> str:
    """What would tell the type where the labels do not."""
    name = labels.get(LABEL_KARPENTER_GPU_NAME, "").lower()
    if len(KARPENTER_GPU_NAMES.get(name, ())) > 1:
        return f"{LABEL_KARPENTER_GPU_MEMORY} is missing or not a number; it tells {name}s apart"
    return ""


def _number(raw: str | None) -> float | None:
    try:
        return float(raw) if raw is not None else None
    except ValueError:
        return None


def mig_partitions(labels: Mapping[str, str], allocatable: Mapping[str, object]) -> str:
    """What shows the node's GPUs are MIG-partitioned ("" when they are whole GPUs).

    [GFD] single strategy: the product label ends in ``-MIG-<profile>``; mixed strategy: the
    node advertises ``nvidia.com/mig-<profile>`` resources.
    """
    product = labels.get(LABEL_GFD_PRODUCT, "")
    if MIG_PRODUCT_MARK in product.lower():
        return f"{LABEL_GFD_PRODUCT}={product}"
    mig = sorted(
        k
        for k, v in allocatable.items()
        if k.startswith(MIG_RESOURCE_PREFIX) and str(v).strip() not in {"", "0"}
    )
    return f"allocatable {', '.join(mig)}" if mig else ""
