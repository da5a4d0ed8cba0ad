"""A resize's downtime and the job's goodput as the resuming world measures them: the step-end
times they are measured between (tables), and a real run under the local launcher whose resumed
worlds' first steps say how long training stopped and whose steps say the goodput."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from elastra_worker.downtime import (
    FIRST_STEP_AT,
    GOODPUT,
    LAST_STEP_AT,
    TRAINED_SECONDS,
    ResizeClock,
)

from .conftest import run_local


@pytest.mark.parametrize(
    ("manifest_version", "extra", "steps", "first_record"),
    [
        # restored from world 1's checkpoint of a step that ended at t=100: the first step
        # (ending at 104.5) says 4.5 s; the next says nothing
        (1, {LAST_STEP_AT: 100.0}, [104.5, 105.0],
         {"resizeDowntimeSeconds": 4.5, "resizeFromVersion": 1, "stateFrom": "storage"}),
        (2, {LAST_STEP_AT: 100.0}, [104.5], {}),  # this world's own checkpoint: no resize
        (1, {}, [104.5], {}),  # a checkpoint from before the field: unknown, not invented
        (1, {LAST_STEP_AT: 110.0}, [104.5],  # clocks of two nodes disagree: never negative
         {"resizeDowntimeSeconds": 0.0, "resizeFromVersion": 1, "stateFrom": "storage"}),
    ],
)  # fmt: skip
def test_the_first_step_after_a_restore_from_another_world_says_the_gap(
    manifest_version: int, extra: dict[str, Any], steps: list[float], first_record: dict[str, Any]
) -> None:
    clock = ResizeClock(world_version=2)
    clock.restored(manifest_version, extra)
    records = [_without_goodput(clock.stepped(t)) for t in steps]
    assert records[0] == first_record
    assert all(r == {} for r in records[1:])
    assert _without_goodput(clock.progress()) == first_record
    assert clock.manifest_extra()[LAST_STEP_AT] == steps[-1]


def _without_goodput(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if k != GOODPUT}


@pytest.mark.parametrize(
    ("extra", "steps", "goodput", "trained"),
    [
        # a first world stepping once a second: all of it is training; one step is no span yet
        ({}, [10.0], None, 0.0),
        ({}, [10.0, 11.0, 12.0], 1.0, 2.0),
        # restored from a checkpoint of a job that had trained 8 s of its first 10 s; this
        # world's first step ends at 14 (a resize's gap, not training), then two 1 s steps
        ({FIRST_STEP_AT: 0.0, TRAINED_SECONDS: 8.0, LAST_STEP_AT: 10.0}, [14.0, 15.0, 16.0],
         0.625, 10.0),
        # a failed world trained past that checkpoint until t=20: its lost steps are not
        # counted, the next world starts from the checkpoint's 8 s
        ({FIRST_STEP_AT: 0.0, TRAINED_SECONDS: 8.0, LAST_STEP_AT: 10.0}, [24.0, 25.0],
         0.36, 9.0),
        # a checkpoint from before these fields: the job's time counts from this world's steps
        ({LAST_STEP_AT: 10.0}, [14.0, 15.0], 1.0, 1.0),
        # clocks of two nodes disagree (the restored first step lies ahead): at most 1
        ({FIRST_STEP_AT: 20.0, TRAINED_SECONDS: 1.0, LAST_STEP_AT: 21.0}, [14.0, 22.0],
         1.0, 9.0),
    ],
)  # fmt: skip
def test_goodput_is_the_kept_steps_time_over_the_wall_time_since_the_first_step(
    extra: dict[str, Any], steps: list[float], goodput: float | None, trained: float
) -> None:
    clock = ResizeClock(world_version=2)
    clock.restored(1, extra)
    last = [clock.stepped(t) for t in steps][-1]
    assert last.get(GOODPUT) == goodput
    assert clock.progress().get(GOODPUT) == goodput
    kept = clock.manifest_extra()
    assert kept[TRAINED_SECONDS] == trained
    assert kept[FIRST_STEP_AT] == extra.get(FIRST_STEP_AT, steps[0])


def test_a_resized_run_records_each_resumed_worlds_downtime(tmp_path: Path) -> None:
    started = time.time()
    pods = tmp_path / "pods"
    run = run_local(
        tmp_path, "2:0,1:3,2:6", consistency="data", steps=9, extra=["--work-dir", str(pods)]
    )
    elapsed = time.time() - started
    assert run.returncode == 0, run.output[-3000:]
    steps = run.by_step()
    assert sorted(steps) == list(range(9))
    resumed = {k: r for k, r in steps.items() if "resizeDowntimeSeconds" in r}
    assert sorted(resumed) == [3, 6], "the first step of each resumed world, and only those"
    for k, record in resumed.items():
        assert record["resizeFromVersion"] == steps[k - 1]["worldVersion"]
        assert record["worldVersion"] > record["resizeFromVersion"]
        # rank 0 stays: it moved in its own process
        assert record["stateFrom"] == "memory", (k, run.output[-4000:])
        assert 0 < record["resizeDowntimeSeconds"] < elapsed
        # the step log's wall clock says the same: the old world's last step to this one
        gap = record["endedAt"] - steps[k - 1]["endedAt"]
        assert abs(gap - record["resizeDowntimeSeconds"]) < 0.01, (gap, record)
    ended = [steps[k]["endedAt"] for k in range(9)]
    assert started < ended[0] and ended == sorted(ended) and ended[-1] < started + elapsed
    # two resizes cost training time: the job's goodput after them is below 1, and above 0
    assert 0 < steps[8][GOODPUT] < 1, steps[8]
    assert "first step" in run.output and "after the step it resumed from" in run.output
    # what checkpoints cost the last world's rank 0, as its agent exports them
    report = json.loads((pods / "pod-0" / "control" / "progress-0.json").read_text())
    joiner = json.loads((pods / "pod-1" / "control" / "progress-0.json").read_text())
    # pod 0 kept its state; pod 1 joined the last world and took the model and AdamW from it
    assert report["stateBytesFromStorage"] is None and report["stateBytesFromPeers"] is None
    assert joiner["stateBytesFromPeers"] > 0 and joiner["stateBytesFromStorage"] is None
    assert joiner["stateFrom"] == "peers" and joiner["peerTransferSeconds"] > 0
    assert 0 < report["checkpointBlockingSeconds"] < elapsed, "the final save stopped training"
    assert report["lastCheckpointStep"] == 9
