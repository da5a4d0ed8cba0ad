"""``elastra simulate``: the JSON contract, the table, plots, and exit 2 on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from elastra.cli import main
from tests.unit.sim.conftest import FLEET

TRACE = (
    "name,submitTime,gpus,gpuType,durationSeconds\n"
    "a,0,8,H100,3600\nb,60,4,T4,1800\nc,120,16,H100,600\n"
)
KEYS = {
    "policy",
    "jobs",
    "avgJctSeconds",
    "p50JctSeconds",
    "p99JctSeconds",
    "makespanSeconds",
    "gpuUtilization",
    "restarts",
}


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    trace = tmp_path / "trace.csv"
    trace.write_text(TRACE)
    return fleet, trace


def test_json_contract(files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    fleet, trace = files
    args = ["simulate", "--cluster", str(fleet), "--trace", str(trace), "--policy", "elastra"]
    assert main([*args, "--output", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert set(document) == KEYS
    assert document["policy"] == "elastra" and document["jobs"] == 3
    assert 0 < document["gpuUtilization"] <= 1
    assert document["p50JctSeconds"] <= document["p99JctSeconds"] <= document["makespanSeconds"]


def test_all_policies_table_and_plots(
    files: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet, trace = files
    plots = tmp_path / "plots"
    args = ["simulate", "--cluster", str(fleet), "--trace", str(trace), "--policy", "all"]
    assert main([*args, "--plots", str(plots)]) == 0
    out = capsys.readouterr().out
    for name in ("static", "gavel-like", "elastic", "elastra"):
        assert name in out
    for png in ("jct_cdf.png", "utilization.png"):
        assert (plots / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("trace", "expected"),
    [
        ("name,submitTime,gpus,gpuType\nx,0,1,T4\n", ":1: missing column durationSeconds"),
        ("name,submitTime,gpus,gpuType,durationSeconds\nx,0,1,T4,-3\n", ":2: durationSeconds"),
        ("name,submitTime,gpus,gpuType,durationSeconds\nx,0,1,B200X,3\n", ":2: gpuType"),
        ("name,submitTime,gpus,gpuType,durationSeconds\nx,0,1,A100,3\n", ":2: gpuType: the "),
        ("name,submitTime,gpus,gpuType,durationSeconds\nx,0,64,H100,3\n", ":2: gpus: 64"),
    ],
)
def test_bad_trace_exits_2_naming_line_and_field(
    files: tuple[Path, Path], trace: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet, path = files
    path.write_text(trace)
    args = ["simulate", "--cluster", str(fleet), "--trace", str(path), "--policy", "static"]
    assert main(args) == 2
    err = capsys.readouterr()
    assert err.out == ""  # nothing simulated, nothing printed
    assert err.err.startswith(f"elastra: error: {path}{expected}")
    assert err.err.count("\n") == 1


def test_bad_fleet_and_policy_exit_2(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    fleet, trace = files
    fleet.write_text(FLEET.replace("Tesla-T4", "Tesla-T9"))
    args = ["simulate", "--cluster", str(fleet), "--trace", str(trace)]
    assert main([*args, "--policy", "static"]) == 2
    assert f"{fleet}:12: groups[1].gpu.product" in capsys.readouterr().err
    assert main([*args, "--policy", "fifo"]) == 2
    assert "--policy: unknown policy 'fifo'" in capsys.readouterr().err
