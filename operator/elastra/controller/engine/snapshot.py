"""The cluster as every pass reads it: the informers' stores, plus the pods being created.

Passes read nodes, pods, TrainingJobs and PriorityClasses (for sharing, as numbers: see
``sharing.priorities``) from watch-fed caches (``elastra.kube.informer``), so
a pass makes no read request at all, and a steady job costs the API server nothing.

A cache lags the writes that passes make, which matters in two ways:

- Job loops plan concurrently, so without help two jobs could pick the same free GPUs in the
  moment before either's new pods reach the cache, and the scheduler would leave one gang
  Unschedulable. Each pass therefore ``reserve``s the pods it is about to create in the same
  event-loop step in which it planned them (``read`` does not await), and every later read
  counts them as placed.
- A pass must never take a pod it just created for a lost one (and re-plan the world). The
  reservations are also the pass's "expectations": ``job_pods`` returns the cached pods of a
  job plus its reserved pods the cache does not show yet (the create's answer once it came).

A reservation ends when the pods informer reports the pod (added, changed or deleted: from
then on the cache tells the truth), when its create fails, or ``RESERVATION_TTL_S`` after
its create returned, so a pod the watch never reports (created and deleted across a relist)
cannot hold capacity forever.

A node the operator declared lost before the node controller did (``nodeliveness``: its Lease
overdue and its workers silent) is read as NotReady (``unresponsive``), by the policy, which
counts its pods lost, and by the planner, which places nothing there, until its Lease is
renewed again or the node controller's own condition takes over.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType

from elastra.controller.decide.manifests import LABEL_JOB
from elastra.controller.decide.memo import PerObject
from elastra.controller.decide.observe import slim_node, slim_pod
from elastra.controller.decide.placeholders import requester
from elastra.controller.decide.sharing import priorities
from elastra.elastic.liveness import NODE_UNRESPONSIVE
from elastra.elastic.share import NO_CLASSES, Priorities
from elastra.kube import resources
from elastra.kube.client import JsonDict, Kube
from elastra.kube.informer import Informer, Key, key_of, version_of, without_managed_fields

LOST_NODE_MEMORY = timedelta(hours=1)
RESERVATION_TTL_S = 60.0
"""How long a created pod the pods informer never reported still counts as placed."""


@dataclass(frozen=True)
class ClusterState:
    """What every job's pass shares: all nodes, all pods, all TrainingJobs (in tuples that stay
    the same objects until their informer changes, so derived values are cached per change),
    and the pods being created that the cache does not show yet."""

    nodes: tuple[JsonDict, ...]
    pods: tuple[JsonDict, ...]
    jobs: tuple[JsonDict, ...]
    reserved: tuple[JsonDict, ...] = ()
    lost_nodes: Mapping[str, datetime] = dataclasses.field(default_factory=dict)
    priorities: Priorities = NO_CLASSES
    """The PriorityClasses' values (none read when sharing is off)."""


@dataclass
class _Reservation:
    """A pod a pass is creating: the manifest, then the create's answer."""

    pod: JsonDict
    settled: float | None = None
    """When its create call returned (monotonic); ``None`` while it is in flight."""
    slim: JsonDict = field(init=False)
    """``slim_pod(pod)``, made once: under a burst of creates hundreds of reservations wait
    for the watch, and every pass reads them all (slimming them per read was 8 % of the
    operator's CPU at 300 jobs)."""

    def __post_init__(self) -> None:
        self.slim = slim_pod(self.pod)

    def update(self, pod: JsonDict) -> None:
        """The server's answer replaces the manifest."""
        self.pod = pod
        self.slim = slim_pod(pod)


def job_of(pod: Mapping[str, object]) -> tuple[str, str] | None:
    """(namespace, job) of an Elastra worker pod or capacity-request pod (``placeholders``):
    a change to either wakes the job; ``None`` for any other pod."""
    meta = pod.get("metadata") or {}
    assert isinstance(meta, Mapping)
    job = (meta.get("labels") or {}).get(LABEL_JOB) or requester(pod)
    return (str(meta.get("namespace") or ""), str(job)) if job else None


def keep_pod(pod: JsonDict) -> JsonDict:
    """What the pods cache keeps: a worker pod whole (passes read its status and
    annotations), any other pod only as much as capacity needs (``slim_pod``)."""
    return without_managed_fields(pod) if job_of(pod) is not None else slim_pod(pod)


