"""What of a node wakes the jobs: exactly what the snapshot keeps of it (``slim_node``); and the
one line a failed worker's termination message gives the job's condition (``exit_message``)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from elastra.controller.decide.observe import (
    MAX_EXIT_MESSAGE,
    exit_message,
    node_fingerprint,
    slim_node,
)
from elastra.controller.decide.planning import cluster_inventory
from elastra.planner import inventory
from tests.unit.controller.fakecluster import node

Change = Callable[[dict[str, Any]], None]


def annotate(key: str, value: str) -> Change:
    def change(n: dict[str, Any]) -> None:
        n["metadata"].setdefault("annotations", {})[key] = value

    return change


def heartbeat(n: dict[str, Any]) -> None:
    for c in n["status"].setdefault("conditions", []):
        c["lastHeartbeatTime"] = "2030-01-01T00:00:00Z"


FIGURES = [getattr(inventory, k) for k in dir(inventory) if k.startswith("ANN_")]


@pytest.mark.parametrize("key", FIGURES)
def test_an_annotation_the_inventory_reads_changes_the_fingerprint(key: str) -> None:
    """Before: the fingerprint hashed labels, taints, allocatable and readiness, no annotation."""
    before = node("gpu-0")
    after = copy.deepcopy(before)
    annotate(key, "123")(after)
    assert node_fingerprint(after) != node_fingerprint(before)
    assert slim_node(after)["metadata"]["annotations"] == {key: "123"}


@pytest.mark.parametrize(
    "change",
    [
        annotate("node.alpha.kubernetes.io/ttl", "0"),
        annotate("flannel.alpha/lease", "x"),
        heartbeat,
    ],
)
def test_what_the_planner_does_not_read_changes_nothing(change: Change) -> None:
    before = node("gpu-0")
    after = copy.deepcopy(before)
    change(after)
    assert node_fingerprint(after) == node_fingerprint(before)


def test_the_slim_node_plans_like_the_full_one() -> None:
    full = node("gpu-0")
    annotate(inventory.ANN_TFLOPS, "500")(full)
    annotate("other.example/x", "y")(full)
    assert cluster_inventory([slim_node(full)], []) == cluster_inventory([full], [])


@pytest.mark.parametrize(
    ("terminated", "line"),
    [
        (None, ""),
        ({"exitCode": 2}, ""),
        ({"exitCode": 2, "message": "worker.gpus is 1 but ...\n"}, "worker.gpus is 1 but ..."),
        ({"message": "Traceback (most recent call last):\n  ...\nValueError: bad\n\n"},
         "ValueError: bad"),  # a log tail (FallbackToLogsOnError): its last line
        ({"message": "x" * 5000}, "x" * (MAX_EXIT_MESSAGE - 3) + "..."),
    ],
)  # fmt: skip
def test_the_termination_message_becomes_one_bounded_line(
    terminated: dict[str, Any] | None, line: str
) -> None:
    assert exit_message(terminated) == line
