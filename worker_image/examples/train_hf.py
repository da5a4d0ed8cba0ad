"""A Hugging Face causal LM (Llama or GPT-2, tiny config) trained with the elastra_worker API.

The model is ``transformers``' own ``LlamaForCausalLM`` or ``GPT2LMHeadModel``, built from a
tiny config in code (no download), and ``prepare_parallel`` (``Session.prepare`` without a
pipeline) takes it under any plan without a hook: the block finder
(``elastra_worker.parallel.blocks``) finds Llama's blocks at ``model.layers`` and GPT-2's at
``transformer.h``; FSDP shards them, recomputation wraps them, a pipeline plan cuts the model
between them (``--split`` names the first block of each later stage instead). Under the local
elastic launcher, through data-parallel, FSDP and pipeline plans::

    elastra-worker local --schedule 2:0,2:4:sharding=full,3:8 --steps 12 \\
        --consistency data --checkpoint-dir /tmp/ck --log /tmp/steps.jsonl \\
        -- python train_hf.py --arch llama

The pipeline tracer needs ``use_cache=False`` (the cache object is no tensor), and GPT-2's
embedding and head share one weight, which two stages cannot: ``--arch gpt2-untied`` unties it. The
data are generated token sequences (as in ``train_tiny_gpt.py``): sample i is an
arithmetic sequence modulo the vocabulary whose start and stride depend on i. The loss is the
next token's cross-entropy (``next_token_loss``, what ``labels=`` computes inside the
model). Dropout is off, so every plan computes the
same function and a resized run's loss follows a static run's.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from elastra_worker import Session
from elastra_worker.parallel_model import prepare_parallel

VOCAB = 256
SEQ_LEN = 16


def tiny_llama() -> nn.Module:
    """Two Llama decoder layers with grouped-query attention (4 heads, 2 kv heads)."""
    config = LlamaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=64,
        bos_token_id=0, eos_token_id=1, pad_token_id=None, use_cache=False,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def tiny_gpt2(*, tied: bool = True) -> nn.Module:
    """Two GPT-2 blocks (4 heads) with a tied output head (or one of its own) and no dropout."""
    config = GPT2Config(
        n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=64, use_cache=False,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=1,
        tie_word_embeddings=tied,
    )  # fmt: skip
    return GPT2LMHeadModel(config)


def tiny_gpt2_untied() -> nn.Module:
    """``tiny_gpt2`` with an output head of its own (a pipeline can cut between them)."""
    return tiny_gpt2(tied=False)


MODELS: dict[str, Callable[[], nn.Module]] = {
    "llama": tiny_llama, "gpt2": tiny_gpt2, "gpt2-untied": tiny_gpt2_untied,
}  # fmt: skip


def next_token_loss(output: Any, tokens: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of each position's prediction of the next token.

    ``output`` is the model's ``CausalLMOutput``, or its logits where a pipeline's last stage
    returns the tensor alone.
    """
    logits = output.logits if hasattr(output, "logits") else output
    return functional.cross_entropy(
        logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten(), reduction="mean"
    )


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
    p.add_argument(
        "--split", default=None, help="pipeline plans: comma-separated first blocks of stages 2.."
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    with Session.from_env() as sess:
        torch.manual_seed(sess.seed)  # the same initial weights on every rank and every run
        model = MODELS[args.arch]().to(sess.device)
        example = make_tokens(range(sess.plan.micro_batch_size), sess.device)
        split = args.split.split(",") if args.split else None
        parallel = prepare_parallel(
            sess, model, loss_fn=next_token_loss, example=example, split=split, blocks=args.blocks
        )
        opts = [
            torch.optim.AdamW(part.parameters(), lr=args.lr, weight_decay=0.01)
            for part in parallel.parts
        ]
        start = sess.restore(parallel.parts, opts)
        if sess.rank == 0:
            logging.info(
                "%s (%s) from step %d in a world of %d",
                args.arch, type(parallel.parts[0]).__name__, start, sess.world_size,
            )  # fmt: skip

        def data(samples: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
            tokens = make_tokens(samples, sess.device)
            return tokens, tokens

        for batch in sess.batches(dataset_size=args.dataset_size, total_steps=args.steps):
            parallel.train_step(batch, data)
            record = sess.step(opts)
            if sess.rank == 0:
                logging.info("step %d loss %.4f", record["step"], record["loss"])
            if not math.isfinite(record["loss"]):
                logging.error("loss is not finite at step %d", record["step"])
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
