"""A training script that uses every piece of Session state (for tests/worker/test_session.py).

An LR scheduler, an enabled CPU GradScaler, a registered object of its own, ``user_state``,
gradient clipping in ``before_update``, RNG in training (rank 0 draws input noise from torch,
``random`` and numpy and broadcasts it, so the loss depends on rank 0's RNG stream) and data
through ``sess.loader`` with a DataLoader worker process. float64, so a resized run matches a
static one far below the test's 1e-6 tolerance.

Per step, rank 0 appends ``{step, lr, counter, seen, scale, mean, norm}`` to ``OUT/state.jsonl``
and every rank appends one torch draw to ``OUT/rng-rank<r>.jsonl`` (its own RNG stream).
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset

from elastra_worker import Session

DIM = 8


class Points(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Sample i: a fixed input and a linear target, both functions of i only."""

    def __init__(self, size: int) -> None:
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(size, DIM, generator=g, dtype=torch.float64)
        self.y = self.x @ torch.linspace(-1, 1, DIM, dtype=torch.float64) + 0.5

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


class RunningMean:
    """A stateful object of the script's own: the mean loss seen so far."""

    def __init__(self) -> None:
        self.total = 0.0
        self.count = 0

    def add(self, value: float) -> None:
        self.total += value
        self.count += 1

    def state_dict(self) -> dict[str, Any]:
        return {"total": self.total, "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.total, self.count = state["total"], state["count"]


def append(path: Path, record: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def step_noise(sess: Session) -> torch.Tensor:
    """Rank 0 draws from all three RNGs; every rank uses rank 0's draw."""
    noise = torch.zeros(DIM, dtype=torch.float64)
    if sess.rank == 0:
        noise = torch.randn(DIM, dtype=torch.float64) * 0.1
        noise[0] += random.random() * 0.1
        noise[1] += float(np.random.rand()) * 0.1
    dist.broadcast(noise, src=0)
    return noise


def main() -> int:
    """Train until the launcher's world stops; record the per-step state."""
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--dataset-size", type=int, default=300)
    p.add_argument("--workers", type=int, default=1)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_default_dtype(torch.float64)
    ds = Points(args.dataset_size)
    with Session.from_env() as sess:
        torch.manual_seed(sess.seed)
        random.seed(sess.seed)
        np.random.seed(sess.seed)
        model = sess.prepare(nn.Sequential(nn.Linear(DIM, 16), nn.Tanh(), nn.Linear(16, 1)))
        opt = torch.optim.AdamW(model.parameters(), lr=0.05)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7)
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=2)
        mean = RunningMean()
        sess.register("sched", sched)
        sess.register("scaler", scaler)
        sess.register("mean", mean)
        sess.user_state.update(counter=0, seen=0)
        norms: list[float] = []
        sess.on_before_update(lambda params: norms.append(sess.clip_grad_norm(0.5)))
        sess.restore(model, opt)
        loader = sess.loader(ds, num_workers=args.workers)
        for batch, micro_batches in zip(sess.batches(dataset_size=len(ds)), loader, strict=False):
            noise = step_noise(sess)
            for micro, (x, y) in zip(batch, micro_batches, strict=True):
                assert len(x) == len(micro)
                with micro.sync(model):
                    pred = model(x + noise).squeeze(-1)
                    micro.backward(((pred - y) ** 2).mean())
            lr = opt.param_groups[0]["lr"]
            scale = scaler.get_scale()
            record = sess.step(opt)
            sched.step()
            mean.add(record["loss"])
            sess.user_state["counter"] += 1
            sess.user_state["seen"] += len(batch.samples)
            append(args.out / f"rng-rank{sess.rank}.jsonl",
                   {"step": batch.step, "draw": float(torch.rand(()))})  # fmt: skip
            if sess.rank == 0:
                state = {"step": batch.step, "lr": lr, "scale": scale, "norm": norms[-1]}
                state.update(sess.user_state, mean=mean.total / mean.count)
                append(args.out / "state.jsonl", state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
