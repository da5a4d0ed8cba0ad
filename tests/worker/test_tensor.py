"""Tensor (and sequence) parallelism on 2 gloo ranks matches the single-process model."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from elastra_worker.models.llama import Transformer, init_weights, loss_fn, make_batch
from elastra_worker.parallel.tensor import apply_tensor_parallel

from .distributed import TINY, assert_tensors_close, run_world

pytestmark = pytest.mark.slow


def full_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's gradient as a whole tensor (gathered from DTensor shards)."""
    out = {}
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        grad = p.grad
        out[name] = grad.full_tensor() if isinstance(grad, DTensor) else grad
    return out


def reference(tokens: torch.Tensor, targets: torch.Tensor) -> tuple[float, dict[str, torch.Tensor]]:
    model = Transformer(TINY)
    init_weights(model, seed=3)
    loss = loss_fn(model(tokens), targets)
    loss.backward()
    return loss.item(), full_grads(model)


def _tensor_parallel_matches(rank: int, world: int) -> None:
    tokens, targets = make_batch(range(4), TINY, seed=0)
    want_loss, want_grads = reference(tokens, targets)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    for sequence_parallel in (False, True):
        model = Transformer(TINY)
        init_weights(model, seed=3)
        apply_tensor_parallel(model, mesh, sequence_parallel=sequence_parallel)
        wq = model.layers["0"].attention.wq.weight
        assert isinstance(wq, DTensor) and wq.to_local().shape == (16, 32)
        loss = loss_fn(model(tokens), targets)
        loss.backward()
        torch.testing.assert_close(loss.item(), want_loss)
        assert_tensors_close(
            full_grads(model), want_grads, f"sequence_parallel={sequence_parallel}"
        )
    with pytest.raises(ValueError, match="sequence length 15 is not divisible by tp 2"):
        model(tokens[:, :15])  # refused before any collective could mismatch


def _init_after_sharding_matches(rank: int, world: int) -> None:
    want = Transformer(TINY)
    init_weights(want, seed=3)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    model = Transformer(TINY)
    apply_tensor_parallel(model, mesh)
    init_weights(model, seed=3)  # each rank takes its slice of the same full tensors
    got = {n: p.full_tensor() if isinstance(p, DTensor) else p for n, p in model.named_parameters()}
    assert_tensors_close(got, dict(want.named_parameters()), "init after sharding")


def test_tensor_parallel_with_and_without_sequence_parallel() -> None:
    run_world(_tensor_parallel_matches, 2)


def test_init_weights_on_sharded_parameters_gives_the_whole_models_values() -> None:
    run_world(_init_after_sharding_matches, 2)
