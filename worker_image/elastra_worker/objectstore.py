"""Checkpoints in an object store (``checkpoint.uri: s3://bucket/prefix``) through fsspec.

The same commit protocol as the file-system layout (``layout``), for storage without rename or
directories::

    s3://bucket/prefix/    checkpoint.uri: possibly shared by several jobs
      JOB/                 this job's own root; no other job lists, loads, commits or prunes it
        step-000000020/    DCP objects + MANIFEST.json
        step-000000040/
        latest             "step-000000040": the commit point

A save writes its objects straight into ``step-N/`` (rank 0 first deletes whatever an earlier,
unverified save of that step left there), then rank 0 writes ``MANIFEST.json`` with the size and
sha256 of every object, then ``latest``. A single-object PUT is atomic on S3, so ``latest``
written last is the commit point: a save killed before it leaves the previous pointer, and a
``step-N/`` newer than ``latest`` is never loaded while ``latest`` names an older step
(``order_candidates``). Loading follows ``latest`` and falls back to older steps whose objects
match their manifest; any unusable candidate is logged with the reason and skipped.

Credentials and the endpoint come from the environment as for any AWS client
(``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, a web identity token,
``AWS_ENDPOINT_URL`` or ``AWS_ENDPOINT_URL_S3`` for S3-compatible servers): the pod template's
``env``/``envFrom`` (a Secret) puts them there. s3fs is imported only when a job sets ``uri``.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import posixpath
import uuid
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import fsspec

from .assignment import job_checkpoint_uri, split_checkpoint_uri
from .layout import (
    LATEST,
    MANIFEST,
    PROBE,
    CheckpointError,
    FileEntry,
    Manifest,
    UnusableRootError,
    order_candidates,
    parse_step_dir_name,
    pointer_step,
    step_dir_name,
    steps_to_prune,
    verify_manifest,
)

log = logging.getLogger(__name__)

_CHUNK = 8 << 20
_POINTER_MAX = 4096
_MANIFEST_MAX = 64 << 20  # a manifest lists a few entries per rank; far below this
_OPTIONS: dict[str, Any] = {"use_listings_cache": False, "skip_instance_cache": True}
"""fsspec options for every client: no cached listings (other pods write the root) and a client
of its own made from the environment as it is now (fsspec reuses clients by arguments alone)."""


def filesystem(scheme: str) -> Any:
    """An fsspec client for ``scheme`` with these options (imports s3fs for ``s3``)."""
    return fsspec.filesystem(scheme, **_OPTIONS)


def _client_errors() -> tuple[type[BaseException], ...]:
    """The exception classes an S3 request may raise besides OSError: botocore's own."""
    try:
        from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415
    except ImportError:  # s3fs not installed: the probe reports that
        return (OSError, ValueError)
    return (OSError, ValueError, BotoCoreError, ClientError)


def _connection_errors() -> tuple[type[BaseException], ...]:
    """botocore's class for an endpoint it could not reach (after its own retries)."""
    try:
        from botocore.exceptions import ConnectionError as EndpointUnreachable  # noqa: PLC0415
    except ImportError:
        return ()
    return (EndpointUnreachable,)


def describe_error(err: BaseException) -> str:
    """A one-line reason for a client error (errno name or botocore class, then its text)."""
    if isinstance(err, OSError) and err.errno:
        code = errno.errorcode.get(err.errno, str(err.errno))
        return f"{err.strerror or err} [{code}]"
    if isinstance(err, ImportError):
        return "s3fs is not installed in the worker image"
    text = " ".join(str(err).split()) or type(err).__name__
    return f"{type(err).__name__}: {text}"[:300]


