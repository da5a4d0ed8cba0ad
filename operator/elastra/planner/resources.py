"""Resource amounts as kube-scheduler counts them: quantities, a pod's requests, a node's room.

Why: the planner must not place a pod where the scheduler's NodeResourcesFit filter would
refuse it, so it counts what the filter counts, the same way (Kubernetes 1.36):

- Amounts are integers: CPU in millicores, everything else in whole units (bytes for memory),
  each rounded up from the exact quantity, as the scheduler's ``MilliValue``/``Value`` do.
- A pod requests, per resource, the sum over its containers (a container's request, or its
  limit when it sets no request: the API server defaults one to the other), or the most any
  init container needs while it runs if that is more: a regular init container needs its
  own request plus the native sidecars (``restartPolicy: Always``) started before it, and
  those sidecars keep running beside the app containers, so they add to the sum. The pod's
  ``overhead`` is added. The exact sum is rounded once, per pod.
- A node holds ``allocatable`` minus what the pods bound to it request; one more pod fits
  when, for each resource it requests, the rest covers it, and fewer than ``allocatable.pods``
  pods are there (the pod count is the resource ``pods`` here: each pod holds one).

The maintained quantity parser lives in the Kubernetes Python client, which the planner may not
import (an import contract keeps pure decisions free of Kubernetes clients); the grammar is
small and fixed, so it is parsed here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from elastra.errors import UserError

CPU = "cpu"
MEMORY = "memory"
PODS = "pods"
"""The pod count as a resource: allocatable says how many pods a node takes, each pod holds one."""

_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<exponent>[eE][+-]?[0-9]+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?"
)
_SUFFIXES = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    **{f"{p}i": Fraction(1024**i) for i, p in enumerate("KMGTPE", start=1)},
}
_BINARY_SHOWN = (("Ti", 1024**4), ("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024))


def parse_quantity(text: Any) -> Fraction:
    """The exact value of a Kubernetes quantity (``500m``, ``64Gi``, ``1e3``); ``ValueError``
    when ``text`` is not one."""
    match = _QUANTITY.fullmatch(str(text))
    if match is None:
        raise ValueError(f"{text!r} is not a Kubernetes quantity (such as 500m, 2, 64Gi)")
    value = Fraction(match["number"])
    if match["exponent"]:
        value *= Fraction(10) ** int(match["exponent"][1:])
    else:
        value *= _SUFFIXES[match["suffix"] or ""]
    return -value if match["sign"] == "-" else value


def amount(resource: str, quantity: Fraction) -> int:
    """``quantity`` of ``resource`` in the scheduler's integer unit, rounded up."""
    return math.ceil(quantity * 1000) if resource == CPU else math.ceil(quantity)


@dataclass(frozen=True)
class Resources:
    """Integer amounts per resource name (``amount``'s units); missing names are zero."""

    amounts: tuple[tuple[str, int], ...] = ()

    @classmethod
    def of(cls, amounts: Mapping[str, int]) -> Resources:
        """From a mapping; zero amounts are left out, names sorted (equal values compare equal)."""
        return cls(tuple(sorted((name, value) for name, value in amounts.items() if value)))

    def get(self, name: str) -> int:
        """The amount of ``name`` (0 when absent)."""
        for key, value in self.amounts:
            if key == name:
                return value
        return 0

    def as_dict(self) -> dict[str, int]:
        """A mutable copy."""
        return dict(self.amounts)

    def __add__(self, other: Resources) -> Resources:
        if not other.amounts:
            return self
        if not self.amounts:
            return other
        total = self.as_dict()
        for name, value in other.amounts:
            total[name] = total.get(name, 0) + value
        return Resources.of(total)

    def __sub__(self, other: Resources) -> Resources:
        return self + Resources(tuple((name, -value) for name, value in other.amounts))

    def __bool__(self) -> bool:
        return bool(self.amounts)


NOTHING = Resources()
ONE_POD = Resources(((PODS, 1),))


def resource_list(values: Mapping[str, Any] | None, where: str) -> dict[str, Fraction]:
    """A ResourceList (``requests``, ``allocatable``) as exact quantities; ``UserError`` naming
    ``where`` and the resource for a value that is not a quantity."""
    parsed: dict[str, Fraction] = {}
    for name, raw in (values or {}).items():
        try:
            parsed[str(name)] = parse_quantity(raw)
        except ValueError:
            raise UserError(
                f"{where}: {name}={raw!r} is not a Kubernetes quantity (such as 500m, 2, 64Gi)"
            ) from None
    return parsed


