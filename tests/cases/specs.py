"""TrainingJob specs that must be rejected, and ones that must be accepted.

One table, two judges: the unit tests feed every case to the pydantic models, the
integration tests send it to a real API server with the generated CRD. Each invalid case
names the field the error must blame and a fragment of the message: ``local`` for the
models' wording, ``server`` for the API server's (the same when the message is one of our
CEL rules). A case is applied as a set of dotted-path edits to a known-good manifest.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

DELETE = object()
"""Edit value that removes the field instead of setting it."""


def base_manifest(name: str = "case") -> dict[str, Any]:
    """A small valid GPU job every case starts from."""
    return {
        "apiVersion": "elastra.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "replicas": 4,
            "minReplicas": 2,
            "maxReplicas": 8,
            "worker": {"gpus": 8, "gpuTypes": ["H100"], "image": "elastra-worker:dev"},
            "model": {
                "layers": 32,
                "hiddenSize": 4096,
                "ffnHiddenSize": 11008,
                "attentionHeads": 32,
                "vocabSize": 32000,
                "sequenceLength": 4096,
            },
            "training": {"globalBatchSize": 256},
        },
    }


def apply_edits(manifest: dict[str, Any], edits: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``manifest`` with each ``a.b.c: value`` edit applied."""
    out = copy.deepcopy(manifest)
    for path, value in edits.items():
        *parents, leaf = path.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        if value is DELETE:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return out


@dataclass(frozen=True)
class InvalidCase:
    """A spec both judges must reject, blaming ``field`` with the given message fragments."""

    id: str
    edits: dict[str, Any]
    field: str
    local: str
    server: str

    def manifest(self, name: str = "case") -> dict[str, Any]:
        return apply_edits(base_manifest(name), self.edits)


@dataclass(frozen=True)
class ValidCase:
    """A spec both judges must accept."""

    id: str
    edits: dict[str, Any] = field(default_factory=dict)

    def manifest(self, name: str = "case") -> dict[str, Any]:
        return apply_edits(base_manifest(name), self.edits)


def _same(id: str, edits: dict[str, Any], field: str, message: str) -> InvalidCase:
    """A case whose message is one of our CEL rules: both judges use the same words."""
    return InvalidCase(id=id, edits=edits, field=field, local=message, server=message)


