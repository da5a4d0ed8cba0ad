"""PyTorch-native building blocks that execute a plan's tensor, pipeline and sharded parallelism.

Apply them in this order on each (stage) module: ``apply_tensor_parallel`` (tp > 1), then
``apply_recompute``, then ``apply_fsdp``; pipeline stages wrap the result last.
"""

from elastra_worker.parallel.fsdp import apply_fsdp
from elastra_worker.parallel.pipeline import (
    build_stage_modules,
    make_pipeline_stages,
    make_schedule,
    stage_ids,
)
from elastra_worker.parallel.recompute import apply_recompute
from elastra_worker.parallel.tensor import apply_tensor_parallel

__all__ = [
    "apply_fsdp",
    "apply_recompute",
    "apply_tensor_parallel",
    "build_stage_modules",
    "make_pipeline_stages",
    "make_schedule",
    "stage_ids",
]
