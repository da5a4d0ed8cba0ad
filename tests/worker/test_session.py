"""The complete Session: registered state, user state, RNG, clipping and the data helpers.

The multi-process test trains ``session_trainer.py`` (an LR scheduler, an enabled CPU
GradScaler, an object of its own, ``user_state``, clipping in ``before_update``, rank 0's RNG
in the inputs, data through ``sess.loader`` with a worker process) under a 2 -> 1 -> 2 schedule
and compares it with a static world of 2. A world of 2 holds its background checkpoint save
of step 2 while the next save comes due, a resize or a SIGTERM arrives: one behaviour each.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from elastra_worker.api import Session, StepBatch
from elastra_worker.assignment import assignment_from_env, parse_assignment
from elastra_worker.dataorder import DataOrder, rank_shares
from elastra_worker.errors import PermanentError
from elastra_worker.faults import Faults
from elastra_worker.launcher import free_port, free_ports
from elastra_worker.layout import CheckpointRoot
from elastra_worker.models.llama import make_batch
from elastra_worker.parallel_model import build_parallel, llama_recipe
from elastra_worker.sampling import RankSlice, StepLoader, StepSampler

from .conftest import LocalRun, run_local, wait_for
from .distributed import TINY, run_world

TRAINER = Path(__file__).with_name("session_trainer.py")
STEPS = 14


def _session(world: int, rank: int = 0) -> Session:
    env = {"RANK": str(rank), "WORLD_SIZE": str(world), "ELASTRA_GLOBAL_BATCH_SIZE": "24",
           "ELASTRA_MICRO_BATCH_SIZE": "2", "ELASTRA_SEED": "7"}  # fmt: skip
    return Session(assignment_from_env(env), device=torch.device("cpu"))


def _expected(sess: Session, size: int, start: int, steps: int) -> list[list[int]]:
    """Per step, this rank's samples as ``batches()`` computes them."""
    order = DataOrder(sess.seed, size, sess.assignment.global_batch_size)
    out = []
    for k in range(start, start + steps):
        shares = rank_shares(order.step_samples(k), sess.plan.batch_shares, sess.dp_rank,
                             sess.plan.micro_batch_size)  # fmt: skip
        out.append([i for share in shares for i in share.samples])
    return out


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_sampler_yields_each_dp_rank_its_shares_from_the_start_step(world: int) -> None:
    for rank in range(world):
        sess = _session(world, rank)
        sampler = sess.sampler(dataset_size=100, total_steps=9, start_step=4)
        got = list(sampler)
        assert len(got) == len(sampler)
        want = _expected(sess, 100, 4, 5)
        assert got == [i for step in want for i in step]


def test_sampler_starts_at_the_restored_step_and_needs_restore() -> None:
    sess = _session(2, 1)
    with pytest.raises(RuntimeError, match="restore"):
        sess.sampler(dataset_size=50)
    sess._data.restored_at(3)  # what restore() leaves after step 3
    it = iter(sess.sampler(dataset_size=50))
    assert [next(it) for _ in range(12)] == _expected(sess, 50, 3, 1)[0]


def test_dataloader_with_workers_reads_the_job_order() -> None:
    data = torch.arange(60)
    sess = _session(2, 1)
    part = RankSlice(DataOrder(7, 60, 24), (12, 12), 1, 2, start_step=2, total_steps=5)
    loader = DataLoader(data, batch_size=4, sampler=StepSampler(part), num_workers=1)
    assert torch.cat(list(loader)).tolist() == [i for s in _expected(sess, 60, 2, 3) for i in s]
    steps = list(StepLoader(data, part, num_workers=1))
    assert len(steps) == 3 and all(len(micro) == 6 for micro in steps)
    assert [torch.cat(m).tolist() for m in steps] == _expected(sess, 60, 2, 3)


def test_loader_leaves_the_global_rng_alone() -> None:
    before = torch.get_rng_state()
    part = RankSlice(DataOrder(7, 60, 24), (24,), 0, 2, total_steps=1)
    assert len(next(iter(StepLoader(torch.arange(60), part)))) == 12
    assert torch.equal(torch.get_rng_state(), before)
    with pytest.raises(TypeError, match="batch_size"):
        StepLoader(torch.arange(60), part, batch_size=3)


