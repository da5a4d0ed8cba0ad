"""Resizes, crashes and corruption against a static run (CPU, gloo, up to 4 processes).

The reference is a 4-rank bitwise run. In ``bitwise`` mode every other schedule, crash and
resume must reproduce its parameters bit for bit at every step; in ``data`` mode it must see
exactly the same samples per step.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from elastra_worker.faults import SAVE_DELAY_ENV
from elastra_worker.layout import CheckpointRoot

from .conftest import STEPS, LocalRun, run_local

pytestmark = pytest.mark.slow


def assert_same_params(run: LocalRun, static: LocalRun, steps: range = range(STEPS)) -> None:
    got, want = run.by_step(), static.by_step()
    assert sorted(got) == list(steps), run.output[-3000:]
    for k in steps:
        assert got[k]["samples"] == want[k]["samples"], f"step {k}: samples differ"
        assert got[k]["paramsSha256"] == want[k]["paramsSha256"], f"step {k}: params differ"


def assert_checkpoints_intact(path: Path) -> None:
    root = CheckpointRoot(path, job="local")
    steps = root.committed_steps()
    assert steps and root.latest_step() == steps[0]
    for step in steps:
        manifest = root.check_structure(step)
        root.check_hashes(step, list(manifest.files))


def test_bitwise_resize_4_2_3_matches_static_run(tmp_path: Path, static_run: LocalRun) -> None:
    run = run_local(tmp_path, "4:0,2:7,3:14")
    assert run.returncode == 0, run.output[-3000:]
    assert_same_params(run, static_run)
    sizes = {r["step"]: r["worldSize"] for r in run.records}
    assert (sizes[6], sizes[7], sizes[13], sizes[14]) == (4, 2, 2, 3)
    assert len({r["worldVersion"] for r in run.records}) == 3
    assert_checkpoints_intact(tmp_path / "ckpt")


def test_data_mode_resize_and_crash_keep_the_sample_order(
    tmp_path: Path, static_run: LocalRun
) -> None:
    # rank 2 is SIGKILLed in the middle of step 17. The resizes at steps 7 and 14 moved in
    # memory and commit their step in the background of the next world, so the world resumes
    # from step 14, or from step 7 where step 14's commit was not through by the kill.
    run = run_local(tmp_path, "4:0,2:7,3:14", consistency="data", extra=["--fail", "2@17"])
    assert run.returncode == 0, run.output[-3000:]
    restored = set(re.findall(r"restored step (\d+)", run.output))
    assert restored in ({"14"}, {"7"}), run.output[-3000:]
    got, want = run.by_step(), static_run.by_step()
    assert sorted(got) == list(range(STEPS))
    for k in range(STEPS):
        assert got[k]["samples"] == want[k]["samples"], f"step {k}"
        assert got[k]["loss"] == pytest.approx(want[k]["loss"], rel=1e-4)


WRITERS = {"background": [], "blocking": ["--blocking-checkpoints"]}
"""Who writes the periodic checkpoints: a background thread (the default) or the training one."""
BACKGROUND_LINE = "writing it in the background"


def assert_writer(run: LocalRun, writer: str) -> None:
    assert (BACKGROUND_LINE in run.output) == (writer == "background"), run.output[-3000:]


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_sigkill_during_a_save_resumes_from_the_previous_good_one(
    tmp_path: Path, static_run: LocalRun, writer: str
) -> None:
    # rank 1 dies after writing its shards of step 9, before the commit
    run = run_local(
        tmp_path,
        "3:0,2:12",
        extra=["--checkpoint-every", "3", "--fail-in-save", "1@9", *WRITERS[writer]],
    )
    assert run.returncode == 0, run.output[-3000:]
    assert "restored step 6" in run.output
    assert_writer(run, writer)
    assert_same_params(run, static_run)
    assert_checkpoints_intact(tmp_path / "ckpt")


def test_a_kill_in_a_save_that_lands_after_the_world_parked_fires_once(
    tmp_path: Path, static_run: LocalRun
) -> None:
    # Every save waits 2 s before its commit, so the world reaches its stop step 12 and parks
    # before rank 1 dies in step 9's background save. Before: rank 1's agent lived on (a
    # newer world was assigned) and its next trainer died at the same point; rank 2's agent,
    # leaving as its world broke, exited failed and failed every final stop after.
    run = run_local(
        tmp_path,
        "3:0,2:12",
        extra=["--checkpoint-every", "3", "--fail-in-save", "1@9"],
        env={SAVE_DELAY_ENV: "2"},
    )
    assert run.returncode == 0, run.output[-3000:]
    assert run.output.count("elastra-fault:") == 1, run.output[-3000:]
    assert "restored step 6" in run.output
    assert_same_params(run, static_run)
    assert_checkpoints_intact(tmp_path / "ckpt")


def test_corrupted_shard_is_detected_and_skipped(tmp_path: Path, static_run: LocalRun) -> None:
    ckpt = tmp_path / "ckpt"
    first = run_local(tmp_path / "a", "2:0", steps=6, checkpoint_dir=ckpt,
                      extra=["--checkpoint-every", "2"])  # fmt: skip
    assert first.returncode == 0, first.output[-3000:]
    root = CheckpointRoot(ckpt, job="local")
    assert root.latest_step() == 6
    shard = next(root.step_path(6).glob("__1_*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))

    second = run_local(tmp_path / "b", "3:0", steps=8, checkpoint_dir=ckpt)
    assert second.returncode == 0, second.output[-3000:]
    assert "sha256 mismatch" in second.output
    assert "restored step 4" in second.output
    assert_same_params(second, static_run, range(4, 8))


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_background_and_blocking_checkpoints_change_nothing(
    tmp_path: Path, static_run: LocalRun, writer: str
) -> None:
    run = run_local(tmp_path, "2:0,3:10", extra=["--checkpoint-every", "2", *WRITERS[writer]])
    assert run.returncode == 0, run.output[-3000:]
    assert_writer(run, writer)
    assert_same_params(run, static_run)
    assert_checkpoints_intact(tmp_path / "ckpt")
    # the grow moved the two survivors in memory and gave the third rank their state
    assert "rank 0 resumed step 10 from memory" in run.output
    assert "rank 2 resumed step 10 from peers" in run.output


def test_fsdp_model_resizes_in_data_mode(tmp_path: Path, static_run: LocalRun) -> None:
    run = run_local(tmp_path, "2:0,3:4", consistency="data", steps=8, script_args=["--fsdp"])
    assert run.returncode == 0, run.output[-3000:]
    assert "restored step 4" in run.output
    want = static_run.by_step()
    for rec in run.records:
        assert rec["samples"] == want[rec["step"]]["samples"]
        assert rec["loss"] == pytest.approx(want[rec["step"]]["loss"], rel=1e-4)
    assert_checkpoints_intact(tmp_path / "ckpt")


def test_twenty_consecutive_resizes_do_not_hang(tmp_path: Path, static_run: LocalRun) -> None:
    sizes = [2, 1, 3, 1, 2, 3, 2, 1, 2, 3, 1, 2, 1, 3, 2, 1, 2, 1, 3, 2, 1]  # 21 worlds
    assert len(sizes) == STEPS
    schedule = ",".join(f"{size}:{step}" for step, size in enumerate(sizes))
    run = run_local(tmp_path, schedule, timeout=900)
    assert run.returncode == 0, run.output[-3000:]
    assert [r["worldSize"] for r in run.records] == sizes, run.notable()
    assert_same_params(run, static_run)


def test_a_finished_run_started_again_trains_nothing(tmp_path: Path) -> None:
    """Before: restored at its last step, the world trained one more and committed it, so
    every restart of a finished run grew it by a step."""
    ckpt = tmp_path / "ckpt"
    first = run_local(tmp_path / "a", "2:0", steps=4, checkpoint_dir=ckpt)
    assert first.returncode == 0, first.output[-3000:]
    again = run_local(tmp_path / "b", "2:0", steps=4, checkpoint_dir=ckpt)
    assert again.returncode == 0, again.output[-3000:]
    assert again.records == []
    assert CheckpointRoot(ckpt, job="local").committed_steps() == [4]
