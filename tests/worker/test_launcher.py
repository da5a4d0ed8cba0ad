"""The local launcher: worlds it forms, plans it writes, and the causes it names when stuck.

Every run is ``elastra-worker local`` as a subprocess, as users run it, with fake trainers of a
few lines of Python (no torch), so a whole schedule takes seconds.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from elastra_worker import exitcodes
from elastra_worker.assignment import ParallelPlan, RankCoord, parse_assignment
from elastra_worker.launcher import _Pod

from .conftest import quiet_env, wait_for

# Plays a Session trainer: steps from the shared "checkpoint" to stopAtStep, logs each step
# with the plan it was given, saves, and reports "stopped" (rank 0 does the bookkeeping).
FAKE_SESSION = textwrap.dedent(
    """
    import json, os, pathlib
    a = json.loads(os.environ["ELASTRA_ASSIGNMENT_JSON"])
    plan, ctl = a["plan"], pathlib.Path(os.environ["ELASTRA_CONTROL_DIR"])
    ckpt = pathlib.Path(a["checkpoint"]["path"]) / "fake.json"
    start = json.loads(ckpt.read_text())["step"] if ckpt.exists() else 0
    stop = a["stopAtStep"]
    if a["rank"] == 0:
        with open(os.environ["ELASTRA_STEP_LOG"], "a") as f:
            for step in range(start, stop):
                f.write(json.dumps({"step": step, "worldSize": a["worldSize"],
                    "worldVersion": a["worldVersion"], "plan": plan}) + "\\n")
        ckpt.write_text(json.dumps({"step": stop}))
    (ctl / "status-0.json").write_text(json.dumps({"state": "stopped", "step": stop,
        "checkpointStep": stop, "worldVersion": a["worldVersion"]}))
    """
)


def launch(
    tmp: Path,
    schedule: str,
    command: list[str],
    *,
    extra: Sequence[str] = (),
    timeout: float = 60,
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]], float]:
    """Run ``elastra-worker local``; return the process, the step log and the seconds taken."""
    log = tmp / "steps.jsonl"
    cmd = [sys.executable, "-m", "elastra_worker.cli", "local", "--schedule", schedule,
           "--checkpoint-dir", str(tmp / "ckpt"), "--log", str(log), *extra,
           "--", *command]  # fmt: skip
    began = time.monotonic()
    try:
        proc = subprocess.run(
            cmd, env=quiet_env(), capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"elastra-worker local hung past {timeout}s: {err.stderr!r:.3000}")
    records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return proc, records, time.monotonic() - began


def py(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def read_plan(plan: dict[str, Any], world_size: int, *, global_batch: int) -> ParallelPlan:
    """A recorded ``plan`` as the trainer read it (what the wire leaves out filled in)."""
    wire = {"job": "t", "worldVersion": 1, "worldSize": world_size, "masterAddr": "m",
            "masterPort": 1, "rank": 0, "plan": plan, "globalBatchSize": global_batch,
            "checkpoint": {"path": "/ckpt"}}  # fmt: skip
    return parse_assignment(wire).plan


def test_plans_change_at_steps_each_a_new_world_version(tmp_path: Path) -> None:
    schedule = "4:0,4:3:tp=2,4:6:pp=2/mb=1,8:9:tp=2/pp=2/sharding=full,2:12"
    proc, records, _ = launch(tmp_path, schedule, py(FAKE_SESSION), extra=["--steps", "15"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["step"] for r in records] == list(range(15))
    plans = [read_plan(r["plan"], r["worldSize"], global_batch=32) for r in records[::3]]
    got = [
        (r["worldSize"], p.dp, p.tp, p.pp, p.micro_batch_size, p.sharding, p.batch_shares)
        for r, p in zip(records[::3], plans, strict=True)
    ]
    assert got == [
        (4, 4, 1, 1, 2, "none", (8, 8, 8, 8)),
        (4, 2, 2, 1, 2, "none", (16, 16)),
        (4, 2, 1, 2, 1, "none", (16, 16)),
        (8, 2, 2, 2, 2, "full", (16, 16)),
        (2, 2, 1, 1, 2, "none", (16, 16)),
    ]
    # Each plan is a world version of its own, the same size included; a world that had to be
    # formed again (a busy machine) adds a version, never reuses one.
    versions = [r["worldVersion"] for r in records[::3]]
    assert versions == sorted(set(versions)), versions
    wide = plans[3]
    assert wide.schedule == "1f1b" and wide.virtual_stages == 1 and wide.stages == ()
    assert wide.coord(5) == RankCoord(rank=5, dp_rank=1, tp_rank=1, pp_stage=0)


def test_a_world_ended_by_a_time_still_stops_at_the_next_step_point(tmp_path: Path) -> None:
    # World 1 reaches step 4 long before 60 s: it stops there, the 1-rank world between is
    # skipped (its steps are done) and no step runs past a point the schedule names.
    proc, records, took = launch(
        tmp_path, "2:0,1:60s,3:4", py(FAKE_SESSION), extra=["--steps", "6"]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [(r["step"], r["worldSize"]) for r in records] == [
        (0, 2), (1, 2), (2, 2), (3, 2), (4, 3), (5, 3)
    ]  # fmt: skip
    assert "schedule entry '1:60s' skipped: its steps are done" in proc.stderr
    assert took < 30


@pytest.mark.parametrize(
    ("schedule", "own", "trainer", "error"),
    [
        ("4:0,4:10:tp=3", ["--steps", "20"], [], "schedule entry '4:10:tp=3': tp*pp = 3"),
        ("4:0,4:10:zz=1", ["--steps", "20"], [], "schedule entry '4:10:zz=1': 'zz=1' is not KEY"),
        ("2:0,4:10:tp=4", ["--steps", "20"], ["--model", "MODEL"],
         "schedule entry '4:10:tp=4': tp=4 does not divide the model's attentionHeads 6"),
        ("2:0,2:10:pp=2/vpp=2", ["--steps", "20"], ["--model=MODEL"],
         "schedule entry '2:10:pp=2/vpp=2': pp*vpp = 4 stages but the model has 3 layers"),
        ("2:0,1:5", ["--launch", "torchrun"], [],
         "schedule entry '1:5': a plain torchrun script"),
        ("2:0", [], [], "--steps is required"),
    ],
)  # fmt: skip
def test_bad_schedules_exit_2_before_anything_starts(
    tmp_path: Path, schedule: str, own: list[str], trainer: list[str], error: str
) -> None:
    model = tmp_path / "model.yaml"
    model.write_text("layers: 3\nhiddenSize: 48\nattentionHeads: 6\nkvHeads: 6\n")
    command = [sys.executable, "-m", "elastra_worker.train"]
    command += [arg.replace("MODEL", str(model)) for arg in trainer]
    work = tmp_path / "work"
    proc, _, _ = launch(tmp_path, schedule, command, extra=[*own, "--work-dir", str(work)])
    assert proc.returncode == exitcodes.CONFIG
    assert error in proc.stderr
    assert not work.exists()  # no pod was started


def test_a_plain_script_that_finishes_its_steps_ends_the_job(tmp_path: Path) -> None:
    # The report: a script that is no Session script ran all its steps in the first world;
    # its agent exited 0 and the launcher, taking it for alive, waited out the world timeout.
    proc, _, took = launch(
        tmp_path, "2:0,1:5,2:10", py("print('all steps done')"),
        extra=["--steps", "20", "--world-timeout", "30"],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "job done" in proc.stderr
    assert "without reporting through the Session API" in proc.stderr
    assert took < 25


def test_an_agent_on_its_way_out_is_not_taken_for_alive(tmp_path: Path) -> None:
    pod = _Pod(index=0, dir=tmp_path)
    state = pod.state_file
    # An agent that has written its last phase and needs a moment to exit.
    pod.proc = subprocess.Popen(
        py(f"""
            import json, pathlib, time
            pathlib.Path({str(state)!r}).write_text(json.dumps({{"phase": "done"}}))
            time.sleep(1.0)
        """),
        start_new_session=True,  # as the launcher starts agents
    )  # fmt: skip
    wait_for(state.exists, 30, "the last phase")
    assert pod.running()
    assert not pod.alive()
    assert pod.proc.poll() == 0  # waited for, not left behind

    pod.proc = subprocess.Popen(py("import time; time.sleep(60)"), start_new_session=True)
    state.write_text(json.dumps({"phase": "waiting"}))
    try:
        assert pod.alive()  # between two worlds: it will read the next assignment
    finally:
        pod.kill()


def test_world_timeout_names_the_ranks_that_never_made_a_step(tmp_path: Path) -> None:
    proc, _, took = launch(
        tmp_path, "2:0", py("import time; time.sleep(60)"),
        extra=["--steps", "5", "--world-timeout", "3"],
    )  # fmt: skip
    assert proc.returncode == exitcodes.RETRYABLE
    assert "world version 1 (2 ranks, step 0 until step 5) did not finish within 3s" in proc.stderr
    assert "pod 0 (rank 0) has made no step" in proc.stderr
    assert "pod 1 (rank 1) has made no step" in proc.stderr
    assert took < 30


def test_failed_worlds_name_the_pod_and_its_exit_code(tmp_path: Path) -> None:
    crash_rank_1 = """
        import os, sys, time
        if os.environ["RANK"] == "1":
            sys.exit(3)
        time.sleep(60)
    """
    extra = ["--steps", "5", "--max-failed-worlds", "2"]  # 3 worlds of about 10 s, not 6
    proc, _, _ = launch(tmp_path, "2:0", py(crash_rank_1), extra=extra, timeout=90)
    assert proc.returncode == exitcodes.RETRYABLE
    assert "more than 2 failed worlds, giving up; the last: pod 1's agent exited with code 75" in (
        proc.stderr
    )


# Plays a Session trainer whose world stops at its own step: it parks there and saves only once
# the agent asks it to stop with no next world; the first time, it dies in that save.
PARKS_THEN_FAILS_ONCE = """
    import json, os, pathlib, sys, time
    a = json.loads(os.environ["ELASTRA_ASSIGNMENT_JSON"])
    ctl = pathlib.Path(os.environ["ELASTRA_CONTROL_DIR"])
    stop, version = a["stopAtStep"], a["worldVersion"]
    if a["rank"] == 0:
        with open(os.environ["ELASTRA_STEP_LOG"], "a") as f:
            f.write(json.dumps({"step": stop - 1, "worldVersion": version}) + "\\n")
    (ctl / "status-0.json").write_text(json.dumps({"state": "parked", "step": stop,
        "checkpointStep": None, "worldVersion": version}))
    while not (ctl / "stop").exists():
        time.sleep(0.05)
    died = pathlib.Path(a["checkpoint"]["path"]) / f"died-{a['rank']}"
    if not died.exists():
        died.parent.mkdir(parents=True, exist_ok=True)
        died.write_text("")
        sys.exit(1)  # killed in the final save
    (ctl / "status-0.json").write_text(json.dumps({"state": "stopped", "step": stop,
        "checkpointStep": stop, "worldVersion": version}))
