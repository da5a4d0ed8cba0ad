"""The on-disk layout of a job's checkpoint root and its crash-safe commit protocol.

torch.distributed.checkpoint (DCP) writes a directory of shard files and a ``.metadata`` file; it
adds no checksums, does not fsync the directory, and overwriting a directory in place is not
crash safe. This module adds what a job that is killed at any instant needs::

    ROOT/
      step-000000020/      one committed checkpoint: DCP files + MANIFEST.json
      step-000000040/
      latest               "step-000000040": the commit point, replaced atomically
      .partial/            saves in progress (a fresh directory per step and world version)

A save writes into ``.partial/step-N.vV/``; every file is fsynced; a manifest with the size and
sha256 of every file is written (temp file, fsync, rename); the directory is renamed to
``step-N``; the root is fsynced; then ``latest`` is replaced the same way. A crash at any point
leaves either the old ``latest`` or the new one, each pointing at a complete, verifiable
directory. Loading follows ``latest`` first and falls back to older committed steps when a
checkpoint is missing files, has a wrong size or a wrong hash. Only names matching
``step-<digits>`` directly under the root are ever opened (never symlinks, never a path read from
a file), because DCP reads ``.metadata`` with pickle: loading a foreign file could run code.

Everything here is plain file-system work, no torch, so it is tested without processes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MANIFEST = "MANIFEST.json"
LATEST = "latest"
PARTIAL = ".partial"
FORMAT = 1
_STEP_RE = re.compile(r"^step-(\d{9,})$")
_CHUNK = 8 << 20


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used; the message says which file and why."""


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
            raw = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
            files = {
                str(n): FileEntry(size=int(e["size"]), sha256=str(e["sha256"]))
                for n, e in raw["files"].items()
            }
            if raw.get("format") != FORMAT:
                raise CheckpointError(f"{path}: unknown manifest format {raw.get('format')!r}")
            return Manifest(
                job=str(raw["job"]),
                step=int(raw["step"]),
                world_size=int(raw["worldSize"]),
                world_version=int(raw["worldVersion"]),
                files=files,
                extra=dict(raw.get("extra", {})),
            )
        except FileNotFoundError as err:
            raise CheckpointError(f"{path}: no {MANIFEST} (an interrupted save)") from err
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise CheckpointError(f"{path}/{MANIFEST}: malformed ({err})") from err


class CheckpointRoot:
    """One job's checkpoint root directory: listing, verifying, committing, pruning."""

    def __init__(self, path: str | os.PathLike[str], *, job: str) -> None:
        self.path = Path(path).resolve()
        self.job = job

    @property
    def partial_dir(self) -> Path:
        """Where saves in progress live."""
        return self.path / PARTIAL

    def partial_path(self, step: int, world_version: int) -> Path:
        """A fresh in-progress directory for a save of ``step`` by world ``world_version``."""
        return self.partial_dir / f"{step_dir_name(step)}.v{world_version}"

    def committed_steps(self) -> list[int]:
        """Steps of all committed-looking directories, newest first (not yet verified)."""
        if not self.path.is_dir():
            return []
        steps = []
        for entry in os.scandir(self.path):
            step = parse_step_dir_name(entry.name)
            if step is not None and entry.is_dir(follow_symlinks=False):
                steps.append(step)
        return sorted(steps, reverse=True)

    def latest_step(self) -> int | None:
        """The step ``latest`` points to, or None when there is no (valid) pointer."""
        try:
            text = (self.path / LATEST).read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None
        return parse_step_dir_name(text)

    def candidates(self) -> list[int]:
        """Steps to try loading, best first: ``latest``'s target, then the older ones."""
        latest = self.latest_step()
        steps = self.committed_steps()
        if latest is None:
            return steps
        return [latest] + [s for s in steps if s < latest]

    def step_path(self, step: int) -> Path:
        """The committed directory of ``step``."""
        return self.path / step_dir_name(step)

    def check_structure(self, step: int) -> Manifest:
        """Manifest present, for this job, every file present with its recorded size."""
        path = self.step_path(step)
        if path.is_symlink() or not path.is_dir():
            raise CheckpointError(f"{path}: not a directory inside the checkpoint root")
        manifest = Manifest.read(path)
        if manifest.job != self.job:
            raise CheckpointError(
                f"{path}: belongs to job {manifest.job!r}, not {self.job!r}; refusing to load it"
            )
        if manifest.step != step:
            raise CheckpointError(f"{path}: manifest says step {manifest.step}")
        if ".metadata" not in manifest.files:
            raise CheckpointError(f"{path}: manifest lists no .metadata file")
        for name, entry in manifest.files.items():
            if "/" in name or name.startswith(".."):
                raise CheckpointError(f"{path}: manifest names a file outside it: {name!r}")
            try:
                size = (path / name).stat().st_size
            except FileNotFoundError as err:
                raise CheckpointError(f"{path}/{name}: missing") from err
            if size != entry.size:
                raise CheckpointError(f"{path}/{name}: size {size}, manifest says {entry.size}")
        return manifest

    def check_hashes(self, step: int, names: Iterable[str]) -> None:
        """Recompute the sha256 of ``names`` (a share of the files) against the manifest."""
        path = self.step_path(step)
        manifest = Manifest.read(path)
        for name in names:
            digest = sha256_file(path / name)
            if digest != manifest.files[name].sha256:
                raise CheckpointError(f"{path}/{name}: sha256 mismatch (corrupt shard)")

    def commit(self, partial: Path, manifest: Manifest) -> Path:
        """Rank 0's half of a save, after every file of ``partial`` is written and hashed.

        Writes the manifest, renames the directory into place, moves ``latest``. Idempotent for
        a step that is already committed and intact (the existing directory is kept).
        """
        write_atomic(partial / MANIFEST, manifest.to_bytes())
        final = self.step_path(manifest.step)
        if final.exists():
            try:
                self.check_structure(manifest.step)
                shutil.rmtree(partial)
            except CheckpointError:
                trash = self.partial_dir / f"{final.name}.replaced-{os.getpid()}-{time.time_ns()}"
                os.replace(final, trash)
                os.replace(partial, final)
        else:
            os.replace(partial, final)
        fsync_dir(self.path)
        write_atomic(self.path / LATEST, (final.name + "\n").encode())
        return final

    def prune(self, keep: int) -> list[int]:
        """Delete all but the newest ``keep`` committed steps and stale partial saves.

        Called by rank 0 right after a commit, when no other save can be in progress (saves
        are collective). Never deletes what ``latest`` points to.
        """
        latest = self.latest_step()
        removed = []
        for step in self.committed_steps()[keep:]:
            if step != latest:
                shutil.rmtree(self.step_path(step), ignore_errors=True)
                removed.append(step)
        if self.partial_dir.is_dir():
            for entry in os.scandir(self.partial_dir):
                shutil.rmtree(entry.path, ignore_errors=True)
        return removed
