"""The local launcher's schedule: which world size, under which plan, from when to when.

``--schedule 4:0,2:20:tp=2,3:30s`` is a list of entries ``SIZE:POINT[:PLAN]``. ``POINT`` is a
step (the old world stops itself there, checkpointed, through ``stopAtStep``, so the step log
reads the same on every run) or ``SECONDSs``, seconds since the launcher started (the launcher
writes the new world at that time; the only choice for a plain torchrun script, which reports
no steps). ``PLAN`` is ``/``-separated ``key=value`` pairs: ``tp``, ``pp``, ``vpp``,
``sharding``, ``recompute``, ``mb``; ``dp`` is ``SIZE / (tp*pp)``.

Everything here is checked before a single process starts, and every error names the entry, so
a typo in entry 7 fails at once instead of after six resizes. The one plan the operator would
place for an entry is built by ``plan_for``, with the contract's own helpers (``default_coords``,
``default_schedule``), so the local launcher writes exactly what the operator writes.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, cast

from .assignment import (
    RECOMPUTES,
    SHARDINGS,
    Consistency,
    ParallelPlan,
    Recompute,
    Sharding,
    default_coords,
    default_schedule,
)

PLAN_KEYS = ("tp", "pp", "vpp", "sharding", "recompute", "mb")
_SECONDS = re.compile(r"^\d+(\.\d+)?s$")


@dataclass(frozen=True)
class PlanSpec:
    """What one entry asks of the parallel plan; ``mb`` None means the job's micro batch."""

    tp: int = 1
    pp: int = 1
    vpp: int = 1
    sharding: Sharding = "none"
    recompute: Recompute = "none"
    mb: int | None = None


@dataclass(frozen=True)
class Segment:
    """One world: ``size`` ranks under ``plan`` from its entry's point until the next entry's.

    ``stop_at_step`` is where the world stops itself (the next step point of the schedule, or
    ``--steps``); ``until_s`` is when the launcher replaces it (the next entry's time).
    """

    size: int
    entry: str
    plan: PlanSpec = field(default_factory=PlanSpec)
    start_step: int | None = 0
    start_s: float | None = None
    stop_at_step: int | None = None
    until_s: float | None = None

    @property
    def span(self) -> str:
        """Where the world starts and ends, for log lines and errors."""
        start = f"{self.start_s:g}s" if self.start_s is not None else f"step {self.start_step}"
        if self.until_s is not None:
            return f"{start} until {self.until_s:g}s"
        if self.stop_at_step is not None:
            return f"{start} until step {self.stop_at_step}"
        return f"{start} until the trainers finish"


class _Entry(NamedTuple):
    size: int
    step: int | None
    seconds: float | None
    plan: PlanSpec
    text: str


def _int(entry: str, name: str, raw: str, minimum: int) -> int:
    """``int(raw)``, or a ValueError that names the entry and the field."""
    try:
        value = int(raw)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise ValueError(f"schedule entry {entry!r}: {name} must be an integer >= {minimum}")
    return value


def _parse_plan(entry: str, text: str) -> PlanSpec:
    """``tp=2/pp=2/sharding=full`` -> PlanSpec; unknown keys and values name the entry."""
    values: dict[str, Any] = {}
    for pair in text.split("/"):
        key, sep, raw = pair.partition("=")
        if not sep or key not in PLAN_KEYS:
            raise ValueError(
                f"schedule entry {entry!r}: {pair!r} is not KEY=VALUE with KEY one of "
                f"{', '.join(PLAN_KEYS)}"
            )
        if key in values:
            raise ValueError(f"schedule entry {entry!r}: {key} is given twice")
        if key in ("sharding", "recompute"):
            allowed: tuple[str, ...] = SHARDINGS if key == "sharding" else RECOMPUTES
            if raw not in allowed:
                raise ValueError(
                    f"schedule entry {entry!r}: {key} must be one of {', '.join(allowed)}, "
                    f"got {raw!r}"
                )
            values[key] = raw
        else:
            values[key] = _int(entry, key, raw, 1)
    return PlanSpec(**values)


