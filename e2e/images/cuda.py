"""Does the worker Dockerfile's GPU torch resolve, for the CUDA version the README names?

``python -m e2e.images.cuda`` (``make torch-cuda-check``): pip's own resolver in a dry run
(``pip install --dry-run --report``) for the worker image's platform (x86-64 glibc 2.36, CPython
3.11, wheels only) against the package index pip is configured with, constrained by
constraints.txt, as worker_image/Dockerfile installs torch with its default TORCH_INDEX. It
passes when torch resolves at its pinned version together with the CUDA runtime wheel of
CUDA_VERSION. Nothing is installed or downloaded beyond the index's metadata.

Why: no GPU is needed to break the GPU image. A new torch pin whose CUDA build is not on the
index, or one that moved to another CUDA major, resolves to something else or to nothing;
this says so in seconds, not on a user's GPU node.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .build import REPO

CUDA_VERSION = "13.2"
"""The CUDA runtime the default worker image's torch uses; the README's install section names it
(tests/unit/test_images_cuda.py keeps the two alike)."""
GLIBC_MINOR = 36
"""Both bases are Debian 12 (glibc 2.36): wheels for any manylinux up to 2.36 install there."""
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(GLIBC_MINOR, 4, -1)] + [
    f"manylinux{legacy}_x86_64" for legacy in ("2014", "2010", "1")
]
"""pip takes --platform literally (no older manylinux implied), so each is named."""
PYTHON_VERSION = "3.11"
CUDA_RUNTIME = "nvidia-cuda-runtime"


def dry_run_argv(report: Path, *, python: str = sys.executable) -> list[str]:
    return [
        python, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
        "--report", str(report), "--only-binary=:all:", *(f"--platform={p}" for p in PLATFORMS),
        "--python-version", PYTHON_VERSION, "--implementation", "cp",
        "-c", str(REPO / "constraints.txt"), "torch",
    ]  # fmt: skip


def resolved(report: dict[str, Any]) -> dict[str, str]:
    """Normalized name -> version of what a pip installation report would install."""
    return {
        str(item["metadata"]["name"]).lower().replace("_", "-"): str(item["metadata"]["version"])
        for item in report.get("install", [])
    }


def problems(versions: dict[str, str], *, torch: str, cuda: str) -> list[str]:
    """Why the resolution is not torch `torch` on CUDA `cuda` (empty: it is)."""
    found = []
    if versions.get("torch", "").split("+")[0] != torch:
        found.append(f"torch resolved to {versions.get('torch', 'nothing')}, pinned {torch}")
    runtime = versions.get(CUDA_RUNTIME)
    if runtime is None:
        found.append(f"no {CUDA_RUNTIME} wheel: this torch is not a CUDA build")
    elif ".".join(runtime.split(".")[:2]) != cuda:
        found.append(f"{CUDA_RUNTIME} {runtime} is CUDA {runtime.rsplit('.', 1)[0]}, not {cuda}")
    return found


def pinned_torch() -> str:
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.startswith("torch=="):
            return line.split("==", 1)[1].strip()
    raise SystemExit("cuda-check: error: constraints.txt pins no torch")


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        run = subprocess.run(dry_run_argv(report), capture_output=True, text=True, check=False)
        if run.returncode != 0:
            print(f"cuda-check: FAILED pip's resolver: {run.stderr.strip()}", file=sys.stderr)
            return 1
        versions = resolved(json.loads(report.read_text()))
    torch = pinned_torch()
    found = problems(versions, torch=torch, cuda=CUDA_VERSION)
    for line in found:
        print(f"cuda-check: FAILED {line}", file=sys.stderr)
    if not found:
        print(
            f"cuda-check: OK torch {versions['torch']} with {CUDA_RUNTIME} "
            f"{versions[CUDA_RUNTIME]} (CUDA {CUDA_VERSION}) for x86-64 glibc 2.{GLIBC_MINOR}, "
            f"CPython {PYTHON_VERSION}; {len(versions)} wheels"
        )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
