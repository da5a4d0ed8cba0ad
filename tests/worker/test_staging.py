"""torchrun mode's staging folder kept in an object store (``staging.StagingStore``), against
moto's real S3 server on 127.0.0.1 (the fixtures of test_objectstore.py): what is uploaded,
committed, downloaded once per upload, pruned, and refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from elastra_worker.assignment import job_checkpoint_uri
from elastra_worker.staging import KEEP, MARKER, StagingError, StagingStore

from .test_objectstore import s3, s3_endpoint  # noqa: F401 - fixtures


def fill(folder: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return folder


def contents(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): p.read_text()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }


@pytest.fixture
def store(s3: str) -> StagingStore:  # noqa: F811 - the fixture of the same name
    return StagingStore(job_checkpoint_uri(s3, "gpt"))


def test_an_upload_reaches_a_fresh_pod_once_and_its_own_pod_never(
    store: StagingStore, tmp_path: Path
) -> None:
    pod0 = fill(tmp_path / "pod0", {"ckpt.pt": "step 40", "shards/rank-1.pt": "r1"})
    fill(pod0, {".ckpt.pt.tmp": "half a save", ".cache/x": "y"})  # dot names stay local
    (pod0 / "link").symlink_to(pod0 / "ckpt.pt")
    assert store.upload(pod0, 7) == 2
    assert store.fs.cat_file(f"{store.root}/latest") == b"v000000007"
    manifest = json.loads(store.fs.cat_file(f"{store.root}/v000000007.json"))
    assert manifest == {"files": {"ckpt.pt": 7, "shards/rank-1.pt": 2}}

    pod1 = tmp_path / "pod1"
    pod1.mkdir()
    assert store.download(pod1) == 2
    assert contents(pod1) == {"ckpt.pt": "step 40", "shards/rank-1.pt": "r1"}
    assert (pod1 / MARKER).read_text() == "v000000007"
    assert store.download(pod1) == 0  # holds it already
    assert store.download(pod0) == 0  # made it


def test_a_newer_upload_of_the_same_size_replaces_the_old_files(
    store: StagingStore, tmp_path: Path
) -> None:
    """Same shapes, same size: only the marker tells the stale copy from the new one."""
    pod0, pod1 = tmp_path / "pod0", tmp_path / "pod1"
    store.upload(fill(pod0, {"ckpt.pt": "step 40"}), 3)
    pod1.mkdir()
    store.download(pod1)
    store.upload(fill(pod0, {"ckpt.pt": "step 60"}), 4)
    assert store.download(pod1) == 1
    assert contents(pod1) == {"ckpt.pt": "step 60"}


@pytest.mark.parametrize("uploads", [1, KEEP, KEEP + 2])
def test_old_uploads_are_pruned_to_the_newest(
    store: StagingStore, tmp_path: Path, uploads: int
) -> None:
    for version in range(1, uploads + 1):
        store.upload(fill(tmp_path / "pod0", {"ckpt.pt": f"v{version}"}), version)
    names = sorted(os.path.basename(k) for k in store.fs.ls(store.root, detail=False))
    kept = [f"v{v:09d}" for v in range(max(1, uploads - KEEP + 1), uploads + 1)]
    assert names == sorted([*kept, *(f"{n}.json" for n in kept), "latest"])


def test_nothing_to_upload_or_download(store: StagingStore, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert store.download(empty) == 0  # a new job: no upload yet
    assert store.upload(empty, 1) == 0  # a script that saved nothing commits nothing
    assert not store.fs.exists(f"{store.root}/latest")
    assert list(empty.iterdir()) == []


@pytest.mark.parametrize(
    ("latest", "manifest", "message"),
    [
        (b"../../x", None, "not an upload's name"),
        (b"v000000001", {"files": {"../outside": 1}}, "names a path outside"),
        (b"v000000001", {"files": {"ckpt.pt": 99}}, "the manifest says 99"),
    ],
)
def test_a_broken_upload_is_refused_and_writes_nothing_outside(
    store: StagingStore,
    tmp_path: Path,
    latest: bytes,
    manifest: dict[str, dict[str, int]] | None,
    message: str,
) -> None:
    store.upload(fill(tmp_path / "pod0", {"ckpt.pt": "step 1"}), 1)
    store.fs.pipe_file(f"{store.root}/latest", latest)
    if manifest is not None:
        store.fs.pipe_file(f"{store.root}/v000000001.json", json.dumps(manifest).encode())
    pod1 = tmp_path / "pods" / "pod1"
    pod1.mkdir(parents=True)
    with pytest.raises(StagingError, match=message):
        store.download(pod1)
    assert not (tmp_path / "pods" / "outside").exists()
    assert contents(pod1) == {}


@pytest.mark.parametrize(
    ("uploaded", "wanted", "there"), [(None, 1, False), (3, 3, True), (4, 3, True), (2, 3, False)]
)
def test_waiting_for_a_worlds_upload(
    store: StagingStore, tmp_path: Path, uploaded: int | None, wanted: int, there: bool
) -> None:
    if uploaded is not None:
        store.upload(fill(tmp_path / "pod0", {"ckpt.pt": "x"}), uploaded)
    assert store.wait_for_upload(wanted, timeout=0.3, poll=0.1) is there