"""


def test_a_failure_in_the_final_stop_runs_the_last_world_again(tmp_path: Path) -> None:
    proc, records, _ = launch(
        tmp_path, "1:0", py(PARKS_THEN_FAILS_ONCE), extra=["--steps", "3"], timeout=90
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "pod 0's agent exited with code 75 at the end" in proc.stderr, proc.stderr[-3000:]
    # the world that parked at step 3, then a new one that reached it again and stopped cleanly
    assert [r["worldVersion"] for r in records] == [1, 3], records


# SIGKILLs the agent (argv[1]) once its pod is left out of a world (argv[2], its assignment).
KILL_AGENT_WHEN_LEFT_OUT = """
import json, os, pathlib, signal, sys, time
agent, path = int(sys.argv[1]), pathlib.Path(sys.argv[2])
while json.loads(path.read_text()).get("worldSize") != 0:
    time.sleep(0.05)
os.kill(agent, signal.SIGKILL)
"""
# Rank 1 of the first world leaves that process behind: an agent fails outside the world.
KILLS_ITS_AGENT_WHEN_LEFT_OUT = f"""
    import os, pathlib, subprocess, sys
    if os.environ["RANK"] == "1" and os.environ["ELASTRA_WORLD_VERSION"] == "1":
        pod = pathlib.Path(os.environ["ELASTRA_CONTROL_DIR"]).parent
        subprocess.Popen([sys.executable, "-c", {KILL_AGENT_WHEN_LEFT_OUT!r}, str(os.getppid()),
                          str(pod / "assignment.json")], start_new_session=True)
