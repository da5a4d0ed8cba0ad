"""The catalog maps what GPU Feature Discovery writes to entries, and gpuTypes patterns select."""

from __future__ import annotations

import pytest

from elastra.planner.catalog import (
    AMD_GPU,
    CATALOG,
    NVIDIA_GPU,
    by_name,
    lookup,
    matches,
    resource_of,
)

GFD_LABELS = [
    ("NVIDIA-H100-80GB-HBM3", "H100-SXM-80GB"),
    ("NVIDIA-H100-PCIe", "H100-PCIe-80GB"),
    ("NVIDIA-H100-NVL", "H100-NVL-94GB"),
    ("NVIDIA-H200", "H200-SXM-141GB"),
    ("NVIDIA-A100-SXM4-80GB", "A100-SXM-80GB"),
    ("NVIDIA-A100-SXM4-40GB", "A100-SXM-40GB"),
    ("NVIDIA-A100-PCIE-40GB", "A100-PCIe-40GB"),
    ("NVIDIA-A100-80GB-PCIe", "A100-PCIe-80GB"),
    ("NVIDIA-L40S", "L40S"),
    ("NVIDIA-L4", "L4"),
    ("NVIDIA-A10G", "A10G"),
    ("Tesla-V100-SXM2-16GB", "V100-SXM2-16GB"),
    ("Tesla-V100-SXM2-32GB", "V100-SXM2-32GB"),
    ("Tesla-T4", "T4"),
    ("Tesla-T4-SHARED", "T4"),
    ("tesla t4", "T4"),
    ("AMD-Instinct-MI300X", "MI300X"),
    ("AMD_Instinct_MI300X_OAM", "MI300X"),  # as AMD's node labeller writes it
]


@pytest.mark.parametrize(("label", "name"), GFD_LABELS)
def test_product_labels_map_to_entries(label: str, name: str) -> None:
    gpu = lookup(label)
    assert gpu is not None and gpu.name == name


def test_unknown_label_is_none() -> None:
    assert lookup("NVIDIA-GeForce-RTX-4090") is None


def test_every_entry_has_figures_and_marketing_name_in_its_name() -> None:
    for gpu in CATALOG:
        assert gpu.family in gpu.name
        assert gpu.memory_gib > 0 and gpu.memory_bandwidth_gbs > 0
        assert gpu.hourly_usd > 0 and 0 < gpu.gemm_efficiency < 1
        assert gpu.fp32_tflops is not None and gpu.fp16_tflops is not None


@pytest.mark.parametrize(
    ("pattern", "selected"),
    [
        ("H100", {"H100-SXM-80GB", "H100-PCIe-80GB", "H100-NVL-94GB"}),
        ("H100-SXM", {"H100-SXM-80GB"}),
        ("A100-80GB", {"A100-SXM-80GB", "A100-PCIe-80GB"}),
        ("NVIDIA-A100-SXM4-40GB", {"A100-SXM-40GB"}),
        ("t4", {"T4"}),
        ("L4", {"L4"}),
        ("V100", {"V100-SXM2-16GB", "V100-SXM2-32GB"}),
    ],
)
def test_gpu_types_patterns(pattern: str, selected: set[str]) -> None:
    assert {gpu.name for gpu in CATALOG if matches(pattern, gpu)} == selected


def test_precision_support() -> None:
    assert by_name("V100-SXM2-16GB").peak_tflops("bf16") is None
    assert by_name("H100-SXM-80GB").peak_tflops("bf16") == 989.0


@pytest.mark.parametrize(
    ("name", "resource"),
    [
        ("MI300X", AMD_GPU),
        ("H100-SXM-80GB", NVIDIA_GPU),
        ("T4", NVIDIA_GPU),
        ("my-own", NVIDIA_GPU),
    ],
)
def test_pods_request_the_vendor_resource_of_their_type(name: str, resource: str) -> None:
    """A type the catalog does not know was declared by a node's figures: NVIDIA only."""
    assert resource_of(name) == resource
