"""The planner's memory model against the tensors the worker really holds.

For every plan of the exactness matrix (``test_precision.MATRIX``: data, tensor, pipeline and
interleaved pipeline parallel, both shardings, both recompute modes) in fp32 and in bf16, a
gloo world on the CPU builds the reference model for the plan and trains one step. Each rank
sums the bytes of its parameters and gradients (its local shards, for DTensor and FSDP2) just
before the optimizer update and of its optimizer state after it; each of the three and their
sum is within 10% of the planner's per-GPU prediction (``perfmodel.memory_breakdown``) for the
same model shape and layout. The most that autograd holds for backward at once (sampled with
``saved_tensors_hooks``: activations, the weight copies made for compute, and the gradients
during backward, unsharded ones included) is printed beside the model's figures, not asserted;
the table is also written to ``memory.json``.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.tensor import DTensor

from elastra.planner.job import ModelShape
from elastra.planner.perfmodel import Layout, in_flight, memory_breakdown, stage_layers
from elastra_worker.api import Session
from elastra_worker.assignment import ParallelPlan, parse_assignment, plan_to_wire
from elastra_worker.models.llama import make_batch
from elastra_worker.parallel_model import build_parallel, llama_recipe
from elastra_worker.schedule import parse_schedule, plan_for
from tests.worker.distributed import TINY, run_world
from tests.worker.test_parallel_model import port_block
from tests.worker.test_precision import MATRIX, STEPS

TOLERANCE = 0.10
STATES = ("parameters", "gradients", "optimizer")
WORLD = 4
GLOBAL_BATCH = 8
MICRO_BATCH = 2
PLANS = [
    plan_for(segment, global_batch=GLOBAL_BATCH, micro_batch=MICRO_BATCH)
    for segment in parse_schedule(MATRIX, STEPS)
]
"""The plans of the exactness matrix, as the local launcher would place them."""
SHAPE = ModelShape(
    layers=TINY.layers,
    hidden_size=TINY.hidden_size,
    ffn_hidden_size=TINY.ffn_hidden_size,
    attention_heads=TINY.attention_heads,
    kv_heads=TINY.kv_heads,
    vocab_size=TINY.vocab_size,
    sequence_length=TINY.sequence_length,
)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _nbytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(_local(t).numel() * _local(t).element_size() for t in tensors)


def _is_cast_of_leaf(t: torch.Tensor) -> bool:
    """Autocast's cast of a parameter (or a view of one): its input is a leaf's accumulator."""
    base = t._base if t._base is not None else t
    fn = base.grad_fn
    return (
        fn is not None
        and type(fn).__name__ == "ToCopyBackward0"
        and any(type(n).__name__ == "AccumulateGrad" for n, _ in fn.next_functions if n)
    )


@dataclass
class _Saved:
    kind: str
    tensor: weakref.ref[torch.Tensor]

    def nbytes(self) -> int:
        """Bytes its storage holds now (0 once freed, or resized away by FSDP)."""
        t = self.tensor()
        return 0 if t is None else _storage(_local(t))[1]


def _storage(t: torch.Tensor) -> tuple[int, int]:
    """A tensor's storage: an identity that survives FSDP's resizing, and its size in bytes."""
    try:
        storage = t.untyped_storage()
        return storage._cdata, storage.nbytes()
    except RuntimeError:  # a wrapper without storage (an async collective's result)
        return id(t), t.numel() * t.element_size()


class SavedForBackward:
    """The most bytes autograd holds for backward at once: activations, weight copies, and
    gradients (which backward fills, FSDP's unsharded ones included).

    Sampled whenever a tensor is saved (forward) or used (backward). Saved tensors are taken
    by storage: the rank's own parameters are left out (they are counted as parameters),
    copies of weights made for compute (FSDP's gathered parameters, autocast's casts) are
    counted apart from activations. Tensors are held weakly, so what backward frees stops
    counting, as on a GPU.
    """

    def __init__(self, parts: list[nn.Module]) -> None:
        self.parts = parts
        self.params = [p for part in parts for p in part.parameters()]
        self.own = self._storages()
        self.live: dict[int, _Saved] = {}
        self.peak = {"activations": 0, "weights": 0, "gradients": 0}

    def _current(self) -> list[nn.Parameter]:
        """The modules' parameters now (FSDP swaps gathered ones in for compute)."""
        return [p for part in self.parts for p in part.parameters()]

    def _storages(self) -> set[int]:
        return {_storage(_local(p))[0] for p in self._current()}

    def _sample(self) -> None:
        for kind in ("activations", "weights"):
            now = sum(s.nbytes() for s in self.live.values() if s.kind == kind)
            self.peak[kind] = max(self.peak[kind], now)
        grads = (p.grad for p in (*self.params, *self._current()) if p.grad is not None)
        held = dict(_storage(_local(g)) for g in grads)
        self.peak["gradients"] = max(self.peak["gradients"], sum(held.values()))

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            local = _local(t)
            ptr, _ = _storage(local)
            known = self.live.get(ptr)
            if ptr not in self.own and (known is None or known.tensor() is None):
                weight = ptr in self._storages() or _is_cast_of_leaf(local) or _is_cast_of_leaf(t)
                self.live[ptr] = _Saved("weights" if weight else "activations", weakref.ref(t))
            self._sample()
        return t

    def unpack(self, t: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self._sample()
        return t


@dataclass(frozen=True)
class Case:
    """One plan at one precision, in its own Session (process group, port, checkpoint root)."""

    plan: ParallelPlan
    precision: str
    root: Path
    port: int

    def assignment(self, rank: int) -> dict[str, Any]:
        return {
            "job": "memory", "worldVersion": 0, "rank": rank, "worldSize": WORLD,
            "masterAddr": "127.0.0.1", "masterPort": self.port, "precision": self.precision,
            "plan": plan_to_wire(self.plan), "globalBatchSize": GLOBAL_BATCH,
            "consistency": "data",
            "checkpoint": {"path": str(self.root), "intervalSeconds": 0, "keep": 1},
        }  # fmt: skip

    def layout(self) -> Layout:
        plan = self.plan
        return Layout(
            tp=plan.tp, pp=plan.pp, micro_batch=plan.micro_batch_size, sharding=plan.sharding,
            recompute=plan.recompute, precision=self.precision,  # type: ignore[arg-type]
            interleave=plan.virtual_stages,
        )  # fmt: skip

    def predicted(self) -> dict[str, float]:
        """The model's bytes by part, with the micro-batches this plan keeps in flight."""
        layout, plan = self.layout(), self.plan
        micro_batches = max(plan.batch_shares) // plan.micro_batch_size
        held = in_flight(layout.pp, micro_batches, layout.interleave)
        return asdict(memory_breakdown(SHAPE, layout, dp=plan.dp, in_flight=held))


def _measure(rank: int, world: int, case: Case) -> dict[str, int]:
    """One step of the plan on this rank; the bytes it held, by part."""
    assert world == WORLD
    sess = Session(parse_assignment(case.assignment(rank)), rendezvous_timeout_s=60,
                   collective_timeout_s=60, device=torch.device("cpu"))  # fmt: skip
    held: dict[str, int] = {}
    with sess:
        model = build_parallel(sess, llama_recipe(TINY))
        opts = [torch.optim.AdamW(p.parameters(), lr=1e-3) for p in model.parts]
        sess.restore(model.parts, opts)
        saved = SavedForBackward(model.parts)

        def before_update(ps: list[nn.Parameter]) -> None:
            held["parameters"] = _nbytes(ps)
            held["gradients"] = _nbytes(p.grad for p in ps if p.grad is not None)

        sess.before_update = before_update
        for batch in sess.batches(dataset_size=64, total_steps=1):
            with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
                model.train_step(batch, lambda samples: make_batch(samples, TINY, 0))
            sess.step(opts)
        assert "parameters" in held, "no step ran (a checkpoint of another case restored?)"
        states = (v for opt in opts for s in opt.state.values() for v in s.values())
        held["optimizer"] = _nbytes(v for v in states if isinstance(v, torch.Tensor))
        held["saved_activations"] = saved.peak["activations"]
        held["saved_weights"] = saved.peak["weights"]
        held["gradients_at_once"] = saved.peak["gradients"]
    return held


def _measure_all(rank: int, world: int, cases: list[Case]) -> list[dict[str, int]]:
    """Every case in turn in the same processes (one Session each, on its own port): the
    bytes are read from the tensors each case holds, so the cases need no process of their
    own, and spawning a world per case was most of this test's time."""
    return [_measure(rank, world, case) for case in cases]


@dataclass(frozen=True)
class Row:
    """One rank of one plan: the model's bytes and the measured bytes."""

    plan: str
    precision: str
    rank: int
    predicted: dict[str, float]
    measured: dict[str, int]

    def error(self, part: str) -> float:
        """Measured against predicted bytes of one part, or of all three (``states``)."""
        parts = STATES if part == "states" else (part,)
        want = sum(self.predicted[k] for k in parts)
        return sum(self.measured[k] for k in parts) / want - 1.0


def _cell(predicted: float, measured: int) -> str:
    return f"{predicted:>7.0f}/{measured:<7}"


def _table(rows: list[Row]) -> str:
    """One line per rank: predicted/measured bytes of each part."""
    head = (f"{'plan':28} {'prec':4} {'rank':>4} {'parameters':>15} {'gradients':>15} "
            f"{'optimizer':>15} {'error':>6} {'weight copies':>15} "
            f"{'grads at once':>15} {'saved at once':>15}")  # fmt: skip
    lines = [head]
    for r in rows:
        p, m = r.predicted, r.measured
        cells = [_cell(p[k], m[k]) for k in STATES]
        copies = _cell(p["weight_copies"], m["saved_weights"])
        grads = _cell(p["gradients"] + p["unsharded_gradients"], m["gradients_at_once"])
        saved = _cell(p["activations"] + p["logits"], m["saved_activations"])
        lines.append(f"{r.plan:28} {r.precision:4} {r.rank:>4} {' '.join(cells)} "
                     f"{r.error('states'):>+6.1%} {copies} {grads} {saved}")  # fmt: skip
    return "\n".join(lines)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_each_rank_holds_what_the_planner_predicts_for_every_plan(tmp_path: Path) -> None:
    assert stage_layers(SHAPE.layers, 2) == (2, 2), "the pipeline plans split the layers evenly"
    assert {p.dp * p.tp * p.pp for p in PLANS} == {WORLD}, "the matrix runs on WORLD ranks"
    ports = iter(port_block(2 * len(PLANS)))
    cases = [
        Case(plan, precision, tmp_path / f"{i}-{precision}", next(ports))
        for i, plan in enumerate(PLANS)
        for precision in ("fp32", "bf16")
    ]
    by_rank = run_world(_measure_all, WORLD, cases, timeout=180 * len(cases), form_world=False)
    rows: list[Row] = []
    for c, case in enumerate(cases):
        plan = case.plan
        name = f"{plan.label} {plan.sharding}/{plan.recompute}/v{plan.virtual_stages}"
        rows.extend(
            Row(name, case.precision, k, case.predicted(), held[c])
            for k, held in enumerate(by_rank)
        )
    (tmp_path / "memory.json").write_text(json.dumps([asdict(r) for r in rows], indent=1))
    print(f"bytes per rank, predicted/measured ({tmp_path / 'memory.json'}):")
    print(_table(rows))
    off = [f"{r.plan} {r.precision} rank {r.rank} {part}: {r.error(part):+.1%}"
           for r in rows for part in ("states", *STATES)
           if abs(r.error(part)) > TOLERANCE]  # fmt: skip
    assert not off, "parameters, gradients, optimizer state off the model:\n" + "\n".join(off)
