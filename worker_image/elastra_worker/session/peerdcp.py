"""DCP storage in the trainers' memory: a world's state saved to host memory, and loaded by the
next world, resharded to its plan, from the members that hold it, over the process group.

Why: a tensor-, pipeline- or sharded-data-parallel plan holds each parameter as shards laid out
for its mesh; a world of another size or plan needs other shards. PyTorch's distributed
checkpoint (DCP) already computes that redistribution for any two layouts (its load plan says,
for every piece of every tensor this rank needs, which saved chunk holds it and where); what it
lacks is storage other than files. ``MemoryWriter`` is a DCP storage writer that keeps each
rank's chunks in this process (a copy in host memory, as an asynchronous save stages it) and
names, in the metadata, the rank that holds each; ``PeerReader`` is the reader a member of the
next world loads through: the coordinator routes every read to a member that holds the chunk,
and each rank then sends the slices the others asked of it and receives its own (the small
ones packed in one message per pair of ranks, each large one a message of its own received in
place), instead of reading a checkpoint back from the volume. DCP keeps doing what
it does for files: planning, resharding (uneven and strided shards included), and gathering
any rank's error to every rank.

A chunk whose holder is not in the new world (a member that left with its part) is read from
``storage``, the same step's durable checkpoint, by the rank that needs it: only those chunks'
bytes, through the storage's own DCP reader. Without a ``storage`` the coordinator's plan fails
on every rank alike, before any data moves, and the caller restores the whole state from the
durable checkpoint instead.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.metadata import (
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future


@dataclass(frozen=True)
class HeldChunk:
    """Where a saved chunk is: the rank of the saving world that holds it, and its size."""

    rank: int
    nbytes: int


@dataclass
class HeldState:
    """One rank's part of a state saved in memory: its chunks and the whole save's metadata."""

    rank: int
    """This rank in the world that saved it."""
    chunks: dict[MetadataIndex, torch.Tensor | bytes]
    metadata: Metadata | None = None
    """The whole save's, on every rank (``save_in_memory`` sets it)."""

    @property
    def nbytes(self) -> int:
        return sum(_nbytes(c) for c in self.chunks.values())


@dataclass(frozen=True)
class _Send:
    """A slice this rank sends: of which held chunk, to whom."""

    dst: int
    storage_index: MetadataIndex
    storage_offsets: torch.Size
    lengths: torch.Size


_DIRECT_BYTES = 1 << 20
"""A slice of at least this many bytes travels as a message of its own, not copied into its
pair's packed buffer, and is received straight into its target where it can be: the bulk of a
state crosses with gloo's copy alone."""


def _direct(nbytes: int) -> bool:
    return nbytes >= _DIRECT_BYTES


@dataclass(frozen=True)
class _Direct:
    """A large slice received as a message of its own."""

    item: ReadItem
    buffer: torch.Tensor
    target: torch.Tensor | None
    """Its resolved target (``None`` for a byte item)."""
    in_place: bool
    """``buffer`` is ``target``'s own memory: received, it is loaded."""


@dataclass
class _Inbox:
    """What a rank receives from one member: the small slices in one packed buffer (tag 0),
    each ``(item, size)``, then each large one in its own (tags 1, 2, ...)."""

    packed: list[tuple[ReadItem, int]] = field(default_factory=list)
    direct: list[_Direct] = field(default_factory=list)
    packed_buffer: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.uint8))
    """Allocated once every packed slice is counted."""

    @property
    def packed_bytes(self) -> int:
        return sum(size for _, size in self.packed)

    def messages(self) -> list[tuple[int, torch.Tensor]]:
        """``(tag, buffer)`` to receive into, as the source's ``_outgoing`` sends them."""
        head = [(0, self.packed_buffer)] if self.packed else []
        return head + [(tag, d.buffer) for tag, d in enumerate(self.direct, start=1)]

    @property
    def nbytes(self) -> int:
        return self.packed_bytes + sum(d.buffer.numel() for d in self.direct)


