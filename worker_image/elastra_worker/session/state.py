"""Checkpointed state besides the model and optimizer: registered objects, ``user_state`` and
each rank's RNG state.

Each is one pickled blob under its own checkpoint key (DCP keeps a non-tensor value as bytes),
so any ``state_dict`` structure round-trips. Registered objects and ``user_state`` are the same
on every rank: rank 0's copy is saved and every rank loads it. RNG state is per rank; a rank
the saving world lacked reseeds from (seed, rank, step).
"""

from __future__ import annotations

import hashlib
import io
import logging
import random
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from ..errors import PermanentError
from ..layout import Manifest

log = logging.getLogger(__name__)

OBJECT_KEY = "objects/"
USER_STATE_KEY = "user_state"
RNG_KEY = "rng/rank{}"
SCALER_NAME = "gradScaler"
"""The name an fp16 job's loss scaler is checkpointed under (when the script registers none)."""


class Stateful(Protocol):
    """What ``Session.register`` takes: an LR scheduler, a GradScaler, any object of yours."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any], /) -> Any: ...


BeforeUpdate = Callable[[list[nn.Parameter]], None]


class Settings(Protocol):
    """What a script may set on its ``Session`` at any time; the parts read it when they act."""

    user_state: dict[str, Any]
    tokens_per_sample: int | None
    before_update: BeforeUpdate | None
    async_checkpoint: bool


class ExtraState:
    """The registered objects, ``user_state`` and this rank's RNG, as checkpoint blobs."""

    def __init__(self, settings: Settings, *, rank: int, seed: int) -> None:
        self._settings = settings
        self.rank = rank
        self.seed = seed
        self.objects: dict[str, Stateful] = {}
        self.restored = False
        """Set by ``Session.restore``: the objects are loaded, none may be registered after."""

    def register(self, name: str, obj: Stateful) -> None:
        """Checkpoint ``obj`` under ``name`` (see ``Session.register``)."""
        if self.restored:
            raise RuntimeError(
                f"register({name!r}) after restore(): register every stateful object before "
                "session.restore(), which loads them"
            )
        if not name or "/" in name or "." in name:
            raise PermanentError(f"register: name {name!r} must be non-empty without '/' or '.'")
        if name in self.objects:
            raise PermanentError(f"register: {name!r} is already registered")
        scaler = isinstance(obj, torch.amp.GradScaler)
        if name == SCALER_NAME and not scaler:
            raise PermanentError(f"register: the name {name!r} is kept for the loss scaler")
        if not callable(getattr(obj, "state_dict", None)) or not callable(
            getattr(obj, "load_state_dict", None)
        ):
            raise PermanentError(f"register({name!r}): {type(obj).__name__} has no state_dict()")
        if scaler and any(isinstance(o, torch.amp.GradScaler) for o in self.objects.values()):
            raise PermanentError("register: one GradScaler per session")
        self.objects[name] = obj

    def to_save(self) -> dict[str, Any]:
        """This rank's blobs: its RNG, and on rank 0 the replicated objects and user state."""
        state = {RNG_KEY.format(self.rank): _pack(_rng_state())}
        if self.rank == 0:  # replicated state: one copy, rank 0's
            state.update(self.replicated())
        return state

    def replicated(self) -> dict[str, Any]:
        """The blobs every rank shares (registered objects, user state), from any rank: what
        a survivor sends a joiner (``checkpoints.CheckpointManager.share_with_joiners``)."""
        state = {OBJECT_KEY + n: _pack(o.state_dict()) for n, o in self.objects.items()}
        state[USER_STATE_KEY] = _pack(dict(self._settings.user_state))
        return state

    def to_load(self, saved: set[str]) -> dict[str, Any]:
        """Placeholders for the blobs to read: only keys the checkpoint has (``saved``), so a
        rank the saving world did not have asks for no RNG state (old checkpoints have none)."""
        keys = [OBJECT_KEY + name for name in self.objects]
        keys += [USER_STATE_KEY, RNG_KEY.format(self.rank)]
        return {k: b"" for k in keys if k in saved}

    def load(self, state: dict[str, Any], manifest: Manifest) -> None:
        """Load what ``to_load`` asked for (or a peer sent); reseed the RNG of a rank that was
        not saved (a joiner taking state from a peer has none either)."""
        for name, obj in self.objects.items():
            blob = state.get(OBJECT_KEY + name)
            if blob is None:
                log.warning(
                    "checkpoint step %d has no state for %r: kept as is", manifest.step, name
                )
            else:
                obj.load_state_dict(_unpack(blob))
        if USER_STATE_KEY in state:
            self._settings.user_state.clear()  # in place: the script may hold the dict
            self._settings.user_state.update(_unpack(state[USER_STATE_KEY]))
        rng = state.get(RNG_KEY.format(self.rank))
        if rng is not None:
            _set_rng_state(_unpack(rng))
            return
        _reseed(derived_seed(self.seed, self.rank, manifest.step))
        log.info(
            "rank %d: checkpoint step %d (saved by %d ranks) has no RNG state for this rank; "
            "reseeded from (seed %d, rank %d, step %d)",
            self.rank,
            manifest.step,
            manifest.world_size,
            self.seed,
            self.rank,
            manifest.step,
        )


def _pack(obj: Any) -> bytes:
    """One checkpoint blob (``torch.save``: tensors inside a state dict are fine)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _unpack(blob: Any) -> Any:
    """Inverse of ``_pack``; the checkpoint is our own, verified against its manifest."""
    return torch.load(io.BytesIO(blob), weights_only=False)


def _rng_state() -> dict[str, Any]:
    """Every RNG a training script commonly draws from: torch CPU and CUDA, random, numpy."""
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def derived_seed(seed: int, rank: int, step: int) -> int:
    """A seed for a rank the checkpoint has no RNG state for: a function of (seed, rank, step)."""
    digest = hashlib.sha256(f"elastra-rng/{seed}/{rank}/{step}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def _reseed(seed: int) -> None:
    torch.manual_seed(seed)  # also every CUDA device
    random.seed(seed)
    np.random.seed(seed)
