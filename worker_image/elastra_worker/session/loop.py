"""The step loop: global steps cut into this rank's micro-batches, and the end of each step.

``batches()`` yields the global steps from the data position on; the script runs forward and
backward per micro-batch (``Micro``) and calls ``step()``, which reduces the gradients, updates
through the loss scaler, and agrees with every rank on the loss and on what comes next (stop,
checkpoint) with one small all-reduce, so all ranks stop at the same step even though each pod
sees a new assignment at its own time. The agreed checkpoint is taken when the loop body returns
to ``batches()``, after whatever the script does following ``step()``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
from torch.nn.parallel import DistributedDataParallel

from ..control import ControlDir, TrainerStatus
from ..dataorder import Share
from ..faults import Faults
from ..stalls import StallWatch
from . import kept
from .carry import may_rerun, move_to_next_world
from .checkpoints import CheckpointManager
from .data import DataPosition
from .gradients import ShareChain, loss_weight, reduce_gradients
from .model import ModelParts
from .records import StepRecorder
from .scaling import LossScaling
from .state import ExtraState, Settings
from .world import World


@dataclass(frozen=True)
class Decisions:
    """What the whole world agreed on at the end of a step (one all-reduce)."""

    loss: float
    stop: bool
    done: bool
    checkpoint: bool
    keep: bool = False
    """Every member keeps its part of the state in memory at this stop: a member offered the
    next world will run its script again to enter it (``rerun.py``)."""
    defer_save: bool = False
    """The stop saves nothing yet: once every member knows its next world, the old world
    either commits the step or, where a member carries the whole state into the next world
    in its own process, leaves that world to commit it in the background
    (``carry.save_or_hold``)."""


class Micro:
    """One logical share (micro-batch) of this rank's part of a step."""

    def __init__(self, loop: StepLoop, share: Share, *, is_last: bool) -> None:
        self._loop = loop
        self.index = share.index
        self.samples: tuple[int, ...] = share.samples
        self.is_last = is_last

    def __len__(self) -> int:
        return len(self.samples)

    @contextlib.contextmanager
    def sync(self, model: nn.Module) -> Iterator[None]:
        """Wrap forward and backward: the job's precision (``Session.autocast``) for the
        forward, and no gradient sync by the wrapper on all but the last micro-batch."""
        with self._loop.scaling.autocast(), self._no_sync(model):
            yield

    @contextlib.contextmanager
    def _no_sync(self, model: nn.Module) -> Iterator[None]:
        if self.is_last or self._loop.world.consistency == "bitwise":
            yield
        elif isinstance(model, DistributedDataParallel | FullyShardedDataParallel):
            with model.no_sync():
                yield
        elif isinstance(model, FSDPModule):  # FSDP2
            model.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)
        else:
            yield

    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate ``loss`` (the mean over this micro-batch) weighted by its share."""
        self._loop.backward(loss, len(self))


class StepBatch:
    """Global step ``step``: all its samples, and this rank's logical shares."""

    def __init__(self, loop: StepLoop, step: int, samples: list[int], shares: list[Share]):
        self._loop = loop
        self.step = step
        self.samples = samples
        self.shares = shares

    def __iter__(self) -> Iterator[Micro]:
        last = len(self.shares) - 1
        for i, share in enumerate(self.shares):
            yield Micro(self._loop, share, is_last=i == last)


@dataclass
class StepParts:
    """What the loop drives: the session's parts other than the world and the model."""

    settings: Settings
    state: ExtraState
    data: DataPosition
    scaling: LossScaling
    checkpoints: CheckpointManager
    recorder: StepRecorder
    control: ControlDir | None
    faults: Faults
    stall_watch: StallWatch

    @classmethod
    def build(
        cls,
        world: World,
        parts: ModelParts,
        settings: Settings,
        *,
        control: ControlDir | None,
        step_log: Path | None,
        faults: Faults,
        stall_watch: StallWatch,
    ) -> StepParts:
        """The parts of one session, wired to each other."""
        state = ExtraState(settings, rank=world.rank, seed=world.seed)
        data = DataPosition(world)
        recorder = StepRecorder(world, parts, step_log=step_log, control=control)
        checkpoints = CheckpointManager(
            world, parts, state=state, data=data, clock=recorder.clock, faults=faults,
            settings=settings,
        )  # fmt: skip
        return cls(
            settings=settings, state=state, data=data, scaling=LossScaling(world),
            checkpoints=checkpoints, recorder=recorder, control=control, faults=faults,
            stall_watch=stall_watch,
        )  # fmt: skip


