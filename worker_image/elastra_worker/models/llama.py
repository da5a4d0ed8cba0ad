"""A Llama-style decoder the runtime can split by layer: the reference model for 3-D plans.

Why a model lives in the runtime: tensor, pipeline and sharded data parallelism need to know the
model's structure (which Linear is column- or row-parallel, where the layers are), so the plans
the operator places are executed on a model whose layout is known here.

Guarantees the parallel building blocks rely on:

- Layers sit in ``layers`` (a ModuleDict keyed by the *global* layer index), the embedding and
  the head exist only on the first and last pipeline stage, so every stage module has exactly
  the parameter names (FQNs) of the whole model. DCP checkpoints are keyed by FQN, so a
  checkpoint written under one pipeline split loads under any other.
- ``init_weights`` derives each parameter from (seed, FQN) alone: the whole model and any set
  of stage modules get identical values, whatever they hold and however they are later sharded.
- Head counts are read from tensor shapes at run time, so the same code runs on a
  tensor-parallel shard (fewer local heads) and on the whole model.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.nn import functional

CHECKPOINT_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.")
"""Name parts that wrappers insert into FQNs; stripped so wrapping never changes the init."""

_FIELDS: dict[str, str] = {
    "layers": "layers",
    "hiddenSize": "hidden_size",
    "ffnHiddenSize": "ffn_hidden_size",
    "attentionHeads": "attention_heads",
    "kvHeads": "kv_heads",
    "vocabSize": "vocab_size",
    "sequenceLength": "sequence_length",
}


class ModelConfigError(ValueError):
    """The model description is invalid; the message names the field and what is allowed."""


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The model's shape, as the TrainingJob's ``spec.model`` gives it (camelCase there).

    Keyword-only, so no positional call can swap two sizes. ``kv_heads`` left at 0 (or None)
    becomes ``attention_heads`` (plain multi-head attention).
    """

    layers: int
    hidden_size: int
    ffn_hidden_size: int
    attention_heads: int
    kv_heads: int = 0
    vocab_size: int
    sequence_length: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.kv_heads in (0, None):
            object.__setattr__(self, "kv_heads", self.attention_heads)
        for camel, attr in _FIELDS.items():
            value = getattr(self, attr)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ModelConfigError(f"model.{camel}: expected an integer >= 1, got {value!r}")
        if self.hidden_size % self.attention_heads:
            raise ModelConfigError(
                f"model.hiddenSize: {self.hidden_size} must be divisible by "
                f"attentionHeads {self.attention_heads}"
            )
        if (self.hidden_size // self.attention_heads) % 2:
            raise ModelConfigError(
                f"model.hiddenSize: the head size hiddenSize/attentionHeads = "
                f"{self.hidden_size // self.attention_heads} must be even (rotary embedding)"
            )
        if self.attention_heads % self.kv_heads:
            raise ModelConfigError(
                f"model.attentionHeads: {self.attention_heads} must be divisible by "
                f"kvHeads {self.kv_heads}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.attention_heads

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> ModelConfig:
        """Parse ``spec.model`` (camelCase keys; unknown keys are ignored)."""
        values: dict[str, int] = {}
        for camel, attr in _FIELDS.items():
            value = raw.get(camel)
            if value is None:
                if camel == "kvHeads":
                    continue
                raise ModelConfigError(f"model.{camel}: required field is missing")
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ModelConfigError(f"model.{camel}: expected an integer >= 1, got {value!r}")
            values[attr] = value
        return cls(**values)

    @classmethod
    def load(cls, path: str | Path) -> ModelConfig:
        """Read a YAML file: the model mapping itself, or one under ``model:`` / ``spec.model``."""
        import yaml  # noqa: PLC0415 (only this entry point needs it)

        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        if isinstance(doc, dict) and isinstance(doc.get("spec"), dict):
            doc = doc["spec"].get("model", doc)
        if isinstance(doc, dict) and isinstance(doc.get("model"), dict):
            doc = doc["model"]
        if not isinstance(doc, dict):
            raise ModelConfigError(f"{path}: expected a mapping of model fields")
        return cls.from_mapping(doc)


def validate_plan(cfg: ModelConfig, tp: int, pp: int, virtual_stages: int) -> None:
    """Refuse a (tp, pp, virtual stages) plan this model cannot be split by."""
    if tp < 1 or pp < 1 or virtual_stages < 1:
        raise ModelConfigError(
            f"plan: tp ({tp}), pp ({pp}) and virtualStages ({virtual_stages}) must be >= 1"
        )
    for camel, value in (
        ("attentionHeads", cfg.attention_heads),
        ("kvHeads", cfg.kv_heads),
        ("ffnHiddenSize", cfg.ffn_hidden_size),
        # sequence parallelism gives every tensor-parallel rank an equal slice of the sequence
        ("sequenceLength", cfg.sequence_length),
    ):
        if value % tp:
            raise ModelConfigError(
                f"plan.tp: {tp} must divide model.{camel} ({value}); "
                "choose a tensor-parallel size that divides it"
            )
    if pp * virtual_stages > cfg.layers:
        raise ModelConfigError(
            f"plan: pp*virtualStages = {pp}*{virtual_stages} = {pp * virtual_stages} stages "
            f"but model.layers is {cfg.layers}; every stage needs at least one layer"
        )


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in fp32; plain ops so DTensor (sequence parallel) works."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rope_tables(cfg: ModelConfig, device: torch.device | None = None) -> torch.Tensor:
    """cos and sin of the rotary angles, shape (sequence_length, head_dim/2, 2)."""
    half = cfg.head_dim // 2
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(half, device=device).float() / half))
    angles = torch.outer(torch.arange(cfg.sequence_length, device=device).float(), inv_freq)
    return torch.stack((angles.cos(), angles.sin()), dim=-1)


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotate (B, S, heads, head_dim) pairs by their position's angle (real arithmetic only)."""
    s = x.shape[1]
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    cos, sin = rope[:s, None, :, 0], rope[:s, None, :, 1]
    x0, x1 = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return rotated.flatten(-2).type_as(x)


