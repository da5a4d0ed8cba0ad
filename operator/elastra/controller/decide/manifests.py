"""The objects Elastra creates for a job: worker pods, their assignments, a headless Service
and a NetworkPolicy.

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
  RuntimeDefault seccomp, for every container; ``spec.worker.podSecurity: baseline`` keeps
  that for the worker container only.
- **A read-only root for the trainer**: the worker container cannot change its image; what it
  writes goes to /tmp (a size-limited emptyDir that HOME, TMPDIR and torch's compiler caches
  point into), the checkpoint volume, the cache volume (``HF_HOME``, ``TORCH_HOME``: downloads
  that outgrow /tmp) or /dev/shm. The template may set HOME, TMPDIR and the cache variables
  itself (its env wins over these defaults), mount a volume of its own at the cache path (it
  wins too) and mount more writable volumes.
- **Network isolation** (``network_policy``): a job's workers accept traffic from the pods of
  their job only (rendezvous, the TCPStore, collectives: any port), and from the operator's
  pods (and scrapers the installer names) on the metrics port. Egress stays open (object
  storage, DNS). Policies are additive: a user may let more in with a policy of their own.
- **Tolerations**: the operator's (``--toleration``), the template's, then, as Kubernetes'
  ExtendedResourceToleration admission plugin would add them (it is off by default), the
  ``NoSchedule`` taint of each extended resource the pod requests: a GPU pod tolerates the
  taint of the GPUs it asks for, ``nvidia.com/gpu`` or ``amd.com/gpu`` by its planned node.
- **Joining warm**: the worker container's startup probe asks the agent whether it has imported
  torch (``elastra_worker.metrics.READY_PATH``), so a pod created for a running job turns
  Ready, and the resize policy adds it to the world, only once it can start its trainers at
  once: the world trains on meanwhile instead of waiting in the rendezvous for that import.
- **The template** (``spec.worker.template``): its allow-listed fields are added to what
  Elastra builds; the API server has already rejected any that Elastra owns. Elastra's own
  labels, env and volumes come last, so they win a clash.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from elastra.api import API_VERSION, KIND, TrainingJob
from elastra.api.formats import is_zero_size
from elastra.api.podtemplate import (
    CACHE_DIR,
    CACHE_VOLUME,
    WORKER_CONTAINER,
    Affinity,
    NodeAffinity,
    PodSecurity,
    PodTemplate,
    TemplateContainer,
    TemplateMetadata,
)
from elastra.controller.settings import OperatorSettings
from elastra.planner.catalog import GPU_RESOURCES, NVIDIA_GPU, resource_of, selected
from elastra.planner.eligibility import WorkerConstraints, is_extended, requested_toleration
from elastra.planner.scheduling import PodConstraints, PodToleration
from elastra_worker.assignment import Assignment, CheckpointPolicy, ParallelPlan
from elastra_worker.metrics import READY_PATH
from elastra_worker.push import POD_NAME_ENV, POD_UID_ENV, PUBLIC_KEY_ENV
from elastra_worker.torchrun import MAX_RESTARTS_ENV

LABEL_JOB = "elastra.dev/job"
LABEL_SLOT = "elastra.dev/slot"
LABEL_WORLD = "elastra.dev/world-version"
LABEL_LEADER = "elastra.dev/leader"
"""``"true"`` on the world's rank 0 only: the job's headless Service selects that pod alone (its
DNS name is the master address); written with the assignments, never on its own."""
ANNOTATION_ASSIGNMENT = "elastra.dev/assignment"
ANNOTATION_NODE = "elastra.dev/node"
ANNOTATION_GPU_TYPE = "elastra.dev/gpu-type"
ANNOTATION_RETIRED = "elastra.dev/retired-at"
GANG_GATE = "elastra.dev/gang"
ASSIGNMENT_DIR = "/etc/elastra"
SHM_VOLUME = "dshm"
TMP_VOLUME = "tmp"
TMP_DIR = "/tmp"
WORKER_UID = 65532
"""The worker image's user (worker_image/Dockerfile), above any host's login users (login.defs
allots them 1000-60000): what it writes on a node, or does if it escapes, is no host user's."""
SCRATCH_ENV = (
    ("HOME", TMP_DIR),
    ("TMPDIR", TMP_DIR),
    # torch's default names the user (getpass), which fails for a uid the image does not list.
    ("TORCHINDUCTOR_CACHE_DIR", f"{TMP_DIR}/torchinductor"),
    ("TRITON_CACHE_DIR", f"{TMP_DIR}/triton"),
)
"""Where the trainer's scratch files and caches go, the root file system being read-only; set
only where the job's own env does not name the variable."""
CACHE_ENV = (("HF_HOME", f"{CACHE_DIR}/huggingface"), ("TORCH_HOME", f"{CACHE_DIR}/torch"))
"""Downloads that outgrow /tmp (a Hugging Face model, torch hub weights) go to the cache volume;
set, like ``SCRATCH_ENV``, only where the job's own env does not name the variable."""
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
"""Set on every namespace by the API server (1.22+): selects the operator's namespace by name."""


