"""Checkpoints reshard between any two plans, exactly: the plan changes, the numbers do not.

One world of four ranks trains the tiny reference model under each of five plans (data,
tensor, pipeline and interleaved pipeline parallel, with every sharding and recompute mode) to
step K and saves; every plan then loads every plan's checkpoint and trains two more steps.
The loss of both steps must equal the saving plan's own continuation within 1e-5 relative:
the first checks the parameters, the second the optimizer state (AdamW's moments move it).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from elastra_worker.api import Session
from elastra_worker.assignment import parse_assignment
from elastra_worker.errors import PermanentError
from elastra_worker.launcher import free_ports
from elastra_worker.models.llama import make_batch
from elastra_worker.parallel_model import build_parallel, llama_recipe, prepare_parallel
from tests.worker.distributed import TINY, run_world

WORLD = 4
K = 2
GLOBAL_BATCH = 16
PLANS: dict[str, dict[str, Any]] = {
    "dp4": {"dp": 4},
    "dp2tp2-full-recompute": {"dp": 2, "tp": 2, "recompute": "full"},
    "dp2pp2-zero2": {"dp": 2, "pp": 2, "sharding": "optimizer"},
    "tp2pp2-zero3-gpipe": {"dp": 1, "tp": 2, "pp": 2, "sharding": "full", "schedule": "gpipe"},
    "dp2pp2x2-selective": {"dp": 2, "pp": 2, "virtualStages": 2, "recompute": "selective"},
}


def port_block(count: int) -> list[int]:
    """Free ports below Linux's ephemeral range (32768+), for the sessions' stores.

    Ports picked from the ephemeral range up front were sometimes taken by the time a later
    session used them, by gloo's own connections of an earlier session (connection reset).
    """
    base = free_ports(count)
    return list(range(base, base + count))


def assignment(plan: dict[str, Any], rank: int, version: int, port: int, root: Path) -> Any:
    return parse_assignment(
        {
            "job": "reshard",
            "worldVersion": version,
            "rank": rank,
            "worldSize": WORLD,
            "masterAddr": "127.0.0.1",
            "masterPort": port,
            "plan": {"microBatchSize": 2, **plan},
            "globalBatchSize": GLOBAL_BATCH,
            "consistency": "data",
            "checkpoint": {"path": str(root), "intervalSeconds": 0, "keep": 3},
        }
    )


def train(plan: dict[str, Any], rank: int, version: int, port: int, root: Path, *, steps: int
          ) -> tuple[int, list[float]]:  # fmt: skip
    """Restore the newest checkpoint under ``root`` (if any), train to ``steps``, save.

    Returns the step it restored and the loss of every step it trained.
    """
    sess = Session(
        assignment(plan, rank, version, port, root),
        rendezvous_timeout_s=60,
        collective_timeout_s=60,
        device=torch.device("cpu"),
    )
    losses = []
    with sess:
        model = build_parallel(sess, llama_recipe(TINY))
        opts = [torch.optim.AdamW(p.parameters(), lr=1e-2) for p in model.parts]
        start = sess.restore(model.parts, opts)
        for batch in sess.batches(dataset_size=4096, total_steps=steps):
            model.train_step(batch, lambda samples: make_batch(samples, TINY, 0))
            losses.append(sess.step(opts)["loss"])
    return start, losses


def every_pair(rank: int, world: int, root: Path, ports: list[int]
               ) -> dict[str, tuple[int, list[float]]]:  # fmt: skip
    """Save under each plan, load under each plan (sessions one after another)."""
    dist.destroy_process_group()  # each Session forms its own world, as in a pod
    runs = iter(enumerate(ports))
    version, port = next(runs)
    out = {
        "uninterrupted": train(PLANS["dp4"], rank, version, port, root / "straight", steps=K + 2)
    }
    for a, plan_a in PLANS.items():
        version, port = next(runs)
        train(plan_a, rank, version, port, root / a, steps=K)
        for b, plan_b in PLANS.items():
            target = root / f"{a}--{b}"
            if rank == 0:  # before rank 0 hosts the store, so no rank restores too early
                shutil.copytree(root / a, target)
            version, port = next(runs)
            out[f"{a}--{b}"] = train(plan_b, rank, version, port, target, steps=K + 2)
    return out


@pytest.mark.timeout(600)
def test_a_checkpoint_of_any_plan_continues_exactly_under_any_other(tmp_path: Path) -> None:
    ports = port_block(len(PLANS) * (len(PLANS) + 1) + 1)
    results = run_world(every_pair, WORLD, tmp_path, ports, timeout=540)
    assert all(r == results[0] for r in results), "every rank reports the same losses"
    runs = results[0]
    start, straight = runs["uninterrupted"]
    assert start == 0 and len(straight) == K + 2
    assert runs["dp4--dp4"] == (K, straight[K:]), "a restore continues the uninterrupted run"
    for a in PLANS:
        start, want = runs[f"{a}--{a}"]
        assert start == K and len(want) == 2
        for b in PLANS:
            start, got = runs[f"{a}--{b}"]
            assert start == K, f"saved under {a}, loaded under {b}: restored step {start}"
            torch.testing.assert_close(
                torch.tensor(got, dtype=torch.float64),
                torch.tensor(want, dtype=torch.float64),
                rtol=1e-5,
                atol=0,
                msg=lambda m, a=a, b=b: f"saved under {a}, loaded under {b}: {m}",
            )


def _unstarted(plan: dict[str, Any], root: Path) -> Session:
    """A session of rank 0 in a world of four under ``plan`` (not joined: the checks below
    come before any collective)."""
    a = parse_assignment({
        "job": "refuse", "worldVersion": 0, "rank": 0, "worldSize": 4,
        "masterAddr": "127.0.0.1", "masterPort": 1, "globalBatchSize": 8,
        "plan": {"microBatchSize": 2, **plan}, "consistency": "data",
        "checkpoint": {"path": str(root)},
    })  # fmt: skip
    return Session(a, device=torch.device("cpu"))


@pytest.mark.parametrize(
    ("plan", "rows", "message"),
    [
        ({"dp": 1, "tp": 2, "pp": 2}, 2, "takes pipeline or tensor parallelism, not both"),
        ({"dp": 2, "pp": 2}, 3, r"the inputs of one micro-batch \(2 rows first\), got 3"),
        ({"dp": 1, "pp": 4}, 2, "pipeline: 4 stages need at least 4 blocks, found 2 at layers"),
    ],
)  # fmt: skip
def test_prepare_parallel_refuses_what_a_cut_model_cannot_take_in_one_line(
    tmp_path: Path, plan: dict[str, Any], rows: int, message: str
) -> None:
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(4, 4)) for _ in "ab")
    with pytest.raises(PermanentError, match=message):
        prepare_parallel(
            _unstarted(plan, tmp_path), model, loss_fn=torch.nn.functional.mse_loss,
            example=torch.zeros(rows, 4),
        )  # fmt: skip


TWO_STAGES = {"dp": 1, "pp": 2, "schedule": "1f1b", "recompute": "full"}
"""Two stages of two blocks each, every block recomputed."""


def _hf_llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415 - spawned ranks

    torch.manual_seed(3)
    config = LlamaConfig(
        hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, vocab_size=64, max_position_embeddings=32, use_cache=False,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def _hf_tokens(samples: Any) -> torch.Tensor:
    idx = torch.tensor(list(samples)).unsqueeze(1)
    return (idx * 7 + (idx % 5 + 1) * torch.arange(12).unsqueeze(0)) % 64


def _next_token_loss(output: Any, tokens: torch.Tensor) -> torch.Tensor:
    logits = output.logits if hasattr(output, "logits") else output
    return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())


def _hf_pipeline(rank: int, world: int, root: Path, port: int) -> list[tuple[list[int], float]]:
    """Three SGD steps of a Hugging Face Llama cut into two stages: each step's samples and
    its loss (the rank holding the last stage computes it)."""
    dist.destroy_process_group()  # the Session forms its own world, as in a pod
    a = parse_assignment({
        "job": "hf-pp", "worldVersion": 0, "rank": rank, "worldSize": world,
        "masterAddr": "127.0.0.1", "masterPort": port, "globalBatchSize": 8,
        "plan": {"microBatchSize": 2, **TWO_STAGES}, "consistency": "data",
        "checkpoint": {"path": str(root), "intervalSeconds": 0, "keep": 1},
    })  # fmt: skip
    sess = Session(a, rendezvous_timeout_s=60, collective_timeout_s=60,
                   device=torch.device("cpu"))  # fmt: skip
    out = []
    with sess:
        model = prepare_parallel(
            sess, _hf_llama(), loss_fn=_next_token_loss, example=_hf_tokens(range(2))
        )
        opts = [torch.optim.SGD(part.parameters(), lr=0.5) for part in model.parts]
        sess.restore(model.parts, opts)
        for batch in sess.batches(dataset_size=64, total_steps=3):
            model.train_step(batch, lambda s: (_hf_tokens(s), _hf_tokens(s)))
            samples = [s for share in batch.shares for s in share.samples]
            out.append((samples, sess.step(opts)["loss"]))
    return out


@pytest.mark.slow
def test_a_hugging_face_llama_cut_into_two_stages_trains_as_one_process(
    tmp_path: Path,
) -> None:
    ranks = run_world(_hf_pipeline, 2, tmp_path, free_ports(1), timeout=240)
    model = _hf_llama()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    steps = ranks[1]  # rank 1 holds the last stage
    assert [s for s, _ in ranks[0]] == [s for s, _ in steps]
    for samples, loss in steps:
        tokens = _hf_tokens(samples)
        want = _next_token_loss(model(tokens), tokens)
        opt.zero_grad()
        want.backward()  # type: ignore[no-untyped-call]
        opt.step()
        assert loss == pytest.approx(want.item(), rel=1e-4), samples
