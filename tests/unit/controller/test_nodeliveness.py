"""Which workers the liveness task asks for a heartbeat, each job's sentinel, and what of a
Lease it keeps.

The rounds themselves (Leases watched, workers asked over HTTP, the verdict applied and the
Node's Event) run against the real API server in tests/integration/test_node_liveness.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from elastra.controller.engine.nodeliveness import Worker, sentinels, slim_lease, workers_by_node


def pod(name: str, node: str, *, ip: str = "10.0.0.1", **changes: Any) -> dict[str, Any]:
    labels = changes.pop("labels", {"elastra.dev/job": "gpt"})
    meta: dict[str, Any] = {"name": name, "namespace": "ml", "labels": labels}
    if changes.pop("deleting", False):
        meta["deletionTimestamp"] = "2026-12-04T05:00:00Z"
    return {
        "metadata": meta,
        "spec": {"nodeName": node},
        "status": {"phase": changes.pop("phase", "Running"), "podIP": ip},
    }


NODES = [
    {"metadata": {"name": "n1", "labels": {}}},
    {"metadata": {"name": "kwok-1", "labels": {"type": "kwok"}}},
]


@pytest.mark.parametrize(
    ("pods", "asked"),
    [
        ([pod("a", "n1"), pod("b", "n1", ip="10.0.0.2")], {"n1": ["10.0.0.1", "10.0.0.2"]}),
        ([pod("a", "kwok-1")], {}),  # a simulated node: its addresses belong to nobody
        ([pod("a", "n1", labels={})], {}),  # not a worker
        ([pod("a", "n1", phase="Pending")], {}),  # not started: nothing answers yet
        ([pod("a", "n1", deleting=True)], {}),  # going away
        ([pod("a", "n1", ip="")], {}),  # no address
    ],
)
def test_the_running_workers_of_real_nodes_are_asked(
    pods: list[dict[str, Any]], asked: dict[str, list[str]]
) -> None:
    found = workers_by_node(pods, NODES, ("type=kwok",))
    assert {node: [w.ip for w in on_node] for node, on_node in found.items()} == asked
    assert all(w.job == "ml/gpt" for on_node in found.values() for w in on_node)


def test_each_job_has_a_sentinel_the_same_every_round_and_one_on_another_node() -> None:
    found = {
        "n1": [
            Worker("ml/gpt", "gpt-w1", "10.0.0.2", "n1"),
            Worker("ml/bert", "bert-w0", "10.0.0.3", "n1"),
            Worker("ml/gpt", "gpt-w0", "10.0.0.4", "n1"),
        ],
        "n2": [Worker("ml/gpt", "gpt-w3", "10.0.0.5", "n2"), Worker("ml/gpt", "gpt-w2", "", "n2")],
    }
    chosen = sentinels(found)
    assert {job: [w.pod for w in ws] for job, ws in chosen.items()} == {
        "ml/gpt": ["gpt-w0", "gpt-w2"],  # the second is the first pod by name on another node
        "ml/bert": ["bert-w0"],  # all on one node: no second
    }
    assert sentinels(dict(reversed(list(found.items())))) == chosen


def test_a_lease_keeps_its_name_renewal_and_duration_only() -> None:
    lease = {
        "metadata": {"name": "n1", "namespace": "kube-node-lease", "managedFields": [{}]},
        "spec": {
            "holderIdentity": "n1",
            "leaseDurationSeconds": 40,
            "renewTime": "2026-12-04T05:00:00.123456Z",
        },
    }
    assert slim_lease(lease) == {
        "metadata": {"name": "n1", "namespace": "kube-node-lease"},
        "spec": {"leaseDurationSeconds": 40, "renewTime": "2026-12-04T05:00:00.123456Z"},
    }
