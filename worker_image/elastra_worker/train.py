"""The reference trainer: ``python -m elastra_worker.train --model FILE``.

Trains the reference decoder-only transformer (``elastra_worker.models.llama``) built from a
YAML mapping with the field names of a TrainingJob's ``spec.model`` (layers, hiddenSize,
ffnHiddenSize, attentionHeads, kvHeads, vocabSize, sequenceLength), or from ``$ELASTRA_MODEL``
(the same fields as JSON, which the operator sets from the job's model section), at the plan the
assignment gives: tensor, pipeline and (sharded) data parallel, with recomputation. Data are
generated tokens by default (no download), or a token file (``--tokens``: flat int32 tokens).
Under the operator or the local launcher it resizes and changes plans like any Session script:
every new world restores the newest checkpoint, resharded to the new layout. It computes in the
job's ``training.precision`` (the Session's autocast, FSDP policy and fp16 loss scaler), and a
pod given GPUs trains on them or exits 2 saying why (the Session's device check).

A TrainingJob with a ``model`` section runs it as it is: ``python3 -m elastra_worker.train``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import yaml

from .api import Session
from .exitcodes import CONFIG
from .models.llama import ModelConfig, ModelConfigError, TokenFile, make_batch
from .parallel_model import Batch, build_parallel, llama_recipe
from .termination import report_permanent

log = logging.getLogger("elastra_worker.train")
MODEL_ENV = "ELASTRA_MODEL"


def load_model(path: Path | None) -> ModelConfig:
    """The model from ``--model FILE``, else from ``$ELASTRA_MODEL`` (JSON, set by the operator)."""
    if path is not None:
        try:
            return ModelConfig.load(path)
        except yaml.YAMLError as err:
            raise ModelConfigError(f"not YAML: {err}") from None
    raw = os.environ.get(MODEL_ENV, "")
    if not raw:
        raise ModelConfigError(
            f"no model: pass --model FILE, or run in a TrainingJob with a model section "
            f"(the operator sets ${MODEL_ENV})"
        )
    try:
        doc = json.loads(raw)
    except ValueError as err:
        raise ModelConfigError(f"${MODEL_ENV} is not JSON: {err}") from None
    if not isinstance(doc, dict):
        raise ModelConfigError(f"${MODEL_ENV}: expected a JSON object of model fields")
    return ModelConfig.from_mapping(doc)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line (``--help`` lists every option)."""
    p = argparse.ArgumentParser(
        prog="python -m elastra_worker.train",
        description="Train the reference transformer at the plan of this world (elastic).",
    )
    p.add_argument(
        "--model",
        type=Path,
        default=None,
        help=f"YAML file: the job's spec.model (default: ${MODEL_ENV}, which the operator sets "
        "from the TrainingJob's model section)",
    )
    p.add_argument("--steps", type=int, default=None, help="total optimizer steps (default: none)")
    p.add_argument("--dataset-size", type=int, default=1 << 20, help="samples in one epoch")
    p.add_argument("--tokens", type=Path, default=None, help="flat int32 token file (default: "
                   "generated tokens)")  # fmt: skip
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
    return p.parse_args(argv)


def _data(args: argparse.Namespace, cfg: ModelConfig, sess: Session) -> Any:
    """Tokens and targets for global sample indices: from the token file, or generated."""
    tokens = (
        TokenFile(args.tokens, cfg.sequence_length, vocab_size=cfg.vocab_size)
        if args.tokens
        else None
    )

    def batch(samples: Sequence[int]) -> Batch:
        if tokens is not None:
            x, y = tokens.batch(samples)
        else:
            x, y = make_batch(samples, cfg, sess.seed)
        return x.to(sess.device), y.to(sess.device)

    return batch


def train(args: argparse.Namespace, cfg: ModelConfig) -> int:
    """The elastic loop: build for this plan, restore, train until done or told to stop."""
    with Session.from_env() as sess:
        model = build_parallel(sess, llama_recipe(cfg))
        opts = [
            torch.optim.AdamW(p.parameters(), lr=args.lr, weight_decay=0.0) for p in model.parts
        ]
        start = sess.restore(model.parts, opts)
        if sess.rank == 0:
            log.info(
                "step %d, world %d, plan %s, precision %s",
                start,
                sess.world_size,
                sess.plan.label,
                sess.precision,
            )
        data = _data(args, cfg, sess)
        for batch in sess.batches(dataset_size=args.dataset_size, total_steps=args.steps):
            model.train_step(batch, data)
            record = sess.step(opts)
            if sess.rank == 0 and record["step"] % 10 == 0:
                log.info("step %d loss %.4f", record["step"], record["loss"])
            if not math.isfinite(record["loss"]):
                log.error("loss is not finite at step %d", record["step"])
                return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Exit 2 (permanent) for a bad model file or a plan that cannot split it."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        cfg = load_model(args.model)
    except (OSError, ModelConfigError) as err:
        where = f"--model {args.model}" if args.model else f"${MODEL_ENV}"
        report_permanent(f"elastra_worker.train: {where}: {err}")
        return CONFIG
    try:
        return train(args, cfg)
    except ModelConfigError as err:
        report_permanent(f"elastra_worker.train: the plan does not fit the model: {err}")
        return CONFIG


if __name__ == "__main__":
    sys.exit(main())