INVALID_SPECS: tuple[InvalidCase, ...] = (
    InvalidCase(
        "replicas-zero",
        {"spec.replicas": 0},
        "spec.replicas",
        "greater than or equal to 1",
        "greater than or equal to 1",
    ),
    InvalidCase(
        "replicas-too-many",
        {"spec.replicas": 5000, "spec.maxReplicas": DELETE},
        "spec.replicas",
        "less than or equal to 4096",
        "less than or equal to 4096",
    ),
    InvalidCase(
        "replicas-missing",
        {"spec.replicas": DELETE},
        "spec.replicas",
        "required field is missing",
        "Required value",
    ),
    InvalidCase(
        "replicas-string",
        {"spec.replicas": "four"},
        "spec.replicas",
        "valid integer",
        "must be of type integer",
    ),
    _same(
        "min-above-replicas",
        {"spec.minReplicas": 6},
        "spec.minReplicas",
        "minReplicas must be <= replicas",
    ),
    _same(
        "replicas-above-max",
        {"spec.replicas": 9},
        "spec.replicas",
        "replicas must be <= maxReplicas",
    ),
    InvalidCase(
        "min-zero",
        {"spec.minReplicas": 0},
        "spec.minReplicas",
        "greater than or equal to 1",
        "greater than or equal to 1",
    ),
    InvalidCase(
        "gpus-negative",
        {"spec.worker.gpus": -1},
        "spec.worker.gpus",
        "greater than or equal to 0",
        "greater than or equal to 0",
    ),
    InvalidCase(
        "gpus-too-many",
        {"spec.worker.gpus": 17},
        "spec.worker.gpus",
        "less than or equal to 16",
        "less than or equal to 16",
    ),
    _same(
        "cpu-job-with-gpu-types",
        {"spec.worker.gpus": 0},
        "spec.worker.gpuTypes",
        "gpuTypes needs gpus > 0",
    ),
    InvalidCase(
        "too-many-gpu-types",
        {"spec.worker.gpuTypes": [f"T{i}" for i in range(17)]},
        "spec.worker.gpuTypes",
        "at most 16 items",
        "must have at most 16 items",
    ),
    InvalidCase(
        "gpu-type-bad-characters",
        {"spec.worker.gpuTypes": ["H100 SXM"]},
        "spec.worker.gpuTypes",
        "should match pattern",
        "should match",
    ),
    InvalidCase(
        "image-missing",
        {"spec.worker.image": DELETE},
        "spec.worker.image",
        "required field is missing",
        "Required value",
    ),
    InvalidCase(
        "image-too-long",
        {"spec.worker.image": "r/" + "x" * 600},
        "spec.worker.image",
        "at most 512 characters",
        "512",
    ),
    InvalidCase(
        "env-bad-name",
        {"spec.worker.env": [{"name": "1BAD", "value": "x"}]},
        "spec.worker.env",
        "should match pattern",
        "should match",
    ),
    _same(
        "gpu-in-resources",
        {"spec.worker.resources": {"limits": {"nvidia.com/gpu": "8"}}},
        "spec.worker.resources",
        "set GPUs with worker.gpus",
    ),
    InvalidCase(
        "bad-quantity",
        {"spec.worker.resources": {"requests": {"memory": "lots"}}},
        "spec.worker.resources.requests",
        "should match pattern",
        "should match",
    ),
    InvalidCase(
        "unknown-precision",
        {"spec.training.precision": "fp8"},
        "spec.training.precision",
        "'bf16', 'fp16' or 'fp32'",
        'supported values: "bf16", "fp16", "fp32"',
    ),
    InvalidCase(
        "unknown-consistency",
        {"spec.training.consistency": "exact"},
        "spec.training.consistency",
        "'none', 'data' or 'bitwise'",
        'supported values: "none", "data", "bitwise"',
    ),
    InvalidCase(
        "global-batch-zero",
        {"spec.training.globalBatchSize": 0},
        "spec.training.globalBatchSize",
        "greater than or equal to 1",
        "greater than or equal to 1",
    ),
    InvalidCase(
        "training-missing",
        {"spec.training": DELETE},
        "spec.training",
        "required field is missing",
        "Required value",
    ),
    _same(
        "manual-without-pipeline",
        {"spec.parallelism": {"mode": "manual", "tensor": 2}},
        "spec.parallelism.mode",
        "mode: manual needs both tensor and pipeline",
    ),
    _same(
        "tensor-in-auto-mode",
        {"spec.parallelism": {"tensor": 2}},
        "spec.parallelism.mode",
        "tensor and pipeline are honoured only with mode: manual",
    ),
    InvalidCase(
        "unknown-parallelism-mode",
        {"spec.parallelism": {"mode": "magic"}},
        "spec.parallelism.mode",
        "'auto' or 'manual'",
        'supported values: "auto", "manual"',
    ),
    _same(
        "tensor-not-dividing-gpus",
        {
            "spec.parallelism": {"mode": "manual", "tensor": 3, "pipeline": 1},
            "spec.model.attentionHeads": 48,
            "spec.model.hiddenSize": 4608,
        },
        "spec.parallelism.tensor",
        "parallelism.tensor must divide worker.gpus",
    ),
    _same(
        "tensor-not-dividing-heads",
        {
            "spec.parallelism": {"mode": "manual", "tensor": 8, "pipeline": 1},
            "spec.model.attentionHeads": 36,
            "spec.model.hiddenSize": 4608,
        },
        "spec.parallelism.tensor",
        "parallelism.tensor must divide model.attentionHeads",
    ),
    _same(
        "pipeline-above-layers",
        {"spec.parallelism": {"mode": "manual", "tensor": 1, "pipeline": 40}},
        "spec.parallelism.pipeline",
        "parallelism.pipeline must be <= model.layers",
    ),
    InvalidCase(
        "unknown-sharding",
        {"spec.parallelism": {"sharding": "zero3"}},
        "spec.parallelism.sharding",
        "'none', 'optimizer' or 'full'",
        'supported values: "none", "optimizer", "full"',
    ),
    _same(
        "hidden-not-multiple-of-heads",
        {"spec.model.hiddenSize": 4100},
        "spec.model.hiddenSize",
        "hiddenSize must be a multiple of attentionHeads",
    ),
    _same(
        "kv-heads-not-dividing",
        {"spec.model.kvHeads": 5},
        "spec.model.kvHeads",
        "kvHeads must divide attentionHeads",
    ),
    InvalidCase(
        "model-layers-zero",
        {"spec.model.layers": 0},
        "spec.model.layers",
        "greater than or equal to 1",
        "greater than or equal to 1",
    ),
    InvalidCase(
        "unknown-objective",
        {"spec.placement": {"objective": "speed"}},
        "spec.placement.objective",
        "'throughput' or 'cost'",
        'supported values: "throughput", "cost"',
    ),
    _same(
        "volume-and-uri",
        {"spec.checkpoint": {"volume": "ckpt", "uri": "s3://bucket/ckpt"}},
        "spec.checkpoint.uri",
        "set volume or uri, not both",
    ),
    InvalidCase(
        "volume-not-dns",
        {"spec.checkpoint": {"volume": "My_Claim"}},
        "spec.checkpoint.volume",
        "should match pattern",
        "should match",
    ),
    InvalidCase(
        "checkpoint-path-relative",
        {"spec.checkpoint": {"path": "ckpt"}},
        "spec.checkpoint.path",
        "should match pattern",
        "should match",
    ),
    InvalidCase(
        "checkpoint-interval-too-short",
        {"spec.checkpoint": {"intervalSeconds": 1}},
        "spec.checkpoint.intervalSeconds",
        "greater than or equal to 10",
        "greater than or equal to 10",
    ),
    InvalidCase(
        "checkpoint-keep-zero",
        {"spec.checkpoint": {"keep": 0}},
        "spec.checkpoint.keep",
        "greater than or equal to 1",
        "greater than or equal to 1",
    ),
    InvalidCase(
        "max-restarts-negative",
        {"spec.failurePolicy": {"maxRestarts": -1}},
        "spec.failurePolicy.maxRestarts",
        "greater than or equal to 0",
        "greater than or equal to 0",
    ),
    InvalidCase(
        "permanent-exit-code-zero",
        {"spec.failurePolicy": {"permanentExitCodes": [0]}},
        "spec.failurePolicy.permanentExitCodes",
        "greater than or equal to 1",
        "greater than or equal to 1",
    ),
    InvalidCase(
        "suspend-not-bool",
        {"spec.suspend": "yes please"},
        "spec.suspend",
        "valid boolean",
        "must be of type boolean",
    ),
)
"""At least 25 (the foundation issue asks for 25): each blames one field."""

