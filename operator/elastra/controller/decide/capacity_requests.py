"""How many nodes a job asks its cluster's autoscaler for, and when it stops asking.

A job that wants more workers than the nodes hold (below ``minReplicas`` to start, or short
of its desired size to grow), for lack of capacity rather than by the planner's preference,
asks for the missing workers' worth of nodes: one capacity-request pod each
(``placeholders``). The decision is level-triggered, like the rest of a pass: every pass
derives how many requests the job wants from the job and what exists, creates the missing
and deletes the rest. So a job scaled down, finished, deleted (its requests are owned by it),
suspended or held by Kueue, or failed leaves nothing pending.

When the autoscaler's node arrives, the scheduler binds a request there; the job's inventory
counts the GPUs its own requests hold as free for it (``capacity.cluster_inventory``), so the
planner places workers there, and the pass that creates them deletes the requests on those
nodes (they must go for the workers to fit: ``Want.waiting``). Deletes go first in the pass:
a ResourceQuota that holds exactly the job's GPUs would otherwise refuse the workers while
the requests still count.

Without flapping:

- Only capacity shortage asks: when the planner prefers fewer workers than desired on the
  capacity it sees (its cost objective, a network-bound model), the job asks for nothing, and
  a request that brought such nodes ends ``Declined``; asking again would bring a node the
  planner again declines.
- A request nobody satisfies in ``timeout`` (a request older than that still exists: not
  bound, or bound to a node the job cannot use) is withdrawn, reported once (an Event) and
  recorded ``Unsatisfied``.
- A closed request (``Declined``, ``Unsatisfied``) opens again only when something changed
  that could change the answer: the spec (its generation), the job losing workers, or, for
  ``Unsatisfied``, a node added to the cluster since.
- While a failure backoff holds creation back the planner is not asked, and the requests
  that exist stay as they are (``Want.short`` is ``None``).
- Requests are matched to what exists by name (``placeholders.request_name``), so a pass that
  runs before the cache shows its last creates or deletes repeats them harmlessly.

Elastra's own placements come first. A pending request takes any room that frees up, at once,
while a job's workers are created only after a pass planned them: a request could take the
node sharing freed for a starved job, or that a job planned for its workers a moment before.
So a request bound to a node where another job's worker waits gives way (``Want.contested``),
and while another job's worker waits for a node this job could use, it creates no new request
(``Want.hold_new``): the replacement would win the same race again.

Pure: values in, decisions out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from elastra.api import CapacityRequestState, CapacityRequestStatus
from elastra.api.reasons import Reason
from elastra.controller.decide.manifests import ANNOTATION_NODE, LABEL_JOB
from elastra.controller.decide.memo import LastOf
from elastra.controller.decide.observe import format_time, parse_time
from elastra.controller.decide.placeholders import index_of

HOLD_RECHECK = timedelta(seconds=2)
"""How soon a job that held back a request because another job's worker waited looks again."""


@dataclass(frozen=True)
class Placeholder:
    """One of the job's capacity-request pods, as the decision reads it."""

    name: str
    index: int
    node: str | None
    """The node it is bound to (``None``: pending)."""
    created: datetime
    deleting: bool = False


def read_placeholders(
    job: str, pods: Sequence[Mapping[str, object]], *, now: datetime
) -> tuple[Placeholder, ...]:
    """The job's capacity-request pods (a reserved one, not created yet, is as old as ``now``)."""
    found: list[Placeholder] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        assert isinstance(meta, Mapping) and isinstance(spec, Mapping)
        name = str(meta.get("name") or "")
        index = index_of(job, name)
        if index is None:
            continue
        found.append(
            Placeholder(
                name=name,
                index=index,
                node=str(spec["nodeName"]) if spec.get("nodeName") else None,
                created=parse_time(meta.get("creationTimestamp"), now),
                deleting=bool(meta.get("deletionTimestamp")),
            )
        )
    return tuple(sorted(found, key=lambda p: p.index))


@dataclass(frozen=True)
class Want:
    """What the job's pass found, as the request reads it."""

    desired: int
    """Workers the job should have now (``replicas``, less what it gives to starved jobs)."""
    have: int
    """Workers it keeps plus those this pass creates."""
    short: bool | None
    """The planner could not place the desired workers for lack of capacity (``None``: not
    asked this pass: keep the requests as they are)."""
    prefers_fewer: bool = False
    """The planner chose fewer than ``desired`` workers on the capacity it sees, by its own
    preference, not for lack of capacity."""
    held: bool = False
    """Suspended, held by Kueue, past its deadline, finished or failed: asks for nothing."""
    waiting: Mapping[str, int] = field(default_factory=dict)
    """Workers per node that wait for room there (created this pass, or not bound yet): the
    job's requests on those nodes make way for them."""
    contested: Mapping[str, int] = field(default_factory=dict)
    """Other jobs' workers per node that wait for room there: the job's requests on those
    nodes give way to them."""
    hold_new: bool = False
    """Another job's worker waits for a node this job could use: no new request this pass."""
    generation: int = 0
    newest_node: datetime | None = None
    """When the newest node of the cluster was created (a closed request may ask again)."""


