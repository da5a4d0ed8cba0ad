"""The device a trainer computes on, and the check that a pod given GPUs trains on them.

A pod that asked for GPUs and cannot use them must stop, not train on the CPU: an 8-GPU pod
whose image holds CPU torch, or whose node does not show the driver to the container, would
otherwise train with gloo at a fraction of the speed, and nothing would say so. When the
assignment gives the pod GPUs (``gpus``, from ``worker.gpus``), ``require_gpus`` tells the
causes apart, one line each, which the trainer exits with (permanent code, termination
message: the job's condition carries it):

- CPU torch in the image (``torch.version.cuda`` and ``torch.version.hip`` are None);
- the driver not visible: torch is built for CUDA (or ROCm) but ``torch.cuda.is_available()``
  is False, with no GPU device file in the container (``/dev/nvidia<N>``, AMD's ``/dev/kfd``:
  the device plugin or the runtime did not give it) or with devices but no usable driver (too
  old for this CUDA, libraries not mounted);
- fewer devices than the pod asked for (``CUDA_VISIBLE_DEVICES`` named in the line).

The one place a trainer's device is chosen: the Session (and through it the reference
trainer) calls ``trainer_device``; torchrun mode runs ``require_gpus`` before the script.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch

DEVICE_ENV = "ELASTRA_DEVICE"
"""``cpu``: train on the CPU whatever the pod has (an explicit choice; no check)."""
DEVICE_NODES = ("/dev/nvidia[0-9]*", "/dev/kfd")
"""The GPU device files a container sees when it was given GPUs (NVIDIA's, AMD's)."""


class GpuCheckError(RuntimeError):
    """The pod was given GPUs it cannot use: permanent, the message is the one-line reason."""


@dataclass(frozen=True)
class CudaFacts:
    """What this process's torch and container show of CUDA."""

    torch_version: str
    gpu_build: str | None
    """What torch is built for: ``"CUDA 13.2"``, ``"ROCm 6.4"``; None for CPU torch."""
    available: bool
    device_count: int
    device_nodes: int
    """GPU device files (``DEVICE_NODES``) in the container."""
    visible_devices: str | None
    """``$CUDA_VISIBLE_DEVICES``, when set."""


def cuda_facts(environ: Mapping[str, str] = os.environ) -> CudaFacts:
    """Ask torch and the container (the one place that does)."""
    available = torch.cuda.is_available()
    cuda, hip = torch.version.cuda, getattr(torch.version, "hip", None)
    return CudaFacts(
        torch_version=str(torch.__version__),
        gpu_build=f"CUDA {cuda}" if cuda else f"ROCm {hip}" if hip else None,
        available=available,
        device_count=torch.cuda.device_count() if available else 0,
        device_nodes=sum(len(glob.glob(pattern)) for pattern in DEVICE_NODES),
        visible_devices=environ.get("CUDA_VISIBLE_DEVICES"),
    )


def gpu_problem(gpus: int, facts: CudaFacts) -> str | None:
    """Why a pod given ``gpus`` GPUs cannot train on them, in one line; None when it can."""
    if gpus <= 0:
        return None
    asked = f"worker.gpus is {gpus}"
    if facts.gpu_build is None:
        return (
            f"{asked} but the image's torch {facts.torch_version} is a CPU build "
            "(torch.version.cuda is None): build the worker image with CUDA (or ROCm) torch"
        )
    built = f"torch {facts.torch_version} is built for {facts.gpu_build}"
    if not facts.available and facts.device_nodes == 0:
        return (
            f"{asked} but no GPU driver is visible in the container (no /dev/nvidia* or "
            f"/dev/kfd device; {built}): the node's GPU device plugin or container runtime "
            "did not give the pod its GPUs"
        )
    if not facts.available:
        return (
            f"{asked} but CUDA is not available with {facts.device_nodes} GPU device file(s) "
            f"visible ({built}): the node's driver is older than this build, or its libraries "
            "are not mounted into the container"
        )
    if facts.device_count < gpus:
        shown = (
            "" if facts.visible_devices is None
            else f" (CUDA_VISIBLE_DEVICES={facts.visible_devices})"
        )  # fmt: skip
        return f"{asked} but torch sees only {facts.device_count} CUDA device(s){shown}"
    return None


def require_gpus(gpus: int, environ: Mapping[str, str] = os.environ) -> None:
    """Raise ``GpuCheckError`` (the one-line reason) unless ``gpus`` GPUs are usable here."""
    problem = gpu_problem(gpus, cuda_facts(environ))
    if problem is not None:
        raise GpuCheckError(problem)


def trainer_device(
    gpus: int, local_rank: int, *, environ: Mapping[str, str] = os.environ
) -> torch.device:
    """The device of the pod's ``local_rank``-th trainer; ``GpuCheckError`` if it must stop.

    A pod given GPUs trains on ``cuda:<local_rank>`` or not at all; a pod without (or an
    assignment from before the field) uses CUDA when there is one. ``ELASTRA_DEVICE=cpu``
    is the explicit way to train on the CPU anyway.
    """
    if environ.get(DEVICE_ENV) == "cpu":
        return torch.device("cpu")
    if gpus > 0:
        require_gpus(gpus, environ)
        return torch.device("cuda", local_rank)
    return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
