"""The assignment: what the operator tells one worker pod about the world it belongs to.

The operator writes it as JSON into the pod annotation ``elastra.dev/assignment``; a downward-API
volume shows it to the pod as a file (``/etc/elastra/assignment`` unless ``ELASTRA_ASSIGNMENT_FILE``
says otherwise). This module is the single place that knows the format: it parses and validates
it into frozen dataclasses and fails with a message that names the bad field, so a malformed
annotation is a clear permanent error (exit code 2), never a half-started world.

Format (``elastra.dev/v1alpha1``, kind ``Assignment``)::

    {"apiVersion": "elastra.dev/v1alpha1", "kind": "Assignment",
     "job": "gpt", "worldVersion": 3, "rank": 0, "worldSize": 4,
     "masterAddr": "gpt-w-0.gpt", "masterPort": 29500, "localWorldSize": 1,
     "plan": {"dp": 4, "tp": 1, "pp": 1, "microBatchSize": 2, "batchShares": [8, 8, 8, 8]},
     "globalBatchSize": 32, "consistency": "none", "seed": 0,
     "checkpoint": {"path": "/ckpt", "intervalSeconds": 300, "keep": 3, "intervalSteps": 0},
     "stopAtStep": null, "stop": false}

``rank`` and ``worldSize`` count trainer processes (pods x ``localWorldSize``); ``rank`` is the
global rank of the pod's first trainer. ``worldSize: 0`` (or no file at all) means the pod is in
no world and waits. ``stop: true`` asks the pod to checkpoint and exit 0 (suspend, shrink-out).
``checkpoint.intervalSteps`` (0 = off) and ``stopAtStep`` (null = none) are optional additions
to the first draft of the contract: a step-based checkpoint interval, and a step at which the
world stops on its own (checkpoint, exit 0) so a planned resize lands on an exact step.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, cast

API_VERSION = "elastra.dev/v1alpha1"
KIND = "Assignment"
DEFAULT_ASSIGNMENT_FILE = "/etc/elastra/assignment"
ASSIGNMENT_FILE_ENV = "ELASTRA_ASSIGNMENT_FILE"

Consistency = Literal["none", "data", "bitwise"]
CONSISTENCIES: tuple[Consistency, ...] = ("none", "data", "bitwise")


class AssignmentError(ValueError):
    """The assignment is malformed; the message names the field and what was expected."""


@dataclass(frozen=True)
class Plan:
    """The parallel plan: degrees and how many sequences each data-parallel rank takes."""

    dp: int
    tp: int = 1
    pp: int = 1
    micro_batch_size: int = 1
    batch_shares: tuple[int, ...] = ()


@dataclass(frozen=True)
class CheckpointSpec:
    """Where and how often the job checkpoints; ``path`` is the job's own checkpoint root."""

    path: str
    interval_seconds: int = 300
    keep: int = 3
    interval_steps: int = 0


@dataclass(frozen=True)
class Assignment:
    """One pod's place in one world version (see the module docstring for the JSON form)."""

    job: str
    world_version: int
    rank: int
    world_size: int
    master_addr: str
    master_port: int
    plan: Plan
    global_batch_size: int
    checkpoint: CheckpointSpec
    local_world_size: int = 1
    consistency: Consistency = "none"
    seed: int = 0
    stop: bool = False
    stop_at_step: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def waiting(self) -> bool:
        """True when the pod is in no world (``worldSize: 0``) and should wait."""
        return self.world_size == 0

    def for_local_rank(self, local_rank: int) -> Assignment:
        """The same assignment seen by the pod's ``local_rank``-th trainer."""
        return replace(self, rank=self.rank + local_rank)

    def to_json(self) -> str:
        """Serialise back to the wire format (camelCase keys)."""
        return json.dumps(to_wire(self), sort_keys=True)


def to_wire(a: Assignment) -> dict[str, Any]:
    """The JSON object the operator writes for ``a``."""
    plan = asdict(a.plan)
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
        "plan": {
            "dp": plan["dp"],
            "tp": plan["tp"],
            "pp": plan["pp"],
            "microBatchSize": plan["micro_batch_size"],
            "batchShares": list(plan["batch_shares"]),
        },
        "globalBatchSize": a.global_batch_size,
        "consistency": a.consistency,
        "seed": a.seed,
        "checkpoint": {
            "path": a.checkpoint.path,
            "intervalSeconds": a.checkpoint.interval_seconds,
            "keep": a.checkpoint.keep,
            "intervalSteps": a.checkpoint.interval_steps,
        },
        "stopAtStep": a.stop_at_step,
        "stop": a.stop,
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


