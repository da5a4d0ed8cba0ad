"""The objects Elastra creates for a job: worker pods, their assignments, a headless Service.

Pure functions from the parsed job and a decision to plain dicts; the reconciler compares
them with what exists and sends only the difference. Choices a reader should know:

- **Placement**: a required node affinity on ``metadata.name`` pins each pod to the node the
  planner chose, and the real scheduler still binds it. Unlike ``nodeName`` this keeps the
  scheduler's resource and taint checks (a stale plan fails safe, as a Pending pod the
  resize policy notices) and works with scheduling gates, which ``nodeName`` bypasses.
- **Gang admission**: pods are created with the ``elastra.dev/gang`` scheduling gate and the
  gate is removed only when every pod of the batch exists, so a half-created batch never
  holds GPUs.
- **Assignment**: the JSON the worker reads, written by ``elastra_worker.assignment`` itself
  so the operator and the worker cannot disagree on the format. A downward-API volume shows
  the annotation to the pod; workers need no service-account token.
- **Pod Security "restricted"**: non-root, no privilege escalation, all capabilities dropped,
  RuntimeDefault seccomp.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from elastra.api import API_VERSION, KIND, TrainingJob
from elastra.controller.settings import GPU_TOLERATION, OperatorSettings
from elastra_worker.assignment import Assignment, CheckpointSpec, Plan

LABEL_JOB = "elastra.dev/job"
LABEL_SLOT = "elastra.dev/slot"
LABEL_WORLD = "elastra.dev/world-version"
ANNOTATION_ASSIGNMENT = "elastra.dev/assignment"
ANNOTATION_NODE = "elastra.dev/node"
ANNOTATION_GPU_TYPE = "elastra.dev/gpu-type"
ANNOTATION_RETIRED = "elastra.dev/retired-at"
GANG_GATE = "elastra.dev/gang"
ASSIGNMENT_DIR = "/etc/elastra"
WORKER_CONTAINER = "worker"
WORKER_UID = 1000


def pod_name(job: str, slot: int) -> str:
    """The stable name of a worker slot."""
    return f"{job}-w{slot}"


def selector(job: str) -> str:
    """Label selector of a job's worker pods (the scale subresource reports it)."""
    return f"{LABEL_JOB}={job}"


@dataclass(frozen=True)
class RankSpec:
    """What the assignment of one pod in a world says."""

    rank: int
    world_size: int
    master_addr: str
    plan: Plan


def assignment_json(
    job: TrainingJob,
    *,
    version: int,
    rank: RankSpec | None,
    stop: bool,
    settings: OperatorSettings,
) -> str:
    """The ``elastra.dev/assignment`` annotation: in a world (``rank``), waiting, or stopping."""
    spec = job.spec
    local = max(spec.worker.gpus, 1)
    checkpoint = CheckpointSpec(
        path=spec.checkpoint.path,
        interval_seconds=spec.checkpoint.interval_seconds,
        keep=spec.checkpoint.keep,
    )
    if rank is None:
        rank = RankSpec(rank=0, world_size=0, master_addr="", plan=Plan(dp=1))
    return Assignment(
        job=job.metadata.name,
        world_version=version,
        rank=rank.rank,
        world_size=rank.world_size,
        master_addr=rank.master_addr,
        master_port=settings.master_port_base + version % 1000,
        plan=rank.plan,
        global_batch_size=spec.training.global_batch_size,
        checkpoint=checkpoint,
        local_world_size=local,
        consistency=spec.training.consistency.value,
        seed=spec.training.seed,
        stop=stop,
    ).to_json()