class ObjectCheckpointRoot:
    """One job's checkpoint root in an object store: ``<uri>/<job>/`` (``CheckpointStore``)."""

    def __init__(self, uri: str, *, job: str) -> None:
        own = job_checkpoint_uri(uri, job)
        self.scheme, self.bucket, _ = split_checkpoint_uri(own)
        self.job = job
        self.path = own.removeprefix(f"{self.scheme}://")
        """The root as fsspec names it: ``bucket/prefix/job``, no scheme."""
        self._fs: Any = None

    @property
    def uri(self) -> str:
        """The job's root as a URL."""
        return f"{self.scheme}://{self.path}"

    @property
    def fsspec_options(self) -> Mapping[str, Any]:
        """Options for DCP's fsspec writer and reader (the same client settings as ours)."""
        return dict(_OPTIONS)

    @property
    def fs(self) -> Any:
        """The fsspec client, made on first use (imports s3fs)."""
        if self._fs is None:
            self._fs = filesystem(self.scheme)
        return self._fs

    def _key(self, *parts: str) -> str:
        return posixpath.join(self.path, *parts)

    def _url(self, *parts: str) -> str:
        return f"{self.scheme}://{self._key(*parts)}"

    # ---- start ------------------------------------------------------------------------------

    def probe(self) -> None:
        """Write and delete an object in the root; UnusableRootError saying why it failed.

        A missing bucket, missing or wrong credentials, a denied write or a missing s3fs are
        found when a world starts, not at the first save after hours of training. An endpoint
        that cannot be reached may be a passing outage: a plain CheckpointError (retryable).
        """
        key = self._key(f"{PROBE}-{os.getpid()}-{uuid.uuid4().hex}")
        errors: tuple[type[BaseException], ...] = (ImportError, *_client_errors())
        try:
            self.fs.pipe_file(key, b"probe")
            self.fs.rm_file(key)
        except _connection_errors() as err:
            raise CheckpointError(
                f"checkpoint.uri {self.uri}: cannot reach the object store "
                f"({describe_error(err)}); check AWS_ENDPOINT_URL if it is an S3-compatible "
                "server"
            ) from err
        except errors as err:
            raise UnusableRootError(
                f"checkpoint.uri {self.uri} is not usable: {describe_error(err)}; check the "
                "bucket, the credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, e.g. from a "
                "Secret in spec.worker.template) and AWS_ENDPOINT_URL for an S3-compatible server"
            ) from err

    # ---- listing and verifying ------------------------------------------------------------

    def _list(self, key: str) -> list[dict[str, Any]]:
        """Entries directly under ``key``; [] when there are none (an empty prefix)."""
        try:
            return list(self.fs.ls(key, detail=True))
        except FileNotFoundError:
            return []

    def own_steps(self) -> list[int]:
        """Steps of the ``step-<digits>/`` prefixes directly under the root, newest first."""
        steps = []
        try:
            entries = self._list(self.path)
        except _client_errors() as err:
            log.warning("cannot list checkpoint root %s: %s", self.uri, describe_error(err))
            return []
        for entry in entries:
            step = parse_step_dir_name(posixpath.basename(str(entry["name"]).rstrip("/")))
            if step is not None and entry.get("type") == "directory":
                steps.append(step)
        return sorted(steps, reverse=True)

    def latest_step(self) -> int | None:
        """The step ``latest`` names; None (logged, unless absent) when it names none."""
        where = self._url(LATEST)
        try:
            data = self.fs.cat_file(self._key(LATEST), start=0, end=_POINTER_MAX)
        except FileNotFoundError:
            return None
        except _client_errors() as err:
            log.warning("ignoring checkpoint pointer %s: %s", where, describe_error(err))
            return None
        return pointer_step(bytes(data), where=where)

    def candidates(self) -> list[int]:
        """Steps to try loading, best first: ``latest``'s target, then the older ones."""
        return order_candidates(self.latest_step(), self.own_steps())

    def check_structure(self, step: int) -> Manifest:
        """Manifest present, for this job, every object present with its recorded size."""
        where = self.step_location(step)
        try:
            return self._check_structure(step, where)
        except _client_errors() as err:
            raise CheckpointError(f"{where}: unreadable ({describe_error(err)})") from err

    def _check_structure(self, step: int, where: str) -> Manifest:
        key = self._key(step_dir_name(step))
        try:
            data = self.fs.cat_file(posixpath.join(key, MANIFEST), start=0, end=_MANIFEST_MAX)
        except FileNotFoundError as err:
            raise CheckpointError(f"{where}: no {MANIFEST} (an interrupted save)") from err
        manifest = Manifest.parse(bytes(data), where=where)
        sizes = {
            posixpath.basename(str(e["name"])): int(e.get("size") or 0)
            for e in self._list(key)
            if e.get("type") == "file"
        }
        return verify_manifest(manifest, where=where, job=self.job, step=step, size_of=sizes.get)

    def check_hashes(self, step: int, names: Iterable[str]) -> None:
        """Stream ``names`` (a share of the objects) and compare their sha256 with the manifest."""
        where = self.step_location(step)
        key = posixpath.join(self._key(step_dir_name(step)), MANIFEST)
        try:
            data = self.fs.cat_file(key, start=0, end=_MANIFEST_MAX)
        except _client_errors() as err:
            raise CheckpointError(
                f"{where}/{MANIFEST}: unreadable ({describe_error(err)})"
            ) from err
        manifest = Manifest.parse(bytes(data), where=where)
        for name in names:
            entry = manifest.files.get(name)
            if entry is None:
                raise CheckpointError(f"{where}/{name}: not in the manifest")
            if self._hash(self._key(step_dir_name(step), name), where=f"{where}/{name}") != entry:
                raise CheckpointError(f"{where}/{name}: sha256 mismatch (corrupt shard)")

    def _hash(self, key: str, *, where: str) -> FileEntry:
        h = hashlib.sha256()
        size = 0
        try:
            with self.fs.open(key, "rb", block_size=_CHUNK) as f:
                while chunk := f.read(_CHUNK):
                    h.update(chunk)
                    size += len(chunk)
        except _client_errors() as err:
            raise CheckpointError(f"{where}: unreadable ({describe_error(err)})") from err
        return FileEntry(size=size, sha256=h.hexdigest())

    # ---- saving -----------------------------------------------------------------------------

    def save_location(self, step: int, world_version: int) -> str:
        """Where DCP writes: the step's own prefix (no rename exists to move it there later)."""
        return self.step_location(step)

    def begin_save(self, step: int, world_version: int) -> str:
        """Delete what an earlier save of ``step`` left: the running world did not verify it.

        A world saves a step again only when it resumed from an older one, so that copy is
        corrupt, half written or from an abandoned timeline; ``latest`` never names it while
        this save runs without the fallback taking over.
        """
        key = self._key(step_dir_name(step))
        if self._list(key):
            log.info("replacing the unverified copy of %s", self.step_location(step))
            self.fs.rm(key, recursive=True)
        return self.step_location(step)

    def saved_names(self, location: str) -> list[str]:
        """The objects DCP wrote under the step's prefix."""
        return sorted(
            posixpath.basename(str(e["name"]))
            for e in self._list(self._strip(location))
            if e.get("type") == "file"
        )

    def hash_saved(self, location: str, names: list[str]) -> dict[str, FileEntry]:
        """Size and sha256 of objects read back (those no writer stream reported)."""
        key = self._strip(location)
        return {n: self._hash(posixpath.join(key, n), where=f"{location}/{n}") for n in names}

    def commit_save(self, location: str, manifest: Manifest) -> str:
        """The manifest after every shard, then ``latest`` last: one PUT each, the second the
        commit point."""
        key = self._strip(location)
        self.fs.pipe_file(posixpath.join(key, MANIFEST), manifest.to_bytes())
        self.fs.pipe_file(self._key(LATEST), (step_dir_name(manifest.step) + "\n").encode())
        return location

    def step_location(self, step: int) -> str:
        """The URL of a committed step's prefix."""
        return self._url(step_dir_name(step))

    def prune(
        self, keep: int, *, trusted: Collection[int] = (), restored: int | None = None
    ) -> list[int]:
        """Delete the steps ``steps_to_prune`` names (the file-system rule); return them.

        A delete that fails is logged and left for the next prune: cleanup must not fail a
        save that is already committed.
        """
        removed = steps_to_prune(
            self.own_steps(),
            latest=self.latest_step(),
            keep=keep,
            trusted=trusted,
            restored=restored,
        )
        for step in removed:
            try:
                self.fs.rm(self._key(step_dir_name(step)), recursive=True)
            except _client_errors() as err:
                log.warning("cannot prune %s: %s", self.step_location(step), describe_error(err))
        return removed

    def _strip(self, location: str) -> str:
        """A URL of ours as fsspec's key (``bucket/...``)."""
        prefix = f"{self.scheme}://"
        if not location.startswith(prefix + self.path):
            raise ValueError(f"{location} is not inside {self.uri}")
        return location[len(prefix) :]