class StepLoop:
    """Steps from the data position until done or until the world agrees to stop."""

    def __init__(self, world: World, parts: ModelParts, uses: StepParts) -> None:
        self.world = world
        self.parts = parts
        self.uses = uses
        self.scaling = uses.scaling
        self.in_update = False
        self.stop_agreed = False
        self.done = False
        self.sigterm = False
        self._chain = ShareChain(world, parts)
        self._current: StepBatch | None = None
        self._decided: Decisions | None = None
        self._total: int | None = None
        self._save_deferred = False
        self._last_loss = float("nan")
        self._loss_sum = torch.zeros((), dtype=torch.float64)

    def report_exit(self) -> None:
        """Tell the agent how this trainer leaves (nothing without a control folder)."""
        control = self.uses.control
        if control is None:
            return
        control.write_status(
            self.world.local_rank,
            TrainerStatus(
                state="done" if self.done else "stopped",
                step=self.uses.data.step,
                checkpoint_step=self.uses.checkpoints.last_committed_step,
                world_version=self.world.assignment.world_version,
            ),
        )

    def on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        # Only set a flag: the next step boundary checkpoints and leaves.
        self.sigterm = True

    def batches(self, *, total_steps: int | None) -> Iterator[StepBatch]:
        """The global steps (``Session.batches``, after its order and scaler are set); across
        world versions where this trainer moves to the next one in memory (``carry.py``)."""
        self._total = total_steps
        while True:
            if not self._nothing_to_do():
                yield from self._world_steps()
            unsaved, self._save_deferred = self._save_deferred, False
            if self.done or (self.sigterm and not unsaved):
                return
            moved = move_to_next_world(
                self.world, self.parts, self.uses, unsaved=unsaved, leaving=self.sigterm
            )
            if not moved:
                if unsaved:  # the stop's step is committed now (or held by a member that moved)
                    self._report_progress()
                return
            self.stop_agreed = False

    def _nothing_to_do(self) -> bool:
        """Done, or restored at (or past) the step this world is to stop at: before, it
        trained one more step and committed it, so a finished run restarted grew by a step."""
        step, total = self.uses.data.step, self._total
        if total is not None and step >= total:
            self.done = True
            return True
        stop_at = self.world.assignment.stop_at_step
        if stop_at is not None and step >= stop_at:
            self.stop_agreed = True
            return True
        return False

    def _world_steps(self) -> Iterator[StepBatch]:
        """This world's steps, until the world agrees to stop."""
        data = self.uses.data
        self.uses.recorder.start_timing()
        while not self.stop_agreed:
            samples, shares = data.step_samples(data.step)
            self._current = StepBatch(self, data.step, samples, shares)
            self._chain.begin_step()
            self.scaling.begin_step()
            # on the device: a micro-batch's loss is added there, read once per step (_agree)
            self._loss_sum = torch.zeros((), dtype=torch.float64, device=self.world.device)
            yield self._current
            if self._current is not None:
                raise RuntimeError("call session.step(optimizer) once per batch")
            self._finish_step()

    def _finish_step(self) -> None:
        """Checkpoint (if agreed) and report, after the whole loop body of the step.

        Not inside ``step()``: what the script does after it (``scheduler.step()``, counters
        in ``user_state``, random draws) belongs to the step and must be in its checkpoint.
        """
        self.uses.stall_watch.arm()  # a step completed: the interval starts again
        decisions, self._decided = self._decided, None
        if decisions is None:
            return
        if decisions.defer_save:
            self._save_deferred = True
        elif decisions.checkpoint:
            self.uses.checkpoints.save(wait=decisions.stop)
        if decisions.keep:
            kept.keep(self.uses.checkpoints.keep_in_memory())
        self._last_loss = decisions.loss
        self._report_progress()

    def _report_progress(self) -> None:
        """The newest step's progress for the agent, with what checkpoints cost so far."""
        self.uses.recorder.report_progress(
            step=self.uses.data.step,
            loss=self._last_loss,
            checkpoint=self.uses.checkpoints.progress(),
            tokens=self.uses.settings.tokens_per_sample,
        )

    def loss_weight(self, samples: int) -> float:
        return loss_weight(self.world, self.parts.first, samples)

    def add_loss(self, loss: torch.Tensor, samples: int) -> None:
        """Count a micro-batch's mean loss in the step's reported loss (once per replica)."""
        if self.world.mesh.computes_loss:
            g = self.world.assignment.global_batch_size
            self._loss_sum += loss.detach().to(torch.float64) * (samples / g)  # no host sync

    def backward(self, loss: torch.Tensor, samples: int) -> None:
        """A micro-batch's backward: weighted, scaled, outside autocast; its loss counted."""
        weighted = loss * self.loss_weight(samples)
        with torch.autocast(self.world.device.type, enabled=False):  # backward outside autocast
            torch.autograd.backward(self.scaling.scale(weighted))
        self.add_loss(loss, samples)
        if self.world.consistency == "bitwise":
            self._chain.keep(loss, samples)

    def step(self, optimizers: list[torch.optim.Optimizer]) -> dict[str, Any]:
        """Finish the current global step (``Session.step``); the step's record."""
        batch = self._current
        if batch is None:
            raise RuntimeError("session.step() outside a batch from session.batches()")
        self.parts.optimizers = optimizers
        self.uses.faults.at_step(batch.step)
        known_loss = reduce_gradients(self.world, self.parts, self._chain)
        self._update()
        self.uses.data.step = batch.step + 1
        self._current = None
        decisions = self._agree(known_loss)
        record = self.uses.recorder.record(batch.step, batch.samples, decisions.loss)
        self._decided = decisions  # acted on by batches() once the loop body is through
        if decisions.stop:
            self.stop_agreed = True
            self.done = decisions.done
        return record

    def _update(self) -> None:
        """Unscale (GradScaler), run ``before_update``, step the optimizers, clear gradients."""
        optimizers = self.parts.optimizers
        self.in_update = True
        try:
            self.scaling.unscale(optimizers)
            hook = self.uses.settings.before_update
            if hook is not None:
                hook(self.parts.params())
        finally:
            self.in_update = False
        self.scaling.step(optimizers)

    def _agree(self, known_loss: float | None) -> Decisions:
        """One all-reduce carries the loss and every vote, so all ranks decide alike."""
        control, ckpt = self.uses.control, self.uses.checkpoints
        a, step = self.world.assignment, self.uses.data.step
        asked = control is not None and control.stop_requested(a.world_version)
        local_stop = self.sigterm or asked
        interval = a.checkpoint.interval_seconds
        due = (
            self.world.rank == 0
            and interval > 0
            and time.monotonic() - ckpt.last_save_time >= interval
        )
        at_stop_step = a.stop_at_step is not None and step >= a.stop_at_step
        rerun_next = may_rerun(self.world, control, asked=asked, at_stop_step=at_stop_step)
        votes = torch.tensor(
            [float(self._loss_sum), 1.0 if local_stop else 0.0, 1.0 if due else 0.0,
             1.0 if rerun_next else 0.0, 1.0 if self.sigterm else 0.0],
            dtype=torch.float64,
        )  # fmt: skip
        dist.all_reduce(votes, group=self.world.group)
        done = self._total is not None and step >= self._total
        stop = bool(votes[1] > 0) or done or at_stop_step
        every = a.checkpoint.interval_steps
        keep = stop and not done and bool(votes[3] > 0)
        return Decisions(
            loss=float(votes[0]) if known_loss is None else known_loss,
            stop=stop,
            done=done,
            checkpoint=stop or bool(votes[2] > 0) or (every > 0 and step % every == 0),
            keep=keep,
            defer_save=stop and not done and not keep and bool(votes[4] == 0) and self._may_defer(),
        )

    def _may_defer(self) -> bool:
        """Whether a stop of this world may leave its save until the next world is known
        (``Decisions.defer_save``): an agent that may offer it (a control folder) and saves
        that may run in the background (``checkpoint.asynchronous``), the same on every rank."""
        return self.uses.control is not None and self.uses.settings.async_checkpoint
