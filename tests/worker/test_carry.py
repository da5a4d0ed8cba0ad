"""Resizes in memory: survivors keep their processes and state, joiners take it from them.

Each case runs one schedule twice under the local launcher (data mode, CPU gloo): as the agent
does by default, where trainers whose pod stays move to the next world in their own processes,
and with ``ELASTRA_IN_MEMORY_RESIZE=0``, where every world change restarts the trainers and
reads the committed checkpoint back (the path through the volume). Both must train steps
0..N once each on the static run's samples, with losses within 1e-5 of each other; the first
run's new worlds must say where their state came from and, observed by an audit hook in every
trainer (``audited_trainer.py``), open no file of a committed checkpoint for reading.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from elastra_worker.agent import IN_MEMORY_RESIZE_ENV
from elastra_worker.assignment import Assignment, AssignmentError, parse_assignment
from elastra_worker.launcher import LocalJob
from elastra_worker.layout import Manifest, job_root, step_dir_name
from elastra_worker.session.carry import offered_after, why_not_carried
from elastra_worker.session.data import DataPosition
from elastra_worker.session.model import CPU_DDP_ENV, REBINDABLE_ATTR, ModelParts
from elastra_worker.session.world import World

from .conftest import STEPS, LocalRun, run_local

AUDITED = Path(__file__).resolve().parent / "audited_trainer.py"
RESIZE_AT = 10
MICRO_BATCH = 2
"""The local launcher's default micro-batch size (``--micro-batch-size``)."""


@dataclass(frozen=True)
class Case:
    name: str
    schedule: str
    state_from: str
    """Where rank 0 of the second world says its state came from."""
    says: tuple[str, ...]
    """Lines of the in-memory run's output that show the path taken."""
    env: dict[str, str] = field(default_factory=dict)
    micro_batch_after: int = 2
    """The micro-batch size the second world's records say it trained with."""
    llama: bool = False
    """Train the reference trainer's Llama (``elastra_worker.train``), which has a tensor
    parallel layout and pipeline stages, instead of the example GPT."""
    stored: str = ""
    """A pattern of the only files of the checkpoint the in-memory run reads, if any: the part
    of the state a member that left held (the rest from the members' memory)."""
    held: bool = False
    """A survivor carries the whole state into the second world in its own process: the
    in-memory run's first world saves nothing at its stop, the second commits that step."""


SHRUNK = "rank 0 resumed step 10 from memory"
GROWN = "rank 1 resumed step 10 from peers (rank 0"
RERUN = "rank 0 runs its script again for world v2:"
RESHARDED = "resumed step 10 resharded from the members' memory"
REBUILT = "rank 0 rebuilt its DDP module over world v2"
HELD = "rank 0 holds step 10 in memory for the next world: no save at this stop"
"""Only a DDP module is rebuilt: a bare one (``ELASTRA_CPU_DDP`` ignored) would not say it."""

