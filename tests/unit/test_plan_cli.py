"""``elastra plan``: the example plans in well under two seconds, the JSON follows the
contract, and bad input or no fit give the documented exit statuses."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
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
    "peakMemoryGiBByType",
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
    by_type = predicted["peakMemoryGiBByType"]
    assert set(by_type) == set(best["gpuTypes"])
    assert max(by_type.values()) == predicted["peakMemoryGiB"]


def test_a_mix_whose_types_need_different_memory_says_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Six 4-GPU pods on 4 H100 pods + 2 A100-40GB pods: the A100-40GB replica runs one
    micro-batch and needs 21.6 GiB of its 36, the H100s 58.0; both outputs say so."""
    spec = yaml.safe_load(Path(JOB).read_text())
    spec["spec"].update(replicas=6, minReplicas=6, maxReplicas=6)
    spec["spec"]["worker"].update(gpus=4, gpuTypes=["H100", "A100-40GB"])
    spec["spec"]["training"]["globalBatchSize"] = 24
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(spec))
    nodes = yaml.safe_load(Path(NODES).read_text())
    h100 = [n for n in nodes["items"] if "H100" in str(n["metadata"]["labels"])][:2]
    a100 = next(n for n in nodes["items"] if "A100" in str(n["metadata"]["labels"]))
    a100["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-A100-SXM4-40GB"
    nodes["items"] = [*h100, a100]
    cluster = tmp_path / "nodes.yaml"
    cluster.write_text(yaml.safe_dump(nodes))
    status, out = plan_json(capsys, str(job), "--cluster", str(cluster))
    assert status == 0
    predicted = out["plans"][0]["predicted"]
    by_type = {name: round(gib, 1) for name, gib in predicted["peakMemoryGiBByType"].items()}
    assert by_type == {"H100-SXM-80GB": 58.0, "A100-SXM-40GB": 21.6}
    assert main(["plan", str(job), "--cluster", str(cluster)]) == 0
    table = capsys.readouterr().out
    assert "peak 58.0 GiB/GPU (H100-SXM-80GB 58.0, A100-SXM-40GB 21.6)" in table


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
    assert out == {
        "feasible": False,
        "reason": out["reason"],
        "plans": [],
        "excludedNodes": [],
        "nodeNotes": [],
    }
    assert "T4" in out["reason"]


def test_a_node_of_unknown_gpu_type_is_listed_and_the_rest_planned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = yaml.safe_load(Path(NODES).read_text())
    nodes["items"][0]["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-Mystery-1"
    odd = tmp_path / "odd.yaml"
    odd.write_text(yaml.safe_dump(nodes))
    assert main(["plan", JOB, "--cluster", str(odd)]) == 0
    out = capsys.readouterr().out
    assert (
        "Capacity: A100-SXM-80GB 4 nodes (32 GPUs usable), CPU 1 node, H100-SXM-80GB 3 nodes" in out
    )
    assert "\n  h100-0: 8 nvidia.com/gpu but no known GPU type in " in out
    assert "nvidia.com/gpu.product='NVIDIA-Mystery-1'" in out


@pytest.mark.parametrize(
    ("edit", "error"),
    [
        (lambda n: n["metadata"].pop("name"), "a Node without metadata.name"),
        (
            lambda n: n["metadata"]["annotations"].update({"elastra.dev/network-gbps": "fast"}),
            "node h100-0: elastra.dev/network-gbps='fast' is not a number",
        ),
        (
            lambda n: n["status"]["allocatable"].update({"nvidia.com/gpu": "eight"}),
            "node h100-0: nvidia.com/gpu='eight' is not a whole number",
        ),
    ],
)
def test_malformed_nodes_are_still_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: Any, error: str
) -> None:
    nodes = yaml.safe_load(Path(NODES).read_text())
    edit(nodes["items"][0])
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(nodes))
    assert main(["plan", JOB, "--cluster", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and error in err


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


FIXTURES = ROOT / "tests" / "fixtures" / "clusters"
SKU_GPU = {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
"""The toleration AKS documents for its GPU pools' taint (the job's template carries it)."""


@dataclass(frozen=True)
class Case:
    """A job sized for one provider's fixture, and what its plan must be."""

    fixture: str
    gpus: int
    replicas: int
    planned: dict[str, int]
    """GPUs per type of the best plan."""
    unusable: frozenset[str] = frozenset()
    """The nodes listed as not planned with."""
    gpu_types: tuple[str, ...] = ()
    tolerations: tuple[dict[str, str], ...] = ()
    """The job template's (AKS's GPU pools are tainted sku=gpu:NoSchedule)."""


EKS = ".us-west-2.compute.internal"
PROVIDERS = [
    Case("eks-p4d.yaml", 4, 3, {"A100-SXM-40GB": 12}),
    Case("eks-p5.yaml", 8, 2, {"H100-SXM-80GB": 16}),
    Case("eks-g5-gfd.yaml", 4, 4, {"A10G": 16}),
    Case("eks-g5-nogfd.yaml", 4, 2, {"A10G": 8}),
    Case("gke-a2.yaml", 8, 3, {"A100-SXM-40GB": 16, "A100-SXM-80GB": 8}),
    Case("gke-a3.yaml", 8, 3, {"H100-SXM-80GB": 24}, frozenset({"gke-train-b200-3f9c2a71-m1zs"})),
    Case("gke-g2.yaml", 2, 6, {"L4": 12}, gpu_types=("L4",)),
    Case("aks-nd-a100-v4.yaml", 8, 2, {"A100-SXM-40GB": 16}, tolerations=(SKU_GPU,)),
    Case("aks-nd-h100-v5.yaml", 8, 2, {"H100-SXM-80GB": 16}, tolerations=(SKU_GPU,)),
    Case("aks-nd-h100-v5.yaml", 8, 1, {"MI300X": 8}, gpu_types=("MI300X",), tolerations=(SKU_GPU,)),
    Case(
        "karpenter.yaml",
        4,
        5,
        {"A100-SXM-40GB": 8, "A100-SXM-80GB": 8, "L40S": 4},
        frozenset({f"ip-10-0-162-40{EKS}"}),
    ),
    Case(
        "mixed.yaml",
        8,
        2,
        {"H100-SXM-80GB": 16},
        frozenset(
            {
                "dgx-a100-mig-0",
                "dgx-a100-mig-1",
                "dgx-h100-2",
                "gpu-unlabelled-0",
                "ip-10-9-4-17.ec2.internal",
                "ws-rtx4090-0",
            }
        ),
    ),
]


def provider_job(tmp_path: Path, case: Case) -> str:
    """The example job sized for ``case``."""
    job = yaml.safe_load(Path(JOB).read_text())
    job["spec"].update(replicas=case.replicas, minReplicas=1, maxReplicas=case.replicas)
    job["spec"]["worker"].update(gpus=case.gpus, gpuTypes=list(case.gpu_types))
    if case.tolerations:
        job["spec"]["worker"]["template"] = {"spec": {"tolerations": list(case.tolerations)}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return str(path)


def not_planned_with(table: str) -> set[str]:
    """The nodes ``elastra plan``'s table lists as not planned with."""
    if "Nodes not planned with" not in table:
        return set()
    section = table.split("Nodes not planned with", 1)[1].split("\nNotes", 1)[0]
    return set(re.findall(r"^  (\S+): \S", section, re.M))


@pytest.mark.parametrize("case", PROVIDERS, ids=lambda c: f"{c.fixture}-{c.gpus}")
def test_plans_on_provider_fixtures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: Case
) -> None:
    """EKS (p4d, p5, g5 with and without GFD), GKE (a2, a3, g2), AKS (ND A100 v4, ND H100 v5
    and MI300X) and Karpenter nodes as their providers label them: the plan is on the right
    types and counts, and every node it cannot use is listed with the reason."""
    job, cluster = provider_job(tmp_path, case), str(FIXTURES / case.fixture)
    status, out = plan_json(capsys, job, "--cluster", cluster)
    assert status == 0, out["reason"]
    assert out["plans"][0]["gpuTypes"] == case.planned
    assert {n["name"] for n in out["excludedNodes"]} == case.unusable
    assert main(["plan", job, "--cluster", cluster]) == 0
    assert not_planned_with(capsys.readouterr().out) == case.unusable


def provider(fixture: str) -> Case:
    """The ``PROVIDERS`` case of ``fixture`` (the first)."""
    return next(c for c in PROVIDERS if c.fixture == fixture)


@pytest.mark.parametrize(
    ("case", "node", "expected"),
    [
        (provider("mixed.yaml"), "dgx-a100-mig-0",
         ("MigPartitioned", "MIG partitions are not planned")),
        (provider("mixed.yaml"), "ws-rtx4090-0", ("UnknownGpuType", "no known GPU type in")),
        (provider("mixed.yaml"), "ip-10-9-4-17.ec2.internal",
         ("GpusNotAdvertised", "the device plugin has not registered")),
        (provider("karpenter.yaml"), f"ip-10-0-162-40{EKS}", ("UnknownGpuType", "")),
        # the pool's taint, not tolerated: no category
        (Case("aks-nd-a100-v4.yaml", 8, 2, {}), "aks-ndasr-27418803-vmss000000",
         ("", "taint sku=gpu:NoSchedule not tolerated")),
    ],
    ids=lambda v: v.fixture if isinstance(v, Case) else None,
)  # fmt: skip
def test_json_lists_each_node_not_planned_with_its_reason_and_category(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: Case, node: str,
    expected: tuple[str, str],
) -> None:  # fmt: skip
    """The table's "Nodes not planned with", in the JSON: a category for a node left out for
    its GPUs ("" for the others: a taint, a selector, not Ready)."""
    cluster = str(FIXTURES / case.fixture)
    _, out = plan_json(capsys, provider_job(tmp_path, case), "--cluster", cluster)
    (listed,) = [n for n in out["excludedNodes"] if n["name"] == node]
    category, reason = expected
    assert listed["category"] == category and reason in listed["reason"]
    assert set(listed) == {"name", "reason", "category"}


def test_json_carries_the_nodes_notes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    case = provider("eks-p4d.yaml")
    cluster = str(FIXTURES / case.fixture)
    _, out = plan_json(capsys, provider_job(tmp_path, case), "--cluster", cluster)
    assert out["nodeNotes"] == [
        {
            "name": f"ip-10-0-131-201{EKS}",
            "message": "node.kubernetes.io/instance-type=p4d.24xlarge has 8 GPUs but "
            "status.allocatable nvidia.com/gpu is 7: planned with 7, the device plugin's count",
        }
    ]


def test_an_untolerated_pool_is_listed_with_its_taint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """AKS's GPU pools without the job tolerating sku=gpu: nothing to plan on, every GPU node
    listed with the taint."""
    job = provider_job(tmp_path, Case("aks-nd-a100-v4.yaml", 8, 2, {}))
    assert main(["plan", job, "--cluster", str(FIXTURES / "aks-nd-a100-v4.yaml")]) == 3
    table = capsys.readouterr().out
    assert not_planned_with(table) == {
        "aks-ndasr-27418803-vmss000000",
        "aks-ndasr-27418803-vmss000001",
        "aks-nca100-27418803-vmss000000",
    }
    assert "aks-ndasr-27418803-vmss000000: taint sku=gpu:NoSchedule not tolerated" in table


def test_the_operators_toleration_counts_like_the_templates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--toleration`` stands for ``elastra run --toleration`` (the chart's
    workerTolerations): with it, AKS's tainted pools are capacity again."""
    job = provider_job(tmp_path, Case("aks-nd-a100-v4.yaml", 8, 2, {}))
    cluster = str(FIXTURES / "aks-nd-a100-v4.yaml")
    status, out = plan_json(capsys, job, "--cluster", cluster, "--toleration", "sku=gpu")
    assert status == 0, out["reason"]
    assert main(["plan", job, "--cluster", cluster, "--toleration", "sku=gpu:NoExecute"]) == 3
    assert "taint sku=gpu:NoSchedule not tolerated" in capsys.readouterr().out
    assert main(["plan", job, "--cluster", cluster, "--toleration", "sku=gpu:Never"]) == 2


@pytest.mark.parametrize(("training", "said"), [({}, True), ({"microBatchSize": 4}, False)])
def test_a_default_micro_batch_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], training: dict[str, Any], said: bool
) -> None:
    body = yaml.safe_load(Path(JOB).read_text())
    del body["spec"]["model"]
    body["spec"]["training"].update(training)
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(body))
    assert main(["plan", str(job), "--cluster", NODES]) == 0
    out = capsys.readouterr().out
    assert ("Note: micro-batch 1 by default: set training.microBatchSize" in out) is said
    assert f"mb={training.get('microBatchSize', 1)} " in out
