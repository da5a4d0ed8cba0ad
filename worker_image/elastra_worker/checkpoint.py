"""Sharded, verified checkpoints with torch.distributed.checkpoint, resharded on load.

Every rank writes its own shards with DCP (so N ranks save, M ranks load, and FSDP's sharded
state needs no gathering); the commit protocol of ``layout`` makes the result crash safe and
verifiable. Hashing is spread over the ranks: each rank hashes the files it wrote while they are
still in its page cache, and on load each rank re-hashes a share of the files, so a corrupt
shard is found without one rank reading the whole checkpoint.

Hashes are computed while DCP writes: the writer's file streams feed sha256 in the writer
threads (hashlib releases the GIL), so no file is read back after a save. A stream that seeks
(which would make the running hash wrong) falls back to reading the file back.

The root is a ``layout.CheckpointStore``: a directory (DCP's file-system writer and reader) or
an object-store prefix (DCP's fsspec writer and reader, straight to and from the objects: no
local staging copy, and a loading rank reads only the byte ranges it needs).

All coordination goes through a gloo process group passed in (``group``), so the same code runs
for CPU (gloo) and GPU (nccl) training, and an asynchronous save can run in a background thread
on its own group while training continues on the default one.

The asynchronous save (``save_async``) blocks only while the state is copied to host memory;
the copy is then written, hashed and committed by the same ``_save`` as a blocking one, so the
commit protocol, the manifest and the fallback on load are the same. At most one save is in
flight: the next save (periodic or the last one before a stop) first waits for it, so commits
happen in step order, host memory holds at most one staged copy, and a stop's checkpoint is the
newest committed one when the trainer exits. A background save that fails raises its error in
the training thread at that next wait, as a blocking save would have raised it at once.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import posixpath
import threading
import time
from collections.abc import Callable, Generator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import (
    FileSystem,
    FileSystemBase,
    FileSystemReader,
    FileSystemWriter,
)
from torch.distributed.checkpoint.fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from .layout import (
    CheckpointError,
    CheckpointStore,
    FileEntry,
    Manifest,
    file_owner,
)

log = logging.getLogger(__name__)

StateDict = dict[str, Any]


@dataclass(frozen=True)
class SaveResult:
    """A committed checkpoint: where, which step, how many bytes, how long the save took."""

    step: int
    location: str
    bytes: int
    seconds: float


def _world(group: dist.ProcessGroup | None) -> tuple[int, int]:
    return dist.get_rank(group), dist.get_world_size(group)


def agree_all(flag: bool, *, group: dist.ProcessGroup | None = None) -> bool:
    """Whether every rank's ``flag`` is set, known to all (collective)."""
    box = torch.tensor([1 if flag else 0], dtype=torch.int64)
    dist.all_reduce(box, op=dist.ReduceOp.MIN, group=group)
    return bool(int(box))


def _broadcast(obj: Any, group: dist.ProcessGroup | None) -> Any:
    box = [obj]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0) if group else 0, group=group)
    return box[0]


class _HashingStream(io.RawIOBase):
    """A write-only file that keeps a running sha256 and size of what went through it."""

    def __init__(self, raw: io.IOBase, on_close: Callable[[FileEntry | None], None]):
        super().__init__()
        self._raw = raw
        self._hash = hashlib.sha256()
        self._size = 0
        self._valid = True
        self._on_close = on_close

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        self._hash.update(view)
        self._size += view.nbytes
        return int(self._raw.write(view))  # typeshed's IOBase declares no write

    def tell(self) -> int:
        return self._raw.tell()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._valid = False  # the running hash no longer matches the file
        return self._raw.seek(offset, whence)

    def flush(self) -> None:
        if not self._raw.closed:
            self._raw.flush()

    def fileno(self) -> int:
        return self._raw.fileno()

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
            entry = FileEntry(self._size, self._hash.hexdigest()) if self._valid else None
            self._on_close(entry)
        super().close()


