"""The training-script API: what a user's training loop calls to be elastic.

A script that uses it survives resizes: it restores model, optimizer and data position resharded
to whatever world it is started in, trains on this rank's share of each global batch, and
checkpoints on an interval (in the background unless ``checkpoint.asynchronous`` is false), on
a stop request and on SIGTERM (blocking until committed)::

    from elastra_worker import Session

    with Session.from_env() as sess:                     # joins this world version's rendezvous
        torch.manual_seed(sess.seed)
        model = sess.prepare(Net().to(sess.device))      # DDP (or yours: DDP/FSDP), bitwise: bare
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
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import math
import os
import random
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset

from .assignment import Assignment, assignment_from_env, parse_assignment
from .checkpoint import Checkpointer
from .control import CONTROL_DIR_ENV, ControlDir, TrainerStatus
from .dataorder import DataOrder, Share, rank_shares
from .devices import GpuCheckError, trainer_device
from .downtime import ResizeClock
from .errors import PermanentError, install_hook
from .exitcodes import RETRYABLE
from .faults import Faults
from .layout import (
    CheckpointError,
    CheckpointRoot,
    CheckpointStore,
    Manifest,
    UnusableRootError,
)
from .lifeline import arm_from_env
from .mesh import Mesh, build_mesh, needs_mesh
from .objectstore import ObjectCheckpointRoot
from .precision import apply_tf32, autocast, grad_scaler
from .sampling import RankSlice, StepLoader, StepSampler
from .stalls import StallWatch

log = logging.getLogger(__name__)

ASSIGNMENT_JSON_ENV = "ELASTRA_ASSIGNMENT_JSON"
STEP_LOG_ENV = "ELASTRA_STEP_LOG"
WAITED_WARN_S = 1.0
"""A periodic save that waited this long for the previous background save says so (warning)."""


Optimizers = torch.optim.Optimizer | Sequence[torch.optim.Optimizer]
Models = nn.Module | Sequence[nn.Module]
BeforeUpdate = Callable[[list[nn.Parameter]], None]

# Checkpoint keys besides "model", "optim" and "data". Each value is one pickled blob (DCP keeps a
# non-tensor value as bytes), so any state_dict structure round-trips; RNG state is per rank.
_OBJECT_KEY = "objects/"
_USER_STATE_KEY = "user_state"
_RNG_KEY = "rng/rank{}"
SCALER_NAME = "gradScaler"
"""The name an fp16 job's loss scaler is checkpointed under (when the script registers none)."""


class Stateful(Protocol):
    """What ``Session.register`` takes: an LR scheduler, a GradScaler, any object of yours."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any], /) -> Any: ...


# Optimizer state keyed by parameter name ("state.<fqn>.exp_avg"), so it reshards between any
# two plans and the state of several pipeline stage modules merges without clashes.
_FLAT_OPTIM = StateDictOptions(flatten_optimizer_state_dict=True)


def _is_fsdp(model: nn.Module) -> bool:
    return isinstance(model, FSDPModule | FullyShardedDataParallel)


def _as_list(obj: Any) -> list[Any]:
    return list(obj) if isinstance(obj, Sequence) else [obj]


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds (a DTensor's local shard)."""
    return t.to_local() if isinstance(t, DTensor) else t


@dataclass(frozen=True)
class Decisions:
    """What the whole world agreed on at the end of a step (one all-reduce)."""

    loss: float
    stop: bool
    done: bool
    checkpoint: bool


def _averaging_wrapper(model: nn.Module) -> bool:
    """DDP and FSDP average gradients over the world; a bare module needs an explicit sum."""
    return isinstance(model, DistributedDataParallel) or _is_fsdp(model)


class Micro:
    """One logical share (micro-batch) of this rank's part of a step."""

    def __init__(self, session: Session, share: Share, *, is_last: bool) -> None:
        self._session = session
        self.index = share.index
        self.samples: tuple[int, ...] = share.samples
        self.is_last = is_last

    def __len__(self) -> int:
        return len(self.samples)

    @contextlib.contextmanager
    def sync(self, model: nn.Module) -> Iterator[None]:
        """Wrap forward and backward: the job's precision (``Session.autocast``) for the
        forward, and no gradient sync by the wrapper on all but the last micro-batch."""
        with self._session.autocast(), self._no_sync(model):
            yield

    @contextlib.contextmanager
    def _no_sync(self, model: nn.Module) -> Iterator[None]:
        if self.is_last or self._session.consistency == "bitwise":
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
        self._session._backward(self, loss)


