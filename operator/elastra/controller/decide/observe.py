"""Turn the pods and nodes the API returned into what the pure decisions read.

Pure: dicts in, frozen values out. This is where Kubernetes' many ways of saying a pod is
gone (phase Failed with reason Evicted, a deletion timestamp, a node that vanished or went
NotReady) become the few states the resize policy decides on.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from elastra.api import TrainingJob
from elastra.controller.decide.manifests import (
    ANNOTATION_ASSIGNMENT,
    ANNOTATION_GPU_TYPE,
    ANNOTATION_NODE,
    ANNOTATION_RETIRED,
    LABEL_LEADER,
    LABEL_SLOT,
    is_gated,
)
from elastra.controller.decide.memo import LastOf
from elastra.elastic.workers import NodeHealth, NodeName, PodName, WorkerView, classify

JsonDict = dict[str, Any]


@dataclass(frozen=True)
class PodFacts:
    """One worker pod reduced to what the controller uses."""

    view: WorkerView
    raw: Mapping[str, Any]
    assignment: str
    assignment_version: int
    ip: str | None
    bound: bool
    node_gone: bool
    """Bound to a node that no longer exists: no kubelet will ever finish its deletion."""
    gated: bool
    exit_code: int | None
    leader: bool = False
    """Labelled as its world's rank 0 (``LABEL_LEADER``)."""
    exit_message: str = ""
    """The worker container's termination message, one line: why it failed for good (a
    worker that exits with the permanent code writes it, ``elastra_worker.termination``)."""

    @property
    def name(self) -> PodName:
        """The pod's name."""
        return self.view.pod


def parse_time(value: Any, default: datetime) -> datetime:
    """An RFC 3339 timestamp from the API, or ``default`` when absent or malformed."""
    if not value:
        return default
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return default


def format_time(moment: datetime) -> str:
    """The API's RFC 3339 form, seconds precision, UTC."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_health(nodes: Sequence[Mapping[str, Any]]) -> Mapping[str, NodeHealth]:
    """Health of every node by name (computed once per listing: see ``memo``)."""
    return _HEALTH.get(nodes, _node_health)


def _node_health(nodes: Sequence[Mapping[str, Any]]) -> Mapping[str, NodeHealth]:
    health: dict[str, NodeHealth] = {}
    for node in nodes:
        name = str((node.get("metadata") or {}).get("name", ""))
        conditions = (node.get("status") or {}).get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        schedulable = not (node.get("spec") or {}).get("unschedulable", False)
        health[name] = NodeHealth(exists=True, ready=ready, schedulable=schedulable)
    return health


_HEALTH: LastOf[Sequence[Mapping[str, Any]], Mapping[str, NodeHealth]] = LastOf()
API_TIME_RESOLUTION = timedelta(seconds=1)
"""The API server writes timestamps in whole seconds (RFC 3339 without fractions)."""

_MISSING = NodeHealth(exists=False, ready=False, schedulable=False)


def pod_facts(
    pod: Mapping[str, Any],
    nodes: Mapping[str, NodeHealth],
    *,
    now: datetime,
    lost_nodes: Mapping[str, datetime] | None = None,
) -> PodFacts:
    """Classify one worker pod.

    ``lost_nodes`` says when the operator saw nodes deleted: a pod on a vanished node broke
    then, not when it last turned Ready, so the policy's settle window can fold a rack whose
    nodes go one after another into one resize.
    """
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    created = parse_time(meta.get("creationTimestamp"), now)
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    ready_condition = conditions.get("Ready") or {}
    scheduled = conditions.get("PodScheduled") or {}
    gated = is_gated(pod)
    bound_node = spec.get("nodeName")
    node = None if not bound_node else nodes.get(str(bound_node), _MISSING)
    terminated = _terminated(status)
    state = classify(
        phase=str(status.get("phase", "Pending")),
        ready=ready_condition.get("status") == "True",
        gated=gated,
        deleting=bool(meta.get("deletionTimestamp")),
        reason=status.get("reason"),
        node=node,
    )
    since = created
    for condition in (ready_condition, scheduled):
        since = max(since, parse_time(condition.get("lastTransitionTime"), since))
    if terminated is not None:
        # finishedAt is cut to whole seconds: the container may have exited up to a second
        # later, and the settle window must not close before a burst's last exit.
        since = parse_time(terminated.get("finishedAt"), since) + API_TIME_RESOLUTION
    if node is _MISSING and lost_nodes and str(bound_node) in lost_nodes:
        since = max(since, lost_nodes[str(bound_node)])
    retired = annotations.get(ANNOTATION_RETIRED)
    assignment = str(annotations.get(ANNOTATION_ASSIGNMENT, ""))
    view = WorkerView(
        pod=PodName(str(meta.get("name", ""))),
        slot=_int(labels.get(LABEL_SLOT), -1),
        state=state,
        since=since,
        node=NodeName(str(bound_node or annotations.get(ANNOTATION_NODE) or "")) or None,
        gpu_type=annotations.get(ANNOTATION_GPU_TYPE),
        exit_code=None if terminated is None else _int(terminated.get("exitCode"), None),
        unschedulable=scheduled.get("reason") == "Unschedulable",
        retiring_since=parse_time(retired, now) if retired else None,
        node_down=node is not None and node.down,
    )
    return PodFacts(
        view=view,
        raw=pod,
        assignment=assignment,
        assignment_version=_assignment_version(assignment),
        ip=status.get("podIP"),
        bound=bool(bound_node),
        node_gone=node is not None and not node.exists,
        gated=gated,
        exit_code=view.exit_code,
        leader=labels.get(LABEL_LEADER) == "true",
        exit_message=exit_message(terminated),
    )


def _terminated(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for container in status.get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated:
            return dict(terminated)
    return None


MAX_EXIT_MESSAGE = 512
"""Characters of a termination message kept: it becomes part of a condition's message."""


