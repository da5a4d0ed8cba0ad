"""A small GPT trained on generated data with the elastra_worker API (CPU gloo or GPU nccl).

Run it on its own (a world of one), under ``elastra-worker run`` in a pod, or under the local
elastic launcher::

    elastra-worker local --schedule 4:0,2:20,3:40 --steps 60 --checkpoint-dir /tmp/ck \\
        --consistency bitwise --log /tmp/steps.jsonl -- python train_tiny_gpt.py

The data is generated, so the example needs no download: sample i is an arithmetic sequence
modulo the vocabulary whose start and stride depend on i, which a small model learns quickly
(the loss falls visibly within a few dozen steps).
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.nn import functional

from elastra_worker import Session


@dataclass(frozen=True)
class GPTConfig:
    """Model size; the defaults make a ~60k-parameter model that trains in ms per step."""

    vocab: int = 64
    seq_len: int = 16
    d_model: int = 32
    n_heads: int = 2
    n_layers: int = 2


class Block(nn.Module):
    """Pre-norm transformer block with causal self-attention."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model),
            nn.GELU(),
            nn.Linear(4 * cfg.d_model, cfg.d_model),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        heads = [z.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2) for z in (q, k, v)]
        att = functional.scaled_dot_product_attention(*heads, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Token + position embeddings, a few blocks, a tied output head."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Parameter(torch.zeros(cfg.seq_len, cfg.d_model))
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln = nn.LayerNorm(cfg.d_model)
        nn.init.normal_(self.pos, std=0.02)
        nn.init.normal_(self.tok.weight, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        logits = self.ln(x) @ self.tok.weight.T
        return functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_batch(
    samples: Sequence[int], cfg: GPTConfig, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets for the given global sample indices."""
    idx = torch.tensor(samples, dtype=torch.long)
    start = (idx % cfg.vocab).unsqueeze(1)
    stride = ((idx // cfg.vocab) % 7 + 1).unsqueeze(1)
    t = torch.arange(cfg.seq_len + 1).unsqueeze(0)
    seq = (start + stride * t) % cfg.vocab
    return seq[:, :-1].to(device), seq[:, 1:].to(device)


def main(argv: Sequence[str] | None = None) -> int:
    """Train until ``--steps`` or until the world is asked to stop."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=None, help="total optimizer steps (default: none)")
    p.add_argument("--dataset-size", type=int, default=4096)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--fsdp", action="store_true", help="shard with FSDP2 (not with bitwise)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    cfg = GPTConfig(d_model=args.d_model, n_layers=args.layers)
    with Session.from_env() as sess:
        torch.manual_seed(sess.seed)  # the same initial weights on every rank and every run
        model: nn.Module = TinyGPT(cfg).to(sess.device)
        if args.fsdp:
            for block in model.blocks:  # type: ignore[union-attr]
                fully_shard(block)
            fully_shard(model)
        model = sess.prepare(model)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
        start = sess.restore(model, opt)
        if sess.rank == 0:
            logging.info("starting at step %d in a world of %d", start, sess.world_size)
        for batch in sess.batches(dataset_size=args.dataset_size, total_steps=args.steps):
            for micro in batch:
                with micro.sync(model):
                    x, y = make_batch(micro.samples, cfg, sess.device)
                    micro.backward(model(x, y))
            record = sess.step(opt)
            if sess.rank == 0 and record["step"] % 10 == 0:
                logging.info("step %d loss %.4f", record["step"], record["loss"])
            if not math.isfinite(record["loss"]):
                logging.error("loss is not finite at step %d", record["step"])
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
