"""Models nobody here wrote, trained through plan changes with no hook: Hugging Face's
``LlamaForCausalLM`` and ``GPT2LMHeadModel`` (tiny configs, ``worker_image/examples/train_hf.py``)
under the local launcher through data parallel, FSDP (ZeRO-3, ZeRO-2) and, for Llama, tensor
parallel plans (the known split, no hook) and tensor parallel with FSDP, and Llama from a
recomputing data-parallel plan into a pipeline (``prepare_parallel`` cuts it between its blocks
with PyTorch's tracer), against a static data-parallel run: the same samples at every step and
the loss within 2% (what the issue asks; in practice the plans differ only in reduction order).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import REPO, LocalRun, run_local

pytestmark = pytest.mark.slow

TRAINER = REPO / "worker_image" / "examples" / "train_hf.py"
STEPS = 12


@dataclass(frozen=True)
class Case:
    arch: str
    schedule: str
    worlds: dict[int, tuple[int, str]]
    """The world starting at each step of ``schedule``: its size and the class prepare()
    returned (FSDP2 swaps the model's class; a tensor-parallel, unsharded plan keeps it, and so
    does a data-parallel one on CPU; a pipeline stage is the tracer's ``GraphModule``)."""
    says: tuple[str, ...] = ()
    """Lines the run's output must hold."""


CASES = [
    Case(
        "gpt2",
        "2:0,2:3:sharding=full,3:6:sharding=optimizer,2:9",
        {3: (2, "FSDPGPT2LMHeadModel"), 6: (3, "FSDPGPT2LMHeadModel"),
         9: (2, "GPT2LMHeadModel")},
    ),
    Case(  # data parallel, then tensor parallel (no hook: the known Llama split), then both
        "llama",
        "2:0,2:3:tp=2,4:6:tp=2/sharding=full,3:9:sharding=optimizer",
        {3: (2, "LlamaForCausalLM"), 6: (4, "FSDPLlamaForCausalLM"),
         9: (3, "FSDPLlamaForCausalLM")},
    ),
    Case(  # recomputing data parallel, then a pipeline of two stages (selective: whole blocks)
        "llama",
        "2:0:recompute=full,2:6:pp=2/recompute=selective",
        {6: (2, "GraphModule")},
        ("recomputing whole blocks (full) instead",),
    ),
]  # fmt: skip


@pytest.fixture(scope="module")
def static_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], LocalRun]:
    """The static data-parallel run of an architecture, made once for all its cases."""
    runs: dict[str, LocalRun] = {}

    def get(arch: str) -> LocalRun:
        if arch not in runs:
            runs[arch] = train(tmp_path_factory.mktemp(f"static-{arch}"), arch, "2:0")
        return runs[arch]

    return get


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


@pytest.mark.parametrize("case", CASES, ids=lambda case: f"{case.arch}:{case.schedule}")
def test_a_hugging_face_model_trains_through_plan_changes_as_a_static_run(
    tmp_path: Path, case: Case, static_run: Callable[[str], LocalRun]
) -> None:
    static = static_run(case.arch)
    run = train(tmp_path / "elastic", case.arch, case.schedule)
    for step, (size, wrapper) in case.worlds.items():
        line = f"({wrapper}) from step {step} in a world of {size}"
        assert line in run.output, run.output[-3000:]
    for line in case.says:
        assert line in run.output, run.output[-3000:]
    difference = max_relative_loss_difference(run, static)
    print(f"{case.arch}: largest relative loss difference to the static run {difference:.2e}")
    assert difference < 0.02
    losses = [static.by_step()[k]["loss"] for k in range(STEPS)]
    assert losses[-1] < losses[0], f"{case.arch} does not learn: {losses}"


def test_a_model_with_no_known_tensor_parallel_split_fails_once_with_the_line(
    tmp_path: Path,
) -> None:
    trainer = [str(TRAINER), "--arch", "gpt2", "--dataset-size", "500"]
    run = run_local(tmp_path, "2:0:tp=2", consistency="data", steps=STEPS, trainer=trainer)
    assert run.returncode == 2, run.output[-3000:]
    assert "has no self_attn.q_proj" in run.output and "parallelize=fn" in run.output
    assert "Traceback" not in run.output, run.output[-3000:]
    assert run.by_step() == {}
