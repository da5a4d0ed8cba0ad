"""Resources as kube-scheduler counts them: quantities, a pod's requests, one more pod's fit."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from elastra.errors import UserError
from elastra.planner.resources import (
    Resources,
    amount,
    held_by,
    parse_quantity,
    pod_requests,
    room,
    shortfall,
    show,
)

GI = 1024**3


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2", Fraction(2)),
        (8, Fraction(8)),
        ("500m", Fraction(1, 2)),
        ("1.5", Fraction(3, 2)),
        (".5", Fraction(1, 2)),
        ("64Gi", Fraction(64 * GI)),
        ("1Ki", Fraction(1024)),
        ("1k", Fraction(1000)),
        ("1M", Fraction(10**6)),
        ("1E", Fraction(10**18)),
        ("1e3", Fraction(1000)),
        ("1E-3", Fraction(1, 1000)),
        ("100n", Fraction(1, 10**7)),
        ("+1", Fraction(1)),
        ("-1", Fraction(-1)),
    ],
)
def test_quantities(text: object, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "1 Gi", "1GB", "Gi", "1e", "1.2.3", "0x10", "1_000"])
def test_not_quantities(text: str) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        parse_quantity(text)


@pytest.mark.parametrize(
    ("resource", "text", "units"),
    [
        ("cpu", "1", 1000),
        ("cpu", "100u", 1),  # rounded up, as MilliValue
        ("memory", "1.5", 2),  # rounded up, as Value
        ("memory", "1Gi", GI),
        ("nvidia.com/gpu", "8", 8),
    ],
)
def test_amounts_round_up(resource: str, text: str, units: int) -> None:
    assert amount(resource, parse_quantity(text)) == units


def container(name: str, *, restart: str | None = None, **requests: str) -> dict[str, Any]:
    found: dict[str, Any] = {"name": name, "resources": {"requests": dict(requests)}}
    if restart:
        found["restartPolicy"] = restart
    return found


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"containers": [container("a", cpu="1"), container("b", cpu="500m")]}, {"cpu": 1500}),
        # limits stand for requests a container does not set
        (
            {"containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
            {"nvidia.com/gpu": 2},
        ),
        # an init container that needs more than the app containers sets the pod's request
        (
            {"containers": [container("a", cpu="1")], "initContainers": [container("i", cpu="3")]},
            {"cpu": 3000},
        ),
        # native sidecars run beside everything after them: they add to both
        (
            {
                "containers": [container("a", cpu="1")],
                "initContainers": [
                    container("s", restart="Always", cpu="1"),
                    container("i", cpu="2"),
                ],
            },
            {"cpu": 3000},
        ),
        (
            {
                "containers": [container("a", cpu="4")],
                "initContainers": [
                    container("s", restart="Always", cpu="1"),
                    container("i", cpu="2"),
                ],
            },
            {"cpu": 5000},
        ),
        (
            {"containers": [container("a", memory="1Gi")], "overhead": {"memory": "1Gi"}},
            {"memory": 2 * GI},
        ),
        # exact sums, rounded once per pod
        (
            {"containers": [container("a", memory="0.5"), container("b", memory="0.5")]},
            {"memory": 1},
        ),
    ],
)
def test_pod_requests(spec: dict[str, Any], expected: dict[str, int]) -> None:
    assert pod_requests(spec, "pod p") == Resources.of(expected)


def test_bad_quantity_names_pod_container_and_resource() -> None:
    spec = {"containers": [container("w", memory="lots")]}
    with pytest.raises(UserError, match=r"pod p: container w requests: memory='lots'"):
        pod_requests(spec, "pod p")


@pytest.mark.parametrize(
    ("pod", "node", "requests"),
    [
        ({"spec": {"nodeName": "n", "containers": [container("a", cpu="1")]}}, "n", {"cpu": 1000}),
        ({"spec": {"containers": [container("a", cpu="1")]}}, "", None),  # not bound
        (
            {
                "spec": {"nodeName": "n", "containers": [container("a", cpu="1")]},
                "status": {"phase": "Succeeded"},
            },
            "",
            None,
        ),
    ],
)
def test_held_by_counts_bound_unfinished_pods_and_one_pod(
    pod: dict[str, Any], node: str, requests: dict[str, int] | None
) -> None:
    where, held = held_by(pod)
    assert where == node
    assert held == (Resources.of({**requests, "pods": 1}) if requests else Resources())


ALLOCATABLE = Resources.of({"cpu": 8000, "memory": 64 * GI, "nvidia.com/gpu": 8, "pods": 4})


@pytest.mark.parametrize(
    ("need", "used", "count", "reason"),
    [
        ({"cpu": 2000, "nvidia.com/gpu": 2}, {}, 4, ""),
        ({"cpu": 3000, "nvidia.com/gpu": 2}, {}, 2, ""),
        ({"cpu": 1000}, {"pods": 4}, 0, "Too many pods: 4 of 4 allowed"),
        (
            {"memory": 40 * GI},
            {"memory": 30 * GI},
            0,
            "Insufficient memory: the pod requests 40Gi, 34Gi of 64Gi left",
        ),
        ({"example.com/fpga": 1}, {}, 0, "Insufficient example.com/fpga: the pod requests 1"),
        ({}, {"pods": 3}, 1, ""),
        ({"nvidia.com/gpu": 8}, {"nvidia.com/gpu": 1}, 0, "Insufficient nvidia.com/gpu"),
    ],
)
def test_room_and_shortfall_agree(
    need: dict[str, int], used: dict[str, int], count: int, reason: str
) -> None:
    kwargs = {"allocatable": ALLOCATABLE, "used": Resources.of(used)}
    assert room(Resources.of(need), **kwargs) == count
    found = shortfall(Resources.of(need), **kwargs)
    assert found.startswith(reason) and bool(found) == bool(reason) == (count == 0)


@pytest.mark.parametrize(
    ("resource", "value", "shown"),
    [("cpu", 2000, "2"), ("cpu", 1500, "1500m"), ("memory", 3 * GI, "3Gi"), ("pods", 3, "3")],
)
def test_show(resource: str, value: int, shown: str) -> None:
    assert show(resource, value) == shown


def test_arithmetic() -> None:
    a, b = Resources.of({"cpu": 1, "pods": 1}), Resources.of({"cpu": 2})
    assert (a + b).get("cpu") == 3 and (a + b - a) == b and not (a - a)
