"""Fit the performance model's per-type GEMM efficiency to measured step times.

The catalog's ``gemm_efficiency`` is calibrated for A100 and H100 SXM only (see
``validation``); for any other type, or a cluster whose software stack differs, measure a few
steps and fit. The result is a ``ModelConstants`` to pass to ``plan_job``.

File format (YAML or JSON), one entry per measured layout::

    measurements:
      - gpuType: L40S            # catalog name or product label
        gpus: 16                 # GPUs of the run (8-GPU nodes assumed unless gpusPerNode)
        gpusPerNode: 8           # optional
        networkGbps: 400         # optional node NIC total; default: the catalog's
        model: {layers: 32, hiddenSize: 4096, ffnHiddenSize: 11008, attentionHeads: 32,
                kvHeads: 32, vocabSize: 32000, sequenceLength: 4096}
        globalBatchSize: 256
        precision: bf16          # optional, default bf16
        tp: 2
        pp: 1
        microBatchSize: 2
        sharding: optimizer      # none | optimizer | full
        recompute: selective     # none | selective | full
        stepTimeSeconds: 21.7    # measured, steady state (median over many steps)

Fitting: for each GPU type, a scalar search (golden section over efficiency in [0.05, 1])
minimises the sum of squared log ratios of predicted to measured step time over that type's
measurements; log ratios weigh a 10% miss equally on short and long steps. Types without
measurements keep the catalog default. The fit is deterministic.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from elastra.errors import UserError
from elastra.planner.catalog import Precision, lookup
from elastra.planner.inventory import Inventory, NodeCapacity, NodeName
from elastra.planner.job import (
    RECOMPUTE_MODES,
    SHARDING_MODES,
    JobRequirements,
    ModelShape,
    Recompute,
    Sharding,
)
from elastra.planner.perfmodel import DEFAULT_CONSTANTS, Layout, ModelConstants
from elastra.planner.search import evaluate_layout


@dataclass(frozen=True)
class Measurement:
    """One measured layout and its steady-state step time."""

    gpu_type: str
    gpus: int
    model: ModelShape
    global_batch_size: int
    tp: int
    pp: int
    micro_batch: int
    sharding: Sharding
    recompute: Recompute
    step_time_s: float
    precision: Precision = "bf16"
    gpus_per_node: int = 8
    network_gbps: float | None = None


def parse_measurements(document: Mapping[str, Any]) -> tuple[Measurement, ...]:
    """Measurements from the file format in the module docstring (UserError on bad input)."""
    entries = document.get("measurements")
    if not isinstance(entries, list) or not entries:
        raise UserError("measurements: expected a non-empty list")
    parsed = []
    for index, entry in enumerate(entries):
        where = f"measurements[{index}]"
        try:
            gpu = lookup(str(entry["gpuType"]))
            if gpu is None:
                raise UserError(f"{where}.gpuType: {entry['gpuType']!r} is not a catalog type")
            m = entry["model"]
            sharding, recompute = entry.get("sharding", "none"), entry.get("recompute", "none")
            if sharding not in SHARDING_MODES or recompute not in RECOMPUTE_MODES:
                raise UserError(f"{where}: sharding/recompute must be one of the documented modes")
            precision = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}[
                entry.get("precision", "bf16")
            ]
            parsed.append(
                Measurement(
                    gpu_type=gpu.name,
                    gpus=int(entry["gpus"]),
                    model=ModelShape(
                        layers=int(m["layers"]),
                        hidden_size=int(m["hiddenSize"]),
                        ffn_hidden_size=int(m["ffnHiddenSize"]),
                        attention_heads=int(m["attentionHeads"]),
                        kv_heads=int(m.get("kvHeads", m["attentionHeads"])),
                        vocab_size=int(m["vocabSize"]),
                        sequence_length=int(m["sequenceLength"]),
                    ),
                    global_batch_size=int(entry["globalBatchSize"]),
                    tp=int(entry["tp"]),
                    pp=int(entry["pp"]),
                    micro_batch=int(entry["microBatchSize"]),
                    sharding=sharding,
                    recompute=recompute,
                    step_time_s=float(entry["stepTimeSeconds"]),
                    precision=precision,  # type: ignore[arg-type]
                    gpus_per_node=int(entry.get("gpusPerNode", 8)),
                    network_gbps=float(entry["networkGbps"]) if "networkGbps" in entry else None,
                )
            )
        except KeyError as err:
            raise UserError(f"{where}: missing field {err.args[0]}") from None
        except (TypeError, ValueError) as err:
            raise UserError(f"{where}: {err}") from None
    return tuple(parsed)


def predict_step_s(measurement: Measurement, constants: ModelConstants) -> float | None:
    """The model's step time for a measured layout (None if it does not fit the model)."""
    gpu = lookup(measurement.gpu_type)
    assert gpu is not None
    per_node = measurement.gpus_per_node
    nodes = tuple(
        NodeCapacity(
            name=NodeName(f"n{i:05d}"),
            gpu_type=gpu,
            free_gpus=per_node,
            free_cpu_millis=64_000,
            network_gbps=measurement.network_gbps or gpu.node_network_gbps,
            zone="",
            block="",
        )
        for i in range(max(1, measurement.gpus // per_node))
    )
    pods = measurement.gpus // per_node
    job = JobRequirements(
        global_batch_size=measurement.global_batch_size,
        replicas=max(1, pods),
        gpus_per_worker=min(per_node, measurement.gpus),
        precision=measurement.precision,
        model=measurement.model,
        sharding=(measurement.sharding,),
    )
    result = evaluate_layout(
        job,
        Inventory(nodes=nodes),
        Layout(
            measurement.tp,
            measurement.pp,
            measurement.micro_batch,
            measurement.sharding,
            measurement.recompute,
            measurement.precision,
        ),
        pods=((gpu.name, max(1, pods)),),
        constants=constants,
    )
    return result.plans[0].predicted.step_time_s if result.feasible else None


def fit(
    measurements: Sequence[Measurement], base: ModelConstants = DEFAULT_CONSTANTS
) -> ModelConstants:
    """``base`` with a fitted efficiency for every type that has measurements."""
    fitted = dict(base.efficiency)
    for name in sorted({m.gpu_type for m in measurements}):
        mine = [m for m in measurements if m.gpu_type == name]

        def loss(efficiency: float, mine: list[Measurement] = mine, name: str = name) -> float:
            trial = dataclasses.replace(
                base, efficiency=tuple(sorted({**fitted, name: efficiency}.items()))
            )
            total = 0.0
            for m in mine:
                predicted = predict_step_s(m, trial)
                total += math.inf if predicted is None else math.log(predicted / m.step_time_s) ** 2
            return total

        fitted[name] = _golden_minimum(loss, 0.05, 1.0)
    return dataclasses.replace(base, efficiency=tuple(sorted(fitted.items())))


def _golden_minimum(f: Any, low: float, high: float, iterations: int = 40) -> float:
    ratio = (math.sqrt(5) - 1) / 2
    a, b = low, high
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(iterations):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = f(d)
    return round((a + b) / 2, 4)
