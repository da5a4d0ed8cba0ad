"""Random SIGKILLs of trainers, in the middle of steps and between writing a checkpoint's shards
and its commit, on the local launcher: nothing is lost beyond the newest committed checkpoint.
Periodic saves are written by the background thread (the default), so most kills in saves
strike that thread while the training thread is already in the next steps.

Every trainer draws its death from (seed, world version, rank, step) (``faults.Chaos``), so a
run's faults repeat. After the run the checks of the e2e suite judge what the workers recorded:
the step log holds steps 0..N once each with exactly a static run's samples, every world
restored the newest checkpoint committed before it (never an older one), and every committed
checkpoint left on disk verifies. ``ELASTRA_CHAOS_KILLS`` asks for a longer run with at least
that many kills (docs/benchmarks.md, "Faults injected": ``ELASTRA_CHAOS_KILLS=200 pytest
tests/worker/test_chaos.py -s --timeout 4700``: 255 kills, 173 of them in saves, in 33 min).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from e2e.trainlog import (
    check_contiguous,
    check_data_order,
    check_resumes,
    parse_step_log,
    resumes,
)

from .conftest import run_local
from .test_elastic import assert_checkpoints_intact

pytestmark = pytest.mark.slow

KILL = re.compile(r"elastra-fault: rank (\d+) of world v(\d+) killed (mid-step|in-save-of-step)")
SEED, P_STEP, P_SAVE = 7, 0.02, 0.1
CHECKPOINT_EVERY = 2
DATASET_SIZE, GLOBAL_BATCH = 500, 24  # run_local's example arguments
STEPS_PER_KILL = 5  # about 0.2 kills per step trained at these probabilities with 3 ranks
SECONDS_PER_KILL = 40.0  # a failed world, its survivors stopped, a new one formed: 10-20 s


def test_random_kills_during_steps_and_saves_lose_nothing(tmp_path: Path) -> None:
    wanted = int(os.environ.get("ELASTRA_CHAOS_KILLS", "4"))
    steps = max(24, wanted * STEPS_PER_KILL)
    started = time.monotonic()
    run = run_local(
        tmp_path,
        "3:0",
        consistency="data",
        steps=steps,
        extra=[
            "--checkpoint-every", str(CHECKPOINT_EVERY),
            "--chaos", f"{SEED}:{P_STEP}:{P_SAVE}",
            "--max-failed-worlds", str(10 * wanted + 20),
        ],
        timeout=300 + wanted * SECONDS_PER_KILL,
    )  # fmt: skip
    assert run.returncode == 0, run.output[-3000:]
    kills = KILL.findall(run.output)
    in_save = sum(1 for k in kills if k[2] == "in-save-of-step")
    assert len(kills) >= min(wanted, 3), f"only {len(kills)} kills: the faults did not fire"
    records = parse_step_log((tmp_path / "steps.jsonl").read_text())
    check_contiguous(records)
    assert len(records) == steps
    assert check_data_order(
        records, seed=0, dataset_size=DATASET_SIZE, global_batch_size=GLOBAL_BATCH
    ) == len(records)
    found = resumes(run.output.splitlines())
    assert found, "no world restored a checkpoint"
    check_resumes(found)
    assert_checkpoints_intact(tmp_path / "ckpt")
    print(
        f"chaos: {len(kills)} SIGKILLs ({in_save} in saves) over {steps} steps, "
        f"{len(found)} restores, each of the newest commit; 0 steps lost; "
        f"{time.monotonic() - started:.0f}s"
    )
