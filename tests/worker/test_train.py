"""The reference trainer under the local launcher: resized through five plans, it trains the
same steps on the same samples with the same losses as a static run (the issue's done-when).

The schedule goes data parallel -> tensor parallel -> pipeline -> tensor x pipeline with
ZeRO-3 on twice the ranks -> data parallel on half: each change is a new world version that
stops at a step boundary, checkpoints, and restores resharded into the new layout.
"""

from __future__ import annotations

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


def train(tmp: Path, schedule: str, model: Path) -> LocalRun:
    trainer = ("-m", "elastra_worker.train", "--model", str(model), "--dataset-size", "4096")
    run = run_local(tmp, schedule, consistency="data", steps=STEPS, trainer=trainer, timeout=600)
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
