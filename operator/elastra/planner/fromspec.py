"""The one adapter from the TrainingJob spec (``elastra.api``) to ``JobRequirements``.

Kept apart from ``job`` so the planner core does not depend on the CRD's shape: only this
module changes when the API does. ``check_gpu_types`` turns a ``worker.gpuTypes`` entry that
selects nothing into a ``UserError`` naming the field, instead of a silently empty plan.
"""

from __future__ import annotations

from collections.abc import Iterable

from elastra.api import TrainingJobSpec
from elastra.errors import UserError
from elastra.planner.catalog import CATALOG, GpuType, Precision, known_pattern
from elastra.planner.job import SHARDING_MODES, JobRequirements, ModelShape, Sharding

_PRECISIONS: dict[str, Precision] = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}
_SHARDINGS: dict[str, Sharding] = {mode: mode for mode in SHARDING_MODES}


def requirements_from_spec(spec: TrainingJobSpec) -> JobRequirements:
    """What the planner needs from a TrainingJob spec."""
    model = None
    if spec.model is not None:
        m = spec.model
        model = ModelShape(
            layers=m.layers,
            hidden_size=m.hidden_size,
            ffn_hidden_size=m.ffn_hidden_size,
            attention_heads=m.attention_heads,
            kv_heads=m.kv_heads if m.kv_heads is not None else m.attention_heads,
            vocab_size=m.vocab_size,
            sequence_length=m.sequence_length,
        )
    parallelism = spec.parallelism
    manual = parallelism.mode == "manual"
    # bitwise sums every logical share's gradient in a fixed order through whole replicas:
    # data parallel only (the API server refuses manual tensor or pipeline > 1 with it).
    data_parallel_only = spec.training.consistency == "bitwise"
    # ... and every rank holds the whole model (no ZeRO/FSDP) unless the spec says otherwise.
    sharding: tuple[Sharding, ...] = ("none",) if data_parallel_only else SHARDING_MODES
    if parallelism.sharding is not None:
        sharding = (_SHARDINGS[str(parallelism.sharding)],)
    return JobRequirements(
        global_batch_size=spec.training.global_batch_size,
        replicas=spec.replicas,
        min_replicas=spec.min_replicas,
        gpus_per_worker=spec.worker.gpus,
        precision=_PRECISIONS[str(spec.training.precision)],
        model=model,
        gpu_types=tuple(spec.worker.gpu_types),
        tensor=1 if data_parallel_only else parallelism.tensor if manual else None,
        pipeline=1 if data_parallel_only else parallelism.pipeline if manual else None,
        sharding=sharding,
        objective="cost" if str(spec.placement.objective) == "cost" else "throughput",
        heterogeneous=spec.placement.heterogeneous,
        cpus_per_worker=_cpus(spec.worker.resources.requests.get("cpu", "1")),
        cpu_ranks=spec.worker.cpu_ranks,
        micro_batch=spec.training.micro_batch_size,
    )


def check_gpu_types(patterns: Iterable[str], inventory_types: Iterable[GpuType] = ()) -> None:
    """Raise ``UserError`` for a ``worker.gpuTypes`` entry that selects no known type."""
    extra = tuple(inventory_types)
    for pattern in patterns:
        if not known_pattern(pattern, extra):
            names = ", ".join(gpu.name for gpu in CATALOG)
            raise UserError(
                f"spec.worker.gpuTypes: {pattern!r} matches no GPU type; use a catalog name "
                f"or marketing name ({names}) or a GPU Feature Discovery product label"
            )


def _cpus(quantity: str) -> float:
    text = quantity.strip()
    try:
        return float(text[:-1]) / 1000 if text.endswith("m") else float(text)
    except ValueError:
        raise UserError(
            f"spec.worker.resources.requests.cpu: {quantity!r} is not a CPU count"
        ) from None
