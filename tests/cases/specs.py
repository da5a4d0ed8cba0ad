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
            "checkpoint": {"volume": "case-checkpoints"},
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


def _template(spec: dict[str, Any], **more: Any) -> dict[str, Any]:
    """The edit that gives the base job a worker pod template with this spec."""
    return {"spec.worker.template": {"spec": spec, **more}}


def _worker_entry(**fields: Any) -> dict[str, Any]:
    """A template whose entry for the worker container sets these fields."""
    return _template({"containers": [{"name": "worker", **fields}]})


def _sidecar(**fields: Any) -> dict[str, Any]:
    """A template with one sidecar container that sets these fields."""
    return _template({"containers": [{"name": "proxy", "image": "envoy:1", **fields}]})


def _volume(**fields: Any) -> dict[str, Any]:
    """A template with one volume."""
    return _template({"volumes": [fields]})


TEMPLATE = "spec.worker.template.spec"
CONTAINERS = f"{TEMPLATE}.containers"
SECRET_KEY = {"name": "hub-token", "key": "token"}


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
    _same(
        "amd-gpu-in-resources",
        {"spec.worker.resources": {"requests": {"amd.com/gpu": "8"}}},
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
        "bitwise-with-tensor",
        {
            "spec.training.consistency": "bitwise",
            "spec.parallelism": {"mode": "manual", "tensor": 2, "pipeline": 1},
        },
        "spec.parallelism",
        "training.consistency: bitwise is data parallel only",
    ),
    _same(
        "bitwise-with-pipeline",
        {
            "spec.training.consistency": "bitwise",
            "spec.parallelism": {"mode": "manual", "tensor": 1, "pipeline": 2},
        },
        "spec.parallelism",
        "training.consistency: bitwise is data parallel only",
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
        "cpu-tensor-not-dividing-cpu-ranks",
        {
            "spec.worker": {"gpus": 0, "cpuRanks": 3, "image": "elastra-worker:dev"},
            "spec.parallelism": {"mode": "manual", "tensor": 2, "pipeline": 1},
        },
        "spec.parallelism.tensor",
        "a CPU job: it must divide worker.cpuRanks",
    ),
    _same(
        "cpu-ranks-on-a-gpu-job",
        {"spec.worker.cpuRanks": 2},
        "spec.worker.cpuRanks",
        "cpuRanks is for CPU jobs (gpus: 0)",
    ),
    InvalidCase(
        "unknown-launch",
        {"spec.worker.launch": "mpirun"},
        "spec.worker.launch",
        "'elastra' or 'torchrun'",
        'supported values: "elastra", "torchrun"',
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
        "batch-not-whole-micro-batches",
        {"spec.training.microBatchSize": 3},
        "spec.training.microBatchSize",
        "globalBatchSize must be a multiple of microBatchSize",
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
        {"spec.checkpoint.uri": "s3://bucket/ckpt"},
        "spec.checkpoint.uri",
        "set volume or uri, not both",
    ),
    _same(
        "uri-not-s3",
        {"spec.checkpoint.volume": DELETE, "spec.checkpoint.uri": "gs://bucket/ckpt"},
        "spec.checkpoint.uri",
        "uri must be s3://BUCKET[/PREFIX]",
    ),
    InvalidCase(
        "volume-not-dns",
        {"spec.checkpoint.volume": "My_Claim"},
        "spec.checkpoint.volume",
        "should match pattern",
        "should match",
    ),
    InvalidCase(
        "checkpoint-path-relative",
        {"spec.checkpoint.path": "ckpt"},
        "spec.checkpoint.path",
        "should match pattern",
        "should match",
    ),
    InvalidCase(
        "checkpoint-interval-too-short",
        {"spec.checkpoint.intervalSeconds": 1},
        "spec.checkpoint.intervalSeconds",
        "greater than or equal to 10",
        "greater than or equal to 10",
    ),
    InvalidCase(
        "checkpoint-keep-zero",
        {"spec.checkpoint.keep": 0},
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
    _same(
        "replicas-without-shared-checkpoints",
        {"spec.checkpoint": DELETE},
        "spec.checkpoint",
        "checkpoint.volume (a PersistentVolumeClaim every worker mounts) or checkpoint.uri "
        "is required when replicas or maxReplicas is above 1",
    ),
    _same(
        "max-replicas-without-shared-checkpoints",
        {"spec.replicas": 1, "spec.minReplicas": 1, "spec.checkpoint": DELETE},
        "spec.checkpoint",
        "so every resize restarts at step 0",
    ),
    InvalidCase(
        "shm-size-negative",
        {"spec.worker.shmSize": "-1Gi"},
        "spec.worker.shmSize",
        "should match pattern: a size",
        "should match",
    ),
    *(
        InvalidCase(
            f"cache-size-{size}",
            {"spec.worker.cacheSize": size},
            "spec.worker.cacheSize",
            "should match pattern: a size above zero",
            "should match",
        )
        for size in ("0", "0.0Gi", "-1Gi")
    ),
    InvalidCase(
        "unknown-pod-security",
        {"spec.worker.podSecurity": "privileged"},
        "spec.worker.podSecurity",
        "'restricted' or 'baseline'",
        'supported values: "restricted", "baseline"',
    ),
    _same(
        "template-node-name",
        _template({"nodeName": "gpu-1"}),
        f"{TEMPLATE}.nodeName",
        "nodeName is Elastra's: it pins each worker to the node the planner chose",
    ),
    _same(
        "template-scheduling-gates",
        _template({"schedulingGates": [{"name": "mine"}]}),
        f"{TEMPLATE}.schedulingGates",
        "schedulingGates are Elastra's: its gang gate",
    ),
    *(
        _same(
            f"template-{field.lower()}",
            _template({field: True}),
            f"{TEMPLATE}.{field}",
            f"{field} is not allowed: worker pods keep their own network, process and IPC",
        )
        for field in ("hostNetwork", "hostPID", "hostIPC")
    ),
    _same(
        "template-pod-security-context",
        _template({"securityContext": {"runAsUser": 0}}),
        f"{TEMPLATE}.securityContext",
        "securityContext is Elastra's: the pod's comes from spec.worker.podSecurity",
    ),
    _same(
        "template-privileged-sidecar",
        _sidecar(securityContext={"privileged": True}),
        CONTAINERS,
        "so no container runs privileged",
    ),
    *(
        _same(
            f"template-worker-{field}",
            _worker_entry(**{field: value}),
            CONTAINERS,
            "the worker container's image, command, args and resources are set in spec.worker",
        )
        for field, value in (
            ("image", "other:1"),
            ("command", ["sh"]),
            ("args", ["-c", "true"]),
            ("resources", {"limits": {"memory": "1Gi"}}),
        )
    ),
    _same(
        "template-worker-ports",
        _worker_entry(ports=[{"containerPort": 8080}]),
        CONTAINERS,
        "the worker container may only add env, envFrom and volumeMounts",
    ),
    _same(
        "template-worker-reserved-env",
        _worker_entry(env=[{"name": "POD_NAME", "value": "me"}]),
        CONTAINERS,
        "POD_NAME, ELASTRA_LAUNCH, ELASTRA_MODEL or ELASTRA_MAX_RESTARTS: Elastra sets",
    ),
    _same(
        "template-worker-mounts-over-shm",
        {
            **_worker_entry(volumeMounts=[{"name": "data", "mountPath": "/dev/shm"}]),
            f"{TEMPLATE}.volumes": [{"name": "data", "emptyDir": {}}],
        },
        CONTAINERS,
        "may not use /etc/elastra, /dev/shm or /tmp",
    ),
    _same(
        "template-worker-mounts-over-checkpoints",
        {
            **_worker_entry(volumeMounts=[{"name": "data", "mountPath": "/checkpoints"}]),
            f"{TEMPLATE}.volumes": [{"name": "data", "emptyDir": {}}],
        },
        "spec.worker.template",
        "may not use checkpoint.path: Elastra mounts the checkpoints there",
    ),
    _same(
        "template-mount-of-unknown-volume",
        _worker_entry(volumeMounts=[{"name": "nope", "mountPath": "/data"}]),
        CONTAINERS,
        "containers[].volumeMounts must name a volume of the template or one of Elastra's",
    ),
    _same(
        "template-init-mount-of-unknown-volume",
        _template(
            {
                "initContainers": [
                    {
                        "name": "fetch",
                        "image": "busybox:1",
                        "volumeMounts": [{"name": "nope", "mountPath": "/data"}],
                    }
                ]
            }
        ),
        f"{TEMPLATE}.initContainers",
        "initContainers[].volumeMounts must name a volume of the template or one of Elastra's",
    ),
    _same(
        "template-sidecar-without-image",
        _template({"containers": [{"name": "proxy"}]}),
        CONTAINERS,
        "a sidecar container needs an image",
    ),
    _same(
        "template-sidecar-gpus",
        _sidecar(resources={"limits": {"nvidia.com/gpu": "1"}}),
        CONTAINERS,
        "set GPUs with worker.gpus",
    ),
    _same(
        "template-sidecar-amd-gpus",
        _sidecar(resources={"limits": {"amd.com/gpu": "1"}}),
        CONTAINERS,
        "set GPUs with worker.gpus",
    ),
    _same(
        "template-container-restart-policy",
        _sidecar(restartPolicy="Always"),
        CONTAINERS,
        "restartPolicy is for initContainers only",
    ),
    _same(
        "template-init-container-named-worker",
        _template({"initContainers": [{"name": "worker"}]}),
        f"{TEMPLATE}.initContainers",
        "initContainers need names of their own",
    ),
    _same(
        "template-init-container-named-like-a-sidecar",
        _template(
            {
                "containers": [{"name": "proxy", "image": "envoy:1"}],
                "initContainers": [{"name": "proxy", "image": "busybox:1"}],
            }
        ),
        f"{TEMPLATE}.initContainers",
        "initContainers need names of their own",
    ),
    *(
        _same(
            f"template-volume-named-{name}",
            _volume(name=name, emptyDir={}),
            f"{TEMPLATE}.volumes",
            "volume names assignment, checkpoints, dshm, tmp and elastra-cache are Elastra's",
        )
        for name in ("assignment", "dshm", "elastra-cache")
    ),
    _same(
        "template-host-path-volume",
        _volume(name="data", hostPath={"path": "/data"}),
        f"{TEMPLATE}.volumes",
        "hostPath volumes are not allowed: Pod Security forbids them",
    ),
    _same(
        "template-volume-two-sources",
        _volume(name="data", emptyDir={}, secret={"secretName": "s"}),
        f"{TEMPLATE}.volumes",
        "a volume needs exactly one source",
    ),
    _same(
        "template-env-value-and-value-from",
        _worker_entry(
            env=[{"name": "TOKEN", "value": "x", "valueFrom": {"secretKeyRef": SECRET_KEY}}]
        ),
        CONTAINERS,
        "set value or valueFrom, not both",
    ),
    _same(
        "template-value-from-two-sources",
        _worker_entry(
            env=[
                {
                    "name": "TOKEN",
                    "valueFrom": {
                        "secretKeyRef": SECRET_KEY,
                        "fieldRef": {"fieldPath": "metadata.name"},
                    },
                }
            ]
        ),
        CONTAINERS,
        "valueFrom needs exactly one of secretKeyRef, configMapKeyRef, fieldRef",
    ),
    _same(
        "template-elastra-label",
        _template({}, metadata={"labels": {"elastra.dev/job": "other"}}),
        "spec.worker.template.metadata.labels",
        "labels under elastra.dev/ are Elastra's",
    ),
    _same(
        "template-elastra-annotation",
        _template({}, metadata={"annotations": {"elastra.dev/assignment": "{}"}}),
        "spec.worker.template.metadata.annotations",
        "annotations under elastra.dev/ are Elastra's",
    ),
)
"""At least 25 (the foundation issue asks for 25): each blames one field."""