def exit_message(terminated: Mapping[str, Any] | None) -> str:
    """The last non-empty line of a terminated container's message, bounded; ``""`` if none.

    The worker writes one line; a message the pod's own code left longer (or the kubelet's
    log tail, under ``FallbackToLogsOnError``) is cut to the line that says the most: its last.
    """
    text = str((terminated or {}).get("message") or "")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    line = lines[-1]
    return line if len(line) <= MAX_EXIT_MESSAGE else line[: MAX_EXIT_MESSAGE - 3] + "..."


def _assignment_version(text: str) -> int:
    try:
        return int(json.loads(text).get("worldVersion", 0)) if text else 0
    except (ValueError, AttributeError, TypeError):
        return 0


def _int(value: Any, default: Any) -> Any:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


NODE_ANNOTATION_PREFIX = "elastra.dev/"
"""The only node annotations the operator reads (the inventory's figures, e.g. gpu-tflops)."""


def slim_node(node: Mapping[str, Any]) -> JsonDict:
    """The parts of a Node the planner and node health read, for the shared snapshot.

    Real nodes carry kilobytes the operator never reads (``status.images``, ``nodeInfo``,
    managed fields, other controllers' annotations); the snapshot holds every node between
    listings, so it keeps only these. ``node_fingerprint`` hashes exactly this, so whatever the
    planner can see change wakes the jobs, and nothing else does.
    """
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    annotations = meta.get("annotations") or {}
    return {
        "metadata": {
            "name": meta.get("name"),
            "creationTimestamp": meta.get("creationTimestamp"),
            "labels": meta.get("labels") or {},
            "annotations": {
                k: v for k, v in annotations.items() if str(k).startswith(NODE_ANNOTATION_PREFIX)
            },
        },
        "spec": {"unschedulable": spec.get("unschedulable"), "taints": spec.get("taints")},
        "status": {
            "allocatable": status.get("allocatable") or {},
            "conditions": [
                {"type": c.get("type"), "status": c.get("status")}
                for c in status.get("conditions") or []
            ],
        },
    }


def newest_node(nodes: Sequence[Mapping[str, Any]]) -> datetime | None:
    """When the newest of ``nodes`` was created (``None``: none says); once per listing."""
    return _NEWEST.get(nodes, _newest_node)


def _newest_node(nodes: Sequence[Mapping[str, Any]]) -> datetime | None:
    stamps = (str((n.get("metadata") or {}).get("creationTimestamp") or "") for n in nodes)
    times = [parse_time(s, datetime.min.replace(tzinfo=UTC)) for s in stamps if s]
    return max(times, default=None)


_NEWEST: LastOf[Sequence[Mapping[str, Any]], datetime | None] = LastOf()


def node_fingerprint(node: Mapping[str, Any]) -> str:
    """A digest of what the planner reads of a node (``slim_node``), not its heartbeats."""
    return hashlib.sha256(json.dumps(slim_node(node), sort_keys=True).encode()).hexdigest()


def slim_pod(pod: Mapping[str, Any]) -> JsonDict:
    """The parts of any pod that capacity and sharing read, for the shared snapshot.

    Where it runs or will run (``nodeName``, or a gated Elastra pod's planned node), what its
    containers request, whether it still holds them (phase, deletion) and whose job it is.
    """
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    annotations = meta.get("annotations") or {}
    slim_meta: JsonDict = {
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "labels": meta.get("labels") or {},
    }
    if ANNOTATION_NODE in annotations:
        slim_meta["annotations"] = {ANNOTATION_NODE: annotations[ANNOTATION_NODE]}
    if meta.get("deletionTimestamp"):
        slim_meta["deletionTimestamp"] = meta["deletionTimestamp"]
    return {
        "metadata": slim_meta,
        "spec": {
            "nodeName": spec.get("nodeName"),
            "containers": [
                {"resources": c.get("resources") or {}} for c in spec.get("containers") or []
            ],
            "initContainers": [
                {"resources": c.get("resources") or {}} for c in spec.get("initContainers") or []
            ],
        },
        "status": {"phase": (pod.get("status") or {}).get("phase")},
    }


