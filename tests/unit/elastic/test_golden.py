"""Seeded random event orders against golden decision logs for the pure resize policy.

Each seed drives a small simulated job (desired size changes, workers failing, nodes lost,
new pods becoming Ready) through ``decide`` and writes one line per decision. The log must
equal the committed golden file: any change in the policy's behaviour shows up as a diff a
reviewer reads. Regenerate deliberately with ``ELASTRA_UPDATE_GOLDEN=1``.
"""

from __future__ import annotations

import os
import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from elastra.elastic.resize import ResizeInput, ResizePolicy, decide
from elastra.elastic.workers import PodName, WorkerState, WorkerView

GOLDEN = Path(__file__).parent / "golden"
POLICY = ResizePolicy(
    settle=timedelta(seconds=2),
    pending_grace=timedelta(seconds=20),
    cooldown=timedelta(seconds=10),
    retire_timeout=timedelta(seconds=30),
)


def transcript(seed: int, steps: int = 60) -> str:
    rng = random.Random(seed)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    desired, minimum = 6, 2
    workers: dict[str, WorkerView] = {}
    world: tuple[PodName, ...] = ()
    last_resize: datetime | None = None
    next_slot = 0
    lines = []
    for step in range(steps):
        event = rng.choice(["tick", "tick", "ready", "fail", "lose", "scale", "free"])
        note = event
        if event == "ready":
            for name, w in sorted(workers.items()):
                if w.state in (WorkerState.PENDING, WorkerState.GATED):
                    workers[name] = replace(w, state=WorkerState.READY, since=now)
        elif event in ("fail", "lose") and world:
            victim = rng.choice(sorted(world))
            state = WorkerState.FAILED if event == "fail" else WorkerState.LOST
            workers[victim] = replace(workers[victim], state=state, since=now)
            note = f"{event} {victim}"
        elif event == "scale":
            desired = rng.randint(minimum, 8)
            note = f"scale {desired}"
        placeable = rng.randint(0, 3) if event == "free" else rng.randint(0, 1)
        decision = decide(
            ResizeInput(
                desired=desired,
                minimum=minimum,
                world=world,
                workers=tuple(workers.values()),
                placeable=placeable,
                now=now,
                last_resize=last_resize,
            ),
            POLICY,
        )
        for name in decision.delete:
            workers.pop(name, None)
        for name in decision.retire:
            workers[name] = replace(workers[name], retiring_since=now)
        created = []
        for _ in range(decision.create):
            name = PodName(f"w{next_slot}")
            workers[name] = WorkerView(
                pod=name, slot=next_slot, state=WorkerState.PENDING, since=now
            )
            created.append(name)
            next_slot += 1
        if decision.world is not None:
            world = decision.world + (tuple(created) if decision.joins else ())
            last_resize = now
        lines.append(
            f"{step:02d} {note:<12} -> {decision.reason.value:<20} "
            f"world={','.join(world) or '-'} create={decision.create} "
            f"delete={','.join(sorted(decision.delete)) or '-'} "
            f"retire={','.join(sorted(decision.retire)) or '-'}"
            + (" degraded" if decision.degraded else "")
        )
        now += timedelta(seconds=rng.choice([1, 3, 5, 12]))
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_decision_log_matches_golden(seed: int) -> None:
    path = GOLDEN / f"resize-seed-{seed}.log"
    log = transcript(seed)
    if os.environ.get("ELASTRA_UPDATE_GOLDEN"):
        path.write_text(log)
    assert path.exists(), f"no golden log {path.name}: run with ELASTRA_UPDATE_GOLDEN=1"
    assert log == path.read_text(), f"decisions changed for seed {seed}: diff against {path}"


def test_transcript_is_deterministic() -> None:
    assert transcript(7) == transcript(7)
