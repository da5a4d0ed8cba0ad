"""The checkpoint root's commit protocol, checked on the file system alone (no processes)."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from elastra_worker.layout import (
    CheckpointError,
    CheckpointRoot,
    FileEntry,
    Manifest,
    UnusableRootError,
    probe_writable,
    sha256_file,
    step_dir_name,
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
    root.path.mkdir(parents=True)
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
    (root.path / "latest").write_text("../../etc\n")
    assert root.latest_step() is None
    assert root.candidates() == [10]


def corrupt(root: CheckpointRoot, step: int) -> None:
    """Flip one byte of the step's shard: the structure still checks, the hash does not."""
    shard = root.step_path(step) / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[0] ^= 0xFF
    shard.write_bytes(bytes(data))


def test_resaving_a_step_replaces_a_corrupt_copy(tmp_path: Path) -> None:
    # The world resumed from 6 because 9 and 12 are corrupt, then saved 9 again.
    root = CheckpointRoot(tmp_path, job="j")
    for step in (3, 6, 9, 12):
        save(root, step)
    corrupt(root, 9)
    corrupt(root, 12)
    fresh = save(root, 9, payload=b"fresh" * 20, version=2)
    assert (fresh / "__0_0.distcp").read_bytes() == b"fresh" * 20
    assert root.latest_step() == 9
    root.check_hashes(9, ["__0_0.distcp", ".metadata"])
    assert root.prune(3, trusted={6, 9}, restored=6) == [12]  # corrupt 12 first, 3 fills a slot
    assert root.committed_steps() == [9, 6, 3]
    save(root, 12, version=2)
    root.prune(3, trusted={6, 9, 12}, restored=6)
    assert root.committed_steps() == [12, 9, 6]


@pytest.mark.parametrize(
    ("steps", "trusted", "restored", "kept"),
    [
        # the restored step stays even when `keep` newer ones are verified
        ([2, 4, 6, 8], {2, 4, 6, 8}, 2, [8, 6, 2]),
        # unverified steps above the restored one never count as kept good ones
        ([2, 4, 6, 8, 10], {4, 6}, 4, [6, 4]),
        # an older fallback fills a slot the verified ones leave free
        ([2, 4, 6, 8, 10], {4}, 4, [4, 2]),
        # nothing restored: everything not trusted and newer than the newest trusted goes
        ([2, 4, 6], {2}, None, [2]),
        # no trust given (a plain call): the newest `keep` up to `latest`
        ([2, 4, 6, 8], set(), None, [8, 6]),
    ],
)
def test_prune_keeps_verified_steps_relative_to_the_restored_one(
    tmp_path: Path, steps: list[int], trusted: set[int], restored: int | None, kept: list[int]
) -> None:
    root = CheckpointRoot(tmp_path, job="j")
    for step in steps:
        save(root, step)
    if trusted:  # the world's last save is the newest trusted step: `latest` points at it
        save(root, max(trusted), version=2)
    root.prune(2, trusted=trusted, restored=restored)
    assert root.committed_steps() == kept


def test_jobs_sharing_a_path_keep_apart(tmp_path: Path) -> None:
    a, b = CheckpointRoot(tmp_path, job="a"), CheckpointRoot(tmp_path, job="b")
    for step in (1, 2, 3, 4):
        save(a, step)
        a.prune(2)
    save(b, 1)
    b.prune(1)
    assert a.committed_steps() == [4, 3]
    assert b.committed_steps() == [1]
    assert (a.latest_step(), b.latest_step()) == (4, 1)
    assert a.path == tmp_path / "a" and b.path == tmp_path / "b"
    a.check_structure(4)
    b.check_structure(1)


def test_the_old_layout_is_still_read_never_written(tmp_path: Path) -> None:
    """A job upgraded mid-run finds its checkpoints directly under checkpoint.path."""
    old = tmp_path / step_dir_name(5)
    root = CheckpointRoot(tmp_path, job="j")
    legacy = save(root, 5)  # written in the new layout, then moved where the old one put it
    os.rename(legacy, old)
    (root.path / "latest").rename(tmp_path / "latest")
    assert root.latest_step() == 5 and root.candidates() == [5]
    assert root.step_path(5) == old
    root.check_structure(5)
    other = CheckpointRoot(tmp_path, job="other")
    with pytest.raises(CheckpointError, match="belongs to job 'j'"):
        other.check_structure(5)
    save(root, 8)
    root.prune(1, trusted={5, 8}, restored=5)
    assert root.candidates() == [8, 5] and old.is_dir()  # never pruned there