CASES = [
    Case("shrink", f"2:0,1:{RESIZE_AT}", "memory", (SHRUNK, HELD), held=True),
    Case("grow", f"1:0,2:{RESIZE_AT}", "memory", (GROWN, HELD), held=True),
    Case("plan change", f"2:0,2:{RESIZE_AT}:mb=1", "memory",  # micro-batches of 1, not 2
         ("rank 0 resumed step 10 from memory into a world of 2", HELD), micro_batch_after=1,
         held=True),
    # what cannot move in memory restarts through the checkpoint, saying why
    # a plan bound to its mesh: the script runs again in its process and the state comes,
    # resharded, from the members' memory; a member that left took its part: from storage
    Case("sharded grow", f"1:0:sharding=full,2:{RESIZE_AT}:sharding=full", "memory",
         (f"{RERUN} this world's plan dp1tp1pp1 (sharding full)", f"rank 1 {RESHARDED}")),
    Case("sharded plan change", f"2:0:sharding=full,2:{RESIZE_AT}", "memory",
         (f"{RERUN} this world's plan dp2tp1pp1 (sharding full)", f"rank 0 {RESHARDED}")),
    Case("tensor to pipeline", f"2:0:tp=2,2:{RESIZE_AT}:pp=2", "memory",
         (f"{RERUN} this world's plan dp1tp2pp1 (sharding none)", f"rank 0 {RESHARDED}"),
         llama=True),
    Case("pipeline grow", f"2:0:pp=2,4:{RESIZE_AT}:pp=2", "memory",
         (f"{RERUN} this world's plan dp1tp1pp2 (sharding none)", f"rank 3 {RESHARDED}"),
         llama=True),
    Case("sharded shrink", f"2:0:sharding=full,1:{RESIZE_AT}:sharding=full", "storage",
         (RERUN, f"rank 0 {RESHARDED} (0.0 MB from peers"), stored=r"\.metadata|__1_\d+\.distcp"),
    # a world that ends at its stop step keeps nothing unless its own plan needs the script
    Case("to sharded", f"2:0,2:{RESIZE_AT}:sharding=full", "storage",
         ("restarts for world v2: the next world's plan dp2tp1pp1 (sharding full) is tensor",)),
    Case("recompute", f"2:0,2:{RESIZE_AT}:recompute=full", "storage",
         ("restarts for world v2: the plan's recompute changes from none to full",)),
    # DDP, as GPU jobs run it (here on gloo): rebuilt over the new world in place
    Case("shrink ddp", f"2:0,1:{RESIZE_AT}", "memory", (SHRUNK, f"{REBUILT} (world size 1)"),
         env={CPU_DDP_ENV: "1"}, held=True),
    Case("grow ddp", f"1:0,2:{RESIZE_AT}", "memory", (GROWN, f"{REBUILT} (world size 2)"),
         env={CPU_DDP_ENV: "1"}, held=True),
]  # fmt: skip


LLAMA = {"layers": 4, "hiddenSize": 32, "ffnHiddenSize": 64, "attentionHeads": 4, "kvHeads": 2,
         "vocabSize": 97, "sequenceLength": 16}  # fmt: skip


def run(tmp: Path, case: Case, *, in_memory: bool) -> tuple[LocalRun, list[str]]:
    """The case's schedule under the audited trainer; the run and the checkpoint state files
    its trainers opened for reading."""
    tmp.mkdir(parents=True)
    audit = tmp / "reads.log"
    ckpt = tmp / "ckpt"
    trainer = [str(AUDITED), "--dataset-size", "500"]
    env = dict(case.env)
    if case.llama:
        model = tmp / "model.yaml"
        model.write_text(json.dumps(LLAMA))  # YAML reads JSON
        trainer += ["--model", str(model)]
        env["AUDIT_MODULE"] = "elastra_worker.train"
    result = run_local(
        tmp,
        case.schedule,
        consistency="data",
        checkpoint_dir=ckpt,
        trainer=trainer,
        env={
            IN_MEMORY_RESIZE_ENV: "1" if in_memory else "0",
            "AUDIT_ROOT": str(ckpt),
            "AUDIT_LOG": str(audit),
            "PYTHONPATH": str(AUDITED.parent),
            **env,
        },
        timeout=600,
    )
    assert result.returncode == 0, result.output[-12000:]  # stacks of a stalled rank included
    reads = audit.read_text().splitlines() if audit.exists() else []
    # a checkpoint's state: shards, DCP metadata, manifest (committing a save reads the
    # ``latest`` pointer beside them while it prunes; the job's first world finds no step)
    return result, [line for line in reads if "/step-" in line]


