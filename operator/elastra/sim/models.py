"""Named model profiles a trace's ``model`` column may refer to.

A trace says how long a job ran, not what it trained; the simulator needs a model shape to ask
the planner how fast the job would run elsewhere. These profiles are standard decoder-only
shapes (GPT-3 paper, Brown et al. 2020, Table 2.1, for the ``gpt-*`` sizes; Llama 2, Touvron
et al. 2023, for ``llama-7b``) with a global batch fixed per profile, trained in fp16 so that
every catalog GPU (V100 and T4 have no bf16) is a candidate. A row without a model gets one by
its size (``default_model``), so public traces, which carry no model, still load.
"""

from __future__ import annotations

from dataclasses import dataclass

from elastra.planner.job import ModelShape
from elastra.planner.perfmodel import total_params


@dataclass(frozen=True)
class ModelProfile:
    """A model shape plus what the simulator assumes about its training run."""

    name: str
    shape: ModelShape
    global_batch_size: int
    """Sequences per optimizer step, fixed across resizes (as ``training.globalBatchSize``)."""

    @property
    def params(self) -> float:
        """Parameters of the whole model (from the planner's performance model)."""
        return total_params(self.shape)


def _gpt(name: str, layers: int, hidden: int, heads: int, batch: int) -> ModelProfile:
    shape = ModelShape(
        layers=layers,
        hidden_size=hidden,
        ffn_hidden_size=4 * hidden,
        attention_heads=heads,
        kv_heads=heads,
        vocab_size=50257,
        sequence_length=1024,
    )
    return ModelProfile(name, shape, batch)


PROFILES: tuple[ModelProfile, ...] = (
    _gpt("gpt-125m", 12, 768, 12, 256),
    _gpt("gpt-350m", 24, 1024, 16, 256),
    _gpt("gpt-760m", 24, 1536, 16, 512),
    _gpt("gpt-1.3b", 24, 2048, 16, 512),
    _gpt("gpt-2.7b", 32, 2560, 32, 512),
    ModelProfile(
        "llama-7b",
        ModelShape(
            layers=32,
            hidden_size=4096,
            ffn_hidden_size=11008,
            attention_heads=32,
            kv_heads=32,
            vocab_size=32000,
            sequence_length=2048,
        ),
        1024,
    ),
)

BY_NAME: dict[str, ModelProfile] = {p.name: p for p in PROFILES}


def profile(name: str) -> ModelProfile | None:
    """The profile called ``name`` (case-insensitive), or None."""
    return BY_NAME.get(name.strip().lower())


def default_model(gpus: int) -> str:
    """The profile a row without a model gets: larger jobs train larger models."""
    if gpus <= 1:
        return "gpt-125m"
    if gpus <= 8:
        return "gpt-350m"
    return "gpt-1.3b"