class AttentionCore(nn.Module):
    """Causal scaled-dot-product attention over (B, S, heads, head_dim) tensors.

    A module of its own, without parameters, so selective recomputation can wrap exactly the
    memory-heavy, cheap-to-redo part of attention. Grouped-query attention: the kv heads are
    repeated to the number of (local) query heads, both taken from the tensors' shapes.
    """

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        repeat = q.shape[2] // k.shape[2]
        if repeat > 1:
            k = k.repeat_interleave(repeat, dim=2)
            v = v.repeat_interleave(repeat, dim=2)
        out = functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return out.transpose(1, 2)


class Attention(nn.Module):
    """Grouped-query self-attention with rotary positions; wq/wk/wv/wo without bias."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        self.wq = nn.Linear(cfg.hidden_size, cfg.attention_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.hidden_size, cfg.kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.hidden_size, cfg.kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.attention_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.core = AttentionCore()

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        b, s = x.shape[0], x.shape[1]
        # -1: the local head count under tensor parallelism (wq/wk/wv are column shards)
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        out = self.core(apply_rope(q, rope), apply_rope(k, rope), v)
        return self.wo(out.reshape(b, s, -1))  # type: ignore[no-any-return]


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.hidden_size, cfg.ffn_hidden_size, bias=False)
        self.w2 = nn.Linear(cfg.ffn_hidden_size, cfg.hidden_size, bias=False)
        self.w3 = nn.Linear(cfg.hidden_size, cfg.ffn_hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(functional.silu(self.w1(x)) * self.w3(x))  # type: ignore[no-any-return]


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attention(norm x), then + feed_forward(norm)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope)
        return h + self.feed_forward(self.ffn_norm(h))  # type: ignore[no-any-return]


class Transformer(nn.Module):
    """The whole decoder, or one pipeline stage of it (``layer_ids``, ``first``, ``last``).

    ``forward``: int64 tokens (B, S) on the first stage, hidden states (B, S, H) elsewhere;
    returns logits (B, S, V) on the last stage, hidden states otherwise.
    """

    tok_embeddings: nn.Embedding | None
    norm: RMSNorm | None
    output: nn.Linear | None
    rope: torch.Tensor

    def __init__(
        self,
        cfg: ModelConfig,
        *,
        layer_ids: Iterable[int] | None = None,
        first: bool = True,
        last: bool = True,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        ids = sorted(set(range(cfg.layers) if layer_ids is None else layer_ids))
        if ids and (ids[0] < 0 or ids[-1] >= cfg.layers):
            raise ModelConfigError(f"layer_ids: expected indices in 0..{cfg.layers - 1}, got {ids}")
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size) if first else None
        self.layers = nn.ModuleDict({str(i): TransformerBlock(cfg) for i in ids})
        self.norm = RMSNorm(cfg.hidden_size, cfg.norm_eps) if last else None
        self.output = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False) if last else None
        # Derived from the config, so not part of a checkpoint.
        self.register_buffer("rope", rope_tables(cfg), persistent=False)

    def reset_buffers(self) -> None:
        """Recompute the rotary tables in place (after ``to_empty`` from the meta device)."""
        with torch.no_grad():
            self.rope.copy_(rope_tables(self.cfg, self.rope.device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        for block in self.layers.values():
            h = block(h, self.rope)
        if self.norm is not None and self.output is not None:
            h = self.output(self.norm(h))
        return h


def _param_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _canonical(name: str) -> str:
    for prefix in CHECKPOINT_PREFIXES:
        name = name.replace(prefix, "")
    return name


def _initial_value(cfg: ModelConfig, name: str, shape: torch.Size, seed: int) -> torch.Tensor:
    """The full initial tensor of one parameter, generated on the CPU from (seed, FQN)."""
    if name.endswith("norm.weight"):
        return torch.ones(shape)
    if name == "tok_embeddings.weight":
        std = 1.0
    elif name == "output.weight":
        std = cfg.hidden_size**-0.5
    elif name.endswith(("wo.weight", "w2.weight")):
        std = 0.02 / math.sqrt(2 * cfg.layers)  # residual branches: keep the stream's scale
    else:
        std = 0.02
    gen = torch.Generator().manual_seed(_param_seed(seed, name))
    return torch.randn(shape, generator=gen) * std


def init_weights(model: nn.Module, seed: int) -> None:
    """Initialise every parameter from (seed, FQN) and recompute the buffers.

    Values are generated on the CPU (identical on every device type). A DTensor parameter gets
    its slice of the same full tensor, so calling this after sharding also gives the values
    of the unsharded model (each rank builds the full tensor; fine at reference-model sizes).
    """
    if not isinstance(model, Transformer):
        raise TypeError(f"init_weights: expected a Transformer, got {type(model).__name__}")
    with torch.no_grad():
        for raw_name, param in model.named_parameters():
            name = _canonical(raw_name)
            full = _initial_value(model.cfg, name, param.shape, seed).to(param.dtype)
            if isinstance(param, DTensor):
                local = distribute_tensor(
                    full.to(param.device), param.device_mesh, param.placements, src_data_rank=None
                ).to_local()
                param.to_local().copy_(local)
            else:
                param.copy_(full)
        model.reset_buffers()


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over all tokens of the batch, in fp32."""
    return functional.cross_entropy(logits.float().flatten(0, -2), targets.flatten())


