"""Trace simulator: the four policies on the committed trace, and how run time scales.

Part 1 replays ``bench/traces/philly-300-hetero-small.csv`` (300 Philly-shaped jobs, see
``elastra.sim.synthetic``) on the ``hetero-small`` fleet under every policy and prints the
table plus ratios of average JCT (each baseline over ``elastra``): above 1 means ``elastra``
finishes jobs sooner. Part 2 times the ``elastra`` policy (the slowest: it plans parallelism)
on generated Philly-shaped traces against heterogeneous fleets of growing size, and prints how
run time grows with jobs and with GPUs, as ratios to the smallest run. Absolute seconds are
context only (the machine is shared).
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

from elastra.sim.experiment import run_policies
from elastra.sim.fleet import SimCluster, load_cluster, parse_cluster
from elastra.sim.metrics import render_table
from elastra.sim.policies import POLICY_NAMES
from elastra.sim.synthetic import PHILLY, generate
from elastra.sim.trace import load_trace

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "bench" / "traces" / "philly-300-hetero-small.csv"
FLEET = ROOT / "e2e" / "fleets" / "hetero-small.yaml"

# (group, product, GPUs per node, share of the fleet's GPUs)
MIX = (
    ("h100", "NVIDIA-H100-80GB-HBM3", 8, 0.3, 3200),
    ("a100", "NVIDIA-A100-SXM4-80GB", 8, 0.3, 400),
    ("v100", "Tesla-V100-SXM2-16GB", 8, 0.2, 100),
    ("t4", "Tesla-T4", 4, 0.2, 50),
)


def fleet(gpus: int) -> SimCluster:
    """A heterogeneous fleet of about ``gpus`` GPUs in the proportions of ``MIX``."""
    groups = []
    for prefix, product, per_node, share, network in MIX:
        count = max(1, round(gpus * share / per_node))
        groups.append(
            f"  - {{prefix: {prefix}, count: {count}, gpu: {{product: {product}, "
            f"count: {per_node}}}, cpu: '64', memory: 512Gi, networkGbps: {network}, "
            f"blockSize: 32}}"
        )
    text = f"kind: Fleet\nname: scale-{gpus}\ngroups:\n" + "\n".join(groups) + "\n"
    return parse_cluster(text, source=f"<scale-{gpus}>")


def timed(cluster: SimCluster, jobs: int, *, seed: int = 7) -> tuple[float, int]:
    """Seconds to simulate ``jobs`` Philly-shaped jobs under ``elastra``; planner calls."""
    types: dict[str, int] = {}
    for node in cluster.inventory.nodes:
        types[node.gpu_type.name] = types.get(node.gpu_type.name, 0) + node.free_gpus
    trace = generate(
        PHILLY, jobs=jobs, types=sorted(types.items()), load=0.9, rng=random.Random(seed)
    )
    started = time.process_time()
    (result,) = run_policies(cluster, trace, ["elastra"])
    return time.process_time() - started, result.planner_calls


def main() -> int:
    """Print the policy table, the JCT ratios and the scaling table."""
    cluster = load_cluster(FLEET)
    jobs = load_trace(TRACE)
    results = {r.policy: r for r in run_policies(cluster, jobs, POLICY_NAMES, source=str(TRACE))}
    print(
        f"{len(jobs)} jobs from {TRACE.relative_to(ROOT)} on {cluster.name} ({cluster.gpus} GPUs)"
    )
    print(render_table(list(results.values())))
    elastra = results["elastra"]
    for name in ("static", "gavel-like", "elastic"):
        base = results[name]
        print(
            f"avg JCT {name}/elastra = {base.avg_jct_s / elastra.avg_jct_s:.2f}x   "
            f"p99 JCT {name}/elastra = {base.p99_jct_s / elastra.p99_jct_s:.2f}x   "
            f"makespan {name}/elastra = {base.makespan_s / elastra.makespan_s:.2f}x"
        )
    failed = [
        name for name in ("static", "gavel-like") if results[name].avg_jct_s <= elastra.avg_jct_s
    ]

    quick = "--quick" in sys.argv
    sizes = [(1000, 1000), (2500, 1000), (5000, 1000), (10000, 1000)]
    sizes += [(2500, 250), (2500, 500), (2500, 2000)]
    if quick:
        sizes = [(500, 250), (1000, 250), (1000, 500)]
    print("\nscaling (elastra policy, CPU seconds on one core, Philly-shaped, load 0.9)")
    print(f"{'jobs':>6} {'GPUs':>6} {'seconds':>8} {'planner calls':>14} {'vs first':>9}")
    first: float | None = None
    for count, gpus in sizes:
        seconds, calls = timed(fleet(gpus), count)
        first = first or seconds
        print(f"{count:>6} {gpus:>6} {seconds:>8.1f} {calls:>14} {seconds / first:>8.1f}x")
    if failed:
        print(f"bench_sim: FAILED elastra's avg JCT is not below {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