class StepBatch:
    """Global step ``step``: all its samples, and this rank's logical shares."""

    def __init__(self, session: Session, step: int, samples: list[int], shares: list[Share]):
        self._session = session
        self.step = step
        self.samples = samples
        self.shares = shares

    def __iter__(self) -> Iterator[Micro]:
        last = len(self.shares) - 1
        for i, share in enumerate(self.shares):
            yield Micro(self._session, share, is_last=i == last)


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
        collective_timeout_s: float = 600.0,
        device: torch.device | None = None,
        stall_watch: StallWatch | None = None,
    ) -> None:
        install_hook()  # an uncaught PermanentError ends this trainer as a permanent failure
        self.assignment = assignment
        self.local_rank = local_rank
        self.rank = assignment.rank + local_rank
        self.world_size = assignment.world_size
        self.consistency = assignment.consistency
        self.seed = assignment.seed
        self.plan = assignment.plan
        self.coord = self.plan.coord(self.rank)
        self.dp_rank = self.coord.dp_rank
        if self.consistency == "bitwise" and needs_mesh(self.plan):
            raise PermanentError(
                f"consistency bitwise is data parallel only (plan {self.plan.label}, sharding "
                f"{self.plan.sharding}): use consistency data for tensor, pipeline or sharded plans"
            )
        self.precision = assignment.precision
        """``training.precision``: what forward and backward compute in (``precision.py``)."""
        if device is None:
            try:
                device = trainer_device(assignment.gpus, local_rank)
            except GpuCheckError as err:  # a GPU pod that cannot see its GPUs: never on CPU
                raise PermanentError(str(err)) from None
        self.device = device
        self.control = control
        self.step_log = step_log
        self.faults = faults or Faults()
        self.async_checkpoint = (
            assignment.checkpoint.asynchronous if async_checkpoint is None else async_checkpoint
        )
        """Periodic saves staged to host memory and written in the background (default: the
        job's ``checkpoint.asynchronous``); the save before a stop always blocks until committed.
        """
        self._rdzv_timeout = rendezvous_timeout_s
        self._coll_timeout = collective_timeout_s
        self.stall_watch = stall_watch or StallWatch()
        """Writes every thread's stack to stderr when no step completes for its interval."""
        self._group: dist.ProcessGroup | None = None
        self._async_group: dist.ProcessGroup | None = None
        self._parts: list[nn.Module] = []
        self._optimizers: list[torch.optim.Optimizer] = []
        self._mesh: Mesh | None = None
        self._checkpointer: Checkpointer | None = None
        self._start_step = 0
        self._step = 0  # optimizer steps completed
        self._current: StepBatch | None = None
        self._share_grads: list[torch.Tensor] = []
        self._loss_sum = torch.zeros((), dtype=torch.float64)
        self._stop_agreed = False
        self._done = False
        self._sigterm = False
        self._last_ckpt_time = time.monotonic()
        self._step_time = time.monotonic()
        self._samples_per_s = 0.0
        self._restored_manifest: Manifest | None = None
        self._clock = ResizeClock(self.assignment.world_version)
        self._order: DataOrder | None = None
        self._prev_sigterm: Any = None
        self._objects: dict[str, Stateful] = {}
        self._scaler: torch.amp.GradScaler | None = None
        self._scaled = False  # the step's backward went through the scaler
        self._restore_called = False
        self._in_update = False
        self._decided: Decisions | None = None
        self._step_seconds = 0.0
        self.user_state: dict[str, Any] = {}
        """Plain values of yours (counters, flags): checkpointed and restored with the model."""
        self.tokens_per_sample: int | None = None
        """Set it (or pass ``batches(tokens_per_sample=...)``) to report tokens per second."""
        self.before_update: BeforeUpdate | None = None
        """Called with the parameters between the gradient reduction and ``optimizer.step()``.

        The gradients are complete there (reduced over the replicas, unscaled by a registered
        GradScaler), so it is the place for clipping and gradient logging::

            sess.before_update = lambda params: torch.nn.utils.clip_grad_norm_(params, 1.0)
            sess.before_update = lambda params: sess.clip_grad_norm(1.0)  # any plan, pp too
        """

    # ---- construction ---------------------------------------------------------------------

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **kwargs: Any) -> Session:
        """Build a session from what the agent (or torchrun, or nothing) put in the environment.

        The agent sets ``ELASTRA_ASSIGNMENT_JSON`` (the pod's assignment), ``LOCAL_RANK`` and
        ``ELASTRA_CONTROL_DIR``; without it torchrun-style ``RANK``/``WORLD_SIZE``/``MASTER_*``
        are used, and with nothing at all the script runs as a world of one.
        """
        env = dict(os.environ if environ is None else environ)
        raw = env.get(ASSIGNMENT_JSON_ENV)
        assignment = parse_assignment(raw) if raw else assignment_from_env(env)
        control = ControlDir(env[CONTROL_DIR_ENV]) if env.get(CONTROL_DIR_ENV) else None
        step_log = Path(env[STEP_LOG_ENV]) if env.get(STEP_LOG_ENV) else None
        if env.get("ELASTRA_RENDEZVOUS_TIMEOUT"):
            kwargs.setdefault("rendezvous_timeout_s", float(env["ELASTRA_RENDEZVOUS_TIMEOUT"]))
        if env.get("ELASTRA_COLLECTIVE_TIMEOUT"):
            kwargs.setdefault("collective_timeout_s", float(env["ELASTRA_COLLECTIVE_TIMEOUT"]))
        kwargs.setdefault("stall_watch", StallWatch.from_env(env))
        return cls(
            assignment,
            local_rank=int(env.get("LOCAL_RANK", "0")),
            control=control,
            step_log=step_log,
            faults=Faults.from_env(env),
            **kwargs,
        )

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
        """Join this world version's rendezvous (a fresh store namespace per version)."""
        arm_from_env()  # started by an agent: die with it
        self.stall_watch.arm()  # a rendezvous that never completes shows where it waits
        threads = os.environ.get("ELASTRA_THREADS")
        if threads:
            torch.set_num_threads(int(threads))
        elif self.consistency == "bitwise":
            torch.set_num_threads(1)  # the same intra-op split in every world
        try:
            apply_tf32()
        except ValueError as err:
            raise PermanentError(str(err)) from None
        self._prev_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
        a = self.assignment
        store = dist.TCPStore(  # type: ignore[attr-defined]  # exported, not declared
            a.master_addr,
            a.master_port,
            self.world_size,
            is_master=self.rank == 0,
            timeout=timedelta(seconds=self._rdzv_timeout),
            wait_for_workers=False,
        )
        namespace = f"elastra/{a.job}/v{a.world_version}/"  # a fresh namespace per version
        prefixed = dist.PrefixStore(namespace, store)  # type: ignore[attr-defined]
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        dist.init_process_group(
            backend,
            store=prefixed,
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=self._coll_timeout),
        )
        # Coordination (votes, checkpoint metadata) always runs on gloo, also next to nccl.
        self._group = self._gloo_group() if backend != "gloo" else None
        self._mesh = build_mesh(self.plan, self.rank, self.device)
        if self.async_checkpoint:
            self._async_group = self._gloo_group()
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
            log.error("%s", err)
            raise SystemExit(RETRYABLE) from None
        self._checkpointer = Checkpointer(
            root,
            group=self._group,
            world_version=a.world_version,
            keep=a.checkpoint.keep,
            thread_count=int(os.environ.get("ELASTRA_CHECKPOINT_THREADS", "4")),
            after_write=self.faults.in_save,
        )
        log.info(
            "rank %d/%d joined world version %d (%s, plan %s, consistency %s, precision %s)",
            self.rank,
            self.world_size,
            a.world_version,
            backend,
            self.plan.label,
            self.consistency,
            self.precision,
        )

    def _gloo_group(self) -> dist.ProcessGroup:
        group = dist.new_group(backend="gloo", timeout=timedelta(seconds=self._coll_timeout))
        if not isinstance(group, dist.ProcessGroup):
            raise RuntimeError("this rank is not in its own world's gloo group")
        return group

    def close(self, *, failed: bool = False) -> None:
        """Leave the world: finish an async save, report how we left, destroy the groups."""
        if self._checkpointer is not None and not failed:
            self._checkpointer.wait()
        if not failed and self.control is not None:
            ckpt = self._checkpointer.last_committed_step if self._checkpointer else None
            self.control.write_status(
                self.local_rank,
                TrainerStatus(
                    state="done" if self._done else "stopped",
                    step=self._step,
                    checkpoint_step=ckpt,
                    world_version=self.assignment.world_version,
                ),
            )
        if dist.is_initialized():
            dist.destroy_process_group()
        self.stall_watch.disarm()
        if self._prev_sigterm is not None:
            signal.signal(signal.SIGTERM, self._prev_sigterm)
            self._prev_sigterm = None

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        # Only set a flag: the next step boundary checkpoints and leaves.
        self._sigterm = True

    # ---- model, optimizer, restore ----------------------------------------------------------

    @property
    def mesh(self) -> Mesh:
        """This rank's device mesh and coordinates (after ``start``)."""
        if self._mesh is None:
            raise RuntimeError("session not started: use `with Session.from_env() as sess:`")
        return self._mesh

    def prepare(
        self,
        model: nn.Module,
        *,
        blocks: str | None = None,
        parallelize: Callable[[nn.Module, DeviceMesh], None] | None = None,
    ) -> nn.Module:
        """Wrap ``model`` for this consistency mode and plan.

        ``none``/``data``: a bare module is wrapped in DDP; DDP or FSDP modules are kept.
        ``bitwise``: the module stays bare (every rank holds a full replica); the session
        reduces gradients itself in share order. FSDP cannot be bitwise (its reduce-scatter
        order depends on the world size).

        A tensor-parallel plan splits the model in place first, over the plan's
        tensor-parallel group: by ``parallelize(model, tp_mesh)`` when given (your own split,
        in the style of PyTorch's large-model trainers: ``parallelize_module`` with the styles
        your layers need), else by the one known block layout (``parallel.known_tp``: the Llama
        family as Hugging Face lays it out). Sharding (FSDP over the data-parallel group)
        comes after; without sharding the session sums gradients over the replicas itself.
        A pipeline plan needs to know where to cut the model: build it with
        ``elastra_worker.parallel_model`` (the reference model, or yours through a
        ``ModelRecipe``), which calls ``adopt``.

        ``blocks`` names the module holding the model's blocks (FSDP's units, the blocks the
        known split applies to) where ``parallel.blocks.find_blocks`` would not find them; a
        wrong path fails under any plan.
        """
        if blocks is not None:
            from .parallel.blocks import find_blocks  # noqa: PLC0415 - as apply_fsdp below

            find_blocks(model, blocks)
        self._check_preparable(model)
        if self.plan.tp > 1:
            self._split_tensor_parallel(model, blocks=blocks, parallelize=parallelize)
        if self.consistency != "bitwise":
            model = self._data_parallel(model, blocks=blocks)
        self._parts = [model]
        return model

    def _check_preparable(self, model: nn.Module) -> None:
        """Refuse a plan or module ``prepare`` cannot take, naming what would work."""
        if self.plan.pp > 1:
            raise PermanentError(
                f"plan {self.plan.label}: prepare() cannot cut a model into pipeline stages; "
                "pipeline parallel plans need a ModelRecipe "
                "(elastra_worker.parallel_model.build_parallel)"
            )
        if self.consistency == "bitwise" and (_averaging_wrapper(model) or self.plan.tp > 1):
            raise PermanentError(
                f"plan {self.plan.label}: consistency bitwise needs a bare module and a data "
                "parallel plan, not DDP/FSDP or tensor parallelism"
            )

    def _split_tensor_parallel(
        self,
        model: nn.Module,
        *,
        blocks: str | None,
        parallelize: Callable[[nn.Module, DeviceMesh], None] | None,
    ) -> None:
        """Split ``model`` in place over the tensor-parallel group (see ``prepare``)."""
        if _averaging_wrapper(model):
            raise PermanentError(
                f"plan {self.plan.label} is tensor parallel: pass prepare() the bare module, "
                "not DDP/FSDP (tensor parallelism is applied before data parallelism)"
            )
        tp_mesh = self.mesh.sub("tp")
        if parallelize is not None:
            parallelize(model, tp_mesh)
            return
        from .parallel.known_tp import apply_known_tensor_parallel  # noqa: PLC0415 - tp plans

        apply_known_tensor_parallel(model, tp_mesh, blocks=blocks)

    def _data_parallel(self, model: nn.Module, *, blocks: str | None) -> nn.Module:
        """FSDP for a sharded plan, DDP for a data-parallel one, the module itself when it is
        tensor parallel and unsharded (the session sums its gradients over the replicas)."""
        if self.plan.sharding != "none" and not _is_fsdp(model):
            from .parallel.fsdp import apply_fsdp  # noqa: PLC0415 - only sharded plans need it

            try:
                apply_fsdp(
                    model, self.mesh.sub("dp"), self.plan.sharding,
                    precision=self.precision, blocks=blocks,
                )  # fmt: skip
            except (TypeError, PermanentError) as err:  # not laid out as the sharding needs
                raise PermanentError(
                    f"plan {self.plan.label} shards the model ({self.plan.sharding}), but "
                    f"prepare() cannot: {err}"
                ) from None
            return model
        if self.plan.tp > 1 or _averaging_wrapper(model):
            return model
        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    def adopt(self, parts: Sequence[nn.Module]) -> None:
        """Register modules already parallelized for this plan (one per pipeline stage held)."""
        self._parts = list(parts)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The job's precision for a forward pass and its loss: ``torch.autocast`` to bf16 or
        fp16, nothing at fp32 (see ``elastra_worker.precision``).

        ``micro.sync(model)`` enters it, so a loop that runs its forward there needs nothing
        more; wrap a forward that runs elsewhere (an evaluation) in ``with sess.autocast():``.
        """
        return autocast(self.precision, self.device)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` as backward must see it: times the GradScaler's scale (fp16), else as is.

        ``micro.backward`` calls it; a loop that runs backward itself (a pipeline schedule's
        loss function) calls it on the loss it returns.
        """
        scaler = self._scaler
        if scaler is None or not scaler.is_enabled():
            return loss
        self._scaled = True
        return scaler.scale(loss)

    @property
    def grad_scaler(self) -> torch.amp.GradScaler | None:
        """The loss scaler in use: the registered one, an fp16 job's own (after ``restore``)."""
        return self._scaler

    def _ensure_scaler(self) -> None:
        """fp16 without a registered GradScaler: the session's own, checkpointed as others."""
        if self._scaler is not None:
            return
        scaler = grad_scaler(self.precision, self.device)
        if scaler is not None:
            self._scaler = scaler
            self._objects[SCALER_NAME] = scaler

    # ---- registered state -------------------------------------------------------------------

    def register(self, name: str, obj: Stateful) -> None:
        """Checkpoint ``obj`` (``state_dict``/``load_state_dict``) with the model under ``name``.

        For an LR scheduler, a ``torch.amp.GradScaler`` or an object of yours. Register before
        ``restore()``, which loads it into every rank; rank 0's object is the one saved, so
        register state that is the same on every rank (``user_state`` likewise). A registered
        GradScaler is also used by the session: the loss is scaled for backward, gradients are
        unscaled before ``before_update``, and the step goes through ``scaler.step`` and
        ``scaler.update``. An fp16 job that registers none gets one anyway (``SCALER_NAME``).
        """
        if self._restore_called:
            raise RuntimeError(
                f"register({name!r}) after restore(): register every stateful object before "
                "session.restore(), which loads them"
            )
        if not name or "/" in name or "." in name:
            raise PermanentError(f"register: name {name!r} must be non-empty without '/' or '.'")
        if name in self._objects:
            raise PermanentError(f"register: {name!r} is already registered")
        if name == SCALER_NAME and not isinstance(obj, torch.amp.GradScaler):
            raise PermanentError(f"register: the name {name!r} is kept for the loss scaler")
        if not callable(getattr(obj, "state_dict", None)) or not callable(
            getattr(obj, "load_state_dict", None)
        ):
            raise PermanentError(f"register({name!r}): {type(obj).__name__} has no state_dict()")
        if isinstance(obj, torch.amp.GradScaler):
            if self._scaler is not None:
                raise PermanentError("register: one GradScaler per session")
            self._scaler = obj
        self._objects[name] = obj

    def on_before_update(self, fn: BeforeUpdate) -> BeforeUpdate:
        """Set the ``before_update`` hook (usable as a decorator); see that attribute."""
        self.before_update = fn
        return fn

    def clip_grad_norm(self, max_norm: float, norm_type: float = 2.0) -> float:
        """Clip the gradients to a total norm of ``max_norm``; return the norm before clipping.

        Call it from ``before_update``, where the gradients are complete. The norm is over the
        whole model whatever the plan: DTensor (FSDP, tensor parallel) gradients are reduced
        over their mesh, and with a pipeline the stages' norms are combined over the ``pp``
        group, so every rank scales by the same factor (which
        ``torch.nn.utils.clip_grad_norm_`` on one stage's parameters would not do).
        """
        if not self._in_update:
            raise RuntimeError("clip_grad_norm() runs inside the before_update hook")
        grads = [p.grad for p in self._params() if p.grad is not None]
        total = _grad_norm(grads, norm_type)
        if self.plan.pp > 1:
            inf = math.isinf(norm_type)
            t = torch.tensor([total if inf else total**norm_type], device=self.device)
            op = dist.ReduceOp.MAX if inf else dist.ReduceOp.SUM
            dist.all_reduce(t, op=op, group=self.mesh.sub("pp").get_group())
            total = float(t.item()) if inf else float(t.item()) ** (1.0 / norm_type)
        coef = max_norm / (total + 1e-6)
        if coef < 1.0:
            for g in grads:
                g.mul_(coef)
        return total

    def _extra_state(self, saved: set[str] | None) -> dict[str, Any]:
        """Registered objects, user state and this rank's RNG, each one pickled blob.

        ``saved`` (on load): the checkpoint's keys, so a rank asks DCP only for what exists
        (a rank the saving world did not have has no RNG key; old checkpoints have none).
        """
        keys = [_OBJECT_KEY + name for name in self._objects]
        keys += [_USER_STATE_KEY, _RNG_KEY.format(self.rank)]
        if saved is not None:
            return {k: b"" for k in keys if k in saved}
        state = {_RNG_KEY.format(self.rank): _pack(_rng_state())}
        if self.rank == 0:  # replicated state: one copy, rank 0's
            state.update({_OBJECT_KEY + n: _pack(o.state_dict()) for n, o in self._objects.items()})
            state[_USER_STATE_KEY] = _pack(dict(self.user_state))
        return state

    def _apply_extra_state(self, state: dict[str, Any], manifest: Manifest) -> None:
        """Load what ``_extra_state`` asked for; reseed the RNG of a rank that was not saved."""
        for name, obj in self._objects.items():
            blob = state.get(_OBJECT_KEY + name)
            if blob is None:
                log.warning(
                    "checkpoint step %d has no state for %r: kept as is", manifest.step, name
                )
            else:
                obj.load_state_dict(_unpack(blob))
        if _USER_STATE_KEY in state:
            self.user_state.clear()
            self.user_state.update(_unpack(state[_USER_STATE_KEY]))
        rng = state.get(_RNG_KEY.format(self.rank))
        if rng is not None:
            _set_rng_state(_unpack(rng))
            return
        seed = _derived_seed(self.seed, self.rank, manifest.step)
        _reseed(seed)
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

    def _state(self) -> tuple[dict[str, Any], list[tuple[set[str], set[str]]]]:
        """The DCP state of every part, merged under parameter names, and each part's keys."""
        model: dict[str, Any] = {}
        optim: dict[str, Any] = {}
        keys: list[tuple[set[str], set[str]]] = []
        for part, opt in zip(self._parts, self._optimizers, strict=True):
            msd = get_model_state_dict(part)
            osd = get_optimizer_state_dict(part, opt, options=_FLAT_OPTIM)
            model.update(msd)
            optim.update(osd)
            keys.append((set(msd), set(osd)))
        return {"model": model, "optim": optim}, keys

    def _bind(self, models: Models, optimizers: Optimizers) -> None:
        parts, opts = _as_list(models), _as_list(optimizers)
        if len(parts) != len(opts):
            raise PermanentError(
                f"{len(parts)} model parts but {len(opts)} optimizers: one per part"
            )
        self._parts, self._optimizers = parts, opts

    def restore(self, model: Models, optimizer: Optimizers) -> int:
        """Load the newest good checkpoint into ``model``/``optimizer``; return the next step.

        Collective. ``model`` and ``optimizer`` may be lists (one optimizer per pipeline stage
        module). Returns 0 (and leaves both untouched) when the job has no checkpoint yet.
        Any plan loads any other plan's checkpoint: state is saved under parameter names and
        DCP reshards it to this rank's shards.
        """
        self._bind(model, optimizer)
        self._ensure_scaler()
        self._restore_called = True
        ckpt = self._require_checkpointer()
        manifest = ckpt.find_loadable()
        self._start_step = 0 if manifest is None else manifest.step
        if manifest is not None:
            self._load(manifest)
        ckpt.last_committed_step = None if manifest is None else manifest.step
        self._step = self._start_step
        if self.rank == 0 and self.step_log is not None:
            _truncate_step_log(self.step_log, self._start_step)
        return self._start_step

    def _load(self, manifest: Manifest) -> None:
        state, keys = self._state()
        ckpt = self._require_checkpointer()
        saved = ckpt.reader(manifest.step).read_metadata().state_dict_metadata
        extra = self._extra_state(set(saved))
        state.update(extra)
        ckpt.load(state, manifest)
        self._apply_extra_state({k: state[k] for k in extra}, manifest)
        for (mkeys, okeys), part, opt in zip(keys, self._parts, self._optimizers, strict=True):
            set_model_state_dict(part, {k: state["model"][k] for k in mkeys})
            osd = {k: state["optim"][k] for k in okeys}
            set_optimizer_state_dict(part, opt, osd, options=_FLAT_OPTIM)
        self._restored_manifest = manifest
        self._clock.restored(manifest.world_version, manifest.extra)
        saved_plan = manifest.extra.get("plan", "?")
        log.info(
            "rank %d restored step %d (saved by %d ranks, plan %s) into a world of %d (plan %s)",
            self.rank,
            manifest.step,
            manifest.world_size,
            saved_plan,
            self.world_size,
            self.plan.label,
        )

    # ---- the step loop ----------------------------------------------------------------------

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
        a = self.assignment
        if tokens_per_sample is not None:
            self.tokens_per_sample = tokens_per_sample
        self._order = DataOrder(a.seed, dataset_size, a.global_batch_size)
        if self._restored_manifest is not None and a.consistency != "none":
            saved = self._restored_manifest.extra.get("dataOrder")
            now = {
                "seed": a.seed,
                "datasetSize": dataset_size,
                "globalBatchSize": a.global_batch_size,
            }
            if saved is not None and saved != now:
                raise PermanentError(
                    f"the checkpoint's data order {saved} differs from this run's {now}: "
                    f"consistency {a.consistency} cannot hold; use the original values"
                )
        self._total = total_steps
        self._ensure_scaler()
        if total_steps is not None and self._step >= total_steps:
            self._done = True
            return
        stop_at = a.stop_at_step
        if stop_at is not None and self._step >= stop_at:
            # Restored at (or past) the step this world is to stop at: before, it trained one
            # more step and committed it, so a finished run restarted grew by a step each time.
            self._stop_agreed = True
            return
        self._step_time = time.monotonic()
        while not self._stop_agreed:
            k = self._step
            samples = self._order.step_samples(k)
            shares = rank_shares(
                samples, self.plan.batch_shares, self.dp_rank, self.plan.micro_batch_size
            )
            self._current = StepBatch(self, k, samples, shares)
            self._share_grads = []
            self._scaled = False
            # on the device: a micro-batch's loss is added there, read once per step (_agree)
            self._loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
            yield self._current
            if self._current is not None:
                raise RuntimeError("call session.step(optimizer) once per batch")
            self._finish_step()

    def _finish_step(self) -> None:
        """Checkpoint (if agreed) and report, after the whole loop body of the step.

        Not inside ``step()``: what the script does after it (``scheduler.step()``, counters
        in ``user_state``, random draws) belongs to the step and must be in its checkpoint.
        """
        self.stall_watch.arm()  # a step completed: the interval starts again
        decisions, self._decided = self._decided, None
        if decisions is None:
            return
        if decisions.checkpoint:
            self.save_checkpoint(wait=decisions.stop)
        self._report_progress(decisions.loss)

    def sampler(
        self,
        *,
        dataset_size: int,
        total_steps: int | None = None,
        start_step: int | None = None,
    ) -> StepSampler:
        """A ``Sampler[int]``: this data-parallel rank's samples of every step, in order.

        Starts at the restored step (call ``restore()`` first) or ``start_step``, and yields
        exactly the samples ``batches()`` gives this rank, step after step, so a
        ``DataLoader(ds, batch_size=micro_batch_size, sampler=sess.sampler(...))`` reads the
        job's order at any world size. ``loader()`` does the cutting into micro-batches too.
        """
        return StepSampler(self._rank_slice(dataset_size, total_steps, start_step))

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

        Iterate it in lockstep with ``batches()`` (same ``total_steps``)::

            loader = sess.loader(ds, total_steps=N, num_workers=2, pin_memory=True)
            for batch, micro_batches in zip(sess.batches(dataset_size=len(ds), total_steps=N),
                                            loader):
                for micro, (x, y) in zip(batch, micro_batches):
                    ...

        Keyword arguments go to ``DataLoader`` (not ``batch_size``/``sampler``/``shuffle``: the
        order is the job's). Worker processes obey SIGTERM and die with the trainer.
        """
        size = len(dataset) if dataset_size is None else dataset_size  # type: ignore[arg-type]
        part = self._rank_slice(size, total_steps, start_step)
        return StepLoader(dataset, part, **dataloader_kwargs)

    def _rank_slice(self, size: int, total_steps: int | None, start: int | None) -> RankSlice:
        if start is None and not self._restore_called:
            raise RuntimeError("call session.restore() first: the data starts at its step")
        a = self.assignment
        return RankSlice(
            order=DataOrder(a.seed, size, a.global_batch_size),
            batch_shares=tuple(self.plan.batch_shares),
            dp_rank=self.dp_rank,
            micro_batch_size=self.plan.micro_batch_size,
            start_step=self._step if start is None else start,
            total_steps=total_steps,
        )

    def _params(self) -> list[nn.Parameter]:
        if not self._parts:
            raise RuntimeError("call session.prepare(model) or session.restore() first")
        return [p for part in self._parts for p in part.parameters() if p.requires_grad]

    def loss_weight(self, samples: int) -> float:
        """The factor for a loss that is the mean over ``samples`` sequences of this step.

        Scaled so that, after the gradient reduction the model's wrapper does (DDP averages
        over the world, FSDP over the data-parallel replicas, a bare module is summed by the
        session), every replica's gradient counts by its share of the global batch: uneven
        shares (heterogeneous GPUs) give the gradient of one big batch.
        """
        weight = samples / self.assignment.global_batch_size
        part = self._parts[0] if self._parts else None
        if part is not None and _is_fsdp(part):
            weight *= self.plan.dp
        elif isinstance(part, DistributedDataParallel):
            weight *= self.world_size
        return weight

    def add_loss(self, loss: torch.Tensor, samples: int) -> None:
        """Count a micro-batch's mean loss in the step's reported loss (once per replica)."""
        if self.mesh.computes_loss:
            g = self.assignment.global_batch_size
            self._loss_sum += loss.detach().to(torch.float64) * (samples / g)  # no host sync

    def _backward(self, micro: Micro, loss: torch.Tensor) -> None:
        weighted = loss * self.loss_weight(len(micro))
        with torch.autocast(self.device.type, enabled=False):  # backward outside autocast
            torch.autograd.backward(self.scale_loss(weighted))
        self.add_loss(loss, len(micro))
        if self.consistency == "bitwise":
            self._keep_share_grad(loss, len(micro))

    def _keep_share_grad(self, loss: torch.Tensor, samples: int) -> None:
        """Bitwise: set this logical share's gradient (and loss) aside for the chain sum."""
        g = self.assignment.global_batch_size
        params = self._params()
        flat = torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
            + [loss.detach().reshape(1).to(params[0].dtype) * (samples / g)]
        )
        self._share_grads.append(flat)
        for p in params:
            p.grad = None

    def _chain_reduce(self) -> float:
        """Sum the logical shares' gradients in share order through the ranks (bitwise)."""
        params = self._params()
        size = sum(p.numel() for p in params) + 1
        acc: torch.Tensor | None = None
        if self.rank > 0:
            acc = torch.empty(size, dtype=params[0].dtype, device=self.device)
            dist.recv(acc, src=self.rank - 1)
        for flat in self._share_grads:
            acc = flat if acc is None else acc + flat
        if acc is None:
            raise RuntimeError("bitwise: rank 0 has no logical share (batchShares[0] is 0)")
        last = self.world_size - 1
        if self.rank < last:
            dist.send(acc, dst=self.rank + 1)
            acc = torch.empty(size, dtype=params[0].dtype, device=self.device)
        dist.broadcast(acc, src=last)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = acc[offset : offset + n].view_as(p).clone()
            offset += n
        return float(acc[-1].item())

    def _sum_gradients(self) -> None:
        """A bare (or tensor-parallel) module: sum the weighted gradients over the replicas."""
        params = [p for p in self._params() if p.grad is not None]
        for p in params:  # a replicated DTensor's gradient may come back partial: settle it
            grad = p.grad
            if (
                isinstance(grad, DTensor)
                and isinstance(p, DTensor)
                and grad.placements != p.placements
            ):
                p.grad = grad.redistribute(placements=p.placements)
        grads = [_local(p.grad) for p in params if p.grad is not None]
        if not grads or self.plan.dp == 1:
            return
        group = self.mesh.dp_group
        for bucket in _buckets(grads):
            flat = torch.cat([g.reshape(-1) for g in bucket])
            dist.all_reduce(flat, group=group)
            offset = 0
            for g in bucket:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()

    def _reduce_gradients(self) -> float | None:
        """Finish the step's gradient; returns the loss when the reduction already knows it."""
        if self.consistency == "bitwise":
            return self._chain_reduce()
        part = self._parts[0] if self._parts else None
        if part is not None and not _averaging_wrapper(part):
            self._sum_gradients()
        return None

    def step(self, optimizer: Optimizers) -> dict[str, Any]:
        """Finish the current global step: reduce, update, log, maybe checkpoint or stop.

        ``optimizer`` may be a list (one per pipeline stage module). Returns the step record
        (``step``, ``loss``, ``worldSize``, ``plan`` ...). A checkpoint the world agreed on is
        taken when the loop body returns to ``batches()`` (so a ``scheduler.step()`` or a
        ``user_state`` update after this call is in it); after the step on which the world
        agreed to stop, that checkpoint is committed and ``batches()`` ends.
        """
        batch = self._current
        if batch is None:
            raise RuntimeError("session.step() outside a batch from session.batches()")
        self._optimizers = _as_list(optimizer)
        self.faults.at_step(batch.step)
        known_loss = self._reduce_gradients()
        self._update()
        self._step = batch.step + 1
        self._current = None
        decisions = self._agree(known_loss)
        record = self._record(batch, decisions.loss)
        self._decided = decisions  # acted on by batches() once the loop body is through
        if decisions.stop:
            self._stop_agreed = True
            self._done = decisions.done
        return record

    def _update(self) -> None:
        """Unscale (GradScaler), run ``before_update``, step the optimizers, clear gradients."""
        scaler = self._scaler
        self._in_update = True
        try:
            if scaler is not None:
                if scaler.is_enabled() and not self._scaled:
                    raise RuntimeError(
                        "the GradScaler scales the loss in micro.backward() (or "
                        "session.scale_loss()); this step's backward did not go through it"
                    )
                self._agree_found_inf(scaler)
                for opt in self._optimizers:
                    scaler.unscale_(opt)
            if self.before_update is not None:
                self.before_update(self._params())
        finally:
            self._in_update = False
        for opt in self._optimizers:
            if scaler is not None:
                scaler.step(opt)  # skipped when the unscaled gradients hold an inf or nan
            else:
                opt.step()
            opt.zero_grad(set_to_none=True)
        if scaler is not None:
            scaler.update()

    def _agree_found_inf(self, scaler: torch.amp.GradScaler) -> None:
        """Sharded, tensor or pipeline plans: skip the step everywhere if any shard overflowed.

        Each rank sees only its shards' gradients, so one rank may find an inf that another
        does not; without agreement some ranks would step and others skip, and their loss
        scales would part. So before ``unscale_`` looks, the world agrees (one all-reduce)
        whether any rank's gradients hold an inf or a nan, and if so every rank puts an inf
        into one gradient of each of its optimizers: each scaler then skips the step and backs
        off alike (the gradients are dropped with the skipped step). Public API only, so it
        holds for any GradScaler, FSDP's ShardedGradScaler included.
        """
        if not scaler.is_enabled() or not needs_mesh(self.plan):
            return
        per_opt = [
            [_local(p.grad) for g in opt.param_groups for p in g["params"] if p.grad is not None]
            for opt in self._optimizers
        ]
        grads = [g for opt_grads in per_opt for g in opt_grads]
        peak = torch.nn.utils.get_total_norm(grads, math.inf) if grads else torch.zeros(())
        found = (~torch.isfinite(peak)).to(device=self.device, dtype=torch.float32).reshape(1)
        dist.all_reduce(found, op=dist.ReduceOp.MAX)
        if not bool(found.item()):
            return
        with torch.no_grad():
            for opt_grads in per_opt:
                filled = next((g for g in opt_grads if g.numel() > 0), None)
                if filled is not None:
                    filled.fill_(math.inf)

    def _agree(self, known_loss: float | None) -> Decisions:
        """One all-reduce carries the loss and every vote, so all ranks decide alike."""
        local_stop = self._sigterm or (self.control is not None and self.control.stop_requested())
        interval = self.assignment.checkpoint.interval_seconds
        due = (
            self.rank == 0 and interval > 0 and time.monotonic() - self._last_ckpt_time >= interval
        )
        votes = torch.tensor(
            [float(self._loss_sum), 1.0 if local_stop else 0.0, 1.0 if due else 0.0],
            dtype=torch.float64,
        )
        dist.all_reduce(votes, group=self._group)
        stop_at = self.assignment.stop_at_step
        done = self._total is not None and self._step >= self._total
        stop = bool(votes[1] > 0) or done or (stop_at is not None and self._step >= stop_at)
        every = self.assignment.checkpoint.interval_steps
        return Decisions(
            loss=float(votes[0]) if known_loss is None else known_loss,
            stop=stop,
            done=done,
            checkpoint=stop or bool(votes[2] > 0) or (every > 0 and self._step % every == 0),
        )

    def _record(self, batch: StepBatch, loss: float) -> dict[str, Any]:
        """The step's record; rank 0 appends it to the step log (with a parameter hash)."""
        now = time.monotonic()
        self._step_seconds = now - self._step_time
        self._samples_per_s = len(batch.samples) / max(self._step_seconds, 1e-9)
        self._step_time = now
        record = {
            "step": batch.step,
            "worldSize": self.world_size,
            "worldVersion": self.assignment.world_version,
            "plan": self.plan.label,
            "precision": self.precision,
            "loss": loss,
            "samples": sorted(batch.samples),
            **self._clock.stepped(time.time()),
        }
        if "resizeDowntimeSeconds" in record and self.rank == 0:
            log.info(
                "world v%d: first step %.2fs after the step it resumed from (world v%d, state "
                "from %s)",
                self.assignment.world_version,
                record["resizeDowntimeSeconds"],
                record["resizeFromVersion"],
                record["stateFrom"],
            )
        if self.step_log is None:
            return record
        digest = self.params_sha256() if self._hash_is_collective() or self.rank == 0 else None
        if self.rank == 0:
            if digest is not None:
                record["paramsSha256"] = digest
            with open(self.step_log, "a", encoding="utf-8") as f:
                f.write(json.dumps(record, sort_keys=True) + "\n")
        return record

    def _hash_is_collective(self) -> bool:
        """Sharded parameters (FSDP, DTensor) are gathered for the hash: every rank joins."""
        return self.plan.pp == 1 and any(
            _is_fsdp(part) or any(isinstance(p, DTensor) for p in part.parameters())
            for part in self._parts
        )

    def _report_progress(self, loss: float) -> None:
        if self.control is None:
            return
        ckpt = self._require_checkpointer().last_committed_step
        self.control.write_progress(
            self.local_rank,
            {
                "step": self._step,
                "loss": loss,
                "samplesPerSecond": self._samples_per_s,
                "stepSeconds": self._step_seconds,
                "tokensPerSecond": (
                    None
                    if self.tokens_per_sample is None
                    else self._samples_per_s * self.tokens_per_sample
                ),
                "lastCheckpointStep": ckpt,
                "worldVersion": self.assignment.world_version,
                "worldSize": self.world_size,
                "plan": self.plan.label,
                **self._clock.progress(),
            },
        )

    @property
    def step_count(self) -> int:
        """Optimizer steps completed so far (the data position)."""
        return self._step

    @property
    def stopping(self) -> bool:
        """True once the world agreed to stop; ``batches()`` yields no more steps."""
        return self._stop_agreed

    def save_checkpoint(self, *, wait: bool = True) -> None:
        """Checkpoint the current step now (collective); a no-op if it is already committed.

        ``wait=False`` (a periodic save) under ``async_checkpoint`` returns once the state is
        copied to host memory and leaves writing and committing to a background thread. Either
        way a save still in flight is finished first: one save at a time, in step order.
        """
        ckpt = self._require_checkpointer()
        t0 = time.perf_counter()
        previous = ckpt.wait()
        waited = time.perf_counter() - t0
        if previous is not None and waited > WAITED_WARN_S:
            log.warning(
                "rank %d waited %.2fs for the background save of step %d: checkpoints are due "
                "faster than the storage writes them (raise checkpoint.intervalSeconds)",
                self.rank,
                waited,
                previous.step,
            )
        if ckpt.last_committed_step == self._step:
            return
        if not self._parts or not self._optimizers:
            raise RuntimeError("call session.restore(model, optimizer) before checkpointing")
        state, _ = self._state()
        state.update(self._extra_state(None))
        assert self._order is not None
        extra = {
            "dataOrder": {
                "seed": self._order.seed,
                "datasetSize": self._order.dataset_size,
                "globalBatchSize": self._order.global_batch_size,
            },
            "consistency": self.consistency,
            "plan": self.plan.label,
            **self._clock.manifest_extra(),
        }
        state["data"] = {"step": self._step}
        if not wait and self.async_checkpoint and self._async_group is not None:
            t1 = time.perf_counter()
            ckpt.save_async(state, step=self._step, extra=extra, group=self._async_group)
            log.info(
                "rank %d staged step %d in %.2fs; writing it in the background",
                self.rank,
                self._step,
                time.perf_counter() - t1,
            )
        else:
            result = ckpt.save(state, step=self._step, extra=extra)
            log.info(
                "rank %d committed step %d (%.1f MB in %.2fs)",
                self.rank,
                result.step,
                result.bytes / 1e6,
                result.seconds,
            )
        self._last_ckpt_time = time.monotonic()

    def wait_for_checkpoint(self) -> int | None:
        """Block until a background save in flight is committed (re-raising its error); the
        newest committed step. Not needed before leaving: the session waits for it then."""
        ckpt = self._require_checkpointer()
        ckpt.wait()
        return ckpt.last_committed_step

    def params_sha256(self) -> str | None:
        """sha256 over the model state dict (parameters and persistent buffers) in key order.

        Collective for sharded parameters (the full state is gathered); rank 0's value is the
        one to use. ``None`` with a pipeline: no rank holds every parameter.
        """
        if self.plan.pp > 1:
            return None
        part = self._parts[0]
        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(part, options=full if self._hash_is_collective() else None)
        h = hashlib.sha256()
        for key in sorted(state):
            t = state[key]
            if not isinstance(t, torch.Tensor):
                continue
            t = t.detach().to("cpu").contiguous()
            h.update(f"{key}:{t.dtype}:{tuple(t.shape)};".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    def _require_checkpointer(self) -> Checkpointer:
        if self._checkpointer is None:
            raise RuntimeError("session not started: use `with Session.from_env() as sess:`")
        return self._checkpointer


def _buckets(tensors: list[torch.Tensor], limit: int = 25_000_000) -> Iterator[list[torch.Tensor]]:
    """Group gradients of one dtype and device into all-reduce buckets of about ``limit`` items."""
    bucket: list[torch.Tensor] = []
    size = 0
    for t in tensors:
        if bucket and (size + t.numel() > limit or t.dtype != bucket[0].dtype):
            yield bucket
            bucket, size = [], 0
        bucket.append(t)
        size += t.numel()
    if bucket:
        yield bucket


def _truncate_step_log(path: Path, start_step: int) -> None:
    """Drop records of steps >= ``start_step``: they are being redone after a restore."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return
    kept = [ln for ln in lines if ln.strip() and json.loads(ln)["step"] < start_step]
    if len(kept) == len(lines):
        return
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(ln + "\n" for ln in kept), encoding="utf-8")
    os.replace(tmp, path)


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


def _derived_seed(seed: int, rank: int, step: int) -> int:
    """A seed for a rank the checkpoint has no RNG state for: a function of (seed, rank, step)."""
    digest = hashlib.sha256(f"elastra-rng/{seed}/{rank}/{step}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def _reseed(seed: int) -> None:
    torch.manual_seed(seed)  # also every CUDA device
    random.seed(seed)
    np.random.seed(seed)


def _grad_norm(grads: list[torch.Tensor], norm_type: float) -> float:
    """The norm of this rank's gradients; DTensor gradients count over their whole mesh.

    ``get_total_norm`` takes a list of DTensors that share a mesh and placements, so the
    gradients are grouped that way and the groups' norms combined here.
    """
    groups: dict[Any, list[torch.Tensor]] = {}
    for g in grads:
        key = (id(g.device_mesh), g.placements) if isinstance(g, DTensor) else None
        groups.setdefault(key, []).append(g)
    norms: list[float] = []
    for group in groups.values():
        n = torch.nn.utils.get_total_norm(group, norm_type)
        norms.append(float(n.full_tensor() if isinstance(n, DTensor) else n))
    if not norms:
        return 0.0
    if math.isinf(norm_type):
        return max(norms)
    return float(sum(n**norm_type for n in norms) ** (1.0 / norm_type))