STARTUP_PROBE_PERIOD_SECONDS = 1
"""How often the kubelet asks a starting worker whether it is warm: a joiner waits at most this
long after its import before it can join."""
STARTUP_PROBE_FAILURES = 900
"""15 minutes of probes (torch from a slow disk on a crowded node takes a minute or two): a
worker not warm by then is restarted by the kubelet, as a stuck start should be."""


GRACE_ENV = "ELASTRA_GRACE_SECONDS"
"""The agent's stop deadline after SIGTERM (``elastra-worker run --grace``), from the pod's."""
GRACE_MARGIN_SECONDS = 15
"""What the agent leaves of the pod's grace period for itself: to kill trainers that did not
finish their checkpoint (and its upload) in time, and exit before the kubelet's SIGKILL."""


def agent_grace_seconds(pod_grace: int) -> int:
    """The agent's deadline for the pod's ``terminationGracePeriodSeconds``: all of it but the
    margin (a quarter of a short grace period), so a checkpoint on eviction or a spot
    reclaim has what the pod was given, not the agent's old constant 25 s."""
    return max(1, pod_grace - min(GRACE_MARGIN_SECONDS, max(1, pod_grace // 4)))


def pod_name(job: str, slot: int) -> str:
    """The stable name of a worker slot."""
    return f"{job}-w{slot}"


def slot_of(job: str, pod: str) -> int | None:
    """The slot of a worker pod's name (``pod_name``'s inverse); ``None``: not one of its."""
    tail = pod.removeprefix(f"{job}-w")
    return int(tail) if tail != pod and tail.isdigit() else None


def selector(job: str) -> str:
    """Label selector of a job's worker pods (the scale subresource reports it)."""
    return f"{LABEL_JOB}={job}"


@dataclass(frozen=True)
class RankSpec:
    """What the assignment of one pod in a world says."""

    rank: int
    world_size: int
    master_addr: str
    plan: ParallelPlan


def assignment_json(
    job: TrainingJob,
    *,
    version: int,
    rank: RankSpec | None,
    stop: bool,
    settings: OperatorSettings,
    peers_lost: bool = False,
) -> str:
    """The ``elastra.dev/assignment`` annotation: in a world (``rank``), waiting, or stopping;
    ``peers_lost``: the world replaces members that were lost or failed."""
    spec = job.spec
    local = spec.worker.ranks_per_pod
    checkpoint = CheckpointPolicy(
        path=spec.checkpoint.path,
        interval_seconds=spec.checkpoint.interval_seconds,
        keep=spec.checkpoint.keep,
        uri=spec.checkpoint.uri or "",
        asynchronous=spec.checkpoint.asynchronous,
    )
    if rank is None:
        rank = RankSpec(rank=0, world_size=0, master_addr="", plan=ParallelPlan(dp=1))
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
        precision=spec.training.precision.value,
        gpus=spec.worker.gpus,
        peers_lost=peers_lost,
    ).to_json()


def is_gated(pod: Mapping[str, Any]) -> bool:
    """Whether a pod (an object or a body about to be created) is held by the gang gate."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(g.get("name") == GANG_GATE for g in gates)


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
    """The DNS name ``<rank 0's pod>.<job>.<namespace>.svc`` that workers rendezvous at.

    It selects the pod labelled leader only, the one name workers resolve: the cluster's
    endpoint controllers then rewrite the Service's Endpoints and EndpointSlices when rank 0
    changes, not on every worker's start, restart or exit. (At 8 workers per job the
    controllers coalesce those updates anyway: ``bench_operator_scale.py`` counted about ten
    endpoint writes per job either way; a world of hundreds of pods is where it matters.)
    """
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
            "selector": {LABEL_JOB: name, LABEL_LEADER: "true"},
            "publishNotReadyAddresses": True,
            "ports": [{"name": "rendezvous", "port": 29500, "protocol": "TCP"}],
        },
    }


def network_policy(service: dict[str, Any], settings: OperatorSettings) -> dict[str, Any] | None:
    """The job's NetworkPolicy, or ``None`` where the operator is told to create none.

    Built from the job's headless Service so that both have the same owner (the job: deleting
    it deletes the policy); it selects every worker of the job. Without ``metrics_peers`` (an
    operator outside the cluster, no scraper named) the metrics rule is left out: no pod is let
    in.
    """
    if not settings.network_policy:
        return None
    meta = service["metadata"]
    workers = {"matchLabels": {LABEL_JOB: meta["labels"][LABEL_JOB]}}
    ingress: list[dict[str, Any]] = [{"from": [{"podSelector": workers}]}]
    if settings.metrics_peers:
        peers = [
            {
                "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: peer.namespace}},
                "podSelector": {"matchLabels": dict(peer.labels)},
            }
            for peer in settings.metrics_peers
        ]
        ports = [{"protocol": "TCP", "port": settings.metrics_port}]
        ingress.append({"from": peers, "ports": ports})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": dict(meta["labels"]),
            "ownerReferences": list(meta["ownerReferences"]),
        },
        "spec": {"podSelector": workers, "policyTypes": ["Ingress"], "ingress": ingress},
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
    gated: bool = True,
    leader: bool = False,
) -> dict[str, Any]:
    """A worker pod pinned to ``node``, carrying its assignment, with the template merged;
    held by the gang gate unless ``gated`` is false (the last pod of a batch).

    Elastra's own labels and annotations are written after the template's, so they win even
    where the API server's rules would not have caught a clash.
    """
    template = job.spec.worker.template or PodTemplate()
    extra = template.metadata or TemplateMetadata()
    name = pod_name(job.metadata.name, slot)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": job.metadata.namespace,
            "labels": {
                **extra.labels,
                LABEL_JOB: job.metadata.name,
                LABEL_SLOT: str(slot),
                LABEL_WORLD: str(version),
                **({LABEL_LEADER: "true"} if leader else {}),
                "app.kubernetes.io/name": "elastra-worker",
                "app.kubernetes.io/managed-by": "elastra",
            },
            "annotations": {
                **extra.annotations,
                ANNOTATION_ASSIGNMENT: assignment,
                ANNOTATION_NODE: node,
                ANNOTATION_GPU_TYPE: gpu_type,
            },
            "ownerReferences": [owner_reference(job)],
        },
        "spec": _pod_spec(
            job,
            template,
            name=name,
            node=node,
            settings=settings,
            gated=gated,
            resource=gpu_resource(job, gpu_type),
        ),
    }


def _pod_spec(
    job: TrainingJob,
    template: PodTemplate,
    *,
    name: str,
    node: str | None,
    settings: OperatorSettings,
    gated: bool,
    resource: str,
) -> dict[str, Any]:
    """Elastra's pod spec with the template's allow-listed fields added."""
    extra = template.pod_spec()
    restricted = job.spec.worker.pod_security == PodSecurity.RESTRICTED
    sidecars = [_sidecar(c, restricted=restricted) for c in template.sidecars()]
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "hostname": name,
        "subdomain": job.metadata.name,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": settings.termination_grace_seconds,
        "affinity": _affinity(node, extra.affinity),
        "tolerations": _own_tolerations(settings, template),
        "securityContext": _pod_security_context(restricted=restricted),
        "containers": [
            _worker_container(job, template.worker_additions(), settings, resource=resource),
            *sidecars,
        ],
        "volumes": [*_elastra_volumes(job, settings), *(v.to_wire() for v in extra.volumes)],
    }
    if gated:
        spec["schedulingGates"] = [{"name": GANG_GATE}]
    if extra.init_containers:
        spec["initContainers"] = [_sidecar(c, restricted=restricted) for c in extra.init_containers]
    if extra.node_selector:
        spec["nodeSelector"] = dict(extra.node_selector)
    if extra.priority_class_name:
        spec["priorityClassName"] = extra.priority_class_name
    if extra.service_account_name:
        spec["serviceAccountName"] = extra.service_account_name
    if extra.image_pull_secrets:
        spec["imagePullSecrets"] = [s.to_wire() for s in extra.image_pull_secrets]
    spec["tolerations"] += _requested_tolerations(spec)
    return spec


def worker_constraints(job: TrainingJob, settings: OperatorSettings) -> WorkerConstraints:
    """What kube-scheduler will read of the job's worker pods to judge a node (tolerations,
    node selector, required node affinity, requests), from the very spec ``worker_pod``
    builds, less the pin to a planned node: the planner's nodes are the scheduler's. The GPUs
    are requested by one vendor's resource here; the planner judges each node with its own
    type's (``eligibility.as_built_for``), as ``worker_pod`` builds the pod planned there."""
    template = job.spec.worker.template or PodTemplate()
    resource = gpu_resource(job, "")
    spec = _pod_spec(
        job, template, name=pod_name(job.metadata.name, 0), node=None, settings=settings,
        gated=False, resource=resource,
    )  # fmt: skip
    pod = PodConstraints.of_pod_spec(spec, where=f"the worker pods of {job.metadata.name}")
    if not job.spec.worker.gpus:
        return WorkerConstraints.of(pod, gpu_resource="", gpu_toleration_added=False)
    own = _parsed(_own_tolerations(settings, template))
    added = requested_toleration(resource) not in own
    return WorkerConstraints.of(pod, gpu_resource=resource, gpu_toleration_added=added)


