"""The Checkpointer in a world of one: fallback past unusable candidates, pruning after a restore,
the asynchronous save (one at a time, in step order, from a copy; its errors not lost), and a
save killed at each commit point, by either writer.

The protocol's file-level rules are in test_layout.py; this checks that the collective code uses
them (what rank 0 finds unusable is skipped on every rank, what was restored is never pruned).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from elastra_worker.checkpoint import Checkpointer
from elastra_worker.layout import CheckpointError, CheckpointRoot, Manifest


@pytest.fixture
def world(tmp_path: Path) -> Iterator[None]:
    store = dist.FileStore(str(tmp_path / "store"), 1)  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def saver(root: CheckpointRoot, *, version: int, keep: int = 2) -> Checkpointer:
    return Checkpointer(root, group=None, world_version=version, keep=keep, thread_count=1)


def save(ckpt: Checkpointer, step: int) -> None:
    ckpt.save({"w": torch.full((4,), float(step))}, step=step, extra={})


def test_unreadable_latest_and_corrupt_steps_fall_back_then_prune_keeps_the_restored(
    tmp_path: Path, world: None
) -> None:
    root = CheckpointRoot(tmp_path, job="j")
    first = saver(root, version=1, keep=10)
    for step in (2, 4, 6):
        save(first, step)
    (root.path / "latest").unlink()
    (root.path / "latest").mkdir()  # an odd file: a directory where the pointer should be
    (root.step_path(6) / "MANIFEST.json").unlink()
    (root.step_path(6) / "MANIFEST.json").mkdir()

    second = saver(root, version=2)
    manifest = second.find_loadable()
    assert manifest is not None and manifest.step == 4
    state = {"w": torch.zeros(4)}
    second.load(state, manifest)
    assert state["w"].tolist() == [4.0] * 4
    save(second, 6)  # the broken 6 is replaced by this world's save
    assert root.check_structure(6).world_version == 2
    assert root.own_steps() == [6, 4]  # 2 gave way to the verified ones, never 4
    save(second, 8)
    assert root.own_steps() == [8, 6, 4]  # the restored step stays while this world runs


def gloo_group() -> dist.ProcessGroup:
    """A group of its own for the background writer (as the Session gives it)."""
    group = dist.new_group(backend="gloo")
    assert isinstance(group, dist.ProcessGroup)
    return group


HOLD_S = 60.0
"""Deadline for a held background save: a test that never releases it fails, never hangs."""


def loaded(ckpt: Checkpointer, step: int) -> list[float]:
    manifest = ckpt.root.check_structure(step)
    state = {"w": torch.zeros(4)}
    ckpt.load(state, manifest)
    return list(state["w"].tolist())


@pytest.mark.parametrize("next_save", ["periodic", "stop"])
def test_a_save_due_while_one_is_written_waits_for_it_and_commits_after_it(
    tmp_path: Path, world: None, monkeypatch: pytest.MonkeyPatch, next_save: str
) -> None:
    """Step 2 is held between its shards and its commit while step 4's save is called: 4 is
    written only after 2 committed, and 2 holds the state as it was when it was staged."""
    root = CheckpointRoot(tmp_path, job="j")
    events: list[tuple[str, int]] = []
    release, calling = threading.Event(), threading.Event()

    def after_write(step: int) -> None:
        events.append(("written", step))
        if step == 2 and not release.wait(HOLD_S):
            raise TimeoutError("the held save was never released")

    commit = root.commit_save

    def traced_commit(location: Any, manifest: Manifest) -> Any:
        events.append(("committed", manifest.step))
        return commit(location, manifest)

    monkeypatch.setattr(root, "commit_save", traced_commit)
    ckpt = Checkpointer(
        root, group=None, world_version=1, keep=3, thread_count=1, after_write=after_write
    )
    group = gloo_group()
    state = {"w": torch.full((4,), 2.0)}
    ckpt.save_async(state, step=2, extra={}, group=group)
    assert ckpt.in_flight == 2 and root.latest_step() is None  # returned before the commit
    state["w"].fill_(4.0)  # training goes on and changes the state in place

    def save_next() -> None:
        calling.set()
        if next_save == "periodic":
            ckpt.save_async(state, step=4, extra={}, group=group)
            ckpt.wait()
        else:
            ckpt.save(state, step=4, extra={})

    thread = threading.Thread(target=save_next)
    thread.start()
    assert calling.wait(HOLD_S)
    release.set()
    thread.join(HOLD_S)
    assert not thread.is_alive()
    assert events == [("written", 2), ("committed", 2), ("written", 4), ("committed", 4)]
    assert root.latest_step() == 4 and ckpt.in_flight is None
    assert (loaded(ckpt, 2), loaded(ckpt, 4)) == ([2.0] * 4, [4.0] * 4)


def test_a_failed_background_save_raises_at_the_next_wait_and_the_last_commit_stays(
    tmp_path: Path, world: None
) -> None:
    def fail_step_4(step: int) -> None:
        if step == 4:
            raise OSError("disk full")

    root = CheckpointRoot(tmp_path, job="j")
    ckpt = Checkpointer(
        root, group=None, world_version=1, keep=3, thread_count=1, after_write=fail_step_4
    )
    group = gloo_group()
    save(ckpt, 2)
    ckpt.save_async({"w": torch.full((4,), 4.0)}, step=4, extra={}, group=group)
    with pytest.raises(CheckpointError, match="asynchronous checkpoint save failed: disk full"):
        ckpt.wait()
    assert root.latest_step() == 2 and ckpt.last_committed_step == 2
    manifest = saver(root, version=2).find_loadable()
    assert manifest is not None and manifest.step == 2
    ckpt.save_async({"w": torch.full((4,), 6.0)}, step=6, extra={}, group=group)
    result = ckpt.wait()
    assert result is not None and result.step == 6 == root.latest_step()


class Killed(BaseException):
    """The process dies here (nothing after this point runs)."""


COMMIT_POINTS = {"before the manifest": 1, "before the rename into place": 2, "before latest": 3}
"""Rank 0's commit renames three times (manifest, the step's directory, ``latest``): the save is
killed in place of the n-th, after every shard is written and hashed."""


@pytest.mark.parametrize("writer", ["blocking", "background"])
@pytest.mark.parametrize("point", sorted(COMMIT_POINTS))
def test_a_save_killed_at_a_commit_point_leaves_the_previous_checkpoint(
    tmp_path: Path, world: None, monkeypatch: pytest.MonkeyPatch, point: str, writer: str
) -> None:
    root = CheckpointRoot(tmp_path, job="j")
    save(saver(root, version=1), 2)
    written = threading.Event()  # set once the shards of step 4 are on disk
    renames = 0
    real_replace = os.replace

    def replace(src: Any, dst: Any) -> None:
        nonlocal renames
        if written.is_set():
            renames += 1
            if renames == COMMIT_POINTS[point]:
                raise Killed
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    ckpt = Checkpointer(root, group=None, world_version=2, keep=3, thread_count=1,
                        after_write=lambda step: written.set())  # fmt: skip
    state = {"w": torch.full((4,), 4.0)}
    if writer == "blocking":
        with pytest.raises(Killed):
            ckpt.save(state, step=4, extra={})
    else:  # the thread hands what ended it to the training thread at the next wait
        ckpt.save_async(state, step=4, extra={}, group=gloo_group())
        with pytest.raises(CheckpointError, match="asynchronous checkpoint save failed"):
            ckpt.wait()
    monkeypatch.undo()
    assert renames == COMMIT_POINTS[point] and root.latest_step() == 2
    after = saver(root, version=3)  # the next world
    manifest = after.find_loadable()
    assert manifest is not None and manifest.step == 2
    assert loaded(after, 2) == [2.0] * 4
    save(after, 4)  # and its own save of the step commits over what was left
    assert root.latest_step() == 4 and loaded(after, 4) == [4.0] * 4