NOISE = 0.1
"""Fraction of generated tokens replaced by random ones (the data is learnable, not trivial)."""


def _generated_sample(sample_id: int, cfg: ModelConfig, seed: int) -> torch.Tensor:
    """S+1 tokens: an arithmetic sequence mod V with a per-sample start and small stride, noised.

    A small model first learns "the next token is the current one plus 1..4" and then to read
    the stride from the context, so the loss falls visibly within a few dozen steps.
    """
    gen = torch.Generator().manual_seed(_param_seed(seed, f"sample/{sample_id}"))
    v, n = cfg.vocab_size, cfg.sequence_length + 1
    start = int(torch.randint(v, (1,), generator=gen))
    stride = int(torch.randint(1, 5, (1,), generator=gen))
    tokens = (start + stride * torch.arange(n)) % v
    noisy = torch.rand(n, generator=gen) < NOISE
    tokens[noisy] = torch.randint(v, (n,), generator=gen)[noisy]
    return tokens


class TokenFile:
    """A flat binary file of int32 tokens, memory-mapped; sample i is tokens [iS, (i+1)S+1).

    Positions wrap around the end of the file, so any sample index is valid and consecutive
    samples overlap by one token (the last target of one is the first input of the next).
    With ``vocab_size``, a token outside ``0..vocab_size-1`` is refused when read (an embedding
    lookup would fail later with a less helpful message, or not at all on some devices).
    """

    def __init__(
        self, path: str | Path, sequence_length: int, *, vocab_size: int | None = None
    ) -> None:
        self.path = Path(path)
        self.sequence_length = sequence_length
        self.vocab_size = vocab_size
        size = self.path.stat().st_size
        if size < 4 or size % 4:
            raise ValueError(f"{self.path}: expected a non-empty file of int32 tokens")
        self._tokens = np.memmap(self.path, dtype=np.int32, mode="r")

    def __len__(self) -> int:
        return int(self._tokens.shape[0])

    def sample(self, sample_id: int) -> torch.Tensor:
        """The S+1 tokens of one sample, int64."""
        n = self.sequence_length + 1
        index = (sample_id * self.sequence_length + np.arange(n, dtype=np.int64)) % len(self)
        tokens = torch.from_numpy(self._tokens[index].astype(np.int64))
        if self.vocab_size is not None and (
            bool((tokens < 0).any()) or bool((tokens >= self.vocab_size).any())
        ):
            raise ValueError(
                f"{self.path}: sample {sample_id} has tokens outside 0..{self.vocab_size - 1}"
            )
        return tokens

    def batch(self, sample_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens, targets), int64 (len(sample_ids), S), as ``make_batch`` returns them."""
        return _split([self.sample(int(i)) for i in sample_ids], self.sequence_length)


def _split(rows: list[torch.Tensor], sequence_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    if not rows:
        empty = torch.empty(0, sequence_length, dtype=torch.int64)
        return empty, empty.clone()
    data = torch.stack(rows)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


def make_batch(
    sample_ids: Sequence[int],
    cfg: ModelConfig,
    seed: int,
    *,
    token_file: TokenFile | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, targets), int64 (len(sample_ids), S) on the CPU; targets are tokens shifted by one.

    Each sample depends only on (seed, its global index) or on its place in ``token_file``, so
    a batch is the same whichever rank or world size builds it.
    """
    if token_file is not None:
        return token_file.batch(sample_ids)
    return _split([_generated_sample(int(i), cfg, seed) for i in sample_ids], cfg.sequence_length)