class _HashingFileSystem(FileSystem):
    """A DCP file system (local or fsspec) that records size and sha256 of every file written.

    It wraps the writer's own file system (every method goes to ``inner``), so the same hashing
    covers a local directory and an object store; it subclasses ``FileSystem`` only because
    that is the type DCP's writer declares for its ``fs``.
    """

    def __init__(self, inner: FileSystemBase) -> None:
        super().__init__()
        self.inner = inner
        self.entries: dict[str, FileEntry | None] = {}
        self._lock = threading.Lock()

    @contextmanager
    def create_stream(
        self, path: str | os.PathLike[str], mode: str
    ) -> Generator[io.IOBase, None, None]:
        if mode != "wb":
            with self.inner.create_stream(path, mode) as stream:
                yield stream
            return
        name = posixpath.basename(os.fspath(path))

        def record(entry: FileEntry | None) -> None:
            with self._lock:
                self.entries[name] = entry

        with self.inner.create_stream(path, mode) as raw, _HashingStream(raw, record) as stream:
            yield stream

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        self.inner.rename(path, new_path)
        old, new = posixpath.basename(os.fspath(path)), posixpath.basename(os.fspath(new_path))
        with self._lock:
            self.entries[new] = self.entries.pop(old, None)

    def concat_path(self, path: str | os.PathLike[str], suffix: str) -> str | os.PathLike[str]:
        return self.inner.concat_path(path, suffix)

    def init_path(self, path: str | os.PathLike[str]) -> str | os.PathLike[str]:
        return self.inner.init_path(path)

    def mkdir(self, path: str | os.PathLike[str]) -> None:
        self.inner.mkdir(path)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return True  # the wrapped file system was chosen for the location already

    def exists(self, path: str | os.PathLike[str]) -> bool:
        return self.inner.exists(path)

    def rm_file(self, path: str | os.PathLike[str]) -> None:
        self.inner.rm_file(path)


