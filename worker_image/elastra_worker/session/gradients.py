"""The step's gradients: loss weights, the reductions the session does itself, clipping.

DDP and FSDP average gradients over their replicas; a bare module (bitwise, or tensor
parallel without sharding) gets its gradient summed here. So each micro-batch's loss is
weighted by its share of the global batch, times the replica count an averaging wrapper divides
by: uneven shares (heterogeneous GPUs) give the gradient of one big batch. In ``bitwise`` mode
each logical share's gradient is kept apart (``ShareChain``) and the shares are summed in share
order by a chain through the ranks, the same float computation at every world size.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from .model import ModelParts, averaging_wrapper, is_fsdp
from .world import World


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds (a DTensor's local shard)."""
    return t.to_local() if isinstance(t, DTensor) else t


def loss_weight(world: World, part: nn.Module | None, samples: int) -> float:
    """The factor for a loss that is the mean over ``samples`` sequences of the step: the
    share of the global batch, times the replicas an averaging wrapper divides by."""
    weight = samples / world.assignment.global_batch_size
    if part is not None and is_fsdp(part):
        weight *= world.plan.dp
    elif isinstance(part, DistributedDataParallel):
        weight *= world.world_size
    return weight


class ShareChain:
    """Bitwise: each logical share's gradient (and loss) set aside, summed in share order."""

    def __init__(self, world: World, parts: ModelParts) -> None:
        self._world = world
        self._parts = parts
        self._shares: list[torch.Tensor] = []

    def begin_step(self) -> None:
        self._shares = []

    def keep(self, loss: torch.Tensor, samples: int) -> None:
        """Set this share's gradient and weighted loss aside; clear the gradients."""
        g = self._world.assignment.global_batch_size
        params = self._parts.params()
        flat = torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
            + [loss.detach().reshape(1).to(params[0].dtype) * (samples / g)]
        )
        self._shares.append(flat)
        for p in params:
            p.grad = None

    def reduce(self) -> float:
        """Sum the shares in share order through the ranks (rank r adds its shares to the
        partial sum of ranks < r), set every gradient to the sum; return the step's loss."""
        rank, device = self._world.rank, self._world.device
        params = self._parts.params()
        size = sum(p.numel() for p in params) + 1
        acc: torch.Tensor | None = None
        if rank > 0:
            acc = torch.empty(size, dtype=params[0].dtype, device=device)
            dist.recv(acc, src=rank - 1)
        for flat in self._shares:
            acc = flat if acc is None else acc + flat
        if acc is None:
            raise RuntimeError("bitwise: rank 0 has no logical share (batchShares[0] is 0)")
        last = self._world.world_size - 1
        if rank < last:
            dist.send(acc, dst=rank + 1)
            acc = torch.empty(size, dtype=params[0].dtype, device=device)
        dist.broadcast(acc, src=last)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = acc[offset : offset + n].view_as(p).clone()
            offset += n
        return float(acc[-1].item())


def sum_over_replicas(world: World, parts: ModelParts) -> None:
    """A bare (or tensor-parallel) module: sum the weighted gradients over the replicas."""
    params = [p for p in parts.params() if p.grad is not None]
    for p in params:  # a replicated DTensor's gradient may come back partial: settle it
        grad = p.grad
        if isinstance(grad, DTensor) and isinstance(p, DTensor) and grad.placements != p.placements:
            p.grad = grad.redistribute(placements=p.placements)
    grads = [local(p.grad) for p in params if p.grad is not None]
    if not grads or world.plan.dp == 1:
        return
    group = world.mesh.dp_group
    for bucket in _buckets(grads):
        flat = torch.cat([g.reshape(-1) for g in bucket])
        dist.all_reduce(flat, group=group)
        offset = 0
        for g in bucket:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()


def reduce_gradients(world: World, parts: ModelParts, chain: ShareChain) -> float | None:
    """Finish the step's gradient; returns the loss when the reduction already knows it."""
    if world.consistency == "bitwise":
        return chain.reduce()
    part = parts.first
    if part is not None and not averaging_wrapper(part):
        sum_over_replicas(world, parts)
    return None


def clip_grad_norm(
    world: World, params: list[nn.Parameter], max_norm: float, norm_type: float
) -> float:
    """Clip to a total norm of ``max_norm`` over the whole model (``Session.clip_grad_norm``)."""
    grads = [p.grad for p in params if p.grad is not None]
    total = _grad_norm(grads, norm_type)
    if world.plan.pp > 1:
        inf = math.isinf(norm_type)
        t = torch.tensor([total if inf else total**norm_type], device=world.device)
        op = dist.ReduceOp.MAX if inf else dist.ReduceOp.SUM
        dist.all_reduce(t, op=op, group=world.mesh.sub("pp").get_group())
        total = float(t.item()) if inf else float(t.item()) ** (1.0 / norm_type)
    coef = max_norm / (total + 1e-6)
    if coef < 1.0:
        for g in grads:
            g.mul_(coef)
    return total


def _buckets(tensors: list[torch.Tensor], limit: int = 25_000_000) -> Iterator[list[torch.Tensor]]:
    """Group gradients of one dtype and device into all-reduce buckets of about ``limit`` items."""
    bucket: list[torch.Tensor] = []
    size = 0
    for t in tensors:
        if bucket and (size + t.numel() > limit or t.dtype != bucket[0].dtype):
            yield bucket
            bucket, size = [], 0
        bucket.append(t)
        size += t.numel()
    if bucket:
        yield bucket


def _grad_norm(grads: list[torch.Tensor], norm_type: float) -> float:
    """The norm of this rank's gradients; DTensor gradients count over their whole mesh.

    ``get_total_norm`` takes a list of DTensors that share a mesh and placements, so the
    gradients are grouped that way and the groups' norms combined here.
    """
    groups: dict[Any, list[torch.Tensor]] = {}
    for g in grads:
        key = (id(g.device_mesh), g.placements) if isinstance(g, DTensor) else None
        groups.setdefault(key, []).append(g)
    norms: list[float] = []
    for group in groups.values():
        n = torch.nn.utils.get_total_norm(group, norm_type)
        norms.append(float(n.full_tensor() if isinstance(n, DTensor) else n))
    if not norms:
        return 0.0
    if math.isinf(norm_type):
        return max(norms)
    return float(sum(n**norm_type for n in norms) ** (1.0 / norm_type))