def committed_by(tmp: Path) -> int:
    """The world version that committed the checkpoint of step ``RESIZE_AT`` in a run."""
    step = job_root(tmp / "ckpt", LocalJob.job) / step_dir_name(RESIZE_AT)
    return Manifest.read(step).world_version


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_resize_in_memory_trains_what_the_volume_path_trains(
    tmp_path: Path, static_run: LocalRun, case: Case
) -> None:
    memory, memory_reads = run(tmp_path / "memory", case, in_memory=True)
    volume, volume_reads = run(tmp_path / "volume", case, in_memory=False)
    want = static_run.by_step()
    for path in (memory, volume):
        assert [r["step"] for r in path.records] == list(range(STEPS)), path.output[-3000:]
        for r in path.records:
            assert r["samples"] == want[r["step"]]["samples"], f"step {r['step']}: samples"
    for a, b in zip(memory.records, volume.records, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5), f"step {a['step']}: loss"
    first = memory.by_step()[RESIZE_AT]
    assert (first["worldVersion"], first["stateFrom"]) == (2, case.state_from)
    for path in (memory, volume):  # the new world's plan is the one it trains with
        before, after = path.by_step()[RESIZE_AT - 1], path.by_step()[RESIZE_AT]
        assert after["microBatchSize"] == case.micro_batch_after
        assert before["microBatchSize"] == MICRO_BATCH
    assert volume.by_step()[RESIZE_AT]["stateFrom"] == "storage"
    # who committed the step of the resize: the first world at its stop, or (held) the second
    assert committed_by(tmp_path / "memory") == (2 if case.held else 1)
    assert committed_by(tmp_path / "volume") == 1
    assert (f"rank 0 committed step {RESIZE_AT} (" in memory.output) is not case.held
    for line in case.says:
        assert line in memory.output, memory.output[-3000:]
    if not case.env:  # a bare module (CPU) is never rebuilt
        assert "rebuilt its DDP module" not in memory.output
    assert volume_reads, "the path through the volume read no checkpoint: the audit sees nothing"
    if case.state_from == "memory":
        assert memory_reads == [], f"read the checkpoint folder: {memory_reads[:5]}"
        assert "restored step" not in memory.output
    elif case.stored:
        names = {Path(line).name for line in memory_reads}
        assert all(re.fullmatch(case.stored, n) for n in names), sorted(names)
        assert any(n.endswith(".distcp") for n in names), sorted(names)
        assert "restored step" not in memory.output
    else:
        assert memory_reads, "a restart through the checkpoint read nothing"


