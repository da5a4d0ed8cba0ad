"""Activation recomputation: same gradients as without it, fewer saved activations, same FQNs;
for the reference model and, through ``Session.prepare``, for a Hugging Face Llama."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from elastra_worker.api import Session
from elastra_worker.assignment import parse_assignment
from elastra_worker.models.llama import Transformer, init_weights, loss_fn, make_batch
from elastra_worker.parallel.recompute import apply_recompute

from .distributed import TINY, assert_tensors_close


def run(mode: str) -> tuple[float, dict[str, torch.Tensor], int, list[str]]:
    """Loss, gradients, bytes of tensors saved for backward, and parameter names."""
    model = Transformer(TINY)
    init_weights(model, seed=5)
    apply_recompute(model, mode)  # type: ignore[arg-type]
    tokens, targets = make_batch(range(4), TINY, seed=0)
    loss, grads, saved = backward_measured(model, lambda: loss_fn(model(tokens), targets))
    return loss, grads, saved, [n for n, _ in model.named_parameters()]


def backward_measured(
    model: torch.nn.Module, forward: Callable[[], torch.Tensor]
) -> tuple[float, dict[str, torch.Tensor], int]:
    """``forward()``'s loss backward through ``model``: the loss, the gradients, and the bytes
    of the tensors autograd saved for backward."""
    saved = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = forward()
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return loss.item(), grads, saved


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


def hf_llama_under(mode: str, root: Path) -> tuple[float, dict[str, torch.Tensor], int]:
    """A Hugging Face ``LlamaForCausalLM`` through ``Session.prepare`` under a plan that
    recomputes ``mode``: loss, gradients, bytes saved for backward."""
    a = parse_assignment({
        "job": "recompute", "worldVersion": 0, "rank": 0, "worldSize": 1,
        "masterAddr": "127.0.0.1", "masterPort": 1, "globalBatchSize": 2,
        "plan": {"microBatchSize": 2, "recompute": mode}, "consistency": "bitwise",
        "checkpoint": {"path": str(root)},
    })  # fmt: skip
    sess = Session(a, device=torch.device("cpu"))  # prepare under bitwise needs no world
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, vocab_size=64, max_position_embeddings=32, use_cache=False,
    )  # fmt: skip
    model = sess.prepare(LlamaForCausalLM(config))
    tokens = torch.arange(32).reshape(2, 16) % 64
    return backward_measured(model, lambda: model(input_ids=tokens, labels=tokens).loss)


def test_prepare_recomputes_a_hugging_face_models_blocks_as_the_plan_says(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    loss, grads, saved = hf_llama_under("none", tmp_path)
    for mode in ("full", "selective"):  # selective: no attention core, so whole blocks
        caplog.clear()
        got_loss, got_grads, got_saved = hf_llama_under(mode, tmp_path)
        torch.testing.assert_close(got_loss, loss, rtol=0, atol=0)
        assert_tensors_close(got_grads, grads, mode)
        assert got_saved < saved / 2, (mode, got_saved, saved)
        fell_back = "recomputing whole blocks (full) instead" in caplog.text
        assert fell_back == (mode == "selective"), caplog.text
