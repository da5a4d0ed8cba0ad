"""State from a peer: one rank's named tensors sent to the other members of the world.

Why: a trainer that enters a world (a grow, a replaced pod) would otherwise read the whole
committed checkpoint back from the volume. When a member of the new world already holds the
state in memory (a survivor, ``carry.py``), sending it over the new world's state group costs
the network's time instead of the shared file system's, and the volume stays the durable copy.
Layouts and agreements travel over the state group (gloo, with the state's timeout,
``checkpoints.py``); tensor data over the group of its device (``device_groups``): on GPUs the
world's NCCL group, so GPU tensors go GPU to GPU without copies through host memory, CPU
tensors (an optimizer's step counters) over gloo. (NCCL refuses two ranks on one GPU, so a
machine with one GPU cannot run the NCCL side; the CPU tests route through a second gloo group.)

``share_state`` packs the source's tensors into flat byte buffers of at most ``chunk_bytes``,
one device per buffer, and broadcasts them, so a few large collectives carry the state
whatever the number of tensors; every rank receives in place into its own tensors of the same
names, dtypes, shapes and devices (the source's layout is checked first, so a mismatch is an
error, never a silent misfit). ``agree_source`` picks the rank to send from: the lowest that
holds the newest step.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..checkpoint import agree_all

CHUNK_BYTES = 64 * 2**20
"""Bytes per broadcast: large enough that the per-collective cost vanishes, small enough that
the staging buffer is a small fraction of the state."""

NOTHING_HELD = -1
"""``agree_source``'s step for a rank that holds no state (a joiner)."""


@dataclass(frozen=True)
class Spec:
    """One tensor's layout: what sender and receivers must agree on."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    device: str = "cpu"
    """The device type (``cuda``, ``cpu``): a tensor's data travels over that device's group."""

    @staticmethod
    def of(name: str, t: torch.Tensor) -> Spec:
        return Spec(name, t.dtype, tuple(t.shape), t.device.type)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()


@dataclass(frozen=True)
class Transfer:
    """What one ``share_state`` moved: bytes of tensor data and the seconds it took."""

    bytes: int
    seconds: float


@dataclass(frozen=True)
class Holders:
    """Who holds which step of the state, as every rank sees it after ``agree_source``."""

    steps: tuple[int, ...]

    @property
    def newest(self) -> int:
        return max(self.steps)

    @property
    def source(self) -> int | None:
        """The rank to send from (the lowest that holds the newest step), or ``None``."""
        if self.newest == NOTHING_HELD:
            return None
        return self.steps.index(self.newest)

    @property
    def all_hold(self) -> bool:
        """Every rank holds the newest step already: nothing to send."""
        return self.source is not None and all(s == self.newest for s in self.steps)


class LayoutMismatchError(RuntimeError):
    """The receiver's tensors are not laid out as the source's (another model or optimizer)."""


def agree_source(held_step: int, *, group: dist.ProcessGroup | None = None) -> Holders:
    """Every rank's held step (``NOTHING_HELD`` for none), known to all (collective)."""
    world = dist.get_world_size(group)
    steps = torch.full((world,), NOTHING_HELD, dtype=torch.int64)
    steps[dist.get_rank(group)] = held_step
    dist.all_reduce(steps, op=dist.ReduceOp.MAX, group=group)
    return Holders(tuple(int(s) for s in steps))


def agree_any(flag: bool, *, group: dist.ProcessGroup | None = None) -> bool:
    """Whether any rank's ``flag`` is set, known to all (collective): no rank's is unset."""
    return not agree_all(not flag, group=group)


