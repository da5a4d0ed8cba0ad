"""Resize downtime in step-time units: what a shrink, a grow and a plan change cost a job.

Runs the example GPT under the local launcher with a 2 -> 1 -> 2 -> 2 (micro-batches of 1) ->
2 (sharded) -> 1 (sharded) -> 2 (replicated again) schedule (data mode) twice in one run: once
through storage (every world change restarts the trainers, which read the committed checkpoint
back: ``ELASTRA_IN_MEMORY_RESIZE=0``) and once as the agent does by default (trainers whose pod
stays move to the next world in their own processes and keep the state in memory; a joiner
takes it from them over the new process group; into the sharded plan, from a world that ended
at its own stop step with nothing kept, they restart through storage; in the sharded plan's
shrink and on the way out of it the trainers run their script again and load the state
resharded from the members' memory, the part the leaving member held from the checkpoint
committed at the stop, the joiner's from the member). The
step time is the median time between two steps inside a world; a resize's downtime is the time
from the old world's last step to the new world's first step, minus one step of the new world
(the median of its own; until 2026-12-06, the run's median, which counted the slower steps of
the sharded plan as downtime). It is split, from
the trainers' own log lines, into stop + checkpoint (to the commit of the stop step, or where a
survivor carries the state, to rank 0's line saying it holds that step unsaved: the new world
commits it in the background), state (to
rank 0's line saying where its state came from: a restart, rendezvous and load from storage,
or a rendezvous and a transfer from peers) and the rest (the first step's extra work).

The state's size decides what a resize through storage costs, so the model is sized by flags
(``--d-model 1024 --layers 8``: about 1.2 GB of parameters and AdamW state). The same run
measures raw loopback TCP throughput, so a transfer of the state between peers has its yardstick
(the issue's target: at most 3 step times plus the state's bytes at half that throughput for a
grow or a plan change, 2 step times for a shrink); the figures are ratios within this one run,
never pass/fail.

Environment: ``BENCH_RESIZE_STEPS`` (steps per world, default 15; ``--steps-per-world`` wins).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from elastra_worker.agent import IN_MEMORY_RESIZE_ENV

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "worker_image" / "examples" / "train_tiny_gpt.py"
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (.*)$")
_PEERS = re.compile(
    r"rank (?P<rank>\d+) resumed step \d+ (from peers \(rank \d+ sent|resharded from the "
    r"members' memory \() ?(?P<mb>[\d.]+) MB (from peers )?in (?P<s>[\d.]+)s"
    r"(\)|; (?P<stored>[\d.]+) MB that left with a member from storage\))"
)
LOOPBACK_BYTES = 512 * 2**20
CHUNK = 4 * 2**20


def _stamp(line: str) -> tuple[float, str] | None:
    m = _STAMP.match(line)
    if not m:
        return None
    when = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return when, m.group(2)


def loopback_throughput(total: int = LOOPBACK_BYTES) -> float:
    """Bytes per second one TCP connection carries over 127.0.0.1 (send and receive here)."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    received = 0

    def drain() -> None:
        nonlocal received
        conn, _ = server.accept()
        with conn:
            while chunk := conn.recv(CHUNK):
                received += len(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    payload = b"\0" * CHUNK
    start = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port)) as client:
        for _ in range(total // CHUNK):
            client.sendall(payload)
    reader.join()
    elapsed = time.perf_counter() - start
    server.close()
    return received / elapsed


def checkpoint_bytes(root: Path) -> int:
    """The largest committed checkpoint under ``root``: the state a resize through storage
    writes and reads back."""
    sizes = [
        sum(f.stat().st_size for f in step.rglob("*") if f.is_file())
        for step in root.rglob("step-*")
        if step.is_dir() and ".partial" not in step.parts
    ]
    return max(sizes, default=0)


@dataclass
class Run:
    """One launcher run: rank 0's step records as they appeared, and the trainers' log."""

    arrivals: dict[int, tuple[float, dict[str, Any]]]
    log_lines: list[str]
    state_bytes: int


def run_schedule(
    schedule: str, steps: int, model_args: Sequence[str], *, in_memory: bool
) -> Run | None:
    """Run the example under ``elastra-worker local``, timestamping each step as it is logged;
    the run's folder (checkpoints of a gigabyte or more) is removed before returning."""
    work = Path(tempfile.mkdtemp(prefix="elastra-bench-resize-"))
    try:
        return _run_in(work, schedule, steps, model_args, in_memory=in_memory)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_in(
    work: Path, schedule: str, steps: int, model_args: Sequence[str], *, in_memory: bool
) -> Run | None:
    log = work / "steps.jsonl"
    arrivals: dict[int, tuple[float, dict[str, Any]]] = {}
    done = threading.Event()

    def tail() -> None:
        seen = 0
        while not done.is_set():
            if log.exists():
                lines = log.read_text().splitlines()
                for line in lines[seen:]:
                    rec = json.loads(line)
                    arrivals.setdefault(int(rec["step"]), (time.time(), rec))
                seen = len(lines)
            time.sleep(0.002)

    watcher = threading.Thread(target=tail, daemon=True)
    watcher.start()
    env = dict(os.environ, ELASTRA_THREADS="1", OMP_NUM_THREADS="1")
    env[IN_MEMORY_RESIZE_ENV] = "1" if in_memory else "0"
    cmd = [
        sys.executable, "-m", "elastra_worker.cli", "local", "--schedule", schedule,
        "--steps", str(steps), "--checkpoint-dir", str(work / "ckpt"), "--log", str(log),
        "--consistency", "data", "--world-timeout", "300",
        "--", sys.executable, str(EXAMPLE), *model_args,
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600, check=False)
    time.sleep(0.05)
    done.set()
    watcher.join()
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        return None
    return Run(arrivals, proc.stderr.splitlines(), checkpoint_bytes(work / "ckpt"))


def report(run: Run, *, entries: Sequence[str], loopback: float, state: int) -> None:
    """Print the step time, and each resize's downtime in step times with its parts;
    ``entries`` are the schedule's, one per world in order (the step log's plan label does
    not show the sharding)."""
    worlds: dict[int, list[int]] = {}
    for step, (_, rec) in sorted(run.arrivals.items()):
        worlds.setdefault(int(str(rec["worldVersion"])), []).append(step)

    def intervals(members: list[int]) -> list[float]:
        # each world's first step skipped (warm-up)
        return [run.arrivals[s][0] - run.arrivals[s - 1][0] for s in members[2:]]

    step_s = statistics.median([i for members in worlds.values() for i in intervals(members)])
    events = [e for e in (_stamp(x) for x in run.log_lines) if e is not None]

    def first_after(t: float, pattern: str) -> float | None:
        for when, text in events:
            if when >= t - 0.002 and re.search(pattern, text):
                return when
        return None

    transfer_s = state / (0.5 * loopback)
    print(f"  step time (median within a world): {step_s * 1000:.1f} ms")
    print(
        f"  state: {state / 2**30:.2f} GiB committed; loopback TCP {loopback / 2**30:.2f} GiB/s;"
        f" the state at half of it: {transfer_s:.2f} s = {transfer_s / step_s:.1f} step times"
    )
    versions = sorted(worlds)
    entry = dict(zip(versions, entries, strict=True))
    for old, new in itertools.pairwise(versions):
        last, first = worlds[old][-1], worlds[new][0]
        t_last, t_first = run.arrivals[last][0], run.arrivals[first][0]
        # The new world's first step is one of its own steps, not downtime: a plan whose steps
        # are slower (a sharded one on CPU gloo: 3x on 2 cores, 2026-12-06) would otherwise
        # count the difference as time lost to the resize.
        own = statistics.median(intervals(worlds[new]) or [step_s])
        downtime = t_first - t_last - own
        commit = first_after(t_last, rf"rank 0 (committed|holds) step {last + 1}\b")
        resumed = first_after(t_last, r"rank 0 (restored|resumed) step")
        parts = ""
        if commit and resumed:
            parts = (
                f" = stop+checkpoint {(commit - t_last) / step_s:.1f}"
                f" + state {(resumed - commit) / step_s:.1f}"
                f" + first step {(t_first - resumed - own) / step_s:.1f}"
            )
        if abs(own - step_s) > 0.25 * step_s:
            parts += f" (its steps {own:.2f} s)"
        source = run.arrivals[first][1].get("stateFrom", "?")
        print(
            f"  world {old} -> {new} ({entry[old]} -> {entry[new]}, state from {source}): "
            f"{downtime:.2f} s = {downtime / step_s:.1f} step times{parts}"
        )
        for when, text in events:
            sent = _PEERS.search(text)
            if sent and t_last <= when <= t_first:
                rate = float(sent["mb"]) * 1e6 / max(float(sent["s"]), 1e-9)
                stored = f"; {float(sent['stored']) / 1e3:.2f} GB from storage" if sent[
                    "stored"] else ""  # fmt: skip
                print(
                    f"    rank {sent['rank']} took {float(sent['mb']) / 1e3:.2f} GB from peers "
                    f"in {sent['s']} s: {rate / 2**30:.2f} GiB/s = {rate / loopback:.2f}x "
                    f"loopback TCP{stored}"
                )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the schedule, then print the figures; never pass/fail on time."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument(
        "--steps-per-world", type=int, default=int(os.environ.get("BENCH_RESIZE_STEPS", "15"))
    )
    args = p.parse_args(argv)
    n = args.steps_per_world
    schedule = (
        f"2:0,1:{n},2:{2 * n},2:{3 * n}:mb=1,2:{4 * n}:sharding=full,1:{5 * n}:sharding=full,"
        f"2:{6 * n}"
    )
    loopback = loopback_throughput()
    model = ["--d-model", str(args.d_model), "--layers", str(args.layers)]
    print(f"resize downtime, schedule {schedule}, tiny GPT d={args.d_model} x{args.layers}")
    for title, in_memory in (("restart and storage", False), ("in memory and peers", True)):
        print(f"{title}:")
        run = run_schedule(schedule, 7 * n, model, in_memory=in_memory)
        if run is None:
            return 1
        report(run, entries=schedule.split(","), loopback=loopback, state=run.state_bytes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
