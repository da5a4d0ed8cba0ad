"""The on-disk layout of a job's checkpoint root and its crash-safe commit protocol.

torch.distributed.checkpoint (DCP) writes a directory of shard files and a ``.metadata`` file; it
adds no checksums, does not fsync the directory, and overwriting a directory in place is not
crash safe. This module adds what a job that is killed at any instant needs::

    PATH/                  checkpoint.path: the claim, possibly shared by several jobs
      JOB/                 ROOT: this job's own root; no other job opens, commits or prunes it
        step-000000020/    one committed checkpoint: DCP files + MANIFEST.json
        step-000000040/
        latest             "step-000000040": the commit point, replaced atomically
        .partial/          saves in progress (a fresh directory per step and world version)

Before the per-job directory existed, ROOT was PATH itself. Such checkpoints are still read (a
job upgraded mid-run resumes from them: only those whose manifest names this job), never
written or pruned: PATH may hold other jobs' files.

A save writes into ``.partial/step-N.vV/``; every file is fsynced; a manifest with the size and
sha256 of every file is written (temp file, fsync, rename); the directory is renamed to
``step-N``; the root is fsynced; then ``latest`` is replaced the same way. A crash at any point
leaves either the old ``latest`` or the new one, each pointing at a complete, verifiable
directory. Loading follows ``latest`` first and falls back to older committed steps when a
checkpoint is missing files, has a wrong size or a wrong hash; any candidate that cannot be read
(an odd file in place of ``latest`` or of a manifest, a decode error, an I/O error) is logged and
skipped the same way. Only names matching
``step-<digits>`` directly under the root are ever opened (never symlinks, never a path read from
a file), because DCP reads ``.metadata`` with pickle: loading a foreign file could run code.

The rules that do not depend on the storage (``verify_manifest``, ``order_candidates``,
``steps_to_prune``, ``pointer_step``) are functions here, and ``CheckpointStore`` is what the
collective code needs of a root: ``CheckpointRoot`` below implements it on a file system,
``objectstore.ObjectCheckpointRoot`` in an object store (``checkpoint.uri``).

Everything here is plain file-system work, no torch, so it is tested without processes.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
LATEST = "latest"
PARTIAL = ".partial"
FORMAT = 1
_STEP_RE = re.compile(r"^step-(\d{9,})$")
_CHUNK = 8 << 20
_POINTER_MAX = 4096  # ``latest`` holds one short name; read no more than this
PROBE = ".elastra-probe"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used; the message says which file and why."""


class UnusableRootError(CheckpointError):
    """The checkpoint root cannot be written; no save could ever succeed (a permanent error)."""


class CheckpointStore(Protocol):
    """What the collective checkpoint code needs of one job's checkpoint root, wherever it is.

    Two implementations share the protocol's rules (``verify_manifest``, ``order_candidates``,
    ``steps_to_prune``, ``pointer_step``): ``CheckpointRoot`` on a file system and
    ``objectstore.ObjectCheckpointRoot`` in an object store. A location is a string that DCP's
    writer and reader take: a directory, or a URL when ``fsspec_options`` is not None.
    """

    job: str

    @property
    def fsspec_options(self) -> Mapping[str, Any] | None:
        """None for a local file system; else the options DCP's fsspec writer/reader need."""
        ...

    def probe(self) -> None:
        """Raise UnusableRootError when no save could ever succeed (checked at start)."""
        ...

    def latest_step(self) -> int | None:
        """The step the ``latest`` pointer names, if any."""
        ...

    def candidates(self) -> list[int]:
        """Steps to try loading, best first."""
        ...

    def check_structure(self, step: int) -> Manifest:
        """The step's manifest, after checking every listed file is there with its size."""
        ...

    def check_hashes(self, step: int, names: Iterable[str]) -> None:
        """Recompute the sha256 of ``names`` against the step's manifest."""
        ...

    def prune(
        self, keep: int, *, trusted: Collection[int] = (), restored: int | None = None
    ) -> list[int]:
        """Delete the steps ``steps_to_prune`` names; return them."""
        ...

    def save_location(self, step: int, world_version: int) -> str:
        """Where every rank's DCP writer puts a save of ``step`` by ``world_version``."""
        ...

    def begin_save(self, step: int, world_version: int) -> str:
        """Rank 0, before the ranks write: make ``save_location`` empty and ready."""
        ...

    def saved_names(self, location: str) -> list[str]:
        """The files a save wrote, sorted."""
        ...

    def hash_saved(self, location: str, names: list[str]) -> dict[str, FileEntry]:
        """Size and sha256 of ``names`` in ``location``, read back."""
        ...

    def commit_save(self, location: str, manifest: Manifest) -> str:
        """Rank 0: the manifest, then ``latest`` last; returns the committed location."""
        ...

    def step_location(self, step: int) -> str:
        """Where DCP's reader finds the committed ``step``."""
        ...


