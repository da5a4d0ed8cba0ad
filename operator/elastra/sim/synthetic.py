"""Synthetic traces shaped like published GPU cluster traces.

Two shapes, each a job-size mix plus a log-normal run time per size class, with Poisson
arrivals whose rate is set from the offered load the caller asks for:

- ``PHILLY`` follows Microsoft's Philly trace as characterised by Jeon et al., "Analysis of
  Large-Scale Multi-Tenant GPU Clusters for DNN Training Workloads", USENIX ATC'19 (arXiv
  1901.05758): most jobs use one GPU and the mix falls off through 2-4, 5-8 and >8 GPUs (the
  paper's breakdown of jobs by GPU count); run times spread over minutes to days and grow with
  the job's size (its CDFs of run time per size class). Our medians: 1 GPU 30 min, 2-4 GPUs
  1 h, 5-8 GPUs 2 h, more 4 h, with a log-normal spread of sigma 1.5 (a decade either side
  holds ~87% of jobs).
- ``HELIOS`` follows SenseTime's Helios traces as characterised by Hu et al.,
  "Characterization and Prediction of Deep Learning Workloads in Large-Scale GPU
  Datacenters", SC'21: GPU jobs are shorter than Philly's (its CDF of GPU job duration has a
  median of minutes, with a long tail of multi-day jobs) and a larger share asks for a whole
  8-GPU node or more (its CDF of requested GPUs). Our medians: 1 GPU 10 min, 2-4 GPUs 20 min,
  8 GPUs 40 min, more 1.5 h, sigma 1.8.

The figures above are our reading of those distributions, not fitted parameters; a user with
the real trace should load it (``elastra.sim.public``) instead. Elastic bounds are ours too:
a job may run on a quarter to twice its request (``minGpus``, ``maxGpus``), as elastic
schedulers (Pollux, OSDI'21; EasyScale, SC'23) assume of training jobs.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from elastra.errors import UserError
from elastra.sim.models import default_model
from elastra.sim.trace import TraceJob


@dataclass(frozen=True)
class TraceShape:
    """A published trace's shape: (GPUs, share) and, per size, (upper GPUs, median s, sigma)."""

    name: str
    sizes: tuple[tuple[int, float], ...]
    durations: tuple[tuple[int, float, float], ...]
    min_duration_s: float = 60.0
    max_duration_s: float = 7 * 86400.0

    def duration_params(self, gpus: int) -> tuple[float, float]:
        """(median seconds, sigma) of the run time of a job of ``gpus``."""
        for upto, median, sigma in self.durations:
            if gpus <= upto:
                return median, sigma
        _, median, sigma = self.durations[-1]
        return median, sigma

    def mean_gpu_seconds(self, max_gpus: int) -> float:
        """Expected GPU-seconds of one job (sizes above ``max_gpus`` dropped)."""
        sizes = [(g, w) for g, w in self.sizes if g <= max_gpus]
        total = sum(w for _, w in sizes)
        mean = 0.0
        for gpus, weight in sizes:
            median, sigma = self.duration_params(gpus)
            mean += weight / total * gpus * median * math.exp(sigma * sigma / 2)
        return mean


PHILLY = TraceShape(
    name="philly",
    sizes=((1, 0.62), (2, 0.10), (4, 0.12), (8, 0.11), (16, 0.035), (32, 0.012), (64, 0.003)),
    durations=((1, 1800.0, 1.5), (4, 3600.0, 1.5), (8, 7200.0, 1.5), (1 << 30, 14400.0, 1.5)),
)
HELIOS = TraceShape(
    name="helios",
    sizes=((1, 0.50), (2, 0.08), (4, 0.12), (8, 0.20), (16, 0.06), (32, 0.03), (64, 0.01)),
    durations=((1, 600.0, 1.8), (4, 1200.0, 1.8), (8, 2400.0, 1.8), (1 << 30, 5400.0, 1.8)),
)
SHAPES = {shape.name: shape for shape in (PHILLY, HELIOS)}


def generate(
    shape: TraceShape,
    *,
    jobs: int,
    types: Sequence[tuple[str, int]],
    load: float,
    rng: random.Random,
    max_gpus: int = 64,
) -> tuple[TraceJob, ...]:
    """``jobs`` jobs of ``shape`` for a cluster with ``types`` (catalog name, GPUs).

    Each job asks for a type with probability proportional to its GPUs, and a size no larger
    than that type's GPUs (nor ``max_gpus``). Arrivals are Poisson at the rate that offers
    ``load`` (requested GPU-seconds per cluster GPU-second; 1.0 saturates the cluster at the
    requested sizes).
    """
    if jobs < 1 or load <= 0 or not types:
        raise UserError("generate: need jobs >= 1, load > 0 and at least one GPU type")
    capacity = sum(gpus for _, gpus in types)
    per_second = load * capacity / shape.mean_gpu_seconds(max_gpus)
    names = [name for name, _ in types]
    weights = [gpus for _, gpus in types]
    clock = 0.0
    out: list[TraceJob] = []
    for index in range(jobs):
        clock += rng.expovariate(per_second)
        gpu_type = rng.choices(names, weights)[0]
        limit = min(max_gpus, dict(types)[gpu_type])
        sizes = [(g, w) for g, w in shape.sizes if g <= limit] or [(1, 1.0)]
        gpus = rng.choices([g for g, _ in sizes], [w for _, w in sizes])[0]
        median, sigma = shape.duration_params(gpus)
        duration = median * math.exp(rng.gauss(0.0, sigma))
        duration = min(max(duration, shape.min_duration_s), shape.max_duration_s)
        out.append(
            TraceJob(
                name=f"{shape.name}-{index:05d}",
                submit_s=round(clock, 3),
                gpus=gpus,
                gpu_type=gpu_type,
                duration_s=round(duration, 3),
                min_gpus=max(1, gpus // 4),
                max_gpus=min(2 * gpus, limit),
                model=default_model(gpus),
                line=index + 2,
            )
        )
    return tuple(out)