@dataclass(frozen=True)
class Requests:
    """What the pass does about the job's capacity requests."""

    create: tuple[int, ...] = ()
    """Indices of the requests to create (``placeholders.request_name``)."""
    delete: tuple[str, ...] = ()
    record: CapacityRequestStatus | None = None
    """``status.capacityRequest`` after this pass."""
    event: str | None = None
    """The message of a Warning Event (reason ``Reason.CAPACITY_UNSATISFIED``): withdrawn now."""
    recheck: timedelta | None = None
    """When the open request times out, if nothing happens before."""

    @property
    def open(self) -> bool:
        """Whether the job asks for nodes now."""
        return self.record is not None and self.record.state is CapacityRequestState.REQUESTED

    @property
    def unsatisfied(self) -> bool:
        """Whether the last request ended unanswered."""
        return self.record is not None and self.record.state is CapacityRequestState.UNSATISFIED

    def condition(self) -> tuple[str, str] | None:
        """The reason and message the job's conditions give for its request, if any."""
        if self.open and self.record is not None:
            return Reason.CAPACITY_REQUESTED, self.record.message
        if self.unsatisfied and self.record is not None:
            return Reason.CAPACITY_UNSATISFIED, self.record.message
        return None


def decide(
    want: Want,
    existing: Sequence[Placeholder],
    *,
    recorded: CapacityRequestStatus | None,
    timeout: timedelta,
    now: datetime,
) -> Requests:
    """The requests the job wants now, what to create and delete to get there, and its record."""
    live = [p for p in existing if not p.deleting]
    if want.short is None:
        return _keep(want, live, recorded=recorded)
    opened = recorded is not None and recorded.state is CapacityRequestState.REQUESTED
    closed = None if opened else recorded
    missing = max(0, want.desired - want.have)
    if want.held or not missing:
        return _withdraw(live, closed if want.held else None)
    if closed is not None and not _reopens(closed, want):
        return _withdraw(live, closed)
    if want.prefers_fewer or not want.short:
        declined = want.prefers_fewer and recorded is not None and not closed
        return _withdraw(live, _declined(want, now) if declined else None)
    return _request(want, existing, recorded=recorded, missing=missing, timeout=timeout, now=now)


def _keep(
    want: Want, live: Sequence[Placeholder], *, recorded: CapacityRequestStatus | None
) -> Requests:
    """Not judged this pass: only the requests in the way of waiting workers go."""
    consumed = _consumed(live, want)
    return Requests(delete=tuple(p.name for p in consumed), record=recorded)


def _withdraw(live: Sequence[Placeholder], record: CapacityRequestStatus | None) -> Requests:
    return Requests(delete=tuple(p.name for p in live), record=record)


def _reopens(closed: CapacityRequestStatus, want: Want) -> bool:
    """Whether something changed since the request closed that may change its answer."""
    if want.generation != closed.observed_generation or want.have < closed.workers:
        return True
    if closed.state is not CapacityRequestState.UNSATISFIED or want.newest_node is None:
        return False
    return want.newest_node > parse_time(closed.since, want.newest_node)


def _declined(want: Want, now: datetime) -> CapacityRequestStatus:
    return CapacityRequestStatus(
        state=CapacityRequestState.DECLINED,
        workers=want.have,
        since=format_time(now),
        observed_generation=want.generation,
        message=(
            f"the planner prefers {want.have} of the {want.desired} desired workers on the "
            "nodes that came; asks again when the spec changes or the job loses workers"
        ),
    )


