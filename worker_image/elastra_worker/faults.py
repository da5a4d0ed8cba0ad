"""Fault injection for tests and the local launcher: kill this trainer at a chosen point, or
make its saves slow.

Set by ``elastra-worker local --fail`` on one pod only, or ``--chaos`` on every trainer: there
each trainer dies at random, in the middle of a step with one probability and between writing
its shards of a checkpoint and the commit with another, drawn from (seed, world version, rank,
step) so a run's faults repeat. The kill is a SIGKILL to the trainer itself: no handler, no
flush, no checkpoint, which is what a lost node or an OOM kill looks like. Just before it, the
trainer writes one ``FAULT_LINE`` to stderr naming where it died, so a test can check what the
next world restored against what had been committed.

A ``--fail`` kill fires once per run: it leaves a mark in ``FIRED_DIR_ENV``'s folder, and a
trainer that finds its kill's mark there is not armed with it. The agent that passes the fault
on often outlives its trainer (it joins the next world when one is assigned), so its next
trainers inherit the same variables; without the mark they would die at the same point again.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

KILL_AT_STEP_ENV = "ELASTRA_FAULT_KILL_AT_STEP"
KILL_IN_SAVE_ENV = "ELASTRA_FAULT_KILL_IN_SAVE"
SAVE_DELAY_ENV = "ELASTRA_FAULT_SAVE_DELAY_SECONDS"
"""Every save waits this long after writing its shards, before the commit: a slow volume."""
FIRED_DIR_ENV = "ELASTRA_FAULT_FIRED_DIR"
"""A folder where a fired ``--fail`` kill leaves its mark (one file per kind of kill)."""
CHAOS_ENV = "ELASTRA_FAULT_CHAOS"
"""``SEED:P_STEP:P_SAVE``: kill with probability P_STEP in each step, P_SAVE in each save."""
FAULT_LINE = "elastra-fault: rank {rank} of world v{version} killed {where} {step}"
MID_STEP, IN_SAVE = "mid-step", "in-save-of-step"


@dataclass(frozen=True)
class Chaos:
    """Random kills: the seed and the probabilities per step and per save."""

    seed: int
    p_step: float
    p_save: float

    @staticmethod
    def parse(text: str) -> Chaos:
        """``SEED:P_STEP:P_SAVE``; ValueError naming the form when it is not that."""
        try:
            seed, p_step, p_save = text.split(":")
            chaos = Chaos(int(seed), float(p_step), float(p_save))
        except ValueError:
            raise ValueError(f"chaos {text!r}: expected SEED:P_STEP:P_SAVE") from None
        if not (0 <= chaos.p_step < 1 and 0 <= chaos.p_save < 1):
            raise ValueError(f"chaos {text!r}: probabilities must be in [0, 1)")
        return chaos


def _fired_mark(where: str, environ: Mapping[str, str]) -> Path | None:
    folder = environ.get(FIRED_DIR_ENV)
    return Path(folder) / where if folder else None


def _kill_self(where: str, step: int, environ: Mapping[str, str], *, once: bool = False) -> None:
    mark = _fired_mark(where, environ) if once else None
    if mark is not None:
        mark.write_text(f"{step}\n", encoding="utf-8")
    line = FAULT_LINE.format(
        rank=environ.get("RANK", "?"),
        version=environ.get("ELASTRA_WORLD_VERSION", "?"),
        where=where,
        step=step,
    )
    print(line, file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class Faults:
    """Where to die: during step ``kill_at_step`` or while saving checkpoint ``kill_in_save``."""

    kill_at_step: int | None = None
    kill_in_save: int | None = None
    save_delay_s: float = 0.0
    """Seconds every save waits before its commit (a slow volume, for grace-period tests)."""
    chaos: Chaos | None = None
    environ: Mapping[str, str] | None = None
    """The trainer's environment: rank and world version for the chaos draw and the line."""

    @staticmethod
    def from_env(environ: Mapping[str, str]) -> Faults:
        """Read ``ELASTRA_FAULT_KILL_AT_STEP``, ``ELASTRA_FAULT_KILL_IN_SAVE`` (each unless
        its mark in ``ELASTRA_FAULT_FIRED_DIR`` says it fired) and
        ``ELASTRA_FAULT_SAVE_DELAY_SECONDS``."""

        def opt(name: str, where: str) -> int | None:
            raw = environ.get(name, "")
            mark = _fired_mark(where, environ)
            return int(raw) if raw and not (mark is not None and mark.exists()) else None

        chaos = environ.get(CHAOS_ENV)
        return Faults(
            kill_at_step=opt(KILL_AT_STEP_ENV, MID_STEP),
            kill_in_save=opt(KILL_IN_SAVE_ENV, IN_SAVE),
            save_delay_s=float(environ.get(SAVE_DELAY_ENV) or 0.0),
            chaos=Chaos.parse(chaos) if chaos else None,
            environ=dict(environ),
        )

    def at_step(self, step: int) -> None:
        """Called in the middle of global step ``step`` (after backward, before the reduce)."""
        if self.kill_at_step == step or self._draw(MID_STEP, step):
            _kill_self(MID_STEP, step, self.environ or {}, once=self.kill_at_step == step)

    def in_save(self, step: int) -> None:
        """Called after this rank's shards of checkpoint ``step`` are written, before commit."""
        if self.save_delay_s > 0:
            time.sleep(self.save_delay_s)
        if self.kill_in_save == step or self._draw(IN_SAVE, step):
            _kill_self(IN_SAVE, step, self.environ or {}, once=self.kill_in_save == step)

    def _draw(self, where: str, step: int) -> bool:
        if self.chaos is None:
            return False
        env = self.environ or {}
        key = (
            f"{self.chaos.seed}:{env.get('ELASTRA_WORLD_VERSION')}:{env.get('RANK')}:{where}:{step}"
        )
        chance = self.chaos.p_step if where == MID_STEP else self.chaos.p_save
        return random.Random(key).random() < chance