FULL_TEMPLATE: dict[str, Any] = {
    "metadata": {
        "labels": {"team": "nlp", "app.kubernetes.io/part-of": "llm"},
        "annotations": {"example.com/owner": "nlp-oncall"},
    },
    "spec": {
        "volumes": [
            {"name": "config", "configMap": {"name": "train-config"}},
            {"name": "certs", "secret": {"secretName": "hub-certs"}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "datasets", "readOnly": True}},
            {"name": "cache", "emptyDir": {"sizeLimit": "10Gi"}},
            {"name": "bundle", "projected": {"sources": [{"configMap": {"name": "extra"}}]}},
            {"name": "fuse", "csi": {"driver": "gcsfuse.csi.storage.gke.io"}},
            {
                "name": "scratch",
                "ephemeral": {
                    "volumeClaimTemplate": {
                        "spec": {
                            "accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": "1Gi"}},
                        }
                    }
                },
            },
            {
                "name": "podinfo",
                "downwardAPI": {
                    "items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]
                },
            },
        ],
        "containers": [
            {
                "name": "worker",
                "env": [
                    {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": SECRET_KEY}},
                    {
                        "name": "RUN_NAME",
                        "valueFrom": {"configMapKeyRef": {"name": "train-config", "key": "run"}},
                    },
                    {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    {"name": "LOG_LEVEL", "value": "info"},
                ],
                "envFrom": [{"configMapRef": {"name": "train-config"}}],
                "volumeMounts": [
                    {"name": "config", "mountPath": "/etc/train", "readOnly": True},
                    {"name": "data", "mountPath": "/data"},
                ],
            },
            {
                "name": "metrics-agent",
                "image": "example.com/agent:1.2",
                "args": ["--port=9500"],
                "ports": [{"containerPort": 9500, "name": "agent"}],
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                "readinessProbe": {"httpGet": {"path": "/ready", "port": 9500}},
                "volumeMounts": [{"name": "certs", "mountPath": "/certs", "readOnly": True}],
            },
        ],
        "initContainers": [
            {"name": "fetch", "image": "busybox:1.36", "command": ["true"]},
            {"name": "log-shipper", "image": "example.com/shipper:3", "restartPolicy": "Always"},
        ],
        "nodeSelector": {"example.com/pool": "training"},
        "tolerations": [
            {
                "key": "example.com/dedicated",
                "operator": "Equal",
                "value": "nlp",
                "effect": "NoSchedule",
            },
        ],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "example.com/rack",
                                    "operator": "In",
                                    "values": ["r1", "r2"],
                                }
                            ]
                        }
                    ]
                }
            },
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 10,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": {"team": "other"}},
                        },
                    }
                ]
            },
        },
        "priorityClassName": "training-high",
        "serviceAccountName": "trainer",
        "imagePullSecrets": [{"name": "registry-creds"}],
    },
}
"""A template that uses every allow-listed field (unit tests build a pod from it, too)."""

