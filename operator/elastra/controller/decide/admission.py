"""Kueue admission of a TrainingJob, decided: is the job held, how many pods may it run, and
what becomes of its Workload.

Kueue's "external framework" model: a job whose controller is not built into Kueue is queued
through a ``kueue.x-k8s.io`` Workload that the job's own controller creates and owns. Kueue
reserves quota for it in the ClusterQueue behind the job's LocalQueue (the
``kueue.x-k8s.io/queue-name`` label) and records that in ``status.admission``; the job's
controller starts the job only then. When Kueue withdraws the admission (preemption, a quota
cut: the ``Evicted`` condition), the job's controller stops the job and releases the
Workload, which queues it again.

Here that means: a labelled job is held exactly as ``spec.suspend`` holds it (no pods, or
every worker told to checkpoint and stop) until its Workload is admitted; once admitted, the
world never grows past the admitted podSet count. An evicted job stops like a suspend and,
once no pod of it is left, its Workload is deleted so the next pass queues a fresh one (which
also gives back the quota Kueue keeps for an evicted Workload until its owner lets go).
Asking Kueue for more pods than admitted would take a new Workload (and a stop); that is not
done: a scale-up past the admitted count is capped and the Admitted condition says so.

Pure: reads the parsed job and the Workload as the API server returned it; the reconciler
does the calls (``elastra.kube.workloads``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from elastra.api import TrainingJob
from elastra.api.podtemplate import WORKER_CONTAINER
from elastra.api.reasons import Reason
from elastra.controller.decide.manifests import LABEL_JOB, owner_reference

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
WORKLOAD_GROUP = "kueue.x-k8s.io"
WORKLOAD_VERSION = "v1beta2"
POD_SET = "workers"
"""The name of the Workload's one podSet: every worker pod is alike."""
WORKLOAD_PREFIX = "trainingjob-"
MAX_NAME = 253

JsonDict = Mapping[str, Any]


class GateState(StrEnum):
    """Where the job's Workload stands with Kueue."""

    PENDING = "Pending"
    """No Workload yet, or not admitted (or deactivated)."""
    ADMITTED = "Admitted"
    EVICTED = "Evicted"
    """Admission withdrawn or being withdrawn: stop, then release the Workload."""


@dataclass(frozen=True)
class Gate:
    """The job's Kueue admission as this pass read it."""

    queue: str
    workload: str
    state: GateState
    admitted: int | None = None
    """Pods of the admitted podSet (``ADMITTED`` only)."""
    requested: int | None = None
    """Pods the existing Workload asks for; ``None`` when there is no Workload."""
    message: str = ""
    active: bool = True
    """False when someone deactivated the Workload (``spec.active: false``): it is left alone."""


@dataclass(frozen=True)
class Hold:
    """Why the job must not run now: the Suspended condition's reason and message."""

    reason: str
    message: str


@dataclass(frozen=True)
class WorkloadAction:
    """At most one Workload write for this pass."""

    create: dict[str, Any] | None = None
    delete: str | None = None


def queue_of(job: TrainingJob) -> str | None:
    """The LocalQueue the job is queued in, or ``None`` when Kueue is not asked."""
    queue = job.metadata.labels.get(QUEUE_LABEL)
    return queue or None


def workload_name(job: str) -> str:
    """The Workload's name: fixed per job, so each pass finds it with one GET."""
    name = f"{WORKLOAD_PREFIX}{job}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(job.encode()).hexdigest()[:10]
    return f"{name[: MAX_NAME - 11]}-{digest}"


def read_gate(job: TrainingJob, workload: JsonDict | None) -> Gate | None:
    """The job's admission (``None``: the job has no queue label and is not gated)."""
    queue = queue_of(job)
    if queue is None:
        return None
    name = workload_name(job.metadata.name)
    if workload is None:
        return Gate(queue, name, GateState.PENDING, message="creating the Workload")
    spec = workload.get("spec") or {}
    status = workload.get("status") or {}
    requested = _podset_count(spec.get("podSets"))
    conditions = {str(c.get("type")): c for c in status.get("conditions") or []}
    if spec.get("active", True) is False:
        # Kueue returns a deactivated Workload's quota itself; deleting it would undo the
        # deactivation, so the job just waits (stopping first if it ran).
        return Gate(
            queue, name, GateState.PENDING, requested=requested, message="deactivated", active=False
        )
    evicted = conditions.get("Evicted", {})
    if evicted.get("status") == "True":
        return Gate(queue, name, GateState.EVICTED, requested=requested, message=_said(evicted))
    admitted = conditions.get("Admitted", {})
    admission = status.get("admission")
    if admitted.get("status") == "True" and admission:
        # count is optional in the assignment: then the podSet's own count was admitted.
        assigned = _podset_count(admission.get("podSetAssignments")) or requested
        return Gate(queue, name, GateState.ADMITTED, admitted=assigned, requested=requested)
    waiting = conditions.get("QuotaReserved") or admitted
    return Gate(queue, name, GateState.PENDING, requested=requested, message=_said(waiting))


def _podset_count(podsets: Any) -> int | None:
    for podset in podsets or []:
        if podset.get("name") == POD_SET and podset.get("count") is not None:
            return int(podset["count"])
    return None


def _said(condition: JsonDict) -> str:
    return str(condition.get("message") or condition.get("reason") or "no word from Kueue yet")


