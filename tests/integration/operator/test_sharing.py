"""Sharing GPUs between jobs by PriorityClass, with the real operator on the real control plane.

Two PriorityClasses exist and one job of each holds or wants the same private H200 nodes. A
lower-priority job gives GPUs, down to its minimum, to a higher-priority job starved below
its own; a higher-priority job gives nothing to a starved lower one. The classes have
``preemptionPolicy: Never``, so kube-scheduler preempts nothing: every move is Elastra's
(``elastra.elastic.share``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.conftest import LocalCluster
from tests.integration.operator.conftest import Jobs, NodePool, OperatorProcess
from tests.integration.operator.test_elastic import world_is
from tests.integration.operator.test_operator import h200_job

LOW, HIGH = 10, 1000


@pytest.fixture
def classes(cluster: LocalCluster, namespace: str) -> Iterator[dict[int, str]]:
    """PriorityClasses of value ``LOW`` and ``HIGH`` (cluster-wide: named for this test)."""
    names = {value: f"{namespace}-{value}" for value in (LOW, HIGH)}
    for value, name in names.items():
        cluster.apply(
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": value,
                "preemptionPolicy": "Never",
            }
        )
    yield names
    cluster.kubectl("delete", "priorityclass", *names.values(), "--ignore-not-found")


def job_in_class(name: str, priority_class: str, *, replicas: int, minimum: int) -> Any:
    body = h200_job(name, replicas=replicas, minReplicas=minimum)
    body["spec"]["worker"]["template"] = {"spec": {"priorityClassName": priority_class}}
    return body


def starved(jobs: Jobs, name: str) -> bool:
    """Degraded for lack of capacity: what the sharing rule reads as starved."""
    conditions = {c["type"]: c for c in jobs.status(name).get("conditions") or []}
    degraded = conditions.get("Degraded") or {}
    return degraded.get("status") == "True" and degraded.get("reason") == "InsufficientCapacity"


def test_a_lower_priority_job_gives_gpus_to_a_starved_higher_one(
    jobs: Jobs, operator: OperatorProcess, pool: NodePool, classes: dict[int, str]
) -> None:
    pool.add(3)
    jobs.apply(job_in_class("low", classes[LOW], replicas=3, minimum=1))
    jobs.wait("low runs on all 3 nodes", lambda: world_is(jobs, "low", 3, "Running"))
    jobs.apply(job_in_class("high", classes[HIGH], replicas=2, minimum=2))
    jobs.wait(
        "low gave 2 nodes, down to its minimum, and high runs at its minimum",
        lambda: world_is(jobs, "high", 2, "Running") and world_is(jobs, "low", 1),
        timeout=120,
    )
    priorities = {p["spec"].get("priority") for p in jobs.pods("high")}
    assert priorities == {HIGH}, "the API server gave high's pods its class's value"
    low = jobs.status("low")
    assert [r["toReplicas"] for r in low["resizes"]][-1] == 1
    assert len({p["node"] for p in low["placement"]} | {
        p["node"] for p in jobs.status("high")["placement"]
    }) == 3, "each job on its own nodes"  # fmt: skip


def test_a_higher_priority_job_gives_nothing_to_a_starved_lower_one(
    jobs: Jobs, operator: OperatorProcess, pool: NodePool, classes: dict[int, str]
) -> None:
    pool.add(3)
    jobs.apply(job_in_class("high", classes[HIGH], replicas=3, minimum=1))
    running = jobs.wait("high runs on all 3 nodes", lambda: world_is(jobs, "high", 3, "Running"))
    jobs.apply(job_in_class("low", classes[LOW], replicas=2, minimum=2))
    jobs.wait("low is starved", lambda: starved(jobs, "low"))
    seen = operator.quiet_passes("high")
    jobs.wait(
        "two more passes over high that wrote nothing",
        lambda: operator.quiet_passes("high") >= seen + 2,
        timeout=60,
    )
    assert jobs.status("high")["world"] == running["world"], "high kept every GPU"
    assert starved(jobs, "low") and jobs.pods("low") == []
