"""Sharing a scarce GPU type between elastic jobs: minimums first, by priority, then the rest.

Elastic jobs grab what is free, so without a rule the first job to arrive keeps every GPU of
a type and a later job waits forever below its ``minReplicas``. The rule here: a job running
above its minimum gives back pods while another job that could use the same GPUs is starved
below its own minimum, and

- never to a job of lower priority: a donor gives only to a starved job whose priority (the
  value of its pods' PriorityClass, ``Priorities``) is at least its own. Equal priorities
  share (the first to arrive does not keep everything); a higher-priority job never shrinks
  for a lower one;
- donors of the lowest priority give first, then those with the largest surplus, then by
  name; starved jobs of the highest priority are served first (then by name);
- only within the starved job's namespace, unless the scope is ``Scope.CLUSTER``; and not at
  all with ``Scope.OFF``.

Every job's operator pass computes the same answer from the same snapshot (``gifts`` walks
the same claims in the same order), so two jobs never take turns preempting each other: once
the starved job reaches its minimum it is no longer starved, and nothing moves again (no
livelock).

Pure: plain values in, a number out; the controller feeds it the TrainingJobs it listed and
the simulator its running jobs. Sizes are counted in pods (GPUs in the simulator), which is
exact when the jobs sharing a type use the same number of GPUs per pod and an approximation
otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

Compatible = Callable[[str, str], bool]


class Scope(StrEnum):
    """Which jobs may give GPUs to a starved job (``elastra run --sharing``)."""

    OFF = "off"
    """None: a starved job waits for free capacity."""
    NAMESPACE = "namespace"
    """Jobs of the starved job's namespace (the default: one team's jobs share)."""
    CLUSTER = "cluster"
    """Jobs of every namespace."""


@dataclass(frozen=True)
class Priorities:
    """PriorityClass values by name, and the value of a job that names no class.

    As Kubernetes resolves a pod's priority: the named class's value; no name, the value of
    the class marked ``globalDefault`` (the smallest when several are); none marked, 0.
    """

    values: Mapping[str, int] = field(default_factory=dict)
    default: int = 0

    @classmethod
    def of_classes(cls, classes: Iterable[tuple[str, int, bool]]) -> Priorities:
        """From (name, value, globalDefault) of every PriorityClass."""
        listed = list(classes)
        defaults = [value for _, value, is_default in listed if is_default]
        return cls(
            values={name: value for name, value, _ in listed},
            default=min(defaults, default=0),
        )

    def of(self, class_name: str | None) -> int | None:
        """The priority of pods naming ``class_name``; ``None`` when no such class exists
        (the API server refuses such pods, so the job holds no GPUs and takes none)."""
        if not class_name:
            return self.default
        return self.values.get(class_name)


NO_CLASSES = Priorities()
"""A cluster without PriorityClasses: every job's priority is 0."""


@dataclass(frozen=True)
class Claim:
    """One job as the sharing rule sees it."""

    key: str
    """namespace/name: unique and a stable tie-break."""
    minimum: int
    held: int
    """Pods the job occupies now: its world, standby, pending and retiring pods."""
    starved: bool
    """Below its minimum for lack of capacity."""
    gpu_types: frozenset[str]
    """GPU types its pods run on (donors) or may run on (starved jobs); empty: any."""
    priority: int = 0
    """Its pods' priority (see ``Priorities``)."""

    @property
    def namespace(self) -> str:
        """The namespace part of ``key`` (``""`` for a key without one)."""
        return self.key.rpartition("/")[0]

    @property
    def surplus(self) -> int:
        """Pods above its minimum."""
        return max(0, self.held - self.minimum)

    @property
    def deficit(self) -> int:
        """Pods below its minimum."""
        return max(0, self.minimum - self.held)


def overlaps(a: Claim, b: Claim, *, compatible: Compatible) -> bool:
    """Could the two jobs use the same GPUs? ``compatible(pattern, type)`` decides."""
    if not a.gpu_types or not b.gpu_types:
        return True
    return any(compatible(p, t) or compatible(t, p) for p in a.gpu_types for t in b.gpu_types)


def may_give(donor: Claim, starved: Claim, *, scope: Scope, compatible: Compatible) -> bool:
    """May ``donor`` give GPUs to ``starved``? Same GPUs, in scope, not of higher priority."""
    if scope is Scope.OFF or donor.key == starved.key:
        return False
    if scope is Scope.NAMESPACE and donor.namespace != starved.namespace:
        return False
    return donor.priority <= starved.priority and overlaps(donor, starved, compatible=compatible)


def gifts(
    claims: Sequence[Claim], *, free: int, scope: Scope, compatible: Compatible
) -> dict[str, int]:
    """Pods each donor gives (by key; absent: none), for every starved job at once.

    Starved jobs are served highest priority first (then by key): first from ``free`` pods,
    then from the donors they may take from (``may_give``), lowest priority first, then
    largest surplus, then by key; no donor gives more than its surplus.
    """
    if scope is Scope.OFF:
        return {}
    starved = sorted(
        (c for c in claims if c.starved and c.deficit), key=lambda c: (-c.priority, c.key)
    )
    donors = sorted(
        (c for c in claims if not c.starved and c.surplus),
        key=lambda c: (c.priority, -c.surplus, c.key),
    )
    left = {d.key: d.surplus for d in donors}
    given: dict[str, int] = {}
    free_left = free
    for taker in starved:
        from_free = min(taker.deficit, free_left)
        free_left -= from_free
        need = taker.deficit - from_free
        for donor in donors:
            if need == 0:
                break
            if left[donor.key] and may_give(donor, taker, scope=scope, compatible=compatible):
                share = min(need, left[donor.key])
                left[donor.key] -= share
                given[donor.key] = given.get(donor.key, 0) + share
                need -= share
    return given


def shared_desired(
    me: Claim,
    others: Sequence[Claim],
    *,
    desired: int,
    free: int,
    compatible: Compatible,
    scope: Scope = Scope.NAMESPACE,
) -> int:
    """The size ``me`` should aim for while starved jobs it may give to wait.

    Free pods go to the starved first (``me`` does not grow into them while a job it may
    give to waits); what they still lack is given back by donors (``gifts``). ``held``
    counts every pod a job occupies, including pods it is already retiring, so a pass made
    while a donated pod is still shutting down does not give it twice.
    """
    if me.starved or not any(
        c.starved and c.deficit and may_give(me, c, scope=scope, compatible=compatible)
        for c in others
    ):
        return desired
    starved = [c for c in others if c.starved and overlaps(me, c, compatible=compatible)]
    donors = [
        c
        for c in [me, *others]
        if not c.starved and any(overlaps(c, s, compatible=compatible) for s in starved)
    ]
    give = gifts([*starved, *donors], free=free, scope=scope, compatible=compatible)
    return max(me.minimum, min(desired, me.held - give.get(me.key, 0)))
