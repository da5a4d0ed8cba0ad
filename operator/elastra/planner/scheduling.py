"""Whether kube-scheduler would bind a pod to a node: its filter rules, as the planner asks them.

Why: Elastra pins each worker pod to the node the planner chose and lets the real scheduler
bind it. A node the scheduler refuses leaves the pod Pending, so the planner must see only
nodes the scheduler would accept, by the scheduler's own rules. These are the filters that
judge a node by the pod's spec alone, with their semantics as in Kubernetes 1.36 (read from
its source, written here, not copied):

- **NodeUnschedulable**: a cordoned node (``spec.unschedulable``) takes only pods that
  tolerate the taint ``node.kubernetes.io/unschedulable:NoSchedule``.
- **TaintToleration**: every taint with effect ``NoSchedule`` or ``NoExecute`` must be
  tolerated (``PreferNoSchedule`` never refuses). A toleration with an empty effect matches
  every effect; an empty key matches every key; operator ``Exists`` matches any value,
  ``Equal`` (or none) only its own value. ``Lt``/``Gt`` tolerations need an alpha feature
  gate and tolerate nothing without it, as in a default cluster.
- **NodeAffinity**: every ``nodeSelector`` label must be on the node with that value; the
  required node affinity's ``nodeSelectorTerms`` are ORed, and an empty list matches no node.
  An empty term matches nothing. In a term, ``matchExpressions`` and ``matchFields`` are
  ANDed. Expressions: ``In``/``NotIn`` (a missing label passes ``NotIn``), ``Exists``,
  ``DoesNotExist``, ``Gt``/``Lt`` (the label and the one value both read as 64-bit decimal
  integers, else no match). Fields: ``In``/``NotIn`` with exactly one value; a node has only
  ``metadata.name``. A term with a malformed requirement matches nothing.

Resources (NodeResourcesFit) are counted in ``resources``. Not modelled: pod (anti-)affinity,
topology spread, host ports and volume topology, which Elastra's pod template does not let a
job set or which the planner leaves to the scheduler.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from elastra.planner.resources import NOTHING, Resources, pod_requests

TAINT_UNSCHEDULABLE = "node.kubernetes.io/unschedulable"
NO_SCHEDULE = "NoSchedule"
NO_EXECUTE = "NoExecute"
REFUSING_EFFECTS = frozenset({NO_SCHEDULE, NO_EXECUTE})
"""Taint effects the scheduler filters on; ``PreferNoSchedule`` only scores."""
FIELD_NAME = "metadata.name"
"""The one field ``matchFields`` can read of a node."""
LABEL_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})
FIELD_OPERATORS = frozenset({"In", "NotIn"})
_INT64 = re.compile(r"[+-]?[0-9]+")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class Taint:
    """A node taint."""

    key: str
    value: str = ""
    effect: str = ""

    def __str__(self) -> str:
        return (
            f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"
        )


CORDON = Taint(TAINT_UNSCHEDULABLE, effect=NO_SCHEDULE)
"""What a cordon counts as: a pod tolerating this taint may go to a cordoned node."""


@dataclass(frozen=True)
class PodToleration:
    """A pod toleration as the API spells it (empty strings for fields left out)."""

    key: str = ""
    operator: str = ""
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        """Whether this toleration matches ``taint`` (module docstring)."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator in ("", "Equal"):
            return self.value == taint.value
        return self.operator == "Exists"

    def to_wire(self) -> dict[str, str]:
        """The pod-spec form, fields left empty left out (as the API server reads them)."""
        wire = {"key": self.key, "operator": self.operator, "value": self.value}
        return {name: text for name, text in (*wire.items(), ("effect", self.effect)) if text}


