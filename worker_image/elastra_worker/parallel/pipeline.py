"""Pipeline parallelism with ``torch.distributed.pipelining``: stages, modules and schedules.

A plan has ``pp * virtual_stages`` (virtual) stages; stage ``s`` runs on pipeline rank
``s % pp`` (the interleaved placement: with virtual stages a rank holds every pp-th chunk of
layers, which shortens the pipeline bubble by the number of chunks it holds). Each stage's
module is a ``Transformer`` built with only its layers, so parameter names match the whole
model's and DCP checkpoints reshard between any two splits.

Running one step (every rank of the pipeline group calls ``step`` together)::

    losses: list[torch.Tensor] = []
    args = (tokens,) if holds_first_stage else ()  # only stage 0 takes the batch's input
    target = targets if holds_last_stage else None  # only the last stage computes the loss
    schedule.step(*args, target=target, losses=losses)

``tokens``/``targets`` are the whole local batch (B, S); the schedule splits dim 0 into
``n_microbatches`` equal chunks. ``step`` returns the merged logits on the rank holding the
last stage (None elsewhere; ``return_outputs=False`` skips that (B, S, V) concatenation) and
appends ``loss_fn``'s value for each micro-batch (weight included) to ``losses`` there. The
schedule is built with ``scale_grads=False``: gradients are the plain sum over micro-batches
of the gradients of ``loss_fn``'s values, so the caller puts each micro-batch's weight into
``loss_fn`` (for equal micro-batches of a mean loss: divide by ``n_microbatches``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch.distributed import ProcessGroup
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)
from torch.distributed.pipelining.schedules import PipelineScheduleMulti, PipelineScheduleSingle
from torch.distributed.pipelining.stage import _PipelineStageBase

from elastra_worker.assignment import SCHEDULES, Schedule, StageLayers
from elastra_worker.models.llama import ModelConfig, Transformer

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def stage_ids(pp_rank: int, pp: int, virtual_stages: int) -> list[int]:
    """The (virtual) stage indices pipeline rank ``pp_rank`` holds, ascending: r, r+pp, ..."""
    if not 0 <= pp_rank < pp or virtual_stages < 1:
        raise ValueError(f"pipeline rank {pp_rank} of {pp} with {virtual_stages} virtual stages")
    return [pp_rank + v * pp for v in range(virtual_stages)]


def build_stage_modules(
    cfg: ModelConfig,
    stages: Sequence[StageLayers],
    stage_indices: Sequence[int],
    device: torch.device | str,
) -> list[Transformer]:
    """One ``Transformer`` per held stage, on ``device``, holding that stage's layer range.

    Parameters are uninitialised; call ``init_weights`` (or load a checkpoint) next.
    """
    modules = []
    for index in stage_indices:
        layers = stages[index]
        if layers.stage != index:
            raise ValueError(f"stages[{index}] describes stage {layers.stage}; expected in order")
        with torch.device(device):
            modules.append(
                Transformer(
                    cfg,
                    layer_ids=range(layers.start, layers.stop),
                    first=index == 0,
                    last=index == len(stages) - 1,
                )
            )
    return modules


def make_pipeline_stages(  # noqa: PLR0917 (the agreed positional interface)
    modules: Sequence[torch.nn.Module],
    stage_indices: Sequence[int],
    pp: int,
    virtual_stages: int,
    device: torch.device | str,
    group: ProcessGroup | None,
) -> list[PipelineStage]:
    """``PipelineStage`` objects over the pipeline process ``group`` (None: the default group).

    Shapes are inferred at the first step by running the first micro-batch through the
    stages, so the same code serves sequence-parallel (local) and whole activations.
    """
    if len(modules) != len(stage_indices):
        raise ValueError(f"{len(modules)} modules for {len(stage_indices)} stage indices")
    return [
        PipelineStage(module, index, pp * virtual_stages, torch.device(device), group=group)
        for module, index in zip(modules, stage_indices, strict=True)
    ]


def make_schedule(
    kind: Schedule,
    pipeline_stages: Sequence[_PipelineStageBase],
    n_microbatches: int,
    loss_fn: LossFn,
) -> PipelineScheduleSingle | PipelineScheduleMulti:
    """The torch schedule ``kind`` ("gpipe" | "1f1b" | "interleaved1f1b") without grad scaling.

    See the module docstring for how to call ``step`` and how to weight ``loss_fn``. torch's
    own limits (it raises ValueError): 1F1B needs ``n_microbatches >= pp``; interleaved 1F1B
    needs ``n_microbatches`` to be a multiple of ``max(1, n_microbatches // pp)`` (so a multiple
    of pp, or fewer than 2*pp); the batch's first dimension must split into equal micro-batches.
    """
    if kind not in SCHEDULES:
        raise ValueError(f"schedule: expected one of {', '.join(SCHEDULES)}, got {kind!r}")
    if kind == "interleaved1f1b":
        held: list[_PipelineStageBase] = list(pipeline_stages)
        return ScheduleInterleaved1F1B(held, n_microbatches, loss_fn=loss_fn, scale_grads=False)
    if len(pipeline_stages) != 1:
        raise ValueError(f"schedule {kind} runs one stage per rank, got {len(pipeline_stages)}")
    single = ScheduleGPipe if kind == "gpipe" else Schedule1F1B
    return single(pipeline_stages[0], n_microbatches, loss_fn=loss_fn, scale_grads=False)
