"""What a simulation reports: job completion times, makespan, utilisation, restarts.

``SimResult.to_json`` is a contract (``elastra simulate --output json``): the keys
``policy``, ``jobs``, ``avgJctSeconds``, ``p50JctSeconds``, ``p99JctSeconds``,
``makespanSeconds``, ``gpuUtilization`` (0..1) and ``restarts`` keep their names and meaning.
JCT is finish minus submit time; makespan is the last finish, from the trace start;
utilisation is allocated GPU-seconds over (cluster GPUs x makespan).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SimResult:
    """One policy's run over one trace; ``jcts`` per job in trace order, ``timeline`` as
    (time, allocated GPUs) steps."""

    policy: str
    jobs: int
    avg_jct_s: float
    p50_jct_s: float
    p99_jct_s: float
    makespan_s: float
    gpu_utilization: float
    restarts: int
    jcts: tuple[float, ...] = ()
    timeline: tuple[tuple[float, int], ...] = ()
    cluster_gpus: int = 0
    wall_s: float = 0.0
    planner_calls: int = 0

    def to_json(self) -> dict[str, Any]:
        """The JSON contract (see the module docstring)."""
        return {
            "policy": self.policy,
            "jobs": self.jobs,
            "avgJctSeconds": round(self.avg_jct_s, 3),
            "p50JctSeconds": round(self.p50_jct_s, 3),
            "p99JctSeconds": round(self.p99_jct_s, 3),
            "makespanSeconds": round(self.makespan_s, 3),
            "gpuUtilization": round(self.gpu_utilization, 4),
            "restarts": self.restarts,
        }


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100), linear between closest ranks; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(
    policy: str,
    *,
    jcts: Sequence[float],
    makespan_s: float,
    timeline: Sequence[tuple[float, int]],
    cluster_gpus: int,
    restarts: int,
) -> SimResult:
    """A result from per-job JCTs and the allocation timeline."""
    busy = 0.0
    for (start, gpus), (end, _) in zip(timeline, [*timeline[1:], (makespan_s, 0)], strict=True):
        busy += gpus * max(0.0, min(end, makespan_s) - start)
    capacity = cluster_gpus * makespan_s
    return SimResult(
        policy=policy,
        jobs=len(jcts),
        avg_jct_s=sum(jcts) / len(jcts) if jcts else 0.0,
        p50_jct_s=percentile(jcts, 50),
        p99_jct_s=percentile(jcts, 99),
        makespan_s=makespan_s,
        gpu_utilization=min(1.0, busy / capacity) if capacity > 0 else 0.0,
        restarts=restarts,
        jcts=tuple(jcts),
        timeline=tuple(timeline),
        cluster_gpus=cluster_gpus,
    )


def render_table(results: Sequence[SimResult]) -> str:
    """Results for people: one row per policy, times in hours."""
    header = (
        f"{'policy':<11} {'jobs':>6} {'avg JCT h':>10} {'p50 JCT h':>10} {'p99 JCT h':>10} "
        f"{'makespan h':>11} {'GPU util':>9} {'restarts':>9}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        lines.append(
            f"{r.policy:<11} {r.jobs:>6} {r.avg_jct_s / 3600:>10.2f} {r.p50_jct_s / 3600:>10.2f} "
            f"{r.p99_jct_s / 3600:>10.2f} {r.makespan_s / 3600:>11.2f} "
            f"{r.gpu_utilization:>9.1%} {r.restarts:>9}"
        )
    return "\n".join(lines)