def _parse_entry(text: str) -> _Entry:
    """One ``SIZE:POINT[:PLAN]``, checked on its own (the order is checked across entries)."""
    parts = text.split(":", 2)
    if len(parts) < 2:
        raise ValueError(f"schedule entry {text!r}: expected SIZE:STEP or SIZE:SECONDSs[:PLAN]")
    size = _int(text, "SIZE", parts[0], 1)
    point = parts[1]
    step: int | None = None
    seconds: float | None = None
    if _SECONDS.match(point):
        seconds = float(point[:-1])
    else:
        step = _int(text, "STEP (or SECONDS followed by s)", point, 0)
    plan = _parse_plan(text, parts[2]) if len(parts) == 3 else PlanSpec()
    if size % (plan.tp * plan.pp):
        raise ValueError(
            f"schedule entry {text!r}: tp*pp = {plan.tp * plan.pp} does not divide the world "
            f"size {size}"
        )
    if plan.vpp > 1 and plan.pp == 1:
        raise ValueError(f"schedule entry {text!r}: vpp={plan.vpp} needs pp > 1")
    return _Entry(size, step, seconds, plan, text)


def _check_order(entries: Sequence[_Entry], steps: int | None, *, by_time_only: bool) -> None:
    """Steps and times each increase; a later entry that could never be reached is refused."""
    first = entries[0]
    if first.step != 0 and first.seconds != 0:
        raise ValueError(f"schedule entry {first.text!r}: the first entry must be at 0 (or 0s)")
    last_step, last_s = 0, 0.0
    for e in entries[1:]:
        if e.step is not None:
            if by_time_only:
                raise ValueError(
                    f"schedule entry {e.text!r}: a plain torchrun script reports no steps, so "
                    "it can only be resized at a time: SIZE:SECONDSs"
                )
            if e.step <= last_step:
                raise ValueError(f"schedule entry {e.text!r}: steps must increase")
            if steps is not None and e.step >= steps:
                raise ValueError(f"schedule entry {e.text!r}: step is not below --steps {steps}")
            last_step = e.step
        else:
            assert e.seconds is not None
            if e.seconds <= last_s:
                raise ValueError(f"schedule entry {e.text!r}: times must increase")
            last_s = e.seconds


def parse_schedule(text: str, steps: int | None, *, by_time_only: bool = False) -> list[Segment]:
    """``SIZE:POINT[:PLAN][,...]`` -> segments (see the module docstring); ValueError if bad.

    ``steps`` (``--steps``) ends the last world; ``by_time_only`` refuses step points after the
    first (a torchrun-mode script reports no steps, so nobody could stop it at one).
    """
    entries = [_parse_entry(part.strip()) for part in text.split(",")]
    _check_order(entries, steps, by_time_only=by_time_only)
    segments = []
    for i, (cur, nxt) in enumerate(itertools.pairwise([*entries, None])):
        assert cur is not None
        # A world ended by a time still stops at the next step point (or --steps) if it gets
        # there first: steps never run past a point the schedule names.
        later_steps = [e.step for e in entries[i + 1 :] if e.step is not None]
        segments.append(
            Segment(
                size=cur.size,
                entry=cur.text,
                plan=cur.plan,
                start_step=cur.step,
                start_s=cur.seconds,
                stop_at_step=later_steps[0] if later_steps else steps,
                until_s=None if nxt is None else nxt.seconds,
            )
        )
    return segments


def even_shares(global_batch: int, dp: int, micro: int) -> list[int]:
    """Split the global batch over ``dp`` ranks in whole logical shares, as evenly as possible."""
    if global_batch % micro:
        raise ValueError(f"global batch {global_batch} is not a multiple of micro batch {micro}")
    logical = global_batch // micro
    if dp > logical:
        raise ValueError(f"{dp} ranks but only {logical} logical shares of {micro}")
    base, rest = divmod(logical, dp)
    return [(base + (1 if r < rest else 0)) * micro for r in range(dp)]


