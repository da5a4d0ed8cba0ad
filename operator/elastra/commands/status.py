"""``elastra status NAME``: one screen on a TrainingJob for people.

What ``kubectl describe`` would show if it knew what a world, a plan and a placement are:
the phase and world, the plan, where each pod runs (by node and GPU type), conditions, the
latest resizes and recent events, and the cluster's nodes whose GPUs no job can be planned on
(a type no label names, MIG partitions, GPUs not advertised yet) with the reason: a job
waiting for GPUs the cluster seems to have is often waiting for those. Read only: it gets the
job and lists its events and the nodes. Exit 0 when the job exists, 2 when it does not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from elastra.api import TrainingJob, parse_trainingjob
from elastra.errors import UserError
from elastra.kube import resources
from elastra.kube.client import ApiError, Kube
from elastra.kube.config import Connection, load_connection
from elastra.planner import parse_inventory
from elastra.planner.inventory import GPU_EXCLUSIONS, ExcludedNode


def register(sub: Any) -> None:
    """Add the ``status`` subcommand."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "status",
        help="show a TrainingJob's world, plan, placement, conditions and events",
        description="Show a TrainingJob's world, plan, placement, conditions and events.",
    )
    parser.add_argument("name", help="TrainingJob name")
    parser.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig's)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG)")
    parser.add_argument("--context", help="kubeconfig context (default: its current-context)")
    parser.add_argument("--output", "-o", choices=["text", "json"], default="text")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Fetch the job and its events and print them."""
    connection = load_connection(args.kubeconfig, context=args.context)
    namespace = args.namespace or connection.namespace
    raw, events, nodes = asyncio.run(_fetch(connection, namespace, args.name))
    if raw is None:
        raise UserError(f"trainingjob {namespace}/{args.name} not found")
    unusable = unusable_nodes(nodes) if not isinstance(nodes, str) else nodes
    if args.output == "json":
        shown: Any = unusable
        if not isinstance(unusable, str):
            shown = [{"name": n.name, "category": n.category, "reason": n.reason} for n in unusable]
        print(json.dumps({"trainingJob": raw, "events": events, "unusableNodes": shown}, indent=2))
        return 0
    print(render(parse_trainingjob(raw), events, unusable=unusable))
    return 0


async def _fetch(
    connection: Connection, namespace: str, name: str
) -> tuple[dict[str, Any] | None, list[dict[str, Any]], list[dict[str, Any]] | str]:
    """The job, its events and every node (or why the nodes could not be listed)."""
    async with Kube(connection) as kube:
        raw = await resources.get_job(kube, namespace, name)
        if raw is None:
            return None, [], []
        events = await resources.list_events(kube, namespace, name)
        try:
            nodes: list[dict[str, Any]] | str = await resources.list_nodes(kube)
        except ApiError as err:  # e.g. a user allowed to read jobs, not nodes
            nodes = f"{err.status} {err.reason}: {err.message}"
        return raw, events, nodes


def unusable_nodes(nodes: Sequence[dict[str, Any]]) -> list[ExcludedNode] | str:
    """The nodes left out for their GPUs, by the planner's own reading of them (or why the
    nodes could not be read)."""
    try:  # items of a list response carry no kind; the parser wants one
        inventory = parse_inventory([{**node, "kind": "Node"} for node in nodes])
    except UserError as err:
        return str(err)
    return [n for n in inventory.excluded if n.category in GPU_EXCLUSIONS]


def _goodput(percent: int | None) -> str:
    """The progress line's goodput part (rank 0's figure; absent before a world's second step)."""
    return "" if percent is None else f", goodput {percent}%"


def render(
    job: TrainingJob,
    events: list[dict[str, Any]],
    *,
    unusable: Sequence[ExcludedNode] | str = (),
) -> str:
    """The human summary (pure, so it is tested without a cluster). ``unusable``: the nodes
    left out for their GPUs, or why the nodes could not be read."""
    status, spec = job.status, job.spec
    world = status.world
    lines = [
        f"TrainingJob {job.metadata.namespace}/{job.metadata.name}: {status.phase or 'Pending'}",
        f"  replicas: desired {spec.replicas} (min {spec.min_replicas}"
        + (f", max {spec.max_replicas})" if spec.max_replicas else ")")
        + f", in world {world.replicas}, ready {status.ready_replicas}",
        f"  world: v{world.version}, {world.size} ranks; restarts {status.restarts}",
        f"  progress: step {status.progress.step}, {status.progress.samples_per_second} "
        f"samples/s, last checkpoint step {status.progress.last_checkpoint_step}"
        + _goodput(status.progress.goodput_percent),
    ]
    asked = status.capacity_request
    if asked is not None:
        lines.append(
            f"  capacity request: {asked.state}, {asked.workers} workers, since {asked.since}: "
            f"{asked.message}"
        )
    plan = status.plan
    if plan is not None:
        lines += [
            f"Plan: {plan.shape} (dp x tp x pp), micro-batch {plan.micro_batch_size}, "
            f"sharding {plan.sharding}, recompute {plan.recompute}",
            f"  GPUs: {plan.gpu_summary or '-'}; batch share per replica: "
            + (", ".join(f"{t} {n}" for t, n in plan.batch_shares.items()) or "-"),
            f"  predicted: {plan.predicted_step_millis / 1000:.3f} s/step, "
            f"{plan.predicted_tokens_per_second} tokens/s, bottleneck {plan.bottleneck or '-'}",
        ]
    if status.placement:
        by_node: dict[tuple[str, str], list[str]] = defaultdict(list)
        for entry in status.placement:
            by_node[(entry.node, entry.gpu_type)].append(f"{entry.pod}@{entry.rank}")
        lines.append("Placement (node, GPU type: pod@first-rank):")
        lines += [
            f"  {node:<24} {gpu:<16} {' '.join(pods)}" for (node, gpu), pods in by_node.items()
        ]
    if status.conditions:
        lines.append("Conditions:")
        lines += [
            f"  {c.type:<10} {c.status:<6} {c.reason:<22} {c.message}" for c in status.conditions
        ]
    if status.resizes:
        lines.append("Resizes:")
        lines += [
            f"  {r.time}  v{r.from_version}->v{r.to_version}  "
            f"{r.from_replicas}->{r.to_replicas} pods  {r.reason}"
            + (
                ""
                if r.downtime_millis is None
                else f"  stopped {r.downtime_millis / 1000:.1f}s (state from {r.state_from})"
            )
            for r in status.resizes[-5:]
        ]
    if events:
        lines.append("Events:")
        lines += [
            f"  {e.get('lastTimestamp', '')}  {e.get('type', ''):<8} "
            f"{e.get('reason', ''):<20} {e.get('message', '')}"
            for e in events[-10:]
        ]
    if isinstance(unusable, str):
        lines.append(f"Nodes: not read ({unusable})")
    elif unusable:
        lines.append(f"Nodes whose GPUs no job is planned on ({len(unusable)}):")
        lines += [f"  {n.name}: {n.reason}" for n in unusable]
    return "\n".join(lines)
