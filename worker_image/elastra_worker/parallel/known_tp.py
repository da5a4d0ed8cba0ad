"""Tensor parallelism for a user's model without a hook, by the module names of its blocks.

``Session.prepare`` applies it when the plan is tensor parallel and the caller passed no
``parallelize`` function. One layout is known: a block with ``self_attn.{q,k,v,o}_proj`` and
``mlp.{gate,up,down}_proj`` linear layers, as Hugging Face lays out the Llama family (Llama,
Mistral, Qwen2 and others share these names; ``transformers`` publishes the same split as the
models' ``base_model_tp_plan``). Each block is split the Megatron way: the query, key, value,
gate and up projections by output features (each rank holds whole heads and a slice of the
MLP), the output and down projections by input features, so a block needs one all-reduce
after attention and one after the MLP. The attention reshapes its projections with ``-1``
heads, so it runs on the local heads unchanged.

What stays whole on every rank: the embedding, the norms and the head (their gradients are
equal across the tensor-parallel group, so the session's data-parallel sum treats them like
any replicated parameter). That costs memory a vocabulary-parallel embedding and head would
save; a model that needs it passes its own ``parallelize`` function (docs/parallel-models.md).

The worker never imports ``transformers`` (an import contract): the layout is recognised by
module names and ``nn.Linear`` types alone.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)

from elastra_worker.errors import PermanentError
from elastra_worker.parallel.blocks import find_blocks

COLUMN = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
)
"""Split by output features."""
ROW = ("self_attn.o_proj", "mlp.down_proj")
"""Split by input features (their outputs are summed over the group)."""
HEADS = ("self_attn.q_proj", "self_attn.k_proj")
"""Projections whose output features are whole heads of ``self_attn.head_dim``."""


def apply_known_tensor_parallel(
    model: nn.Module, tp_mesh: DeviceMesh, *, blocks: str | None = None
) -> None:
    """Split every block of ``model`` over the 1-D ``tp_mesh`` in place, or raise
    ``PermanentError`` naming what does not fit (no known layout, heads or MLP width not
    divisible by the tensor-parallel degree)."""
    found = find_blocks(model, blocks)
    tp = tp_mesh.size()
    for name, block in found.named:
        _check_block(name, block, tp)
    styles: dict[str, ParallelStyle] = {path: ColwiseParallel() for path in COLUMN}
    styles.update({path: RowwiseParallel() for path in ROW})
    for block in found.modules():
        parallelize_module(block, tp_mesh, styles)


def _check_block(name: str, block: nn.Module, tp: int) -> None:
    """Refuse a block this layout does not describe, before any rank changes a weight."""
    linears = {path: _linear(block, path) for path in (*COLUMN, *ROW)}
    missing = [path for path, layer in linears.items() if layer is None]
    if missing:
        raise PermanentError(
            f"tensor parallelism: block {name} ({type(block).__name__}) has no "
            f"{', '.join(missing)} linear layer, and no other layout is known; pass "
            "Session.prepare(model, parallelize=fn) with your own split (docs/parallel-models.md)"
        )
    head_dim = getattr(block.get_submodule("self_attn"), "head_dim", None)
    for path in HEADS:
        layer = linears[path]
        assert layer is not None
        heads = layer.out_features // head_dim if isinstance(head_dim, int) and head_dim else 0
        if heads == 0 or heads % tp:
            raise PermanentError(
                f"tensor parallelism: {name}.{path} has {heads or 'an unknown number of'} "
                f"heads, not a multiple of tp={tp}; plan a tensor-parallel degree that "
                "divides the attention and key/value heads"
            )
    width = linears["mlp.up_proj"]
    assert width is not None
    if width.out_features % tp:
        raise PermanentError(
            f"tensor parallelism: {name}.mlp.up_proj has {width.out_features} features, "
            f"not a multiple of tp={tp}"
        )


def _linear(block: nn.Module, path: str) -> nn.Linear | None:
    try:
        layer = block.get_submodule(path)
    except AttributeError:
        return None
    return layer if isinstance(layer, nn.Linear) else None
