"""A reconcile pass over a spec the operator cannot read: say so once, touch nothing else.

The API server refuses such a spec while the installed CRD carries the operator's rules, but a
CRD older than the operator (an upgrade done halfway) lets one through. The test plays that gap
on the real API server by taking one validation rule out of the installed CRD for its duration
and putting it back afterwards.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from tests.integration.conftest import LocalCluster
from tests.integration.operator.conftest import Jobs, OperatorProcess, gpu_job

CRD = "trainingjobs.elastra.dev"
SPEC_RULES = "/spec/versions/0/schema/openAPIV3Schema/properties/spec/x-kubernetes-validations"
MIN_REPLICAS_RULE = "self.minReplicas <= self.replicas"


@contextlib.contextmanager
def crd_without_rule(cluster: LocalCluster, rule: str) -> Iterator[None]:
    """The installed CRD without one of the spec's CEL rules, restored on the way out."""
    rules = cluster.get("crd", CRD)["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
        "properties"
    ]["spec"]["x-kubernetes-validations"]
    index = next(i for i, r in enumerate(rules) if r["rule"] == rule)
    path = f"{SPEC_RULES}/{index}"
    _patch_crd(cluster, [{"op": "test", "path": path, "value": rules[index]},
                         {"op": "remove", "path": path}])  # fmt: skip
    try:
        yield
    finally:
        _patch_crd(cluster, [{"op": "add", "path": path, "value": rules[index]}])


def _patch_crd(cluster: LocalCluster, ops: list[dict[str, Any]]) -> None:
    cluster.kubectl("patch", "crd", CRD, "--type=json", "-p", json.dumps(ops))


def _admitted(status: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in status.get("conditions", []) if c["type"] == "Admitted"), {})


def _pods(jobs: Jobs, name: str) -> dict[str, str]:
    """The job's live pods by name, with their uid (a replaced pod gets a new one)."""
    return {
        p["metadata"]["name"]: p["metadata"]["uid"]
        for p in jobs.pods(name)
        if not p["metadata"].get("deletionTimestamp")
    }


def test_a_spec_the_operator_cannot_read_is_reported_once_and_its_workers_keep_running(
    cluster: LocalCluster, jobs: Jobs, operator: OperatorProcess
) -> None:
    jobs.apply(gpu_job("unreadable", replicas=2))
    jobs.wait_phase("unreadable", "Running")
    running = _pods(jobs, "unreadable")
    assert len(running) == 2
    world = jobs.status("unreadable")["world"]

    def set_min_replicas(value: int) -> bool:
        patch = json.dumps({"spec": {"minReplicas": value}})
        return (
            cluster.kubectl(
                "patch", "tj", "unreadable", "-n", jobs.namespace, "--type=merge", "-p", patch,
                check=False,
            ).returncode
            == 0
        )  # fmt: skip

    with crd_without_rule(cluster, MIN_REPLICAS_RULE):
        # The API server serves a changed CRD's schema a moment after the write.
        jobs.wait("the relaxed CRD accepts minReplicas 3 > replicas 2", lambda: set_min_replicas(3))
        status = jobs.wait(
            "Admitted=False InvalidSpec",
            lambda: _admitted(s := jobs.status("unreadable")).get("reason") == "InvalidSpec" and s,
        )
        said = operator.quiet_passes("unreadable")
        jobs.wait(
            "two more passes over the unreadable spec",
            lambda: operator.quiet_passes("unreadable") >= said + 2,
            timeout=60,
        )
        admitted = _admitted(jobs.status("unreadable"))
        assert admitted["status"] == "False"
        assert "minReplicas" in admitted["message"] and "replicas" in admitted["message"]
        warnings = [e for e in jobs.events("unreadable") if e["reason"] == "InvalidSpec"]
        assert len(warnings) == 1 and warnings[0]["type"] == "Warning", warnings
        assert warnings[0]["message"] == admitted["message"]
        assert _pods(jobs, "unreadable") == running, "bad input deletes no worker"
        assert status["world"] == world
        assert status["phase"] == "Running", "its workers still train: the job has not failed"
        jobs.wait("the corrected spec is accepted", lambda: set_min_replicas(1))
    jobs.wait(
        "Admitted=True again",
        lambda: _admitted(jobs.status("unreadable")).get("status") == "True",
    )
    jobs.wait_phase("unreadable", "Running")
    assert _pods(jobs, "unreadable") == running, "the same workers go on"
    assert jobs.status("unreadable")["world"]["version"] == world["version"]