def owner_reference(job: TrainingJob) -> dict[str, Any]:
    """Makes the job the controller of a child: deleting the job deletes its pods."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": job.metadata.name,
        "uid": job.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def headless_service(job: TrainingJob) -> dict[str, Any]:
    """Stable DNS names ``<pod>.<job>`` for the workers, where the cluster has DNS."""
    name = job.metadata.name
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": job.metadata.namespace,
            "labels": {LABEL_JOB: name, "app.kubernetes.io/managed-by": "elastra"},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": {
            "clusterIP": "None",
            "selector": {LABEL_JOB: name},
            "publishNotReadyAddresses": True,
            "ports": [{"name": "rendezvous", "port": 29500, "protocol": "TCP"}],
        },
    }


def worker_pod(
    job: TrainingJob,
    *,
    slot: int,
    node: str,
    gpu_type: str,
    assignment: str,
    version: int,
    settings: OperatorSettings,
) -> dict[str, Any]:
    """A gated worker pod pinned to ``node``, carrying its assignment."""
    spec = job.spec
    name = pod_name(job.metadata.name, slot)
    gpus = spec.worker.gpus
    requests = dict(spec.worker.resources.requests)
    limits = dict(spec.worker.resources.limits)
    tolerations = [t.to_wire() for t in settings.tolerations]
    if gpus:
        requests["nvidia.com/gpu"] = str(gpus)
        limits["nvidia.com/gpu"] = str(gpus)
        tolerations.append(GPU_TOLERATION.to_wire())
    env: list[dict[str, Any]] = [{"name": e.name, "value": e.value} for e in spec.worker.env]
    env += [
        {"name": "ELASTRA_ASSIGNMENT_FILE", "value": f"{ASSIGNMENT_DIR}/assignment"},
        {"name": "ELASTRA_METRICS_PORT", "value": str(settings.metrics_port)},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    checkpoint_volume: dict[str, Any] = (
        {"persistentVolumeClaim": {"claimName": spec.checkpoint.volume}}
        if spec.checkpoint.volume
        else {"emptyDir": {}}
    )
    container: dict[str, Any] = {
        "name": WORKER_CONTAINER,
        "image": spec.worker.image,
        "imagePullPolicy": "IfNotPresent",
        "env": env,
        "resources": {"requests": requests, "limits": limits},
        "ports": [{"name": "metrics", "containerPort": settings.metrics_port}],
        "volumeMounts": [
            {"name": "assignment", "mountPath": ASSIGNMENT_DIR, "readOnly": True},
            {"name": "checkpoints", "mountPath": spec.checkpoint.path},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
        },
    }
    if spec.worker.command:
        container["command"] = list(spec.worker.command)
    if spec.worker.args:
        container["args"] = list(spec.worker.args)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": job.metadata.namespace,
            "labels": {
                LABEL_JOB: job.metadata.name,
                LABEL_SLOT: str(slot),
                LABEL_WORLD: str(version),
                "app.kubernetes.io/name": "elastra-worker",
                "app.kubernetes.io/managed-by": "elastra",
            },
            "annotations": {
                ANNOTATION_ASSIGNMENT: assignment,
                ANNOTATION_NODE: node,
                ANNOTATION_GPU_TYPE: gpu_type,
            },
            "ownerReferences": [owner_reference(job)],
        },
        "spec": {
            "restartPolicy": "Never",
            "hostname": name,
            "subdomain": job.metadata.name,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": settings.termination_grace_seconds,
            "schedulingGates": [{"name": GANG_GATE}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchFields": [
                                    {"key": "metadata.name", "operator": "In", "values": [node]}
                                ]
                            }
                        ]
                    }
                }
            },
            "tolerations": tolerations,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": WORKER_UID,
                "runAsGroup": WORKER_UID,
                "fsGroup": WORKER_UID,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [container],
            "volumes": [
                {
                    "name": "assignment",
                    "downwardAPI": {
                        "items": [
                            {
                                "path": "assignment",
                                "fieldRef": {
                                    "fieldPath": f"metadata.annotations['{ANNOTATION_ASSIGNMENT}']"
                                },
                            }
                        ]
                    },
                },
                {"name": "checkpoints", **checkpoint_volume},
                {"name": "tmp", "emptyDir": {}},
            ],
        },
    }
