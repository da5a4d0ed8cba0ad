"""The block finder on plain torch modules: known paths, the search, the user's path, errors."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from elastra_worker.api import Session
from elastra_worker.assignment import assignment_from_env
from elastra_worker.errors import PermanentError
from elastra_worker.parallel.blocks import (
    BY_KNOWN_PATH,
    BY_PATH_GIVEN,
    BY_SEARCH,
    KNOWN_PATHS,
    find_blocks,
)
from elastra_worker.parallel.recompute import apply_recompute


class Block(nn.Module):
    """A composite block holding parameters, as a transformer layer is."""

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.GELU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.mlp(x)
        return out


class Other(Block):
    """A second block class, for lists that mix classes."""


def nest(path: str, leaf: nn.Module) -> nn.Module:
    """A root module with ``leaf`` at the dotted ``path`` (plain modules in between)."""
    root = nn.Module()
    parent = root
    *heads, last = path.split(".")
    for name in heads:
        child = nn.Module()
        parent.add_module(name, child)
        parent = child
    parent.add_module(last, leaf)
    root.add_module("head", nn.Linear(4, 4))
    return root


def blocks(n: int) -> nn.ModuleList:
    return nn.ModuleList(Block() for _ in range(n))


@pytest.mark.parametrize("path", KNOWN_PATHS)
def test_every_known_path_is_found(path: str) -> None:
    model = nest(path, blocks(3))
    found = find_blocks(model)
    assert (found.path, found.found_by) == (path, BY_KNOWN_PATH)
    assert [name for name, _ in found.named] == [f"{path}.{i}" for i in range(3)]
    assert found.modules() == list(model.get_submodule(path).children())


# model builder, the path found, how many blocks
CASES = {
    "reference layout: a layers ModuleDict": (
        lambda: nest("layers", nn.ModuleDict({"0": Block(), "1": Block()})), "layers", 2),
    "HF Llama: model.layers": (lambda: nest("model.layers", blocks(2)), "model.layers", 2),
    "nanoGPT and HF GPT-2: transformer.h": (lambda: nest("transformer.h", blocks(2)),
                                            "transformer.h", 2),
    "a known path wins over a bigger list elsewhere": (
        lambda: _two(("blocks", blocks(1)), ("stack.layers", blocks(5))), "blocks", 1),
    "timm-style Sequential at a known path": (
        lambda: nest("blocks", nn.Sequential(Block(), Block())), "blocks", 2),
    "search: a list at an unknown path": (lambda: nest("encoder.stack", blocks(3)),
                                          "encoder.stack", 3),
    "search: a ModuleDict at an unknown path": (
        lambda: nest("trunk", nn.ModuleDict({"a": Block(), "b": Block()})), "trunk", 2),
    "search: the list holding the most parameters": (
        lambda: _two(("small", blocks(3)), ("big", nn.ModuleList(Block(16) for _ in range(2)))),
        "big", 2),
    "search: nested lists take the outer one": (
        lambda: nest("stack", nn.ModuleList(_with_experts() for _ in range(2))), "stack", 2),
    "search: a list of Linear heads is no block list": (
        lambda: _two(("heads", nn.ModuleList(nn.Linear(4, 4) for _ in range(8))),
                     ("trunk", blocks(2))), "trunk", 2),
    "search: mixed classes are no block list": (
        lambda: _two(("mixed", nn.ModuleList([Block(), Other(), Block()])), ("trunk", blocks(2))),
        "trunk", 2),
}  # fmt: skip


def _two(*parts: tuple[str, nn.Module]) -> nn.Module:
    root = nn.Module()
    for path, leaf in parts:
        head, _, last = path.rpartition(".")
        parent = root
        if head:
            parent = nn.Module()
            root.add_module(head, parent)
        parent.add_module(last, leaf)
    return root


def _with_experts() -> nn.Module:
    block = Block()
    block.add_module("experts", nn.ModuleList(Block() for _ in range(4)))
    return block


@pytest.mark.parametrize(("build", "path", "count"), CASES.values(), ids=CASES.keys())
def test_blocks_are_found_by_path_else_by_search(
    build: Callable[[], nn.Module], path: str, count: int
) -> None:
    found = find_blocks(build())
    assert (found.path, len(found.named)) == (path, count)
    assert found.found_by == (BY_KNOWN_PATH if path in KNOWN_PATHS else BY_SEARCH)


def test_the_path_given_wins_over_what_would_be_found() -> None:
    model = _two(("layers", blocks(2)), ("extra.list", blocks(3)))
    found = find_blocks(model, "extra.list")
    assert (found.path, found.found_by, len(found.named)) == ("extra.list", BY_PATH_GIVEN, 3)


ERRORS = {
    "nothing found": (nn.Sequential(nn.Linear(4, 4), nn.ReLU()), None,
                      "Sequential: expected its blocks in a `layers` nn.ModuleDict or at a known "
                      "path (layers, model.layers, transformer.h"),
    "how to name it": (nn.Sequential(nn.Linear(4, 4)), None,
                       "name the module holding them with Session.prepare(model, "
                       "blocks='path.to.blocks')"),
    "no module there": (nest("model.layers", blocks(2)), "model.layer",
                        "Module: blocks='model.layer': the model has no module at that path"),
    "not a container": (nest("model.layers", blocks(2)), "head",
                        "Module: blocks='head' is a Linear, not the nn.ModuleList, nn.ModuleDict "
                        "or nn.Sequential holding the blocks"),
    "empty path": (nest("model.layers", blocks(2)), "", "Module: blocks='' is no module path"),
}  # fmt: skip


@pytest.mark.parametrize(("model", "path", "message"), ERRORS.values(), ids=ERRORS.keys())
def test_no_blocks_is_a_permanent_error_that_says_what_to_do(
    model: nn.Module, path: str | None, message: str
) -> None:
    with pytest.raises(PermanentError) as err:
        find_blocks(model, path)
    assert message in str(err.value)


def test_prepare_checks_the_path_it_is_given_under_any_plan() -> None:
    """A data-parallel plan needs no blocks; a typo in ``blocks=`` still fails at once."""
    env = {"RANK": "0", "WORLD_SIZE": "1", "ELASTRA_GLOBAL_BATCH_SIZE": "4"}
    sess = Session(assignment_from_env(env), device=torch.device("cpu"))
    assert sess.plan.sharding == "none"
    with pytest.raises(PermanentError, match=r"blocks='model\.layer': the model has no module"):
        sess.prepare(nest("model.layers", blocks(2)), blocks="model.layer")


def saved_bytes(model: nn.Module, path: str) -> int:
    """Bytes saved for backward by one pass through the blocks at ``path``."""
    saved = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += t.numel() * t.element_size()
        return t

    x = torch.ones(2, 4, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        for block in model.get_submodule(path).children():
            x = block(x)
    x.sum().backward()
    return saved


def test_full_recompute_wraps_found_blocks_and_selective_names_what_is_missing() -> None:
    torch.manual_seed(0)
    plain, wrapped = nest("transformer.h", blocks(2)), nest("transformer.h", blocks(2))
    apply_recompute(wrapped, "full")
    assert saved_bytes(wrapped, "transformer.h") < saved_bytes(plain, "transformer.h")
    with pytest.raises(PermanentError, match=r"block transformer\.h\.0 \(Block\) has no "
                                             "`attention.core` submodule"):  # fmt: skip
        apply_recompute(nest("transformer.h", blocks(2)), "selective")
