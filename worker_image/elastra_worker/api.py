"""The training-script API: what a user's training loop calls to be elastic.

A script that uses it survives resizes: it restores model, optimizer and data position resharded
to whatever world it is started in, trains on this rank's share of each global batch, and
checkpoints on an interval, on a stop request and on SIGTERM::

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

The step loop agrees on every decision (stop, checkpoint) with one small all-reduce per step, so
all ranks stop at the same step even though each pod sees the new assignment at its own time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import signal
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
from torch.nn.parallel import DistributedDataParallel

from .assignment import Assignment, assignment_from_env, parse_assignment
from .checkpoint import Checkpointer
from .control import CONTROL_DIR_ENV, ControlDir, TrainerStatus
from .dataorder import DataOrder, Share, rank_shares
from .faults import Faults
from .layout import CheckpointRoot, Manifest
from .lifeline import arm_from_env

log = logging.getLogger(__name__)

ASSIGNMENT_JSON_ENV = "ELASTRA_ASSIGNMENT_JSON"
STEP_LOG_ENV = "ELASTRA_STEP_LOG"


def _is_fsdp(model: nn.Module) -> bool:
    return isinstance(model, FSDPModule | FullyShardedDataParallel)


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
        """Wrap forward and backward: skips the wrapper's gradient sync on all but the last."""
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
        async_checkpoint: bool = False,
        rendezvous_timeout_s: float = 300.0,
        collective_timeout_s: float = 600.0,
        device: torch.device | None = None,
    ) -> None:
        self.assignment = assignment
        self.local_rank = local_rank
        self.rank = assignment.rank + local_rank
        self.world_size = assignment.world_size
        self.consistency = assignment.consistency
        self.seed = assignment.seed
        self.plan = assignment.plan
        model_parallel = self.plan.tp * self.plan.pp
        self.dp_rank = self.rank // model_parallel
        if model_parallel != 1:
            raise ValueError(
                f"elastra_worker implements data parallelism only (plan tp={self.plan.tp}, "
                f"pp={self.plan.pp}); run tensor/pipeline parallel plans with your own framework"
            )
        if device is None:
            use_cuda = torch.cuda.is_available() and os.environ.get("ELASTRA_DEVICE") != "cpu"
            device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
        self.device = device
        self.control = control
        self.step_log = step_log
        self.faults = faults or Faults()
        self.async_checkpoint = async_checkpoint
        self._rdzv_timeout = rendezvous_timeout_s
        self._coll_timeout = collective_timeout_s
        self._group: dist.ProcessGroup | None = None
        self._async_group: dist.ProcessGroup | None = None
        self._model: nn.Module | None = None
        self._optimizer: torch.optim.Optimizer | None = None
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
        self._order: DataOrder | None = None
        self._prev_sigterm: Any = None

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
        kwargs.setdefault("async_checkpoint", env.get("ELASTRA_ASYNC_CHECKPOINT") == "1")
        if env.get("ELASTRA_RENDEZVOUS_TIMEOUT"):
            kwargs.setdefault("rendezvous_timeout_s", float(env["ELASTRA_RENDEZVOUS_TIMEOUT"]))
        if env.get("ELASTRA_COLLECTIVE_TIMEOUT"):
            kwargs.setdefault("collective_timeout_s", float(env["ELASTRA_COLLECTIVE_TIMEOUT"]))
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
        threads = os.environ.get("ELASTRA_THREADS")
        if threads:
            torch.set_num_threads(int(threads))
        elif self.consistency == "bitwise":
            torch.set_num_threads(1)  # the same intra-op split in every world
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
        if self.async_checkpoint:
            self._async_group = self._gloo_group()
        root = CheckpointRoot(a.checkpoint.path, job=a.job)
        self._checkpointer = Checkpointer(
            root,
            group=self._group,
            world_version=a.world_version,
            keep=a.checkpoint.keep,
            thread_count=int(os.environ.get("ELASTRA_CHECKPOINT_THREADS", "4")),
            after_write=self.faults.in_save,
        )
        log.info(
            "rank %d/%d joined world version %d (%s, consistency %s)",
            self.rank,
            self.world_size,
            a.world_version,
            backend,
            self.consistency,
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
        if self._prev_sigterm is not None:
            signal.signal(signal.SIGTERM, self._prev_sigterm)
            self._prev_sigterm = None

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        # Only set a flag: the next step boundary checkpoints and leaves.
        self._sigterm = True

    # ---- model, optimizer, restore ----------------------------------------------------------

    def prepare(self, model: nn.Module) -> nn.Module:
        """Wrap ``model`` for this consistency mode.

        ``none``/``data``: a bare module is wrapped in DDP; DDP or FSDP modules are kept.
        ``bitwise``: the module stays bare (every rank holds a full replica); the session
        reduces gradients itself in share order. FSDP cannot be bitwise (its reduce-scatter
        order depends on the world size).
        """
        if self.consistency == "bitwise":
            if _averaging_wrapper(model):
                raise ValueError("consistency bitwise needs a bare module, not DDP/FSDP")
            self._model = model
            return model
        if not _averaging_wrapper(model):
            ids = [self.device.index] if self.device.type == "cuda" else None
            model = DistributedDataParallel(model, device_ids=ids)
        self._model = model
        return model

    def _state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        msd, osd = get_state_dict(model, optimizer)
        return {"model": msd, "optim": osd}

    def restore(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
        """Load the newest good checkpoint into ``model``/``optimizer``; return the next step.

        Collective. Returns 0 (and leaves both untouched) when the job has no checkpoint yet.
        """
        self._model = model
        self._optimizer = optimizer
        ckpt = self._require_checkpointer()
        manifest = ckpt.find_loadable()
        if manifest is None:
            self._start_step = 0
        else:
            state = self._state(model, optimizer)
            ckpt.load(state, manifest)
            set_state_dict(
                model,
                optimizer,
                model_state_dict=state["model"],
                optim_state_dict=state["optim"],
            )
            self._start_step = manifest.step
            self._restored_manifest = manifest
            log.info(
                "rank %d restored step %d (saved by %d ranks) into a world of %d",
                self.rank,
                manifest.step,
                manifest.world_size,
                self.world_size,
            )
        ckpt.last_committed_step = None if manifest is None else manifest.step
        self._step = self._start_step
        if self.rank == 0 and self.step_log is not None:
            _truncate_step_log(self.step_log, self._start_step)
        return self._start_step

    # ---- the step loop ----------------------------------------------------------------------

    def batches(self, *, dataset_size: int, total_steps: int | None = None) -> Iterator[StepBatch]:
        """Global steps from the restored one until done or until the world agrees to stop."""
        a = self.assignment
        self._order = DataOrder(a.seed, dataset_size, a.global_batch_size)
        if self._restored_manifest is not None and a.consistency != "none":
            saved = self._restored_manifest.extra.get("dataOrder")
            now = {
                "seed": a.seed,
                "datasetSize": dataset_size,
                "globalBatchSize": a.global_batch_size,
            }
            if saved is not None and saved != now:
                raise ValueError(
                    f"the checkpoint's data order {saved} differs from this run's {now}: "
                    f"consistency {a.consistency} cannot hold; use the original values"
                )
        self._total = total_steps
        if total_steps is not None and self._step >= total_steps:
            self._done = True
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
            self._loss_sum = torch.zeros((), dtype=torch.float64)
            yield self._current
            if self._current is not None:
                raise RuntimeError("call session.step(optimizer) once per batch")

    def _model_or_fail(self) -> nn.Module:
        if self._model is None:
            raise RuntimeError("call session.prepare(model) or session.restore() first")
        return self._model

    def _params(self) -> list[nn.Parameter]:
        return [p for p in self._model_or_fail().parameters() if p.requires_grad]

    def _backward(self, micro: Micro, loss: torch.Tensor) -> None:
        g = self.assignment.global_batch_size
        weight = len(micro) / g
        if self._model is not None and _averaging_wrapper(self._model):
            weight *= self.world_size  # DDP/FSDP divide by the world size
        torch.autograd.backward(loss * weight)
        self._loss_sum += loss.detach().to(torch.float64).cpu() * (len(micro) / g)
        if self.consistency == "bitwise":
            params = self._params()
            flat = torch.cat(
                [
                    (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                    for p in params
                ]
                + [loss.detach().reshape(1).to(params[0].dtype) * (len(micro) / g)]
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

    def step(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Finish the current global step: reduce, update, log, maybe checkpoint or stop.

        Returns the step record (``step``, ``loss``, ``worldSize`` ...). After the step on which
        the world agreed to stop, the checkpoint is committed and ``batches()`` ends.
        """
        batch = self._current
        if batch is None:
            raise RuntimeError("session.step() outside a batch from session.batches()")
        self._optimizer = optimizer
        self.faults.at_step(batch.step)
        if self.consistency == "bitwise":
            loss = self._chain_reduce()
        elif self._model is not None and not _averaging_wrapper(self._model):
            for p in self._params():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
            loss = None
        else:
            loss = None
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self._step = batch.step + 1
        self._current = None

        # One all-reduce carries the loss and every decision, so all ranks agree.
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
        if loss is None:
            loss = float(votes[0])
        stop_at = self.assignment.stop_at_step
        done = self._total is not None and self._step >= self._total
        stop = bool(votes[1] > 0) or done or (stop_at is not None and self._step >= stop_at)
        every = self.assignment.checkpoint.interval_steps
        checkpoint = stop or bool(votes[2] > 0) or (every > 0 and self._step % every == 0)

        now = time.monotonic()
        self._samples_per_s = len(batch.samples) / max(now - self._step_time, 1e-9)
        self._step_time = now
        record = {
            "step": batch.step,
            "worldSize": self.world_size,
            "worldVersion": self.assignment.world_version,
            "loss": loss,
            "samples": sorted(batch.samples),
        }
        if self.step_log is not None and (self.rank == 0 or _is_fsdp(self._model_or_fail())):
            digest = self.params_sha256()
            if self.rank == 0:
                record["paramsSha256"] = digest
                with open(self.step_log, "a", encoding="utf-8") as f:
                    f.write(json.dumps(record, sort_keys=True) + "\n")
        if checkpoint:
            self.save_checkpoint(wait=stop)
        if self.control is not None:
            ckpt = self._require_checkpointer().last_committed_step
            self.control.write_progress(
                self.local_rank,
                {
                    "step": self._step,
                    "loss": loss,
                    "samplesPerSecond": self._samples_per_s,
                    "lastCheckpointStep": ckpt,
                    "worldVersion": self.assignment.world_version,
                    "worldSize": self.world_size,
                },
            )
        if stop:
            self._stop_agreed = True
            self._done = done
        return record

    @property
    def step_count(self) -> int:
        """Optimizer steps completed so far (the data position)."""
        return self._step

    @property
    def stopping(self) -> bool:
        """True once the world agreed to stop; ``batches()`` yields no more steps."""
        return self._stop_agreed

    def save_checkpoint(self, *, wait: bool = True) -> None:
        """Checkpoint the current step now (collective); a no-op if it is already committed."""
        ckpt = self._require_checkpointer()
        ckpt.wait()
        if ckpt.last_committed_step == self._step:
            return
        if self._model is None or self._optimizer is None:
            raise RuntimeError("call session.restore(model, optimizer) before checkpointing")
        state = self._state(self._model, self._optimizer)
        assert self._order is not None
        extra = {
            "dataOrder": {
                "seed": self._order.seed,
                "datasetSize": self._order.dataset_size,
                "globalBatchSize": self._order.global_batch_size,
            },
            "consistency": self.consistency,
        }
        state["data"] = {"step": self._step}
        if not wait and self.async_checkpoint and self._async_group is not None:
            ckpt.save_async(state, step=self._step, extra=extra, group=self._async_group)
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

    def params_sha256(self) -> str:
        """sha256 over the model state dict (parameters and persistent buffers) in key order.

        Collective for FSDP (the full state is gathered); rank 0's value is the one to use.
        """
        assert self._model is not None
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(
            self._model, options=options if _is_fsdp(self._model) else None
        )
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
