"""Models nobody here wrote, trained through plan changes with no hook: Hugging Face's
``LlamaForCausalLM`` and ``GPT2LMHeadModel`` (tiny configs, ``worker_image/examples/train_hf.py``)
under the local launcher, data parallel then FSDP (ZeRO-3, then ZeRO-2 over 3 ranks) then data
parallel again, against a static data-parallel run: the same samples at every step and the loss
within 2% (what the issue asks; in practice the plans differ only in reduction order).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import REPO, LocalRun, run_local

pytestmark = pytest.mark.slow

TRAINER = REPO / "worker_image" / "examples" / "train_hf.py"
STEPS = 12
SCHEDULE = "2:0,2:3:sharding=full,3:6:sharding=optimizer,2:9"
# the world starting at each step of SCHEDULE: (its size, whether prepare() sharded the model)
WORLDS = {3: (2, True), 6: (3, True), 9: (2, False)}
# the class prepare() returns for a sharded plan (FSDP2 swaps the model's class)
SHARDED = {"llama": "FSDPLlamaForCausalLM", "gpt2": "FSDPGPT2LMHeadModel"}


def train(tmp: Path, arch: str, schedule: str) -> LocalRun:
    trainer = [str(TRAINER), "--arch", arch, "--dataset-size", "500"]
    run = run_local(tmp, schedule, consistency="data", steps=STEPS, trainer=trainer)
    assert run.returncode == 0, run.output[-3000:]
    assert sorted(run.by_step()) == list(range(STEPS)), run.output[-3000:]
    return run


def max_relative_loss_difference(run: LocalRun, static: LocalRun) -> float:
    got, want = run.by_step(), static.by_step()
    for step in range(STEPS):
        assert got[step]["samples"] == want[step]["samples"], f"step {step}: samples differ"
    return max(abs(got[k]["loss"] - want[k]["loss"]) / abs(want[k]["loss"]) for k in range(STEPS))


@pytest.mark.parametrize("arch", sorted(SHARDED))
def test_a_hugging_face_model_trains_through_plan_changes_as_a_static_run(
    tmp_path: Path, arch: str
) -> None:
    static = train(tmp_path / "static", arch, "2:0")
    run = train(tmp_path / "elastic", arch, SCHEDULE)
    for step, (size, sharded) in WORLDS.items():
        wrapper = SHARDED[arch] if sharded else "DistributedDataParallel"
        line = f"({wrapper}) from step {step} in a world of {size}"
        assert line in run.output, run.output[-3000:]
    difference = max_relative_loss_difference(run, static)
    print(f"{arch}: largest relative loss difference to the static run {difference:.2e}")
    assert difference < 0.02
    losses = [static.by_step()[k]["loss"] for k in range(STEPS)]
    assert losses[-1] < losses[0], f"{arch} does not learn: {losses}"