def probe_writable(directory: Path) -> None:
    """Create ``directory`` and write, fsync and delete a file in it; raise UnusableRootError.

    A read-only mount, a full disk, wrong ownership or a file where the root should be is
    found when a world starts, with the path and the errno text, instead of at the first save.
    """
    # Unique across pods: trainers in different pods often have the same pid, and one's
    # unlink of the other's probe made a healthy shared root look unusable (ENOENT).
    probe = directory / f"{PROBE}-{os.getpid()}-{uuid.uuid4().hex}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"probe")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.unlink(probe)
        fsync_dir(directory)
    except OSError as err:
        why = err.strerror or str(err)
        code = errno.errorcode.get(err.errno or 0, "?")
        raise UnusableRootError(
            f"checkpoint root {directory} is not usable: {why} [{code}]; check the volume "
            "mount (a writable directory owned by the worker's user, with free space)"
        ) from err


def step_dir_name(step: int) -> str:
    """The directory name of the checkpoint taken after ``step`` optimizer steps."""
    return f"step-{step:09d}"


def parse_step_dir_name(name: str) -> int | None:
    """The step of a committed checkpoint directory name, or None if it is not one."""
    m = _STEP_RE.match(name)
    return int(m.group(1)) if m else None


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: temp file, fsync, rename, fsync the directory."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in large chunks (hashlib releases the GIL on big updates)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def hash_files(directory: Path, names: list[str]) -> dict[str, FileEntry]:
    """Size and sha256 of ``names`` in ``directory``, a few files at a time."""

    def one(name: str) -> tuple[str, FileEntry]:
        path = directory / name
        return name, FileEntry(size=path.stat().st_size, sha256=sha256_file(path))

    if not names:
        return {}
    with ThreadPoolExecutor(max_workers=min(4, len(names))) as pool:
        return dict(pool.map(one, names))


def file_owner(name: str, index: int, world_size: int) -> int:
    """Which rank hashes/verifies file ``name`` (``index`` in sorted order).

    DCP names a rank's shard files ``__<rank>_<n>.distcp``; the writer hashes its own files
    (still in its page cache, on its node). Other files are spread round-robin.
    """
    m = re.match(r"^__(\d+)_", name)
    if m and int(m.group(1)) < world_size:
        return int(m.group(1))
    return index % world_size


@dataclass(frozen=True)
class FileEntry:
    """Size and sha256 of one checkpoint file."""

    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """What a committed checkpoint holds; written last, before the directory is renamed."""

    job: str
    step: int
    world_size: int
    world_version: int
    files: Mapping[str, FileEntry]
    extra: Mapping[str, Any]

    def to_bytes(self) -> bytes:
        """The JSON form stored as MANIFEST.json."""
        return json.dumps(
            {
                "format": FORMAT,
                "job": self.job,
                "step": self.step,
                "worldSize": self.world_size,
                "worldVersion": self.world_version,
                "createdAt": time.time(),
                "files": {
                    n: {"size": e.size, "sha256": e.sha256} for n, e in sorted(self.files.items())
                },
                "extra": dict(self.extra),
            },
            indent=1,
            sort_keys=True,
        ).encode()

    @staticmethod
    def read(path: Path) -> Manifest:
        """Parse ``path/MANIFEST.json``; raise CheckpointError when absent or malformed."""
        try:
            data = (path / MANIFEST).read_bytes()
        except FileNotFoundError as err:
            raise CheckpointError(f"{path}: no {MANIFEST} (an interrupted save)") from err
        except OSError as err:  # a directory in its place, an I/O error
            raise CheckpointError(f"{path}/{MANIFEST}: unreadable ({err.strerror})") from err
        return Manifest.parse(data, where=str(path))

    @staticmethod
    def parse(data: bytes, *, where: str) -> Manifest:
        """The manifest stored as ``data`` (any storage); CheckpointError names ``where``."""
        try:
            raw = json.loads(data.decode("utf-8"))
            files = {
                str(n): FileEntry(size=int(e["size"]), sha256=str(e["sha256"]))
                for n, e in raw["files"].items()
            }
            if raw.get("format") != FORMAT:
                raise CheckpointError(f"{where}: unknown manifest format {raw.get('format')!r}")
            return Manifest(
                job=str(raw["job"]),
                step=int(raw["step"]),
                world_size=int(raw["worldSize"]),
                world_version=int(raw["worldVersion"]),
                files=files,
                extra=dict(raw.get("extra", {})),
            )
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as err:
            # ValueError covers UnicodeDecodeError and JSONDecodeError
            raise CheckpointError(f"{where}/{MANIFEST}: malformed ({err})") from err


