"""A model built for the plan the operator placed: tensor, pipeline and sharded data parallel.

The worker executes every plan the planner can emit. This module composes PyTorch's own
building blocks in the order they must be applied to each stage module: tensor parallelism
(DTensor ``parallelize_module``) inside the pod, activation recomputation, FSDP2 over the
data-parallel replicas, and ``torch.distributed.pipelining`` across the stages, then runs one
global step of it inside a :class:`~elastra_worker.api.Session`.

What it needs to know about a model is a :class:`ModelRecipe`: how to build the module for a
range of layers, how to initialise it, how to apply tensor parallelism to it, and its loss. The
reference Llama-style model ships one (:func:`llama_recipe`); a user model plugs in the same way
(``docs/parallel-models.md``), in the style of PyTorch's own large-model trainers: a function
that parallelizes a module on a mesh, plus the pipeline split points (layer ranges).

Initial weights depend on the seed and each parameter's name only, so every plan starts from
the same model; checkpoints are keyed by parameter name, so every plan loads every other's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from .api import Session, StepBatch
from .assignment import StageLayers, split_layers
from .parallel.fsdp import apply_fsdp
from .parallel.pipeline import make_pipeline_stages, make_schedule, stage_ids
from .parallel.recompute import apply_recompute

Batch = tuple[torch.Tensor, torch.Tensor]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class ModelRecipe:
    """How to build, split and parallelize one model (the hook for your own models).

    ``build(layer_ids, first, last)`` returns the module holding those layers (with the
    embedding when ``first``, the head when ``last``) whose parameter names are those of the
    whole model; its blocks are in a ``layers`` ModuleDict so recomputation and FSDP can wrap
    them one by one. ``tensor_parallel(module, tp_mesh)`` shards it in place.
    """

    layers: int
    build: Callable[[Sequence[int], bool, bool], nn.Module]
    init_weights: Callable[[nn.Module, int], None]
    tensor_parallel: Callable[[nn.Module, DeviceMesh], None]
    loss_fn: LossFn
    check_plan: Callable[[int, int, int], None] = field(default=lambda tp, pp, vpp: None)
    """Raise ``ValueError`` naming the problem when (tp, pp, vpp) cannot split this model."""


def llama_recipe(cfg: Any) -> ModelRecipe:
    """The reference decoder-only transformer built from the job's ``spec.model``."""
    from .models.llama import (  # noqa: PLC0415 - the recipe is the one place that names it
        Transformer,
        init_weights,
        loss_fn,
        validate_plan,
    )
    from .parallel.tensor import apply_tensor_parallel  # noqa: PLC0415

    def build(layer_ids: Sequence[int], first: bool, last: bool) -> nn.Module:
        return Transformer(cfg, layer_ids=layer_ids, first=first, last=last)

    def check(tp: int, pp: int, vpp: int) -> None:
        validate_plan(cfg, tp, pp, vpp)

    return ModelRecipe(
        layers=cfg.layers,
        build=build,
        init_weights=init_weights,
        tensor_parallel=apply_tensor_parallel,  # type: ignore[arg-type]
        loss_fn=loss_fn,
        check_plan=check,
    )


@dataclass
class ParallelModel:
    """This rank's stage modules (one unless interleaved) and, with a pipeline, its schedule."""

    session: Session
    recipe: ModelRecipe
    parts: list[nn.Module]
    schedule: Any = None
    first_stage: bool = True
    last_stage: bool = True

    def train_step(self, batch: StepBatch, data: Callable[[Sequence[int]], Batch]) -> None:
        """Forward and backward of this replica's share of ``batch`` (gradients weighted)."""
        if self.schedule is None:
            self._micro_steps(batch, data)
        else:
            self._pipeline_step(batch, data)

    def _micro_steps(self, batch: StepBatch, data: Callable[[Sequence[int]], Batch]) -> None:
        model = self.parts[0]
        for micro in batch:
            tokens, targets = data(micro.samples)
            with micro.sync(model):  # the job's precision (autocast) for forward and loss
                micro.backward(self.recipe.loss_fn(model(tokens), targets))

    def _pipeline_step(self, batch: StepBatch, data: Callable[[Sequence[int]], Batch]) -> None:
        samples = [s for share in batch.shares for s in share.samples]
        tokens, targets = data(samples)
        losses: list[torch.Tensor] = []
        args = (tokens,) if self.first_stage else ()
        target = targets if self.last_stage else None
        with self.session.autocast():
            self.schedule.step(*args, target=target, losses=losses)
        mbs = self.session.plan.micro_batch_size
        scaler = self.session.grad_scaler
        scale = scaler.get_scale() if scaler is not None and scaler.is_enabled() else 1.0
        weight = self.session.loss_weight(mbs) * scale  # what the loss function multiplied in
        for loss in losses:
            self.session.add_loss(loss.detach() / weight, mbs)


def plan_stages(session: Session, recipe: ModelRecipe) -> tuple[StageLayers, ...]:
    """The plan's layer ranges, or the default split when the assignment gives none."""
    plan = session.plan
    recipe.check_plan(plan.tp, plan.pp, plan.virtual_stages)
    return plan.stages or split_layers(recipe.layers, plan.pp * plan.virtual_stages)


def build_parallel(session: Session, recipe: ModelRecipe) -> ParallelModel:
    """Build this rank's part of the model for the session's plan and register it.

    Collective (tensor parallel, FSDP and the pipeline create groups and exchange shapes).
    """
    plan = session.plan
    stages = plan_stages(session, recipe)
    held = stage_ids(session.coord.pp_stage, plan.pp, plan.virtual_stages) if plan.pp > 1 else [0]
    parts = [_stage_module(session, recipe, stages, index) for index in held]
    session.adopt(parts)
    model = ParallelModel(session, recipe, parts)
    if plan.pp > 1:
        _attach_pipeline(model, held, len(stages))
    return model


def _stage_module(
    session: Session, recipe: ModelRecipe, stages: Sequence[StageLayers], index: int
) -> nn.Module:
    """One stage's module: built whole, initialised, then sharded (TP, recompute, FSDP)."""
    plan, stage = session.plan, stages[index]
    first, last = index == 0, index == len(stages) - 1
    module = recipe.build(range(stage.start, stage.stop), first, last)
    recipe.init_weights(module, session.seed)
    module.to(session.device)
    if plan.tp > 1:
        recipe.tensor_parallel(module, session.mesh.sub("tp"))
    apply_recompute(module, plan.recompute)
    if plan.sharding != "none":
        apply_fsdp(module, session.mesh.sub("dp"), plan.sharding, precision=session.precision)
    return module


def _attach_pipeline(model: ParallelModel, held: list[int], num_stages: int) -> None:
    session, plan = model.session, model.session.plan
    share = plan.batch_shares[session.dp_rank]
    if share % plan.micro_batch_size:
        raise ValueError(
            f"plan {plan.label}: data-parallel replica {session.dp_rank} has {share} sequences "
            f"per step, not a multiple of microBatchSize {plan.micro_batch_size}: pipeline "
            "micro-batches must all have one shape"
        )
    weight = session.loss_weight(plan.micro_batch_size)

    def weighted(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # fp16: times the GradScaler's scale too; _pipeline_step divides both out again
        return session.scale_loss(model.recipe.loss_fn(output, target) * weight)

    group = session.mesh.sub("pp").get_group()
    stages = make_pipeline_stages(
        model.parts, held, plan.pp, plan.virtual_stages, session.device, group
    )
    model.schedule = make_schedule(plan.schedule, stages, share // plan.micro_batch_size, weighted)
    model.first_stage = 0 in held
    model.last_stage = num_stages - 1 in held
