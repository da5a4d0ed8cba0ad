"""``elastra plan JOB.yaml --cluster NODES.yaml``: rank plans for a job without a cluster.

NODES.yaml is what ``kubectl get nodes -o yaml`` prints (a NodeList or List; a multi-document
file of Nodes also works); ``--pods`` optionally subtracts what running pods hold. Only nodes
the job's worker pods could be scheduled on are planned with, judged on the pod spec the
operator would create: the template's tolerations, node selector and required node affinity,
the GPU toleration, and the operator's own tolerations, given here as ``--toleration`` as to
``elastra run``; every other node is listed with the reason (a GPU type no label names, MIG
partitions, a taint, ...). Exit status: 0 a plan fits, 3 none fits (the reason is printed), 2
bad input (one line naming the file, field or node: a node without a name, a figure that is
not a number). ``--output json`` prints the contract in ``elastra.planner.plan``, and as the
table does, every node not planned with (``excludedNodes``: name, reason and, for a node left
out for its GPUs, the category ``UnknownGpuType``, ``MigPartitioned`` or
``GpusNotAdvertised``) and what a node's labels say that its capacity contradicts
(``nodeNotes``).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from elastra.api import load_trainingjob
from elastra.commands.run import parse_toleration
from elastra.controller.decide.manifests import worker_constraints
from elastra.controller.decide.planning import micro_batch_note
from elastra.controller.settings import OperatorSettings
from elastra.errors import UserError
from elastra.planner import (
    Inventory,
    JobPlan,
    PlanResult,
    parse_inventory,
    plan_job,
    result_to_dict,
)
from elastra.planner.catalog import CPU_TYPE
from elastra.planner.eligibility import eligible
from elastra.planner.fromspec import check_gpu_types, requirements_from_spec
from elastra.planner.search import NO_MODEL

EXIT_NO_PLAN = 3
RUNNER_UPS_SHOWN = 4
PODS_SHOWN = 8


def register(sub: Any) -> None:
    """Add the ``plan`` subcommand."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "plan",
        help="rank parallel plans and placements for a TrainingJob on a node snapshot",
        description="Rank parallel plans and placements for a TrainingJob on a node snapshot "
        "(kubectl get nodes -o yaml), without a cluster. Exit 0: a plan fits; 3: none fits; "
        "2: bad input.",
    )
    parser.add_argument("job", metavar="JOB.yaml", help="a TrainingJob manifest")
    parser.add_argument(
        "--cluster", metavar="NODES.yaml", required=True, help="Nodes as kubectl prints them"
    )
    parser.add_argument(
        "--pods", metavar="PODS.yaml", help="running Pods whose GPU/CPU requests are not free"
    )
    parser.add_argument(
        "--toleration",
        action="append",
        default=[],
        metavar="KEY[=VALUE][:EFFECT]",
        help="a toleration the operator adds to every worker pod (elastra run --toleration; "
        "the chart's workerTolerations), repeatable",
    )
    parser.add_argument("--top", type=int, default=3, metavar="K", help="plans to rank (3)")
    parser.add_argument("--output", "-o", choices=("table", "json"), default="table")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Plan and print; see the module docstring for exit statuses."""
    if args.top < 1:
        raise UserError("--top: must be >= 1")
    job = load_trainingjob(args.job)
    settings = OperatorSettings(tolerations=tuple(parse_toleration(t) for t in args.toleration))
    try:
        constraints = worker_constraints(job, settings)
    except UserError as err:
        raise UserError(f"{args.job}: {err}") from None
    inventory = eligible(
        parse_inventory(_documents(args.cluster), _documents(args.pods) if args.pods else ()),
        constraints,
    )
    try:
        check_gpu_types(job.spec.worker.gpu_types, inventory.types())
        requirements = requirements_from_spec(job.spec)
    except UserError as err:
        raise UserError(f"{args.job}: {err}") from None
    result = plan_job(requirements, inventory, top_k=args.top)
    if args.output == "json":
        print(json.dumps({**result_to_dict(result), **nodes_to_dict(inventory)}, indent=2))
    else:
        print(render_table(result, inventory, title=f"{job.metadata.name} on {args.cluster}"))
        if note := micro_batch_note(job):
            print(f"\nNote: {note}")
    return 0 if result.feasible else EXIT_NO_PLAN


def _documents(path: str) -> list[Any]:
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise UserError(f"{path}: cannot read: {err.strerror}") from None
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else "syntax error"
        raise UserError(f"{path}: not valid YAML: {first}") from None
    if not documents:
        raise UserError(f"{path}: empty")
    return documents


def render_table(result: PlanResult, inventory: Inventory, *, title: str) -> str:
    """The result for people: chosen plan, runner-ups, why the rest were rejected."""
    lines = [f"Plan for {title}"]
    if not result.feasible:
        lines.append(f"  NO PLAN FITS: {result.reason}")
    else:
        best = result.plans[0]
        lines += _describe(best)
        if len(result.plans) > 1:
            lines.append("")
            lines.append("Runner-ups")
            for i, plan in enumerate(result.plans[1 : 1 + RUNNER_UPS_SHOWN], start=2):
                ratio = plan.predicted.tokens_per_s / best.predicted.tokens_per_s - 1.0
                lines.append(
                    f"  #{i} {_types(plan)} dp={plan.dp} tp={plan.tp} pp={plan.pp} "
                    f"mb={plan.micro_batch} {plan.sharding}/{plan.recompute}: "
                    f"{_si(plan.predicted.tokens_per_s)} tok/s ({ratio:+.0%}), "
                    f"{plan.predicted.peak_memory_gib:.1f} GiB, {plan.predicted.bottleneck}"
                )
    lines.append("")
    lines.append(f"Rejected candidates ({result.candidates} layouts evaluated)")
    if not result.rejections:
        lines.append("  none")
    for rejection in result.rejections:
        lines.append(f"  {rejection.category} x{rejection.count}: e.g. {rejection.example}")
    return "\n".join([*lines, *_nodes(inventory)])


def nodes_to_dict(inventory: Inventory) -> dict[str, Any]:
    """The nodes the table lists after the plans, in the JSON form: those not planned with,
    why, and the notes on nodes whose labels and capacity disagree."""
    return {
        "excludedNodes": [
            {"name": n.name, "reason": n.reason, "category": n.category} for n in inventory.excluded
        ],
        "nodeNotes": [{"name": n.name, "message": n.message} for n in inventory.notes],
    }


def _nodes(inventory: Inventory) -> list[str]:
    """What the planner had, and every node it could not use with the reason (none left out:
    a node missing from the plan is explained here), and what the nodes' labels said that
    their capacity contradicts."""
    nodes = Counter(str(n.gpu_type.name) for n in inventory.nodes)
    gpus = Counter[str]()
    for node in inventory.nodes:
        gpus[node.gpu_type.name] += node.free_gpus
    shown = [
        f"{name} {count} node{'s' if count > 1 else ''}"
        + ("" if name == CPU_TYPE else f" ({gpus[name]} GPUs usable)")
        for name, count in sorted(nodes.items())
    ]
    lines = ["", "Capacity: " + (", ".join(shown) or "none")]
    if inventory.excluded:
        lines.append(f"Nodes not planned with ({len(inventory.excluded)})")
        lines += [f"  {n.name}: {n.reason}" for n in inventory.excluded]
    if inventory.notes:
        lines.append("Notes")
        lines += [f"  {n.name}: {n.message}" for n in inventory.notes]
    return lines


def _peak_memory(plan: JobPlan) -> str:
    """``peak 28.5 GiB/GPU``; per type when a mix's types need different amounts (a type whose
    replicas run fewer micro-batches than ``pp`` holds fewer in flight)."""
    peak = f"peak {plan.predicted.peak_memory_gib:.1f} GiB/GPU"
    needs = [(s.gpu_type, f"{s.peak_memory_gib:.1f}") for s in plan.types]
    if len({need for _, need in needs}) == 1:
        return peak
    return peak + " (" + ", ".join(f"{name} {need}" for name, need in needs) + ")"


def _describe(plan: JobPlan) -> list[str]:
    p = plan.predicted
    replicas = " + ".join(f"{s.replicas}x{s.gpu_type}" for s in plan.types)
    shares = ", ".join(
        "/".join(str(n) for n in sorted(set(s.replica_shares), reverse=True))
        + f" per {s.gpu_type} replica"
        for s in plan.types
    )
    breakdown = " | ".join(f"{name} {seconds:.3g}s" for name, seconds in p.breakdown)
    if p.bottleneck == NO_MODEL:
        predicted = (
            f"  predicted   no model section: data parallel with shares by relative speed; "
            f"{p.tokens_per_s:.3g} samples per second of the fastest type"
        )
    else:
        predicted = (
            f"  predicted   step {p.step_time_s:.3g} s, {_si(p.tokens_per_s)} tokens/s, "
            f"{p.tflops_per_gpu:.0f} TFLOP/s/GPU, MFU {p.mfu:.1%}, {_peak_memory(plan)}, "
            f"bottleneck {p.bottleneck}"
        )
    lines = [
        f"  GPUs        {plan.gpus} ({_types(plan)}), {plan.hourly_usd:.2f} $/h",
        f"  layout      dp={plan.dp} ({replicas})  tp={plan.tp}  pp={plan.pp}  "
        f"micro-batch={plan.micro_batch}  sharding={plan.sharding}  recompute={plan.recompute}",
        f"  batch       {shares}",
        predicted,
    ]
    if p.bottleneck != NO_MODEL:
        lines.append(f"  step time   {breakdown} (memory = recomputation)")
    pods = [f"{pod.index}->{pod.node}" for pod in plan.pods[:PODS_SHOWN]]
    more = len(plan.pods) - PODS_SHOWN
    lines.append(f"  pods        {' '.join(pods)}" + (f" (+{more} more)" if more > 0 else ""))
    return lines


def _types(plan: JobPlan) -> str:
    return " + ".join(f"{s.gpus} {s.gpu_type}" for s in plan.types)


def _si(value: float) -> str:
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= factor:
            return f"{value / factor:.3g}{suffix}"
    return f"{value:.3g}"
