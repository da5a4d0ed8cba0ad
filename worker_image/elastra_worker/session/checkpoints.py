"""The checkpoint manager: the job's checkpoint root opened, the newest good step restored into
the model parts, a step saved (blocking, or staged and written in the background).

A checkpoint holds every part's model and optimizer state under parameter names (optimizer
state flattened, ``state.<fqn>.exp_avg``), so any plan loads any other plan's checkpoint and DCP
reshards it to this rank's shards; beside them the data position, the registered objects, user
state and RNG (``state.py``). Writing, verifying and committing are ``checkpoint.Checkpointer``'s.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor

from ..checkpoint import Checkpointer
from ..downtime import FROM_PEERS, ResizeClock
from ..errors import PermanentError, RetryableError
from ..faults import Faults
from ..layout import CheckpointError, CheckpointRoot, CheckpointStore, Manifest, UnusableRootError
from ..objectstore import ObjectCheckpointRoot
from .data import DataPosition
from .model import ModelParts
from .peers import NOTHING_HELD, Transfer, agree_source, share_state
from .state import ExtraState, Settings
from .world import World

log = logging.getLogger(__name__)

WAITED_WARN_S = 1.0
"""A periodic save that waited this long for the previous background save says so (warning)."""

# Optimizer state keyed by parameter name ("state.<fqn>.exp_avg"), so it reshards between any
# two plans and the state of several pipeline stage modules merges without clashes.
_FLAT_OPTIM = StateDictOptions(flatten_optimizer_state_dict=True)


class CheckpointManager:
    """Restore and save the session's whole state through the job's checkpoint root."""

    def __init__(
        self,
        world: World,
        parts: ModelParts,
        *,
        state: ExtraState,
        data: DataPosition,
        clock: ResizeClock,
        faults: Faults,
        settings: Settings,
    ) -> None:
        self._world = world
        self._parts = parts
        self._extra = state
        self._data = data
        self._clock = clock
        self._faults = faults
        self._settings = settings
        self.last_save_time = time.monotonic()
        self._checkpointer: Checkpointer | None = None
        self._async_group: dist.ProcessGroup | None = None
        self._blocking_s: float | None = None
        self._restored_bytes: int | None = None
        self._peer_transfer: Transfer | None = None
        self.held: Manifest | None = None
        """What this rank's memory holds: the manifest of the newest step saved or restored
        (``files`` empty where it came from a peer), the state a joiner can take from here."""

    def open(self) -> None:
        """Probe the job's root (after the world is joined): an unusable root is permanent,
        storage out of reach retryable (``errors.RetryableError``: a new world tries again).
        Again after ``World.rejoin``: the checkpointer is bound to the world's group."""
        a = self._world.assignment
        previous = self._checkpointer
        if self._settings.async_checkpoint:
            self._async_group = self._world.gloo_group()
        root: CheckpointStore = (
            ObjectCheckpointRoot(a.checkpoint.uri, job=a.job)
            if a.checkpoint.uri
            else CheckpointRoot(a.checkpoint.path, job=a.job)
        )
        try:
            root.probe()  # an unusable root fails the job now (permanent), not at the first save
        except UnusableRootError as err:
            raise PermanentError(str(err)) from None
        except CheckpointError as err:  # storage out of reach for now: a new world retries
            raise RetryableError(str(err)) from None
        self._checkpointer = Checkpointer(
            root,
            group=self._world.group,
            world_version=a.world_version,
            keep=a.checkpoint.keep,
            thread_count=int(os.environ.get("ELASTRA_CHECKPOINT_THREADS", "4")),
            after_write=self._faults.in_save,
            read_latest=False,  # restore() learns it, from storage or from the peers
        )
        if previous is not None:  # a survivor's new world: what it committed and verified
            ckpt = self._checkpointer
            ckpt.last_committed_step = previous.last_committed_step
            ckpt.restored_step, ckpt.verified = previous.restored_step, previous.verified

    @property
    def opened(self) -> bool:
        return self._checkpointer is not None

    @property
    def checkpointer(self) -> Checkpointer:
        if self._checkpointer is None:
            raise RuntimeError("session not started: use `with Session.from_env() as sess:`")
        return self._checkpointer

    @property
    def last_committed_step(self) -> int | None:
        """The newest step committed (or restored); ``None`` before any."""
        return None if self._checkpointer is None else self._checkpointer.last_committed_step

    def progress(self) -> dict[str, Any]:
        """What checkpoints cost this rank, for its progress report and metrics: the newest
        committed step; the seconds the newest save of this world stopped training (staging
        only, for a background save) and the seconds the newest background save took to write
        and commit; the bytes of state this world's restore read from storage (its shards).
        ``None`` where this world has no such figure yet."""
        background = None if self._checkpointer is None else self._checkpointer.last_background
        return {
            "lastCheckpointStep": self.last_committed_step,
            "checkpointBlockingSeconds": None
            if self._blocking_s is None
            else round(self._blocking_s, 4),
            "checkpointBackgroundSeconds": None
            if background is None
            else round(background.seconds, 4),
            "stateBytesFromStorage": self._restored_bytes,
            "stateBytesFromPeers": None
            if self._peer_transfer is None
            else self._peer_transfer.bytes,
            "peerTransferSeconds": None
            if self._peer_transfer is None
            else round(self._peer_transfer.seconds, 4),
        }

    def wait(self) -> int | None:
        """Finish a background save in flight (re-raising its error); the newest committed step."""
        self.checkpointer.wait()
        return self.checkpointer.last_committed_step

    def restore(self) -> Manifest | None:
        """Load the newest state into the parts and the registered state: from a member of
        this world that holds it in memory (a survivor of the resize) if any, else from the
        newest good checkpoint; its manifest, or ``None`` (everything left untouched) when the
        job has none yet. Collective: the survivors meet it in ``share_with_joiners``."""
        holders = agree_source(NOTHING_HELD, group=self._world.group)
        if holders.source is not None:
            return self._receive(holders.source)
        ckpt = self.checkpointer
        manifest = ckpt.find_loadable()
        if manifest is not None:
            self._load(manifest)
        ckpt.last_committed_step = None if manifest is None else manifest.step
        self.held = manifest
        return manifest

    def share_with_joiners(self) -> None:
        """A survivor in its new world: agree with the members on who holds the state (the
        joiners ask in ``restore``) and, if some member lacks it, send it from the lowest
        rank that holds it. Collective."""
        held = self.held
        holders = agree_source(NOTHING_HELD if held is None else held.step, group=self._world.group)
        if holders.source is None or holders.all_hold:
            return
        if held is None or held.step != holders.newest:
            raise RuntimeError(
                f"rank {self._world.rank} holds step {None if held is None else held.step}, "
                f"another member step {holders.newest}: survivors of one world hold one step"
            )
        *_, moved = self._transfer(holders.source, held, self._state()[0])
        if self._world.rank == holders.source:
            log.info(
                "rank %d sent step %d to the world's joiners: %.1f MB in %.2fs",
                self._world.rank,
                held.step,
                moved.bytes / 1e6,
                moved.seconds,
            )

    def _transfer(
        self, src: int, held: Manifest | None, state: dict[str, Any]
    ) -> tuple[Manifest, dict[str, Any], dict[str, Any], Transfer]:
        """Send (rank ``src``) or receive in place the tensors of ``state`` (``_state``'s);
        every rank gets the source's manifest, non-tensor optimizer entries and replicated
        blobs (registered objects, user state)."""
        tensors = {f"{kind}/{k}": v for kind in ("model", "optim")
                   for k, v in state[kind].items() if isinstance(v, torch.Tensor)}  # fmt: skip
        box: list[Any] = [None]
        if self._world.rank == src:
            plain = {k: v for k, v in state["optim"].items() if not isinstance(v, torch.Tensor)}
            box = [(held, plain, self._extra.replicated())]
        dist.broadcast_object_list(box, src=src, group=self._world.group)
        moved = share_state(tensors, src=src, group=self._world.group)
        if self._world.rank != src:  # what this rank loaded from a peer (progress, metrics)
            self._peer_transfer = moved
        manifest, plain, replicated = box[0]
        return manifest, plain, replicated, moved

    def _receive(self, src: int) -> Manifest:
        """A joiner: take the state from rank ``src``, which holds it in memory; nothing of
        the checkpoint root is read."""
        state, keys = self._state()
        manifest, plain, replicated, moved = self._transfer(src, None, state)
        state["optim"].update(plain)
        self._extra.load(replicated, manifest)
        self._apply(state, keys)
        self._clock.restored(manifest.world_version, manifest.extra, state_from=FROM_PEERS)
        ckpt = self.checkpointer  # the survivors committed this step at the stop: kept by prune
        ckpt.last_committed_step = ckpt.restored_step = manifest.step
        ckpt.verified.add(manifest.step)
        self.held = manifest
        w = self._world
        log.info(
            "rank %d resumed step %d from peers (rank %d sent %.1f MB in %.2fs) into a world of "
            "%d (plan %s)",
            w.rank, manifest.step, src, moved.bytes / 1e6,
            moved.seconds, w.world_size, w.plan.label,
        )  # fmt: skip
        return manifest

    def _state(self) -> tuple[dict[str, Any], list[tuple[set[str], set[str]]]]:
        """The DCP state of every part, merged under parameter names, and each part's keys."""
        model: dict[str, Any] = {}
        optim: dict[str, Any] = {}
        keys: list[tuple[set[str], set[str]]] = []
        for part, opt in zip(self._parts.parts, self._parts.optimizers, strict=True):
            msd = get_model_state_dict(part)
            osd = get_optimizer_state_dict(part, opt, options=_FLAT_OPTIM)
            model.update(msd)
            optim.update(osd)
            keys.append((set(msd), set(osd)))
        return {"model": model, "optim": optim}, keys

    def _load(self, manifest: Manifest) -> None:
        state, keys = self._state()
        ckpt = self.checkpointer
        saved = ckpt.reader(manifest.step).read_metadata().state_dict_metadata
        extra = self._extra.to_load(set(saved))
        state.update(extra)
        ckpt.load(state, manifest)
        self._restored_bytes = _tensor_bytes(state["model"]) + _tensor_bytes(state["optim"])
        self._extra.load({k: state[k] for k in extra}, manifest)
        self._apply(state, keys)
        self._clock.restored(manifest.world_version, manifest.extra)
        w = self._world
        log.info(
            "rank %d restored step %d (saved by %d ranks, plan %s) into a world of %d (plan %s)",
            w.rank,
            manifest.step,
            manifest.world_size,
            manifest.extra.get("plan", "?"),
            w.world_size,
            w.plan.label,
        )

    def _apply(self, state: dict[str, Any], keys: list[tuple[set[str], set[str]]]) -> None:
        """Set every part's model and optimizer state from the merged ``state``."""
        parts = zip(keys, self._parts.parts, self._parts.optimizers, strict=True)
        for (mkeys, okeys), part, opt in parts:
            set_model_state_dict(part, {k: state["model"][k] for k in mkeys})
            osd = {k: state["optim"][k] for k in okeys}
            set_optimizer_state_dict(part, opt, osd, options=_FLAT_OPTIM)

    def save(self, *, wait: bool) -> None:
        """Checkpoint the current step (``Session.save_checkpoint``); a no-op if committed."""
        ckpt = self.checkpointer
        self._wait_for_previous()
        step = self._data.step
        if ckpt.last_committed_step == step:
            return
        if not self._parts.parts or not self._parts.optimizers:
            raise RuntimeError("call session.restore(model, optimizer) before checkpointing")
        state, _ = self._state()
        state.update(self._extra.to_save())
        state["data"] = {"step": step}
        extra = {
            **self._data.manifest_extra(),
            "consistency": self._world.consistency,
            "plan": self._world.plan.label,
            **self._clock.manifest_extra(),
        }
        w = self._world
        self.held = Manifest(w.assignment.job, step, w.world_size, w.assignment.world_version,
                             {}, extra)  # fmt: skip
        rank = w.rank
        t1 = time.perf_counter()
        if not wait and self._settings.async_checkpoint and self._async_group is not None:
            ckpt.save_async(state, step=step, extra=extra, group=self._async_group)
            self._blocking_s = time.perf_counter() - t1
            log.info(
                "rank %d staged step %d in %.2fs; writing it in the background",
                rank,
                step,
                self._blocking_s,
            )
        else:
            result = ckpt.save(state, step=step, extra=extra)
            self._blocking_s = time.perf_counter() - t1
            log.info(
                "rank %d committed step %d (%.1f MB in %.2fs)",
                rank,
                result.step,
                result.bytes / 1e6,
                result.seconds,
            )
        self.last_save_time = time.monotonic()

    def _wait_for_previous(self) -> None:
        """One save at a time, in step order: finish the one in flight (warn if it was slow)."""
        t0 = time.perf_counter()
        previous = self.checkpointer.wait()
        waited = time.perf_counter() - t0
        if previous is not None and waited > WAITED_WARN_S:
            log.warning(
                "rank %d waited %.2fs for the background save of step %d: checkpoints are due "
                "faster than the storage writes them (raise checkpoint.intervalSeconds)",
                self._world.rank,
                waited,
                previous.step,
            )


def _tensor_bytes(state: dict[str, Any]) -> int:
    """Bytes of the tensors of a (flat) state dict held on this rank: a DTensor's local shard."""
    total = 0
    for value in state.values():
        local = value.to_local() if isinstance(value, DTensor) else value
        if isinstance(local, torch.Tensor):
            total += local.numel() * local.element_size()
    return total
