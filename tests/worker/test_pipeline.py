"""Pipeline schedules on 2 gloo ranks: the same loss and gradients as the whole model.

The batch is split into micro-batches whose losses are weighted by 1/n (``scale_grads=False``:
the caller weights), so their sum is the full-batch mean and the accumulated gradients are
the full-batch gradients of the single-process model, for every schedule and split.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor

from elastra_worker.assignment import Schedule, split_layers
from elastra_worker.models.llama import Transformer, init_weights, loss_fn, make_batch
from elastra_worker.parallel.fsdp import apply_fsdp
from elastra_worker.parallel.pipeline import (
    build_stage_modules,
    make_pipeline_stages,
    make_schedule,
    stage_ids,
)
from elastra_worker.parallel.tensor import apply_tensor_parallel

from .distributed import TINY, assert_tensors_close, run_world

pytestmark = pytest.mark.slow

BATCH, MICRO = 8, 4


def reference(tokens: torch.Tensor, targets: torch.Tensor) -> tuple[float, dict[str, torch.Tensor]]:
    model = Transformer(TINY)
    init_weights(model, seed=2)
    loss = loss_fn(model(tokens), targets)
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def weighted_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return loss_fn(logits, targets) / MICRO


def pipeline_step(
    mesh: DeviceMesh, virtual_stages: int, kind: Schedule, batch: tuple[torch.Tensor, torch.Tensor]
) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """One schedule step on this rank: its micro-batch losses and its stages' whole gradients.

    ``mesh`` has a "pp" dimension and may have a "tp" one (then with sequence parallelism) or
    a "dp" one (FSDP, ZeRO-3; the replica takes its slice of the batch, and since FSDP averages
    over replicas, each replica's micro-batch weight stays 1/MICRO).
    """
    dims = mesh.mesh_dim_names or ()
    tokens, targets = batch
    if "dp" in dims:
        size = len(tokens) // mesh["dp"].size()
        start = mesh["dp"].get_local_rank() * size
        tokens, targets = tokens[start : start + size], targets[start : start + size]
    pp = mesh["pp"].size()
    stages = split_layers(TINY.layers, pp * virtual_stages)
    held = stage_ids(mesh["pp"].get_local_rank(), pp, virtual_stages)
    modules = build_stage_modules(TINY, stages, held, "cpu")
    for module in modules:
        init_weights(module, seed=2)
        if "tp" in dims:
            apply_tensor_parallel(module, mesh["tp"])
        if "dp" in dims:
            apply_fsdp(module, mesh["dp"], "full")
    group = mesh["pp"].get_group()
    pipeline = make_pipeline_stages(modules, held, pp, virtual_stages, "cpu", group)
    schedule = make_schedule(kind, pipeline, MICRO, weighted_loss)
    losses: list[torch.Tensor] = []
    args = (tokens,) if 0 in held else ()
    target = targets if len(stages) - 1 in held else None
    schedule.step(*args, target=target, losses=losses)  # as the module docstring says
    grads = {
        n: full(p.grad) for m in modules for n, p in m.named_parameters() if p.grad is not None
    }
    assert len(grads) == sum(len(list(m.parameters())) for m in modules)
    return losses, grads


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def assert_matches(
    got: tuple[list[torch.Tensor], dict[str, torch.Tensor]],
    want: tuple[float, dict[str, torch.Tensor]],
    mesh: DeviceMesh,
    label: str,
) -> None:
    (losses, grads), (want_loss, want_grads) = got, want
    assert_tensors_close(grads, {n: want_grads[n] for n in grads}, label)
    total = torch.tensor([float(sum(loss.item() for loss in losses))])
    # Only the ranks holding the last stage have losses: each tp rank the same, each replica
    # the mean of its slice. The mean over those ranks is the full-batch mean.
    dist.all_reduce(total)
    torch.testing.assert_close(total.item() * mesh["pp"].size() / mesh.size(), want_loss)


def _pipelines_match(rank: int, world: int) -> None:
    batch = make_batch(range(BATCH), TINY, seed=0)
    want = reference(*batch)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("pp",))
    for kind, virtual_stages in (("1f1b", 1), ("gpipe", 1), ("interleaved1f1b", 2)):
        assert_matches(pipeline_step(mesh, virtual_stages, kind, batch), want, mesh, kind)


def _pipeline_over_tensor_parallel_matches(rank: int, world: int) -> None:
    batch = make_batch(range(BATCH), TINY, seed=0)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "tp"))
    got = pipeline_step(mesh, 1, "1f1b", batch)
    assert_matches(got, reference(*batch), mesh, "pp2 x tp2")


def _pipeline_over_fsdp_matches(rank: int, world: int) -> None:
    batch = make_batch(range(BATCH), TINY, seed=0)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "pp"))
    got = pipeline_step(mesh, 1, "1f1b", batch)
    assert_matches(got, reference(*batch), mesh, "dp2 x pp2")


def test_gpipe_1f1b_and_interleaved_match_one_process() -> None:
    run_world(_pipelines_match, 2)


def test_pipeline_over_sequence_parallel_2x2_matches_one_process() -> None:
    run_world(_pipeline_over_tensor_parallel_matches, 4)


def test_pipeline_over_fsdp_2x2_matches_one_process() -> None:
    run_world(_pipeline_over_fsdp_matches, 4)


def test_stage_ids_and_schedule_validation() -> None:
    assert stage_ids(0, 1, 1) == [0]
    assert stage_ids(1, 4, 3) == [1, 5, 9]
    with pytest.raises(ValueError, match="pipeline rank 4 of 4"):
        stage_ids(4, 4, 1)
    with pytest.raises(ValueError, match="schedule: expected one of gpipe, 1f1b, interleaved1f1b"):
        make_schedule("zb", [], 2, weighted_loss)  # type: ignore[arg-type]


def test_stage_modules_have_their_layers_and_ends() -> None:
    stages = split_layers(TINY.layers, 4)
    first, third = build_stage_modules(TINY, stages, [0, 2], "cpu")
    assert list(first.layers) == ["0"] and first.tok_embeddings is not None
    assert first.output is None
    assert list(third.layers) == ["2"] and third.tok_embeddings is None and third.output is None
    (last,) = build_stage_modules(TINY, stages, [3], torch.device("cpu"))
    assert last.output is not None and last.norm is not None