@dataclass(frozen=True)
class _Route:
    """The coordinator's routing of one rank's reads: each read item's source rank (in the
    loading group) and the slices this rank sends to others, in the order they read them."""

    sources: tuple[int, ...]
    sends: tuple[_Send, ...]


class MemoryWriter(StorageWriter):
    """Keeps this rank's chunks of a ``dcp.save`` in host memory (``held``)."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.held = HeldState(rank, {})

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self.held = HeldState(self.held.rank, {})

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        pass

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return plans

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        results = []
        for item in plan.items:
            data = planner.resolve_data(item)
            chunk: torch.Tensor | bytes
            if item.type == WriteItemType.BYTE_IO:
                assert isinstance(data, io.BytesIO)
                chunk = data.getvalue()
            else:
                assert isinstance(data, torch.Tensor)
                chunk = data.detach().to("cpu", copy=True).contiguous()
            self.held.chunks[item.index] = chunk
            where = HeldChunk(self.held.rank, _nbytes(chunk))
            results.append(WriteResult(item.index, where.nbytes, where))
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        metadata.storage_data = {r.index: r.storage_data for rs in results for r in rs}

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False  # memory has no checkpoint ids


def save_in_memory(state: dict[str, Any], *, group: dist.ProcessGroup | None) -> HeldState:
    """``state`` (a DCP state dict) saved to this rank's memory over ``group``: its part and
    the save's metadata. Collective."""
    writer = MemoryWriter(dist.get_rank(group))
    metadata = dcp_save(state, storage_writer=writer, process_group=group)
    writer.held.metadata = metadata
    return writer.held


class NotHeldError(RuntimeError):
    """A chunk the load needs is held by no member of the loading world."""


_STORAGE = -1
"""A read item's source where no member of the loading group holds its chunk."""


