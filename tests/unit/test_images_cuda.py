"""e2e/images/cuda.py: what makes a pip resolution of torch the CUDA build the README names."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e.images.cuda import CUDA_RUNTIME, CUDA_VERSION, main, problems, resolved

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "versions, found",
    [
        ({"torch": "2.15.0", CUDA_RUNTIME: "13.2.86"}, []),
        ({"torch": "2.15.0+cu132", CUDA_RUNTIME: "13.2.86"}, []),
        ({"torch": "2.15.0+cpu"}, [f"no {CUDA_RUNTIME} wheel: this torch is not a CUDA build"]),
        ({"torch": "2.14.1", CUDA_RUNTIME: "13.2.86"}, ["torch resolved to 2.14.1, pinned 2.15.0"]),
        ({"torch": "2.15.0", CUDA_RUNTIME: "12.8.90"},
         [f"{CUDA_RUNTIME} 12.8.90 is CUDA 12.8, not 13.2"]),
        ({}, ["torch resolved to nothing, pinned 2.15.0",
              f"no {CUDA_RUNTIME} wheel: this torch is not a CUDA build"]),
    ],
    ids=["cuda", "local-label", "cpu", "other-torch", "other-cuda", "nothing"],
)  # fmt: skip
def test_problems_of_a_resolution(versions: dict[str, str], found: list[str]) -> None:
    assert problems(versions, torch="2.15.0", cuda="13.2") == found


def test_resolved_reads_pips_installation_report() -> None:
    report = {
        "version": "1",
        "install": [
            {"metadata": {"name": "torch", "version": "2.15.0"}},
            {"metadata": {"name": "nvidia_cuda_runtime", "version": "13.2.86"}},
        ],
    }
    assert resolved(report) == {"torch": "2.15.0", CUDA_RUNTIME: "13.2.86"}


def test_the_readme_names_the_cuda_version_the_check_resolves() -> None:
    assert f"CUDA {CUDA_VERSION}" in (REPO / "README.md").read_text()


def test_the_worker_images_cuda_torch_resolves_on_the_package_index(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``make torch-cuda-check`` itself: pip's resolver, dry run, against the index pip is set
    up with (the one the project's own scripts install from; about 20 s, metadata only)."""
    assert main() == 0, capsys.readouterr().err
    assert f"(CUDA {CUDA_VERSION})" in capsys.readouterr().out
