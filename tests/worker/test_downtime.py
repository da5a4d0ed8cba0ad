"""A resize's downtime as the resuming world measures it: the step-end times it is measured
between (table), and a real run under the local launcher whose resumed worlds' first steps say
how long training stopped."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from elastra_worker.downtime import LAST_STEP_AT, ResizeClock

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
    records = [clock.stepped(t) for t in steps]
    assert records[0] == first_record
    assert all(r == {} for r in records[1:])
    assert clock.progress() == first_record
    assert clock.manifest_extra() == {LAST_STEP_AT: steps[-1]}


def test_a_resized_run_records_each_resumed_worlds_downtime(tmp_path: Path) -> None:
    started = time.time()
    run = run_local(tmp_path, "2:0,1:3,2:6", consistency="data", steps=9)
    elapsed = time.time() - started
    assert run.returncode == 0, run.output[-3000:]
    steps = run.by_step()
    assert sorted(steps) == list(range(9))
    resumed = {k: r for k, r in steps.items() if "resizeDowntimeSeconds" in r}
    assert sorted(resumed) == [3, 6], "the first step of each resumed world, and only those"
    for k, record in resumed.items():
        assert record["resizeFromVersion"] == steps[k - 1]["worldVersion"]
        assert record["worldVersion"] > record["resizeFromVersion"]
        assert record["stateFrom"] == "storage"
        assert 0 < record["resizeDowntimeSeconds"] < elapsed
    assert "first step" in run.output and "after the step it resumed from" in run.output
