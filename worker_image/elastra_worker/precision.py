"""What ``training.precision`` means to the trainer: autocast, FSDP's policy, the loss scaler, TF32.

The planner sizes memory and speed for the job's precision; this module makes the trainer
compute in it, with PyTorch's own mixed-precision tools:

- **bf16**: forward and backward under ``torch.autocast`` (matmuls in bf16, reductions and
  losses where autocast keeps them, in fp32); a sharded plan's FSDP2 units also gather their
  parameters in bf16 and reduce gradients in fp32 (``MixedPrecisionPolicy``). Parameters
  (the master weights), gradients as the optimizer sees them and optimizer state stay fp32.
- **fp16**: the same in fp16, plus a ``torch.amp.GradScaler`` that scales the loss, skips the
  steps whose gradients overflow and is checkpointed with the model (its ``state_dict``).
- **fp32**: no casting. ``ELASTRA_TF32=1`` lets matmuls and convolutions use TF32 on GPUs that
  have it (Ampere and later: 10 bits of mantissa instead of 23, several times the speed);
  ``ELASTRA_TF32=0`` forbids it; unset leaves PyTorch's defaults (matmuls in full fp32).

On the CPU, bf16 and fp16 autocast run as well (slower than fp32 on most CPUs: for tests).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

from .assignment import PRECISIONS, Precision

TF32_ENV = "ELASTRA_TF32"
"""``1``: fp32 matmuls and convolutions may use TF32; ``0``: never; unset: torch's default."""

_DTYPES: dict[Precision, torch.dtype] = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
}


def compute_dtype(precision: Precision) -> torch.dtype:
    """The dtype matmuls run in at ``precision``."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision: expected one of {', '.join(PRECISIONS)}, got {precision!r}")
    return _DTYPES[precision]


def autocast(precision: Precision, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The context forward (and the loss) run in: autocast to bf16/fp16, nothing for fp32."""
    if compute_dtype(precision) == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=compute_dtype(precision))


def fsdp_policy(precision: Precision) -> MixedPrecisionPolicy:
    """FSDP2's policy: gather parameters in the compute dtype, reduce gradients in fp32.

    The sharded parameters the optimizer steps stay fp32; fp32 is FSDP's default (no casts).
    """
    dtype = compute_dtype(precision)
    if dtype == torch.float32:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def grad_scaler(precision: Precision, device: torch.device) -> torch.amp.GradScaler | None:
    """A loss scaler for fp16 (its range is too narrow for small gradients); None otherwise."""
    if compute_dtype(precision) != torch.float16:
        return None
    return torch.amp.GradScaler(device.type)


def apply_tf32(environ: Mapping[str, str] = os.environ) -> bool | None:
    """Set TF32 for fp32 matmuls and convolutions from ``$ELASTRA_TF32``; returns the choice.

    None (unset) leaves PyTorch's defaults alone. Anything but ``0``/``1`` is a ValueError.
    """
    raw = environ.get(TF32_ENV, "")
    if raw == "":
        return None
    if raw not in {"0", "1"}:
        raise ValueError(f"${TF32_ENV}: expected 0 or 1, got {raw!r}")
    mode = "tf32" if raw == "1" else "ieee"
    torch.backends.cuda.matmul.fp32_precision = mode
    torch.backends.cudnn.conv.fp32_precision = mode  # type: ignore[attr-defined]
    return raw == "1"
