"""The assignment: what the operator tells one worker pod about the world it belongs to.

The operator writes it as JSON into the pod annotation ``elastra.dev/assignment``; a downward-API
volume shows it to the pod as a file (``/etc/elastra/assignment`` unless ``ELASTRA_ASSIGNMENT_FILE``
says otherwise). This module is the single place that knows the format: it parses and validates
it into frozen dataclasses and fails with a message that names the bad field, so a malformed
annotation is a clear permanent error (exit code 2), never a half-started world.

Format (``elastra.dev/v1alpha1``, kind ``Assignment``)::

    {"apiVersion": "elastra.dev/v1alpha1", "kind": "Assignment",
     "job": "gpt", "worldVersion": 3, "rank": 0, "worldSize": 4,
     "masterAddr": "gpt-w0.gpt.default.svc", "masterPort": 29500, "localWorldSize": 1,
     "plan": {"dp": 4, "tp": 1, "pp": 1, "microBatchSize": 2, "batchShares": [8, 8, 8, 8]},
     "globalBatchSize": 32, "consistency": "none", "seed": 0,
     "checkpoint": {"path": "/ckpt", "intervalSeconds": 300, "keep": 3, "intervalSteps": 0,
                    "uri": "s3://bucket/prefix", "asynchronous": true},
     "stopAtStep": null, "stop": false, "precision": "bf16", "gpus": 1, "peersLost": false}

``rank`` and ``worldSize`` count trainer processes (pods x ``localWorldSize``); ``rank`` is the
global rank of the pod's first trainer. ``worldSize: 0`` (or no file at all) means the pod is in
no world and waits. ``stop: true`` asks the pod to checkpoint and exit 0 (suspend, shrink-out).
``checkpoint.intervalSteps`` (0 = off) and ``stopAtStep`` (null = none) are optional additions
to the first draft of the contract: a step-based checkpoint interval, and a step at which the
world stops on its own (checkpoint, exit 0) so a planned resize lands on an exact step.
``checkpoint.uri`` (optional, absent when unset) puts the checkpoints in an object store
instead of ``path``. ``checkpoint.asynchronous`` (default true) writes periodic checkpoints in
the background after copying the state to host memory; false blocks training for the whole
save (``checkpoint.py``). The operator leaves out the ``plan`` and ``checkpoint`` fields that hold
the value a reader assumes when they are absent (``tp: 1``, ``keep: 3``, ...: see
``_PLAN_DEFAULTS``); the top-level fields are always written.

``precision`` (``training.precision``: bf16, fp16 or fp32) is the arithmetic the trainer
computes in, and ``gpus`` (``worker.gpus``; 0 on a CPU pod) the GPUs the pod was given, which
the trainer must see or stop (``elastra_worker.devices``). An assignment without them (an
operator from before they existed) means fp32 on whatever device there is, as it did then.

``peersLost`` (optional, default false) says the world version was formed because members of
the one before were lost or failed: that world's trainers cannot agree on a stop (the agreement
is a collective with the member that is gone), so the agent ends them at once instead of
waiting out its stop timeout while they block on the dead peer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, cast

API_VERSION = "elastra.dev/v1alpha1"
KIND = "Assignment"
DEFAULT_ASSIGNMENT_FILE = "/etc/elastra/assignment"
ASSIGNMENT_FILE_ENV = "ELASTRA_ASSIGNMENT_FILE"
PRECISION_ENV = "ELASTRA_PRECISION"
"""The job's precision for a script run without the assignment (torchrun mode sets it)."""
ASSIGNMENT_JSON_ENV = "ELASTRA_ASSIGNMENT_JSON"
"""The assignment itself, in the wire format (a Session trainer's; the agent sets it)."""
POD_GPUS_ENV = "ELASTRA_POD_GPUS"
"""The pod's GPUs for a script run without the assignment (torchrun mode sets it)."""

Consistency = Literal["none", "data", "bitwise"]
CONSISTENCIES: tuple[Consistency, ...] = ("none", "data", "bitwise")
Sharding = Literal["none", "optimizer", "full"]
SHARDINGS: tuple[Sharding, ...] = ("none", "optimizer", "full")
Recompute = Literal["none", "selective", "full"]
RECOMPUTES: tuple[Recompute, ...] = ("none", "selective", "full")
Schedule = Literal["gpipe", "1f1b", "interleaved1f1b"]
SCHEDULES: tuple[Schedule, ...] = ("gpipe", "1f1b", "interleaved1f1b")
Precision = Literal["bf16", "fp16", "fp32"]
PRECISIONS: tuple[Precision, ...] = ("bf16", "fp16", "fp32")
DEFAULT_PRECISION: Precision = "fp32"
"""What an assignment without ``precision`` means: what every trainer computed in before."""
MAX_GPUS = 1024
"""Bound on ``gpus`` (far above any node's GPU count)."""