def test_the_audit_hook_sees_reads_of_its_folder(tmp_path: Path) -> None:
    """The check above can fail: the hook records reads (and only reads) under its root."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "a").write_text("x")
    code = (
        "import os, sys; sys.path.insert(0, sys.argv[1]); import audited_trainer as t;"
        "fd = os.open(sys.argv[3], os.O_WRONLY | os.O_CREAT | os.O_APPEND);"
        "sys.addaudithook(t._reads(os.path.abspath(sys.argv[2]), fd));"
        "open(os.path.join(sys.argv[2], 'a')).read();"
        "open(os.path.join(sys.argv[2], 'b'), 'w').write('y');"
        "os.close(os.open(os.path.join(sys.argv[2], 'a'), os.O_RDONLY))"
    )
    log = tmp_path / "reads.log"
    subprocess.run(
        [sys.executable, "-c", code, str(AUDITED.parent), str(root), str(log)], check=True
    )
    reads = [re.sub(r"^\d+ ", "", line) for line in log.read_text().splitlines()]
    assert reads == [str(root / "a"), str(root / "a")]


def assignment(tmp: Path, version: int, **changes: Any) -> Assignment:
    raw: dict[str, Any] = {
        "job": "j", "worldVersion": version, "rank": 0, "worldSize": 2, "localWorldSize": 1,
        "masterAddr": "127.0.0.1", "masterPort": 1, "globalBatchSize": 8, "seed": 3,
        "consistency": "data", "plan": {"dp": 2, "microBatchSize": 2},
        "checkpoint": {"path": str(tmp)},
    }  # fmt: skip
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key] = {**raw[key], **value}
        else:
            raw[key] = value
    return parse_assignment(raw)


@pytest.mark.parametrize(
    ("next_world", "model", "sliced", "why"),
    [
        ({"worldSize": 4, "plan": {"dp": 4}}, "bare", False, None),
        ({"worldSize": 1, "plan": {"dp": 1, "microBatchSize": 1}}, "bare", False, None),
        ({"worldSize": 0}, "bare", False, "this pod is in no next world"),
        ({"stop": True}, "bare", False, "this pod is in no next world"),
        ({"localWorldSize": 2, "worldSize": 4, "plan": {"dp": 4}}, "bare", False,
         "the pod's trainers change from 1 to 2"),
        ({"plan": {"dp": 1, "tp": 2}}, "bare", False,
         "the next world's plan dp1tp2pp1 (sharding none) is tensor"),
        ({"plan": {"sharding": "full"}}, "bare", False,
         "the next world's plan dp2tp1pp1 (sharding full) is tensor"),
        ({"plan": {"recompute": "full"}}, "bare", False,
         "the plan's recompute changes from none to full"),
        ({}, "ddp", False, "the model is wrapped by the script (its own DDP, or FSDP)"),
        ({}, "ddp built by prepare()", False, None),
        ({}, "bare", True, "the script reads through sampler()/loader()"),
        ({"globalBatchSize": 16, "seed": 4}, "bare", False,
         "the next world changes seed, global_batch_size"),
        ({"precision": "bf16"}, "bare", False, "the next world changes precision"),
        ({"checkpoint": {"path": "/elsewhere"}}, "bare", False,
         "the next world changes checkpoint"),
    ],
)  # fmt: skip
def test_what_moves_in_memory_and_why_the_rest_restarts(
    tmp_path: Path, next_world: dict[str, Any], model: str, sliced: bool, why: str | None
) -> None:
    world = World(assignment(tmp_path, 1), local_rank=0, device=torch.device("cpu"),
                  rendezvous_timeout_s=1, collective_timeout_s=1)  # fmt: skip
    parts = ModelParts()
    module: torch.nn.Module = torch.nn.Linear(2, 2)
    if model.startswith("ddp"):
        module = torch.nn.parallel.DistributedDataParallel.__new__(
            torch.nn.parallel.DistributedDataParallel
        )  # the type is what is judged; a real one needs a process group
        torch.nn.Module.__init__(module)
        module.module = torch.nn.Linear(2, 2)
        if model == "ddp built by prepare()":
            object.__setattr__(module, REBINDABLE_ATTR, True)
    parts.adopt([module])
    data = DataPosition(world)
    data.sliced = sliced
    got = why_not_carried(world, parts, data, assignment(tmp_path, 2, **next_world))
    if why is None:
        assert got is None
    else:
        assert got is not None and got.startswith(why), got


@pytest.mark.parametrize(
    ("offer", "expected"),
    [
        (None, None),  # nothing offered: park
        ({"worldVersion": 1}, None),  # the offer that brought this trainer here: park on
        ({"worldVersion": 2}, 2),
        ("{not json", AssignmentError),  # unreadable: restart
    ],
)
def test_a_parked_trainer_takes_only_an_offer_of_a_later_world(
    tmp_path: Path,
    offer: dict[str, Any] | str | None,
    expected: int | type[AssignmentError] | None,
) -> None:
    world = World(assignment(tmp_path, 1), local_rank=0, device=torch.device("cpu"),
                  rendezvous_timeout_s=1, collective_timeout_s=1)  # fmt: skip
    raw = (
        assignment(tmp_path, offer["worldVersion"]).to_json() if isinstance(offer, dict) else offer
    )
    if expected is AssignmentError:
        with pytest.raises(AssignmentError):
            offered_after(world, raw)
        return
    got = offered_after(world, raw)
    assert (None if got is None else got.world_version) == expected
