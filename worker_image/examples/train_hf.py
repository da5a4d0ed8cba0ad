"""A Hugging Face causal LM (Llama or GPT-2, tiny config) trained with the elastra_worker API.

The model is ``transformers``' own ``LlamaForCausalLM`` or ``GPT2LMHeadModel``, built from a
tiny config in code (no download), and ``Session.prepare`` shards it under a sharded plan
without a hook: the block finder (``elastra_worker.parallel.blocks``) finds Llama's blocks at
``model.layers`` and GPT-2's at ``transformer.h``. Under the local elastic launcher, through
data-parallel and FSDP plans::

    elastra-worker local --schedule 2:0,2:4:sharding=full,3:8 --steps 12 \\
        --consistency data --checkpoint-dir /tmp/ck --log /tmp/steps.jsonl \\
        -- python train_hf.py --arch llama

The data are generated token sequences (as in ``train_tiny_gpt.py``): sample i is an
arithmetic sequence modulo the vocabulary whose start and stride depend on i. The loss is the
model's own (``labels=``, shifted inside the model). Dropout is off, so every plan computes the
same function and a resized run's loss follows a static run's.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from collections.abc import Callable, Sequence

import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from elastra_worker import Session

VOCAB = 256
SEQ_LEN = 16


def tiny_llama() -> nn.Module:
    """Two Llama decoder layers with grouped-query attention (4 heads, 2 kv heads)."""
    config = LlamaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=64,
        bos_token_id=0, eos_token_id=1, pad_token_id=None,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def tiny_gpt2() -> nn.Module:
    """Two GPT-2 blocks (4 heads) with a tied output head and no dropout."""
    config = GPT2Config(
        n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=64,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=1,
    )  # fmt: skip
    return GPT2LMHeadModel(config)


MODELS: dict[str, Callable[[], nn.Module]] = {"llama": tiny_llama, "gpt2": tiny_gpt2}


def make_tokens(samples: Sequence[int], device: torch.device) -> torch.Tensor:
    """Token ids (len(samples), SEQ_LEN) for the given global sample indices."""
    idx = torch.tensor(samples, dtype=torch.long)
    start = (idx % VOCAB).unsqueeze(1)
    stride = ((idx // VOCAB) % 7 + 1).unsqueeze(1)
    return ((start + stride * torch.arange(SEQ_LEN).unsqueeze(0)) % VOCAB).to(device)


def main(argv: Sequence[str] | None = None) -> int:
    """Train until ``--steps`` or until the world is asked to stop."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", choices=sorted(MODELS), default="llama")
    p.add_argument("--steps", type=int, default=None, help="total optimizer steps (default: none)")
    p.add_argument("--dataset-size", type=int, default=4096)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--blocks", default=None, help="the module path of the blocks, if not found")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    with Session.from_env() as sess:
        torch.manual_seed(sess.seed)  # the same initial weights on every rank and every run
        model = MODELS[args.arch]().to(sess.device)
        model = sess.prepare(model, blocks=args.blocks)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
        start = sess.restore(model, opt)
        if sess.rank == 0:
            logging.info(
                "%s (%s) from step %d in a world of %d",
                args.arch, type(model).__name__, start, sess.world_size,
            )  # fmt: skip
        for batch in sess.batches(dataset_size=args.dataset_size, total_steps=args.steps):
            for micro in batch:
                with micro.sync(model):
                    tokens = make_tokens(micro.samples, sess.device)
                    micro.backward(model(input_ids=tokens, labels=tokens).loss)
            record = sess.step(opt)
            if sess.rank == 0:
                logging.info("step %d loss %.4f", record["step"], record["loss"])
            if not math.isfinite(record["loss"]):
                logging.error("loss is not finite at step %d", record["step"])
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
