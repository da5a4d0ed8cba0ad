"""Precision in the step: autocast for the forward, the loss scaler, the optimizer update.

The job's ``training.precision`` (``precision.py``): bf16 and fp16 run the forward under
autocast, parameters and optimizer state stay fp32. fp16 needs a ``torch.amp.GradScaler``: the
script's registered one, else the session's own (checkpointed under ``state.SCALER_NAME``). The
loss is scaled for backward, gradients are unscaled before the ``before_update`` hook, and the
update goes through ``scaler.step`` and ``scaler.update``. Only the scaler's public API is used
(``is_enabled``, ``scale``, ``unscale_``, ``step``, ``update``), so any GradScaler works, FSDP's
``ShardedGradScaler`` included.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
import torch.distributed as dist

from ..mesh import needs_mesh
from ..precision import autocast, grad_scaler
from .gradients import local
from .world import World


class LossScaling:
    """The job's precision for forward and loss, and the GradScaler the update goes through."""

    def __init__(self, world: World) -> None:
        self._world = world
        self.scaler: torch.amp.GradScaler | None = None
        """The loss scaler in use: the registered one, or an fp16 job's own."""
        self._scaled = False  # the step's backward went through the scaler

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """``torch.autocast`` to bf16 or fp16, nothing at fp32 (``Session.autocast``)."""
        return autocast(self._world.precision, self._world.device)

    def own_scaler(self) -> torch.amp.GradScaler | None:
        """fp16 without a registered GradScaler: make the session's own (returned, to be
        checkpointed as registered objects are); ``None`` when there is one or none is needed."""
        if self.scaler is not None:
            return None
        self.scaler = grad_scaler(self._world.precision, self._world.device)
        return self.scaler

    def begin_step(self) -> None:
        self._scaled = False

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` as backward must see it: times the scale (fp16), else as is."""
        scaler = self.scaler
        if scaler is None or not scaler.is_enabled():
            return loss
        self._scaled = True
        return scaler.scale(loss)

    def unscale(self, optimizers: list[torch.optim.Optimizer]) -> None:
        """Unscale every optimizer's gradients (after the world agreed on an overflow)."""
        scaler = self.scaler
        if scaler is None:
            return
        if scaler.is_enabled() and not self._scaled:
            raise RuntimeError(
                "the GradScaler scales the loss in micro.backward() (or "
                "session.scale_loss()); this step's backward did not go through it"
            )
        self._agree_found_inf(optimizers)
        for opt in optimizers:
            scaler.unscale_(opt)

    def step(self, optimizers: list[torch.optim.Optimizer]) -> None:
        """Step every optimizer (through the scaler, which skips a step with an inf or a nan),
        clear the gradients, update the scale."""
        scaler = self.scaler
        for opt in optimizers:
            if scaler is not None:
                scaler.step(opt)
            else:
                opt.step()
            opt.zero_grad(set_to_none=True)
        if scaler is not None:
            scaler.update()

    def _agree_found_inf(self, optimizers: list[torch.optim.Optimizer]) -> None:
        """Sharded, tensor or pipeline plans: skip the step everywhere if any shard overflowed.

        Each rank sees only its shards' gradients, so one rank may find an inf that another
        does not; without agreement some ranks would step and others skip, and their loss
        scales would part. So before ``unscale_`` looks, the world agrees (one all-reduce)
        whether any rank's gradients hold an inf or a nan, and if so every rank puts an inf
        into one gradient of each of its optimizers: each scaler then skips the step and backs
        off alike (the gradients are dropped with the skipped step).
        """
        scaler = self.scaler
        if scaler is None or not scaler.is_enabled() or not needs_mesh(self._world.plan):
            return
        per_opt = [
            [local(p.grad) for g in opt.param_groups for p in g["params"] if p.grad is not None]
            for opt in optimizers
        ]
        grads = [g for opt_grads in per_opt for g in opt_grads]
        peak = torch.nn.utils.get_total_norm(grads, math.inf) if grads else torch.zeros(())
        found = (~torch.isfinite(peak)).to(device=self._world.device, dtype=torch.float32)
        found = found.reshape(1)
        dist.all_reduce(found, op=dist.ReduceOp.MAX)
        if not bool(found.item()):
            return
        with torch.no_grad():
            for opt_grads in per_opt:
                filled = next((g for g in opt_grads if g.numel() > 0), None)
                if filled is not None:
                    filled.fill_(math.inf)
