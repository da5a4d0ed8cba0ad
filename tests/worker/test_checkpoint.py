"""The Checkpointer in a world of one: fallback past unusable candidates, pruning after a restore.

The protocol's file-level rules are in test_layout.py; this checks that the collective code uses
them (what rank 0 finds unusable is skipped on every rank, what was restored is never pruned).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from elastra_worker.checkpoint import Checkpointer
from elastra_worker.layout import CheckpointRoot


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
