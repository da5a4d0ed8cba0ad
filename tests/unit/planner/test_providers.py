"""Providers' labels name catalog types in the documented order; the table names only types the
catalog has; MIG is recognised in both of GPU Feature Discovery's strategies."""

from __future__ import annotations

import pytest

from elastra.planner.catalog import by_name, lookup
from elastra.planner.providers import (
    GKE_ACCELERATORS,
    INSTANCE_TYPES,
    KARPENTER_GPU_NAMES,
    identify,
    mig_partitions,
)

EKS_P5 = {"node.kubernetes.io/instance-type": "p5.48xlarge"}
KARPENTER_P4DE = {
    "karpenter.k8s.aws/instance-gpu-name": "a100",
    "karpenter.k8s.aws/instance-gpu-manufacturer": "nvidia",
    "karpenter.k8s.aws/instance-gpu-memory": "81920",
    "karpenter.k8s.aws/instance-gpu-count": "8",
    "karpenter.k8s.aws/instance-network-bandwidth": "400000",
    "node.kubernetes.io/instance-type": "p4de.24xlarge",
}


def test_every_type_the_table_names_is_in_the_catalog() -> None:
    named = {
        *(gpu.gpu for gpu in INSTANCE_TYPES.values()),
        *GKE_ACCELERATORS.values(),
        *(name for names in KARPENTER_GPU_NAMES.values() for name in names),
    }
    for name in named:
        assert by_name(name).name == name
    assert all(gpu.count > 0 for gpu in INSTANCE_TYPES.values())


