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
from torch.distributed.pipelining.stage import _PipelineStageBase

from .api import Session, StepBatch
from .assignment import StageLayers, split_layers
from .errors import PermanentError
from .parallel.blocks import find_blocks
from .parallel.fsdp import apply_fsdp
from .parallel.pipeline import make_pipeline_stages, make_schedule, stage_ids
from .parallel.recompute import apply_recompute, apply_recompute_or_full
from .parallel.split import example_inputs, split_points, trace_stages

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
    loss_fn: LossFn
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
                micro.backward(self.loss_fn(model(tokens), targets))

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
    model = ParallelModel(session, recipe.loss_fn, parts)
    if plan.pp > 1:
        group = session.mesh.sub("pp").get_group()
        pipeline_stages = make_pipeline_stages(
            parts, held, plan.pp, plan.virtual_stages, session.device, group
        )
        _attach_pipeline(model, held, list(pipeline_stages), len(stages))
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


def prepare_parallel(
    session: Session,
    model: nn.Module,
    *,
    loss_fn: LossFn,
    example: torch.Tensor | tuple[Any, ...],
    split: Sequence[str] | None = None,
    blocks: str | None = None,
    parallelize: Callable[[nn.Module, DeviceMesh], None] | None = None,
) -> ParallelModel:
    """Your whole model under any plan of the session, pipeline plans included.

    Without a pipeline this is ``session.prepare(model, blocks=..., parallelize=...)``. With
    ``pp`` > 1 the model is cut into stages at module paths (``parallel.split``: the paths in
    ``split``, else the blocks divided by the plan), this rank keeps its stages, each gets the
    plan's recomputation and sharding, and a ``torch.distributed.pipelining`` schedule runs
    them. ``example`` is the model's input for one micro-batch (``plan.micro_batch_size``
    rows), used to trace it; ``loss_fn(output, targets)`` is the mean loss of a micro-batch,
    where ``output`` is what the model returns (on the last stage of a pipeline: its tensors,
    one tensor when it returns one, e.g. a Hugging Face model's logits). With a pipeline the
    model and ``example`` may be on the CPU: the stages this rank holds move to the session's
    device. ``example`` and ``split`` matter to pipeline plans only, so that one script takes
    every plan the job may get. Collective.
    """
    plan = session.plan
    if plan.pp == 1:
        parts = [session.prepare(model, blocks=blocks, parallelize=parallelize)]
        return ParallelModel(session, loss_fn, parts)
    if plan.tp > 1:
        raise PermanentError(
            f"plan {plan.label}: a model cut by module path takes pipeline or tensor "
            "parallelism, not both; build its stages with a ModelRecipe for both"
        )
    inputs = example_inputs(example)
    rows = inputs[0].shape[0] if inputs and isinstance(inputs[0], torch.Tensor) else None
    if rows != plan.micro_batch_size:
        raise PermanentError(
            f"example: expected the inputs of one micro-batch ({plan.micro_batch_size} rows "
            f"first), got {rows}"
        )
    found = find_blocks(model, blocks)
    stages = plan.pp * plan.virtual_stages
    points = split_points(found, stages, plan_stages=plan.stages, split=split)
    held = stage_ids(session.coord.pp_stage, plan.pp, plan.virtual_stages)
    cut = trace_stages(model, inputs, points)
    parts = [cut.modules[index].to(session.device) for index in held]
    for part in parts:
        apply_recompute_or_full(part, plan.recompute, blocks=found.path)
        if plan.sharding != "none":
            apply_fsdp(part, session.mesh.sub("dp"), plan.sharding,
                       precision=session.precision, blocks=found.path)  # fmt: skip
    session.adopt(parts)
    parallel = ParallelModel(session, loss_fn, parts)
    group = session.mesh.sub("pp").get_group()
    _attach_pipeline(parallel, held, [cut.stage(i, session.device, group) for i in held], stages)
    return parallel


def _attach_pipeline(
    model: ParallelModel,
    held: list[int],
    pipeline_stages: list[_PipelineStageBase],
    num_stages: int,
) -> None:
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
        return session.scale_loss(model.loss_fn(output, target) * weight)

    n_microbatches = share // plan.micro_batch_size
    model.schedule = make_schedule(plan.schedule, pipeline_stages, n_microbatches, weighted)
    model.first_stage = 0 in held
    model.last_stage = num_stages - 1 in held
