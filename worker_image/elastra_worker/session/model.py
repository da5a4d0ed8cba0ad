"""Model building for a plan: ``prepare`` and the model parts a session holds.

``prepare_model`` is the one place a module is made ready for this rank's plan: split for
tensor parallelism (the user's ``parallelize`` hook or the known block layout), then sharded
(FSDP2 over the data-parallel group), wrapped in DDP, or left bare (bitwise, or tensor parallel
without sharding, where the session sums gradients itself). A pipeline plan builds its stage
modules with ``parallel_model.build_parallel``, which hands them to ``ModelParts.adopt``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from ..errors import PermanentError
from .world import World

Optimizers = torch.optim.Optimizer | Sequence[torch.optim.Optimizer]
Models = nn.Module | Sequence[nn.Module]
Parallelize = Callable[[nn.Module, DeviceMesh], None]

log = logging.getLogger(__name__)


CPU_DDP_ENV = "ELASTRA_CPU_DDP"
"""``1``: wrap data-parallel modules in DDP on CPU too (gloo), as on GPUs: the GPU jobs' path,
where a CPU run would leave the module bare."""
REBINDABLE_ATTR = "_elastra_rebindable"
"""Marks a DDP ``prepare`` built, with its settings: the one ``rebind`` may rebuild."""


def is_fsdp(model: nn.Module) -> bool:
    return isinstance(model, FSDPModule | FullyShardedDataParallel)


def averaging_wrapper(model: nn.Module) -> bool:
    """DDP and FSDP average gradients over the world; a bare module needs an explicit sum."""
    return isinstance(model, DistributedDataParallel) or is_fsdp(model)


def as_list(obj: Any) -> list[Any]:
    return list(obj) if isinstance(obj, Sequence) else [obj]


class ModelParts:
    """The model parts this rank holds (one, or one per pipeline stage) and their optimizers."""

    def __init__(self) -> None:
        self.parts: list[nn.Module] = []
        self.optimizers: list[torch.optim.Optimizer] = []

    def adopt(self, parts: Sequence[nn.Module]) -> None:
        self.parts = list(parts)

    def bind(self, models: Models, optimizers: Optimizers) -> None:
        """Hold ``models`` with ``optimizers``, one optimizer per part."""
        parts, opts = as_list(models), as_list(optimizers)
        if len(parts) != len(opts):
            raise PermanentError(
                f"{len(parts)} model parts but {len(opts)} optimizers: one per part"
            )
        self.parts, self.optimizers = parts, opts

    @property
    def first(self) -> nn.Module | None:
        return self.parts[0] if self.parts else None

    def params(self) -> list[nn.Parameter]:
        """The trainable parameters of every part."""
        if not self.parts:
            raise RuntimeError("call session.prepare(model) or session.restore() first")
        return [p for part in self.parts for p in part.parameters() if p.requires_grad]

    def sharded(self) -> bool:
        """Whether some part's parameters are sharded (FSDP, DTensor)."""
        return any(
            is_fsdp(part) or any(isinstance(p, DTensor) for p in part.parameters())
            for part in self.parts
        )


def prepare_model(
    world: World,
    model: nn.Module,
    *,
    blocks: str | None = None,
    parallelize: Parallelize | None = None,
) -> nn.Module:
    """``model`` made ready for ``world``'s plan and consistency (see ``Session.prepare``)."""
    if blocks is not None:
        from ..parallel.blocks import find_blocks  # noqa: PLC0415 - as apply_fsdp below

        find_blocks(model, blocks)
    _check_preparable(world, model)
    if world.plan.tp > 1:
        _split_tensor_parallel(world, model, blocks=blocks, parallelize=parallelize)
    if world.plan.recompute != "none":
        from ..parallel.recompute import apply_recompute_or_full  # noqa: PLC0415 - as above

        apply_recompute_or_full(model, world.plan.recompute, blocks=blocks)
    if world.consistency != "bitwise":
        model = _data_parallel(world, model, blocks=blocks)
    return model


