"""Activation recomputation: same gradients as without it, fewer saved activations, same FQNs."""

from __future__ import annotations

import copy

import pytest
import torch

from elastra_worker.models.llama import Transformer, init_weights, loss_fn, make_batch
from elastra_worker.parallel.recompute import apply_recompute

from .distributed import TINY, assert_tensors_close


def run(mode: str) -> tuple[float, dict[str, torch.Tensor], int, list[str]]:
    """Loss, gradients, bytes of tensors saved for backward, and parameter names."""
    model = Transformer(TINY)
    init_weights(model, seed=5)
    apply_recompute(model, mode)  # type: ignore[arg-type]
    tokens, targets = make_batch(range(4), TINY, seed=0)
    saved = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_fn(model(tokens), targets)
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return loss.item(), grads, saved, [n for n, _ in model.named_parameters()]


def test_recompute_modes_give_the_same_gradients_with_less_saved() -> None:
    loss, grads, saved, names = run("none")
    previous = saved
    for mode in ("selective", "full"):
        got_loss, got_grads, got_saved, got_names = run(mode)
        assert got_names == names  # no wrapper module in the FQNs
        torch.testing.assert_close(got_loss, loss)
        assert_tensors_close(got_grads, grads, mode)
        assert got_saved < previous, (mode, got_saved, previous)
        previous = got_saved


def test_recompute_survives_deepcopy_and_rejects_unknown_modes() -> None:
    model = Transformer(TINY)
    init_weights(model, seed=5)
    apply_recompute(model, "full")
    apply_recompute(model, "full")  # idempotent
    clone = copy.deepcopy(model)
    with torch.no_grad():
        clone.layers["0"].attention.wq.weight.zero_()
    tokens, _ = make_batch([0], TINY, seed=0)
    assert not torch.allclose(clone(tokens), model(tokens))  # the copy runs its own weights
    with pytest.raises(ValueError, match="recompute: expected one of none, selective, full"):
        apply_recompute(model, "some")  # type: ignore[arg-type]