def hold_of(job: TrainingJob, gate: Gate | None) -> Hold | None:
    """Why the job is held by the user or by Kueue, if it is."""
    if job.spec.suspend:
        return Hold(Reason.SUSPENDED, "spec.suspend is true")
    if gate is None or gate.state is GateState.ADMITTED:
        return None
    if gate.state is GateState.EVICTED:
        return Hold(
            Reason.EVICTED_BY_KUEUE,
            f"Kueue evicted Workload {gate.workload} (queue {gate.queue}): {gate.message}; "
            "the workers checkpoint and stop, then the job queues again",
        )
    return Hold(
        Reason.AWAITING_ADMISSION,
        f"waiting for Kueue to admit Workload {gate.workload} in queue {gate.queue}: "
        f"{gate.message}",
    )


def capped(job: TrainingJob, gate: Gate | None) -> TrainingJob:
    """The job as this pass plans it: ``replicas`` no higher than Kueue admitted."""
    if gate is None or gate.admitted is None or job.spec.replicas <= gate.admitted:
        return job
    spec = job.spec.model_copy(update={"replicas": gate.admitted})
    return job.model_copy(update={"spec": spec})


def admitted_note(job: TrainingJob, gate: Gate | None) -> tuple[str, str] | None:
    """The Admitted condition's reason and message under Kueue, once admitted."""
    if gate is None or gate.admitted is None:
        return None
    if job.spec.replicas > gate.admitted:
        return (
            Reason.CAPPED_BY_ADMISSION,
            f"spec.replicas is {job.spec.replicas} but Kueue admitted {gate.admitted} workers "
            f"(Workload {gate.workload}, queue {gate.queue}): the world stays within "
            f"{gate.admitted}; suspend and resume the job to queue for more",
        )
    return (
        Reason.ADMITTED_BY_KUEUE,
        f"Kueue admitted {gate.admitted} workers (Workload {gate.workload}, queue {gate.queue})",
    )


def workload_action(
    job: TrainingJob,
    gate: Gate | None,
    *,
    pod: JsonDict,
    has_pods: bool,
    finished: bool,
) -> WorkloadAction:
    """Create, delete or keep the Workload (``pod``: a worker pod, for the podSet template).

    A finished job's Workload is deleted (its quota goes back at once); an evicted job's once
    its last pod is gone; a queued one whose size no longer matches spec.replicas is deleted
    and created again on the next pass (an admitted podSet cannot change).
    """
    if gate is None:
        return WorkloadAction()
    exists = gate.requested is not None
    if finished:
        return WorkloadAction(delete=gate.workload if exists else None)
    if not exists:
        return WorkloadAction(create=workload_manifest(job, pod=pod))
    if gate.state is GateState.EVICTED and not has_pods:
        return WorkloadAction(delete=gate.workload)
    if gate.state is GateState.PENDING and gate.active and gate.requested != job.spec.replicas:
        return WorkloadAction(delete=gate.workload)
    return WorkloadAction()


def workload_manifest(job: TrainingJob, *, pod: JsonDict) -> dict[str, Any]:
    """The job's Workload: one podSet of ``spec.replicas`` pods like ``pod``, owned by the job."""
    spec = pod.get("spec") or {}
    template: dict[str, Any] = {
        "containers": [_requests_only(c) for c in spec.get("containers") or []],
    }
    if spec.get("initContainers"):
        template["initContainers"] = [_requests_only(c) for c in spec["initContainers"]]
    for key in ("tolerations", "nodeSelector", "priorityClassName"):
        if spec.get(key):
            template[key] = spec[key]
    body: dict[str, Any] = {
        "apiVersion": f"{WORKLOAD_GROUP}/{WORKLOAD_VERSION}",
        "kind": "Workload",
        "metadata": {
            "name": workload_name(job.metadata.name),
            "namespace": job.metadata.namespace,
            "labels": {LABEL_JOB: job.metadata.name},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": {
            "queueName": queue_of(job) or "",
            "podSets": [
                {"name": POD_SET, "count": job.spec.replicas, "template": {"spec": template}}
            ],
        },
    }
    return body


def priority_class_of(workload: JsonDict) -> str | None:
    """The PriorityClass the Workload's pods name, if any."""
    for podset in (workload.get("spec") or {}).get("podSets") or []:
        name = ((podset.get("template") or {}).get("spec") or {}).get("priorityClassName")
        if name:
            return str(name)
    return None


def with_priority(workload: JsonDict, *, name: str, value: int) -> dict[str, Any]:
    """The Workload with its priority from PriorityClass ``name`` (Kueue wants both set).

    Kueue's own integrations fill ``priority`` from the class when they create a Workload, and
    its API refuses a ``priorityClassRef`` without it; Elastra does the same.
    """
    spec = {
        **(workload.get("spec") or {}),
        "priorityClassRef": {"group": "scheduling.k8s.io", "kind": "PriorityClass", "name": name},
        "priority": value,
    }
    return {**workload, "spec": spec}


def _requests_only(container: JsonDict) -> dict[str, Any]:
    """A container reduced to what Kueue counts: its name, image and resource requests.

    Where only a limit is set (GPUs), the limit is the request, as the API server defaults it
    for a pod; a Workload's template gets no such defaulting.
    """
    resources = container.get("resources") or {}
    requests = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return {
        "name": container.get("name", WORKER_CONTAINER),
        "image": container.get("image", ""),
        "resources": {"requests": requests},
    }