def _parse_plan(raw: Mapping[str, Any], world_size: int, global_batch: int) -> Plan:
    dp = _positive(_get(raw, "dp", int, "plan.", max(world_size, 1)), "plan.dp")
    tp = _positive(_get(raw, "tp", int, "plan.", 1), "plan.tp")
    pp = _positive(_get(raw, "pp", int, "plan.", 1), "plan.pp")
    mbs = _positive(_get(raw, "microBatchSize", int, "plan.", 1), "plan.microBatchSize")
    shares_raw = _get(raw, "batchShares", list, "plan.", [])
    shares: list[int] = []
    for i, s in enumerate(shares_raw):
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise AssignmentError(f"plan.batchShares[{i}]: expected an integer >= 0, got {s!r}")
        shares.append(s)
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
    return Plan(dp=dp, tp=tp, pp=pp, micro_batch_size=mbs, batch_shares=tuple(shares))


def parse_assignment(data: Mapping[str, Any] | str) -> Assignment:
    """Validate the JSON (text or decoded) and return the assignment; raise AssignmentError."""
    if isinstance(data, str):
        try:
            decoded = json.loads(data)
        except json.JSONDecodeError as err:
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
    stop = _get(data, "stop", bool, "", False)
    job = _get(data, "job", str, "")
    if not job or "/" in job:
        raise AssignmentError(f"job: expected a non-empty name without '/', got {job!r}")
    version = _nonneg(_get(data, "worldVersion", int, ""), "worldVersion")
    consistency = _get(data, "consistency", str, "", "none")
    if consistency not in CONSISTENCIES:
        raise AssignmentError(f"consistency: expected one of {CONSISTENCIES}, got {consistency!r}")
    ckpt_raw = _get(data, "checkpoint", dict, "", {})
    checkpoint = CheckpointSpec(
        path=_get(ckpt_raw, "path", str, "checkpoint.", ""),
        interval_seconds=_nonneg(
            _get(ckpt_raw, "intervalSeconds", int, "checkpoint.", 300), "checkpoint.intervalSeconds"
        ),
        keep=_positive(_get(ckpt_raw, "keep", int, "checkpoint.", 3), "checkpoint.keep"),
        interval_steps=_nonneg(
            _get(ckpt_raw, "intervalSteps", int, "checkpoint.", 0), "checkpoint.intervalSteps"
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
            plan=Plan(dp=1),
            global_batch_size=max(global_batch, 0),
            checkpoint=checkpoint,
            consistency=consistency,
            stop=stop,
        )
    if not checkpoint.path:
        raise AssignmentError("checkpoint.path: required for a pod in a world")
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
    addr = _get(data, "masterAddr", str, "")
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
        "checkpoint", "stop", "stopAtStep",
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
        extra={k: v for k, v in data.items() if k not in known},
    )


def assignment_path(environ: Mapping[str, str] = os.environ) -> Path:
    """Where the downward-API file is: ``$ELASTRA_ASSIGNMENT_FILE`` or the default path."""
    return Path(environ.get(ASSIGNMENT_FILE_ENV) or DEFAULT_ASSIGNMENT_FILE)


def read_assignment_file(path: Path) -> Assignment | None:
    """The assignment in ``path``; None when the file is absent or empty (the pod waits).

    A downward-API file is replaced atomically through a symlink swap, so one read sees either
    the old or the new content, never a mix.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    if not text.strip():
        return None
    return parse_assignment(text)


def assignment_from_env(environ: Mapping[str, str] = os.environ) -> Assignment:
    """An assignment built from torchrun-style variables, for runs without the operator.

    ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` (torchrun's names), plus
    ``ELASTRA_JOB``, ``ELASTRA_GLOBAL_BATCH_SIZE``, ``ELASTRA_MICRO_BATCH_SIZE``,
    ``ELASTRA_CONSISTENCY``, ``ELASTRA_SEED``, ``ELASTRA_CHECKPOINT_DIR``,
    ``ELASTRA_CHECKPOINT_INTERVAL_SECONDS`` and ``ELASTRA_LOCAL_WORLD_SIZE``.
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
            "seed": num("ELASTRA_SEED", 0),
            "checkpoint": {
                "path": environ.get("ELASTRA_CHECKPOINT_DIR", "checkpoints"),
                "intervalSeconds": num("ELASTRA_CHECKPOINT_INTERVAL_SECONDS", 300),
                "intervalSteps": num("ELASTRA_CHECKPOINT_INTERVAL_STEPS", 0),
                "keep": num("ELASTRA_CHECKPOINT_KEEP", 3),
            },
        }
    )
