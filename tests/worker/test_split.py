"""Cutting models nobody here wrote into pipeline stages at module paths: where the cuts go,
what the stages hold (the whole model's names and keys, the same outputs), and the one-line
errors for split points, tied weights and forwards the tracer cannot capture."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest
import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from elastra_worker.assignment import StageLayers
from elastra_worker.errors import PermanentError
from elastra_worker.parallel.blocks import BY_KNOWN_PATH, Blocks, find_blocks
from elastra_worker.parallel.split import split_points, trace_stages

VOCAB = 64


def llama(layers: int = 4, *, use_cache: bool = False) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=32, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=32, use_cache=use_cache,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def gpt2(*, tied: bool) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(
        n_embd=32, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=32, use_cache=False,
        tie_word_embeddings=tied,
    )  # fmt: skip
    return GPT2LMHeadModel(config)


def tokens(rows: int = 2) -> torch.Tensor:
    return torch.arange(rows * 8).reshape(rows, 8) % VOCAB


def blocks(count: int) -> Blocks:
    named = tuple((f"model.layers.{i}", nn.Linear(1, 1)) for i in range(count))
    return Blocks("model.layers", BY_KNOWN_PATH, named)


def ranges(*bounds: int) -> tuple[StageLayers, ...]:
    return tuple(
        StageLayers(stage=i, start=a, stop=b) for i, (a, b) in enumerate(itertools.pairwise(bounds))
    )


@pytest.mark.parametrize(
    ("count", "stages", "plan_stages", "split", "want"),
    [
        (4, 2, (), None, [2]),  # even
        (5, 2, (), None, [3]),  # earlier stages one more
        (6, 3, (), None, [2, 4]),
        (4, 2, ranges(0, 1, 4), None, [1]),  # the plan's ranges when they cover the blocks
        (4, 2, ranges(0, 1, 3), None, [2]),  # not when they do not (the plan's model is another)
        (4, 2, ranges(0, 1, 2, 4), None, [2]),  # nor when they count other stages
        (4, 2, ranges(0, 1, 4), ["model.layers.3"], [3]),  # the user's paths win
        (4, 3, (), ["model.layers.1", "model.layers.2"], [1, 2]),
    ],
)
def test_split_points(
    count: int,
    stages: int,
    plan_stages: tuple[StageLayers, ...],
    split: list[str] | None,
    want: list[int],
) -> None:
    got = split_points(blocks(count), stages, plan_stages=plan_stages, split=split)
    assert got == [f"model.layers.{i}" for i in want]


@pytest.mark.parametrize(
    ("count", "stages", "split", "message"),
    [
        (4, 3, ["model.layers.2"], r"names 1 split points; the plan has 3 stages, so name 2"),
        (4, 2, ["model.norm"], r"model.norm are not blocks .* model.layers.0 \.\. model.layers.3"),
        (4, 2, ["model.layers.0"], r"after its first block model.layers.0"),
        (4, 3, ["model.layers.2", "model.layers.1"], r"distinct blocks in the model's order"),
        (4, 3, ["model.layers.2", "model.layers.2"], r"distinct blocks in the model's order"),
        (2, 3, None, r"3 stages need at least 3 blocks, found 2 at model.layers"),
    ],
)
def test_split_points_that_cannot_be_are_permanent_errors(
    count: int, stages: int, split: Sequence[str] | None, message: str
) -> None:
    with pytest.raises(PermanentError, match=message):
        split_points(blocks(count), stages, split=split)


def test_llama_stages_hold_the_whole_models_names_keys_and_outputs() -> None:
    model = llama()
    want = model(input_ids=tokens()).logits
    parts = trace_stages(model, (tokens(),), ["model.layers.2"]).modules
    names = [[n for n, _ in part.named_parameters()] for part in parts]
    flat = [n for group in names for n in group]  # each parameter in one stage, by its name
    assert sorted(flat) == sorted(n for n, _ in model.named_parameters())
    assert set(names[1]) == {n for n, _ in model.named_parameters() if n.startswith(
        ("model.layers.2.", "model.layers.3.", "model.norm.", "lm_head."))}  # fmt: skip
    # the rotary table is no checkpoint key in the model, so in no stage either
    assert {k for part in parts for k in part.state_dict()} == set(model.state_dict())
    # the second stage takes the first's output and rotary table (cos, sin) and the mask
    torch.testing.assert_close(parts[1](*parts[0](tokens())), want, rtol=0, atol=0)
    # the blocks are found at the model's path in every stage (for FSDP and recomputation)
    assert [n for n, _ in find_blocks(parts[1], "model.layers").named] == [
        "model.layers.2", "model.layers.3"]  # fmt: skip


def test_a_stage_taking_a_value_past_the_stage_before_it_is_refused() -> None:
    with pytest.raises(PermanentError) as error:  # Llama's third stage takes the rotary table
        trace_stages(llama(), (tokens(),), ["model.layers.1", "model.layers.3"])
    assert str(error.value) == (
        "pipeline: stage 2 of LlamaForCausalLM takes a value from stage 0 (not the stage before "
        "it), which torch.distributed.pipelining cannot train through yet; plan at most 2 "
        "stages (pp x virtualStages)"
    )


def test_an_untied_gpt2_is_cut_and_a_tied_one_refused() -> None:
    parts = trace_stages(gpt2(tied=False), (tokens(),), ["transformer.h.1"]).modules
    assert "lm_head.weight" in dict(parts[1].named_parameters())
    with pytest.raises(PermanentError) as error:
        trace_stages(gpt2(tied=True), (tokens(),), ["transformer.h.1"])
    assert str(error.value) == (
        "pipeline: transformer.wte.weight and lm_head.weight are one tied parameter in "
        "different stages; untie them (Hugging Face: config.tie_word_embeddings=False) or "
        "train this model without pipeline stages"
    )


def test_a_forward_the_tracer_cannot_capture_is_one_line() -> None:
    with pytest.raises(PermanentError) as error:  # the cache object in the output
        trace_stages(llama(2, use_cache=True), (tokens(),), ["model.layers.1"])
    line = str(error.value)
    assert "\n" not in line
    assert line.startswith("pipeline: torch.distributed.pipelining could not trace LlamaForCausal")
    assert "config.use_cache=False" in line
