"""torchrun mode with ``checkpoint.uri``: the script's local checkpoint folder, kept in the
object store by the agent.

A plain script checkpoints to files in ``$ELASTRA_CHECKPOINT_DIR``. When the job checkpoints to
object storage that folder is on the pod's own volume and dies with the pod, so the agents
carry it: when the script has exited 0 (after SIGTERM, its stop checkpoint; unasked, training
finished), the agent of the world's rank-0 pod uploads the folder; before the script starts
in a world, every agent downloads the last upload into its folder. The script then resumes
as it would from a shared claim, and never imports anything for it.

Under the job's prefix (``<uri>/<job>/``, the same prefix a ``Session`` job uses)::

    torchrun/v000000007/...      the folder as uploaded after world version 7
    torchrun/v000000007.json     its manifest: every file's relative path and size
    torchrun/latest              "v000000007": the commit point, written after the rest

An upload that stops half-way leaves ``latest`` at the previous upload, whole; a download
checks each file's size against the manifest. The folder's ``.elastra-upload`` names the upload
it holds (written after an upload or a download), so a pod downloads each upload once, and the
pod that made it never. Files whose names start with ``.`` (a temp file of a killed save, that
marker) and symlinks are not uploaded. fsspec (and s3fs) are imported only
when a job has ``checkpoint.uri``; nothing here imports torch.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import re
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FOLDER = "torchrun"
POINTER = "latest"
MARKER = ".elastra-upload"
"""In the local folder: the name of the upload whose files it holds."""
KEEP = 2
"""Uploads kept: the newest and the one before it (a download that began before the newest
was committed still finds its files)."""
_VERSION = re.compile(r"^v(\d{9,})$")
_POINTER_MAX = 4096


def _describe(err: BaseException) -> str:
    """One line for a client error (objectstore's wording; fsspec imported only then)."""
    from .objectstore import describe_error  # noqa: PLC0415

    return describe_error(err)


class StagingError(Exception):
    """An upload or download of the staging folder failed; the message is one line."""


def version_name(world_version: int) -> str:
    """``v000000007``: the upload after world version 7."""
    return f"v{world_version:09d}"


def local_files(folder: Path) -> dict[str, int]:
    """Relative path -> size of every regular file under ``folder``, dot names and symlinks
    left out (and folders under a dot name)."""
    found: dict[str, int] = {}
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            path = Path(root, name)
            if name.startswith(".") or path.is_symlink() or not path.is_file():
                continue
            found[path.relative_to(folder).as_posix()] = path.stat().st_size
    return found


def _read_marker(folder: Path) -> str | None:
    try:
        return (folder / MARKER).read_text(encoding="utf-8").strip()
    except (FileNotFoundError, NotADirectoryError, UnicodeDecodeError):
        return None


def _write_marker(folder: Path, name: str) -> None:
    tmp = folder / f"{MARKER}.tmp"
    tmp.write_text(name, encoding="utf-8")
    os.replace(tmp, folder / MARKER)


def _safe_relative(name: str) -> bool:
    """A manifest entry that stays inside the folder: relative, no ``..``, no empty parts."""
    parts = name.split("/")
    return bool(name) and "\0" not in name and all(p not in ("", ".", "..") for p in parts)


class StagingStore:
    """The uploads of one job's staging folder under ``<job_uri>/torchrun/``."""

    def __init__(self, job_uri: str, fs: Any = None) -> None:
        scheme, _, path = job_uri.partition("://")
        self.scheme = scheme
        self.root = posixpath.join(path, FOLDER)
        self._fs = fs

    @property
    def fs(self) -> Any:
        """The fsspec client, made on first use with the Session's options (imports s3fs)."""
        if self._fs is None:
            from .objectstore import filesystem  # noqa: PLC0415 - only jobs with a uri pay

            self._fs = filesystem(self.scheme)
        return self._fs

    def _key(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    def upload(self, folder: Path, world_version: int) -> int:
        """Upload ``folder`` as the upload of ``world_version`` and commit it; the number of
        files (0: an empty folder, nothing uploaded or committed)."""
        files = local_files(folder)
        if not files:
            return 0
        name = version_name(world_version)
        try:
            if self.fs.exists(self._key(name)):
                self.fs.rm(self._key(name), recursive=True)  # a killed earlier try
            for rel in files:
                self.fs.put_file(str(folder / rel), self._key(name, rel))
            manifest = json.dumps({"files": files}, sort_keys=True).encode()
            self.fs.pipe_file(self._key(f"{name}.json"), manifest)
            self.fs.pipe_file(self._key(POINTER), name.encode())
            _write_marker(folder, name)
        except Exception as err:  # any client error (s3fs, botocore, OSError): one line
            where = f"{self.scheme}://{self.root}"
            raise StagingError(f"uploading {folder} to {where}: {_describe(err)}") from err
        self._prune(keep_from=name)
        return len(files)

    def download(self, folder: Path) -> int:
        """Fetch the committed upload into ``folder``, unless its marker says it holds it; the
        number of files fetched (0: no upload yet, or already here)."""
        try:
            name = self._committed()
            if name is None or _read_marker(folder) == name:
                return 0
            manifest = json.loads(self.fs.cat_file(self._key(f"{name}.json")))
            files: dict[str, int] = manifest["files"]
            for rel in files:
                if not _safe_relative(rel):
                    raise StagingError(f"manifest {name}.json names a path outside: {rel[:80]!r}")
            for rel, size in sorted(files.items()):
                self._fetch(self._key(name, rel), folder / rel, int(size))
            _write_marker(folder, name)
        except StagingError:
            raise
        except Exception as err:  # any client error (s3fs, botocore, OSError): one line
            where = f"{self.scheme}://{self.root}"
            raise StagingError(f"downloading {where}: {_describe(err)}") from err
        return len(files)

    def wait_for_upload(self, world_version: int, *, timeout: float, poll: float = 0.5) -> bool:
        """Wait until the committed upload is that of ``world_version`` or a later one: a pod
        whose script stopped cleanly in that world starts the next one only after its rank-0
        pod's upload (or ``timeout`` seconds, if that pod's script failed to save). True: it
        is there."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                name = self._committed()
            except StagingError:
                raise
            except Exception as err:  # any client error (s3fs, botocore, OSError): one line
                raise StagingError(
                    f"reading {self.scheme}://{self.root}: {_describe(err)}"
                ) from err
            if name is not None and int(name[1:]) >= world_version:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll)

    def _committed(self) -> str | None:
        """The name ``latest`` names, or None before the first upload."""
        key = self._key(POINTER)
        if not self.fs.exists(key):
            return None
        name = bytes(self.fs.cat_file(key)[:_POINTER_MAX]).decode().strip()
        if not _VERSION.match(name):
            raise StagingError(f"{self.scheme}://{key}: not an upload's name: {name[:80]!r}")
        return name

    def _fetch(self, key: str, target: Path, size: int) -> None:
        """``key`` to ``target`` through a temp file beside it, checked against ``size``."""
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.download")
        self.fs.get_file(key, str(tmp))
        got = tmp.stat().st_size
        if got != size:
            tmp.unlink(missing_ok=True)
            raise StagingError(f"{self.scheme}://{key}: {got} bytes, the manifest says {size}")
        os.replace(tmp, target)

    def _prune(self, *, keep_from: str) -> None:
        """Delete uploads older than the ``KEEP`` newest (never ``keep_from``); a failure is
        logged, never raised: the upload is already committed."""
        try:
            names = sorted(
                {
                    n
                    for entry in self.fs.ls(self.root, detail=False)
                    if _VERSION.match(n := posixpath.basename(entry).removesuffix(".json"))
                }
            )
            for name in names[:-KEEP]:
                if name != keep_from:
                    self.fs.rm(self._key(name), recursive=True)
                    self.fs.rm_file(self._key(f"{name}.json"))
        except Exception as err:  # cleanup must not fail a committed upload
            log.warning(
                "pruning old uploads under %s://%s: %s", self.scheme, self.root, _describe(err)
            )
