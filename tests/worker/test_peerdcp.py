"""DCP storage in memory: a state sharded over one mesh, saved to the ranks' memory, loads into
another mesh (more ranks, two dimensions, other dimensions) from the members that hold it, equal to
the original; a chunk whose holder is not in the loading group fails on every loading rank, or,
given the same state's durable copy, is read from it (and only that chunk)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from elastra_worker.session.peerdcp import PeerReader, save_in_memory

from .distributed import run_world

SAVERS = [0, 1, 2]
"""The saving world: three of the four ranks (rank 3 joins to load)."""


def originals() -> dict[str, torch.Tensor]:
    """Uneven rows over 3 and 4 ranks, a bf16 tensor, a scalar, and one large enough that its
    slices travel as messages of their own (over 1 MiB), saved by columns."""
    g = torch.Generator().manual_seed(5)
    return {
        "w": torch.randn(10, 6, generator=g),
        "exp_avg": torch.randn(10, 6, generator=g).to(torch.bfloat16),
        "bias": torch.randn(7, generator=g),
        "step": torch.tensor(42.0),
        "big": torch.randn(3000, 1200, generator=g),
    }


LAYOUTS: dict[str, tuple[list[Any], Any]] = {
    # name: (mesh of the loading world, placements of "w")
    "grow": ([0, 1, 2, 3], (Shard(0),)),
    "plan change": ([[0, 1], [2, 3]], (Shard(0), Shard(1))),
    "columns": ([0, 1, 2, 3], (Shard(1),)),  # every rank reads from all three holders
    "replicated": ([0, 1, 2, 3], (Replicate(),)),
    "shrink": ([0, 1], (Shard(0),)),  # rank 2's rows are in no loading rank's memory
}
LOADED = [name for name in LAYOUTS if name != "shrink"]


def _state(mesh: DeviceMesh, w_placements: Any, big_placements: Any = None) -> dict[str, Any]:
    """The originals on ``mesh``: "w" and "big" as placed (``big_placements`` defaults to
    ``w_placements``), the others by rows."""
    o = originals()
    dims = mesh.ndim
    return {
        "w": distribute_tensor(o["w"], mesh, w_placements),
        "big": distribute_tensor(o["big"], mesh, big_placements or w_placements),
        "exp_avg": distribute_tensor(o["exp_avg"], mesh, (Shard(0),) + (Replicate(),) * (dims - 1)),
        "bias": distribute_tensor(o["bias"], mesh, (Shard(0),) + (Replicate(),) * (dims - 1)),
        "step": o["step"].clone(),
        "lr": 0.25,
    }


def _blank(mesh: DeviceMesh, w_placements: Any) -> dict[str, Any]:
    state = _state(mesh, w_placements)
    for value in state.values():
        if isinstance(value, DTensor):
            value.to_local().zero_()
        elif isinstance(value, torch.Tensor):
            value.zero_()
    state["lr"] = 0.0
    return state


def _move(
    rank: int, world: int, layout: str, durable: str | None = None, lost: bool = False
) -> dict[str, Any]:
    """Save over ``SAVERS`` (3 ranks, rows sharded, "big" by columns), load over the layout's
    mesh (loaded by rows, a piece of "big" lands in a strided target, received into a buffer;
    by columns, some land in place); with ``durable`` (a folder) the savers also save to files
    there, and the loaders read what no loader holds from the file of the saver that left
    alone (the others' files are removed; with ``lost`` that one too)."""
    old_group = dist.new_group(SAVERS)
    old_mesh = DeviceMesh("cpu", SAVERS)  # every rank forms every group, members or not
    shape, placements = LAYOUTS[layout]
    ranks = torch.tensor(shape)
    loaders = sorted(ranks.flatten().tolist())
    group = dist.new_group(loaders)
    mesh = DeviceMesh("cpu", ranks)
    held = None
    if rank in SAVERS:
        saved = _state(old_mesh, (Shard(0),), (Shard(1),))
        held = save_in_memory(saved, group=old_group)
        if durable is not None:
            dcp.save(saved, checkpoint_id=durable, process_group=old_group)
    dist.barrier()
    if durable is not None and rank == 0:  # what the members hold need not be on the volume
        for path in Path(durable).glob("__*.distcp"):
            if lost or not path.name.startswith("__2_"):
                path.unlink()
    box = [None if held is None else held.metadata]
    dist.broadcast_object_list(box, src=0)
    if rank not in loaders:
        return {}
    target = _blank(mesh, placements)
    storage = None if durable is None else dcp.FileSystemReader(durable)
    reader = PeerReader(held, box[0], group, storage=storage)
    try:
        dcp.load(target, storage_reader=reader, process_group=group)
    except CheckpointException as err:
        return {"error": str(err)}
    full = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in target.items()}
    return {"state": full, "received": reader.received_bytes, "stored": reader.stored_bytes}


def _assert_loaded(results: list[dict[str, Any]]) -> None:
    want = originals()
    for rank, result in enumerate(results):
        assert "state" in result, f"rank {rank}: {result}"
        got = result["state"]
        for name, tensor in want.items():
            assert torch.equal(got[name], tensor), f"rank {rank}: {name}: {got[name]} {tensor}"
        assert got["lr"] == 0.25, f"rank {rank}: lr"


@pytest.mark.parametrize("layout", LOADED)
def test_a_state_held_in_memory_loads_into_another_layout_from_its_holders(layout: str) -> None:
    results = run_world(_move, 4, layout)
    _assert_loaded(results)
    assert results[3]["received"] > 0  # the joiner held nothing: all it has came from peers
    assert all(r["stored"] == 0 for r in results)


def test_the_part_of_a_member_that_left_comes_from_the_durable_copy(tmp_path: Path) -> None:
    results = run_world(_move, 4, "shrink", str(tmp_path))
    loaded = results[:2]
    _assert_loaded(loaded)
    # rank 2 held rows 8..9 of w and exp_avg and row 6 of bias, all in rank 1's half now;
    # the files of the members that stayed were removed, so nothing else came from storage
    assert loaded[1]["stored"] > 0, [(r["received"], r["stored"]) for r in loaded]
    assert loaded[0]["received"] > 0  # row 4 of w from rank 1 of the saving world


def test_a_part_the_durable_copy_lacks_too_fails_on_every_loading_rank(tmp_path: Path) -> None:
    """What the caller takes as its cue to read the whole state from storage instead."""
    results = run_world(_move, 4, "shrink", str(tmp_path), True)
    for rank in (0, 1):
        assert "__2_0.distcp" in results[rank].get("error", ""), results[rank]


def test_a_chunk_whose_holder_left_fails_on_every_loading_rank() -> None:
    results = run_world(_move, 4, "shrink")
    for rank in (0, 1):
        assert "held by rank 2 of the saving world" in results[rank]["error"], results[rank]