def _request(
    want: Want,
    existing: Sequence[Placeholder],
    *,
    recorded: CapacityRequestStatus | None,
    missing: int,
    timeout: timedelta,
    now: datetime,
) -> Requests:
    """An open request for ``missing`` workers: consumed and surplus requests go, missing ones
    come; unless one has waited ``timeout``, which withdraws them all."""
    live = [p for p in existing if not p.deleting]
    consumed = _consumed(live, want)
    kept = [p for p in live if p not in consumed]
    expired = [p for p in kept if now - p.created >= timeout]
    if expired:
        return _give_up(want, kept, consumed=consumed, timeout=timeout, now=now)
    surplus = _surplus(kept, len(kept) - missing)
    kept = [p for p in kept if p not in surplus]
    taken = {p.index for p in existing}  # a name being deleted is not free yet
    free = (i for i in range(len(taken) + missing + 1) if i not in taken)
    create = () if want.hold_new else tuple(next(free) for _ in range(missing - len(kept)))
    opened = recorded is not None and recorded.state is CapacityRequestState.REQUESTED
    record = CapacityRequestStatus(
        state=CapacityRequestState.REQUESTED,
        workers=missing,
        since=recorded.since if opened and recorded is not None else format_time(now),
        observed_generation=want.generation,
        message=(
            f"asked the cluster's autoscaler for nodes for {missing} more "
            f"worker{'s' if missing != 1 else ''} (capacity-request pods)"
        ),
    )
    oldest = min((p.created for p in kept), default=now)
    recheck = max(oldest + timeout - now, timedelta(0))
    if want.hold_new and len(kept) < missing:
        recheck = min(recheck, HOLD_RECHECK)
    return Requests(
        create=create,
        delete=tuple(p.name for p in (*consumed, *surplus)),
        record=record,
        recheck=recheck,
    )


def _give_up(
    want: Want,
    kept: Sequence[Placeholder],
    *,
    consumed: Sequence[Placeholder],
    timeout: timedelta,
    now: datetime,
) -> Requests:
    """Withdraw an open request that waited ``timeout``: say why, once."""
    pending = sum(1 for p in kept if p.node is None)
    seconds = f"{timeout.total_seconds():.0f}s"
    if pending:
        why = (
            f"no autoscaler gave nodes for {pending} of {len(kept)} capacity-request pods "
            f"within {seconds}"
        )
    else:
        why = f"the job could not use the nodes that came for its capacity requests in {seconds}"
    message = f"{why}; withdrawn until a node is added, the spec changes or the job loses workers"
    record = CapacityRequestStatus(
        state=CapacityRequestState.UNSATISFIED,
        workers=want.have,
        since=format_time(now),
        observed_generation=want.generation,
        message=message,
    )
    names = tuple(p.name for p in (*consumed, *kept))
    return Requests(delete=names, record=record, event=message)


def _consumed(live: Sequence[Placeholder], want: Want) -> list[Placeholder]:
    """Requests bound to nodes where workers (the job's, or another job's) wait for room: one
    per waiting worker."""
    left = dict(want.waiting)
    for node, count in want.contested.items():
        left[node] = left.get(node, 0) + count
    out: list[Placeholder] = []
    for p in live:
        if p.node is not None and left.get(p.node, 0) > 0:
            left[p.node] -= 1
            out.append(p)
    return out


def _surplus(kept: Sequence[Placeholder], count: int) -> list[Placeholder]:
    """The ``count`` requests to give up first: pending before bound, newest first."""
    if count <= 0:
        return []
    order = sorted(kept, key=lambda p: (p.node is not None, -p.index))
    return order[:count]


Waiting = Mapping[str, frozenset[tuple[str, str, str]]]
"""Per planned node, the (namespace, job, pod) of Elastra workers not bound there yet."""


def contested(
    pods: Sequence[Mapping[str, Any]],
    reserved: Sequence[Mapping[str, Any]],
    *,
    namespace: str,
    job: str,
) -> Counter[str]:
    """Other jobs' workers per node that wait to be bound there (gated, or pending), from the
    cluster's pods (read once per listing) and the pods being created."""
    listed, creating = _WAITING.get(pods, _waiting), _waiting(reserved)
    out: Counter[str] = Counter()
    for node in {*listed, *creating}:
        owners = listed.get(node, frozenset()) | creating.get(node, frozenset())
        others = sum(1 for ns, owner, _ in owners if (ns, owner) != (namespace, job))
        if others:
            out[node] = others
    return out


def _waiting(pods: Sequence[Mapping[str, Any]]) -> Waiting:
    by_node: dict[str, set[tuple[str, str, str]]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        job = (meta.get("labels") or {}).get(LABEL_JOB)
        node = (meta.get("annotations") or {}).get(ANNOTATION_NODE)
        if job and node and _unbound(pod):
            owner = (str(meta.get("namespace") or ""), str(job), str(meta.get("name") or ""))
            by_node.setdefault(str(node), set()).add(owner)
    return {node: frozenset(owners) for node, owners in by_node.items()}


def _unbound(pod: Mapping[str, Any]) -> bool:
    """Created and waiting to be bound: no node yet, not going away, not ended."""
    meta = pod.get("metadata") or {}
    bound = (pod.get("spec") or {}).get("nodeName")
    phase = (pod.get("status") or {}).get("phase")
    return not bound and not meta.get("deletionTimestamp") and phase in (None, "Pending")


_WAITING: LastOf[Sequence[Mapping[str, Any]], Waiting] = LastOf()