VALID_SPECS: tuple[ValidCase, ...] = (
    ValidCase("base"),
    ValidCase(
        "cpu-job",
        {"spec.worker": {"gpus": 0, "image": "elastra-worker:dev"}, "spec.model": DELETE},
    ),
    ValidCase(
        "manual-parallelism",
        {
            "spec.parallelism": {
                "mode": "manual",
                "tensor": 4,
                "pipeline": 2,
                "sharding": "optimizer",
            }
        },
    ),
    ValidCase(
        "heterogeneous-cost",
        {
            "spec.worker.gpuTypes": ["H100", "NVIDIA-A100-SXM4-80GB"],
            "spec.placement": {"objective": "cost", "heterogeneous": True},
        },
    ),
    ValidCase(
        "everything-set",
        {
            "spec.maxReplicas": DELETE,
            "spec.worker.env": [{"name": "NCCL_DEBUG", "value": "WARN"}],
            "spec.worker.command": ["elastra-worker", "run", "--"],
            "spec.worker.args": ["python", "train.py"],
            "spec.worker.resources": {"requests": {"cpu": "8", "memory": "64Gi"}},
            "spec.model.kvHeads": 8,
            "spec.training": {
                "globalBatchSize": 512,
                "precision": "fp16",
                "consistency": "bitwise",
                "seed": 3,
                "totalSteps": 10000,
            },
            "spec.checkpoint": {"volume": "ckpt-claim", "intervalSeconds": 60, "keep": 5},
            "spec.failurePolicy": {
                "maxRestarts": 3,
                "backoffSeconds": 30,
                "permanentExitCodes": [2, 3],
            },
            "spec.suspend": True,
        },
    ),
    ValidCase("bounds-equal", {"spec.replicas": 2, "spec.minReplicas": 2, "spec.maxReplicas": 2}),
)
