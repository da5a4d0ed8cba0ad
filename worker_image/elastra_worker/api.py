"""The training-script API: what a user's training loop calls to be elastic.

A script that uses it survives resizes: it restores model, optimizer and data position resharded
to whatever world it is started in, trains on this rank's share of each global batch, and
checkpoints on an interval (in the background unless ``checkpoint.asynchronous`` is false), on
a stop request and on SIGTERM (blocking until committed)::

    from elastra_worker import Session

    with Session.from_env() as sess:                     # joins this world version's rendezvous
        torch.manual_seed(sess.seed)
        model = sess.prepare(Net().to(sess.device))      # DDP on GPUs (or yours), bare on CPU
        opt = torch.optim.AdamW(model.parameters())
        sess.restore(model, opt)                         # newest good checkpoint, resharded
        for batch in sess.batches(dataset_size=len(ds), total_steps=1000):
            for micro in batch:                          # this rank's logical shares, in order
                with micro.sync(model):                  # no grad all-reduce until the last one
                    x, y = ds.get(micro.samples)
                    micro.backward(loss_fn(model(x), y)) # loss = mean over the micro-batch
            sess.step(opt)                               # reduce, step, log, checkpoint, stop

Gradient weighting is done here, not in the script: ``micro.backward`` scales the micro-batch's
mean loss by its share of the global batch, so uneven shares (heterogeneous GPUs) give the same
gradient as one big batch. In ``bitwise`` mode each logical share's gradient is kept apart and
the shares are summed in share order by a chain through the ranks (rank r adds its shares to the
partial sum of ranks < r), so the sum is the same float computation at every world size.

The job's ``training.precision`` is applied here too (``precision.py``): ``micro.sync`` runs the
forward under autocast (bf16 or fp16), a sharded ``prepare`` gathers FSDP parameters in that
dtype and reduces gradients in fp32, and fp16 gets a GradScaler of the session's own
(checkpointed) unless the script registers one. Parameters and optimizer state stay fp32.

The step loop agrees on every decision (stop, checkpoint) with one small all-reduce per step, so
all ranks stop at the same step even though each pod sees the new assignment at its own time.
The checkpoint is taken when the loop body returns to ``batches()``, after whatever the script
does following ``sess.step`` (a ``scheduler.step()``), so that is part of the step.

Beyond model, optimizer and data position, a checkpoint holds every object registered with
``sess.register(name, obj)`` (LR scheduler, ``torch.amp.GradScaler``, your own), the plain
values in ``sess.user_state``, and each rank's RNG state (a rank the saving world lacked
reseeds from seed, rank and step). ``sess.before_update`` runs between the gradient reduction
and ``optimizer.step()`` (``sess.clip_grad_norm`` clips there under any plan);
``sess.sampler()``/``sess.loader()`` feed a ``torch.utils.data`` pipeline the same samples as
``batches()``::

    sess.register("sched", sched)
    sess.before_update = lambda params: sess.clip_grad_norm(1.0)
    sess.restore(model, opt)
    for batch, micro_batches in zip(sess.batches(dataset_size=len(ds)), sess.loader(ds)):
        for micro, (x, y) in zip(batch, micro_batches):
            ...
        sess.step(opt)
        sched.step()

The Session is a facade over the parts in ``session/`` (world, model preparation, checkpoint
manager, data position, step loop), split the way PyTorch's large-model trainers split theirs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, TypeVar, cast, overload

import torch
from torch import nn
from torch.utils.data import Dataset

from .assignment import (
    ASSIGNMENT_JSON_ENV,
    Assignment,
    Consistency,
    ParallelPlan,
    Precision,
    RankCoord,
)
from .control import ControlDir
from .errors import install_hook
from .faults import Faults
from .layout import Manifest
from .lifeline import arm_from_env
from .mesh import Mesh
from .sampling import StepLoader, StepSampler
from .session.checkpoints import WAITED_WARN_S
from .session.gradients import clip_grad_norm
from .session.loop import Decisions, Micro, StepBatch, StepLoop, StepParts
from .session.model import ModelParts, Models, Optimizers, Parallelize, as_list, prepare_model
from .session.state import SCALER_NAME, BeforeUpdate, Stateful
from .session.world import COLLECTIVE_TIMEOUT_S, STEP_LOG_ENV, World, arguments_from_env
from .stalls import StallWatch

__all__ = [
    "ASSIGNMENT_JSON_ENV",
    "SCALER_NAME",
    "STEP_LOG_ENV",
    "WAITED_WARN_S",
    "BeforeUpdate",
    "Decisions",
    "Micro",
    "Models",
    "Optimizers",
    "Session",
    "Stateful",
    "StepBatch",
]

log = logging.getLogger(__name__)


T = TypeVar("T")


class _FromWorld(Generic[T]):
    """A ``Session`` attribute read from its ``World`` on every access: a trainer that moves to
    the next world version in its own process (``session/carry.py``) gets a new rank, size and
    plan, and the script sees them."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> _FromWorld[T]: ...

    @overload
    def __get__(self, obj: Session, objtype: type | None = None) -> T: ...

    def __get__(self, obj: Session | None, objtype: type | None = None) -> T | _FromWorld[T]:
        if obj is None:
            return self
        return cast(T, getattr(obj._world, self._name))