@dataclass
class ClusterSnapshot:
    """Nodes, pods, TrainingJobs and PriorityClasses from their informers, and this
    operator's reservations."""

    nodes: Informer
    pods: Informer
    jobs: Informer
    classes: Informer | None = None
    """PriorityClasses; ``None`` when nothing reads them (sharing off)."""
    _cluster: ClusterState = field(default_factory=lambda: ClusterState((), (), ()))
    _built: tuple[int, int, int, int, int] = (-1, -1, -1, -1, -1)
    _reserved: dict[Key, _Reservation] = field(default_factory=dict)
    _slim: PerObject[JsonDict, JsonDict] = field(default_factory=lambda: PerObject(slim_pod))
    """Each cached pod's ``slim_pod``: a read re-slims only the pods that changed."""
    _lost_nodes: dict[str, datetime] = field(default_factory=dict)
    _status_written: dict[Key, datetime] = field(default_factory=dict)
    """When this operator last wrote each job's status (for ``pacing``), until the job goes."""
    _unresponsive: dict[str, str] = field(default_factory=dict)
    """Nodes declared lost by ``nodeliveness`` -> why (the Ready condition's message)."""
    _unresponsive_changes: int = 0

    def __post_init__(self) -> None:
        self.pods.listeners.append(self._pod_seen)
        self.jobs.listeners.append(self._job_seen)

    @classmethod
    def watching(
        cls, kube: Kube, *, watch_timeout_s: float = 600.0, priority_classes: bool = True
    ) -> ClusterSnapshot:
        """A snapshot over informers of every node, pod and TrainingJob of the cluster, and
        of every PriorityClass unless ``priority_classes`` is false.

        Cluster-wide even when the operator manages one namespace: capacity counts every pod
        on a node, and scarce GPU types may be shared between the jobs of all namespaces.
        """
        return cls(
            nodes=resources.nodes_informer(kube, slim_node, watch_timeout_s=watch_timeout_s),
            pods=resources.pods_informer(
                kube, keep_pod, index=job_of, watch_timeout_s=watch_timeout_s
            ),
            jobs=resources.jobs_informer(kube, watch_timeout_s=watch_timeout_s),
            classes=resources.priority_classes_informer(kube, watch_timeout_s=watch_timeout_s)
            if priority_classes
            else None,
        )

    @property
    def informers(self) -> tuple[Informer, ...]:
        """The informers (the operator runs each as a task)."""
        found = (self.nodes, self.pods, self.jobs)
        return found if self.classes is None else (*found, self.classes)

    @property
    def synced(self) -> bool:
        """True once every informer has its first list."""
        return all(i.synced for i in self.informers)

    async def wait_synced(self) -> None:
        """Return once every informer has its first list (no pass plans from a partial view)."""
        for informer in self.informers:
            await informer.wait_synced()

    def read(self) -> ClusterState:
        """The cluster as cached now, plus reservations (never awaits: see the module doc)."""
        self._rebuild()
        now = time.monotonic()
        self._reserved = {
            k: r
            for k, r in self._reserved.items()
            if r.settled is None or now - r.settled < RESERVATION_TTL_S
        }
        extra = tuple(r.slim for r in self._reserved.values())
        if not extra and not self._lost_nodes:
            return self._cluster
        return dataclasses.replace(self._cluster, reserved=extra, lost_nodes=dict(self._lost_nodes))

    def _rebuild(self) -> None:
        """New tuples for the informers that changed since the last read, and only for them."""
        nodes, pods, jobs = self.nodes.version, self.pods.version, self.jobs.version
        classes = -1 if self.classes is None else self.classes.version
        marks = self._unresponsive_changes
        if (nodes, pods, jobs, classes, marks) == self._built:
            return
        was = self._cluster
        same_nodes = (nodes, marks) == (self._built[0], self._built[4])
        self._cluster = ClusterState(
            nodes=was.nodes
            if same_nodes
            else tuple(unresponsive(n, self._unresponsive) for n in self.nodes.items()),
            pods=was.pods if pods == self._built[1] else tuple(self._slim.map(self.pods.items())),
            jobs=was.jobs if jobs == self._built[2] else tuple(self.jobs.items()),
            priorities=was.priorities
            if classes == self._built[3] or self.classes is None
            else priorities(self.classes.items()),
        )
        self._built = (nodes, pods, jobs, classes, marks)

    def job(self, namespace: str, name: str) -> JsonDict | None:
        """The cached TrainingJob, or ``None``."""
        return self.jobs.get(namespace, name)

    def job_pods(self, namespace: str, name: str) -> list[JsonDict]:
        """The job's cached worker pods, and those it is creating that the cache does not show
        yet."""
        return [p for p in self._children(namespace, name) if requester(p) is None]

    def capacity_requests(self, namespace: str, name: str) -> list[JsonDict]:
        """The job's capacity-request pods (``placeholders``), as ``job_pods`` its workers."""
        return [p for p in self._children(namespace, name) if requester(p) is not None]

    def _children(self, namespace: str, name: str) -> list[JsonDict]:
        cached = self.pods.indexed((namespace, name))
        seen = {key_of(p) for p in cached}
        extra = [
            r.pod
            for k, r in self._reserved.items()
            if k not in seen and job_of(r.pod) == (namespace, name)
        ]
        return cached + extra

    def reserve(self, pods: Sequence[JsonDict]) -> None:
        """Count ``pods`` as placed from now on (call before awaiting anything after planning)."""
        for pod in pods:
            self._reserved[key_of(pod)] = _Reservation(pod)

    def created(self, pod: JsonDict, answer: JsonDict | None) -> None:
        """The create of ``pod`` returned ``answer`` (the server's object; ``None``: it existed)."""
        found = self._reserved.get(key_of(pod))
        if found is not None:
            found.settled = time.monotonic()
            if answer is not None:
                found.update(without_managed_fields(answer))

    def unreserve(self, pod: JsonDict) -> None:
        """The create of ``pod`` failed: its GPUs are free again."""
        self._reserved.pop(key_of(pod), None)

    def release(self, pods: Sequence[JsonDict]) -> None:
        """The pass is over: reservations of its creates that never returned are dropped.

        A pass that stopped early (a 409 on the status write, a failed delete) never sent
        those creates; without this they would hold their GPUs forever.
        """
        for pod in pods:
            found = self._reserved.get(key_of(pod))
            if found is not None and found.settled is None:
                del self._reserved[key_of(pod)]

    def current_pod(self, namespace: str, name: str) -> JsonDict | None:
        """A pod as this operator knows it now: its reservation's, else the cache's."""
        found = self._reserved.get((namespace, name))
        return found.pod if found is not None else self.pods.get(namespace, name)

    def wrote_job(self, before: JsonDict, after: JsonDict, *, at: datetime) -> None:
        """A status write (by the pass of time ``at``) returned ``after``: the cache holds it
        at once (see ``Informer``)."""
        self.jobs.written(version_of(before), after)
        self._status_written[key_of(after)] = at

    def status_written(self, namespace: str, name: str) -> datetime | None:
        """When this operator last wrote the job's status (``None``: not since it started)."""
        return self._status_written.get((namespace, name))

    def wrote_pod(self, before: JsonDict | None, after: JsonDict | None) -> None:
        """A pod patch from ``before`` returned ``after`` (``None``: the pod was gone)."""
        if before is None or after is None:
            return
        found = self._reserved.get(key_of(after))
        if found is not None:
            if version_of(found.pod) == version_of(before):
                found.update(without_managed_fields(after))
            return
        self.pods.written(version_of(before), after)

    def node_lost(self, name: str, when: datetime) -> None:
        """A node was deleted: remember when (for an hour; see ``observe.pod_facts``)."""
        self._lost_nodes = {
            n: t for n, t in self._lost_nodes.items() if when - t < LOST_NODE_MEMORY
        }
        self._lost_nodes.setdefault(name, when)

    def declare_unresponsive(self, name: str, why: str) -> bool:
        """Read node ``name`` as NotReady, for ``why``, from now on; False if it already was."""
        if name in self._unresponsive:
            return False
        self._unresponsive[name] = why
        self._unresponsive_changes += 1
        return True

    def clear_unresponsive(self, name: str) -> bool:
        """Read node ``name`` as it is again (its Lease renewed); False if it was not marked."""
        if self._unresponsive.pop(name, None) is None:
            return False
        self._unresponsive_changes += 1
        return True

    @property
    def unresponsive_nodes(self) -> Mapping[str, str]:
        """The nodes declared lost, and why (a read-only view, not a copy: the liveness task
        asks it for every node once a second)."""
        return MappingProxyType(self._unresponsive)

    def _job_seen(self, kind: str, old: JsonDict | None, new: JsonDict | None) -> None:
        """A job that is gone has no status to pace."""
        if new is None and old is not None:
            self._status_written.pop(key_of(old), None)

    def _pod_seen(self, kind: str, old: JsonDict | None, new: JsonDict | None) -> None:
        """The pods informer reported a pod: from now on the cache tells its truth."""
        self._reserved.pop(key_of(new or old or {}), None)


def unresponsive(node: JsonDict, marks: Mapping[str, str]) -> JsonDict:
    """``node`` (as the nodes informer keeps it) with its Ready condition Unknown if ``marks``
    names it; the same object otherwise."""
    name = str((node.get("metadata") or {}).get("name") or "")
    why = marks.get(name)
    if why is None:
        return node
    status = node.get("status") or {}
    others = [c for c in status.get("conditions") or [] if c.get("type") != "Ready"]
    ready = {"type": "Ready", "status": "Unknown", "reason": NODE_UNRESPONSIVE, "message": why}
    return {**node, "status": {**status, "conditions": [*others, ready]}}
