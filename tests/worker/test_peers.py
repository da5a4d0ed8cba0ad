"""State from a peer: what rank 0 holds arrives bit for bit in the others' tensors, with its size;
the source is the lowest rank holding the newest step; a receiver laid out otherwise is refused;
one rank's flag reaches every rank."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
import torch

from elastra_worker.session.peers import (
    NOTHING_HELD,
    Holders,
    LayoutMismatchError,
    Spec,
    _batches,
    _mismatch,
    agree_any,
    agree_source,
    share_state,
)

from .distributed import run_world


def state() -> dict[str, torch.Tensor]:
    """Every shape of trouble: dtypes of 1, 2, 4 and 8 bytes, a scalar, an empty tensor, a
    non-contiguous view, and one tensor larger than the test's chunk."""
    g = torch.Generator().manual_seed(3)
    wide = torch.randn(6, 5, generator=g)
    return {
        "layers.0.weight": torch.randn(64, 32, generator=g),
        "layers.0.weight.exp_avg": torch.randn(64, 32, generator=g).to(torch.bfloat16),
        "step": torch.tensor(17, dtype=torch.int64),
        "mask": torch.rand(7, generator=g) > 0.5,
        "empty": torch.empty(0, 4),
        "transposed": wide.t(),
        "big": torch.randn(2048, generator=g, dtype=torch.float64),
        "half": torch.randn(3, 3, generator=g).half(),
    }


def digest(tensors: dict[str, torch.Tensor]) -> dict[str, tuple[str, str, tuple[int, ...]]]:
    return {
        name: (
            hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
            .hexdigest(),
            str(t.dtype),
            tuple(t.shape),
        )
        for name, t in tensors.items()
    }  # fmt: skip


def blank() -> dict[str, torch.Tensor]:
    """A receiver's own tensors: the source's layout (the transposed one a view too), zeros."""
    out = {n: torch.zeros_like(t) for n, t in state().items()}
    out["transposed"] = torch.zeros(6, 5).t()
    return out


def _share(rank: int, world: int, chunk_bytes: int) -> dict[str, Any]:
    mine = state() if rank == 0 else blank()
    moved = share_state(mine, src=0, chunk_bytes=chunk_bytes)
    return {"digest": digest(mine), "order": list(mine), "bytes": moved.bytes}


@pytest.mark.parametrize("chunk_bytes", [1024, 64 * 2**20])
def test_the_sources_state_arrives_bit_for_bit_on_every_rank(chunk_bytes: int) -> None:
    results = run_world(_share, 3, chunk_bytes)
    expected = digest(state())
    size = sum(t.numel() * t.element_size() for t in state().values())
    for rank, result in enumerate(results):
        assert result["digest"] == expected, f"rank {rank}"
        assert result["bytes"] == size


def _routed(rank: int, world: int) -> dict[str, Any]:
    """``share_state`` with CPU data routed to a second gloo group, as a GPU world routes CUDA
    data to its NCCL group; every broadcast's group recorded (the real one still runs)."""
    import torch.distributed as dist  # noqa: PLC0415 - in the spawned rank only

    layouts, data = dist.new_group(backend="gloo"), dist.new_group(backend="gloo")
    assert isinstance(layouts, dist.ProcessGroup) and isinstance(data, dist.ProcessGroup)
    used: list[str] = []
    real = dist.broadcast

    def broadcast(tensor: torch.Tensor, src: int, group: Any = None, **kw: Any) -> Any:
        used.append({id(layouts): "layouts", id(data): "data"}.get(id(group), "other"))
        return real(tensor, src, group=group, **kw)

    setattr(dist, "broadcast", broadcast)  # noqa: B010 - a spy; the collective is real
    mine = state() if rank == 0 else blank()
    share_state(mine, src=0, group=layouts, device_groups={"cpu": data}, chunk_bytes=1024)
    return {"digest": digest(mine), "groups": used}


def test_tensor_data_travels_over_its_devices_group_and_layouts_over_the_state_group() -> None:
    expected = digest(state())
    for rank, result in enumerate(run_world(_routed, 2)):
        assert result["digest"] == expected, f"rank {rank}"
        assert result["groups"] and set(result["groups"]) == {"data"}, result["groups"]


def _misfit(rank: int, world: int) -> str:
    mine = state() if rank == 0 else blank()
    if rank == 2:
        mine["half"] = torch.zeros(3, 4).half()
    try:
        share_state(mine, src=0)
    except LayoutMismatchError as err:
        return str(err)
    return "no error"


def test_a_receiver_laid_out_otherwise_is_refused_on_every_rank() -> None:
    results = run_world(_misfit, 3)
    assert results[2] == "half: here torch.float16 (3, 4), at the source torch.float16 (3, 3)"
    assert results[0] == results[1] == "another rank's differ"


def _holders(rank: int, world: int, held: list[int]) -> tuple[int, ...]:
    return agree_source(held[rank]).steps


@pytest.mark.parametrize(
    ("held", "source", "all_hold"),
    [
        ([40, 40, NOTHING_HELD], 0, False),  # a grow: survivors send
        ([NOTHING_HELD, 40, 40], 1, False),  # the joiner got rank 0
        ([NOTHING_HELD] * 3, None, False),  # nobody holds state: the volume
        ([40, 40, 40], 0, True),  # a shrink: nothing to send
    ],
)
def test_the_source_is_the_lowest_rank_with_the_newest_step(
    held: list[int], source: int | None, all_hold: bool
) -> None:
    for steps in run_world(_holders, 3, held):
        assert steps == tuple(held)
    holders = Holders(tuple(held))
    assert (holders.source, holders.all_hold) == (source, all_hold)


def _any(rank: int, world: int, flags: list[bool]) -> bool:
    return agree_any(flags[rank])


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ([False, False, False], False),  # nobody carries the state: the old world saves
        ([False, True, False], True),  # one member carries it: every rank learns so
        ([True, True, True], True),
    ],
)
def test_any_ranks_flag_is_known_to_all(flags: list[bool], expected: bool) -> None:
    assert run_world(_any, 3, flags) == [expected] * 3


@pytest.mark.parametrize(
    ("sizes", "chunk", "expected"),
    [
        ([4, 4, 4], 8, [[4, 4], [4]]),
        ([16, 4], 8, [[16], [4]]),  # larger than a chunk: alone
        ([4, 16, 4], 8, [[4], [16], [4]]),
        ([0, 0, 4], 4, [[0, 0, 4]]),
        ([], 8, []),
    ],
)
def test_batches_keep_order_and_stay_under_the_chunk(
    sizes: list[int], chunk: int, expected: list[list[int]]
) -> None:
    specs = [Spec(f"t{i}", torch.uint8, (n,)) for i, n in enumerate(sizes)]
    assert [[s.nbytes for s in b] for b in _batches(specs, chunk)] == expected


def test_a_batch_holds_one_device_type() -> None:
    """A GPU model's optimizer keeps its step counters on the CPU: they travel apart."""
    devices = ["cuda", "cuda", "cpu", "cuda", "cpu", "cpu"]
    specs = [Spec(f"t{i}", torch.uint8, (4,), d) for i, d in enumerate(devices)]
    batches = [[s.device for s in b] for b in _batches(specs, 1024)]
    assert batches == [["cuda", "cuda"], ["cpu"], ["cuda"], ["cpu", "cpu"]]


def test_a_tensor_on_another_device_than_the_sources_is_named() -> None:
    mine = [Spec("w", torch.float32, (2,), "cpu")]
    theirs = [Spec("w", torch.float32, (2,), "cuda")]
    assert _mismatch(mine, theirs) == "w: here on cpu, at the source on cuda"
