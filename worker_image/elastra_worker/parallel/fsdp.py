"""Sharded data parallelism with FSDP2 (``fully_shard``): ZeRO-2-like or ZeRO-3.

Each block is its own FSDP unit (one all-gather per block, overlapped with the previous
block's compute), and the module itself is the root unit for the embedding, final norm and
head. ``optimizer`` keeps the gathered parameters from forward to backward (no second
all-gather; gradients and optimizer state are still sharded), ``full`` frees them after
forward (ZeRO-3: least memory, one more all-gather per block in backward).

``precision`` sets FSDP2's ``MixedPrecisionPolicy`` (``elastra_worker.precision``): at bf16 or
fp16 the units gather their parameters in that dtype and reduce gradients in fp32, while the
sharded parameters the optimizer steps stay fp32.
"""

from __future__ import annotations

import logging

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

from elastra_worker.assignment import SHARDINGS, Precision, Sharding
from elastra_worker.parallel.blocks import find_blocks
from elastra_worker.precision import fsdp_policy

log = logging.getLogger(__name__)


def apply_fsdp(
    model: nn.Module,
    dp_mesh: DeviceMesh,
    sharding: Sharding,
    *,
    precision: Precision = "fp32",
    blocks: str | None = None,
) -> None:
    """Shard ``model`` (whole model or one pipeline stage) over the 1-D ``dp_mesh``, in place.

    Call after tensor parallelism (then ``dp_mesh`` is the data-parallel sub-mesh of the 2-D
    mesh) and after ``apply_recompute``. The blocks are found by ``find_blocks`` (the
    ``layers`` ModuleDict of the reference model, a known path such as Hugging Face Llama's
    ``model.layers``, or the path ``blocks`` names). With "none" the caller does its own data
    parallelism.
    """
    if sharding not in SHARDINGS:
        raise ValueError(f"sharding: expected one of {', '.join(SHARDINGS)}, got {sharding!r}")
    if sharding == "none":
        return
    reshard = sharding == "full"
    policy = fsdp_policy(precision)
    found = find_blocks(model, blocks)
    log.debug("sharding %d blocks at %s (%s)", len(found.named), found.path, found.found_by)
    for block in found.modules():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=policy)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=policy)
