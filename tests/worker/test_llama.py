"""The reference Llama model: shapes, GQA, causality, per-FQN init, config errors, data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from elastra_worker.assignment import split_layers
from elastra_worker.models.llama import (
    ModelConfig,
    ModelConfigError,
    TokenFile,
    Transformer,
    init_weights,
    loss_fn,
    make_batch,
    validate_plan,
)

from .distributed import TINY

SPEC = {"layers": 4, "hiddenSize": 32, "ffnHiddenSize": 64, "attentionHeads": 4,
        "kvHeads": 2, "vocabSize": 97, "sequenceLength": 16}  # fmt: skip


def tiny_model(seed: int = 0) -> Transformer:
    model = Transformer(TINY)
    init_weights(model, seed)
    return model


def test_shapes_and_grouped_query_projections() -> None:
    model = tiny_model()
    tokens, _ = make_batch(range(3), TINY, seed=0)
    assert tokens.shape == (3, 16) and tokens.dtype == torch.int64
    assert model(tokens).shape == (3, 16, 97)
    attn = model.layers["0"].attention
    assert attn.wq.weight.shape == (32, 32)  # 4 heads of 8
    assert attn.wk.weight.shape == (16, 32)  # 2 kv heads of 8
    assert attn.wv.weight.shape == (16, 32)
    assert list(model.layers) == ["0", "1", "2", "3"]
    assert "rope" not in model.state_dict()  # derived, never checkpointed


def test_a_later_token_does_not_change_earlier_logits() -> None:
    model = tiny_model()
    tokens, _ = make_batch([5], TINY, seed=0)
    changed = tokens.clone()
    changed[0, 10] = (changed[0, 10] + 1) % TINY.vocab_size
    a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_stage_modules_hold_the_full_models_parameters_per_fqn() -> None:
    full = tiny_model(seed=7).state_dict()
    seen: dict[str, torch.Tensor] = {}
    stages = split_layers(TINY.layers, 2)
    for s in stages:
        part = Transformer(TINY, layer_ids=range(s.start, s.stop), first=s.stage == 0,
                           last=s.stage == len(stages) - 1)  # fmt: skip
        init_weights(part, seed=7)
        assert not seen.keys() & part.state_dict().keys()
        seen.update(part.state_dict())
    assert seen.keys() == full.keys()
    for name, value in full.items():
        torch.testing.assert_close(seen[name], value, rtol=0, atol=0, msg=name)
    assert "tok_embeddings.weight" in full and "output.weight" in full
    other = tiny_model(seed=8).state_dict()
    assert not torch.equal(other["layers.0.attention.wq.weight"],
                           full["layers.0.attention.wq.weight"])  # fmt: skip


def test_a_model_built_on_the_meta_device_initialises_like_a_real_one() -> None:
    with torch.device("meta"):
        model = Transformer(TINY)
    model.to_empty(device="cpu")
    init_weights(model, seed=0)
    tokens, _ = make_batch(range(2), TINY, seed=0)
    torch.testing.assert_close(model(tokens), tiny_model(seed=0)(tokens))


def test_hidden_states_flow_between_stage_modules() -> None:
    model = tiny_model()
    first = Transformer(TINY, layer_ids=[0, 1], last=False)
    last = Transformer(TINY, layer_ids=[2, 3], first=False)
    for part in (first, last):
        init_weights(part, 0)
    tokens, _ = make_batch(range(2), TINY, seed=1)
    hidden = first(tokens)
    assert hidden.shape == (2, 16, 32)
    torch.testing.assert_close(last(hidden), model(tokens))


def test_from_mapping_and_load(tmp_path: Path) -> None:
    cfg = ModelConfig.from_mapping({**SPEC, "unknownKey": "ignored"})
    assert cfg == TINY
    assert ModelConfig.from_mapping({**SPEC, "kvHeads": None}).kv_heads == 4
    path = tmp_path / "model.yaml"
    path.write_text("\n".join(f"{k}: {v}" for k, v in SPEC.items()))
    assert ModelConfig.load(path) == TINY
    path.write_text("spec:\n  model:\n" + "".join(f"    {k}: {v}\n" for k, v in SPEC.items()))
    assert ModelConfig.load(path) == TINY


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"layers": None}, "model.layers: required field is missing"),
        ({"hiddenSize": "32"}, "model.hiddenSize: expected an integer >= 1"),
        ({"vocabSize": True}, "model.vocabSize: expected an integer >= 1"),
        ({"sequenceLength": 0}, "model.sequenceLength: expected an integer >= 1"),
        ({"kvHeads": 0}, "model.kvHeads: expected an integer >= 1, got 0"),
        ({"hiddenSize": 30}, "model.hiddenSize: 30 must be divisible by attentionHeads 4"),
        ({"hiddenSize": 12}, "model.hiddenSize: the head size"),
        ({"kvHeads": 3}, "model.attentionHeads: 4 must be divisible by kvHeads 3"),
    ],
)
def test_from_mapping_errors_name_the_field(change: dict[str, object], message: str) -> None:
    raw = {k: v for k, v in {**SPEC, **change}.items() if v is not None}
    with pytest.raises(ModelConfigError, match=message):
        ModelConfig.from_mapping(raw)


def test_validate_plan() -> None:
    validate_plan(TINY, tp=2, pp=2, virtual_stages=2)
    with pytest.raises(ModelConfigError, match=r"plan.tp: 4 must divide model.kvHeads \(2\)"):
        validate_plan(TINY, tp=4, pp=1, virtual_stages=1)
    with pytest.raises(ModelConfigError, match=r"plan\.tp: 3 must divide model\.attentionHeads"):
        validate_plan(TINY, tp=3, pp=1, virtual_stages=1)
    odd = ModelConfig.from_mapping({**SPEC, "sequenceLength": 15})
    with pytest.raises(ModelConfigError, match=r"plan\.tp: 2 must divide model\.sequenceLength"):
        validate_plan(odd, tp=2, pp=1, virtual_stages=1)
    with pytest.raises(ModelConfigError, match=r"tp \(0\), pp \(1\) and virtualStages"):
        validate_plan(TINY, tp=0, pp=1, virtual_stages=1)
    with pytest.raises(ModelConfigError, match=r"pp\*virtualStages = 2\*3 = 6 stages"):
        validate_plan(TINY, tp=1, pp=2, virtual_stages=3)


def test_batches_are_per_sample_deterministic() -> None:
    tokens, targets = make_batch([3, 9], TINY, seed=1)
    alone, _ = make_batch([9], TINY, seed=1)
    torch.testing.assert_close(tokens[1:], alone)
    torch.testing.assert_close(tokens[:, 1:], targets[:, :-1])
    assert not torch.equal(make_batch([9], TINY, seed=2)[0], alone)
    assert int(tokens.max()) < TINY.vocab_size


def test_token_file_samples_wrap_around(tmp_path: Path) -> None:
    path = tmp_path / "tokens.bin"
    np.arange(40, dtype=np.int32).tofile(path)
    data = TokenFile(path, TINY.sequence_length, vocab_size=TINY.vocab_size)
    tokens, targets = data.batch([0, 2])
    assert tokens[0].tolist() == list(range(16))
    assert targets[0].tolist() == list(range(1, 17))
    assert tokens[1].tolist() == [(32 + i) % 40 for i in range(16)]
    via_make_batch = make_batch([0, 2], TINY, seed=0, token_file=data)
    torch.testing.assert_close(via_make_batch[0], tokens)
    with pytest.raises(ValueError, match=r"outside 0\.\.9"):
        TokenFile(path, 16, vocab_size=10).batch([0])


def test_loss_falls_within_a_few_dozen_steps() -> None:
    torch.manual_seed(0)
    model = tiny_model()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(40):
        tokens, targets = make_batch(range(step * 16, step * 16 + 16), TINY, seed=0)
        loss = loss_fn(model(tokens), targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 1.0, losses