class PeerReader(StorageReader):
    """Loads a state saved by ``MemoryWriter`` from the members of ``group`` that hold it.
    ``held`` is this rank's part (``None`` for a member that holds nothing, a joiner);
    ``metadata`` the save's, on every rank; ``group`` a gloo group (the slices travel in host
    memory); ``storage`` a reader of the same state's durable copy (the same step, saved by the
    same world) for the chunks no member holds, or ``None``: such a chunk fails the load."""

    def __init__(
        self,
        held: HeldState | None,
        metadata: Metadata,
        group: dist.ProcessGroup | None,
        *,
        storage: StorageReader | None = None,
    ) -> None:
        super().__init__()
        self._held = held
        self._metadata = metadata
        self._group = group
        self._storage = storage
        self.received_bytes = 0
        """Bytes this rank received from other members in the last load."""
        self.stored_bytes = 0
        """Bytes this rank read from ``storage`` in the last load."""

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self.received_bytes = self.stored_bytes = 0

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        return self._metadata

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        pass

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """Tell the coordinator which saving rank's chunks this rank holds."""
        return replace(plan, storage_data=None if self._held is None else self._held.rank)

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """Route each read to the lowest loading rank that holds its chunk."""
        holders: dict[int, int] = {}
        for rank, plan in enumerate(plans):
            if plan.storage_data is not None:
                holders.setdefault(plan.storage_data, rank)
        sends: list[list[_Send]] = [[] for _ in plans]
        sources: list[list[int]] = [[] for _ in plans]
        for rank, plan in enumerate(plans):
            for item in plan.items:
                saver = self._where(item.storage_index).rank
                src = holders.get(saver, _STORAGE)
                if src == _STORAGE and self._storage is None:
                    raise NotHeldError(
                        f"{item.storage_index.fqn}: its chunk was held by rank {saver} of the "
                        "saving world, which is in no part of this one"
                    )
                sources[rank].append(src)
                if src not in (rank, _STORAGE):
                    sends[src].append(
                        _Send(rank, item.storage_index, item.storage_offsets, item.lengths)
                    )
        return [
            replace(plan, storage_data=_Route(tuple(sources[r]), tuple(sends[r])))
            for r, plan in enumerate(plans)
        ]

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Send the slices others read from here and receive this rank's (``_DIRECT_BYTES``),
        then read from storage what no member holds. Every rank of the group is here at once
        (DCP calls it on all ranks between two collectives), so the point-to-point messages
        meet; a storage error comes after them and DCP gives it to every rank."""
        route = plan.storage_data
        assert isinstance(route, _Route)
        me = dist.get_rank(self._group)
        outgoing = self._outgoing(route.sends)
        inboxes = self._inboxes(plan.items, route.sources, me, planner)
        ops = [dist.P2POp(dist.isend, buf, group=self._group, group_peer=dst, tag=tag)
               for dst, messages in outgoing.items() for tag, buf in messages]  # fmt: skip
        ops += [dist.P2POp(dist.irecv, buf, group=self._group, group_peer=src, tag=tag)
                for src, box in inboxes.items() for tag, buf in box.messages()]  # fmt: skip
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        self.received_bytes = sum(box.nbytes for box in inboxes.values())
        for item, src in zip(plan.items, route.sources, strict=True):
            if src == me:
                self._deliver_own(item, planner)
        for box in inboxes.values():
            self._unpack(box, planner)
        stored = [i for i, src in zip(plan.items, route.sources, strict=True) if src == _STORAGE]
        if stored:
            self._read_stored(stored, planner)
        future: Future[None] = Future()
        future.set_result(None)
        return future

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False

    def _read_stored(self, items: list[ReadItem], planner: LoadPlanner) -> None:
        """Read ``items`` from the durable copy through its own reader: only their bytes."""
        storage = self._storage
        assert storage is not None  # prepare_global_plan routes nothing here without one
        storage.set_up_storage_reader(storage.read_metadata(), False)
        storage.read_data(LoadPlan(items), planner).wait()
        self.stored_bytes = sum(self._read_size(item) for item in items)

    def _where(self, index: MetadataIndex) -> HeldChunk:
        where = self._metadata.storage_data[index]
        assert isinstance(where, HeldChunk)
        return where

    def _outgoing(self, sends: Iterable[_Send]) -> dict[int, list[tuple[int, torch.Tensor]]]:
        """The messages to each destination, ``(tag, bytes)``: the small slices it reads from
        here packed in its order (tag 0), then each large one as it lies (tags 1, 2, ...)."""
        packed: dict[int, list[torch.Tensor]] = {}
        direct: dict[int, list[torch.Tensor]] = {}
        for s in sends:
            piece = self._slice(s.storage_index, s.storage_offsets, s.lengths)
            (direct if _direct(piece.numel()) else packed).setdefault(s.dst, []).append(piece)
        return {
            dst: ([(0, torch.cat(packed[dst]))] if dst in packed else [])
            + [(tag, piece) for tag, piece in enumerate(direct.get(dst, []), start=1)]
            for dst in packed.keys() | direct.keys()
        }

    def _inboxes(
        self, items: list[ReadItem], sources: Iterable[int], me: int, planner: LoadPlanner
    ) -> dict[int, _Inbox]:
        """What this rank receives from each source, in the order the source sends it: a large
        slice straight into its target where that is a contiguous CPU tensor of its type."""
        boxes: dict[int, _Inbox] = {}
        for item, src in zip(items, sources, strict=True):
            if src in (me, _STORAGE):
                continue
            box = boxes.setdefault(src, _Inbox())
            size = self._read_size(item)
            if _direct(size):
                box.direct.append(self._direct_slice(item, size, planner))
            else:
                box.packed.append((item, size))
        for box in boxes.values():
            box.packed_buffer = torch.empty(box.packed_bytes, dtype=torch.uint8)
        return boxes

    def _direct_slice(self, item: ReadItem, size: int, planner: LoadPlanner) -> _Direct:
        """Where a large slice is received: its target's own memory where that is a
        contiguous CPU tensor of its type, else a buffer of its own."""
        if item.type == LoadItemType.BYTE_IO:
            return _Direct(item, torch.empty(size, dtype=torch.uint8), None, in_place=False)
        target = planner.resolve_tensor(item).detach()
        cpu = target.device.type == "cpu"
        if cpu and target.is_contiguous() and target.dtype == self._dtype(item):
            return _Direct(item, _bytes_of(target), target, in_place=True)
        return _Direct(item, torch.empty(size, dtype=torch.uint8), target, in_place=False)

    def _unpack(self, box: _Inbox, planner: LoadPlanner) -> None:
        """Deliver what came from one source: the packed slices cut apart, the large ones."""
        offset = 0
        for item, size in box.packed:
            self._deliver(item, box.packed_buffer[offset : offset + size], planner)
            offset += size
        for d in box.direct:
            if d.in_place:
                assert d.target is not None
                planner.commit_tensor(d.item, d.target)
            else:
                self._deliver(d.item, d.buffer, planner, target=d.target)

    def _read_size(self, item: ReadItem) -> int:
        if item.type == LoadItemType.BYTE_IO:
            return self._where(item.storage_index).nbytes
        numel = 1
        for n in item.lengths:
            numel *= n
        return numel * self._dtype(item).itemsize

    def _dtype(self, item: ReadItem) -> torch.dtype:
        meta = self._metadata.state_dict_metadata[item.storage_index.fqn]
        assert isinstance(meta, TensorStorageMetadata)
        return meta.properties.dtype

    def _slice(
        self, index: MetadataIndex, offsets: torch.Size, lengths: torch.Size
    ) -> torch.Tensor:
        """A held chunk's bytes, or the slice of it at ``offsets`` of ``lengths``, flat (to
        send: a copy only where the slice is strided)."""
        piece = self._piece(index, offsets, lengths)
        if isinstance(piece, bytes):
            return torch.frombuffer(bytearray(piece), dtype=torch.uint8)
        return _bytes_of(piece.contiguous())

    def _piece(
        self, index: MetadataIndex, offsets: torch.Size, lengths: torch.Size
    ) -> torch.Tensor | bytes:
        """A held chunk (bytes), or the view of it at ``offsets`` of ``lengths``."""
        if self._held is None or index not in self._held.chunks:
            raise NotHeldError(f"{index.fqn}: routed to rank {self._held_rank()}, which lacks it")
        piece = self._held.chunks[index]
        if isinstance(piece, bytes):
            return piece
        for dim, (start, length) in enumerate(zip(offsets, lengths, strict=True)):
            piece = piece.narrow(dim, start, length)
        return piece

    def _held_rank(self) -> int | None:
        return None if self._held is None else self._held.rank

    def _deliver_own(self, item: ReadItem, planner: LoadPlanner) -> None:
        """An item this rank holds itself: copied from its chunk into the target, once."""
        piece = self._piece(item.storage_index, item.storage_offsets, item.lengths)
        if isinstance(piece, bytes):
            planner.load_bytes(item, io.BytesIO(piece))
        else:
            _copy_into(item, piece, planner)

    def _deliver(
        self,
        item: ReadItem,
        data: torch.Tensor,
        planner: LoadPlanner,
        *,
        target: torch.Tensor | None = None,
    ) -> None:
        """A received item (flat bytes) into its target (``target`` where already resolved)."""
        if item.type == LoadItemType.BYTE_IO:
            planner.load_bytes(item, io.BytesIO(data.numpy().tobytes()))
            return
        dtype = self._dtype(item)
        if data.storage_offset() % dtype.itemsize:  # packed after an odd-sized slice
            data = data.clone()
        _copy_into(item, data.view(dtype).reshape(tuple(item.lengths)), planner, target=target)


def _copy_into(
    item: ReadItem,
    source: torch.Tensor,
    planner: LoadPlanner,
    *,
    target: torch.Tensor | None = None,
) -> None:
    """``source`` (``item``'s values, in its shape) into its target, then loaded."""
    if target is None:
        target = planner.resolve_tensor(item).detach()
    target.copy_(source)
    planner.commit_tensor(item, target)


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's memory as a flat byte tensor (the same memory)."""
    return tensor.reshape(-1).view(torch.uint8)


def _nbytes(chunk: torch.Tensor | bytes) -> int:
    return len(chunk) if isinstance(chunk, bytes) else chunk.numel() * chunk.element_size()