def _own_tolerations(settings: OperatorSettings, template: PodTemplate) -> list[dict[str, Any]]:
    """The operator's configured tolerations, then the template's."""
    extra = template.pod_spec()
    return [*(t.to_wire() for t in settings.tolerations), *(t.to_wire() for t in extra.tolerations)]


def _requested_tolerations(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What the ExtendedResourceToleration admission plugin would add to a pod with ``spec``
    (Kubernetes 1.36): for each extended resource a container or init container requests (a
    limit alone counts, the API server makes it the request too), in name order, its
    ``NoSchedule`` taint tolerated with any value, unless the pod has that toleration."""
    containers = [*spec.get("containers", ()), *spec.get("initContainers", ())]
    names = {
        name
        for container in containers
        for part in ("requests", "limits")
        for name in (container.get("resources") or {}).get(part) or {}
        if is_extended(name)
    }
    present = _parsed(spec.get("tolerations") or [])
    added = [requested_toleration(name) for name in sorted(names)]
    return [t.to_wire() for t in added if t not in present]


def _parsed(tolerations: list[dict[str, Any]]) -> frozenset[PodToleration]:
    """Tolerations as the scheduler compares them (fields left out are empty)."""
    return frozenset(PodConstraints.of_pod_spec({"tolerations": tolerations}).tolerations)


def _affinity(node: str | None, extra: Affinity | None) -> dict[str, Any]:
    """The pin to ``node``, ANDed into each of the template's required node terms (no pin
    when ``node`` is ``None``: the constraints the planner checks, see ``worker_constraints``).

    Node selector terms are ORed, so the pin cannot be one more term: each of the
    template's terms gets the pin added to its ``matchFields`` instead, which reads "the
    planned node, and it matches one of the template's terms". An empty template term
    matches no node, so it stays empty: pinned, it would match the planned node.
    """
    pin = [{"key": "metadata.name", "operator": "In", "values": [node]}] if node is not None else []
    node_affinity = (extra.node_affinity if extra else None) or NodeAffinity()
    required = node_affinity.required_during_scheduling_ignored_during_execution
    terms = required.node_selector_terms if required else ([{}] if pin else [])

    def pinned_term(term: dict[str, Any]) -> dict[str, Any]:
        if required and not (term.get("matchExpressions") or term.get("matchFields")):
            return term
        return {**term, "matchFields": [*pin, *term.get("matchFields", [])]}

    pinned: dict[str, Any] = {}
    if terms:
        pinned["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [pinned_term(term) for term in terms]
        }
    if node_affinity.preferred_during_scheduling_ignored_during_execution:
        pinned["preferredDuringSchedulingIgnoredDuringExecution"] = list(
            node_affinity.preferred_during_scheduling_ignored_during_execution
        )
    affinity: dict[str, Any] = {"nodeAffinity": pinned}
    if extra and extra.pod_affinity:
        affinity["podAffinity"] = extra.pod_affinity
    if extra and extra.pod_anti_affinity:
        affinity["podAntiAffinity"] = extra.pod_anti_affinity
    return affinity


def _pod_security_context(*, restricted: bool) -> dict[str, Any]:
    """restricted: the pod runs as the worker user with RuntimeDefault seccomp.

    baseline: only ``fsGroup`` stays (volumes must be writable by the worker user); the
    worker container carries the rest itself, so other containers are left alone.
    """
    if not restricted:
        return {"fsGroup": WORKER_UID}
    return {
        "runAsNonRoot": True,
        "runAsUser": WORKER_UID,
        "runAsGroup": WORKER_UID,
        "fsGroup": WORKER_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _container_security_context(*, worker: bool, restricted: bool) -> dict[str, Any] | None:
    """What Pod Security "restricted" asks of each container; in baseline, of the worker only.

    The worker's root file system is read-only in both: it is Elastra's container, and its
    writable places are the volumes (see ``SCRATCH_ENV``). Sidecars are the user's, left so.
    """
    if not worker and not restricted:
        return None
    context: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
    }
    if worker:
        context["readOnlyRootFilesystem"] = True
    if worker and not restricted:
        context.update(
            runAsUser=WORKER_UID,
            runAsGroup=WORKER_UID,
            seccompProfile={"type": "RuntimeDefault"},
        )
    return context


def gpu_resource(job: TrainingJob, gpu_type: str) -> str:
    """The extended resource the job's pods request GPUs by on a node of ``gpu_type``: AMD's
    ``amd.com/gpu`` or NVIDIA's ``nvidia.com/gpu``, as the catalog says of the type (the
    inventory plans a type only on nodes that advertise its resource). With no type yet
    (``""``: a Workload's pod template), the one resource of every type the job's
    ``gpuTypes`` select, NVIDIA's when they span vendors."""
    if gpu_type:
        return resource_of(gpu_type)
    patterns = job.spec.worker.gpu_types
    resources = {gpu.resource for gpu in selected(patterns)} if patterns else set(GPU_RESOURCES)
    return resources.pop() if len(resources) == 1 else NVIDIA_GPU


def _worker_container(
    job: TrainingJob,
    additions: TemplateContainer | None,
    settings: OperatorSettings,
    *,
    resource: str,
) -> dict[str, Any]:
    """The trainer's container: spec.worker's fields, the template's additions, then Elastra's."""
    worker = job.spec.worker
    requests = dict(worker.resources.requests)
    limits = dict(worker.resources.limits)
    if worker.gpus:
        requests[resource] = str(worker.gpus)
        limits[resource] = str(worker.gpus)
    env: list[dict[str, Any]] = [{"name": e.name, "value": e.value} for e in worker.env]
    env += [e.to_wire() for e in (additions.env if additions and additions.env else ())]
    env += [
        {"name": "ELASTRA_ASSIGNMENT_FILE", "value": f"{ASSIGNMENT_DIR}/assignment"},
        {"name": "ELASTRA_METRICS_PORT", "value": str(settings.metrics_port)},
        {"name": POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        # What pushed assignments are signed for and with (elastra_worker.push).
        {"name": POD_UID_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": "ELASTRA_LAUNCH", "value": str(worker.launch)},
        # torchrun mode shows it to the script as TORCHELASTIC_MAX_RESTARTS.
        {"name": MAX_RESTARTS_ENV, "value": str(job.spec.failure_policy.max_restarts)},
        # The trainers size their thread pools by it (elastra_worker.cpushare), not by the node.
        {
            "name": "ELASTRA_CPU_MILLIS",
            "valueFrom": {
                "resourceFieldRef": {
                    "containerName": WORKER_CONTAINER,
                    "resource": "requests.cpu",
                    "divisor": "1m",
                }
            },
        },
    ]
    if settings.assignment_public_key:
        env.append({"name": PUBLIC_KEY_ENV, "value": settings.assignment_public_key})
    if job.spec.model is not None:  # the reference trainer builds its model from it
        model = json.dumps(job.spec.model.to_wire(), sort_keys=True)
        env.append({"name": "ELASTRA_MODEL", "value": model})
    named = {e["name"] for e in env}
    grace = (GRACE_ENV, str(agent_grace_seconds(settings.termination_grace_seconds)))
    defaults = (*SCRATCH_ENV, *CACHE_ENV, grace)
    env += [{"name": k, "value": v} for k, v in defaults if k not in named]
    mounts = [
        {"name": "assignment", "mountPath": ASSIGNMENT_DIR, "readOnly": True},
        {"name": "checkpoints", "mountPath": job.spec.checkpoint.path},
        {"name": TMP_VOLUME, "mountPath": TMP_DIR},
    ]
    own = additions.volume_mounts if additions and additions.volume_mounts else ()
    if not any(os.path.normpath(m.mount_path) == CACHE_DIR for m in own):
        mounts.append({"name": CACHE_VOLUME, "mountPath": CACHE_DIR})  # else the template's
    if not is_zero_size(worker.shm_size):
        mounts.append({"name": SHM_VOLUME, "mountPath": "/dev/shm"})
    if additions and additions.volume_mounts:
        mounts += [m.to_wire() for m in additions.volume_mounts]
    restricted = worker.pod_security == PodSecurity.RESTRICTED
    container: dict[str, Any] = {
        "name": WORKER_CONTAINER,
        "image": worker.image,
        "imagePullPolicy": "IfNotPresent",
        "env": env,
        "resources": {"requests": requests, "limits": limits},
        "ports": [{"name": "metrics", "containerPort": settings.metrics_port}],
        "startupProbe": {
            "httpGet": {"path": READY_PATH, "port": "metrics"},
            "periodSeconds": STARTUP_PROBE_PERIOD_SECONDS,
            "failureThreshold": STARTUP_PROBE_FAILURES,
        },
        "volumeMounts": mounts,
        "securityContext": _container_security_context(worker=True, restricted=restricted),
    }
    if additions and additions.env_from:
        container["envFrom"] = list(additions.env_from)
    if worker.command:
        container["command"] = list(worker.command)
    if worker.args:
        container["args"] = list(worker.args)
    return container


def _sidecar(container: TemplateContainer, *, restricted: bool) -> dict[str, Any]:
    """A template container as given, with the security context Pod Security asks for."""
    body = container.to_wire()
    context = _container_security_context(worker=False, restricted=restricted)
    if context is not None:
        body["securityContext"] = context
    return body


def _elastra_volumes(job: TrainingJob, settings: OperatorSettings) -> list[dict[str, Any]]:
    """The assignment, the checkpoints, bounded scratch space, the cache and, unless sized 0,
    /dev/shm. The cache volume is there even where the template mounts its own volume at
    ``CACHE_DIR`` (then the worker does not mount it): the template may mount it elsewhere."""
    checkpoint = job.spec.checkpoint
    cache_size = job.spec.worker.cache_size or settings.worker_cache_size
    checkpoint_volume: dict[str, Any] = (
        {"persistentVolumeClaim": {"claimName": checkpoint.volume}}
        if checkpoint.volume
        else {"emptyDir": {}}
    )
    assignment_field = f"metadata.annotations['{ANNOTATION_ASSIGNMENT}']"
    volumes: list[dict[str, Any]] = [
        {
            "name": "assignment",
            "downwardAPI": {
                "items": [{"path": "assignment", "fieldRef": {"fieldPath": assignment_field}}]
            },
        },
        {"name": "checkpoints", **checkpoint_volume},
        {"name": TMP_VOLUME, "emptyDir": {"sizeLimit": settings.worker_tmp_size}},
        {"name": CACHE_VOLUME, "emptyDir": {"sizeLimit": cache_size}},
    ]
    shm = job.spec.worker.shm_size
    if not is_zero_size(shm):
        volumes.append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": shm}})
    return volumes
