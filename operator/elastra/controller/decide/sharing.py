"""Claims of every TrainingJob, read from raw objects, for ``elastra.elastic.share``.

Listing all jobs and parsing each fully on every pass would cost O(jobs^2) pydantic parses;
the sharing rule needs six facts per job, read here straight from the dicts. Priorities are
numbers by then: ``priorities`` reads the cluster's PriorityClasses (which the snapshot
caches) into a ``Priorities``, and each job's class name is looked up in it per pass.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from elastra.api import TrainingJob
from elastra.api.reasons import Reason
from elastra.controller.decide.manifests import LABEL_JOB
from elastra.controller.decide.memo import LastOf, PerObject
from elastra.controller.decide.observe import PodFacts
from elastra.controller.decide.placeholders import requester
from elastra.elastic.share import NO_CLASSES, Claim, Priorities, Scope, shared_desired
from elastra.planner.catalog import lookup, matches

JsonDict = Mapping[str, Any]


def compatible(pattern: str, type_name: str) -> bool:
    """Does a ``worker.gpuTypes`` entry (or a type name) select this catalog type?"""
    if pattern == type_name:
        return True
    gpu = lookup(type_name)
    return gpu is not None and matches(pattern, gpu)


def priorities(classes: Iterable[JsonDict]) -> Priorities:
    """The value of every PriorityClass (raw objects), and the global default's."""
    return Priorities.of_classes(
        (
            str((c.get("metadata") or {}).get("name") or ""),
            int(c.get("value") or 0),
            bool(c.get("globalDefault")),
        )
        for c in classes
    )


def desired(
    job: TrainingJob,
    facts: Mapping[str, PodFacts],
    jobs: Sequence[JsonDict],
    cluster_pods: Sequence[JsonDict],
    *,
    free: int,
    reserved: Sequence[JsonDict] = (),
    priorities: Priorities = NO_CLASSES,
    scope: Scope = Scope.NAMESPACE,
) -> int:
    """``spec.replicas``, lowered while a starved job needs GPUs this job may give it.

    The size the user asked for, not the planner's: what the planner can place now is
    ``decide``'s concern (``placeable``), and starting from a smaller planned size here would
    make a job that is short of capacity also give GPUs away it never asked to give. A job
    whose PriorityClass does not exist (its pods would be refused) neither gives nor takes.
    """
    if scope is Scope.OFF:
        return job.spec.replicas
    key = f"{job.metadata.namespace}/{job.metadata.name}"
    entries = [e for e in _CLAIMS.get(jobs, _PER_JOB.map) if e is not None and e[0].key != key]
    if not any(claim.starved for claim, _ in entries):
        return job.spec.replicas  # nobody waits for GPUs: nothing to give (most passes)
    template = job.spec.worker.template
    priority = priorities.of(template.pod_spec().priority_class_name if template else None)
    if priority is None:
        return job.spec.replicas
    counts = _LIVE_PODS.get(cluster_pods, _live_pods) + _counted(map(_live_job, reserved))
    # Terminating pods count (``holds_gpus``): before, a donor whose donated pod was still
    # shutting down gave a second one in that moment. Bound capacity requests count too
    # (``_live_job``), for every job alike, so that all passes compute the same gifts.
    held = sum(1 for f in facts.values() if f.view.state.holds_gpus)
    held += counts.get(_requests_key(key), 0)
    placed = {p.gpu_type for p in job.status.placement if p.gpu_type}
    me = Claim(
        key=key,
        minimum=job.spec.min_replicas,
        held=held,
        starved=_starved(job.status.model_dump(by_alias=True), job.spec.suspend),
        gpu_types=frozenset(placed or job.spec.worker.gpu_types),
        priority=priority,
    )
    others = [
        dataclasses.replace(
            claim,
            held=counts.get(claim.key, 0) + counts.get(_requests_key(claim.key), 0),
            priority=value,
        )
        for claim, class_name in entries
        if (value := priorities.of(class_name)) is not None
    ]
    return shared_desired(
        me, others, desired=job.spec.replicas, free=free, compatible=compatible, scope=scope
    )