class _Counter:
    def __init__(self) -> None:
        self.n = 0

    def state_dict(self) -> dict[str, Any]:
        return {"n": self.n}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.n = state["n"]


def test_register_errors() -> None:
    sess = _session(1)
    sess.register("counter", _Counter())
    with pytest.raises(PermanentError, match="already registered"):
        sess.register("counter", _Counter())
    with pytest.raises(PermanentError, match="without"):
        sess.register("a/b", _Counter())
    with pytest.raises(PermanentError, match="state_dict"):
        sess.register("plain", object())  # type: ignore[arg-type]
    sess.register("scaler", torch.amp.GradScaler("cpu"))
    with pytest.raises(PermanentError, match="one GradScaler"):
        sess.register("scaler2", torch.amp.GradScaler("cpu"))
    sess._state.restored = True  # what restore() leaves
    with pytest.raises(RuntimeError, match=r"after restore\(\)"):
        sess.register("late", _Counter())
    with pytest.raises(RuntimeError, match="before_update"):
        sess.clip_grad_norm(1.0)


def _jsonl(path: Path) -> dict[int, dict[str, Any]]:
    """Records by step; the last one wins (a redone step is recorded again)."""
    return {r["step"]: r for r in map(json.loads, path.read_text().splitlines())}


def _train(tmp: Path, schedule: str) -> tuple[LocalRun, Path]:
    out = tmp / "out"
    out.mkdir(parents=True)
    run = run_local(tmp, schedule, consistency="data", steps=STEPS, timeout=150,
                    trainer=(str(TRAINER), "--out", str(out)))  # fmt: skip
    assert run.returncode == 0, run.output[-3000:]
    return run, out


@pytest.mark.slow
def test_scheduler_scaler_rng_and_user_state_survive_a_resize(tmp_path: Path) -> None:
    static, s_out = _train(tmp_path / "static", "2:0")
    elastic, e_out = _train(tmp_path / "elastic", "2:0,1:5,2:10")
    assert "reseeded from (seed 0, rank 1, step 10)" in elastic.output
    got, want = elastic.by_step(), static.by_step()
    assert sorted(got) == list(range(STEPS))
    assert {got[k]["worldSize"] for k in (4, 5, 9, 10)} == {2, 1}
    for k in range(STEPS):
        assert got[k]["samples"] == want[k]["samples"], f"step {k}"
        assert got[k]["loss"] == pytest.approx(want[k]["loss"], rel=1e-6, abs=0), f"step {k}"
    g_state, w_state = _jsonl(e_out / "state.jsonl"), _jsonl(s_out / "state.jsonl")
    for k in range(STEPS):
        g, w = g_state[k], w_state[k]
        assert (g["lr"], g["scale"], g["counter"], g["seen"]) == (
            w["lr"],
            w["scale"],
            k + 1,
            24 * (k + 1),
        )
        assert (g["mean"], g["norm"]) == pytest.approx((w["mean"], w["norm"]), rel=1e-6)
    assert len({r["lr"] for r in w_state.values()}) > 3  # the schedule and scaler moved
    assert len({r["scale"] for r in w_state.values()}) > 3
    # rank 0's own stream continues across both restores; rank 1 is reseeded at step 10
    g0, w0 = _jsonl(e_out / "rng-rank0.jsonl"), _jsonl(s_out / "rng-rank0.jsonl")
    assert [g0[k]["draw"] for k in range(STEPS)] == [w0[k]["draw"] for k in range(STEPS)]
    g1, w1 = _jsonl(e_out / "rng-rank1.jsonl"), _jsonl(s_out / "rng-rank1.jsonl")
    assert sorted(g1) == [*range(5), *range(10, STEPS)]
    assert [g1[k]["draw"] for k in range(5)] == [w1[k]["draw"] for k in range(5)]
    assert g1[10]["draw"] != w1[10]["draw"]