def verify_manifest(
    manifest: Manifest, *, where: str, job: str, step: int, size_of: Callable[[str], int | None]
) -> Manifest:
    """The structural checks every storage makes: this job's, this step, every file's size.

    ``size_of`` gives a listed file's size in the storage, None when it is missing. File names
    are checked before ``size_of`` sees them, so a manifest cannot point outside its step.
    """
    if manifest.job != job:
        raise CheckpointError(
            f"{where}: belongs to job {manifest.job!r}, not {job!r}; refusing to load it"
        )
    if manifest.step != step:
        raise CheckpointError(f"{where}: manifest says step {manifest.step}")
    if ".metadata" not in manifest.files:
        raise CheckpointError(f"{where}: manifest lists no .metadata file")
    for name, entry in manifest.files.items():
        if not _safe_name(name):
            raise CheckpointError(f"{where}: manifest names a file outside it: {name[:80]!r}")
        size = size_of(name)
        if size is None:
            raise CheckpointError(f"{where}/{name}: missing")
        if size != entry.size:
            raise CheckpointError(f"{where}/{name}: size {size}, manifest says {entry.size}")
    return manifest


def pointer_step(data: bytes, *, where: str) -> int | None:
    """The step a ``latest`` pointer's content names; None (logged) when it names none."""
    try:
        text = data[:_POINTER_MAX].decode("utf-8")
    except UnicodeDecodeError as err:
        log.warning(
            "ignoring checkpoint pointer %s: not UTF-8 (%s); trying older checkpoints",
            where,
            err.reason,
        )
        return None
    step = parse_step_dir_name(text.strip())
    if step is None:
        log.warning("ignoring checkpoint pointer %s: it names no step directory", where)
    return step


def order_candidates(latest: int | None, steps: Iterable[int]) -> list[int]:
    """Steps to try loading, best first: ``latest``'s target, then the older committed ones.

    Committed steps newer than ``latest`` are a save killed between its manifest and its
    pointer (or an abandoned timeline): never loaded while a pointer names an older step.
    """
    ordered = sorted(set(steps), reverse=True)
    if latest is None:
        return ordered
    return [latest] + [s for s in ordered if s < latest]


def steps_to_prune(
    own: Iterable[int],
    *,
    latest: int | None,
    keep: int,
    trusted: Collection[int],
    restored: int | None,
) -> list[int]:
    """Which of a root's own committed steps to delete, newest first (the pruning rule).

    ``trusted`` are the steps the running world verified: the one it restored (``restored``)
    and the ones it saved. The newest ``keep`` of them (and ``latest``) stay, and the restored
    one always does. Others newer than ``restored`` (all others when nothing was restored) are
    corrupt or from an abandoned timeline. Older ones are the previous fallbacks: kept only in
    the slots the trusted ones leave free, never counted as good.
    """
    steps = sorted(set(own), reverse=True)
    good = sorted(set(trusted) | ({latest} if latest is not None else set()), reverse=True)
    kept = set(good[:keep]) | ({restored} if restored is not None else set())
    floor = restored if restored is not None else max(good, default=-1)
    fallbacks = [s for s in steps if s not in kept and s < floor]
    kept |= set(fallbacks[: max(0, keep - len(good))])
    return [s for s in steps if s not in kept]


def _safe_name(name: str) -> bool:
    """A single plain entry name: no separator, no NUL, not ``.``/``..``."""
    return bool(name) and "/" not in name and "\0" not in name and name not in (".", "..")


