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
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.tensor import DTensor

from ..checkpoint import Checkpointer
from ..downtime import FROM_MEMORY, FROM_PEERS, FROM_STORAGE, ResizeClock
from ..errors import PermanentError, RetryableError
from ..faults import Faults
from ..layout import CheckpointError, CheckpointRoot, CheckpointStore, Manifest, UnusableRootError
from ..objectstore import ObjectCheckpointRoot
from . import kept
from .data import DataPosition
from .model import ModelParts
from .peerdcp import HeldState, PeerReader, save_in_memory
from .peers import NOTHING_HELD, Transfer, agree_any, agree_source, share_state
from .state import ExtraState, Settings
from .world import World

log = logging.getLogger(__name__)

WAITED_WARN_S = 1.0
"""A periodic save that waited this long for the previous background save says so (warning)."""
STATE_TIMEOUT_S = 600.0
"""How long a collective on the state group waits for a member (at least the world's
collective timeout): saves, restores and the agreement on who holds the state at a world's
start, where one rank may spend minutes writing, reading or verifying a large state, or a
joiner building its model, while the others wait for it."""

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
        self._state_group: dist.ProcessGroup | None = None
        self._members_met = False
        self._blocking_s: float | None = None
        self._restored_bytes: int | None = None
        self._peer_transfer: Transfer | None = None
        self.held: Manifest | None = None
        """What this rank's memory holds: the manifest of the newest step saved or restored
        (``files`` empty where it came from a peer), the state a joiner can take from here."""

    def open(self) -> None:
        """Probe the job's root (after the world is joined): an unusable root is permanent,
        storage out of reach retryable (``errors.RetryableError``: a new world tries again).
        Again after ``World.rejoin``: the state group and the checkpointer are the world's."""
        a = self._world.assignment
        previous = self._checkpointer
        w = self._world
        self._state_group = w.gloo_group(timeout_s=max(STATE_TIMEOUT_S, w.collective_timeout_s))
        self._members_met = False
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
            group=self._state_group,
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
    def state_group(self) -> dist.ProcessGroup:
        """The gloo group of saves, restores and the holders' agreement (``STATE_TIMEOUT_S``),
        created by ``open``; used by one thread at a time (a save in flight is waited for first).
        """
        if self._state_group is None:
            raise RuntimeError("session not started: use `with Session.from_env() as sess:`")
        return self._state_group

    def wait_for_members(self) -> None:
        """Once per world, before the first collective after the script built its model (a
        DDP's broadcast, the holders' agreement): wait on the state group until every member
        is there. A joiner may spend minutes between joining and ``prepare`` (importing,
        loading weights), which the survivors, already there, must not take for a lost
        member as the world's short collective timeout would. Collective; nothing before the
        session is entered (``prepare`` may check a model first: no world to wait for)."""
        if self._state_group is not None and not self._members_met:
            self._members_met = True
            dist.barrier(group=self._state_group)

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
        handoff = kept.take()  # what this process held in its previous world, if anything
        held_step = NOTHING_HELD if handoff is None else handoff.manifest.step
        holders = agree_source(held_step, group=self.state_group)
        if holders.source is not None:
            found = self._receive(holders.source, handoff)
            if found is not None:
                self.commit_held()
                return found
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
        holders = agree_source(NOTHING_HELD if held is None else held.step, group=self.state_group)
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
        """A survivor's side of a live transfer: rank ``src`` sends the tensors of ``state``
        (``_state``'s) with its manifest, non-tensor optimizer entries and replicated blobs
        (registered objects, user state); the others receive them in place."""
        tensors = _tensors(state)
        if self._world.rank == src:
            plain = {k: v for k, v in state["optim"].items() if not isinstance(v, torch.Tensor)}
            self._announce(src, (_LIVE, held, plain, self._extra.replicated()))
            box: tuple[Any, ...] = (_LIVE, held, plain, None)
        else:
            box = self._announce(src, None)
        return self._share_live(src, box, tensors)

    def _share_live(
        self, src: int, box: tuple[Any, ...], tensors: dict[str, torch.Tensor]
    ) -> tuple[Manifest, dict[str, Any], dict[str, Any], Transfer]:
        moved = share_state(
            tensors, src=src, group=self.state_group, device_groups=self._world.device_groups()
        )
        if self._world.rank != src:  # what this rank loaded from a peer (progress, metrics)
            self._peer_transfer = moved
        _, manifest, plain, replicated = box
        return manifest, plain, replicated, moved

    def _announce(self, src: int, box: tuple[Any, ...] | None) -> tuple[Any, ...]:
        """Rank ``src`` tells every member how it holds the state (``_LIVE``: in its model,
        sent as it is; ``_KEPT``: kept in memory by the previous run of the script, loaded
        resharded) and what comes with it."""
        boxes: list[Any] = [box]
        dist.broadcast_object_list(boxes, src=src, group=self.state_group)
        got = boxes[0]
        assert isinstance(got, tuple)
        return got

    def _receive(self, src: int, handoff: kept.Handoff | None) -> Manifest | None:
        """A member without the state in its model: take it from the members that hold it in
        memory, ``src`` the lowest; nothing of the checkpoint root is read. ``None`` where they
        cannot give all of it (a member that held a part left): restore from storage."""
        if self._world.rank == src and handoff is not None:
            box = self._announce(src, (_KEPT, handoff.manifest, handoff.held.metadata))
        else:
            box = self._announce(src, None)
        if box[0] == _KEPT:
            held = None if handoff is None else handoff.held
            return self._load_kept(box[1], box[2], held)
        state, keys = self._state()
        manifest, plain, replicated, moved = self._share_live(src, box, _tensors(state))
        state["optim"].update(plain)
        self._extra.load(replicated, manifest)
        self._apply(state, keys)
        self._adopt_committed(manifest, state_from=FROM_PEERS)
        w = self._world
        log.info(
            "rank %d resumed step %d from peers (rank %d sent %.1f MB in %.2fs) into a world of "
            "%d (plan %s)",
            w.rank, manifest.step, src, moved.bytes / 1e6,
            moved.seconds, w.world_size, w.plan.label,
        )  # fmt: skip
        return manifest

    def _load_kept(
        self, manifest: Manifest, metadata: Metadata, held: HeldState | None
    ) -> Manifest | None:
        """Load the state the members kept in memory at the previous world's stop, resharded
        by DCP to this world's plan, each piece from a member that holds it (``peerdcp``); the
        pieces that left with a member (a shrink) from the checkpoint the old world committed
        at that stop, and only those. ``None`` (nothing loaded) where that fails too."""
        state, keys = self._state()
        extra = self._extra.to_load(set(metadata.state_dict_metadata))
        state.update(extra)
        storage = self.checkpointer.reader(manifest.step)
        reader = PeerReader(held, metadata, self.state_group, storage=storage)
        start = time.perf_counter()
        try:
            dcp_load(state, storage_reader=reader, process_group=self.state_group)
        except CheckpointException as err:
            log.info("rank %d could not load step %d from the members' memory (%s): from storage",
                     self._world.rank, manifest.step, _first_line(err))  # fmt: skip
            return None
        self._peer_transfer = Transfer(reader.received_bytes, time.perf_counter() - start)
        self._restored_bytes = reader.stored_bytes or None
        self._extra.load({k: state[k] for k in extra}, manifest)
        self._apply(state, keys)
        came_from = FROM_MEMORY if held is not None else FROM_PEERS
        if reader.stored_bytes:  # a part came from the volume: the resize needed storage
            came_from = FROM_STORAGE
        self._adopt_committed(manifest, state_from=came_from)
        w = self._world
        log.info(
            "rank %d resumed step %d resharded from the members' memory (%.1f MB from peers in "
            "%.2fs; %.1f MB that left with a member from storage) into a world of %d (plan %s; "
            "plan %s before)",
            w.rank, manifest.step, reader.received_bytes / 1e6, self._peer_transfer.seconds,
            reader.stored_bytes / 1e6, w.world_size, w.plan.label, manifest.extra.get("plan", "?"),
        )  # fmt: skip
        return manifest

    def _adopt_committed(self, manifest: Manifest, *, state_from: str) -> None:
        """A step taken from peers: timed for the resize's downtime; taken as committed, as
        the old world committed it at the stop (kept by prune), unless ``commit_held`` learns
        that the old world moved on without saving it."""
        self._clock.restored(manifest.world_version, manifest.extra, state_from=state_from)
        ckpt = self.checkpointer
        ckpt.last_committed_step = ckpt.restored_step = manifest.step
        ckpt.verified.add(manifest.step)
        self.held = manifest

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
        state, self.held = self._snapshot()
        extra = dict(self.held.extra)
        rank = self._world.rank
        t1 = time.perf_counter()
        if not wait and self._settings.async_checkpoint:
            ckpt.save_async(state, step=step, extra=extra, group=self.state_group)
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

    def hold(self) -> None:
        """Move on without saving the current step: a member carries the whole state into the
        next world in its own process (``carry.py``), where it is this rank's ``held`` step and
        that world writes it in the background (``commit_held``). Until then the newest
        committed checkpoint is the durable copy."""
        self.held = self._manifest()
        log.info("rank %d holds step %d in memory for the next world: no save at this stop",
                 self._world.rank, self.held.step)  # fmt: skip

    def commit_held(self) -> None:
        """In a new world whose state came from memory or peers: where the old world moved on
        without committing the held step (``hold``), stage it now and write and commit it in
        the background, with the old world's manifest fields (its last step's end, for the
        downtime of a later restore). Collective: a joiner cannot know, the survivors tell it."""
        held, ckpt = self.held, self.checkpointer
        pending = held is not None and held.step != ckpt.last_committed_step
        if not agree_any(pending, group=self.state_group) or held is None:
            return
        if ckpt.last_committed_step == held.step:  # a joiner took it as committed: not yet
            ckpt.last_committed_step = None
        state = self._state_to_save()
        start = time.perf_counter()
        extra = {**held.extra, "plan": self._world.plan.label}  # laid out by this world
        ckpt.save_async(state, step=held.step, extra=extra, group=self.state_group)
        self._blocking_s = time.perf_counter() - start
        self.last_save_time = time.monotonic()
        log.info("rank %d staged step %d, held since the last world, in %.2fs; its durable copy "
                 "follows in the background", self._world.rank, held.step,
                 self._blocking_s)  # fmt: skip

    def keep_in_memory(self) -> kept.Handoff:
        """This rank's part of the current step's whole state, copied to host memory, for
        the next run of the script in this process (``rerun.py``). Collective: at a stop,
        every member keeps its part, so the next world finds each piece at a member."""
        state, manifest = self._snapshot()
        start = time.perf_counter()
        held = save_in_memory(state, group=self._world.group)
        log.info("rank %d kept step %d in memory (%.1f MB in %.2fs)", self._world.rank,
                 manifest.step, held.nbytes / 1e6, time.perf_counter() - start)  # fmt: skip
        return kept.Handoff(held, manifest)

    def _snapshot(self) -> tuple[dict[str, Any], Manifest]:
        """The state to save at the current step and its manifest (no files yet)."""
        return self._state_to_save(), self._manifest()

    def _state_to_save(self) -> dict[str, Any]:
        """The whole state at the current step: model, optimizer, blobs, data position."""
        if not self._parts.parts or not self._parts.optimizers:
            raise RuntimeError("call session.restore(model, optimizer) before checkpointing")
        state, _ = self._state()
        state.update(self._extra.to_save())
        state["data"] = {"step": self._data.step}
        return state

    def _manifest(self) -> Manifest:
        """The manifest of the current step (no files yet): what the next world learns of it."""
        step = self._data.step
        extra = {
            **self._data.manifest_extra(),
            "consistency": self._world.consistency,
            "plan": self._world.plan.label,
            **self._clock.manifest_extra(),
        }
        a = self._world.assignment
        return Manifest(a.job, step, self._world.world_size, a.world_version, {}, extra)

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


_LIVE = "live"
_KEPT = "kept"


def _tensors(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The model's and optimizer's tensors of ``_state``, under one name space."""
    return {f"{kind}/{k}": v for kind in ("model", "optim")
            for k, v in state[kind].items() if isinstance(v, torch.Tensor)}  # fmt: skip


def _first_line(err: BaseException) -> str:
    lines = [ln for ln in str(err).splitlines() if ln.strip()]
    return lines[-1] if lines else type(err).__name__


def _tensor_bytes(state: dict[str, Any]) -> int:
    """Bytes of the tensors of a (flat) state dict held on this rank: a DTensor's local shard."""
    total = 0
    for value in state.values():
        local = value.to_local() if isinstance(value, DTensor) else value
        if isinstance(local, torch.Tensor):
            total += local.numel() * local.element_size()
    return total