def share_state(
    tensors: Mapping[str, torch.Tensor],
    *,
    src: int,
    group: dist.ProcessGroup | None = None,
    device_groups: Mapping[str, dist.ProcessGroup] | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> Transfer:
    """Broadcast ``src``'s ``tensors`` into every other rank's ``tensors`` of the same names,
    in place; returns what moved. The layouts go over ``group``, the data of each device type
    over ``device_groups[type]`` (``group`` for a type not named); every group spans the whole
    world in one rank order, so ``src`` is the source in each. Raises
    ``LayoutMismatchError`` on a rank whose tensors differ from the source's (every rank
    learns of it: the check is agreed before any data)."""
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    start = time.perf_counter()
    is_src = dist.get_rank(group) == src
    specs = _source_specs(tensors, src=src, group=group)
    mine = [Spec.of(n, t) for n, t in tensors.items()]
    ok = torch.tensor([1 if is_src or mine == specs else 0], dtype=torch.int64)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=group)
    if not int(ok):
        raise LayoutMismatchError(
            _mismatch(mine, specs) if mine != specs else "another rank's differ"
        )
    for batch in _batches(specs, chunk_bytes):
        device = batch[0].device
        data_group = (device_groups or {}).get(device, group)
        if len(batch) == 1:  # a large tensor: sent from and received into its own memory
            target = tensors[batch[0].name]
            alone = _as_bytes(target)
            dist.broadcast(alone, src=src, group=data_group)
            if not is_src and alone.data_ptr() != target.data_ptr():  # not contiguous
                _fill(target, alone)
            continue
        if is_src:
            buffer = torch.cat([_as_bytes(tensors[s.name]) for s in batch])
        else:
            size = sum(s.nbytes for s in batch)
            buffer = torch.empty(size, dtype=torch.uint8, device=torch.device(device))
        dist.broadcast(buffer, src=src, group=data_group)
        if not is_src:
            _unpack(buffer, batch, tensors)
    if any(s.device == "cuda" for s in specs):
        torch.cuda.synchronize()  # NCCL returns once queued: the time is the copies' too
    return Transfer(sum(s.nbytes for s in specs), time.perf_counter() - start)


def _source_specs(
    tensors: Mapping[str, torch.Tensor], *, src: int, group: dist.ProcessGroup | None
) -> list[Spec]:
    """The source's names, dtypes and shapes, on every rank."""
    is_src = dist.get_rank(group) == src
    box: list[object] = [[Spec.of(n, t) for n, t in tensors.items()] if is_src else None]
    dist.broadcast_object_list(box, src=src, group=group)
    specs = box[0]
    assert isinstance(specs, list)
    return specs


def _mismatch(mine: list[Spec], theirs: list[Spec]) -> str:
    names = {s.name for s in mine} ^ {s.name for s in theirs}
    if names:
        return f"tensors only one side has: {sorted(names)[:5]}"
    differ = [(a, b) for a, b in zip(mine, theirs, strict=True) if a != b]
    if differ:
        a, b = differ[0]
        if a.device != b.device:
            return f"{a.name}: here on {a.device}, at the source on {b.device}"
        return f"{a.name}: here {a.dtype} {a.shape}, at the source {b.dtype} {b.shape}"
    return "the same tensors in another order"


def _batches(specs: list[Spec], chunk_bytes: int) -> Iterator[list[Spec]]:
    """Consecutive runs of tensors on one device of at most ``chunk_bytes`` (a larger tensor
    alone)."""
    batch: list[Spec] = []
    size = 0
    for spec in specs:
        if batch and (size + spec.nbytes > chunk_bytes or spec.device != batch[0].device):
            yield batch
            batch, size = [], 0
        batch.append(spec)
        size += spec.nbytes
    if batch:
        yield batch


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A tensor's data as a flat uint8 view (a contiguous copy where it is not contiguous)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _unpack(buffer: torch.Tensor, batch: list[Spec], out: Mapping[str, torch.Tensor]) -> None:
    offset = 0
    for spec in batch:
        _fill(out[spec.name], buffer[offset : offset + spec.nbytes])
        offset += spec.nbytes


def _fill(target: torch.Tensor, data: torch.Tensor) -> None:
    """Copy raw bytes ``data`` into ``target`` (its dtype and shape), contiguous or not."""
    target = target.detach()
    if target.is_contiguous():
        target.view(-1).view(torch.uint8).copy_(data)
    else:  # a fresh copy is aligned for any dtype; a slice of the buffer may not be
        target.copy_(data.clone().view(target.dtype).reshape(target.shape))