VALID_SPECS: tuple[ValidCase, ...] = (
    ValidCase("base"),
    ValidCase(
        "cpu-job",
        {"spec.worker": {"gpus": 0, "image": "elastra-worker:dev"}, "spec.model": DELETE},
    ),
    ValidCase(
        "cpu-job-tensor-within-its-ranks",
        {
            "spec.worker": {"gpus": 0, "cpuRanks": 2, "image": "elastra-worker:dev"},
            "spec.parallelism": {"mode": "manual", "tensor": 2, "pipeline": 2},
        },
    ),
    ValidCase("torchrun-launch", {"spec.worker.launch": "torchrun"}),
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
        "single-replica-without-checkpoints",
        {
            "spec.replicas": 1,
            "spec.minReplicas": 1,
            "spec.maxReplicas": DELETE,
            "spec.checkpoint": DELETE,
        },
    ),
    ValidCase("checkpoints-at-a-uri", {"spec.checkpoint": {"uri": "s3://bucket/ckpt"}}),
    ValidCase(
        "template-everything",
        {
            "spec.worker.template": FULL_TEMPLATE,
            "spec.worker.shmSize": "0",
            "spec.worker.podSecurity": "baseline",
        },
    ),
    ValidCase("cache-size-set", {"spec.worker.cacheSize": "0.5Ti"}),
    ValidCase("template-host-network-false", _template({"hostNetwork": False})),
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
    ValidCase(
        "bitwise-manual-data-parallel",
        {
            "spec.training.consistency": "bitwise",
            "spec.parallelism": {"mode": "manual", "tensor": 1, "pipeline": 1},
        },
    ),
    ValidCase("bounds-equal", {"spec.replicas": 2, "spec.minReplicas": 2, "spec.maxReplicas": 2}),
)
