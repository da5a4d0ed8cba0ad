"""Tensor (and sequence) parallelism for the reference Transformer, with DTensor.

Megatron's layout: in each block wq/wk/wv and w1/w3 are split by output features (each rank
holds whole heads and a slice of the FFN), wo and w2 by input features, so a block needs one
reduction after attention and one after the feed-forward. With sequence parallelism the
residual stream between those reductions is split along the sequence (the reduction becomes
a reduce-scatter and the next input an all-gather) and the norms run on the local slice: the
same communication volume, 1/tp of the activation memory outside the matmuls.

The residual stream stays a plain (local) tensor between blocks, sharded on the sequence with
sequence parallelism and whole otherwise; so pipeline stages pass local tensors too, and each
tensor-parallel rank of one stage talks to the same tensor-parallel rank of the next.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from elastra_worker.models.llama import Transformer


def _block_plan(sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """The styles of one block; the attention and FFN inputs are gathered with SP."""
    stream = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, ParallelStyle] = {
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=stream),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=stream),
    }
    if sequence_parallel:
        plan.update(
            {
                "attention_norm": SequenceParallel(),
                "ffn_norm": SequenceParallel(),
                # (normed hidden, rotary table): all-gather the first, leave the table alone
                "attention": PrepareModuleInput(
                    input_layouts=(Shard(1), None),
                    desired_input_layouts=(Replicate(), None),
                    use_local_output=True,
                ),
                "feed_forward": PrepareModuleInput(
                    input_layouts=(Shard(1),),
                    desired_input_layouts=(Replicate(),),
                    use_local_output=True,
                ),
            }
        )
    return plan


def _check_sequence(tp: int, _module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
    """Refuse a sequence that does not split evenly: ranks would disagree on message sizes
    (gloo fails with a size mismatch, NCCL can hang)."""
    if args and args[0].dim() > 1 and args[0].shape[1] % tp:
        raise ValueError(
            f"sequence parallelism: sequence length {args[0].shape[1]} is not divisible by "
            f"tp {tp}; use whole sequences of model.sequenceLength or sequence_parallel=False"
        )


def apply_tensor_parallel(
    model: Transformer, tp_mesh: DeviceMesh, *, sequence_parallel: bool = True
) -> None:
    """Shard ``model`` (the whole model or one pipeline stage) over the 1-D ``tp_mesh``, in place.

    The embedding is vocabulary-parallel; the head is column-parallel and its logits are
    gathered, so the caller sees ordinary full (B, S, V) logits and the plain loss works.
    """
    stream = Shard(1) if sequence_parallel else Replicate()
    if model.tok_embeddings is not None:
        if sequence_parallel:
            model.register_forward_pre_hook(functools.partial(_check_sequence, tp_mesh.size()))
        parallelize_module(
            model.tok_embeddings,
            tp_mesh,
            RowwiseParallel(input_layouts=Replicate(), output_layouts=stream),
        )
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, _block_plan(sequence_parallel))
    if model.norm is not None and model.output is not None:
        head: dict[str, ParallelStyle] = {
            "output": ColwiseParallel(
                input_layouts=stream, output_layouts=Replicate(), use_local_output=True
            )
        }
        if sequence_parallel:
            head["norm"] = SequenceParallel()
        parallelize_module(model, tp_mesh, head)
