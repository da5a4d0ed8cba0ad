"""The agent: assignment watching, stop requests, SIGTERM, exit codes and metrics.

The first tests use a fake trainer (a few lines of Python, no torch) to pin the protocol fast,
in both launch modes (``elastra``: the Session's stop file; ``torchrun``: a plain script that
only understands SIGTERM); one runs the real example in a world of two pods driven through
assignment files.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from elastra_worker import exitcodes
from elastra_worker.agent import AgentConfig
from elastra_worker.launcher import free_port
from elastra_worker.layout import CheckpointRoot, pointer_step
from elastra_worker.metrics import READY_PATH
from elastra_worker.push import POD_UID_ENV, PUBLIC_KEY_ENV
from elastra_worker.standby import warm_command

from .conftest import EXAMPLE, quiet_env, wait_for
from .test_metrics import get, post
from .test_objectstore import s3, s3_endpoint  # noqa: F401 - fixtures
from .test_push import POD_UID, PUBLIC

FAKE_TRAINER = textwrap.dedent(
    """
    import json, os, pathlib, sys, time
    control = pathlib.Path(os.environ["ELASTRA_CONTROL_DIR"])
    (control / "progress-0.json").write_text(json.dumps(
        {"step": 5, "loss": 1.5, "samplesPerSecond": 10.0, "lastCheckpointStep": 4,
         "worldVersion": int(os.environ["ELASTRA_WORLD_VERSION"])}))
    deadline = time.monotonic() + 60
    while not (control / "stop").exists():
        if time.monotonic() > deadline:
            sys.exit(9)
        time.sleep(0.02)
    (control / "status-0.json").write_text(json.dumps(
        {"state": "stopped", "step": 5, "checkpointStep": 5,
         "worldVersion": int(os.environ["ELASTRA_WORLD_VERSION"])}))
    """
)


def assignment(version: int, *, rank: int = 0, size: int = 1, port: int = 1, **kw: Any) -> str:
    return json.dumps(
        {
            "job": "t", "worldVersion": version, "rank": rank, "worldSize": size,
            "masterAddr": "127.0.0.1", "masterPort": port, "globalBatchSize": 24,
            "plan": {"dp": size, "microBatchSize": 2}, "checkpoint": {"path": kw.pop("ckpt", "/x")},
            **kw,
        }
    )  # fmt: skip


def start_agent(
    pod: Path,
    command: list[str],
    *,
    metrics_port: int = 0,
    args: Sequence[str] = ("--grace", "20"),
    env: dict[str, str] | None = None,
    stderr: int | None = None,
) -> subprocess.Popen[str]:
    pod.mkdir(parents=True, exist_ok=True)
    full_env = quiet_env()
    full_env.update(
        {
            "ELASTRA_ASSIGNMENT_FILE": str(pod / "assignment"),
            "ELASTRA_METRICS_PORT": str(metrics_port),
            "ELASTRA_STEP_LOG": str(pod.parent / "steps.jsonl"),
            **(env or {}),
        }
    )
    cmd = [sys.executable, "-m", "elastra_worker.cli", "run", "--control-dir", str(pod / "ctl"),
           "--state-file", str(pod / "agent.json"), *args, "--", *command]  # fmt: skip
    return subprocess.Popen(cmd, env=full_env, text=True, stderr=stderr)


def write(pod: Path, text: str) -> None:
    tmp = pod / ".assignment.tmp"
    tmp.write_text(text)
    tmp.replace(pod / "assignment")


def agent_state(pod: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((pod / "agent.json").read_text()))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def test_bad_assignment_is_a_permanent_error(tmp_path: Path) -> None:
    (tmp_path / "assignment").write_text('{"job": "t", "worldVersion": 1, "worldSize": "two"}')
    message = tmp_path / "termination-log"
    message.touch()  # as the kubelet does: the job's condition reads what is written here
    env = {"ELASTRA_TERMINATION_LOG": str(message)}
    proc = start_agent(tmp_path, [sys.executable, "-c", "pass"], env=env)
    assert proc.wait(timeout=60) == exitcodes.CONFIG
    assert message.read_text() == "bad assignment: worldSize: expected an integer, got 'two'\n"


def test_a_directory_at_the_assignment_path_is_a_permanent_error(tmp_path: Path) -> None:
    (tmp_path / "assignment").mkdir()
    proc = start_agent(tmp_path, [sys.executable, "-c", "pass"])
    assert proc.wait(timeout=60) == exitcodes.CONFIG
    assert "Is a directory" in agent_state(tmp_path)["error"]


def test_a_trainer_exiting_config_makes_the_pod_exit_config(tmp_path: Path) -> None:
    write(tmp_path, assignment(1, port=free_port()))
    proc = start_agent(tmp_path, [sys.executable, "-c", "raise SystemExit(2)"])
    assert proc.wait(timeout=60) == exitcodes.CONFIG
    assert agent_state(tmp_path)["phase"] == "failed"


def test_an_unusable_checkpoint_root_fails_at_start_permanently(tmp_path: Path) -> None:
    """Not at the first save, retryably: the Session probes the root when it starts."""
    claim = tmp_path / "claim"
    claim.write_text("a file where the checkpoint root should be")
    write(tmp_path, assignment(1, port=free_port(), ckpt=str(claim)))
    command = [sys.executable, str(EXAMPLE), "--dataset-size", "50"]
    proc = start_agent(tmp_path, command, stderr=subprocess.PIPE)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == exitcodes.CONFIG, err
    assert f"checkpoint root {claim}/t is not usable: Not a directory" in err
    assert "Traceback" not in err


def test_the_sigterm_deadline_is_the_grace_the_operator_passes(tmp_path: Path) -> None:
    """ELASTRA_GRACE_SECONDS (the operator sets it from the pod's terminationGracePeriodSeconds)
    is how long a trainer gets after SIGTERM: here 3 s for one that never stops, not 25."""
    write(tmp_path, assignment(1, port=free_port()))
    stuck = [sys.executable, "-c", "import time; time.sleep(600)"]
    proc = start_agent(tmp_path, stuck, args=(), env={"ELASTRA_GRACE_SECONDS": "3"})
    wait_for(lambda: agent_state(tmp_path).get("phase") == "running", 60, "the trainer")
    asked = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == exitcodes.RETRYABLE  # killed: nothing was checkpointed
    waited = time.monotonic() - asked
    assert 3.0 <= waited < 20.0, f"the agent waited {waited:.1f}s after SIGTERM"


@pytest.mark.slow
def test_a_45s_grace_lets_a_30s_checkpoint_finish(tmp_path: Path) -> None:
    """SIGTERM (eviction, spot reclaim) with the pod's grace of 45 s: a Session trainer whose
    save takes 30 s (a slow volume, injected) commits its checkpoint and the pod exits 0. With
    the old 25 s deadline (still the default) the agent killed it mid-save."""
    ckpt = tmp_path / "ckpt"
    write(tmp_path, assignment(1, port=free_port(), ckpt=str(ckpt)))
    command = [sys.executable, str(EXAMPLE), "--dataset-size", "5000"]
    env = {"ELASTRA_GRACE_SECONDS": "45", "ELASTRA_FAULT_SAVE_DELAY_SECONDS": "30"}
    proc = start_agent(tmp_path, command, args=(), env=env)
    progress = tmp_path / "ctl" / "progress-0.json"
    wait_for(progress.exists, 180, "the trainer's first step")
    asked = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=150) == exitcodes.OK, "stopped with a committed checkpoint"
    waited = time.monotonic() - asked
    assert 30.0 <= waited < 45.0, f"the agent waited {waited:.1f}s after SIGTERM"
    status = json.loads((tmp_path / "ctl" / "status-0.json").read_text())
    assert status["state"] == "stopped" and status["checkpointStep"] == status["step"]
    latest = ckpt / "t" / "latest"
    assert pointer_step(latest.read_bytes(), where=str(latest)) == status["step"]


STUCK_TRAINER = textwrap.dedent(
    """
    import json, os, pathlib, time
    control = pathlib.Path(os.environ["ELASTRA_CONTROL_DIR"])
    (control / "progress-0.json").write_text(json.dumps(
        {"step": 5, "worldVersion": int(os.environ["ELASTRA_WORLD_VERSION"])}))
    time.sleep(600)  # blocked in a collective with a peer that is gone: never sees the stop
    """
)


@pytest.mark.parametrize(
    ("peers_lost", "stop_timeout", "earliest", "latest"),
    [(True, 60.0, 0.0, 8.0), (False, 4.0, 4.0, 30.0)],
)
def test_a_world_that_replaces_lost_members_ends_the_old_trainers_at_once(
    tmp_path: Path, peers_lost: bool, stop_timeout: float, earliest: float, latest: float
) -> None:
    """A new version with ``peersLost``: the old world's trainers, stuck on the dead peer, are
    ended at once, not after the stop timeout; a planned resize still waits its stop timeout."""
    write(tmp_path, assignment(1, port=free_port()))
    command = [sys.executable, "-c", STUCK_TRAINER]
    proc = start_agent(tmp_path, command, args=("--stop-timeout", str(stop_timeout)))
    try:
        progress = tmp_path / "ctl" / "progress-0.json"
        wait_for(progress.exists, 60, "the trainer's first step")
        asked = time.monotonic()
        write(tmp_path, assignment(2, port=free_port(), peersLost=peers_lost))
        wait_for(lambda: agent_state(tmp_path).get("worldVersion") == 2, latest, "the second world")
        waited = time.monotonic() - asked
        assert earliest <= waited < latest, f"the old trainers ended after {waited:.1f}s"
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_crashed_trainer_is_retryable(tmp_path: Path) -> None:
    write(tmp_path, assignment(1, port=free_port()))
    proc = start_agent(tmp_path, [sys.executable, "-c", "raise SystemExit(3)"])
    assert proc.wait(timeout=60) == exitcodes.RETRYABLE


FAILS_IN_WORLD_1 = textwrap.dedent(
    """
    import os, pathlib, sys, time
    if os.environ["ELASTRA_WORLD_VERSION"] == "1":
        (pathlib.Path(os.environ["ELASTRA_CONTROL_DIR"]) / "failed-v1").write_text("")
        sys.exit(int(sys.argv[1]))  # its collective broke: a peer died
    time.sleep(600)
    """
)


@pytest.mark.parametrize(
    ("code", "held"),
    [(3, 0.0), (exitcodes.PEERS_LOST, AgentConfig.failure_wait_s + 3)],
    ids=["crash-then-new-world", "collective-failed-lease-still-running"],
)
def test_a_survivor_whose_trainer_failed_waits_for_the_world_of_survivors(
    tmp_path: Path, code: int, held: float
) -> None:
    """A trainer fails because a peer died; the new world's assignment reaches this pod
    ``held`` seconds later: the pod joins it instead of exiting failed (a lost survivor).
    Past ``failure_wait_s`` only when the trainer ended on a failed collective
    (``PEERS_LOST``): the operator may need the lost node's Lease to run out first."""
    write(tmp_path, assignment(1, port=free_port()))
    proc = start_agent(tmp_path, [sys.executable, "-c", FAILS_IN_WORLD_1, str(code)])
    try:
        wait_for((tmp_path / "ctl" / "failed-v1").exists, 60, "the first world's failure")
        if held:
            with pytest.raises(subprocess.TimeoutExpired):
                proc.wait(timeout=held)
            # What the operator's node liveness task reads: this world lost a member.
            assert agent_state(tmp_path).get("peersLostWorldVersion") == 1
        write(tmp_path, assignment(2, port=free_port(), peersLost=True))
        wait_for(
            lambda: agent_state(tmp_path).get("worldVersion") == 2, 30, "the world of survivors"
        )
        assert proc.poll() is None, "the pod stays"
        assert agent_state(tmp_path).get("peersLostWorldVersion") is None, "a new world clears it"
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_a_pod_whose_trainer_failed_as_it_left_the_world_waits_for_the_next(
    tmp_path: Path,
) -> None:
    """The trainer's world broke (a peer died) and the next world leaves this pod out: it
    waits, as any pod left out, and joins a later world (before: it exited failed)."""
    write(tmp_path, assignment(1, port=free_port()))
    proc = start_agent(tmp_path, [sys.executable, "-c", FAILS_IN_WORLD_1,
                                  str(exitcodes.PEERS_LOST)])  # fmt: skip
    try:
        wait_for((tmp_path / "ctl" / "failed-v1").exists, 60, "the first world's failure")
        write(tmp_path, assignment(2, size=0))
        wait_for(lambda: agent_state(tmp_path).get("phase") == "waiting", 30, "a waiting pod")
        assert proc.poll() is None, "the pod stays"
        write(tmp_path, assignment(3, port=free_port()))
        wait_for(lambda: agent_state(tmp_path).get("worldVersion") == 3, 30, "the next world")
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_a_stop_before_the_first_step_ends_the_pod_cleanly(tmp_path: Path) -> None:
    """Its trainer made no step (nothing to save): the agent ends it at once, and that is a
    stop, not a failure (before: exit 75 whenever the stop beat the first step)."""
    write(tmp_path, assignment(1, port=free_port()))
    proc = start_agent(tmp_path, [sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        wait_for(lambda: agent_state(tmp_path).get("phase") == "running", 60, "a running world")
        write(tmp_path, assignment(2, stop=True))
        assert proc.wait(timeout=60) == exitcodes.OK
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_waits_then_runs_serves_metrics_and_stops_on_request(tmp_path: Path) -> None:
    port = free_port()
    proc = start_agent(tmp_path, [sys.executable, "-c", FAKE_TRAINER], metrics_port=port)
    try:
        write(tmp_path, assignment(0, size=0))  # in no world yet: keeps waiting
        wait_for(lambda: agent_state(tmp_path).get("phase") == "waiting", 30, "a waiting agent")
        write(tmp_path, assignment(3, port=free_port()))
        wait_for((tmp_path / "ctl" / "progress-0.json").exists, 60, "trainer progress")

        def scrape() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                return str(resp.read().decode())

        wait_for(lambda: "elastra_worker_world_version 3.0" in scrape(), 30, "metrics")
        text = scrape()
        assert "elastra_worker_step 5.0" in text
        assert "elastra_worker_last_checkpoint_step 4.0" in text
        write(tmp_path, assignment(4, stop=True))
        assert proc.wait(timeout=60) == exitcodes.OK
        assert agent_state(tmp_path)["phase"] == "stopped"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_pushed_world_version_ahead_of_the_file_moves_the_running_world(tmp_path: Path) -> None:
    """The kubelet is late to refresh the file (it remounted the old content): the operator's
    push of version 2 alone ends world 1 and starts world 2, while the file still says 1."""
    port = free_port()
    write(tmp_path, assignment(1, port=free_port()))
    env = {POD_UID_ENV: POD_UID, PUBLIC_KEY_ENV: PUBLIC}
    proc = start_agent(tmp_path, [sys.executable, "-c", FAKE_TRAINER], metrics_port=port, env=env)
    try:
        wait_for(lambda: agent_state(tmp_path).get("phase") == "running", 30, "world version 1")
        pushed = assignment(2, port=free_port()).encode()
        assert get(post(f"http://127.0.0.1:{port}", pushed, signed=True)) == (200, "taken\n")
        wait_for(lambda: agent_state(tmp_path).get("worldVersion") == 2, 10, "world version 2")
        assert json.loads((tmp_path / "assignment").read_text())["worldVersion"] == 1
        state = agent_state(tmp_path)
        assert (state["phase"], state["trainerStarts"]) == ("running", 2), state
        write(tmp_path, assignment(3, stop=True))  # the file, caught up and ahead: it decides
        assert proc.wait(timeout=30) == exitcodes.OK
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_resize_through_assignment_files_then_sigterm(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    pods = [tmp_path / "pod0", tmp_path / "pod1"]
    command = [sys.executable, str(EXAMPLE), "--dataset-size", "500"]
    port = free_port()
    for rank, pod in enumerate(pods):
        pod.mkdir()
        write(pod, assignment(1, rank=rank, size=2, port=port, ckpt=str(ckpt), consistency="data"))
    procs = [start_agent(pod, command) for pod in pods]
    steps = tmp_path / "steps.jsonl"

    def records() -> list[dict[str, Any]]:
        if not steps.exists():
            return []
        return [json.loads(line) for line in steps.read_text().splitlines() if line.strip()]

    try:
        wait_for(lambda: len(records()) >= 3, 180, "three steps in world version 1")
        # The operator's resize: version 2 keeps pod 0 alone, pod 1 leaves.
        write(pods[0], assignment(2, size=1, port=free_port(), ckpt=str(ckpt), consistency="data"))
        write(pods[1], assignment(2, stop=True))
        assert procs[1].wait(timeout=120) == exitcodes.OK
        wait_for(lambda: any(r["worldVersion"] == 2 for r in records()), 180, "version 2 steps")
        by_version = {r["step"]: r["worldVersion"] for r in records()}
        stop_step = min(k for k, v in by_version.items() if v == 2)
        assert sorted(by_version) == list(range(len(by_version)))  # no step lost or repeated
        assert all(v == 1 for k, v in by_version.items() if k < stop_step)
        # pod 0 stays with one trainer: the same process moved to version 2, state in memory
        state = agent_state(pods[0])
        assert (state["trainerStarts"], state["resizesInMemory"]) == (1, 1), state
        assert records()[stop_step]["stateFrom"] == "memory"

        # Preemption: SIGTERM -> checkpoint of the current step, exit 0, within the grace.
        wait_for(lambda: len(records()) >= stop_step + 2, 120, "steps in version 2")
        started = time.monotonic()
        procs[0].send_signal(signal.SIGTERM)
        assert procs[0].wait(timeout=60) == exitcodes.OK
        assert time.monotonic() - started < 20
        root = CheckpointRoot(ckpt, job="t")
        last = max(r["step"] for r in records())
        assert root.latest_step() == last + 1
        manifest = root.check_structure(last + 1)
        root.check_hashes(last + 1, list(manifest.files))
        assert stop_step in root.committed_steps()  # the resize's checkpoint
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


# Reports no progress (a world still in its start-up), records whether torch was already imported
# when it began (a warm standby's preload), and waits to be asked to stop.
STARTUP_TRAINER = textwrap.dedent(
    """
    import json, os, pathlib, sys, time
    control = pathlib.Path(os.environ["ELASTRA_CONTROL_DIR"])
    version = os.environ["ELASTRA_WORLD_VERSION"]
    starts = control.parent / "starts.jsonl"
    with starts.open("a") as f:
        record = {"version": int(version), "warm": "torch" in sys.modules, "pid": os.getpid()}
        f.write(json.dumps(record) + "\\n")
    deadline = time.monotonic() + 60
    while not (control / "stop").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    """
)


def standbys_of(agent: int) -> set[int]:
    """The agent's child processes that run ``elastra_worker.standby`` (waiting or running)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:  # gone meanwhile
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == agent and b"elastra_worker.standby" in cmdline:
            found.add(int(entry.name))
    return found


def test_a_resize_before_the_first_step_starts_warm(tmp_path: Path) -> None:
    """The next world's standbys start with a world's trainers, not after its first step; the
    first world's trainer runs in a standby too (started then), so its script could run again
    in the next world (``session/rerun.py``)."""
    script = tmp_path / "train.py"
    script.write_text(STARTUP_TRAINER)
    port = free_port()
    write(tmp_path, assignment(1, port=port))
    proc = start_agent(tmp_path, [sys.executable, str(script)])
    starts = tmp_path / "starts.jsonl"
    try:
        wait_for(starts.exists, 60, "the first trainer to start")
        first = json.loads(starts.read_text().splitlines()[0])
        assert first["pid"] in standbys_of(proc.pid)
        # before any step (the trainer reports none): a standby waits beside the trainer
        wait_for(lambda: standbys_of(proc.pid) - {first["pid"]}, 60, "a waiting standby")
        write(tmp_path, assignment(2, port=port))
        wait_for(lambda: len(starts.read_text().splitlines()) == 2, 60, "world 2's trainer")
        records = [json.loads(line) for line in starts.read_text().splitlines()]
        assert [(r["version"], r["warm"]) for r in records] == [(1, True), (2, True)]
        write(tmp_path, assignment(3, stop=True))
        assert proc.wait(timeout=60) == exitcodes.OK
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def probe(port: int) -> int:
    """The startup probe's answer (``metrics.READY_PATH``), or 0 while nothing listens."""
    try:
        return get(f"http://127.0.0.1:{port}{READY_PATH}")[0]
    except OSError:
        return 0


@pytest.mark.parametrize("warm_start", [True, False])
def test_a_waiting_pod_passes_its_startup_probe_once_its_standby_imported_torch(
    tmp_path: Path, warm_start: bool
) -> None:
    """A pod in no world answers 503 until its standby has imported torch, then 200 for good;
    a command that starts cold (no standby) has nothing to wait for."""
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('never run: the pod is in no world')\n")
    write(tmp_path, assignment(0, size=0))
    port = free_port()
    env = {"ELASTRA_WARM_START": "1" if warm_start else "0"}
    proc = start_agent(tmp_path, [sys.executable, str(script)], metrics_port=port, env=env)
    answers: list[int] = []

    def warm_now() -> bool:
        answers.append(probe(port))
        return answers[-1] == 200

    try:
        wait_for(warm_now, 120, "a warm pod")
        seen = [a for a in answers if a]  # 0: the agent was not listening yet
        warm = tmp_path / "ctl" / "warm"
        if warm_start:
            assert seen[0] == 503, answers
            (marker,) = warm.iterdir()
            assert int(marker.name) in standbys_of(proc.pid)  # its standby said so, and waits
        else:
            assert set(seen) == {200}, answers
            assert not warm.exists()
        assert probe(port) == 200
        assert agent_state(tmp_path)["phase"] == "waiting"
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_only_own_interpreter_scripts_start_warm(tmp_path: Path) -> None:
    exe = sys.executable
    assert warm_command([exe, "train.py", "--steps", "3"]) == ["train.py", "--steps", "3"]
    assert warm_command([exe, "-m", "pkg.train", "-x"]) == ["-m", "pkg.train", "-x"]
    assert warm_command([exe, "-u", "train.py"]) is None  # interpreter options: start cold
    assert warm_command(["bash", "train.sh"]) is None
    other = tmp_path / "bin" / "python"
    other.parent.mkdir()
    other.symlink_to(exe)  # another virtual environment's python: start cold
    assert warm_command([str(other), "train.py"]) is None


# ---- torchrun launch mode ------------------------------------------------------------------------

FAKE_PLAIN_SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys, time
    log, mode = sys.argv[1], sys.argv[2]
    keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
            "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
            "TORCHELASTIC_RUN_ID", "TORCHELASTIC_MAX_RESTARTS", "ELASTRA_CHECKPOINT_DIR",
            "ELASTRA_WORLD_VERSION", "ELASTRA_GLOBAL_BATCH_SIZE", "ELASTRA_ASSIGNMENT_JSON",
            "ELASTRA_CONTROL_DIR"]
    def note(**kw):
        with open(log, "a") as f:
            f.write(json.dumps(kw) + "\\n")
    ckpt = os.path.join(os.environ.get("ELASTRA_CHECKPOINT_DIR", "."), "ckpt.txt")
    def on_sigterm(signum, frame):
        note(event="sigterm", version=os.environ["ELASTRA_WORLD_VERSION"])
        if mode in ("save", "slow-save"):  # the stop checkpoint: this world's version
            time.sleep(2 if mode == "slow-save" else 0)
            with open(ckpt, "w") as f:
                f.write(os.environ["ELASTRA_WORLD_VERSION"])
        if mode != "ignore":
            sys.exit(0)
    signal.signal(signal.SIGTERM, on_sigterm)
    found = open(ckpt).read() if os.path.exists(ckpt) else None
    note(event="start", env={k: os.environ.get(k) for k in keys}, found=found)
    if mode in ("exit0", "crash"):
        sys.exit(0 if mode == "exit0" else 3)
    if mode == "report":  # the one-line progress report, as after step 7
        from elastra_worker import report_progress
        report_progress(7, loss=0.25, samples_per_second=96.0, last_checkpoint_step=5)
    if mode == "resize-then-exit0":  # a rank stopped by peers that had SIGTERM first
        staged = os.path.join(os.path.dirname(log), "next-assignment")
        if os.path.exists(staged):  # the new world lands, then this rank exits, unasked
            os.replace(staged, os.environ["ELASTRA_ASSIGNMENT_FILE"])
        sys.exit(0)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.02)
    sys.exit(9)
    """
)


def events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def starts(path: Path) -> list[dict[str, Any]]:
    return [e["env"] for e in events(path) if e["event"] == "start"]


@pytest.fixture
def agents() -> Iterator[list[subprocess.Popen[str]]]:
    """Agents a test starts; killed at the end if the test left them running."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def claim(tmp_path: Path) -> str:
    """A checkpoint claim in the test's folder: torchrun mode makes the job's folder in it."""
    return str(tmp_path / "claim")


def plain(tmp_path: Path, mode: str) -> list[str]:
    return [sys.executable, "-c", FAKE_PLAIN_SCRIPT, str(tmp_path / "events.jsonl"), mode]


def test_torchrun_mode_sigterms_and_restarts_the_script_per_world_version(
    tmp_path: Path, agents: list[subprocess.Popen[str]]
) -> None:
    log = tmp_path / "events.jsonl"
    ports = [free_port(), free_port()]
    write(tmp_path, assignment(1, port=ports[0], ckpt=claim(tmp_path)))
    agents.append(start_agent(tmp_path, plain(tmp_path, "forever"), args=["--launch", "torchrun"]))
    wait_for(lambda: len(starts(log)) == 1, 30, "the script in world version 1")
    first = starts(log)[0]
    assert first == {
        "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": "0", "ROLE_RANK": "0", "ROLE_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(ports[0]), "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_RUN_ID": "t", "TORCHELASTIC_MAX_RESTARTS": "10",
        "ELASTRA_CHECKPOINT_DIR": str(tmp_path / "claim" / "t"), "ELASTRA_WORLD_VERSION": "1",
        "ELASTRA_GLOBAL_BATCH_SIZE": "24", "ELASTRA_ASSIGNMENT_JSON": None,
        "ELASTRA_CONTROL_DIR": None,
    }  # fmt: skip

    write(tmp_path, assignment(2, rank=1, size=2, port=ports[1], ckpt=claim(tmp_path)))
    wait_for(lambda: len(starts(log)) == 2, 30, "the script in world version 2")
    assert [e["event"] for e in events(log)] == ["start", "sigterm", "start"]
    second = starts(log)[1]
    assert (second["RANK"], second["WORLD_SIZE"], second["GROUP_RANK"]) == ("1", "2", "1")
    assert second["MASTER_PORT"] == str(ports[1])
    assert second["TORCHELASTIC_RESTART_COUNT"] == "1"

    agents[0].send_signal(signal.SIGTERM)  # eviction: the script exits 0 on SIGTERM
    assert agents[0].wait(timeout=30) == exitcodes.OK
    assert agent_state(tmp_path)["phase"] == "terminated"
    assert events(log)[-1] == {"event": "sigterm", "version": "2"}


def test_torchrun_mode_serves_the_scripts_progress_report_as_metrics(
    tmp_path: Path, agents: list[subprocess.Popen[str]]
) -> None:
    """``report_progress`` in the script reaches the agent's /metrics, which the operator reads
    into the job's status (``elastra_worker_step``), as a Session's progress does."""
    port = free_port()
    write(tmp_path, assignment(2, ckpt=claim(tmp_path), port=free_port()))
    agents.append(
        start_agent(
            tmp_path, plain(tmp_path, "report"), args=["--launch", "torchrun"], metrics_port=port
        )
    )

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            return str(resp.read().decode())

    wait_for((tmp_path / "ctl" / "progress-0.json").exists, 30, "the script's report")
    wait_for(lambda: "elastra_worker_step 7.0" in scrape(), 30, "the script's step in metrics")
    text = scrape()
    for line in (
        "elastra_worker_loss 0.25",
        "elastra_worker_samples_per_second 96.0",
        "elastra_worker_last_checkpoint_step 5.0",
        "elastra_worker_world_version 2.0",
    ):
        assert line in text
    write(tmp_path, assignment(3, stop=True))
    assert agents[0].wait(timeout=30) == exitcodes.OK


def on_object_storage(text: str, uri: str) -> str:
    """An assignment of a job with ``checkpoint.uri``: its path is the pod's own volume."""
    wire = json.loads(text)
    wire["checkpoint"]["uri"] = uri
    return json.dumps(wire)


def test_torchrun_mode_on_object_storage_carries_the_stop_checkpoint_to_another_pod(
    s3: str,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
    agents: list[subprocess.Popen[str]],
) -> None:
    """The staging folder of rank 0's pod is uploaded after the script's exit 0 on SIGTERM;
    a pod that starts the next world (its own empty volume) finds that checkpoint there."""
    pods = [tmp_path / "pod0", tmp_path / "pod1"]
    log = tmp_path / "events.jsonl"
    for pod in pods:
        pod.mkdir()
    write(pods[0], on_object_storage(assignment(1, ckpt=claim(pods[0]), port=free_port()), s3))
    agents.append(start_agent(pods[0], plain(tmp_path, "save"), args=["--launch", "torchrun"]))
    wait_for(lambda: len(starts(log)) == 1, 30, "the script in world version 1")
    write(pods[0], assignment(2, stop=True))  # a stop: SIGTERM, the script saves and exits 0
    assert agents[0].wait(timeout=60) == exitcodes.OK
    assert (pods[0] / "claim" / "t" / "ckpt.txt").read_text() == "1"

    write(pods[1], on_object_storage(assignment(2, ckpt=claim(pods[1]), port=free_port()), s3))
    agents.append(start_agent(pods[1], plain(tmp_path, "save"), args=["--launch", "torchrun"]))
    wait_for(lambda: len(starts(log)) == 2, 30, "the script in world version 2, another pod")
    assert [e.get("found") for e in events(log) if e["event"] == "start"] == [None, "1"]
    write(pods[1], assignment(3, stop=True))
    assert agents[1].wait(timeout=60) == exitcodes.OK


def test_torchrun_mode_on_object_storage_waits_for_the_previous_worlds_upload(
    s3: str,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
    agents: list[subprocess.Popen[str]],
) -> None:
    """Rank 1 stops at once and is rank 0 of the next world; rank 0 takes 2 s to save and then
    uploads. The new rank 0 starts its script only after that upload, so it finds the save."""
    pods = [tmp_path / "pod0", tmp_path / "pod1"]
    log = tmp_path / "events.jsonl"
    for rank, (pod, mode) in enumerate(zip(pods, ("slow-save", "forever"), strict=True)):
        pod.mkdir()
        write(pod, on_object_storage(
            assignment(1, rank=rank, size=2, ckpt=claim(pod), port=free_port()), s3))  # fmt: skip
        agents.append(start_agent(pod, plain(tmp_path, mode), args=["--launch", "torchrun"]))
    wait_for(lambda: len(starts(log)) == 2, 30, "both scripts in world version 1")
    write(pods[0], assignment(2, stop=True))  # scaled in
    write(pods[1], on_object_storage(assignment(2, ckpt=claim(pods[1]), port=free_port()), s3))
    wait_for(lambda: len(starts(log)) == 3, 60, "the script in world version 2")
    assert [e.get("found") for e in events(log) if e["event"] == "start"] == [None, None, "1"]
    assert agents[0].wait(timeout=30) == exitcodes.OK
    write(pods[1], assignment(3, stop=True))
    assert agents[1].wait(timeout=60) == exitcodes.OK


def test_torchrun_mode_on_a_missing_bucket_is_permanent_before_the_script(
    s3: str,  # noqa: F811 - the fixture imported above (the server, its credentials)
    tmp_path: Path,
) -> None:
    missing = "s3://no-such-bucket-" + s3.split("/")[2] + "/ckpt"
    write(
        tmp_path, on_object_storage(assignment(1, ckpt=claim(tmp_path), port=free_port()), missing)
    )
    proc = start_agent(
        tmp_path, plain(tmp_path, "exit0"), args=["--launch", "torchrun"], stderr=subprocess.PIPE
    )
    assert proc.wait(timeout=60) == exitcodes.CONFIG
    assert proc.stderr is not None
    assert f"checkpoint.uri {missing}/t is not usable: " in proc.stderr.read()
    assert starts(tmp_path / "events.jsonl") == []


def test_torchrun_mode_kills_a_script_that_ignores_sigterm_after_the_grace(
    tmp_path: Path, agents: list[subprocess.Popen[str]]
) -> None:
    log = tmp_path / "events.jsonl"
    write(tmp_path, assignment(1, ckpt=claim(tmp_path), port=free_port()))
    agents.append(
        start_agent(
            tmp_path, plain(tmp_path, "ignore"), args=["--launch", "torchrun", "--grace", "1"]
        )
    )
    wait_for(lambda: len(starts(log)) == 1, 30, "the script in world version 1")
    asked = time.monotonic()
    write(tmp_path, assignment(2, ckpt=claim(tmp_path), port=free_port()))
    wait_for(lambda: len(starts(log)) == 2, 30, "the script in world version 2")
    assert time.monotonic() - asked >= 1.0  # the grace period was given
    assert [e["event"] for e in events(log)] == ["start", "sigterm", "start"]
    write(tmp_path, assignment(3, stop=True))
    assert agents[0].wait(timeout=30) == exitcodes.OK
    assert agent_state(tmp_path)["phase"] == "stopped"


@pytest.mark.parametrize(("mode", "code", "phase"), [("exit0", 0, "done"), ("crash", 75, "failed")])
def test_torchrun_mode_exit_0_is_done_and_a_crash_is_retryable(
    tmp_path: Path, mode: str, code: int, phase: str
) -> None:
    write(tmp_path, assignment(1, ckpt=claim(tmp_path), port=free_port()))
    proc = start_agent(tmp_path, plain(tmp_path, mode), env={"ELASTRA_LAUNCH": "torchrun"})
    assert proc.wait(timeout=60) == code
    assert agent_state(tmp_path)["phase"] == phase
    assert (
        starts(tmp_path / "events.jsonl")[0]["GROUP_RANK"] == "0"
    )  # torchrun mode by $ELASTRA_LAUNCH


def test_torchrun_mode_an_unusable_checkpoint_folder_is_permanent_before_the_script(
    tmp_path: Path,
) -> None:
    """The job's folder cannot be made (the claim is a regular file): exit 2 with the line."""
    (tmp_path / "claim").write_text("not a folder")
    write(tmp_path, assignment(1, ckpt=claim(tmp_path), port=free_port()))
    proc = start_agent(
        tmp_path, plain(tmp_path, "exit0"), args=["--launch", "torchrun"], stderr=subprocess.PIPE
    )
    assert proc.wait(timeout=60) == exitcodes.CONFIG
    assert proc.stderr is not None
    assert f"checkpoint root {tmp_path / 'claim' / 't'} is not usable" in proc.stderr.read()
    assert starts(tmp_path / "events.jsonl") == []


def test_unknown_launch_mode_is_a_permanent_error(tmp_path: Path) -> None:
    write(tmp_path, assignment(1, ckpt=claim(tmp_path), port=free_port()))
    proc = start_agent(tmp_path, plain(tmp_path, "exit0"), env={"ELASTRA_LAUNCH": "mpirun"})
    assert proc.wait(timeout=60) == exitcodes.CONFIG


def test_torchrun_mode_exit_0_as_a_new_world_is_assigned_is_a_stop(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    write(tmp_path, assignment(1, ckpt=claim(tmp_path), port=free_port()))
    staged = assignment(2, ckpt=claim(tmp_path), port=free_port())
    (tmp_path / "next-assignment").write_text(staged)
    proc = start_agent(
        tmp_path, plain(tmp_path, "resize-then-exit0"), args=["--launch", "torchrun"]
    )
    # Not "done" in version 1: the script runs again in version 2, exits 0 unasked there: done.
    assert proc.wait(timeout=30) == exitcodes.OK
    assert [s["ELASTRA_WORLD_VERSION"] for s in starts(log)] == ["1", "2"]
    assert agent_state(tmp_path)["phase"] == "done"