CLIP_PLANS: dict[str, dict[str, Any]] = {
    "dp4": {"dp": 4},
    "dp2tp2": {"dp": 2, "tp": 2},
    "dp2pp2-zero2": {"dp": 2, "pp": 2, "sharding": "optimizer"},
    "tp2pp2-zero3": {"dp": 1, "tp": 2, "pp": 2, "sharding": "full", "schedule": "gpipe"},
}


def _clip_under_plans(rank: int, world: int, root: Path, ports: list[int]) -> dict[str, Any]:
    """Two steps of the reference model per plan, clipped hard; the norms and losses."""
    out: dict[str, Any] = {}
    for version, (name, plan) in enumerate(CLIP_PLANS.items()):
        a = parse_assignment({
            "job": "clip", "worldVersion": version, "rank": rank, "worldSize": world,
            "masterAddr": "127.0.0.1", "masterPort": ports[version],
            "plan": {"microBatchSize": 2, **plan}, "globalBatchSize": 16, "consistency": "data",
            "checkpoint": {"path": str(root / name), "intervalSeconds": 0, "keep": 1},
        })  # fmt: skip
        sess = Session(a, rendezvous_timeout_s=60, collective_timeout_s=60,
                       device=torch.device("cpu"))  # fmt: skip
        norms: list[float] = []
        losses: list[float] = []
        with sess:
            model = build_parallel(sess, llama_recipe(TINY))
            opts = [torch.optim.SGD(p.parameters(), lr=1.0) for p in model.parts]
            sess.before_update = lambda _p, s=sess, n=norms: n.append(s.clip_grad_norm(0.05))
            sess.restore(model.parts, opts)
            for batch in sess.batches(dataset_size=512, total_steps=2):
                model.train_step(batch, lambda samples: make_batch(samples, TINY, 0))
                losses.append(sess.step(opts)["loss"])
        out[name] = (norms, losses)
    return out


@pytest.mark.slow
def test_clip_grad_norm_gives_the_same_step_under_every_plan(tmp_path: Path) -> None:
    base = free_ports(len(CLIP_PLANS))  # one master port per plan, none of them ephemeral
    ports = list(range(base, base + len(CLIP_PLANS)))
    results = run_world(_clip_under_plans, 4, tmp_path, ports, timeout=240, form_world=False)
    norms, losses = results[0]["dp4"]
    assert norms[0] > 0.05, "the test must clip"
    for rank, runs in enumerate(results):
        for name, (got_norms, got_losses) in runs.items():
            assert got_norms == pytest.approx(norms, rel=1e-5), f"rank {rank}, {name}"
            if got_losses:  # only the ranks that compute the loss report it
                assert got_losses == pytest.approx(losses, rel=1e-5), f"rank {rank}, {name}"


READS_TO_HOST = ("item", "cpu", "tolist", "__float__")
"""The tensor methods that copy to the host (on a GPU: wait for the device)."""