GAUGES = {
    "elastra_worker_step": "step",
    "elastra_worker_samples_per_second": "samples_per_second",
    "elastra_worker_last_checkpoint_step": "last_checkpoint_step",
    "elastra_worker_world_version": "world_version",
    "elastra_worker_resize_downtime_seconds": "resize_downtime_s",
    "elastra_worker_goodput": "goodput",
}
STATE_SOURCES = ("storage", "peers", "memory")
"""Where a new world's state can come from (``elastra_worker.downtime``); anything else a
worker reports is not recorded."""


@dataclass(frozen=True)
class WorkerProgress:
    """What rank 0 reported."""

    step: int
    samples_per_second: float
    last_checkpoint_step: int | None
    world_version: int | None
    resize_downtime_s: float | None = None
    """The world's resume gap (``elastra_worker.downtime``); ``None`` in a first world."""
    state_from: str | None = None
    """Where that world's state came from (the gauge's ``state_from`` label)."""
    goodput: float | None = None
    """The job's goodput as rank 0 measures it (``elastra_worker.downtime``), a fraction."""


def parse_metrics(text: str) -> WorkerProgress | None:
    """The progress gauges of a worker's ``/metrics`` page; ``None`` before its first step.

    Every gauge here is a finite count or rate: a NaN, an infinity (``1e400`` parses as one)
    or a negative value is a broken or hostile worker and is ignored, never an exception.
    """
    values: dict[str, float] = {}
    state_from: str | None = None
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, rest = line.partition(" ")
        name, labels = _labels(name)
        key = GAUGES.get(name)
        if key is None:
            continue
        if key == "resize_downtime_s":
            state_from = labels.get("state_from")
        try:
            value = float(rest.split()[0])
        except (IndexError, ValueError):
            continue
        if math.isfinite(value) and value >= 0 and (key != "goodput" or value <= 1):
            values[key] = value
    if "step" not in values:
        return None
    checkpoint = values.get("last_checkpoint_step")
    version = values.get("world_version")
    return WorkerProgress(
        step=int(values["step"]),
        samples_per_second=values.get("samples_per_second", 0.0),
        last_checkpoint_step=int(checkpoint) if checkpoint is not None else None,
        world_version=int(version) if version is not None else None,
        resize_downtime_s=values.get("resize_downtime_s"),
        state_from=state_from if state_from in STATE_SOURCES else None,
        goodput=values.get("goodput"),
    )


def _labels(sample: str) -> tuple[str, dict[str, str]]:
    """``name{a="x",b="y"}`` -> (name, labels); values holding quotes or commas are not
    expected from a worker and make the label unreadable, never an exception."""
    name, brace, rest = sample.partition("{")
    if not brace:
        return name, {}
    labels: dict[str, str] = {}
    for pair in rest.rstrip("}").split(","):
        key, eq, value = pair.partition("=")
        if eq and value.startswith('"') and value.endswith('"') and len(value) >= 2:
            labels[key.strip()] = value[1:-1]
    return name, labels


def simulated(node: Mapping[str, Any], skip: Sequence[str]) -> bool:
    """``node`` carries one of the ``key=value`` labels of ``skip`` (the operator's
    ``skip_metrics_labels``): a simulated node, whose pod addresses belong to nobody."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    return any(labels.get(k) == v for k, _, v in (s.partition("=") for s in skip))


def rank0_address(
    job: TrainingJob,
    pods: Sequence[Mapping[str, Any]],
    nodes: Sequence[Mapping[str, Any]],
    skip: Sequence[str],
) -> str | None:
    """Rank 0's pod IP when it is running on a real (not simulated) node, else ``None``."""
    leader = next((p.pod for p in job.status.placement if p.rank == 0), None)
    if leader is None or not job.status.world.ranks:
        return None
    pod = next((p for p in pods if (p.get("metadata") or {}).get("name") == leader), None)
    if pod is None:
        return None
    node_name = (pod.get("spec") or {}).get("nodeName")
    node = next((n for n in nodes if (n.get("metadata") or {}).get("name") == node_name), None)
    return pod_address(pod, node, skip)


def pod_address(
    pod: Mapping[str, Any], node: Mapping[str, Any] | None, skip: Sequence[str]
) -> str | None:
    """The IP of ``pod`` when it is running on ``node``, a real (not simulated) node; else
    ``None``: there is no agent to reach."""
    if (pod.get("status") or {}).get("phase") != "Running":
        return None
    if node is None or simulated(node, skip):
        return None
    ip = (pod.get("status") or {}).get("podIP")
    return str(ip) if ip else None


def agent_url(address: str, port: int, path: str) -> str:
    """The URL of ``path`` on a pod's agent (an IPv6 address in brackets)."""
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}{path}"
