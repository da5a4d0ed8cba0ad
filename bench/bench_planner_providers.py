"""Plan time on 1,000 nodes labelled and tainted as the clouds do, against the same fleet
labelled the kwok way, as a ratio measured in one run (target: within 1.2x).

The mixed fleet repeats the GPU nodes of the provider fixtures in tests/fixtures/clusters
(EKS p5/p4d/g5 with and without GPU Feature Discovery, GKE a2/a3/g2, AKS ND A100 v4 and ND
H100 v5, Karpenter, GFD and AMD's labeller) to 1,000 nodes, each with its provider's labels and
taints (``nvidia.com/gpu``, AKS's ``sku=gpu``), a third of them also ``dedicated=ml``, a fifth
a spot taint. The kwok twin has the very same nodes (names, GPU types and counts,
allocatable, network bandwidth) labelled as the local kwok fleet labels them (GFD's product
label, ``elastra.dev/network-gbps`` for the bandwidth the instance type gave) and tainted
``kwok.x-k8s.io/node=fake:NoSchedule`` only. One job plans on both: the 7B example without
its type list, its template tolerating the provider taints and selecting linux/amd64 nodes by
nodeSelector and required affinity; the operator's toleration is kwok's.

"Plan time" is what ``elastra plan`` and a job's first pass do with Node objects: parse them
(``parse_inventory``: GPU type from the labels), keep the nodes the job's pods may use
(``eligibility.eligible``: taints, selector, affinity, room) and search (``plan_job``). CPU
seconds of this process, median of a few repeats; the parse-and-filter share is printed too.
"""

from __future__ import annotations

import copy
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from elastra.api import parse_trainingjob
from elastra.controller.decide.manifests import worker_constraints
from elastra.controller.settings import OperatorSettings
from elastra.planner import parse_inventory, plan_job
from elastra.planner.catalog import by_name
from elastra.planner.eligibility import eligible
from elastra.planner.fromspec import requirements_from_spec
from elastra.planner.scheduling import PodConstraints, PodToleration

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "clusters"
NODES = 1000
REPEATS = 5
TARGET = 1.2
KWOK_TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}
DEDICATED = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
SPOT = {"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NoSchedule"}
KEPT_LABELS = ("kubernetes.io/os", "kubernetes.io/arch", "topology.kubernetes.io/zone")


def provider_templates() -> list[dict[str, Any]]:
    """Every node of the provider fixtures that the planner counts GPUs on."""
    templates = []
    for path in sorted(FIXTURES.glob("*.yaml")):
        document = yaml.safe_load(path.read_text())
        usable = {str(n.name) for n in parse_inventory(document).nodes if n.free_gpus}
        templates += [n for n in document["items"] if n["metadata"]["name"] in usable]
    return templates


def mixed_fleet(templates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``NODES`` nodes cycling through ``templates``, renamed, with more taints on some."""
    nodes = []
    for i in range(NODES):
        node = copy.deepcopy(templates[i % len(templates)])
        name = f"n{i:04d}-{node['metadata']['name']}"[:63]
        node["metadata"]["name"] = name
        node["metadata"]["labels"]["kubernetes.io/hostname"] = name
        taints = list(node.get("spec", {}).get("taints") or [])
        if i % 3 == 0:
            taints.append(DEDICATED)
        if i % 5 == 0:
            taints.append(SPOT)
        node.setdefault("spec", {})["taints"] = taints
        nodes.append(node)
    return nodes


def kwok_twin(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same nodes as the local kwok fleet labels and taints them."""
    parsed = {str(n.name): n for n in parse_inventory(nodes).nodes}
    twins = []
    for node in nodes:
        name = node["metadata"]["name"]
        labels = {k: v for k, v in node["metadata"]["labels"].items() if k in KEPT_LABELS}
        gpu = by_name(parsed[name].gpu_type.name)
        labels.update(
            {
                "kubernetes.io/hostname": name,
                "type": "kwok",
                "nvidia.com/gpu.product": gpu.product_labels[0] if gpu.product_labels else gpu.name,
            }
        )
        twins.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": labels,
                    "annotations": {
                        "kwok.x-k8s.io/node": "fake",
                        "elastra.dev/network-gbps": str(parsed[name].network_gbps),
                    },
                },
                "spec": {"taints": [KWOK_TAINT]},
                "status": copy.deepcopy(node["status"]),
            }
        )
    return twins


def job() -> Any:
    body = yaml.safe_load((ROOT / "examples" / "gpt-7b-hetero.yaml").read_text())
    del body["spec"]["worker"]["gpuTypes"]
    body["spec"].update(replicas=64, maxReplicas=64)
    linux = {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}
    body["spec"]["worker"]["template"] = {
        "spec": {
            "tolerations": [
                {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},
                {**DEDICATED, "operator": "Equal"},
                {"key": SPOT["key"], "operator": "Exists"},
            ],
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [linux]}]
                    }
                }
            },
        }
    }
    return parse_trainingjob(body)


def plan_seconds(
    nodes: list[dict[str, Any]], constraints: PodConstraints
) -> tuple[float, float, str]:
    """Median CPU seconds of parse + filter + plan, of parse + filter alone, and the plan."""
    requirements = requirements_from_spec(job().spec)
    totals, parses = [], []
    summary = ""
    for _ in range(REPEATS):
        started = time.process_time()
        inventory = eligible(parse_inventory(nodes), constraints)
        parsed = time.process_time()
        result = plan_job(requirements, inventory, top_k=1)
        totals.append(time.process_time() - started)
        parses.append(parsed - started)
        assert result.feasible, result.reason
        summary = result.plans[0].summary()
    return statistics.median(totals), statistics.median(parses), summary


def main() -> int:
    mixed = mixed_fleet(provider_templates())
    kwok = kwok_twin(mixed)
    settings = OperatorSettings(
        tolerations=(PodToleration(key="kwok.x-k8s.io/node", value="fake"),)
    )
    constraints = worker_constraints(job(), settings)
    usable = {
        label: len(eligible(parse_inventory(nodes), constraints).nodes)
        for label, nodes in (("mixed", mixed), ("kwok", kwok))
    }
    assert usable["mixed"] == usable["kwok"] == NODES, usable
    kwok_total, kwok_parse, kwok_plan = plan_seconds(kwok, constraints)
    mixed_total, mixed_parse, mixed_plan = plan_seconds(mixed, constraints)
    assert kwok_plan == mixed_plan, (kwok_plan, mixed_plan)
    ratio = mixed_total / kwok_total
    print(f"7B job on {NODES} nodes ({usable['mixed']} usable by its pods), CPU s per plan:")
    print(f"  kwok-labelled: {kwok_total:.3f} (parse + filter {kwok_parse:.3f})")
    print(f"  providers' labels and taints: {mixed_total:.3f} (parse + filter {mixed_parse:.3f})")
    print(f"  ratio providers/kwok = {ratio:.2f} (target <= {TARGET}); plan: {mixed_plan}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