class Checkpointer:
    """Collective save/load of a state dict under one job's checkpoint root.

    Every method is collective over ``group`` (a gloo group): all ranks call it together.
    ``after_write`` is a test hook that runs on each rank after DCP has written the shards,
    before they are hashed and committed (fault injection kills a rank there).
    """

    def __init__(
        self,
        root: CheckpointStore,
        *,
        group: dist.ProcessGroup | None,
        world_version: int,
        keep: int,
        thread_count: int = 4,
        after_write: Callable[[int], None] | None = None,
        read_latest: bool = True,
    ) -> None:
        """``read_latest=False``: leave ``last_committed_step`` unknown (``None``) instead of
        reading the root's ``latest`` pointer; for a caller that learns it otherwise (a
        restore, or the peers that hold the state)."""
        self.root = root
        self.group = group
        self.world_version = world_version
        self.keep = keep
        self.thread_count = thread_count
        self.after_write = after_write
        self._async: threading.Thread | None = None
        self._async_error: BaseException | None = None
        self._async_result: SaveResult | None = None
        self._async_step = 0
        self.last_committed_step: int | None = root.latest_step() if read_latest else None
        # Steps this world verified (restored or saved): pruning keeps these, not step numbers.
        self.restored_step: int | None = None
        self.verified: set[int] = set()

    # ---- save -------------------------------------------------------------------------------

    def save(self, state: StateDict, *, step: int, extra: dict[str, Any]) -> SaveResult:
        """Write ``state`` as the checkpoint of ``step`` and commit it (collective)."""
        self.wait()
        return self._save(state, step=step, extra=extra, group=self.group)

    def save_async(
        self, state: StateDict, *, step: int, extra: dict[str, Any], group: dist.ProcessGroup
    ) -> None:
        """Stage ``state`` to CPU memory now; write and commit it in a background thread.

        ``group`` must be a gloo group used by nothing else while the save runs (collectives
        on one group from two threads would interleave). At most one save is in flight: a
        second call first waits for the previous one.
        """
        self.wait()
        staged = _stage_to_cpu(state)

        def run() -> None:
            try:
                result = self._save(staged, step=step, extra=extra, group=group)
            except BaseException as err:  # handed to the training thread by wait()
                self._async_error = err
                return
            self._async_result = result
            log.info(
                "rank %d committed step %d in the background (%.1f MB in %.2fs)",
                dist.get_rank(group),
                result.step,
                result.bytes / 1e6,
                result.seconds,
            )

        self._async_step = step
        self._async = threading.Thread(target=run, name=f"elastra-ckpt-{step}", daemon=True)
        self._async.start()

    @property
    def last_background(self) -> SaveResult | None:
        """The newest background save that committed (its bytes and write seconds), or None."""
        return self._async_result

    @property
    def in_flight(self) -> int | None:
        """The step of the asynchronous save not yet waited for (running or done), or None."""
        return None if self._async is None else self._async_step

    def wait(self) -> SaveResult | None:
        """Wait for an asynchronous save in flight; re-raise its error in this thread."""
        thread, self._async = self._async, None
        if thread is None:
            return None
        thread.join()
        err, self._async_error = self._async_error, None
        if err is not None:
            raise CheckpointError(f"asynchronous checkpoint save failed: {err}") from err
        return self._async_result

    def _save(
        self,
        state: StateDict,
        *,
        step: int,
        extra: dict[str, Any],
        group: dist.ProcessGroup | None,
    ) -> SaveResult:
        t0 = time.perf_counter()
        rank, world = _world(group)
        location = self.root.save_location(step, self.world_version)
        if rank == 0:
            self.root.begin_save(step, self.world_version)
        dist.barrier(group=group)
        writer = self._writer(location)
        hashing = _HashingFileSystem(writer.fs)
        writer.fs = hashing
        dcp_save(state, storage_writer=writer, process_group=group)
        if self.after_write is not None:
            self.after_write(step)
        # Each rank reports the files it wrote, hashed on the way out; a file whose stream
        # seeked, or one that nobody reports, is read back by its owner.
        names: list[str] = _broadcast(self.root.saved_names(location) if rank == 0 else None, group)
        reported = {n: e for n, e in hashing.entries.items() if e is not None}
        known: list[list[str] | None] = [None] * world
        dist.all_gather_object(known, sorted(reported), group=group)
        covered = {n for part in known for n in part or []}
        missing = [n for n in names if n not in covered]
        mine = [n for i, n in enumerate(missing) if file_owner(n, i, world) == rank]
        entries = {**reported, **self.root.hash_saved(location, mine)}
        gathered: list[dict[str, FileEntry] | None] = [None] * world
        dist.all_gather_object(gathered, entries, group=group)
        final = self.root.step_location(step)
        total = 0
        if rank == 0:
            files: dict[str, FileEntry] = {}
            for part in gathered:
                files.update(part or {})
            total = sum(e.size for e in files.values())
            manifest = Manifest(
                job=self.root.job,
                step=step,
                world_size=world,
                world_version=self.world_version,
                files=files,
                extra=extra,
            )
            final = self.root.commit_save(location, manifest)
            self.verified.add(step)
            self.root.prune(self.keep, trusted=self.verified, restored=self.restored_step)
        total = int(_broadcast(total, group))
        dist.barrier(group=group)  # nobody reports the step committed before it is
        self.last_committed_step = step
        seconds = time.perf_counter() - t0
        return SaveResult(step=step, location=final, bytes=total, seconds=seconds)

    def _writer(self, location: str) -> FileSystemWriter:
        """DCP's writer for ``location``: every file fsynced locally; one PUT per object remotely.

        An object is durable once its upload completes, so the fsspec writer skips fsync (its
        streams have no file descriptor).
        """
        options = self.root.fsspec_options
        if options is None:
            return FileSystemWriter(
                location,
                single_file_per_rank=True,
                sync_files=True,
                thread_count=self.thread_count,
                overwrite=True,
            )
        return FsspecWriter(
            location,
            single_file_per_rank=True,
            sync_files=False,
            thread_count=self.thread_count,
            overwrite=True,
            **options,
        )

    def reader(self, step: int) -> FileSystemReader:
        """DCP's reader of the committed ``step`` (reads only the byte ranges a rank needs)."""
        location = self.root.step_location(step)
        options = self.root.fsspec_options
        if options is None:
            return FileSystemReader(location)
        return FsspecReader(location, **options)

    # ---- load -------------------------------------------------------------------------------

    def find_loadable(self) -> Manifest | None:
        """The newest committed checkpoint that verifies on every rank (collective).

        A checkpoint with a missing file, a wrong size or a wrong sha256, or one that cannot be
        read at all, is logged and skipped, and the previous one is tried, so a crash or a
        corrupted shard costs progress, not the job.
        """
        rank, world = _world(self.group)
        candidates: list[int] = _broadcast(
            self.root.candidates() if rank == 0 else None, self.group
        )
        for step in candidates:
            manifest: Manifest | None = None
            reason = ""
            if rank == 0:
                try:
                    manifest = self.root.check_structure(step)
                except CheckpointError as err:
                    reason = str(err)
            manifest = _broadcast(manifest, self.group)
            ok = manifest is not None
            if manifest is not None:
                names = sorted(manifest.files)
                mine = [n for i, n in enumerate(names) if file_owner(n, i, world) == rank]
                try:
                    self.root.check_hashes(step, mine)
                except (CheckpointError, OSError) as err:
                    ok = False
                    log.warning("checkpoint step %d failed verification: %s", step, err)
            if agree_all(ok, group=self.group):
                self.restored_step = step
                self.verified.add(step)
                return manifest
            if rank == 0:
                log.warning(
                    "checkpoint step %d is not usable (%s); trying the previous one",
                    step,
                    reason or "see the ranks' logs",
                )
        return None

    def load(self, state: StateDict, manifest: Manifest) -> None:
        """Load the verified checkpoint into ``state`` in place, resharded to this world."""
        dcp_load(state, storage_reader=self.reader(manifest.step), process_group=self.group)


def _stage_to_cpu(state: Any) -> Any:
    """A deep copy of a state dict with every tensor cloned to CPU memory."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return {k: _stage_to_cpu(v) for k, v in state.items()}
    if isinstance(state, list):
        return [_stage_to_cpu(v) for v in state]
    if isinstance(state, tuple):
        return tuple(_stage_to_cpu(v) for v in state)
    return state
