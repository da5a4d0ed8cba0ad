"""Activation recomputation: trade a second forward for the memory of saved activations.

``full`` recomputes every block in the backward pass (only block inputs are kept);
``selective`` recomputes only the attention core (scores, softmax, weighted sum), which holds
the largest activations per FLOP, as Megatron's selective recomputation does.

The wrapped modules keep their names: the checkpointed call replaces the instance's
``forward`` instead of inserting a wrapper module, so parameter FQNs (and with them DCP
checkpoints, ``init_weights`` and the pipeline split) are the same in every mode.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from torch import nn
from torch.utils.checkpoint import checkpoint

from elastra_worker.assignment import RECOMPUTES, Recompute
from elastra_worker.errors import PermanentError
from elastra_worker.parallel.blocks import find_blocks

log = logging.getLogger(__name__)

_MARK = "_elastra_recompute"
SELECTIVE_PATH = "attention.core"
"""What selective recomputation recomputes in each block."""


def _checkpointed_call(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    # The class's forward, looked up at call time: it stays right under later class swaps
    # (fully_shard) and in a deepcopy (the partial below is copied with its module).
    return checkpoint(type(module).forward, module, *args, use_reentrant=False, **kwargs)


def _checkpoint_forward(module: nn.Module) -> None:
    """Make ``module``'s forward recompute itself in backward (idempotent)."""
    if getattr(module, _MARK, False):
        return
    module.forward = functools.partial(_checkpointed_call, module)
    setattr(module, _MARK, True)


def apply_recompute(model: nn.Module, mode: Recompute, *, blocks: str | None = None) -> None:
    """Apply recomputation ``mode`` ("none" | "selective" | "full") to every block, in place.

    The blocks are found by ``find_blocks`` (the ``layers`` ModuleDict of the reference
    ``Transformer``, a known path, or the path ``blocks`` names); "selective" needs an
    ``attention.core`` submodule in each block, as the reference model has.

    Apply after tensor parallelism and before FSDP, so FSDP's per-block all-gather surrounds
    the recomputed forward.
    """
    if mode not in RECOMPUTES:
        raise ValueError(f"recompute: expected one of {', '.join(RECOMPUTES)}, got {mode!r}")
    if mode == "none":
        return
    for name, block in find_blocks(model, blocks).named:
        if mode == "full":
            _checkpoint_forward(block)
        else:
            _checkpoint_forward(_attention_core(name, block))


def _attention_core(name: str, block: nn.Module) -> nn.Module:
    try:
        return block.get_submodule(SELECTIVE_PATH)
    except AttributeError:
        raise PermanentError(
            f"recompute selective: block {name} ({type(block).__name__}) has no "
            f"`{SELECTIVE_PATH}` submodule (the attention core the reference model has) to "
            "recompute; recompute full works on any block"
        ) from None


def apply_recompute_or_full(model: nn.Module, mode: Recompute, *, blocks: str | None) -> None:
    """``apply_recompute`` for a model of any layout: "selective" recomputes whole blocks
    ("full") where they have no ``attention.core`` to recompute, and says so once.

    Full recomputation keeps less than selective, so the memory the plan counts on holds;
    the price is a second forward of the whole block instead of its attention core.
    """
    if mode == "selective":
        found = find_blocks(model, blocks)
        if not all(_has(block, SELECTIVE_PATH) for block in found.modules()):
            log.warning(
                "recompute selective: the blocks at %s (%s) have no `%s` submodule to "
                "recompute alone; recomputing whole blocks (full) instead",
                found.path, type(found.modules()[0]).__name__, SELECTIVE_PATH,
            )  # fmt: skip
            mode = "full"
    apply_recompute(model, mode, blocks=blocks)


def _has(module: nn.Module, path: str) -> bool:
    try:
        module.get_submodule(path)
    except AttributeError:
        return False
    return True
