"""Events on TrainingJobs that aggregate instead of repeating.

A job that cannot be placed says so on every pass; one core/v1 Event per pass would bury
``kubectl describe tj`` under copies and cost the API server an object each time. Like
client-go's event recorder, an event that repeats (same object, type, reason and message)
updates one Event: ``count`` grows and ``lastTimestamp`` moves, and ``kubectl describe`` shows
"(x5 over 3m)". A different message is a different Event.

How the request count stays at one per event:

- The Event's name is derived from what it is (the job's name, then a digest of the job's uid,
  type, reason and message), so the same event always has the same name, also after an
  operator restart.
- A small in-memory cache per client (bounded, least recently used out first) remembers the
  count and resourceVersion of each recent Event, so a repeat is one merge patch, written with
  the resourceVersion as precondition (a counter is never last-writer-wins).
- Anything the cache does not know is repaired, never raised: a patch that finds the Event
  gone (404: the API server's event TTL, about an hour, expired it) creates it again; a create
  that finds it there (409: an operator restart, an evicted cache entry) reads it and bumps its
  count; a stale resourceVersion (409) re-reads and retries.

client-go also folds many similar events with different messages into one and rate-limits
events per object; Elastra's events are few per pass, so it does neither.

Events on Nodes (``record_node_event``: a node whose GPUs cannot be planned with) are not
counted: each is recorded once, by create alone, under a name derived from what it says.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime
from weakref import WeakKeyDictionary

from elastra.api.resource import GROUP, VERSION
from elastra.kube.client import MERGE_PATCH, ConflictError, JsonDict, Kube

CACHE_SIZE = 1024
"""Recent events remembered per client: enough for every job's live reasons on a big cluster;
an event evicted early costs one extra read (a 409 on create), not a duplicate."""
MESSAGE_LIMIT = 1024
"""Characters of a message kept (the API server accepts more; describe output stays readable)."""
ATTEMPTS = 4
"""Create/patch rounds before giving up: each 404 or 409 costs a round, and more than a couple
in a row means something else keeps deleting or rewriting the Event."""
NAME_LIMIT = 253
DIGEST_CHARS = 16
SOURCE_COMPONENT = "elastra-operator"
REPORTING_COMPONENT = "elastra.dev/operator"


@dataclass(frozen=True)
class EventKey:
    """What makes two events the same: the object, the type, the reason and the message."""

    namespace: str
    uid: str
    kind: str
    reason: str
    message: str


@dataclass(frozen=True)
class Seen:
    """What the last write told us about an Event."""

    count: int
    resource_version: str


class EventsGaveUpError(RuntimeError):
    """The Event kept changing or vanishing under every attempt to record it."""


def event_name(job_name: str, key: EventKey) -> str:
    """``<job>.<digest>``: the same event always gets the same, valid name."""
    text = "\0".join((key.uid, key.kind, key.reason, key.message))
    digest = hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]
    return f"{job_name[: NAME_LIMIT - DIGEST_CHARS - 1]}.{digest}"


def events_path(namespace: str, name: str = "") -> str:
    """Path of the core/v1 Events collection of a namespace, or of one Event."""
    base = f"/api/v1/namespaces/{namespace}/events"
    return f"{base}/{name}" if name else base


def _stamp(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class EventRecorder:
    """Records events about TrainingJobs through one client, folding repeats into one Event."""

    def __init__(self, *, capacity: int = CACHE_SIZE) -> None:
        self.capacity = capacity
        self._seen: OrderedDict[EventKey, Seen] = OrderedDict()

    async def record(
        self,
        kube: Kube,
        job: JsonDict,
        *,
        kind: str,
        reason: str,
        message: str,
        now: datetime | None = None,
    ) -> JsonDict:
        """Create the Event or count one more occurrence of it; returns it as the server has it."""
        meta = job["metadata"]
        key = EventKey(
            namespace=meta["namespace"],
            uid=str(meta.get("uid") or meta["name"]),
            kind=kind,
            reason=reason,
            message=message[:MESSAGE_LIMIT],
        )
        name = event_name(meta["name"], key)
        path = events_path(key.namespace, name)
        stamp = _stamp(now or datetime.now(UTC))
        known = self._seen.get(key)
        for _ in range(ATTEMPTS):
            if known is not None:
                try:
                    written = await kube.patch(path, _bump(known, stamp), kind=MERGE_PATCH)
                except ConflictError:  # stale resourceVersion: someone else counted too
                    known = _seen_of(await kube.get(path))
                    continue
                if written is not None:
                    return self._remember(key, written)
            created = await kube.create(
                events_path(key.namespace), _new_event(job, key, name=name, stamp=stamp)
            )
            if created is not None:
                return self._remember(key, created)
            known = _seen_of(await kube.get(path))  # it exists: continue its count
        self._seen.pop(key, None)
        raise EventsGaveUpError(
            f"event {key.namespace}/{name} ({reason}) changed or vanished {ATTEMPTS} times "
            "while being recorded"
        )

    def _remember(self, key: EventKey, event: JsonDict) -> JsonDict:
        seen = _seen_of(event)
        if seen is not None:
            self._seen[key] = seen
            self._seen.move_to_end(key)
            while len(self._seen) > self.capacity:
                self._seen.popitem(last=False)
        return event

    def __len__(self) -> int:
        return len(self._seen)


def _seen_of(event: JsonDict | None) -> Seen | None:
    """The count and resourceVersion of an Event as read or written; ``None`` when gone."""
    if event is None:
        return None
    return Seen(
        count=int(event.get("count") or 1),
        resource_version=str(event["metadata"]["resourceVersion"]),
    )


def _bump(seen: Seen, stamp: str) -> JsonDict:
    """One more occurrence; the resourceVersion makes the patch fail (409) if it is stale."""
    return {
        "metadata": {"resourceVersion": seen.resource_version},
        "count": seen.count + 1,
        "lastTimestamp": stamp,
    }


def _new_event(job: JsonDict, key: EventKey, *, name: str, stamp: str) -> JsonDict:
    """A core/v1 Event about ``job``, as ``kubectl describe tj`` shows it."""
    meta = job["metadata"]
    involved = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "name": meta["name"],
        "namespace": key.namespace,
        "uid": meta.get("uid"),
        "resourceVersion": meta.get("resourceVersion"),
    }
    return _event_body(
        name,
        key.namespace,
        involved=involved,
        kind=key.kind,
        reason=key.reason,
        message=key.message,
        stamp=stamp,
    )


def _event_body(
    name: str,
    namespace: str,
    *,
    involved: JsonDict,
    kind: str,
    reason: str,
    message: str,
    stamp: str,
) -> JsonDict:
    """A core/v1 Event named ``name`` about the object ``involved`` refers to, first seen now."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": namespace},
        "involvedObject": involved,
        "type": kind,
        "reason": reason,
        "message": message,
        "source": {"component": SOURCE_COMPONENT},
        "reportingComponent": REPORTING_COMPONENT,
        "reportingInstance": SOURCE_COMPONENT,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


