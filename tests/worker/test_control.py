"""The control directory's progress report from a torchrun-mode script (``report_progress``):
what it writes where ``$ELASTRA_PROGRESS_FILE`` names a file, and that it is a no-op elsewhere.
The agent side (stop file, status, progress read back as metrics) is tested in test_agent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from elastra_worker import report_progress
from elastra_worker.control import PROGRESS_FILE_ENV, ControlDir, TrainerStatus


@pytest.mark.parametrize(
    ("step", "known", "written"),
    [
        (0, {}, {"step": 0}),
        (12, {"loss": 1.5}, {"step": 12, "loss": 1.5}),
        (
            40,
            {"loss": 2, "samples_per_second": 64, "step_seconds": 0.5, "tokens_per_second": 8192,
             "last_checkpoint_step": 40},
            {"step": 40, "loss": 2.0, "samplesPerSecond": 64.0, "stepSeconds": 0.5,
             "tokensPerSecond": 8192.0, "lastCheckpointStep": 40},
        ),
    ],
)  # fmt: skip
def test_a_report_is_what_the_agent_reads_as_the_pods_progress(
    tmp_path: Path, step: int, known: dict[str, Any], written: dict[str, Any]
) -> None:
    control = ControlDir(tmp_path)
    env = {PROGRESS_FILE_ENV: str(control.progress_path(0))}
    assert report_progress(step, **known, environ=env) is True
    assert control.progress(0) == written
    assert json.loads(control.progress_path(0).read_text()) == written
    assert [p.name for p in tmp_path.iterdir()] == ["progress-0.json"]  # no temp file left


def test_without_a_progress_file_a_report_writes_nothing(tmp_path: Path) -> None:
    """Under plain torchrun or python the script may call it all the same."""
    assert report_progress(3, loss=0.5, environ={}) is False
    assert report_progress(3, loss=0.5, environ={PROGRESS_FILE_ENV: ""}) is False
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("step", [-1, 2.5, True, "3"])
def test_a_step_that_is_not_a_count_is_refused(tmp_path: Path, step: Any) -> None:
    env = {PROGRESS_FILE_ENV: str(tmp_path / "progress-0.json")}
    with pytest.raises(ValueError, match="report_progress: step must be a whole number >= 0"):
        report_progress(step, environ=env)
    assert list(tmp_path.iterdir()) == []


def test_carrying_trainers_over_keeps_only_what_they_reported_in_their_new_world(
    tmp_path: Path,
) -> None:
    """A fast world may train to its stop step and park before the agent sees its trainers
    arrive: their ``parked`` report in the new version survives; the old world's stop
    request, offer, progress and reports go, as ``reset`` clears them."""
    control = ControlDir(tmp_path)
    control.request_stop("new world version", world_version=1)
    control.offer_next("{}")
    control.write_status(0, TrainerStatus("parked", 6, 6, 2))
    control.write_status(1, TrainerStatus("stopped", 6, 6, 1))
    (tmp_path / "progress-0.json").write_text(json.dumps({"step": 6}))
    control.reset(keep_reports_of=2)
    assert control.status(0) == TrainerStatus("parked", 6, 6, 2)
    assert control.status(1) is None
    assert not control.stop_requested(1) and control.next_assignment() is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["status-0.json"]
