"""The trace contract: what parses, and errors that name file, line and field."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from elastra.errors import UserError
from elastra.sim.synthetic import HELIOS, PHILLY, generate
from elastra.sim.trace import format_trace, load_trace, parse_trace

HEADER = "name,submitTime,gpus,gpuType,durationSeconds"


def test_minimal_trace_gets_defaults_and_catalog_names() -> None:
    jobs = parse_trace(f"{HEADER}\nb,10,4,Tesla-T4,60\na,5,1,H100,30\n", source="t.csv")
    assert [j.name for j in jobs] == ["a", "b"]  # sorted by submit time
    a, b = jobs
    assert (a.gpu_type, a.min_gpus, a.max_gpus, a.model) == ("H100-SXM-80GB", 1, 1, "gpt-125m")
    assert (b.gpu_type, b.min_gpus, b.max_gpus, b.line) == ("T4", 2, 4, 2)


def test_optional_columns_in_any_order() -> None:
    text = "model,maxGpus,priority,name,gpus,minGpus,gpuType,durationSeconds,submitTime\n"
    text += "gpt-1.3b,16,-5,x,8,2,A100-SXM-80GB,100,0\n"
    (job,) = parse_trace(text, source="t.csv")
    assert (job.gpus, job.min_gpus, job.max_gpus, job.model) == (8, 2, 16, "gpt-1.3b")
    assert job.priority == -5


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("name,submitTime,gpus,gpuType\nx,0,1,T4\n", "t.csv:1: missing column durationSeconds"),
        (f"{HEADER},color\n", "t.csv:1: unknown column color"),
        (f"{HEADER}\nx,0,1,T4,-5\n", "t.csv:2: durationSeconds: -5 must be > 0"),
        (f"{HEADER}\nx,0,1,T4,5\ny,0,1,Z80,5\n", "t.csv:3: gpuType: unknown GPU type 'Z80'"),
        (f"{HEADER}\nx,0,0,T4,5\n", "t.csv:2: gpus: 0 must be >= 1"),
        (f"{HEADER}\nx,soon,1,T4,5\n", "t.csv:2: submitTime: 'soon' is not a number"),
        (f"{HEADER}\nx,0,1,T4,5\nx,1,1,T4,5\n", "t.csv:3: name: 'x' already used on line 2"),
        (f"{HEADER},minGpus\nx,0,2,T4,5,4\n", "t.csv:2: minGpus: 4 is above gpus=2"),
        (f"{HEADER},model\nx,0,2,T4,5,gpt-9t\n", "t.csv:2: model: unknown model 'gpt-9t'"),
        (f"{HEADER}\nx,0,2,T4\n", "t.csv:2: 4 fields, the header has 5"),
        (f"{HEADER},priority\nx,0,2,T4,5,high\n", "t.csv:2: priority: 'high' is not a whole"),
        ("", "t.csv:1: empty trace"),
        (f"{HEADER}\n", "t.csv:2: no jobs after the header"),
    ],
)
def test_malformed_traces_name_file_line_and_field(text: str, expected: str) -> None:
    with pytest.raises(UserError) as err:
        parse_trace(text, source="t.csv")
    assert str(err.value).startswith(expected)


def test_format_round_trips(tmp_path: Path) -> None:
    jobs = generate(
        PHILLY, jobs=50, types=[("T4", 8), ("H100-SXM-80GB", 16)], load=0.5, rng=random.Random(3)
    )
    jobs = tuple(replace(j, priority=i % 3 - 1) for i, j in enumerate(jobs))
    path = tmp_path / "trace.csv"
    path.write_text(format_trace(jobs))
    again = load_trace(path)
    fields = ("name", "gpus", "gpu_type", "min_gpus", "max_gpus", "model", "priority")
    assert [[getattr(j, f) for f in fields] for j in again] == [
        [getattr(j, f) for f in fields] for j in jobs
    ]
    assert all(abs(a.submit_s - b.submit_s) < 1e-3 for a, b in zip(again, jobs, strict=True))


def test_generator_is_seeded_and_shaped() -> None:
    types = [("T4", 8), ("H100-SXM-80GB", 64)]
    first = generate(HELIOS, jobs=400, types=types, load=0.8, rng=random.Random(5))
    assert first == generate(HELIOS, jobs=400, types=types, load=0.8, rng=random.Random(5))
    assert first != generate(HELIOS, jobs=400, types=types, load=0.8, rng=random.Random(6))
    single = sum(j.gpus == 1 for j in first) / len(first)
    assert 0.35 < single < 0.65  # Helios: about half the GPU jobs use one GPU
    assert all(j.gpus <= 8 for j in first if j.gpu_type == "T4")  # never above the type
    assert all(j.min_gpus <= j.gpus <= j.max_gpus for j in first)
    submits = [j.submit_s for j in first]
    assert submits == sorted(submits)