def _host_reads_per_micro_batch(rank: int, world: int, root: Path, port: int) -> list[int]:
    """Four micro-batches of a data-parallel step: the host reads each one made."""
    a = parse_assignment({
        "job": "sync", "worldVersion": 1, "rank": rank, "worldSize": world,
        "masterAddr": "127.0.0.1", "masterPort": port, "plan": {"microBatchSize": 2, "dp": world},
        "globalBatchSize": 16, "consistency": "data",
        "checkpoint": {"path": str(root), "intervalSeconds": 0, "keep": 1},
    })  # fmt: skip
    reads = [0]
    originals = {name: getattr(torch.Tensor, name) for name in READS_TO_HOST}

    def counted(name: str) -> Any:
        def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            reads[0] += 1
            return originals[name](self, *args, **kwargs)

        return read

    per_micro: list[int] = []
    with Session(a, rendezvous_timeout_s=60, collective_timeout_s=60,
                 device=torch.device("cpu")) as sess:  # fmt: skip
        torch.manual_seed(0)
        model = sess.prepare(torch.nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sess.restore(model, opt)
        for batch in sess.batches(dataset_size=64, total_steps=1):
            for micro in batch:
                x = torch.arange(len(micro) * 8, dtype=torch.float32).reshape(-1, 8) / 64
                for name in READS_TO_HOST:
                    setattr(torch.Tensor, name, counted(name))
                try:
                    with micro.sync(model):
                        micro.backward(model(x).square().mean())
                finally:
                    for name, method in originals.items():
                        setattr(torch.Tensor, name, method)
                per_micro.append(reads[0])
                reads[0] = 0
            sess.step(opt)
    return per_micro


def test_a_micro_batch_reads_nothing_back_to_the_host(tmp_path: Path) -> None:
    """The step's loss stays on the device until the step ends: on a GPU a host read per
    micro-batch would wait for the device every time."""
    results = run_world(
        _host_reads_per_micro_batch, 2, tmp_path, free_ports(1), timeout=120, form_world=False
    )
    assert [len(r) for r in results] == [4, 4]  # 16 sequences, micro-batches of 2, dp 2
    assert results == [[0] * 4, [0] * 4]


HELD_STEP, HOLD_S = 2, 60.0
_RELEASE = threading.Event()  # one per spawned rank process


class _HoldSave(Faults):
    """Holds the background save of ``HELD_STEP`` after its shards, before its commit."""

    def in_save(self, step: int) -> None:
        if step == HELD_STEP and not _RELEASE.wait(HOLD_S):
            raise TimeoutError(f"the save of step {step} was never released")


@dataclass(frozen=True)
class DuringSave:
    """What happens while step 2's save is held, and what must be committed at the end."""

    released_at: int
    """Steps completed when the next save came due or the world agreed to stop."""
    trained: tuple[int, ...]
    committed: tuple[int, ...]
    stop_at_step: int | None = None
    sigterm_in_step: int | None = None


DURING_SAVE = {
    # the save of step 4 waits for step 2's, then training goes on; 6 is the last (blocking)
    "next save due": DuringSave(4, trained=tuple(range(6)), committed=(6, 4, 2)),
    # a resize stops the world at step 3: step 2's save completes, then 3 is committed
    "resize": DuringSave(3, trained=(0, 1, 2), committed=(3, 2), stop_at_step=3),
    # SIGTERM (to rank 0 only) in step 2: the world stops at the boundary, as for a resize
    "sigterm": DuringSave(3, trained=(0, 1, 2), committed=(3, 2), sigterm_in_step=2),
}


def _linear_step(
    sess: Session, batch: StepBatch, model: torch.nn.Module, opt: torch.optim.Optimizer
) -> None:
    """One step of the tiny linear model the checkpoint tests train, on the step's samples."""
    for micro in batch:
        with micro.sync(model):
            x = torch.tensor(micro.samples, dtype=torch.float32).reshape(-1, 1) / 64
            micro.backward(model(x.repeat(1, 4)).pow(2).mean())
    sess.step(opt)


def _train_holding_a_save(
    rank: int, world: int, root: Path, port: int, case: DuringSave
) -> dict[str, Any]:
    """Train a tiny model with a checkpoint every 2 steps; release the held save of step 2 only
    once the next save is due or the world agreed to stop. What the rank saw and trained."""
    a = parse_assignment({
        "job": "hold", "worldVersion": 1, "rank": rank, "worldSize": world,
        "masterAddr": "127.0.0.1", "masterPort": port, "plan": {"microBatchSize": 2},
        "globalBatchSize": 8, "consistency": "data", "stopAtStep": case.stop_at_step,
        "checkpoint": {"path": str(root), "intervalSeconds": 0, "intervalSteps": 2, "keep": 3},
    })  # fmt: skip
    sess = Session(a, faults=_HoldSave(), rendezvous_timeout_s=60, collective_timeout_s=60,
                   device=torch.device("cpu"))  # fmt: skip
    ckpt_root = CheckpointRoot(root, job="hold")
    seen: list[tuple[int, int | None]] = []

    def release() -> None:
        wait_for(lambda: sess.step_count >= 4 or sess.stopping, HOLD_S, "the next save")
        seen.append((sess.step_count, ckpt_root.latest_step()))
        _RELEASE.set()

    trained: list[int] = []
    with sess:
        torch.manual_seed(0)
        model = sess.prepare(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sess.restore(model, opt)
        helper = threading.Thread(target=release, daemon=True)
        helper.start()
        for batch in sess.batches(dataset_size=64, total_steps=6):
            if batch.step == case.sigterm_in_step and rank == 0:
                os.kill(os.getpid(), signal.SIGTERM)
            _linear_step(sess, batch, model, opt)
            trained.append(batch.step)
        helper.join(HOLD_S)
        newest = sess.wait_for_checkpoint()
    for step in ckpt_root.committed_steps():
        manifest = ckpt_root.check_structure(step)
        ckpt_root.check_hashes(step, list(manifest.files))
    return {
        "seen": seen,
        "trained": trained,
        "committed": ckpt_root.committed_steps(),
        "latest": ckpt_root.latest_step(),
        "newest": newest,
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(DURING_SAVE))
def test_a_background_save_in_flight_completes_before_the_next_or_the_stop(
    tmp_path: Path, name: str
) -> None:
    case = DURING_SAVE[name]
    results = run_world(
        _train_holding_a_save, 2, tmp_path, free_port(), case, timeout=180, form_world=False
    )
    for rank, got in enumerate(results):
        # training went on to the next save (or the stop) while step 2 was not yet committed
        assert got["seen"] == [(case.released_at, None)], f"rank {rank}"
        assert got["trained"] == list(case.trained), f"rank {rank}"
        assert got["committed"] == list(case.committed), f"rank {rank}"
        assert got["latest"] == got["newest"] == case.committed[0], f"rank {rank}"


SLOW_S, SHORT_TIMEOUT_S = 6.0, 2.0
SLOW_MEMBER = {
    # rank 1 writes every checkpoint (step 2 in the background, step 4 blocking at the end)
    # for longer than the world's collective timeout
    "save": Faults(save_delay_s=SLOW_S),
    # rank 1 builds its model for longer than that before prepare(), whose DDP broadcasts
    "model": Faults(),
}


def _train_with_a_slow_member(rank: int, world: int, root: Path, port: int, slow: str
                              ) -> dict[str, Any]:  # fmt: skip
    """Four steps of a tiny DDP model, checkpoints every 2 steps, rank 1 slow where ``slow``
    says; what each rank trained and what was committed."""
    os.environ["ELASTRA_CPU_DDP"] = "1"
    a = parse_assignment({
        "job": "slow", "worldVersion": 1, "rank": rank, "worldSize": world,
        "masterAddr": "127.0.0.1", "masterPort": port, "plan": {"microBatchSize": 2},
        "globalBatchSize": 8, "consistency": "data",
        "checkpoint": {"path": str(root), "intervalSeconds": 0, "intervalSteps": 2, "keep": 3},
    })  # fmt: skip
    faults = SLOW_MEMBER[slow] if rank == 1 else Faults()
    sess = Session(a, faults=faults, rendezvous_timeout_s=60,
                   collective_timeout_s=SHORT_TIMEOUT_S, device=torch.device("cpu"))  # fmt: skip
    trained: list[int] = []
    with sess:
        torch.manual_seed(0)
        if rank == 1 and slow == "model":
            time.sleep(SLOW_S)  # the fault: importing and loading weights, say
        model = sess.prepare(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sess.restore(model, opt)
        for batch in sess.batches(dataset_size=64, total_steps=4):
            _linear_step(sess, batch, model, opt)
            trained.append(batch.step)
        sess.wait_for_checkpoint()
    return {"trained": trained, "committed": CheckpointRoot(root, job="slow").committed_steps()}


@pytest.mark.slow
@pytest.mark.parametrize("slow", sorted(SLOW_MEMBER))
def test_a_member_slower_than_the_collective_timeout_in_a_save_or_its_model_build_is_waited_for(
    tmp_path: Path, slow: str
) -> None:
    """Saves, restores and the first meeting after the model build run on the state group,
    whose timeout is long; only training's collectives have the short one (a collective that
    blocks past it fails: test_session_world)."""
    results = run_world(
        _train_with_a_slow_member, 2, tmp_path, free_port(), slow, timeout=180, form_world=False
    )
    for rank, got in enumerate(results):
        assert got == {"trained": [0, 1, 2, 3], "committed": [4, 2]}, f"rank {rank}"