def free_for_starved(new_pod_nodes: Iterable[str], facts: Mapping[str, PodFacts]) -> int:
    """How many of the new pods this job could place now stand on capacity nobody holds:
    ``desired``'s ``free``.

    The job's placement counts its own pods' capacity as its to plan with again, retiring
    pods' too, so a node where a donated pod is still stopping looks free to its donor. Those
    GPUs are the gift itself: counted as free, they covered the starved job's deficit, the
    donor's gift fell to nothing and its size went back up to what it still held (a pod
    created where the donated one was stopping, seen in an integration run: the donor took
    the GPUs back or ended below its share). Per node, new pods use up the capacity of the
    job's retiring pods there first.
    """
    retiring = Counter(
        str(f.view.node)
        for f in facts.values()
        if f.view.retiring_since is not None and f.view.state.alive and f.view.node
    )
    placed = Counter(new_pod_nodes)
    return sum(max(0, count - retiring[node]) for node, count in placed.items())


_Entry = tuple[Claim, str | None]
"""A job's claim (``held`` 0, priority 0: both filled per pass) and its PriorityClass name."""


def _claim(raw: JsonDict) -> _Entry | None:
    meta = raw.get("metadata") or {}
    spec = raw.get("spec") or {}
    status = raw.get("status") or {}
    key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    try:
        minimum = int(spec.get("minReplicas", 1))
    except (TypeError, ValueError):
        return None
    starved = _starved(status, bool(spec.get("suspend")))
    placed = {str(p.get("gpuType")) for p in status.get("placement") or [] if p.get("gpuType")}
    worker = spec.get("worker") or {}
    patterns = {str(t) for t in worker.get("gpuTypes") or []}
    class_name = ((worker.get("template") or {}).get("spec") or {}).get("priorityClassName")
    claim = Claim(
        key=key,
        minimum=minimum,
        held=0,
        starved=starved,
        gpu_types=frozenset(patterns if starved or not placed else placed),
    )
    return claim, str(class_name) if class_name else None


def _starved(status: JsonDict, suspended: bool) -> bool:
    if suspended:
        return False
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    degraded = conditions.get("Degraded") or {}
    admitted = conditions.get("Admitted") or {}
    terminal = any(
        (conditions.get(t) or {}).get("status") == "True" for t in ("Failed", "Succeeded")
    )
    return (
        not terminal
        and admitted.get("status") != "False"
        and degraded.get("status") == "True"
        and degraded.get("reason") == Reason.INSUFFICIENT_CAPACITY
    )


_LIVE_PODS: LastOf[Sequence[JsonDict], Counter[str]] = LastOf()
_PER_JOB: PerObject[JsonDict, _Entry | None] = PerObject(_claim)
"""Each job's claim and class name: re-read only when the job changed."""
_CLAIMS: LastOf[Sequence[JsonDict], list[_Entry | None]] = LastOf()


def _live_pods(pods: Sequence[JsonDict]) -> Counter[str]:
    """Pods per job ("namespace/name") that hold or will hold their GPUs (for the shared
    listing only: the memo keeps the pods of the last listing it was given)."""
    return _counted(_LIVE_JOB.map(pods))


def _counted(jobs: Iterable[str | None]) -> Counter[str]:
    return Counter(job for job in jobs if job is not None)


def _live_job(pod: JsonDict) -> str | None:
    """The counting key of a pod that holds or will hold GPUs for a job: the job's key for
    its workers (terminating ones too: see ``holds_gpus``), ``_requests_key`` of it for a
    capacity request the scheduler bound to a node.

    A bound request holds a node the job asked for and is about to use (it is replaced by a
    worker in the job's next pass): before it counted, a donor that had freed a node for a
    starved job saw the job's own request on that node, still no worker of the job, and no
    free node, and gave a second pod (the starved job then ended above, the donor at, its
    minimum). Pending requests hold nothing.
    """
    meta = pod.get("metadata") or {}
    namespace = meta.get("namespace", "")
    job = (meta.get("labels") or {}).get(LABEL_JOB)
    phase = (pod.get("status") or {}).get("phase")
    if job and phase not in ("Succeeded", "Failed"):
        return f"{namespace}/{job}"
    asked_for = requester(pod)
    if asked_for and (pod.get("spec") or {}).get("nodeName") and not meta.get("deletionTimestamp"):
        return _requests_key(f"{namespace}/{asked_for}")
    return None


def _requests_key(job: str) -> str:
    """Where ``_live_job`` counts a job's bound capacity requests (no job key ends so)."""
    return f"{job}/capacity-requests"


_LIVE_JOB: PerObject[JsonDict, str | None] = PerObject(_live_job)