"""


def test_an_agent_that_failed_outside_the_last_world_fails_the_run_once(tmp_path: Path) -> None:
    trainer = py(KILLS_ITS_AGENT_WHEN_LEFT_OUT + textwrap.indent(FAKE_SESSION, "    "))
    proc, records, _ = launch(tmp_path, "2:0,1:3", trainer, extra=["--steps", "5"])
    assert proc.returncode == exitcodes.RETRYABLE, proc.stderr[-3000:]
    assert "pod 1's agent exited with code -9 at the end (phase " in proc.stderr
    assert "though in no world since" in proc.stderr, proc.stderr[-3000:]
    # the last world ran once: running it again cannot mend a pod outside it
    assert "starting a new one" not in proc.stderr, proc.stderr[-3000:]
    assert sorted({r["worldVersion"] for r in records}) == [1, 2], records


def test_a_model_prepare_cannot_shard_fails_once_with_its_line(tmp_path: Path) -> None:
    """Before: FSDP's TypeError was a crash, retried in six new worlds. Now the trainer exits
    with the permanent code, and so do its agent and the launcher, after one world."""
    script = """
        import torch
        from elastra_worker.api import Session
        with Session.from_env() as sess:
            sess.prepare(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    """
    proc, _, _ = launch(tmp_path, "2:0:sharding=full", py(script), extra=["--steps", "3"],
                        timeout=120)  # fmt: skip
    assert proc.returncode == exitcodes.CONFIG, proc.stderr[-3000:]
    assert (
        "plan dp2tp1pp1 shards the model (full), but prepare() cannot: Sequential: expected its "
        "blocks in a `layers` nn.ModuleDict" in proc.stderr
    )
    assert "Traceback" not in proc.stderr
    assert "world version 2" not in proc.stderr, "no second world"
    assert "exited with the permanent code 2" in proc.stderr


def test_a_checkpoint_dir_under_a_regular_file_is_a_permanent_error(tmp_path: Path) -> None:
    (tmp_path / "ckpt").write_text("a file where the checkpoint folder should be")
    proc, _, _ = launch(tmp_path, "2:0", py("pass"), extra=["--steps", "3"])
    assert proc.returncode == exitcodes.CONFIG
    assert f"--checkpoint-dir {tmp_path / 'ckpt'}: File exists" in proc.stderr
    assert "Traceback" not in proc.stderr
