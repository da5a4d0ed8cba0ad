"""What a step leaves behind: its record (the step log), the agent's progress file, the hash.

Rank 0 appends each step's record to the step log (``ELASTRA_STEP_LOG``) with a sha256 of the
parameters, which the tests compare across resizes; every trainer writes its progress (step,
loss, rates, last checkpoint, the last resize's downtime) to the agent's control folder after a
step, which feeds the job's status and metrics.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from ..control import ControlDir
from ..downtime import ResizeClock
from .model import ModelParts
from .world import World

log = logging.getLogger(__name__)


class StepRecorder:
    """Step timing, the step log, the progress report and the parameter hash."""

    def __init__(
        self,
        world: World,
        parts: ModelParts,
        *,
        step_log: Path | None,
        control: ControlDir | None,
    ) -> None:
        self._world = world
        self._parts = parts
        self.step_log = step_log
        self.control = control
        self.clock = ResizeClock(world.assignment.world_version)
        self._step_time = time.monotonic()
        self._step_seconds = 0.0
        self._samples_per_s = 0.0

    def restored(self, start_step: int) -> None:
        """Rank 0 drops the step log's records of steps being redone after a restore."""
        if self._world.rank == 0 and self.step_log is not None:
            _truncate_step_log(self.step_log, start_step)

    def start_timing(self) -> None:
        self._step_time = time.monotonic()

    def record(self, step: int, samples: list[int], loss: float) -> dict[str, Any]:
        """The step's record; rank 0 appends it to the step log (with a parameter hash)."""
        world = self._world
        now = time.monotonic()
        self._step_seconds = now - self._step_time
        self._samples_per_s = len(samples) / max(self._step_seconds, 1e-9)
        self._step_time = now
        ended_at = time.time()
        record = {
            "step": step,
            "worldSize": world.world_size,
            "worldVersion": world.assignment.world_version,
            "plan": world.plan.label,
            "microBatchSize": world.plan.micro_batch_size,
            "precision": world.precision,
            "loss": loss,
            "samples": sorted(samples),
            # wall clock, so what happened outside (a `kubectl scale`) can be set against steps
            "endedAt": round(ended_at, 3),
            **self.clock.stepped(ended_at),
        }
        if "resizeDowntimeSeconds" in record and world.rank == 0:
            log.info(
                "world v%d: first step %.2fs after the step it resumed from (world v%d, state "
                "from %s)",
                world.assignment.world_version,
                record["resizeDowntimeSeconds"],
                record["resizeFromVersion"],
                record["stateFrom"],
            )
        if self.step_log is None:
            return record
        collective = self._hash_is_collective()
        digest = self.params_sha256() if collective or world.rank == 0 else None
        if world.rank == 0:
            if digest is not None:
                record["paramsSha256"] = digest
            with open(self.step_log, "a", encoding="utf-8") as f:
                f.write(json.dumps(record, sort_keys=True) + "\n")
        return record

    def report_progress(
        self, *, step: int, loss: float, checkpoint: dict[str, Any], tokens: int | None
    ) -> None:
        """Write this trainer's progress for the agent (nothing without a control folder);
        ``checkpoint``: the checkpoint manager's fields (``CheckpointManager.progress``);
        ``tokens``: per sample, for tokens per second."""
        if self.control is None:
            return
        world = self._world
        self.control.write_progress(
            world.local_rank,
            {
                "step": step,
                "loss": loss,
                "samplesPerSecond": self._samples_per_s,
                "stepSeconds": self._step_seconds,
                "tokensPerSecond": None if tokens is None else self._samples_per_s * tokens,
                **checkpoint,
                "worldVersion": world.assignment.world_version,
                "worldSize": world.world_size,
                "plan": world.plan.label,
                **self.clock.progress(),
            },
        )

    def _hash_is_collective(self) -> bool:
        """Sharded parameters (FSDP, DTensor) are gathered for the hash: every rank joins."""
        return self._world.plan.pp == 1 and self._parts.sharded()

    def params_sha256(self) -> str | None:
        """sha256 over the model state dict in key order (``Session.params_sha256``)."""
        if self._world.plan.pp > 1:
            return None
        part = self._parts.parts[0]
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
