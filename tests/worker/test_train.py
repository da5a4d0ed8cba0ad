"""The reference trainer under the local launcher: resized through five plans, it trains the
same steps on the same samples with the same losses as a static run (the issue's done-when).

The schedule goes data parallel -> tensor parallel -> pipeline -> tensor x pipeline with
ZeRO-3 on twice the ranks -> data parallel on half: each change is a new world version that
stops at a step boundary, checkpoints, and restores resharded into the new layout.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.worker.conftest import LocalRun, quiet_env, run_local

STEPS = 50
SCHEDULE = "4:0,4:10:tp=2,4:20:pp=2,8:30:tp=2/pp=2/sharding=full,2:40"
MODEL = {
    "layers": 4,
    "hiddenSize": 32,
    "ffnHiddenSize": 64,
    "attentionHeads": 4,
    "kvHeads": 2,
    "vocabSize": 97,
    "sequenceLength": 16,
}


def train(
    tmp: Path, schedule: str, model: Path, *, steps: int = STEPS, extra: tuple[str, ...] = ()
) -> LocalRun:
    trainer = ("-m", "elastra_worker.train", "--model", str(model), "--dataset-size", "4096")
    run = run_local(tmp, schedule, consistency="data", steps=steps, trainer=trainer,
                    timeout=600, extra=extra)  # fmt: skip
    assert run.returncode == 0, run.output[-4000:]
    return run


@pytest.mark.timeout(900)
def test_five_plans_train_the_static_runs_steps_samples_and_losses(tmp_path: Path) -> None:
    model = tmp_path / "model.yaml"
    model.write_text(yaml.safe_dump(MODEL))
    static = train(tmp_path / "static", "4:0", model).by_step()
    elastic = train(tmp_path / "elastic", SCHEDULE, model)
    assert [r["step"] for r in elastic.records] == list(range(STEPS)), "each step once"
    plans = [elastic.by_step()[k]["plan"] for k in (0, 10, 20, 30, 40)]
    assert plans == ["dp4tp1pp1", "dp2tp2pp1", "dp2tp1pp2", "dp2tp2pp2", "dp2tp1pp1"]
    for step, record in elastic.by_step().items():
        want = static[step]
        assert record["samples"] == want["samples"], f"step {step}: other samples"
        assert record["loss"] == pytest.approx(want["loss"], rel=0.02), f"step {step}"
    assert static[STEPS - 1]["loss"] < static[0]["loss"], "the model learns"


@pytest.mark.timeout(600)
def test_a_sharded_tensor_parallel_state_saved_in_the_background_is_restored(
    tmp_path: Path,
) -> None:
    """ZeRO-3 x tensor parallel (DTensors): the periodic saves of steps 2 and 4 are written by
    the background thread while training goes on; rank 1 dies in step 5, and the next world
    restores the newest of them committed by then (4, or 2 if 4's commit was not through) and
    trains the same losses as a run without the kill."""
    model = tmp_path / "model.yaml"
    model.write_text(yaml.safe_dump(MODEL))
    plan, every = "4:0:tp=2/sharding=full", ("--checkpoint-every", "2")
    static = train(tmp_path / "static", plan, model, steps=8, extra=every).by_step()
    killed = train(tmp_path / "killed", plan, model, steps=8, extra=(*every, "--fail", "1@5"))
    assert "staged step 4" in killed.output and "writing it in the background" in killed.output
    restored = re.findall(r"restored step (\d+)", killed.output)
    assert restored and set(restored) <= {"2", "4"}, killed.output[-4000:]
    assert [r["step"] for r in killed.records] == list(range(8)), "each step once"
    for step, record in killed.by_step().items():
        assert record["loss"] == pytest.approx(static[step]["loss"], rel=1e-5), f"step {step}"


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        ((), {}, "no model: pass --model FILE"),
        ((), {"ELASTRA_MODEL": '{"layers": 0}'}, "model.layers: expected an integer >= 1"),
        ((), {"ELASTRA_MODEL": "layers: 4"}, "$ELASTRA_MODEL is not JSON"),
        (("--model", "/nonexistent/model.yaml"), {}, "No such file"),
    ],
)
def test_a_bad_model_is_a_permanent_error_that_names_it(
    args: tuple[str, ...], env: dict[str, str], message: str
) -> None:
    base = {k: v for k, v in quiet_env().items() if k != "ELASTRA_MODEL"}
    out = subprocess.run(
        [sys.executable, "-m", "elastra_worker.train", *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 2, out.stderr
    assert message in out.stderr
    assert "Traceback" not in out.stderr
