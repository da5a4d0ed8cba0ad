"""The harness's wait for CRDs: Established read from ``kubectl get -o json``, polled.

A CRD just applied can have no conditions yet (``kubectl wait`` fails on that at once on a
loaded machine), one CRD comes back as an object and several as a List, and a CRD that never
turns Established fails the wait naming it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from e2e.cluster.api import WaitTimeoutError
from e2e.cluster.components import crd_established, wait_crds_established


def crd(name: str, *conditions: tuple[str, str], status: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": "CustomResourceDefinition", "metadata": {"name": name}}
    if status:
        body["status"] = {"conditions": [{"type": t, "status": s} for t, s in conditions]}
    return body


ESTABLISHED = ("Established", "True")


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (crd("a", status=False), False),
        ({**crd("a"), "status": {"conditions": None}}, False),
        (crd("a", ("NamesAccepted", "True")), False),
        (crd("a", ("NamesAccepted", "True"), ("Established", "False")), False),
        (crd("a", ("NamesAccepted", "True"), ESTABLISHED), True),
    ],
)
def test_established_needs_the_established_condition_true(
    body: dict[str, Any], expected: bool
) -> None:
    assert crd_established(body) is expected


def kubectl_answering(
    *bodies: dict[str, Any],
) -> tuple[Callable[..., str], list[tuple[str, ...]]]:
    """A kubectl that answers each ``get`` with the next body (the last one from then on)."""
    calls: list[tuple[str, ...]] = []

    def run(*args: str) -> str:
        calls.append(args)
        return json.dumps(bodies[min(len(calls), len(bodies)) - 1])

    return run, calls


def listed(*items: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "List", "items": list(items)}


@pytest.mark.parametrize(
    ("selector", "bodies"),
    [
        (("crd/a",), [crd("a", status=False), crd("a", ESTABLISHED)]),
        (
            ("crd/a", "crd/b"),
            [listed(crd("a", status=False), crd("b")), listed(crd("a", ESTABLISHED), crd("b")),
             listed(crd("a", ESTABLISHED), crd("b", ESTABLISHED))],
        ),
        (("-f", "crds/"), [listed(crd("a", ESTABLISHED), crd("b", ESTABLISHED))]),
    ],
)  # fmt: skip
def test_the_wait_polls_until_every_listed_crd_is_established(
    selector: tuple[str, ...], bodies: list[dict[str, Any]]
) -> None:
    run, calls = kubectl_answering(*bodies)
    wait_crds_established(run, *selector, timeout=30)
    assert len(calls) == len(bodies)
    assert all(call == ("get", *selector, "-o", "json") for call in calls)


def test_a_crd_never_established_fails_the_wait_naming_it() -> None:
    run, _ = kubectl_answering(listed(crd("a", ESTABLISHED), crd("b", status=False)))
    with pytest.raises(WaitTimeoutError, match=r"not yet: b$"):
        wait_crds_established(run, "crd/a", "crd/b", timeout=0.6)
