"""FSDP2 sharding (ZeRO-2-like and ZeRO-3), alone and over tensor parallelism, on gloo ranks.

Each replica takes its half of the batch; its loss is weighted by its share of the batch times
the replica count (FSDP averages gradients over replicas), so the reduced gradient is the
full-batch gradient and one AdamW step must give the single-process parameters.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from elastra_worker.assignment import Recompute, Sharding
from elastra_worker.models.llama import Transformer, init_weights, loss_fn, make_batch
from elastra_worker.parallel.fsdp import apply_fsdp
from elastra_worker.parallel.recompute import apply_recompute
from elastra_worker.parallel.tensor import apply_tensor_parallel

from .distributed import TINY, assert_tensors_close, run_world

pytestmark = pytest.mark.slow

BATCH = 4
LR = 1e-2
EPS = 1e-4
"""AdamW's first step is lr * g / (|g| + eps): with the default eps (1e-8) a gradient near zero
turns fp32 reduction-order noise into a different update, so a larger eps keeps the update a
smooth function of the gradient and the comparison meaningful."""


def full_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        n: (p.full_tensor() if isinstance(p, DTensor) else p).detach()
        for n, p in model.named_parameters()
    }


def one_step(model: torch.nn.Module, samples: range, weight: float) -> torch.Tensor:
    """Forward, weighted backward and one AdamW step; returns the weighted loss."""
    opt = torch.optim.AdamW(model.parameters(), lr=LR, eps=EPS)
    tokens, targets = make_batch(samples, TINY, seed=0)
    loss = loss_fn(model(tokens), targets) * weight
    loss.backward()
    opt.step()
    return loss.detach()


def reference() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model = Transformer(TINY)
    init_weights(model, seed=11)
    loss = one_step(model, range(BATCH), 1.0)
    return loss, full_params(model)


def sharded_step(
    dp_mesh: DeviceMesh,
    tp_mesh: DeviceMesh | None,
    sharding: Sharding,
    recompute: Recompute = "none",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One step of this replica's half; the loss summed over replicas, full parameters.

    The wrappers go on in the documented order: tensor parallel, recompute, FSDP.
    """
    model = Transformer(TINY)
    init_weights(model, seed=11)
    if tp_mesh is not None:
        apply_tensor_parallel(model, tp_mesh)
    apply_recompute(model, recompute)
    apply_fsdp(model, dp_mesh, sharding)
    assert isinstance(model, FSDPModule) and isinstance(model.layers["0"], FSDPModule)
    dp, rank = dp_mesh.size(), dp_mesh.get_local_rank()
    half = BATCH // dp
    loss = one_step(model, range(rank * half, (rank + 1) * half), half / BATCH * dp) / dp
    dist.all_reduce(loss, group=dp_mesh.get_group())
    return loss, full_params(model)


def assert_matches(got: tuple[torch.Tensor, dict[str, torch.Tensor]], label: str) -> None:
    want_loss, want_params = reference()
    loss, params = got
    torch.testing.assert_close(loss, want_loss, msg=label)
    assert_tensors_close(params, want_params, label)


def _fsdp_matches(rank: int, world: int) -> None:
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    assert_matches(sharded_step(mesh, None, "optimizer", "selective"), "optimizer")
    assert_matches(sharded_step(mesh, None, "full"), "full")


def _fsdp_over_tensor_parallel_matches(rank: int, world: int) -> None:
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    assert_matches(sharded_step(mesh["dp"], mesh["tp"], "full", "full"), "dp2 x tp2")
    # init_weights on 2-D sharded parameters (FSDP over TP) gives the whole model's values
    model, want = Transformer(TINY), Transformer(TINY)
    apply_tensor_parallel(model, mesh["tp"])
    apply_fsdp(model, mesh["dp"], "full")
    init_weights(model, seed=11)
    init_weights(want, seed=11)
    assert_tensors_close(full_params(model), full_params(want), "init after sharding")


def test_fsdp_optimizer_and_full_sharding_match_one_process() -> None:
    run_world(_fsdp_matches, 2)


def test_fsdp_over_tensor_parallel_2x2_matches_one_process() -> None:
    run_world(_fsdp_over_tensor_parallel_matches, 4)


def test_sharding_none_leaves_the_module_alone() -> None:
    model = Transformer(TINY)
    apply_fsdp(model, None, "none")  # type: ignore[arg-type]
    assert not isinstance(model, FSDPModule)
    with pytest.raises(ValueError, match="sharding: expected one of none, optimizer, full"):
        apply_fsdp(model, None, "zero")  # type: ignore[arg-type]
