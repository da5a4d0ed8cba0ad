"""Reference models the runtime knows how to split for tensor, pipeline and sharded parallelism."""

from elastra_worker.models.llama import (
    ModelConfig,
    ModelConfigError,
    TokenFile,
    Transformer,
    init_weights,
    loss_fn,
    make_batch,
    validate_plan,
)

__all__ = [
    "ModelConfig",
    "ModelConfigError",
    "TokenFile",
    "Transformer",
    "init_weights",
    "loss_fn",
    "make_batch",
    "validate_plan",
]