def plan_for(seg: Segment, *, global_batch: int, micro_batch: int) -> ParallelPlan:
    """The plan the operator would place for ``seg``: the default rank order, even shares.

    ``stages`` stays empty: the trainer splits the layers itself (``split_layers``).
    """
    p = seg.plan
    dp = seg.size // (p.tp * p.pp)
    mb = p.mb or micro_batch
    return ParallelPlan(
        dp=dp,
        tp=p.tp,
        pp=p.pp,
        micro_batch_size=mb,
        batch_shares=tuple(even_shares(global_batch, dp, mb)),
        virtual_stages=p.vpp,
        schedule=default_schedule(p.pp, p.vpp),
        sharding=p.sharding,
        recompute=p.recompute,
        ranks=default_coords(dp, p.tp, p.pp),
    )


@dataclass(frozen=True)
class ModelBounds:
    """The parts of a TrainingJob's ``spec.model`` that bound a plan."""

    layers: int
    attention_heads: int
    kv_heads: int | None = None


def model_from_command(command: Sequence[str]) -> ModelBounds | None:
    """The model of ``--model FILE`` in the trainer's command (the reference trainer), if any.

    FILE is YAML with the TrainingJob ``spec.model`` names (``layers``, ``attentionHeads``,
    ``kvHeads``, ...). It is read here rather than through the trainer's model code so the
    launcher imports no torch and fails in milliseconds.
    """
    path: str | None = None
    for i, arg in enumerate(command):
        if arg == "--model" and i + 1 < len(command):
            path = command[i + 1]
        elif arg.startswith("--model="):
            path = arg.split("=", 1)[1]
    if path is None:
        return None
    # PyYAML is not in the worker image: only the local launcher with --model needs it.
    import yaml  # noqa: PLC0415

    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise ValueError(f"--model {path}: cannot read it: {err}") from err
    if not isinstance(raw, dict):
        raise ValueError(f"--model {path}: expected a mapping (the TrainingJob spec.model)")
    spec = cast(Mapping[str, Any], raw)

    def num(key: str, required: bool = True) -> int | None:
        value = spec.get(key)
        if value is None and not required:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"--model {path}: {key} must be an integer >= 1, got {value!r}")
        return value

    layers, heads = num("layers"), num("attentionHeads")
    assert layers is not None and heads is not None
    return ModelBounds(layers=layers, attention_heads=heads, kv_heads=num("kvHeads", False))


def check_plans(
    schedule: Sequence[Segment],
    *,
    global_batch: int,
    micro_batch: int,
    consistency: Consistency,
    model: ModelBounds | None,
) -> None:
    """Refuse, naming the entry, every plan the trainer could not run (before anything starts)."""
    for seg in schedule:
        p = seg.plan
        where = f"schedule entry {seg.entry!r}"
        if consistency == "bitwise" and p.mb not in (None, micro_batch):
            raise ValueError(
                f"{where}: mb={p.mb}, but in bitwise mode the micro batch is the logical share "
                f"and must stay --micro-batch-size {micro_batch} in every world"
            )
        try:
            plan_for(seg, global_batch=global_batch, micro_batch=micro_batch)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from err
        if model is None:
            continue
        for name, heads in (("attentionHeads", model.attention_heads), ("kvHeads", model.kv_heads)):
            if heads is not None and heads % p.tp:
                raise ValueError(f"{where}: tp={p.tp} does not divide the model's {name} {heads}")
        if p.pp * p.vpp > model.layers:
            raise ValueError(
                f"{where}: pp*vpp = {p.pp * p.vpp} stages but the model has {model.layers} layers"
            )