def _latest_invalid_utf8(root: CheckpointRoot) -> None:
    (root.path / "latest").write_bytes(b"\xff\xfestep-000000020\n")


def _latest_directory(root: CheckpointRoot) -> None:
    (root.path / "latest").unlink()
    (root.path / "latest").mkdir()


def _manifest_directory(root: CheckpointRoot) -> None:
    (root.step_path(20) / "MANIFEST.json").unlink()
    (root.step_path(20) / "MANIFEST.json").mkdir()


def _manifest_invalid_utf8(root: CheckpointRoot) -> None:
    (root.step_path(20) / "MANIFEST.json").write_bytes(b"{\xff}")


def _manifest_deep(root: CheckpointRoot) -> None:
    (root.step_path(20) / "MANIFEST.json").write_text("[" * 50_000 + "]" * 50_000)


def _shard_directory(root: CheckpointRoot) -> None:
    shard = root.step_path(20) / "__0_0.distcp"
    shard.unlink()
    shard.mkdir()


def _manifest_nul_name(root: CheckpointRoot) -> None:
    path = root.step_path(20) / "MANIFEST.json"
    path.write_text(path.read_text().replace('"__0_0.distcp"', '"__0\\u0000.distcp"'))


@pytest.mark.parametrize(
    ("damage", "first_usable", "reason"),
    [
        # a useless `latest` is ignored (logged): the newest good directory is found by listing
        (_latest_invalid_utf8, 20, "latest: not UTF-8"),
        (_latest_directory, 20, "latest: Is a directory"),
        # a useless step directory is skipped for the older good one
        (_manifest_directory, 10, "MANIFEST.json: unreadable (Is a directory)"),
        (_manifest_invalid_utf8, 10, "MANIFEST.json: malformed"),
        (_manifest_deep, 10, "MANIFEST.json: malformed"),
        (_shard_directory, 10, "__0_0.distcp: size"),
        (_manifest_nul_name, 10, "names a file outside it"),
    ],
)
def test_an_odd_file_is_skipped_with_its_name_and_reason(
    tmp_path: Path,
    damage: Callable[[CheckpointRoot], None],
    first_usable: int,
    reason: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    root = CheckpointRoot(tmp_path, job="j")
    save(root, 10)
    save(root, 20)
    damage(root)
    caplog.set_level(logging.WARNING)
    usable, errors = [], []
    for step in root.candidates():
        try:
            root.check_structure(step)
            root.check_hashes(step, [".metadata", "__0_0.distcp"])
        except CheckpointError as err:
            errors.append(str(err))
            continue
        usable.append(step)
    assert usable[0] == first_usable
    assert reason in caplog.text + "".join(errors)
    assert str(root.path) in caplog.text + "".join(errors)


def test_probe_accepts_a_writable_root_and_leaves_nothing(tmp_path: Path) -> None:
    root = CheckpointRoot(tmp_path / "claim", job="j")
    root.probe()
    assert root.path.is_dir() and list(root.path.iterdir()) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes read-only directories")
def test_probe_names_the_path_and_the_errno_of_a_read_only_root(tmp_path: Path) -> None:
    tmp_path.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        with pytest.raises(UnusableRootError, match=f"{tmp_path}/j.*Permission denied"):
            CheckpointRoot(tmp_path, job="j").probe()
    finally:
        tmp_path.chmod(stat.S_IRWXU)


def test_probe_refuses_a_file_in_place_of_the_root(tmp_path: Path) -> None:
    (tmp_path / "claim").write_text("not a directory")
    with pytest.raises(UnusableRootError, match=f"{tmp_path}/claim.*Not a directory"):
        probe_writable(tmp_path / "claim" / "j")


@pytest.mark.parametrize("job", ["", ".", "..", "a/b", "a\0b"])
def test_a_job_name_that_is_not_one_directory_is_refused(tmp_path: Path, job: str) -> None:
    with pytest.raises(ValueError, match="cannot name a directory"):
        CheckpointRoot(tmp_path, job=job)
