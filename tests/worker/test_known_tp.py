"""The known tensor-parallel split refuses, before any rank changes a weight, a block it does
not describe or cannot divide, naming the layer and what would fit.

The refusal needs only the group's size, so a stand-in with ``size()`` plays the mesh here;
the split itself runs in real worlds in ``test_hf_models.py`` (Llama, tp=2, with and without
FSDP).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from torch.distributed.tensor import DTensor
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from elastra_worker.errors import PermanentError
from elastra_worker.parallel.known_tp import apply_known_tensor_parallel


@dataclass(frozen=True)
class GroupOf:
    """What the check reads of a mesh: its size."""

    n: int

    def size(self) -> int:
        return self.n


def llama(**config: Any) -> LlamaForCausalLM:
    fields: dict[str, Any] = {
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 64,
    }  # fmt: skip
    fields.update(config)
    return LlamaForCausalLM(LlamaConfig(**fields))


def gpt2() -> GPT2LMHeadModel:
    return GPT2LMHeadModel(
        GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=64, bos_token_id=0, eos_token_id=1)
    )


@pytest.mark.parametrize(
    ("make", "tp", "message"),
    [
        (lambda: llama(num_key_value_heads=1), 2, "k_proj has 1 heads, not a multiple of tp=2"),
        (llama, 8, "self_attn.q_proj has 4 heads, not a multiple of tp=8"),
        (lambda: llama(intermediate_size=129), 2, "129 features, not a multiple of tp=2"),
        (gpt2, 2, "block transformer.h.0 (GPT2Block) has no self_attn.q_proj"),
    ],
)  # fmt: skip
def test_a_block_the_split_cannot_take_is_refused_untouched(
    make: Any, tp: int, message: str
) -> None:
    model = make()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    with pytest.raises(PermanentError, match=message.replace("(", r"\(").replace(")", r"\)")):
        apply_known_tensor_parallel(model, GroupOf(tp))  # type: ignore[arg-type]
    after = dict(model.named_parameters())
    assert not any(isinstance(p, DTensor) for p in after.values())
    assert all(after[name].detach().equal(p) for name, p in before.items())
