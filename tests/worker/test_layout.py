"""The checkpoint root's commit protocol, checked on the file system alone (no processes)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from elastra_worker.layout import (
    CheckpointError,
    CheckpointRoot,
    FileEntry,
    Manifest,
    sha256_file,
)


def save(root: CheckpointRoot, step: int, *, payload: bytes = b"x" * 100, version: int = 1) -> Path:
    """What a one-rank save does after DCP wrote its files."""
    partial = root.partial_path(step, version)
    partial.mkdir(parents=True)
    (partial / ".metadata").write_bytes(b"meta")
    (partial / "__0_0.distcp").write_bytes(payload)
    files = {
        n: FileEntry(size=(partial / n).stat().st_size, sha256=sha256_file(partial / n))
        for n in os.listdir(partial)
    }
    manifest = Manifest(
        job=root.job, step=step, world_size=1, world_version=version, files=files, extra={}
    )
    return root.commit(partial, manifest)


def test_commit_moves_latest_and_prunes(tmp_path: Path) -> None:
    root = CheckpointRoot(tmp_path, job="j")
    for step in (10, 20, 30, 40):
        save(root, step)
        root.prune(keep=3)
    assert root.latest_step() == 40
    assert root.committed_steps() == [40, 30, 20]
    assert root.candidates() == [40, 30, 20]
    assert not any(root.partial_dir.iterdir())
    for step in root.committed_steps():
        root.check_structure(step)
        root.check_hashes(step, ["__0_0.distcp", ".metadata"])


def test_interrupted_save_leaves_latest_alone(tmp_path: Path) -> None:
    root = CheckpointRoot(tmp_path, job="j")
    save(root, 10)
    partial = root.partial_path(20, 2)
    partial.mkdir(parents=True)
    (partial / "__0_0.distcp").write_bytes(b"half")  # killed before the manifest
    assert root.candidates() == [10]
    root.check_structure(10)


def test_corrupt_shard_is_detected_by_hash(tmp_path: Path) -> None:
    root = CheckpointRoot(tmp_path, job="j")
    path = save(root, 10)
    shard = path / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[50] ^= 0xFF  # same size, one flipped byte
    shard.write_bytes(bytes(data))
    root.check_structure(10)  # sizes still match...
    with pytest.raises(CheckpointError, match="sha256 mismatch"):
        root.check_hashes(10, ["__0_0.distcp"])  # ...the hash does not


def test_truncated_or_missing_files_fail_structure(tmp_path: Path) -> None:
    root = CheckpointRoot(tmp_path, job="j")
    path = save(root, 10)
    (path / "__0_0.distcp").write_bytes(b"short")
    with pytest.raises(CheckpointError, match="size 5"):
        root.check_structure(10)
    (path / "__0_0.distcp").unlink()
    with pytest.raises(CheckpointError, match="missing"):
        root.check_structure(10)
    (path / "MANIFEST.json").unlink()
    with pytest.raises(CheckpointError, match="interrupted save"):
        root.check_structure(10)


def test_refuses_other_jobs_and_symlinks(tmp_path: Path) -> None:
    other = CheckpointRoot(tmp_path / "other", job="other")
    save(other, 10)
    root = CheckpointRoot(tmp_path / "mine", job="mine")
    root.path.mkdir()
    os.symlink(other.step_path(10), root.step_path(10))
    assert root.committed_steps() == []  # a symlink is not a checkpoint of ours
    with pytest.raises(CheckpointError, match="not a directory"):
        root.check_structure(10)
    os.unlink(root.step_path(10))
    os.rename(other.step_path(10), root.step_path(10))
    with pytest.raises(CheckpointError, match="belongs to job 'other'"):
        root.check_structure(10)


def test_latest_pointer_cannot_escape_the_root(tmp_path: Path) -> None:
    root = CheckpointRoot(tmp_path, job="j")
    save(root, 10)
    (tmp_path / "latest").write_text("../../etc\n")
    assert root.latest_step() is None
    assert root.candidates() == [10]


def test_recommitting_an_intact_step_keeps_it(tmp_path: Path) -> None:
    root = CheckpointRoot(tmp_path, job="j")
    first = save(root, 10, payload=b"a" * 10)
    save(root, 10, payload=b"b" * 10, version=2)
    assert (first / "__0_0.distcp").read_bytes() == b"a" * 10
    assert root.latest_step() == 10