@pytest.mark.parametrize(
    ("labels", "spelling", "source", "count"),
    [
        # 1. Elastra's own label wins over everything, and is never looked past.
        ({"elastra.dev/gpu-type": "L40S", **EKS_P5}, "L40S", "elastra.dev/gpu-type", 8),
        ({"elastra.dev/gpu-type": "Z9", **EKS_P5}, "Z9", "elastra.dev/gpu-type", 8),
        # 2. GPU Feature Discovery's product, AMD's product name.
        (
            {
                "nvidia.com/gpu.product": "NVIDIA-A10G",
                "node.kubernetes.io/instance-type": "g5.12xlarge",
            },
            "NVIDIA-A10G",
            "nvidia.com/gpu.product",
            4,
        ),
        (
            {"amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM"},
            "AMD_Instinct_MI300X_OAM",
            "amd.com/gpu.product-name",
            None,
        ),
        # A product the catalog does not know is passed over for the next label.
        (
            {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-NEW", **EKS_P5},
            "H100-SXM-80GB",
            "node.kubernetes.io/instance-type",
            8,
        ),
        # 3. GKE's accelerator.
        (
            {
                "cloud.google.com/gke-accelerator": "nvidia-h100-mega-80gb",
                "node.kubernetes.io/instance-type": "a3-megagpu-8g",
            },
            "H100-SXM-80GB",
            "cloud.google.com/gke-accelerator",
            8,
        ),
        (
            {"cloud.google.com/gke-accelerator": "nvidia-tesla-a100"},
            "A100-SXM-40GB",
            "cloud.google.com/gke-accelerator",
            None,
        ),
        # 4. Karpenter: the memory tells the two A100s apart.
        (
            KARPENTER_P4DE,
            "A100-SXM-80GB",
            "karpenter.k8s.aws/instance-gpu-name + karpenter.k8s.aws/instance-gpu-memory",
            8,
        ),
        (
            {
                **KARPENTER_P4DE,
                "karpenter.k8s.aws/instance-gpu-memory": "40960",
                "node.kubernetes.io/instance-type": "p4d.24xlarge",
            },
            "A100-SXM-40GB",
            "karpenter.k8s.aws/instance-gpu-name + karpenter.k8s.aws/instance-gpu-memory",
            8,
        ),
        (
            {
                "karpenter.k8s.aws/instance-gpu-name": "l40s",
                "karpenter.k8s.aws/instance-gpu-count": "4",
            },
            "L40S",
            "karpenter.k8s.aws/instance-gpu-name",
            4,
        ),
        # 5. AKS: the accelerator label names the vendor, the VM size the type.
        (
            {
                "kubernetes.azure.com/accelerator": "nvidia",
                "node.kubernetes.io/instance-type": "Standard_ND96amsr_A100_v4",
            },
            "A100-SXM-80GB",
            "kubernetes.azure.com/accelerator + node.kubernetes.io/instance-type",
            8,
        ),
        # 6. The instance type alone, either label.
        (
            {"node.kubernetes.io/instance-type": "g2-standard-24"},
            "L4",
            "node.kubernetes.io/instance-type",
            2,
        ),
        (
            {"beta.kubernetes.io/instance-type": "Standard_NC80adis_H100_v5"},
            "H100-NVL-94GB",
            "beta.kubernetes.io/instance-type",
            2,
        ),
    ],
)
def test_labels_name_a_type_in_order(
    labels: dict[str, str], spelling: str, source: str, count: int | None
) -> None:
    found = identify(labels)
    assert (found.spelling, found.source, found.count) == (spelling, source, count)
    if spelling != "Z9":
        assert lookup(spelling) is not None


@pytest.mark.parametrize(
    ("labels", "read", "custom", "hint"),
    [
        ({}, (), None, ""),
        (
            {"node.kubernetes.io/instance-type": "m5.2xlarge"},
            ("node.kubernetes.io/instance-type='m5.2xlarge'",),
            None,
            "",
        ),
        (
            {
                "nvidia.com/gpu.product": "NVIDIA-B200",
                "node.kubernetes.io/instance-type": "p6-b200.48xlarge",
            },
            (
                "nvidia.com/gpu.product='NVIDIA-B200'",
                "node.kubernetes.io/instance-type='p6-b200.48xlarge'",
            ),
            "NVIDIA-B200",
            "",
        ),
        (
            {"cloud.google.com/gke-accelerator": "nvidia-b200"},
            ("cloud.google.com/gke-accelerator='nvidia-b200'",),
            None,
            "",
        ),
        # AKS's accelerator label alone says the vendor, not the type.
        (
            {"kubernetes.azure.com/accelerator": "nvidia"},
            ("kubernetes.azure.com/accelerator='nvidia'",),
            None,
            "",
        ),
        # Karpenter's a100 without its memory could be either A100.
        (
            {"karpenter.k8s.aws/instance-gpu-name": "a100"},
            ("karpenter.k8s.aws/instance-gpu-name='a100'",),
            None,
            "karpenter.k8s.aws/instance-gpu-memory is missing or not a number; "
            "it tells a100s apart",
        ),
    ],
)
def test_no_type_says_what_was_read(
    labels: dict[str, str], read: tuple[str, ...], custom: str | None, hint: str
) -> None:
    found = identify(labels)
    assert (found.spelling, found.read, found.custom, found.hint) == (None, read, custom, hint)


def instance(name: str, **more: str) -> dict[str, str]:
    return {"node.kubernetes.io/instance-type": name, **more}


@pytest.mark.parametrize(
    ("labels", "gbps"),
    [
        (KARPENTER_P4DE, 400.0),  # Karpenter's label, in Mbit/s
        # Karpenter's label is the node's own word, before the table's
        (instance("p5.48xlarge", **{"karpenter.k8s.aws/instance-network-bandwidth": "100000"}),
         100.0),
        (EKS_P5, 3200.0),
        (instance("p4d.24xlarge"), 400.0),
        (instance("g5.xlarge"), 2.5),  # sold as "up to 10 Gigabit": its baseline
        (instance("g6e.48xlarge"), 400.0),
        (instance("Standard_ND96asr_v4"), 1600.0),
        (instance("Standard_ND96isr_H100_v5"), 3200.0),
        (instance("Standard_ND96isr_MI300X_v5"), 3200.0),
        (instance("Standard_NC24ads_A100_v4"), 20.0),
        (instance("a2-highgpu-8g"), 100.0),
        (instance("a3-highgpu-8g"), 1000.0),
        (instance("a3-megagpu-8g"), 1800.0),
        (instance("a3-ultragpu-8g"), 3600.0),
        # no instance type the table knows: no figure (the catalog's default applies)
        ({"beta.kubernetes.io/instance-type": "p4de.24xlarge"}, 400.0),
        (instance("m6i.2xlarge"), None),
        ({"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}, None),
        ({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "type": "kwok"}, None),
    ],
)  # fmt: skip
def test_network_from_karpenter_or_the_instance_type(
    labels: dict[str, str], gbps: float | None
) -> None:
    assert identify(labels).network_gbps == gbps


def test_every_instance_type_has_a_documented_network_figure() -> None:
    assert all(gpu.network_gbps and gpu.network_gbps > 0 for gpu in INSTANCE_TYPES.values())


@pytest.mark.parametrize(
    ("labels", "allocatable", "evidence"),
    [
        (
            {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"},
            {"nvidia.com/gpu": "56"},
            "nvidia.com/gpu.product=NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
        ),
        (
            {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
            {
                "nvidia.com/mig-1g.10gb": "7",
                "nvidia.com/mig-3g.40gb": "2",
                "nvidia.com/mig-7g.80gb": "0",
            },
            "allocatable nvidia.com/mig-1g.10gb, nvidia.com/mig-3g.40gb",
        ),
        ({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}, {"nvidia.com/gpu": "8"}, ""),
        ({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}, {"nvidia.com/mig-1g.10gb": "0"}, ""),
    ],
)
def test_mig_in_either_strategy(
    labels: dict[str, str], allocatable: dict[str, str], evidence: str
) -> None:
    assert mig_partitions(labels, allocatable) == evidence