MAX_RANKS = 65536
"""Bound on ``worldSize`` and on every per-rank list (a larger one is a malformed assignment)."""
MAX_NAME = 253
"""Bound on ``job`` and ``masterAddr`` (a Kubernetes object name, a DNS name)."""
MAX_PATH = 4096
"""Bound on ``checkpoint.path`` (Linux's PATH_MAX)."""
MAX_URI = 2048
"""Bound on ``checkpoint.uri`` (the TrainingJob field's bound)."""
URI_SCHEMES = ("s3",)
"""Schemes ``checkpoint.uri`` may use: those the worker image has an fsspec client for."""
MAX_FILE_BYTES = 1 << 20
"""Bound on the assignment file (an annotation is at most 256 KiB)."""


class AssignmentError(ValueError):
    """The assignment is malformed; the message names the field and what was expected."""


@dataclass(frozen=True)
class RankCoord:
    """Where one global rank sits in the (dp, pp, tp) mesh."""

    rank: int
    dp_rank: int
    tp_rank: int
    pp_stage: int


@dataclass(frozen=True)
class StageLayers:
    """The transformer layers ``[start, stop)`` of one (virtual) pipeline stage."""

    stage: int
    start: int
    stop: int


def default_coords(dp: int, tp: int, pp: int) -> tuple[RankCoord, ...]:
    """The planner's rank order: tensor parallel innermost, then stages, data parallel outermost.

    ``rank = (dpRank * pp + ppStage) * tp + tpRank``: a pod's consecutive ranks form its
    tensor-parallel group, pipeline stages span pods, replicas span groups of pods.
    """
    return tuple(
        RankCoord(rank=r, dp_rank=r // (tp * pp), tp_rank=r % tp, pp_stage=(r // tp) % pp)
        for r in range(dp * tp * pp)
    )


def default_schedule(pp: int, virtual_stages: int) -> Schedule:
    """1F1B for a pipeline, its interleaved form with virtual stages (GPipe only on request)."""
    return "interleaved1f1b" if virtual_stages > 1 else "1f1b"


@dataclass(frozen=True)
class ParallelPlan:
    """The parallel plan, whole: everything a worker needs to build the layout the planner placed.

    ``batch_shares`` has one entry per data-parallel replica (sequences per step). ``ranks``
    gives every global rank's (dpRank, tpRank, ppStage); ``stages`` the layer range of each of
    the ``pp * virtual_stages`` (virtual) stages, stage ``s`` running on pipeline rank
    ``s % pp`` (the interleaved order). Both are empty in an assignment from before they
    existed, which then means the default rank order and an even split of the layers.
    """

    dp: int
    tp: int = 1
    pp: int = 1
    micro_batch_size: int = 1
    batch_shares: tuple[int, ...] = ()
    virtual_stages: int = 1
    schedule: Schedule = "1f1b"
    sharding: Sharding = "none"
    recompute: Recompute = "none"
    ranks: tuple[RankCoord, ...] = ()
    stages: tuple[StageLayers, ...] = ()

    @property
    def label(self) -> str:
        """A short name such as ``dp2tp2pp1`` (step logs, metrics)."""
        return f"dp{self.dp}tp{self.tp}pp{self.pp}"

    def coord(self, rank: int) -> RankCoord:
        """The mesh coordinates of global ``rank``."""
        coords = self.ranks or default_coords(self.dp, self.tp, self.pp)
        return coords[rank]


@dataclass(frozen=True)
class CheckpointPolicy:
    """Where and how often the job checkpoints.

    ``uri`` (``s3://bucket/prefix``), when set, is where the Session checkpoints (an object
    store every pod reaches); else ``path``, a directory (a shared volume).
    """

    path: str
    interval_seconds: int = 300
    keep: int = 3
    interval_steps: int = 0
    uri: str = ""
    asynchronous: bool = True
    """Periodic saves copy the state to host memory and are written by a background thread
    (``Checkpointer.save_async``); false: the whole save blocks training."""


@dataclass(frozen=True)
class Assignment:
    """One pod's place in one world version (see the module docstring for the JSON form)."""

    job: str
    world_version: int
    rank: int
    world_size: int
    master_addr: str
    master_port: int
    plan: ParallelPlan
    global_batch_size: int
    checkpoint: CheckpointPolicy
    local_world_size: int = 1
    consistency: Consistency = "none"
    seed: int = 0
    stop: bool = False
    stop_at_step: int | None = None
    precision: Precision = DEFAULT_PRECISION
    gpus: int = 0
    """GPUs of this pod (``worker.gpus``); 0: a CPU pod."""
    peers_lost: bool = False
    """This world replaces one whose members were lost or failed (see the module doc)."""
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def waiting(self) -> bool:
        """True when the pod is in no world (``worldSize: 0``) and should wait."""
        return self.world_size == 0

    def for_local_rank(self, local_rank: int) -> Assignment:
        """The same assignment seen by the pod's ``local_rank``-th trainer."""
        return replace(self, rank=self.rank + local_rank)

    def to_json(self) -> str:
        """Serialise back to the wire format (camelCase keys, no spaces: it rides in a pod)."""
        return json.dumps(to_wire(self), sort_keys=True, separators=(",", ":"))


def session_env(a: Assignment, local_rank: int) -> dict[str, str]:
    """The variables that place a Session trainer of the pod in world ``a``: set by the agent
    when it starts one, and by the trainer itself when it enters the next world in its own
    process (``session/rerun.py``)."""
    return {
        "RANK": str(a.rank + local_rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(a.world_size),
        "LOCAL_WORLD_SIZE": str(a.local_world_size),
        "MASTER_ADDR": a.master_addr,
        "MASTER_PORT": str(a.master_port),
        "ELASTRA_WORLD_VERSION": str(a.world_version),
        ASSIGNMENT_JSON_ENV: a.to_json(),
    }


def plan_to_wire(plan: ParallelPlan) -> dict[str, Any]:
    """The ``plan`` object of the wire format."""
    return {
        "dp": plan.dp,
        "tp": plan.tp,
        "pp": plan.pp,
        "microBatchSize": plan.micro_batch_size,
        "batchShares": list(plan.batch_shares),
        "virtualStages": plan.virtual_stages,
        "schedule": plan.schedule,
        "sharding": plan.sharding,
        "recompute": plan.recompute,
        "ranks": [
            {"rank": c.rank, "dpRank": c.dp_rank, "tpRank": c.tp_rank, "ppStage": c.pp_stage}
            for c in plan.ranks
        ],
        "stages": [{"stage": s.stage, "layers": [s.start, s.stop]} for s in plan.stages],
    }


def compact_plan_to_wire(plan: ParallelPlan) -> dict[str, Any]:
    """``plan_to_wire`` without what the reader derives: no ``ranks`` when the plan has none
    (the default order), no ``batchShares`` when they are equal (an even split), and no field
    that holds the value the reader assumes when it is absent.

    The assignment rides in a pod annotation, and every watcher of pods (scheduler, kubelet,
    operator) receives the whole pod on each change: for 64 ranks the two lists were about
    5 KB of a 7.8 KB pod. Parsing gives back the same plan.
    """
    wire = plan_to_wire(plan)
    if not plan.ranks:
        del wire["ranks"]
    if len(plan.batch_shares) == plan.dp and len(set(plan.batch_shares)) == 1:
        del wire["batchShares"]
    if plan.schedule == default_schedule(plan.pp, plan.virtual_stages):
        del wire["schedule"]
    return _without_defaults(wire, _PLAN_DEFAULTS)


_PLAN_DEFAULTS: dict[str, Any] = {
    "tp": 1, "pp": 1, "microBatchSize": 1, "virtualStages": 1, "sharding": "none",
    "recompute": "none", "stages": [],
}  # fmt: skip
"""What ``_parse_plan`` reads for an absent plan field (``dp`` follows ``worldSize``: kept)."""

_CHECKPOINT_DEFAULTS: dict[str, Any] = {
    "intervalSeconds": 300, "keep": 3, "intervalSteps": 0, "asynchronous": True,
}  # fmt: skip
"""What ``parse_assignment`` reads for an absent ``checkpoint`` field."""


def _without_defaults(wire: dict[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``wire`` less the fields whose value the reader would assume anyway."""
    return {k: v for k, v in wire.items() if k not in defaults or defaults[k] != v}


def to_wire(a: Assignment) -> dict[str, Any]:
    """The JSON object the operator writes for ``a``: every top-level field (what tools read:
    ``stop``, ``worldVersion``), and the plan and checkpoint without fields at the value the
    reader assumes (the annotation is part of every pod write and watch event)."""
    checkpoint = {
        "path": a.checkpoint.path,
        "intervalSeconds": a.checkpoint.interval_seconds,
        "keep": a.checkpoint.keep,
        "intervalSteps": a.checkpoint.interval_steps,
        "asynchronous": a.checkpoint.asynchronous,
        **({"uri": a.checkpoint.uri} if a.checkpoint.uri else {}),
    }
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "job": a.job,
        "worldVersion": a.world_version,
        "rank": a.rank,
        "worldSize": a.world_size,
        "masterAddr": a.master_addr,
        "masterPort": a.master_port,
        "localWorldSize": a.local_world_size,
        "plan": compact_plan_to_wire(a.plan),
        "globalBatchSize": a.global_batch_size,
        "consistency": a.consistency,
        "seed": a.seed,
        "checkpoint": _without_defaults(checkpoint, _CHECKPOINT_DEFAULTS),
        "stopAtStep": a.stop_at_step,
        "stop": a.stop,
        "precision": a.precision,
        "gpus": a.gpus,
        "peersLost": a.peers_lost,
    }


def _get(obj: Mapping[str, Any], key: str, kind: type, where: str, default: Any = ...) -> Any:
    if key not in obj or obj[key] is None:
        if default is ...:
            raise AssignmentError(f"{where}{key}: required field is missing")
        return default
    value = obj[key]
    # bool is an int subclass: refuse true/false where a number is expected.
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise AssignmentError(f"{where}{key}: expected an integer, got {value!r}")
    if not isinstance(value, kind):
        raise AssignmentError(f"{where}{key}: expected {kind.__name__}, got {value!r}")
    return value


def _nonneg(value: int, name: str) -> int:
    if value < 0:
        raise AssignmentError(f"{name}: must be >= 0, got {value}")
    return value


def _positive(value: int, name: str) -> int:
    if value < 1:
        raise AssignmentError(f"{name}: must be >= 1, got {value}")
    return value


_PLAN = ("plan.", _PLAN_DEFAULTS)
_CHECKPOINT = ("checkpoint.", _CHECKPOINT_DEFAULTS)


def _defaulted(
    obj: Mapping[str, Any],
    key: str,
    section: tuple[str, Mapping[str, Any]],
    *,
    check: Callable[[int, str], int] = _positive,
) -> int:
    """An integer field of ``section`` (its prefix and defaults), passed through ``check``: the
    default the writer leaves out is the one read here."""
    where, defaults = section
    return check(_get(obj, key, int, where, defaults[key]), where + key)


def _string(obj: Mapping[str, Any], key: str, where: str, limit: int, default: Any = ...) -> str:
    """A string field of at most ``limit`` characters, without NUL (it may become a path)."""
    value: str = _get(obj, key, str, where, default)
    if len(value) > limit:
        raise AssignmentError(f"{where}{key}: {len(value)} characters, at most {limit}")
    if "\0" in value:
        raise AssignmentError(f"{where}{key}: contains a NUL character")
    return value


def _job_name(data: Mapping[str, Any]) -> str:
    """The job's name: it names the job's checkpoint directory, so one plain path component."""
    job = _string(data, "job", "", MAX_NAME)
    if not job or "/" in job or job in (".", ".."):
        raise AssignmentError(f"job: expected a non-empty name without '/', got {job!r}")
    return job


def _checkpoint_path(raw: Mapping[str, Any]) -> str:
    """``checkpoint.path``: absolute, no ``..``; returned normalised (``""`` when absent)."""
    path = _string(raw, "path", "checkpoint.", MAX_PATH, "")
    if not path:
        return ""
    if not os.path.isabs(path) or ".." in path.split("/"):
        raise AssignmentError(
            f"checkpoint.path: expected an absolute path without '..', got {path[:200]!r}"
        )
    return os.path.normpath(path)


def split_checkpoint_uri(uri: str) -> tuple[str, str, str]:
    """``(scheme, bucket, prefix)`` of a checkpoint URI; ValueError saying what is wrong.

    The prefix is normalised (no empty components) and never climbs (``..``), so a job's
    root, ``prefix/<job>``, stays under the prefix the user gave.
    """
    scheme, sep, rest = uri.partition("://")
    if not sep or scheme not in URI_SCHEMES:
        raise ValueError(f"unsupported scheme {scheme!r} (supported: {', '.join(URI_SCHEMES)})")
    bucket, _, prefix = rest.partition("/")
    parts = [p for p in prefix.split("/") if p]
    if not bucket or any(p in (".", "..") for p in parts) or "\0" in uri:
        raise ValueError(f"expected {scheme}://BUCKET[/PREFIX] without '..', got {uri[:200]!r}")
    return scheme, bucket, "/".join(parts)


def job_checkpoint_uri(uri: str, job: str) -> str:
    """``<uri>/<job>``: the job's own prefix under ``checkpoint.uri`` (one bucket prefix may
    hold several jobs), as ``objectstore.ObjectCheckpointRoot`` and torchrun mode's
    ``$ELASTRA_CHECKPOINT_URI`` name it. ValueError for a bad URI or job name."""
    if not job or "/" in job or "\0" in job or job in (".", ".."):
        raise ValueError(f"job name {job[:80]!r} cannot name a prefix")
    scheme, bucket, prefix = split_checkpoint_uri(uri)
    return f"{scheme}://" + "/".join(p for p in (bucket, prefix, job) if p)


def _checkpoint_uri(raw: Mapping[str, Any]) -> str:
    """``checkpoint.uri``: ``s3://bucket[/prefix]``, returned normalised (``""`` when absent)."""
    uri = _string(raw, "uri", "checkpoint.", MAX_URI, "")
    if not uri:
        return ""
    try:
        scheme, bucket, prefix = split_checkpoint_uri(uri)
    except ValueError as err:
        raise AssignmentError(f"checkpoint.uri: {err}") from None
    return f"{scheme}://{bucket}/{prefix}" if prefix else f"{scheme}://{bucket}"


def _choice(raw: Mapping[str, Any], key: str, allowed: tuple[str, ...], default: str) -> Any:
    value = _get(raw, key, str, "plan.", default)
    if value not in allowed:
        raise AssignmentError(f"plan.{key}: expected one of {', '.join(allowed)}, got {value!r}")
    return value


def _int_list(raw: Mapping[str, Any], key: str) -> list[int]:
    items = _get(raw, key, list, "plan.", [])
    if len(items) > MAX_RANKS:
        raise AssignmentError(f"plan.{key}: {len(items)} entries, at most {MAX_RANKS}")
    for i, s in enumerate(items):
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise AssignmentError(f"plan.{key}[{i}]: expected an integer >= 0, got {s!r}")
    return list(items)


def _parse_coords(raw: Mapping[str, Any], dp: int, tp: int, pp: int) -> tuple[RankCoord, ...]:
    items = _get(raw, "ranks", list, "plan.", [])
    if not items:
        return ()
    if len(items) != dp * tp * pp:
        raise AssignmentError(f"plan.ranks: has {len(items)} entries, dp*tp*pp is {dp * tp * pp}")
    coords = []
    for i, item in enumerate(items):
        where = f"plan.ranks[{i}]."
        if not isinstance(item, dict):
            raise AssignmentError(f"plan.ranks[{i}]: expected an object, got {item!r}")
        coord = RankCoord(
            rank=_get(item, "rank", int, where, i),
            dp_rank=_get(item, "dpRank", int, where),
            tp_rank=_get(item, "tpRank", int, where),
            pp_stage=_get(item, "ppStage", int, where),
        )
        bounds = {"rank": (coord.rank, dp * tp * pp), "dpRank": (coord.dp_rank, dp),
                  "tpRank": (coord.tp_rank, tp), "ppStage": (coord.pp_stage, pp)}  # fmt: skip
        for name, (value, limit) in bounds.items():
            if not 0 <= value < limit:
                raise AssignmentError(f"{where}{name}: expected 0..{limit - 1}, got {value}")
        if coord.rank != i:
            raise AssignmentError(f"{where}rank: entries must be in rank order, got {coord.rank}")
        coords.append(coord)
    if len({(c.dp_rank, c.tp_rank, c.pp_stage) for c in coords}) != len(coords):
        raise AssignmentError("plan.ranks: two ranks share the same (dpRank, tpRank, ppStage)")
    return tuple(coords)


def _parse_stages(raw: Mapping[str, Any], count: int) -> tuple[StageLayers, ...]:
    items = _get(raw, "stages", list, "plan.", [])
    if not items:
        return ()
    if len(items) > MAX_RANKS:
        raise AssignmentError(f"plan.stages: {len(items)} entries, at most {MAX_RANKS}")
    if len(items) != count:
        raise AssignmentError(f"plan.stages: has {len(items)} entries, pp*virtualStages is {count}")
    stages = []
    expected_start = 0
    for i, item in enumerate(items):
        where = f"plan.stages[{i}]"
        layers = item.get("layers") if isinstance(item, dict) else None
        if not (
            isinstance(layers, list)
            and len(layers) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) for x in layers)
        ):
            raise AssignmentError(f"{where}.layers: expected [start, stop], got {layers!r}")
        start, stop = int(layers[0]), int(layers[1])
        if start != expected_start or stop < start:
            raise AssignmentError(
                f"{where}.layers: expected [{expected_start}, stop >= {expected_start}] "
                f"(stages cover the layers in order), got {layers!r}"
            )
        stages.append(StageLayers(stage=i, start=start, stop=stop))
        expected_start = stop
    return tuple(stages)


def _parse_plan(raw: Mapping[str, Any], world_size: int, global_batch: int) -> ParallelPlan:
    dp = _positive(_get(raw, "dp", int, "plan.", max(world_size, 1)), "plan.dp")
    tp, pp = _defaulted(raw, "tp", _PLAN), _defaulted(raw, "pp", _PLAN)
    mbs = _defaulted(raw, "microBatchSize", _PLAN)
    vpp = _defaulted(raw, "virtualStages", _PLAN)
    shares = _int_list(raw, "batchShares")
    if world_size > 0:
        if dp * tp * pp != world_size:
            raise AssignmentError(
                f"plan: dp*tp*pp = {dp}*{tp}*{pp} = {dp * tp * pp} but worldSize is {world_size}"
            )
        if not shares:
            if global_batch % dp:
                raise AssignmentError(
                    f"plan.batchShares is empty and globalBatchSize {global_batch} is not "
                    f"divisible by dp {dp}: give explicit shares"
                )
            shares = [global_batch // dp] * dp
        if len(shares) != dp:
            raise AssignmentError(f"plan.batchShares: has {len(shares)} entries, dp is {dp}")
        if sum(shares) != global_batch:
            raise AssignmentError(
                f"plan.batchShares: sums to {sum(shares)}, globalBatchSize is {global_batch}"
            )
    if vpp > MAX_RANKS:
        raise AssignmentError(f"plan.virtualStages: {vpp} is above the bound {MAX_RANKS}")
    if vpp > 1 and pp == 1:
        raise AssignmentError(f"plan.virtualStages: {vpp} needs pp > 1 (pp is 1)")
    return ParallelPlan(
        dp=dp,
        tp=tp,
        pp=pp,
        micro_batch_size=mbs,
        batch_shares=tuple(shares),
        virtual_stages=vpp,
        schedule=_choice(raw, "schedule", SCHEDULES, default_schedule(pp, vpp)),
        sharding=_choice(raw, "sharding", SHARDINGS, _PLAN_DEFAULTS["sharding"]),
        recompute=_choice(raw, "recompute", RECOMPUTES, _PLAN_DEFAULTS["recompute"]),
        ranks=_parse_coords(raw, dp, tp, pp) if world_size > 0 else (),
        stages=_parse_stages(raw, pp * vpp),
    )


def parse_assignment(data: Mapping[str, Any] | str) -> Assignment:
    """Validate the JSON (text or decoded) and return the assignment; raise AssignmentError."""
    if isinstance(data, str):
        try:
            decoded = json.loads(data)
        except (ValueError, RecursionError) as err:  # RecursionError: nesting too deep
            raise AssignmentError(f"assignment is not valid JSON: {err}") from err
        if not isinstance(decoded, dict):
            raise AssignmentError("assignment must be a JSON object")
        data = cast(dict[str, Any], decoded)
    api = data.get("apiVersion", API_VERSION)
    if api != API_VERSION:
        raise AssignmentError(f"apiVersion: expected {API_VERSION!r}, got {api!r}")
    kind = data.get("kind", KIND)
    if kind != KIND:
        raise AssignmentError(f"kind: expected {KIND!r}, got {kind!r}")
    world_size = _nonneg(_get(data, "worldSize", int, "", 0), "worldSize")
    if world_size > MAX_RANKS:
        raise AssignmentError(f"worldSize: {world_size} is above the bound {MAX_RANKS}")
    stop = _get(data, "stop", bool, "", False)
    job = _job_name(data)
    version = _nonneg(_get(data, "worldVersion", int, ""), "worldVersion")
    consistency = _get(data, "consistency", str, "", "none")
    if consistency not in CONSISTENCIES:
        raise AssignmentError(f"consistency: expected one of {CONSISTENCIES}, got {consistency!r}")
    precision = _get(data, "precision", str, "", DEFAULT_PRECISION)
    if precision not in PRECISIONS:
        raise AssignmentError(f"precision: expected one of {PRECISIONS}, got {precision!r}")
    gpus = _nonneg(_get(data, "gpus", int, "", 0), "gpus")
    if gpus > MAX_GPUS:
        raise AssignmentError(f"gpus: {gpus} is above the bound {MAX_GPUS}")
    ckpt_raw = _get(data, "checkpoint", dict, "", {})
    checkpoint = CheckpointPolicy(
        path=_checkpoint_path(ckpt_raw),
        interval_seconds=_defaulted(ckpt_raw, "intervalSeconds", _CHECKPOINT, check=_nonneg),
        keep=_defaulted(ckpt_raw, "keep", _CHECKPOINT),
        interval_steps=_defaulted(ckpt_raw, "intervalSteps", _CHECKPOINT, check=_nonneg),
        uri=_checkpoint_uri(ckpt_raw),
        asynchronous=_get(
            ckpt_raw, "asynchronous", bool, "checkpoint.", _CHECKPOINT_DEFAULTS["asynchronous"]
        ),
    )
    global_batch = _get(data, "globalBatchSize", int, "", 0)
    stop_at = _get(data, "stopAtStep", int, "", None)
    if world_size == 0:
        # A waiting pod: only the identity fields matter.
        return Assignment(
            job=job,
            world_version=version,
            rank=0,
            world_size=0,
            master_addr="",
            master_port=0,
            plan=ParallelPlan(dp=1),
            global_batch_size=max(global_batch, 0),
            checkpoint=checkpoint,
            consistency=consistency,
            stop=stop,
            precision=precision,
            gpus=gpus,
        )
    if not checkpoint.path and not checkpoint.uri:
        raise AssignmentError("checkpoint.path: required for a pod in a world (or checkpoint.uri)")
    _positive(global_batch, "globalBatchSize")
    local = _positive(_get(data, "localWorldSize", int, "", 1), "localWorldSize")
    rank = _nonneg(_get(data, "rank", int, ""), "rank")
    if rank + local > world_size:
        raise AssignmentError(
            f"rank: {rank} + localWorldSize {local} exceeds worldSize {world_size}"
        )
    port = _get(data, "masterPort", int, "")
    if not 0 < port < 65536:
        raise AssignmentError(f"masterPort: expected 1..65535, got {port}")
    addr = _string(data, "masterAddr", "", MAX_NAME)
    if not addr:
        raise AssignmentError("masterAddr: must not be empty")
    plan = _parse_plan(_get(data, "plan", dict, "", {}), world_size, global_batch)
    if consistency == "bitwise":
        bad = [s for s in plan.batch_shares if s % plan.micro_batch_size]
        if global_batch % plan.micro_batch_size or bad:
            raise AssignmentError(
                "consistency bitwise: globalBatchSize and every plan.batchShares entry must be "
                f"multiples of plan.microBatchSize {plan.micro_batch_size} (the logical share)"
            )
    if stop_at is not None:
        _nonneg(stop_at, "stopAtStep")
    known = {
        "apiVersion", "kind", "job", "worldVersion", "rank", "worldSize", "masterAddr",
        "masterPort", "localWorldSize", "plan", "globalBatchSize", "consistency", "seed",
        "checkpoint", "stop", "stopAtStep", "precision", "gpus", "peersLost",
    }  # fmt: skip
    return Assignment(
        job=job,
        world_version=version,
        rank=rank,
        world_size=world_size,
        master_addr=addr,
        master_port=port,
        plan=plan,
        global_batch_size=global_batch,
        checkpoint=checkpoint,
        local_world_size=local,
        consistency=consistency,
        seed=_get(data, "seed", int, "", 0),
        stop=stop,
        stop_at_step=stop_at,
        precision=precision,
        gpus=gpus,
        peers_lost=_get(data, "peersLost", bool, "", False),
        extra={k: v for k, v in data.items() if k not in known},
    )


def assignment_path(environ: Mapping[str, str] = os.environ) -> Path:
    """Where the downward-API file is: ``$ELASTRA_ASSIGNMENT_FILE`` or the default path."""
    return Path(environ.get(ASSIGNMENT_FILE_ENV) or DEFAULT_ASSIGNMENT_FILE)


def read_assignment_file(path: Path) -> Assignment | None:
    """The assignment in ``path``; None when the file is absent or empty (the pod waits).

    A downward-API file is replaced atomically through a symlink swap, so one read sees either
    the old or the new content, never a mix. Anything else that keeps it from being read (a
    directory in its place, no permission, not UTF-8, too large) is an AssignmentError: a
    permanent error with a message, not a traceback.
    """
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
        text = raw.decode("utf-8")
    except FileNotFoundError:
        return None
    except OSError as err:
        raise AssignmentError(f"assignment file {path}: cannot read it: {err.strerror}") from err
    except UnicodeDecodeError as err:
        raise AssignmentError(f"assignment file {path}: not UTF-8 ({err.reason})") from err
    if len(raw) > MAX_FILE_BYTES:
        raise AssignmentError(f"assignment file {path}: larger than {MAX_FILE_BYTES} bytes")
    if not text.strip():
        return None
    return parse_assignment(text)


def assignment_from_env(environ: Mapping[str, str] = os.environ) -> Assignment:
    """An assignment built from torchrun-style variables, for runs without the operator.

    ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` (torchrun's names), plus
    ``ELASTRA_JOB``, ``ELASTRA_GLOBAL_BATCH_SIZE``, ``ELASTRA_MICRO_BATCH_SIZE``,
    ``ELASTRA_CONSISTENCY``, ``ELASTRA_PRECISION``, ``ELASTRA_SEED``, ``ELASTRA_CHECKPOINT_DIR``,
    ``ELASTRA_CHECKPOINT_INTERVAL_SECONDS``, ``ELASTRA_CHECKPOINT_URI`` (checkpoints in an
    object store instead of the directory), ``ELASTRA_LOCAL_WORLD_SIZE`` and
    ``ELASTRA_POD_GPUS``. A relative checkpoint directory is taken from the current directory.
    """

    def num(name: str, default: int) -> int:
        raw = environ.get(name, "")
        if not raw:
            return default
        try:
            return int(raw)
        except ValueError as err:
            raise AssignmentError(f"${name}: expected an integer, got {raw!r}") from err

    world = num("WORLD_SIZE", 1)
    local = num("ELASTRA_LOCAL_WORLD_SIZE", 1)
    batch = num("ELASTRA_GLOBAL_BATCH_SIZE", 8 * world)
    return parse_assignment(
        {
            "job": environ.get("ELASTRA_JOB", "local"),
            "worldVersion": num("ELASTRA_WORLD_VERSION", 0),
            "rank": num("RANK", 0) - num("LOCAL_RANK", 0),
            "worldSize": world,
            "localWorldSize": local,
            "masterAddr": environ.get("MASTER_ADDR", "127.0.0.1"),
            "masterPort": num("MASTER_PORT", 29500),
            "plan": {"dp": world, "microBatchSize": num("ELASTRA_MICRO_BATCH_SIZE", 1)},
            "globalBatchSize": batch,
            "consistency": environ.get("ELASTRA_CONSISTENCY", "none"),
            "precision": environ.get(PRECISION_ENV) or DEFAULT_PRECISION,
            "gpus": num(POD_GPUS_ENV, 0),
            "seed": num("ELASTRA_SEED", 0),
            "checkpoint": {
                "path": os.path.abspath(environ.get("ELASTRA_CHECKPOINT_DIR", "checkpoints")),
                "intervalSeconds": num("ELASTRA_CHECKPOINT_INTERVAL_SECONDS", 300),
                "intervalSteps": num("ELASTRA_CHECKPOINT_INTERVAL_STEPS", 0),
                "keep": num("ELASTRA_CHECKPOINT_KEEP", 3),
                "uri": environ.get("ELASTRA_CHECKPOINT_URI") or None,
            },
        }
    )


def split_layers(layers: int, stages: int) -> tuple[StageLayers, ...]:
    """An even split of ``layers`` over ``stages`` (virtual) stages, earlier stages one more.

    The one place the default split is computed: the planner uses it for the plans it places
    and the worker for an assignment that gives no ``stages``.
    """
    if stages < 1 or layers < stages:
        raise AssignmentError(f"cannot split {layers} layers over {stages} pipeline stages")
    base, extra = divmod(layers, stages)
    out, start = [], 0
    for s in range(stages):
        stop = start + base + (1 if s < extra else 0)
        out.append(StageLayers(stage=s, start=start, stop=stop))
        start = stop
    return tuple(out)