@dataclass(frozen=True)
class Requirement:
    """One ``matchExpressions`` or ``matchFields`` entry."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def __str__(self) -> str:
        shown = f" [{', '.join(self.values)}]" if self.values else ""
        return f"{self.key} {self.operator}{shown}"

    def malformed(self, *, on_field: bool) -> str:
        """Why the scheduler cannot read this requirement ("" when it can)."""
        operators = FIELD_OPERATORS if on_field else LABEL_OPERATORS
        if self.operator not in operators:
            return f"operator {self.operator!r} is not one of {', '.join(sorted(operators))}"
        count = len(self.values)
        if on_field:
            return "" if count == 1 else "matchFields need exactly one value"
        if self.operator in ("In", "NotIn") and count == 0:
            return f"{self.operator} needs values"
        if self.operator in ("Exists", "DoesNotExist") and count:
            return f"{self.operator} takes no values"
        if self.operator in ("Gt", "Lt") and (count != 1 or _int64(self.values[0]) is None):
            return f"{self.operator} needs exactly one integer value"
        return ""

    def miss(self, values: Mapping[str, str]) -> str:
        """Why ``values`` (labels, or fields) fail this well-formed requirement ("" if not)."""
        have = values.get(self.key)
        shown = "no such label" if have is None else f"{self.key}={have}"
        if self.operator == "In":
            ok = have is not None and have in self.values
        elif self.operator == "NotIn":
            ok = have is None or have not in self.values
        elif self.operator == "Exists":
            ok = have is not None
        elif self.operator == "DoesNotExist":
            ok = have is None
        else:
            number = _int64(have) if have is not None else None
            limit = _int64(self.values[0])
            ok = (
                number is not None
                and limit is not None
                and (number > limit if self.operator == "Gt" else number < limit)
            )
            if have is not None and number is None:
                shown = f"{self.key}={have}, not an integer"
        return "" if ok else f"{self} (node: {shown})"


@dataclass(frozen=True)
class Term:
    """One ``nodeSelectorTerms`` entry: its expressions and fields, ANDed."""

    expressions: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()

    def miss(self, node: NodeFacts) -> str:
        """Why ``node`` does not match this term ("" when it does)."""
        if not self.expressions and not self.fields:
            return "an empty term matches no node"
        for requirement in self.expressions:
            problem = requirement.malformed(on_field=False)
            if problem:
                return f"matchExpressions {requirement}: {problem}"
        for requirement in self.fields:
            problem = requirement.malformed(on_field=True)
            if problem:
                return f"matchFields {requirement}: {problem}"
        for requirement in self.expressions:
            missed = requirement.miss(node.labels)
            if missed:
                return f"matchExpressions {missed}"
        node_fields = {FIELD_NAME: node.name}
        for requirement in self.fields:
            missed = requirement.miss(node_fields)
            if missed:
                return f"matchFields {missed}"
        return ""


@dataclass(frozen=True)
class PodConstraints:
    """What the scheduler reads of a pod to judge a node: tolerations, node selector, required
    node affinity (``None``: none set), and the resources the pod requests."""

    tolerations: tuple[PodToleration, ...] = ()
    node_selector: tuple[tuple[str, str], ...] = ()
    required_terms: tuple[Term, ...] | None = None
    requests: Resources = NOTHING

    @classmethod
    def of_pod_spec(cls, spec: Mapping[str, Any], *, where: str = "pod") -> PodConstraints:
        """From a pod spec as the API server stores it; ``where`` names it in errors."""
        affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        terms = None
        if affinity is not None:
            terms = tuple(_term(t) for t in affinity.get("nodeSelectorTerms") or [])
        return cls(
            tolerations=tuple(_toleration(t) for t in spec.get("tolerations") or []),
            node_selector=tuple(sorted((spec.get("nodeSelector") or {}).items())),
            required_terms=terms,
            requests=pod_requests(spec, where),
        )

    def placement(self) -> PodConstraints:
        """These constraints without the requests: all that ``refusal`` reads."""
        return PodConstraints(self.tolerations, self.node_selector, self.required_terms)


@dataclass(frozen=True)
class NodeFacts:
    """What the scheduler's filters read of a node."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    allocatable: Resources = NOTHING
    """In the scheduler's units (``resources.amount``), ``pods`` included."""


def taints_of(raw: Iterable[Mapping[str, Any]] | None) -> tuple[Taint, ...]:
    """A node's ``spec.taints``."""
    return tuple(
        Taint(str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
        for t in raw or ()
    )


def refusal(pod: PodConstraints, node: NodeFacts) -> str:
    """Why the NodeUnschedulable, TaintToleration or NodeAffinity filter refuses ``node`` for
    ``pod``, naming the taint, label or term; "" when all three let it pass."""
    if node.unschedulable and not _tolerated(pod.tolerations, CORDON):
        return f"cordoned (spec.unschedulable), and the pod does not tolerate {CORDON}"
    for taint in node.taints:
        if taint.effect in REFUSING_EFFECTS and not _tolerated(pod.tolerations, taint):
            return f"taint {taint} not tolerated"
    for key, value in pod.node_selector:
        have = node.labels.get(key)
        if have != value:
            shown = "no such label" if have is None else f"{key}={have}"
            return f"nodeSelector {key}={value} (node: {shown})"
    if pod.required_terms is not None:
        return _affinity_miss(pod.required_terms, node)
    return ""


def _affinity_miss(terms: Sequence[Term], node: NodeFacts) -> str:
    if not terms:
        return "required node affinity has no nodeSelectorTerms: it matches no node"
    misses = []
    for index, term in enumerate(terms):
        missed = term.miss(node)
        if not missed:
            return ""
        misses.append(f"term {index}: {missed}" if len(terms) > 1 else missed)
    return "required node affinity: " + "; ".join(misses)


def _tolerated(tolerations: Iterable[PodToleration], taint: Taint) -> bool:
    return any(t.tolerates(taint) for t in tolerations)


def _int64(text: str) -> int | None:
    """``text`` as Go's ``strconv.ParseInt(text, 10, 64)`` reads it, or ``None``."""
    if not _INT64.fullmatch(text):
        return None
    number = int(text)
    return number if _INT64_MIN <= number <= _INT64_MAX else None


def _toleration(raw: Mapping[str, Any]) -> PodToleration:
    return PodToleration(
        key=str(raw.get("key") or ""),
        operator=str(raw.get("operator") or ""),
        value=str(raw.get("value") or ""),
        effect=str(raw.get("effect") or ""),
    )


def _term(raw: Mapping[str, Any]) -> Term:
    return Term(
        expressions=tuple(_requirement(r) for r in raw.get("matchExpressions") or []),
        fields=tuple(_requirement(r) for r in raw.get("matchFields") or []),
    )


def _requirement(raw: Mapping[str, Any]) -> Requirement:
    return Requirement(
        key=str(raw.get("key") or ""),
        operator=str(raw.get("operator") or ""),
        values=tuple(str(v) for v in raw.get("values") or []),
    )
