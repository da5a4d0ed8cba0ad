"""Resize overhead in step-time units: what one world-size change costs a training job.

Runs the example GPT under the local launcher with a 2 -> 1 -> 2 schedule (data mode, DDP) and
watches rank 0's step log as it grows. The step time is the median time between two steps inside
a world; the overhead of a resize is the time from the old world's last step to the new world's
first step, minus one step. It is split, from the trainers' own log lines, into stop + checkpoint
(to the commit of the stop step), restart (new processes, import, rendezvous), load (restore of
the resharded checkpoint) and the rest (the first step's extra work: DDP set-up, warm-up).

Environment: ``BENCH_RESIZE_STEPS`` (steps per world, default 15).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "worker_image" / "examples" / "train_tiny_gpt.py"
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (.*)$")


def _stamp(line: str) -> tuple[float, str] | None:
    m = _STAMP.match(line)
    if not m:
        return None
    when = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return when, m.group(2)


def main() -> int:
    """Print the step time and each resize's overhead in steps; never pass/fail on time."""
    per_world = int(os.environ.get("BENCH_RESIZE_STEPS", "15"))
    steps = 3 * per_world
    schedule = f"2:0,1:{per_world},2:{2 * per_world}"
    work = Path(tempfile.mkdtemp(prefix="elastra-bench-resize-"))
    log = work / "steps.jsonl"
    arrivals: dict[int, tuple[float, dict[str, object]]] = {}
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
    cmd = [
        sys.executable, "-m", "elastra_worker.cli", "local", "--schedule", schedule,
        "--steps", str(steps), "--checkpoint-dir", str(work / "ckpt"), "--log", str(log),
        "--consistency", "data", "--world-timeout", "300",
        "--", sys.executable, str(EXAMPLE), "--d-model", "128", "--layers", "4",
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=False)
    time.sleep(0.05)
    done.set()
    watcher.join()
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        return 1

    worlds: dict[int, list[int]] = {}
    for step, (_, rec) in sorted(arrivals.items()):
        worlds.setdefault(int(str(rec["worldVersion"])), []).append(step)
    intervals = [
        arrivals[s][0] - arrivals[s - 1][0]
        for members in worlds.values()
        for s in members[2:]  # skip each world's first step (warm-up)
    ]
    step_s = statistics.median(intervals)
    events = [e for e in (_stamp(x) for x in proc.stderr.splitlines()) if e is not None]

    def first_after(t: float, pattern: str) -> float | None:
        for when, text in events:
            if when >= t - 0.002 and re.search(pattern, text):
                return when
        return None

    print(f"resize overhead, schedule {schedule}, tiny GPT d=128 x4 layers, gloo, CPU")
    print(f"  step time (median within a world): {step_s * 1000:.1f} ms")
    versions = sorted(worlds)
    totals = []
    for old, new in itertools.pairwise(versions):
        last, first = worlds[old][-1], worlds[new][0]
        t_last, t_first = arrivals[last][0], arrivals[first][0]
        overhead = t_first - t_last - step_s
        totals.append(overhead / step_s)
        commit = first_after(t_last, rf"rank 0 committed step {last + 1}\b")
        joined = first_after(t_last, rf"rank 0/\d+ joined world version {new}\b")
        restored = first_after(t_last, r"rank 0 restored step")
        parts = ""
        if commit and joined and restored:
            parts = (
                f" = stop+checkpoint {(commit - t_last) / step_s:.0f}"
                f" + restart {(joined - commit) / step_s:.0f}"
                f" + load {(restored - joined) / step_s:.0f}"
                f" + first step {(t_first - restored) / step_s - 1:.0f}"
            )
        print(
            f"  world {old} -> {new} ({len(worlds[old]) and arrivals[last][1]['worldSize']} -> "
            f"{arrivals[first][1]['worldSize']} ranks): {overhead:.2f} s"
            f" = {overhead / step_s:.0f} steps{parts}"
        )
    print(f"  median resize overhead: {statistics.median(totals):.0f} step times")
    return 0


if __name__ == "__main__":
    sys.exit(main())
