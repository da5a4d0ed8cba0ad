"""``elastra plan``: the example plans in well under two seconds, the JSON follows the
contract, and bad input or no fit give the documented exit statuses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from elastra.cli import main

ROOT = Path(__file__).resolve().parents[2]
JOB = str(ROOT / "examples" / "gpt-7b-hetero.yaml")
NODES = str(ROOT / "examples" / "nodes-hetero.yaml")

PLAN_KEYS = {
    "gpuTypes",
    "dp",
    "tp",
    "pp",
    "microBatchSize",
    "sharding",
    "recompute",
    "batchShares",
    "replicaBatchShares",
    "virtualStages",
    "schedule",
    "stages",
    "predicted",
    "placement",
}
PREDICTED_KEYS = {
    "stepTimeSeconds",
    "tokensPerSecond",
    "tflopsPerGpu",
    "mfu",
    "peakMemoryGiB",
    "bottleneck",
}
RANK_KEYS = {"rank", "node", "gpuType", "dpRank", "tpRank", "ppStage"}


def plan_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    status = main(["plan", *argv, "--output", "json"])
    return status, json.loads(capsys.readouterr().out)


def test_example_json_follows_the_contract(capsys: pytest.CaptureFixture[str]) -> None:
    status, out = plan_json(capsys, JOB, "--cluster", NODES)
    assert status == 0
    assert out["feasible"] is True and out["reason"] is None
    best = out["plans"][0]
    assert set(best) == PLAN_KEYS and set(best["predicted"]) == PREDICTED_KEYS
    assert any("H100" in name for name in best["gpuTypes"])
    assert any("A100" in name for name in best["gpuTypes"])
    assert best["sharding"] in {"none", "optimizer", "full"}
    assert best["recompute"] in {"none", "selective", "full"}
    assert set(best["batchShares"]) == set(best["gpuTypes"])
    shares = best["replicaBatchShares"]
    assert len(shares) == best["dp"] and sum(shares) == 512
    assert max(shares) == max(best["batchShares"].values())
    assert best["schedule"] == ("interleaved1f1b" if best["virtualStages"] > 1 else "1f1b")
    stages = best["stages"]
    assert len(stages) == best["pp"] * best["virtualStages"]
    assert stages[0]["layers"][0] == 0 and stages[-1]["layers"][1] == 32
    world = sum(best["gpuTypes"].values())
    assert world == best["dp"] * best["tp"] * best["pp"] == len(best["placement"])
    assert [r["rank"] for r in best["placement"]] == list(range(world))
    assert all(set(r) == RANK_KEYS for r in best["placement"])
    predicted = best["predicted"]
    assert predicted["tflopsPerGpu"] >= predicted["mfu"] * 312 * 0.99  # executed >= model FLOPs
    assert 0 < predicted["mfu"] < 1 and predicted["peakMemoryGiB"] <= 80


def test_example_table_is_one_screen() -> None:
    """(How fast it prints is measured by bench/bench_planner.py, not asserted here.)"""
    done = subprocess.run(
        [sys.executable, "-m", "elastra.cli", "plan", JOB, "--cluster", NODES],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("Plan for gpt-7b-hetero") and len(lines) <= 25
    assert "Runner-ups" in done.stdout and "Rejected candidates" in done.stdout


def test_no_fit_exits_3_with_a_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = yaml.safe_load(Path(NODES).read_text())
    nodes["items"] = [n for n in nodes["items"] if "t4" in n["metadata"]["name"]]
    small = tmp_path / "t4.yaml"
    small.write_text(yaml.safe_dump(nodes))
    status, out = plan_json(capsys, JOB, "--cluster", str(small))
    assert status == 3
    assert out == {"feasible": False, "reason": out["reason"], "plans": []}
    assert "T4" in out["reason"]


def test_unknown_gpu_type_on_a_node_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = yaml.safe_load(Path(NODES).read_text())
    nodes["items"][0]["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-Mystery-1"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(nodes))
    assert main(["plan", JOB, "--cluster", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "node h100-0" in err and "nvidia.com/gpu.product" in err


def test_unknown_gpu_types_pattern_names_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = yaml.safe_load(Path(JOB).read_text())
    job["spec"]["worker"]["gpuTypes"] = ["Z900"]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    assert main(["plan", str(path), "--cluster", NODES]) == 2
    assert "spec.worker.gpuTypes: 'Z900'" in capsys.readouterr().err


def test_missing_cluster_file_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", JOB, "--cluster", "/nonexistent/nodes.yaml"]) == 2
    assert "/nonexistent/nodes.yaml: cannot read" in capsys.readouterr().err


def test_multi_document_nodes_and_top_k(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    items = yaml.safe_load(Path(NODES).read_text())["items"]
    path = tmp_path / "nodes.yaml"
    path.write_text(yaml.safe_dump_all(items))
    status, out = plan_json(capsys, JOB, "--cluster", str(path), "--top", "2")
    assert status == 0 and len(out["plans"]) == 2
