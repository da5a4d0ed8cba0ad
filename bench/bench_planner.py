"""How fast the planner plans: a 70B-class model on up to 1,024 GPUs of four types.

Prints plans per second for the full case (heterogeneous job, 4 types x 256 GPUs, 128 pods of
8) and how the time grows with the GPU count (same four types, fewer nodes) and with the
number of types (1,024 GPUs split over 1-4 types), as ratios measured in this run. Times are
CPU seconds of this process (the planner is single-threaded, so: one core), which a busy
shared machine distorts less than wall time; absolute figures are context, the target is
well under one second per plan.
"""

from __future__ import annotations

import statistics
import sys
import time

from elastra.planner import JobRequirements, ModelShape, plan_job
from elastra.planner.catalog import by_name
from elastra.planner.inventory import Inventory, NodeCapacity, NodeName

LLAMA_70B = ModelShape(80, 8192, 28672, 64, 8, 32000, 4096)
TYPES = ("H100-SXM-80GB", "A100-SXM-80GB", "MI300X", "H200-SXM-141GB")
REPEATS = 3


def inventory(gpus: int, types: int) -> Inventory:
    """``gpus`` GPUs in 8-GPU nodes, split evenly over the first ``types`` types."""
    per_type = gpus // 8 // types
    nodes = tuple(
        NodeCapacity(
            name=NodeName(f"{name.lower()}-{i:04d}"),
            gpu_type=by_name(name),
            free_gpus=8,
            free_cpu_millis=96_000,
            network_gbps=by_name(name).node_network_gbps,
            zone="z",
            block=f"{name}-{i // 16}",
        )
        for name in TYPES[:types]
        for i in range(per_type)
    )
    return Inventory(nodes=tuple(sorted(nodes, key=lambda n: n.name)))


def job(gpus: int) -> JobRequirements:
    return JobRequirements(
        global_batch_size=1024,
        replicas=gpus // 8,
        min_replicas=1,
        gpus_per_worker=8,
        model=LLAMA_70B,
        heterogeneous=True,
    )


def seconds_per_plan(gpus: int, types: int) -> tuple[float, int, str]:
    cluster, requirements = inventory(gpus, types), job(gpus)
    times = []
    result = None
    for _ in range(REPEATS):
        started = time.process_time()
        result = plan_job(requirements, cluster)
        times.append(time.process_time() - started)
    assert result is not None and result.feasible, result and result.reason
    return statistics.median(times), result.candidates, result.plans[0].summary()


def main() -> int:
    full, candidates, summary = seconds_per_plan(1024, 4)
    print(
        f"70B on 1024 GPUs of 4 types: {full:.3f} CPU s/plan = {1 / full:.1f} plans/s "
        f"({candidates} layouts evaluated)"
    )
    print(f"  chosen: {summary}")
    print("growth with GPU count (4 types):")
    base = None
    for gpus in (128, 256, 512, 1024):
        t = full if gpus == 1024 else seconds_per_plan(gpus, 4)[0]
        base = base or t
        print(f"  {gpus:5d} GPUs: time({gpus})/time(128) = {t / base:.2f}")
    print("growth with number of types (1024 GPUs):")
    one = None
    for types in (1, 2, 3, 4):
        t = full if types == 4 else seconds_per_plan(1024, types)[0]
        one = one or t
        print(f"  {types} type(s): time({types})/time(1) = {t / one:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