_recorders: WeakKeyDictionary[Kube, EventRecorder] = WeakKeyDictionary()
"""One recorder per client, living as long as it: the controller passes the client, not a
recorder, to every reconcile pass, and a test's fresh client starts with an empty cache."""


def recorder_for(kube: Kube) -> EventRecorder:
    """The event recorder that belongs to ``kube``."""
    recorder = _recorders.get(kube)
    if recorder is None:
        recorder = _recorders[kube] = EventRecorder()
    return recorder


async def record_event(
    kube: Kube,
    job: JsonDict,
    *,
    kind: str,
    reason: str,
    message: str,
    now: datetime | None = None,
) -> JsonDict:
    """A core/v1 Event on the TrainingJob; a repeat of a recent one counts on that one."""
    return await recorder_for(kube).record(
        kube, job, kind=kind, reason=reason, message=message, now=now
    )


NODE_EVENTS_NAMESPACE = "default"
"""Where events about Nodes (cluster-scoped) live, as the kubelet's do."""


async def record_node_event(
    kube: Kube,
    node: str,
    *,
    kind: str,
    reason: str,
    message: str,
    now: datetime | None = None,
) -> JsonDict | None:
    """A core/v1 Event on the Node ``node``, recorded once: its name is derived from what it
    says, so recording it again (another pass, an operator restart) creates nothing and
    returns ``None``. ``kubectl describe node`` shows it: the reference carries the node's
    name as its uid, the kubelet's convention that describe looks up."""
    message = message[:MESSAGE_LIMIT]
    key = EventKey(NODE_EVENTS_NAMESPACE, node, "Node", reason, f"{kind}\0{message}")
    name = event_name(node, key)
    stamp = _stamp(now or datetime.now(UTC))
    body = _event_body(
        name,
        NODE_EVENTS_NAMESPACE,
        involved={"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
        kind=kind,
        reason=reason,
        message=message,
        stamp=stamp,
    )
    return await kube.create(events_path(NODE_EVENTS_NAMESPACE), body)
