"""Find a model's repeated blocks (transformer layers) by path, so any model can be sharded.

FSDP2 makes each block its own unit and activation recomputation wraps each block, so both
need to know which modules are the blocks. The reference model holds them in a ``layers``
ModuleDict; other models hold them elsewhere. ``find_blocks`` takes, in this order:

1. the dotted path the user names (``Session.prepare(model, blocks="model.layers")``);
2. the first of ``KNOWN_PATHS`` that is a ModuleList, ModuleDict or Sequential:
   ``layers`` (the reference model), ``model.layers`` (Hugging Face Llama, Mistral, Qwen),
   ``transformer.h`` (Hugging Face GPT-2, nanoGPT), ...;
3. else the largest ModuleList or ModuleDict below the root whose children are all of one
   class and are themselves composite modules holding parameters (so a list of ``Linear``
   heads is no candidate): largest by the parameters it holds, which prefers the outer list
   when lists nest (blocks holding lists of experts), then by the number of blocks.

A model where none of this finds blocks is a permanent error that says what was looked for
and how to name the path. No hook is needed for these layouts; the hook that parallelizes a
model on a mesh for tensor and pipeline plans is ``elastra_worker.parallel_model.ModelRecipe``.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn
from torch.export.unflatten import InterpreterModule

from elastra_worker.errors import PermanentError

KNOWN_PATHS = (
    "layers",
    "model.layers",
    "transformer.h",
    "blocks",
    "h",
    "decoder.layers",
    "model.decoder.layers",
    "transformer.layers",
    "transformer.blocks",
    "gpt_neox.layers",
)
"""Where well-known models hold their blocks, tried in this order."""

BY_PATH_GIVEN = "the path given"
BY_KNOWN_PATH = "a known path"
BY_SEARCH = "the search"
"""How the blocks were found (``Blocks.found_by``)."""

_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential, InterpreterModule)
"""Containers of blocks; ``InterpreterModule`` is what a container becomes in a pipeline stage
cut by the tracer (``parallel.split``): its children are the stage's blocks."""
_SEARCHED = (nn.ModuleList, nn.ModuleDict)


@dataclass(frozen=True)
class Blocks:
    """The blocks of a model: the container's dotted ``path`` and each block by its name."""

    path: str
    found_by: str  # BY_PATH_GIVEN | BY_KNOWN_PATH | BY_SEARCH
    named: tuple[tuple[str, nn.Module], ...]

    def modules(self) -> list[nn.Module]:
        """The blocks, in the model's order."""
        return [module for _, module in self.named]


def find_blocks(model: nn.Module, path: str | None = None) -> Blocks:
    """The repeated blocks of ``model``: at ``path`` if given, else found (module docstring).

    Raises ``PermanentError`` when ``path`` names no container of modules, or when nothing
    is found; the message says what was looked for and how to name the path.
    """
    if path is not None:
        return Blocks(path, BY_PATH_GIVEN, _children(_at(model, path), path))
    for known in KNOWN_PATHS:
        container = _submodule(model, known)
        if isinstance(container, _CONTAINERS):
            return Blocks(known, BY_KNOWN_PATH, _children(container, known))
    found = _search(model)
    if found is None:
        raise PermanentError(_not_found(model))
    return found


def _submodule(model: nn.Module, path: str) -> nn.Module | None:
    try:
        return model.get_submodule(path)
    except AttributeError:
        return None


def _at(model: nn.Module, path: str) -> nn.Module:
    """The container the user named, or an error saying what is there instead."""
    kind = type(model).__name__
    if not path or path.startswith(".") or path.endswith("."):
        raise PermanentError(f"{kind}: blocks={path!r} is no module path (e.g. 'model.layers')")
    container = _submodule(model, path)
    if container is None:
        raise PermanentError(f"{kind}: blocks={path!r}: the model has no module at that path")
    if not isinstance(container, _CONTAINERS):
        raise PermanentError(
            f"{kind}: blocks={path!r} is a {type(container).__name__}, not the "
            "nn.ModuleList, nn.ModuleDict or nn.Sequential holding the blocks"
        )
    return container


def _children(container: nn.Module, path: str) -> tuple[tuple[str, nn.Module], ...]:
    return tuple((f"{path}.{name}", child) for name, child in container.named_children())


def _is_block_list(module: nn.Module) -> bool:
    """A ModuleList/ModuleDict of composite modules of one class that hold parameters."""
    if not isinstance(module, _SEARCHED):
        return False
    children = list(module.children())
    return (
        bool(children)
        and len({type(child) for child in children}) == 1
        and all(_composite_with_params(child) for child in children)
    )


def _composite_with_params(module: nn.Module) -> bool:
    return any(True for _ in module.children()) and any(True for _ in module.parameters())


def _search(model: nn.Module) -> Blocks | None:
    """The largest candidate list below the root (by parameters, then blocks), else None."""
    best: tuple[int, int] | None = None
    found: Blocks | None = None
    for name, module in model.named_modules():
        if not name or not _is_block_list(module):
            continue
        size = (sum(p.numel() for p in module.parameters()), len(list(module.children())))
        if best is None or size > best:
            best, found = size, Blocks(name, BY_SEARCH, _children(module, name))
    return found


def _not_found(model: nn.Module) -> str:
    return (
        f"{type(model).__name__}: expected its blocks in a `layers` nn.ModuleDict or at a "
        f"known path ({', '.join(KNOWN_PATHS)}), or in any nn.ModuleList/nn.ModuleDict of "
        "same-class modules; found none: name the module holding them with "
        "Session.prepare(model, blocks='path.to.blocks')"
    )