def rounded(quantities: Mapping[str, Fraction]) -> Resources:
    """Exact quantities in the scheduler's integer units."""
    return Resources.of({name: amount(name, q) for name, q in quantities.items()})


def pod_requests(spec: Mapping[str, Any], where: str) -> Resources:
    """What a pod with this spec requests, as the scheduler counts it (module docstring)."""
    total: dict[str, Fraction] = {}
    for container in spec.get("containers") or []:
        _add(total, _container_requests(container, where))
    sidecars: dict[str, Fraction] = {}
    peak: dict[str, Fraction] = {}
    for container in spec.get("initContainers") or []:
        own = _container_requests(container, where)
        if container.get("restartPolicy") == "Always":
            _add(total, own)
            _add(sidecars, own)
            _raise_to(peak, sidecars)
        else:
            running = dict(sidecars)
            _add(running, own)
            _raise_to(peak, running)
    _raise_to(total, peak)
    _add(total, resource_list(spec.get("overhead"), f"{where}: overhead"))
    return rounded(total)


_FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


def held_by(pod: Mapping[str, Any]) -> tuple[str, Resources]:
    """(node name, what the pod holds there, ``pods`` included); ("", nothing) for a pod that
    is not bound or has finished (the scheduler counts neither)."""
    spec = pod.get("spec") or {}
    node = str(spec.get("nodeName") or "")
    if not node or (pod.get("status") or {}).get("phase") in _FINISHED_PHASES:
        return "", NOTHING
    name = str((pod.get("metadata") or {}).get("name") or "?")
    return node, pod_requests(spec, f"pod {name}") + ONE_POD


def _container_requests(container: Mapping[str, Any], where: str) -> dict[str, Fraction]:
    resources = container.get("resources") or {}
    name = container.get("name") or "?"
    limits = resource_list(resources.get("limits"), f"{where}: container {name} limits")
    requests = resource_list(resources.get("requests"), f"{where}: container {name} requests")
    return {**limits, **requests}


def _add(total: dict[str, Fraction], more: Mapping[str, Fraction]) -> None:
    for name, value in more.items():
        total[name] = total.get(name, Fraction(0)) + value


def _raise_to(total: dict[str, Fraction], floor: Mapping[str, Fraction]) -> None:
    for name, value in floor.items():
        if value > total.get(name, Fraction(0)):
            total[name] = value


def shortfall(need: Resources, *, allocatable: Resources, used: Resources) -> str:
    """Why one more pod needing ``need`` (with ``ONE_POD``) does not fit: the first resource it
    lacks, named as the scheduler names it ("Insufficient memory"); "" when it fits."""
    for name, wanted in (need + ONE_POD).amounts:
        if wanted <= 0:
            continue
        have, held = allocatable.get(name), used.get(name)
        if wanted > have - held:
            if name == PODS:
                return f"Too many pods: {held} of {have} allowed"
            return (
                f"Insufficient {name}: the pod requests {show(name, wanted)}, "
                f"{show(name, max(0, have - held))} of {show(name, have)} left"
            )
    return ""


def room(need: Resources, *, allocatable: Resources, used: Resources) -> int:
    """How many more pods needing ``need`` fit (each also takes one of ``pods``)."""
    counts = [
        max(0, allocatable.get(name) - used.get(name)) // wanted
        for name, wanted in (need + ONE_POD).amounts
        if wanted > 0
    ]
    return min(counts)


def show(resource: str, value: int) -> str:
    """An amount as people write it: ``500m`` CPU, ``64Gi`` of memory, ``8`` GPUs."""
    if resource == CPU:
        return f"{value // 1000}" if value % 1000 == 0 else f"{value}m"
    if resource == MEMORY or resource.startswith(("ephemeral-storage", "hugepages-")):
        for suffix, size in _BINARY_SHOWN:
            if value and value % size == 0:
                return f"{value // size}{suffix}"
    return str(value)


def total(parts: Iterable[Resources]) -> Resources:
    """The sum of ``parts``."""
    summed: dict[str, int] = {}
    for part in parts:
        for name, value in part.amounts:
            summed[name] = summed.get(name, 0) + value
    return Resources.of(summed)
