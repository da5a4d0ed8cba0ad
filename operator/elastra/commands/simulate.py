"""``elastra simulate --cluster FLEET.yaml --trace TRACE.csv --policy POLICY``: replay a trace.

FLEET.yaml is a fleet file (``e2e/fleets/README.md``) or a NodeList; TRACE.csv the contract in
``elastra.sim.trace`` (``--format philly|helios`` reads those public traces instead).
``--policy`` takes one policy, a comma-separated list, or ``all``. ``--output json`` prints
the contract of ``elastra.sim.metrics`` (an object for one policy, a list for several);
``--plots DIR`` writes ``jct_cdf.png`` and ``utilization.png``. Exit status: 0 done, 2 bad
input (one line naming the file, line and field; nothing is simulated).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from elastra.errors import UserError
from elastra.sim.engine import FaultRates
from elastra.sim.experiment import run_policies
from elastra.sim.fleet import load_cluster
from elastra.sim.metrics import render_table
from elastra.sim.plots import write_plots
from elastra.sim.policies import POLICY_NAMES
from elastra.sim.public import load_helios, load_philly
from elastra.sim.trace import load_trace


def register(sub: Any) -> None:
    """Add the ``simulate`` subcommand."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "simulate",
        help="replay a job trace on a simulated cluster under scheduling policies",
        description="Replay a job trace on a simulated cluster (fleet file or NodeList) with "
        "the planner's speed model and the operator's resize policy. Exit 0: done; 2: bad input.",
    )
    parser.add_argument("--cluster", metavar="FLEET.yaml", required=True, help="fleet or NodeList")
    parser.add_argument("--trace", metavar="TRACE.csv", required=True, help="jobs to replay")
    parser.add_argument(
        "--policy",
        required=True,
        metavar="POLICY",
        help=f"one of {', '.join(POLICY_NAMES)}, a comma-separated list, or all",
    )
    parser.add_argument("--output", "-o", choices=("table", "json"), default="table")
    parser.add_argument("--plots", metavar="DIR", help="write jct_cdf.png and utilization.png")
    parser.add_argument(
        "--format",
        choices=("elastra", "philly", "helios"),
        default="elastra",
        help="trace format: the CSV contract (default), Philly's cluster_job_log (JSON) or "
        "Helios' cluster_log.csv",
    )
    parser.add_argument(
        "--gpu-type",
        metavar="TYPE",
        help="GPU type for public traces, which name none (default: the cluster's most common)",
    )
    parser.add_argument("--failures-per-gpu-hour", type=float, default=0.0, metavar="RATE")
    parser.add_argument("--preemptions-per-gpu-hour", type=float, default=0.0, metavar="RATE")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault process (0)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Check all input, simulate each policy, print (and plot); see the module docstring."""
    policies = _policies(args.policy)
    faults = FaultRates(
        failures_per_gpu_hour=args.failures_per_gpu_hour,
        preemptions_per_gpu_hour=args.preemptions_per_gpu_hour,
        seed=args.seed,
    )
    cluster = load_cluster(args.cluster)
    if args.format == "elastra":
        jobs = load_trace(args.trace)
    else:
        gpu_type = args.gpu_type or _most_common_type(cluster.inventory)
        loader = load_philly if args.format == "philly" else load_helios
        jobs = loader(args.trace, gpu_type=gpu_type)
    results = run_policies(cluster, jobs, policies, faults=faults, source=args.trace)
    if args.plots:
        write_plots(results, Path(args.plots))
    if args.output == "json":
        documents = [r.to_json() for r in results]
        print(json.dumps(documents[0] if len(documents) == 1 else documents, indent=2))
    else:
        print(f"{len(jobs)} jobs from {args.trace} on {cluster.name} ({cluster.gpus} GPUs)")
        print(render_table(results))
    return 0


def _policies(text: str) -> list[str]:
    names = list(POLICY_NAMES) if text.strip() == "all" else [p.strip() for p in text.split(",")]
    unknown = [n for n in names if n not in POLICY_NAMES]
    if unknown or not names:
        raise UserError(
            f"--policy: unknown policy {', '.join(unknown) or text!r} "
            f"(one of {', '.join(POLICY_NAMES)}, or all)"
        )
    return list(dict.fromkeys(names))


def _most_common_type(inventory: Any) -> str:
    counts: dict[str, int] = {}
    for node in inventory.nodes:
        if not node.gpu_type.is_cpu:
            counts[node.gpu_type.name] = counts.get(node.gpu_type.name, 0) + node.free_gpus
    if not counts:
        raise UserError("--cluster: the cluster has no GPU nodes")
    return max(sorted(counts), key=lambda name: counts[name])