def _scan_steps(directory: Path) -> list[int]:
    """Steps of the ``step-<digits>`` directories (not symlinks) directly in ``directory``."""
    steps = []
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                step = parse_step_dir_name(entry.name)
                try:
                    if step is not None and entry.is_dir(follow_symlinks=False):
                        steps.append(step)
                except OSError as err:
                    log.warning("skipping checkpoint %s: %s", entry.path, err.strerror)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as err:
        log.warning("cannot list checkpoint directory %s: %s", directory, err.strerror)
        return []
    return sorted(steps, reverse=True)


def _read_pointer(path: Path) -> int | None:
    """The step a ``latest`` file names; None (logged, unless absent) when it names none."""
    try:
        with open(path, "rb") as f:
            data = f.read(_POINTER_MAX)
    except FileNotFoundError:
        return None
    except OSError as err:
        log.warning(
            "ignoring checkpoint pointer %s: %s; trying older checkpoints", path, err.strerror
        )
        return None
    return pointer_step(data, where=str(path))


def _remove(path: Path) -> None:
    """Delete a directory tree or a file, as far as possible (cleanup must not fail a save)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def job_root(path: str | os.PathLike[str], job: str) -> Path:
    """``<path>/<job>``: the job's own folder on ``checkpoint.path`` (a claim several jobs may
    share). The one place that names it: the Session's ``CheckpointRoot`` and torchrun mode's
    ``$ELASTRA_CHECKPOINT_DIR`` both take it from here. ValueError for a job name that is not
    one plain path component."""
    if not _safe_name(job):
        raise ValueError(f"job name {job[:80]!r} cannot name a directory")
    return Path(path).resolve() / job


class CheckpointRoot:
    """One job's checkpoint root, ``<path>/<job>/``: listing, verifying, committing, pruning.

    ``path`` is ``checkpoint.path``, which several jobs may share (one claim); everything this
    class writes or deletes is inside ``<path>/<job>/``. Checkpoints of the layout before that
    (directly in ``path``) are read as well, never written or deleted.
    """

    def __init__(self, path: str | os.PathLike[str], *, job: str) -> None:
        self.path = job_root(path, job)
        self.base = self.path.parent
        self.job = job

    @property
    def partial_dir(self) -> Path:
        """Where saves in progress live."""
        return self.path / PARTIAL

    def partial_path(self, step: int, world_version: int) -> Path:
        """A fresh in-progress directory for a save of ``step`` by world ``world_version``."""
        return self.partial_dir / f"{step_dir_name(step)}.v{world_version}"

    def probe(self) -> None:
        """Create the job's root and check that it takes a durable write (UnusableRootError)."""
        probe_writable(self.path)

    @property
    def fsspec_options(self) -> Mapping[str, Any] | None:
        """None: DCP's own file-system writer and reader."""
        return None

    def save_location(self, step: int, world_version: int) -> str:
        """The in-progress directory: a save becomes visible only when ``commit`` renames it."""
        return str(self.partial_path(step, world_version))

    def begin_save(self, step: int, world_version: int) -> str:
        """A fresh, empty in-progress directory (a killed earlier try of the same save goes)."""
        partial = self.partial_path(step, world_version)
        if partial.exists():
            shutil.rmtree(partial)
        partial.mkdir(parents=True)
        return str(partial)

    def saved_names(self, location: str) -> list[str]:
        """The files DCP wrote into the in-progress directory."""
        return sorted(os.listdir(location))

    def hash_saved(self, location: str, names: list[str]) -> dict[str, FileEntry]:
        """Size and sha256 of files read back from the in-progress directory."""
        return hash_files(Path(location), names)

    def commit_save(self, location: str, manifest: Manifest) -> str:
        """``commit``: manifest, rename into place, ``latest`` last."""
        return str(self.commit(Path(location), manifest))

    def step_location(self, step: int) -> str:
        """The committed directory of ``step`` (own, or the old layout's)."""
        return str(self.step_path(step))

    def own_steps(self) -> list[int]:
        """Committed-looking steps in this job's own root, newest first."""
        return _scan_steps(self.path)

    def committed_steps(self) -> list[int]:
        """Steps of all committed-looking directories, own and old layout, newest first."""
        return sorted(set(self.own_steps()) | set(_scan_steps(self.base)), reverse=True)

    def latest_step(self) -> int | None:
        """The step ``latest`` points to (the old layout's when the job has none of its own)."""
        step = _read_pointer(self.path / LATEST)
        if step is None and not os.path.lexists(self.path / LATEST):
            step = _read_pointer(self.base / LATEST)
        return step

    def candidates(self) -> list[int]:
        """Steps to try loading, best first: ``latest``'s target, then the older ones."""
        return order_candidates(self.latest_step(), self.committed_steps())

    def own_step_path(self, step: int) -> Path:
        """Where this job commits ``step``."""
        return self.path / step_dir_name(step)

    def step_path(self, step: int) -> Path:
        """The committed directory of ``step``: the job's own, else the old layout's."""
        own = self.own_step_path(step)
        legacy = self.base / step_dir_name(step)
        if not os.path.lexists(own) and legacy.is_dir() and not legacy.is_symlink():
            return legacy
        return own

    def check_structure(self, step: int) -> Manifest:
        """Manifest present, for this job, every file present with its recorded size."""
        path = self.step_path(step)
        try:
            return self._check_structure(path, step)
        except OSError as err:
            raise CheckpointError(f"{path}: unreadable ({err.strerror or err})") from err

    def _check_structure(self, path: Path, step: int) -> Manifest:
        if path.is_symlink() or not path.is_dir():
            raise CheckpointError(f"{path}: not a directory inside the checkpoint root")

        def size_of(name: str) -> int | None:
            try:
                return (path / name).stat().st_size
            except FileNotFoundError:
                return None

        manifest = Manifest.read(path)
        return verify_manifest(manifest, where=str(path), job=self.job, step=step, size_of=size_of)

    def check_hashes(self, step: int, names: Iterable[str]) -> None:
        """Recompute the sha256 of ``names`` (a share of the files) against the manifest."""
        path = self.step_path(step)
        manifest = Manifest.read(path)
        for name in names:
            try:
                digest = sha256_file(path / name)
            except OSError as err:
                raise CheckpointError(f"{path}/{name}: unreadable ({err.strerror})") from err
            if digest != manifest.files[name].sha256:
                raise CheckpointError(f"{path}/{name}: sha256 mismatch (corrupt shard)")

    def commit(self, partial: Path, manifest: Manifest) -> Path:
        """Rank 0's half of a save, after every file of ``partial`` is written and hashed.

        Writes the manifest, renames the directory into place, moves ``latest``. A directory
        already there for the step is replaced, never kept: this save was just written and
        hashed by the running world, while the old copy may be corrupt (the reason the world
        resumed from an older step) or from a timeline the job abandoned.
        """
        write_atomic(partial / MANIFEST, manifest.to_bytes())
        final = self.own_step_path(manifest.step)
        stale = [self._move_aside(final)]
        os.replace(partial, final)
        fsync_dir(self.path)
        pointer = self.path / LATEST
        if pointer.is_dir() and not pointer.is_symlink():  # an odd directory: no rename onto it
            stale.append(self._move_aside(pointer))
        write_atomic(pointer, (final.name + "\n").encode())
        for path in stale:
            if path is not None:
                _remove(path)
        return final

    def _move_aside(self, path: Path) -> Path | None:
        """Rename ``path`` (if any) into the partial directory; the caller deletes it later."""
        if not os.path.lexists(path):
            return None
        aside = self.partial_dir / f"{path.name}.replaced-{os.getpid()}-{time.time_ns()}"
        aside.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, aside)
        return aside

    def prune(
        self, keep: int, *, trusted: Collection[int] = (), restored: int | None = None
    ) -> list[int]:
        """Delete what is not worth keeping in the job's own root, and stale partial saves.

        Which steps go is ``steps_to_prune``'s rule, the same for every storage. Called by rank
        0 right after a commit, when no other save can be in progress (saves are collective).
        The old layout in ``checkpoint.path`` is never touched.
        """
        removed = steps_to_prune(
            self.own_steps(),
            latest=self.latest_step(),
            keep=keep,
            trusted=trusted,
            restored=restored,
        )
        for step in removed:
            shutil.rmtree(self.own_step_path(step), ignore_errors=True)
        if self.partial_dir.is_dir():
            for entry in os.scandir(self.partial_dir):
                _remove(Path(entry.path))
        return removed