def _check_preparable(world: World, model: nn.Module) -> None:
    """Refuse a plan or module ``prepare`` cannot take, naming what would work."""
    plan = world.plan
    if plan.pp > 1:
        raise PermanentError(
            f"plan {plan.label}: prepare() returns one module, not pipeline stages; "
            "use elastra_worker.parallel_model.prepare_parallel(sess, model, ...) for "
            "pipeline parallel plans (docs/parallel-models.md)"
        )
    if world.consistency == "bitwise" and (averaging_wrapper(model) or plan.tp > 1):
        raise PermanentError(
            f"plan {plan.label}: consistency bitwise needs a bare module and a data "
            "parallel plan, not DDP/FSDP or tensor parallelism"
        )


def _split_tensor_parallel(
    world: World,
    model: nn.Module,
    *,
    blocks: str | None,
    parallelize: Parallelize | None,
) -> None:
    """Split ``model`` in place over the tensor-parallel group (see ``Session.prepare``)."""
    if averaging_wrapper(model):
        raise PermanentError(
            f"plan {world.plan.label} is tensor parallel: pass prepare() the bare module, "
            "not DDP/FSDP (tensor parallelism is applied before data parallelism)"
        )
    tp_mesh = world.mesh.sub("tp")
    if parallelize is not None:
        parallelize(model, tp_mesh)
        return
    from ..parallel.known_tp import apply_known_tensor_parallel  # noqa: PLC0415 - tp plans

    apply_known_tensor_parallel(model, tp_mesh, blocks=blocks)


def _data_parallel(world: World, model: nn.Module, *, blocks: str | None) -> nn.Module:
    """FSDP for a sharded plan, DDP for a data-parallel one on GPUs, the module itself when it
    is tensor parallel and unsharded or on CPU (the session sums its gradients over the
    replicas)."""
    plan = world.plan
    if plan.sharding != "none" and not is_fsdp(model):
        from ..parallel.fsdp import apply_fsdp  # noqa: PLC0415 - only sharded plans need it

        try:
            apply_fsdp(
                model, world.mesh.sub("dp"), plan.sharding,
                precision=world.precision, blocks=blocks,
            )  # fmt: skip
        except (TypeError, PermanentError) as err:  # not laid out as the sharding needs
            raise PermanentError(
                f"plan {plan.label} shards the model ({plan.sharding}), but prepare() cannot: {err}"
            ) from None
        return model
    if plan.tp > 1 or averaging_wrapper(model):
        return model
    if world.device.type != "cuda" and os.environ.get(CPU_DDP_ENV) != "1":
        # On CPU the module stays bare and the session sums its gradients over the replicas
        # after backward (``gradients.sum_over_replicas``), as for tensor parallelism. What
        # DDP adds, the all-reduce overlapped with backward, buys little where gloo's threads
        # compete with backward for the same cores.
        return model
    wrapped = DistributedDataParallel(model, device_ids=_device_ids(world))
    setattr(wrapped, REBINDABLE_ATTR, True)
    return wrapped


def _device_ids(world: World) -> list[int] | None:
    return [world.device.index] if world.device.type == "cuda" else None


def rebindable(model: nn.Module) -> bool:
    """A bare module, or a DDP ``prepare`` built: it outlives a world change in memory (DDP
    rebuilt over the new world by ``rebind``). A wrapper the script built (its own DDP
    settings, FSDP) is bound to the world it was built in."""
    if isinstance(model, DistributedDataParallel):
        return bool(getattr(model, REBINDABLE_ATTR, False))
    return not is_fsdp(model)


def rebind(world: World, parts: ModelParts) -> None:
    """After ``World.rejoin``: rebuild each DDP ``prepare`` built over the new world's group,
    in place, so the script's reference, the optimizer's parameters and the DDP methods it
    calls (``no_sync``, ``module``) stay what they were. DDP keeps its process group, its
    buckets and its autograd hooks from construction and offers no way to move them: running
    its constructor again on the same object replaces all three (the old reducer, dropped,
    removes its hooks). Collective, as a new DDP is: it broadcasts rank 0's parameters and
    buffers, which a joiner's ``prepare`` meets with its own; the state's sharing, after it,
    gives every member the newest step."""
    for part in parts.parts:
        if isinstance(part, DistributedDataParallel) and rebindable(part):
            DistributedDataParallel.__init__(part, part.module, device_ids=_device_ids(world))
            setattr(part, REBINDABLE_ATTR, True)
            log.info("rank %d rebuilt its DDP module over world v%d (world size %d)", world.rank,
                     world.assignment.world_version, world.world_size)  # fmt: skip
