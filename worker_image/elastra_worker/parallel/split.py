"""Cut a user's whole model into pipeline stages at module paths, with PyTorch's own tracer.

The reference model is built stage by stage from layer ranges (``parallel.pipeline``); a
user's model is built whole, so it is cut instead. ``torch.distributed.pipelining.pipeline``
traces the model once (``torch.export``) with the inputs of one micro-batch and splits the
graph before each module path of ``split_spec``; each stage module keeps the whole model's
parameter names (``model.layers.3.mlp.up_proj.weight`` stays that in stage 1), so DCP
checkpoints load across any two plans, pipelined or not. The tracer is used rather than
copying the model and deleting the blocks a stage lacks (what PyTorch's large-model trainers do
for their own models): that copy needs a forward that skips missing parts, which a Hugging
Face or nanoGPT forward does not have, while the traced graph runs any exportable forward.

Where the stages split, in this order:

1. the module paths the user names (``split=["model.layers.2"]``: each begins a stage), which
   must be blocks of the container ``find_blocks`` returns;
2. else the blocks are divided by the plan's layer ranges (``stages`` in the assignment) when
   they cover exactly the blocks found, or evenly (``split_layers``), so stage ``s`` begins at
   the first block of its range.

Known limits, each a ``PermanentError`` with one line: a forward ``torch.export`` cannot
capture (Hugging Face models: set ``config.use_cache = False``, whose cache object is no
tensor); a parameter tied across two stages (GPT-2's embedding and head share one weight;
two stages would train two copies); a stage that takes a value from an earlier stage than the
one before it (PyTorch's stages cannot run the backward of such a skip connection yet; Hugging
Face Llama's rotary table makes one from its third stage on, so Llama takes two stages).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed import ProcessGroup
from torch.distributed.pipelining import Pipe, SplitPoint, pipeline
from torch.distributed.pipelining.stage import _PipelineStageBase

from elastra_worker.assignment import AssignmentError, StageLayers, split_layers
from elastra_worker.errors import PermanentError
from elastra_worker.parallel.blocks import Blocks


def split_points(
    blocks: Blocks,
    stages: int,
    *,
    plan_stages: Sequence[StageLayers] = (),
    split: Sequence[str] | None = None,
) -> list[str]:
    """The module paths where stages 1..``stages``-1 begin (module docstring for the order)."""
    names = [name for name, _ in blocks.named]
    if split is not None:
        return _checked_split(list(split), names, stages)
    ranges = list(plan_stages)
    if len(ranges) != stages or not ranges or ranges[-1].stop != len(names):
        try:
            ranges = list(split_layers(len(names), stages))
        except AssignmentError:
            raise PermanentError(
                f"pipeline: {stages} stages need at least {stages} blocks, found "
                f"{len(names)} at {blocks.path}"
            ) from None
    return [names[r.start] for r in ranges[1:]]


def _checked_split(split: list[str], names: list[str], stages: int) -> list[str]:
    if len(split) != stages - 1:
        raise PermanentError(
            f"pipeline: split={split} names {len(split)} split points; the plan has {stages} "
            f"stages, so name {stages - 1} (the first block of each stage after the first)"
        )
    order = {name: i for i, name in enumerate(names)}
    unknown = [path for path in split if path not in order]
    if unknown:
        raise PermanentError(
            f"pipeline: split point(s) {', '.join(unknown)} are not blocks of the model; "
            f"expected some of {names[0]} .. {names[-1]}"
        )
    indices = [order[path] for path in split]
    if indices[0] == 0 or indices != sorted(set(indices)):
        raise PermanentError(
            f"pipeline: split={split} must name distinct blocks in the model's order, after "
            f"its first block {names[0]}"
        )
    return split


@dataclass(frozen=True)
class Cut:
    """A model cut into stages: every stage's module, and the traced pipe that wires them
    (which stage sends which value to which: a later stage can take a value from any earlier
    one, as Llama's rotary table goes from the first stage to every other)."""

    modules: list[nn.Module]
    pipe: Pipe

    def stage(
        self, index: int, device: torch.device, group: ProcessGroup | None
    ) -> _PipelineStageBase:
        """The ``torch.distributed.pipelining`` stage of ``modules[index]`` as it is now (after
        recomputation and sharding were applied to it in place) on ``device``; torch moves
        the devices the trace burnt into the graph (``torch.arange(device=...)``) there too."""
        return self.pipe.build_stage(index, device, group)


def trace_stages(model: nn.Module, example: tuple[Any, ...], points: Sequence[str]) -> Cut:
    """``model`` cut before each of ``points``; ``example`` are the positional inputs of one
    micro-batch (their shapes are traced, so every micro-batch must have them)."""
    spec = {path: SplitPoint.BEGINNING for path in points}
    try:
        pipe = pipeline(model, mb_args=example, split_spec=spec)
    except Exception as err:  # any tracer failure is the model's layout
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise PermanentError(
            f"pipeline: torch.distributed.pipelining could not trace {type(model).__name__} "
            f"({first}); its forward must be capturable by torch.export (Hugging Face models: "
            "config.use_cache=False), or build the stages with a ModelRecipe"
        ) from None
    if pipe.num_stages != len(points) + 1:
        raise PermanentError(
            f"pipeline: cutting {type(model).__name__} at {', '.join(points)} gave "
            f"{pipe.num_stages} stages, not {len(points) + 1}"
        )
    modules = [pipe.get_stage_module(index) for index in range(pipe.num_stages)]
    _refuse_tied_across(model, modules)
    _refuse_skips(pipe, type(model).__name__)
    unsaved = {name for name, _ in model.named_buffers()} - set(model.state_dict())
    for module in modules:
        _keep_unsaved(module, unsaved)
    return Cut(modules, pipe)


def _refuse_skips(pipe: Pipe, kind: str) -> None:
    """Refuse a stage that takes a value from a stage other than the one before it.

    ``torch.distributed.pipelining`` runs such a forward but not its backward ("Backward of
    skip connections not supported yet", raised at the first step); Hugging Face Llama has
    one beyond two stages: its first stage computes the rotary table every later stage takes.
    """
    calls = [node for node in pipe.split_gm.graph.nodes if node.op == "call_module"]
    index = {node: i for i, node in enumerate(calls)}
    for stage, node in enumerate(calls):
        for arg in node.all_input_nodes:
            source = arg.args[0] if arg.op == "call_function" and arg.args else arg
            sent_by = index.get(source) if isinstance(source, torch.fx.Node) else None
            if sent_by is not None and sent_by != stage - 1:
                raise PermanentError(
                    f"pipeline: stage {stage} of {kind} takes a value from stage {sent_by} "
                    "(not the stage before it), which torch.distributed.pipelining cannot "
                    f"train through yet; plan at most {stage} stages (pp x virtualStages)"
                )


def _refuse_tied_across(model: nn.Module, stage_modules: Sequence[nn.Module]) -> None:
    """Refuse a parameter the model shares between modules that landed in different stages."""
    stage_of = {
        name: index
        for index, module in enumerate(stage_modules)
        for name, _ in module.named_parameters(remove_duplicate=False)
    }
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    for tied in (group for group in groups.values() if len(group) > 1):
        if len({stage_of.get(name) for name in tied} - {None}) > 1:
            raise PermanentError(
                f"pipeline: {' and '.join(tied)} are one tied parameter in different stages; "
                "untie them (Hugging Face: config.tie_word_embeddings=False) or train this "
                "model without pipeline stages"
            )


def example_inputs(example: torch.Tensor | tuple[Any, ...]) -> tuple[Any, ...]:
    """The tracer's positional inputs: one tensor becomes a 1-tuple."""
    return (example,) if isinstance(example, torch.Tensor) else tuple(example)


def _keep_unsaved(stage: nn.Module, unsaved: set[str]) -> None:
    """Keep the model's non-persistent buffers (a rotary table) out of the stage's state dict,
    as in the whole model's, so checkpoints hold the same keys under every plan."""
    for name, buffer in list(stage.named_buffers()):
        if name in unsaved:
            owner, _, leaf = name.rpartition(".")
            stage.get_submodule(owner).register_buffer(leaf, buffer, persistent=False)
