"""``training.precision`` end to end: what each precision sets, and bf16 against fp32 in training.

The reference trainer runs 50 steps under the local launcher through the plans of the
exactness matrix (data, tensor, pipeline and interleaved pipeline parallel, both shardings,
both recompute modes), once in fp32 and once in bf16 (CPU autocast, FSDP's bf16 policy): the
bf16 loss stays within 3% of the fp32 loss at every step, and the step log says which
precision each step ran in. An fp16 run goes through a plan change with the session's own
GradScaler, whose scale (checkpointed) carries over into the next world.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml

from elastra_worker import precision
from elastra_worker.api import Session
from elastra_worker.assignment import Precision, parse_assignment
from elastra_worker.models.llama import make_batch
from elastra_worker.parallel_model import build_parallel, llama_recipe
from tests.worker.conftest import LocalRun, run_local
from tests.worker.distributed import TINY, run_world
from tests.worker.test_parallel_model import port_block
from tests.worker.test_train import MODEL

STEPS = 50
MATRIX = (
    "4:0,"  # dp4
    "4:10:tp=2/recompute=full,"  # dp2tp2
    "4:20:pp=2/sharding=optimizer,"  # dp2pp2, ZeRO-2
    "4:30:tp=2/pp=2/sharding=full,"  # tp2pp2, ZeRO-3
    "4:40:pp=2/vpp=2/recompute=selective"  # dp2pp2, interleaved
)
PLANS = {0: "dp4tp1pp1", 10: "dp2tp2pp1", 20: "dp2tp1pp2", 30: "dp1tp2pp2", 40: "dp2tp1pp2"}


# ---- what each precision sets ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "dtype", "scaler", "param_dtype"),
    [
        ("bf16", torch.bfloat16, False, torch.bfloat16),
        ("fp16", torch.float16, True, torch.float16),
        ("fp32", torch.float32, False, None),
    ],
)
def test_each_precision_sets_autocast_the_fsdp_policy_and_the_scaler(
    name: Precision, dtype: torch.dtype, scaler: bool, param_dtype: torch.dtype | None
) -> None:
    cpu = torch.device("cpu")
    a = torch.ones(4, 4)
    with precision.autocast(name, cpu):
        assert (a @ a).dtype == dtype
    policy = precision.fsdp_policy(name)
    assert policy.param_dtype == param_dtype
    assert policy.reduce_dtype == (None if param_dtype is None else torch.float32)
    made = precision.grad_scaler(name, cpu)
    assert (made is not None and made.is_enabled()) is scaler


def test_an_unknown_precision_is_refused() -> None:
    with pytest.raises(ValueError, match="expected one of bf16, fp16, fp32, got 'fp8'"):
        precision.compute_dtype("fp8")  # type: ignore[arg-type]


@pytest.fixture
def tf32_restored() -> Iterator[None]:
    matmul = torch.backends.cuda.matmul.fp32_precision
    conv = torch.backends.cudnn.conv.fp32_precision  # type: ignore[attr-defined]
    yield
    torch.backends.cuda.matmul.fp32_precision = matmul
    torch.backends.cudnn.conv.fp32_precision = conv  # type: ignore[attr-defined]


@pytest.mark.usefixtures("tf32_restored")
@pytest.mark.parametrize(
    ("value", "choice", "mode"), [("1", True, "tf32"), ("0", False, "ieee"), ("", None, None)]
)
def test_tf32_is_a_switch_and_unset_leaves_torch_alone(
    value: str, choice: bool | None, mode: str | None
) -> None:
    before = torch.backends.cuda.matmul.fp32_precision
    assert precision.apply_tf32({precision.TF32_ENV: value}) is choice
    assert torch.backends.cuda.matmul.fp32_precision == (mode or before)
    assert torch.backends.cudnn.conv.fp32_precision == (mode or "tf32")  # type: ignore[attr-defined]


def test_a_bad_tf32_value_names_the_variable() -> None:
    with pytest.raises(ValueError, match=r"\$ELASTRA_TF32: expected 0 or 1, got 'yes'"):
        precision.apply_tf32({precision.TF32_ENV: "yes"})


# ---- training --------------------------------------------------------------------------------


def train(tmp: Path, schedule: str, name: str, *, steps: int = STEPS) -> LocalRun:
    model = tmp / "model.yaml"
    tmp.mkdir(parents=True, exist_ok=True)
    model.write_text(yaml.safe_dump(MODEL))
    trainer = ("-m", "elastra_worker.train", "--model", str(model), "--dataset-size", "4096")
    run = run_local(tmp, schedule, consistency="data", steps=steps, trainer=trainer,
                    extra=("--precision", name), timeout=900)  # fmt: skip
    assert run.returncode == 0, run.output[-4000:]
    assert [r["step"] for r in run.records] == list(range(steps)), "each step once"
    assert {r["precision"] for r in run.records} == {name}, "the step log names the precision"
    return run


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_bf16_stays_within_3_percent_of_fp32_at_every_step_of_every_plan(tmp_path: Path) -> None:
    fp32 = train(tmp_path / "fp32", MATRIX, "fp32").by_step()
    bf16 = train(tmp_path / "bf16", MATRIX, "bf16").by_step()
    assert {k: bf16[k]["plan"] for k in PLANS} == PLANS
    worst = max(abs(bf16[k]["loss"] / fp32[k]["loss"] - 1) for k in range(STEPS))
    print(f"bf16 vs fp32 over {STEPS} steps: worst relative loss difference {worst:.4%}")
    for step in range(STEPS):
        assert bf16[step]["samples"] == fp32[step]["samples"], f"step {step}: other samples"
        assert bf16[step]["loss"] == pytest.approx(fp32[step]["loss"], rel=0.03), f"step {step}"
        assert bf16[step]["loss"] != fp32[step]["loss"], f"step {step}: bf16 computed nothing"
    assert bf16[STEPS - 1]["loss"] < bf16[0]["loss"], "the model learns in bf16"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_fp16_trains_through_a_plan_change(tmp_path: Path) -> None:
    steps = 12
    run = train(tmp_path / "fp16", "2:0,2:6:tp=2/sharding=full", "fp16", steps=steps)
    losses = [run.by_step()[k]["loss"] for k in range(steps)]
    assert all(torch.isfinite(torch.tensor(losses))), losses
    assert "has no state for 'gradScaler'" not in run.output, "the scaler was not checkpointed"
    assert losses[-1] < losses[0], "the model learns in fp16"


def _fp16_worlds(rank: int, world: int, root: Path, ports: list[int]) -> list[float]:
    """A tensor-parallel fp16 world moves its loss scale and saves; a data-parallel one loads."""
    scales = []
    for version, plan in enumerate(({"dp": 1, "tp": 2}, {"dp": 2})):
        a = parse_assignment({
            "job": "fp16", "worldVersion": version, "rank": rank, "worldSize": world,
            "masterAddr": "127.0.0.1", "masterPort": ports[version], "precision": "fp16",
            "plan": {"microBatchSize": 2, **plan}, "globalBatchSize": 8, "consistency": "data",
            "checkpoint": {"path": str(root), "intervalSeconds": 0, "keep": 2},
        })  # fmt: skip
        sess = Session(a, rendezvous_timeout_s=60, collective_timeout_s=60,
                       device=torch.device("cpu"))  # fmt: skip
        with sess:
            model = build_parallel(sess, llama_recipe(TINY))
            opts = [torch.optim.AdamW(p.parameters(), lr=1e-3) for p in model.parts]
            sess.restore(model.parts, opts)
            scaler = sess.grad_scaler
            assert scaler is not None and scaler.is_enabled()
            scales.append(scaler.get_scale())
            for batch in sess.batches(dataset_size=512, total_steps=2 * (version + 1)):
                model.train_step(batch, lambda samples: make_batch(samples, TINY, 0))
                sess.step(opts)
                if version == 0:
                    scaler.update(new_scale=512.0 * (batch.step + 1))  # saved with the step
    return scales


@pytest.mark.slow
def test_the_fp16_loss_scale_is_checkpointed_and_restored_under_another_plan(
    tmp_path: Path,
) -> None:
    ports = port_block(2)
    scales = run_world(_fp16_worlds, 2, tmp_path, ports, timeout=180, form_world=False)
    assert scales == [[65536.0, 1024.0]] * 2, "fresh scale, then the one saved at step 2"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_bitwise_holds_in_bf16_through_a_resize(tmp_path: Path, static_run: LocalRun) -> None:
    """Autocast changes what each logical share computes, not the order the shares are summed
    in: a bf16 bitwise run resized 4 -> 2 -> 3 has the static bf16 run's parameters, bit for
    bit, at every step (on the CPU, where bitwise is promised)."""
    runs = []
    for name, schedule in (("static", "4:0"), ("resized", "4:0,2:7,3:14")):
        run = run_local(tmp_path / name, schedule, extra=("--precision", "bf16"))
        assert run.returncode == 0, run.output[-3000:]
        assert {r["precision"] for r in run.records} == {"bf16"}
        runs.append(run.by_step())
    static, resized = runs
    assert sorted(resized) == sorted(static) == list(range(len(static)))
    for k, record in resized.items():
        assert record["paramsSha256"] == static[k]["paramsSha256"], f"step {k}: params differ"
    assert {resized[k]["worldSize"] for k in (6, 7, 14)} == {4, 2, 3}
    fp32 = static_run.by_step()  # conftest's static run: the same job in fp32
    assert all(static[k]["paramsSha256"] != fp32[k]["paramsSha256"] for k in static), (
        "bf16 computed what fp32 computes: autocast did not run"
    )
