"""What the workers of a job say they did, read back and judged: worlds, resumes, data order.

Why: the e2e suite and `make demo` must prove from the workers' own records, not from the
operator's status alone, that a resized job lost no step and saw the same samples per step as
a static run. Two sources, both written by the worker runtime (elastra_worker):

- the step log (``ELASTRA_STEP_LOG``, written by rank 0): one JSON object per optimizer step
  with ``step``, ``worldVersion``, ``worldSize``, the sorted ``samples`` of that step, when it
  ended (``endedAt``, wall clock) and, on a resumed world's first step,
  ``resizeDowntimeSeconds``: how long training stopped. A world that resumes from a checkpoint
  rewrites the records of the steps it redoes, so the file holds exactly one record per step,
  each from the world that finally trained it.
- the worker pods' logs: ``rank 0 committed step N`` when a checkpoint is committed and
  ``rank 0 restored step N ... into a world of W`` when a new world loads it, or ``rank 0
  resumed step N from memory|peers ... into a world of W`` when it keeps the state a survivor
  of the resize holds (such a world commits that step in the background after it resumed, so
  it may be newer than every commit logged before it).

Pure functions over text, so they are tested without a cluster (e2e/suite/test_trainlog.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from elastra_worker.dataorder import DataOrder

_COMMITTED = re.compile(r"^(\S+ \S+) .*\brank 0 committed step (\d+)\b")
_RESTORED = re.compile(
    r"^(\S+ \S+) .*\brank 0 (?:restored|resumed) step (\d+) .*into a world of (\d+)"
)


class TrainLogError(AssertionError):
    """The workers' records contradict what a correct elastic run must show."""


@dataclass(frozen=True)
class StepRecord:
    step: int
    world_version: int
    world_size: int
    samples: tuple[int, ...]
    downtime_s: float | None = None
    """On a resumed world's first step: seconds since the end of the step it resumed from."""
    goodput: float | None = None
    """The job's goodput at this step (a fraction; from a world's second step on)."""
    ended_at: float | None = None
    """When the step ended, wall-clock seconds since the epoch (rank 0's clock)."""
    state_from: str | None = None
    """On a resumed world's first step: where rank 0's state came from (memory, peers,
    storage)."""


@dataclass(frozen=True)
class WorldSpan:
    """The steps one world version trained (as the final step log keeps them)."""

    version: int
    size: int
    first_step: int
    last_step: int


@dataclass(frozen=True)
class Resume:
    """One rank-0 restore: the checkpoint step a new world loaded, and the newest one before."""

    when: str
    step: int
    world_size: int
    last_committed: int | None


def parse_step_log(text: str) -> list[StepRecord]:
    """The records of a step log; a line that is not a complete JSON record is an error."""
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            records.append(
                StepRecord(
                    step=int(raw["step"]),
                    world_version=int(raw["worldVersion"]),
                    world_size=int(raw["worldSize"]),
                    # a plain torchrun script logs no samples: it has no data-order contract
                    samples=tuple(int(s) for s in raw.get("samples", ())),
                    downtime_s=_seconds(raw.get("resizeDowntimeSeconds")),
                    goodput=_seconds(raw.get("goodput")),
                    ended_at=_seconds(raw.get("endedAt")),
                    state_from=raw.get("stateFrom"),
                )
            )
        except (ValueError, KeyError, TypeError) as err:
            raise TrainLogError(f"step log line {number} is not a step record: {err}") from err
    return records


def _seconds(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def check_contiguous(records: Sequence[StepRecord]) -> None:
    """Steps 0..N each exactly once and in order: no step skipped, none counted twice."""
    steps = [r.step for r in records]
    if steps != list(range(len(steps))):
        missing = sorted(set(range(max(steps, default=-1) + 1)) - set(steps))
        raise TrainLogError(f"step log is not steps 0..N once each: missing {missing[:10]}")


def world_spans(records: Sequence[StepRecord]) -> list[WorldSpan]:
    """Consecutive runs of one world version; versions must only grow along the steps."""
    spans: list[WorldSpan] = []
    for r in records:
        if spans and spans[-1].version == r.world_version:
            spans[-1] = WorldSpan(r.world_version, r.world_size, spans[-1].first_step, r.step)
            continue
        if spans and r.world_version < spans[-1].version:
            raise TrainLogError(
                f"world version went back from {spans[-1].version} to {r.world_version} "
                f"at step {r.step}"
            )
        spans.append(WorldSpan(r.world_version, r.world_size, r.step, r.step))
    return spans


def check_data_order(
    records: Iterable[StepRecord], *, seed: int, dataset_size: int, global_batch_size: int
) -> int:
    """Every step trained exactly the samples a static run takes at that step; returns steps."""
    order = DataOrder(seed, dataset_size, global_batch_size)
    checked = 0
    for r in records:
        expected = tuple(sorted(order.step_samples(r.step)))
        if r.samples != expected:
            raise TrainLogError(
                f"step {r.step} (world {r.world_version}, size {r.world_size}) trained other "
                f"samples than a static run: {list(r.samples)[:6]}... != {list(expected)[:6]}..."
            )
        checked += 1
    return checked


def resumes(log_lines: Iterable[str]) -> list[Resume]:
    """Rank-0 restores in time order, each with the newest rank-0 commit logged before it.

    ``log_lines`` are the timestamped lines of every worker pod (any order): rank 0 may move
    between pods across worlds, so the lines are merged by their timestamps.
    """
    events: list[tuple[str, str, int, int]] = []
    for line in log_lines:
        if m := _COMMITTED.match(line):
            events.append((m[1], "commit", int(m[2]), 0))
        elif m := _RESTORED.match(line):
            events.append((m[1], "restore", int(m[2]), int(m[3])))
    events.sort(key=lambda e: (e[0], e[1] == "restore"))
    found: list[Resume] = []
    last: int | None = None
    for when, kind, step, size in events:
        if kind == "commit":
            last = step if last is None else max(last, step)
        else:
            found.append(Resume(when=when, step=step, world_size=size, last_committed=last))
    return found


def check_resumes(found: Sequence[Resume]) -> None:
    """Each new world resumed from the newest committed checkpoint or a newer step held in
    memory, never from an older one."""
    for r in found:
        if r.last_committed is not None and r.step < r.last_committed:
            raise TrainLogError(
                f"a world of {r.world_size} restored step {r.step} at {r.when}, but step "
                f"{r.last_committed} was the newest committed checkpoint: steps were lost"
            )