class Session:
    """This trainer's membership in one world version (see the module docstring)."""

    def __init__(
        self,
        assignment: Assignment,
        *,
        local_rank: int = 0,
        control: ControlDir | None = None,
        step_log: Path | None = None,
        faults: Faults | None = None,
        async_checkpoint: bool | None = None,
        rendezvous_timeout_s: float = 300.0,
        collective_timeout_s: float = COLLECTIVE_TIMEOUT_S,
        device: torch.device | None = None,
        stall_watch: StallWatch | None = None,
    ) -> None:
        install_hook()  # an uncaught PermanentError ends this trainer as a permanent failure
        world = World(
            assignment,
            local_rank=local_rank,
            device=device,
            rendezvous_timeout_s=rendezvous_timeout_s,
            collective_timeout_s=collective_timeout_s,
        )
        self._world = world
        self.device = world.device
        self.control, self.step_log, self.faults = control, step_log, faults or Faults()
        self.stall_watch = stall_watch or StallWatch()
        """Writes every thread's stack to stderr when no step completes for its interval."""
        self.async_checkpoint = (
            assignment.checkpoint.asynchronous if async_checkpoint is None else async_checkpoint
        )
        """Periodic saves staged to host memory and written in the background (default: the
        job's ``checkpoint.asynchronous``); the save before a stop always blocks until committed.
        """
        self.user_state: dict[str, Any] = {}
        """Plain values of yours (counters, flags): checkpointed and restored with the model."""
        self.tokens_per_sample: int | None = None
        """Set it (or pass ``batches(tokens_per_sample=...)``) to report tokens per second."""
        self.before_update: BeforeUpdate | None = None
        """Called with the parameters between the gradient reduction and ``optimizer.step()``,
        where the gradients are complete (reduced, unscaled): the place for clipping
        (``sess.before_update = lambda params: sess.clip_grad_norm(1.0)``) and gradient logs."""
        self._parts = ModelParts()
        uses = StepParts.build(
            world, self._parts, self, control=control, step_log=step_log, faults=self.faults,
            stall_watch=self.stall_watch,
        )  # fmt: skip
        self._loop = StepLoop(world, self._parts, uses)
        self._state, self._data, self._scaling = uses.state, uses.data, uses.scaling
        self._recorder, self._checkpoints = uses.recorder, uses.checkpoints
        self._restored: Manifest | None = None
        self._prev_sigterm: Any = None

    # ---- this rank's place in the world (a survivor of a resize moves to the new one) --------

    assignment: _FromWorld[Assignment] = _FromWorld()
    local_rank: _FromWorld[int] = _FromWorld()
    rank: _FromWorld[int] = _FromWorld()
    world_size: _FromWorld[int] = _FromWorld()
    seed: _FromWorld[int] = _FromWorld()
    consistency: _FromWorld[Consistency] = _FromWorld()
    plan: _FromWorld[ParallelPlan] = _FromWorld()
    coord: _FromWorld[RankCoord] = _FromWorld()
    dp_rank: _FromWorld[int] = _FromWorld()
    precision: _FromWorld[Precision] = _FromWorld()
    """``training.precision``: what forward and backward compute in (``precision.py``)."""

    # ---- construction ---------------------------------------------------------------------

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **kwargs: Any) -> Session:
        """Build a session from what the agent (or torchrun, or nothing) put in the environment.

        The agent sets ``ELASTRA_ASSIGNMENT_JSON`` (the pod's assignment), ``LOCAL_RANK`` and
        ``ELASTRA_CONTROL_DIR``; without it torchrun-style ``RANK``/``WORLD_SIZE``/``MASTER_*``
        are used, and with nothing at all the script runs as a world of one.
        """
        assignment, args = arguments_from_env(dict(os.environ if environ is None else environ))
        return cls(assignment, **{**args, **kwargs})

    def __enter__(self) -> Session:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(failed=exc_type is not None)

    def start(self) -> None:
        """Join this world version's rendezvous (a fresh store namespace per version) and open
        the job's checkpoint root: an unusable one raises ``PermanentError``, storage out of
        reach ``RetryableError`` (``errors.py``; uncaught, they end the trainer with exit 2 or
        75 and one line)."""
        arm_from_env()  # started by an agent: die with it
        self.stall_watch.arm()  # a rendezvous that never completes shows where it waits
        self._prev_sigterm = signal.signal(signal.SIGTERM, self._loop.on_sigterm)
        self._world.join()
        self._checkpoints.open()
        log.info("%s", self._world.describe())

    def close(self, *, failed: bool = False) -> None:
        """Leave the world: finish an async save, report how we left, destroy the groups."""
        if self._checkpoints.opened and not failed:
            self._checkpoints.wait()
        if not failed:
            self._loop.report_exit()
        self._world.leave()
        self.stall_watch.disarm()
        if self._prev_sigterm is not None:
            signal.signal(signal.SIGTERM, self._prev_sigterm)
            self._prev_sigterm = None

    def on_before_update(self, fn: BeforeUpdate) -> BeforeUpdate:
        """Set the ``before_update`` hook (usable as a decorator); see that attribute."""
        self.before_update = fn
        return fn

    # ---- model, precision, registered state, restore ----------------------------------------

    @property
    def mesh(self) -> Mesh:
        """This rank's device mesh and coordinates (after ``start``)."""
        return self._world.mesh

    def prepare(
        self,
        model: nn.Module,
        *,
        blocks: str | None = None,
        parallelize: Parallelize | None = None,
    ) -> nn.Module:
        """Wrap ``model`` for this consistency mode and plan (``session/model.py`` says how).

        ``none``/``data``: DDP for a bare module on GPUs (rebuilt over the next world when the
        trainer moves there in memory), bare on CPU (the session reducing its gradients;
        ``ELASTRA_CPU_DDP=1``: DDP), FSDP2 when the plan shards; ``bitwise``: bare.
        A tensor-parallel plan first splits the model by ``parallelize(model, tp_mesh)`` (your
        own split) or the known Llama block layout. ``blocks`` names the module holding the
        blocks where ``parallel.blocks.find_blocks`` would not find them. The plan's
        ``recompute`` mode is applied to the blocks after tensor parallelism
        (``parallel.recompute.apply_recompute_or_full``). A pipeline plan needs stages:
        ``elastra_worker.parallel_model.prepare_parallel`` cuts your model at module paths,
        ``build_parallel`` builds them from a ``ModelRecipe``; both call ``adopt``.
        """
        self._checkpoints.wait_for_members()
        model = prepare_model(self._world, model, blocks=blocks, parallelize=parallelize)
        self._parts.adopt([model])
        return model

    def adopt(self, parts: Sequence[nn.Module]) -> None:
        """Register modules already parallelized for this plan (one per pipeline stage held)."""
        self._checkpoints.wait_for_members()
        self._parts.adopt(parts)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The job's precision for a forward and its loss (``torch.autocast`` to bf16 or fp16,
        nothing at fp32): ``micro.sync`` enters it; wrap a forward elsewhere (an evaluation)."""
        return self._scaling.autocast()

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` as backward must see it: times the GradScaler's scale (fp16), else as is;
        for a loop that runs backward itself (``micro.backward`` calls it)."""
        return self._scaling.scale(loss)

    @property
    def grad_scaler(self) -> torch.amp.GradScaler | None:
        """The loss scaler in use: the registered one, an fp16 job's own (after ``restore``)."""
        return self._scaling.scaler

    def _ensure_scaler(self) -> None:
        """fp16 without a registered GradScaler: the session's own, checkpointed as others."""
        if (own := self._scaling.own_scaler()) is not None:
            self._state.objects[SCALER_NAME] = own

    def register(self, name: str, obj: Stateful) -> None:
        """Checkpoint ``obj`` (``state_dict``/``load_state_dict``) with the model under ``name``.

        An LR scheduler, a ``torch.amp.GradScaler`` or an object of yours, the same on every
        rank (rank 0's is saved); register before ``restore()``, which loads it. A registered
        GradScaler is the one the step uses (``session/scaling.py``); an fp16 job that
        registers none gets its own, checkpointed as ``SCALER_NAME``.
        """
        self._state.register(name, obj)
        if isinstance(obj, torch.amp.GradScaler):
            self._scaling.scaler = obj

    def clip_grad_norm(self, max_norm: float, norm_type: float = 2.0) -> float:
        """Clip the gradients to a total norm of ``max_norm``; return the norm before clipping.

        Call it from ``before_update``. The norm is over the whole model whatever the plan
        (DTensor gradients over their mesh, pipeline stages over ``pp``), so every rank scales
        by the same factor, which ``torch.nn.utils.clip_grad_norm_`` on a shard would not do.
        """
        if not self._loop.in_update:
            raise RuntimeError("clip_grad_norm() runs inside the before_update hook")
        return clip_grad_norm(self._world, self._parts.params(), max_norm, norm_type)

    def restore(self, model: Models, optimizer: Optimizers) -> int:
        """Load the newest good checkpoint into ``model``/``optimizer``; return the next step.

        Collective; lists for pipeline stages (one optimizer per module). 0, and nothing
        loaded, when the job has no checkpoint yet. Any plan loads any other plan's checkpoint.
        """
        self._parts.bind(model, optimizer)
        self._ensure_scaler()
        self._state.restored = True
        self._checkpoints.wait_for_members()
        self._restored = self._checkpoints.restore()
        start = 0 if self._restored is None else self._restored.step
        self._data.restored_at(start)
        self._recorder.restored(start)
        return start

    # ---- data and the step loop ---------------------------------------------------------------

    def batches(
        self,
        *,
        dataset_size: int,
        total_steps: int | None = None,
        tokens_per_sample: int | None = None,
    ) -> Iterator[StepBatch]:
        """Global steps from the restored one until done or until the world agrees to stop.

        ``tokens_per_sample`` (sequence length) adds tokens per second to the metrics.
        """
        if tokens_per_sample is not None:
            self.tokens_per_sample = tokens_per_sample
        self._data.begin(dataset_size, self._restored)
        self._ensure_scaler()
        yield from self._loop.batches(total_steps=total_steps)

    def sampler(
        self,
        *,
        dataset_size: int,
        total_steps: int | None = None,
        start_step: int | None = None,
    ) -> StepSampler:
        """A ``Sampler[int]``: this data-parallel rank's samples of every step, in order, from
        the restored step (``restore()`` first) or ``start_step``: exactly what ``batches()``
        gives this rank, so a ``DataLoader(ds, batch_size=micro_batch_size, sampler=...)``
        reads the job's order at any world size."""
        return self._data.sampler(dataset_size, total_steps, start_step)

    def loader(
        self,
        dataset: Dataset[Any],
        *,
        total_steps: int | None = None,
        dataset_size: int | None = None,
        start_step: int | None = None,
        **dataloader_kwargs: Any,
    ) -> StepLoader:
        """A DataLoader over ``dataset`` that yields, per step, this rank's collated micro-batches.

        Iterate it in lockstep with ``batches()`` (same ``total_steps``; the module docstring
        shows how). Keyword arguments go to ``DataLoader`` (not ``batch_size``/``sampler``/
        ``shuffle``: the order is the job's). Its workers obey SIGTERM and die with the trainer.
        """
        size = len(dataset) if dataset_size is None else dataset_size  # type: ignore[arg-type]
        return self._data.loader(
            dataset, size, total_steps=total_steps, start=start_step,
            dataloader_kwargs=dataloader_kwargs,
        )  # fmt: skip

    def loss_weight(self, samples: int) -> float:
        """The factor for a loss that is the mean over ``samples`` sequences of this step: after
        the wrapper's reduction every replica's gradient counts by its share of the global
        batch (``session/gradients.py``), so uneven shares give one big batch's gradient."""
        return self._loop.loss_weight(samples)

    def add_loss(self, loss: torch.Tensor, samples: int) -> None:
        """Count a micro-batch's mean loss in the step's reported loss (once per replica)."""
        self._loop.add_loss(loss, samples)

    def step(self, optimizer: Optimizers) -> dict[str, Any]:
        """Finish the current global step: reduce, update, log, maybe checkpoint or stop.

        ``optimizer`` may be a list (one per pipeline stage module). Returns the step record
        (``step``, ``loss``, ``worldSize``, ``plan`` ...). An agreed checkpoint is taken when
        the loop body returns to ``batches()``, so what follows this call is in it.
        """
        return self._loop.step(as_list(optimizer))

    @property
    def step_count(self) -> int:
        """Optimizer steps completed so far (the data position)."""
        return self._data.step

    @property
    def stopping(self) -> bool:
        """True once the world agreed to stop; ``batches()`` yields no more steps."""
        return self._loop.stop_agreed

    # ---- checkpoints ------------------------------------------------------------------------

    def save_checkpoint(self, *, wait: bool = True) -> None:
        """Checkpoint the current step now (collective); a no-op if it is already committed.

        ``wait=False`` (a periodic save) under ``async_checkpoint`` returns once the state is
        copied to host memory and leaves writing and committing to a background thread. Either
        way a save still in flight is finished first: one save at a time, in step order.
        """
        self._checkpoints.save(wait=wait)

    def wait_for_checkpoint(self) -> int | None:
        """Block until a background save in flight is committed (re-raising its error); the
        newest committed step. Not needed before leaving: the session waits for it then."""
        return self._checkpoints.wait()

    def params_sha256(self) -> str | None:
        """sha256 over the model state dict (parameters, persistent buffers) in key order;
        collective when sharded (rank 0's value counts); ``None`` with a pipeline."""
        return self._recorder.params_sha256()
