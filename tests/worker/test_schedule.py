"""The local launcher's schedule: entries at steps and at times, plans, and every refusal.

Tables of (text -> segments) and (text -> error naming the entry); pure, no processes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from elastra_worker.assignment import Consistency, RankCoord, parse_assignment, plan_to_wire
from elastra_worker.schedule import (
    ModelBounds,
    PlanSpec,
    Segment,
    check_plans,
    even_shares,
    model_from_command,
    parse_schedule,
    plan_for,
)

GOOD = [
    ("4:0", 60, [Segment(4, "4:0", stop_at_step=60)]),
    (
        "4:0,2:20,3:40",
        60,
        [
            Segment(4, "4:0", stop_at_step=20),
            Segment(2, "2:20", start_step=20, stop_at_step=40),
            Segment(3, "3:40", start_step=40, stop_at_step=60),
        ],
    ),
    (
        "2:0,1:8s,2:16.5s",
        None,
        [
            Segment(2, "2:0", until_s=8.0),
            Segment(1, "1:8s", start_step=None, start_s=8.0, until_s=16.5),
            Segment(2, "2:16.5s", start_step=None, start_s=16.5),
        ],
    ),
    (
        "2:0,1:10s,3:20",
        30,
        [  # a world ended by a time still stops at the next step point
            Segment(2, "2:0", stop_at_step=20, until_s=10.0),
            Segment(1, "1:10s", start_step=None, start_s=10.0, stop_at_step=20),
            Segment(3, "3:20", start_step=20, stop_at_step=30),
        ],
    ),
    (
        "2:0,1:10s",
        30,
        [
            Segment(2, "2:0", stop_at_step=30, until_s=10.0),
            Segment(1, "1:10s", start_step=None, start_s=10.0, stop_at_step=30),
        ],
    ),
    (
        "2:0s,3:5",
        10,
        [
            Segment(2, "2:0s", start_step=None, start_s=0.0, stop_at_step=5),
            Segment(3, "3:5", start_step=5, stop_at_step=10),
        ],
    ),
    (
        "4:0,4:10:tp=2,4:20:pp=2/mb=1,8:30:tp=2/pp=2/sharding=full,2:40",
        50,
        [
            Segment(4, "4:0", stop_at_step=10),
            Segment(4, "4:10:tp=2", PlanSpec(tp=2), start_step=10, stop_at_step=20),
            Segment(4, "4:20:pp=2/mb=1", PlanSpec(pp=2, mb=1), start_step=20, stop_at_step=30),
            Segment(
                8,
                "8:30:tp=2/pp=2/sharding=full",
                PlanSpec(tp=2, pp=2, sharding="full"),
                start_step=30,
                stop_at_step=40,
            ),
            Segment(2, "2:40", start_step=40, stop_at_step=50),
        ],
    ),
    (
        "4:0:pp=2/vpp=2/recompute=selective",
        5,
        [
            Segment(
                4,
                "4:0:pp=2/vpp=2/recompute=selective",
                PlanSpec(pp=2, vpp=2, recompute="selective"),
                stop_at_step=5,
            )
        ],
    ),
]


@pytest.mark.parametrize(("text", "steps", "want"), GOOD, ids=[g[0] for g in GOOD])
def test_schedule_parses(text: str, steps: int | None, want: list[Segment]) -> None:
    assert parse_schedule(text, steps) == want


BAD = [
    ("4", 60, "'4': expected SIZE:STEP"),
    ("0:0", 60, "'0:0': SIZE must be an integer >= 1"),
    ("x:0", 60, "'x:0': SIZE must be"),
    ("4:-1", 60, "'4:-1': STEP"),
    ("4:8.5", 60, "'4:8.5': STEP"),
    ("4:5", 60, "'4:5': the first entry must be at 0"),
    ("4:0,2:20,3:20", 60, "'3:20': steps must increase"),
    ("4:0,2:8s,3:4s", 60, "'3:4s': times must increase"),
    ("4:0,2:60", 60, "'2:60': step is not below --steps 60"),
    ("4:0:tp=3", 60, "'4:0:tp=3': tp*pp = 3 does not divide the world size 4"),
    ("4:0,4:10:tp=2/pp=4", 60, "'4:10:tp=2/pp=4': tp*pp = 8"),
    ("4:0:dp=2", 60, "'4:0:dp=2': 'dp=2' is not KEY=VALUE with KEY one of tp, pp"),
    ("4:0:tp", 60, "'4:0:tp': 'tp' is not KEY=VALUE"),
    ("4:0:tp=0", 60, "'4:0:tp=0': tp must be an integer >= 1"),
    ("4:0:tp=two", 60, "'4:0:tp=two': tp must be an integer"),
    ("4:0:tp=2/tp=2", 60, "'4:0:tp=2/tp=2': tp is given twice"),
    ("4:0:sharding=zero3", 60, "'4:0:sharding=zero3': sharding must be one of none, optimizer"),
    ("4:0:recompute=some", 60, "'4:0:recompute=some': recompute must be one of none, selective"),
    ("4:0:vpp=2", 60, "'4:0:vpp=2': vpp=2 needs pp > 1"),
]


@pytest.mark.parametrize(("text", "steps", "error"), BAD, ids=[b[0] for b in BAD])
def test_schedule_refuses_naming_the_entry(text: str, steps: int, error: str) -> None:
    with pytest.raises(ValueError, match="schedule entry") as info:
        parse_schedule(text, steps)
    assert error in str(info.value)


def test_torchrun_schedules_resize_only_at_times() -> None:
    assert len(parse_schedule("2:0,1:8s", None, by_time_only=True)) == 2
    with pytest.raises(ValueError, match="'1:5': a plain torchrun script reports no steps"):
        parse_schedule("2:0,1:5", None, by_time_only=True)


def test_plan_for_is_the_operators_plan_and_round_trips() -> None:
    seg = parse_schedule("8:0:tp=2/pp=2/vpp=2/sharding=full/mb=1", 10)[0]
    plan = plan_for(seg, global_batch=10, micro_batch=2)
    assert (plan.dp, plan.tp, plan.pp, plan.virtual_stages) == (2, 2, 2, 2)
    assert plan.micro_batch_size == 1 and plan.batch_shares == (5, 5)
    assert plan.schedule == "interleaved1f1b" and plan.sharding == "full"
    assert plan.ranks[5] == RankCoord(rank=5, dp_rank=1, tp_rank=1, pp_stage=0)
    assert plan.stages == () and plan.label == "dp2tp2pp2"
    wire = {"job": "j", "worldVersion": 1, "rank": 0, "worldSize": 8, "masterAddr": "h",
            "masterPort": 1, "globalBatchSize": 10, "checkpoint": {"path": "/c"},
            "plan": plan_to_wire(plan)}  # fmt: skip
    assert parse_assignment(wire).plan == plan
    default = plan_for(parse_schedule("3:0", 10)[0], global_batch=32, micro_batch=2)
    assert default.batch_shares == tuple(even_shares(32, 3, 2)) == (12, 10, 10)
    assert default.schedule == "1f1b"


MODEL = ModelBounds(layers=4, attention_heads=8, kv_heads=2)
PLAN_BAD = [
    ("4:0,4:5:tp=4", MODEL, "bitwise", "'4:5:tp=4': tp=4 does not divide the model's kvHeads 2"),
    ("8:0:tp=8", ModelBounds(4, 12), "none", "'8:0:tp=8': tp=8 does not divide the model's "
     "attentionHeads 12"),
    ("8:0:pp=8", MODEL, "none", "'8:0:pp=8': pp*vpp = 8 stages but the model has 4 layers"),
    ("4:0:pp=2/vpp=4", MODEL, "none", "'4:0:pp=2/vpp=4': pp*vpp = 8 stages"),
    ("4:0:mb=3", None, "none", "'4:0:mb=3': global batch 32 is not a multiple of micro batch 3"),
    ("4:0:mb=4", None, "bitwise", "'4:0:mb=4': mb=4, but in bitwise mode"),
    ("32:0:mb=2", None, "none", "'32:0:mb=2': 32 ranks but only 16 logical shares"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "model", "consistency", "error"), PLAN_BAD)
def test_plans_the_trainer_cannot_run_are_refused(
    text: str, model: ModelBounds | None, consistency: Consistency, error: str
) -> None:
    schedule = parse_schedule(text, 10)
    with pytest.raises(ValueError) as info:
        check_plans(schedule, global_batch=32, micro_batch=2, consistency=consistency, model=model)
    assert error in str(info.value)


def test_good_plans_pass_with_a_model() -> None:
    schedule = parse_schedule("4:0,4:2:tp=2,4:4:pp=2/vpp=2,8:6:tp=2/pp=2/sharding=full", 10)
    check_plans(schedule, global_batch=32, micro_batch=2, consistency="none", model=MODEL)


def test_model_is_read_from_the_trainer_command(tmp_path: Path) -> None:
    spec = tmp_path / "model.yaml"
    spec.write_text("layers: 6\nhiddenSize: 64\nattentionHeads: 4\nvocabSize: 100\n")
    cmd = ["python", "-m", "elastra_worker.train", "--model", str(spec)]
    assert model_from_command(cmd) == ModelBounds(layers=6, attention_heads=4)
    assert model_from_command(["python", "t.py", f"--model={spec}"]) == ModelBounds(6, 4)
    assert model_from_command(["python", "t.py"]) is None
    with pytest.raises(ValueError, match=r"--model .*missing.yaml: cannot read it"):
        model_from_command(["x", "--model", str(tmp_path / "missing.yaml")])
    spec.write_text("layers: 6\nkvHeads: 2\n")
    with pytest.raises(ValueError, match="attentionHeads must be an integer >= 1, got None"):
        model_from_command(["x", "--model", str(spec)])
