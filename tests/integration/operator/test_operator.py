"""The operator on the real control plane: placement, failures, suspend, delete, restarts.

Every assertion reads cluster state (TrainingJob status, pods, events) through kubectl; the
operator is the real ``elastra run`` process. Scenarios that need capacity to themselves
run on private fake H200 nodes the test adds and removes.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import yaml

from elastra.api import parse_trainingjob
from elastra.controller.decide.planning import cluster_inventory, requirements
from elastra.planner import plan_job
from elastra_worker.launcher import free_ports
from tests.integration.conftest import LocalCluster
from tests.integration.operator.conftest import (
    EXAMPLES,
    Jobs,
    NodePool,
    OperatorProcess,
    gpu_job,
    http_get,
)


def h200_job(name: str, replicas: int, **spec: Any) -> dict[str, Any]:
    body = gpu_job(name, replicas=replicas, **spec)
    body["spec"]["worker"]["gpuTypes"] = ["H200"]
    return body


def world(status: dict[str, Any]) -> dict[str, Any]:
    return dict(status.get("world") or {})


def fail_pod(cluster: LocalCluster, namespace: str, *pods: str, code: int) -> None:
    """Make kwok end these pods Failed with ``code`` (one label call: they fail together)."""
    cluster.kubectl(
        "annotate", "pod", *pods, "-n", namespace, f"sim.elastra.dev/exit-code={code}",
        "--overwrite",
    )  # fmt: skip
    cluster.kubectl("label", "pod", *pods, "-n", namespace, "sim.elastra.dev/fail=true")


def test_places_the_7b_example_as_the_planner_predicts(
    cluster: LocalCluster, jobs: Jobs, operator: OperatorProcess
) -> None:
    manifest = yaml.safe_load((EXAMPLES / "gpt-7b-hetero.yaml").read_text())
    # No PVC behind kwok pods (the scheduler would hold them Pending): a uri nothing reads.
    del manifest["spec"]["checkpoint"]["volume"]
    manifest["spec"]["checkpoint"]["uri"] = "s3://elastra-test/gpt-7b-hetero"
    nodes = cluster.get("nodes")["items"]
    pods = cluster.get("pods", "--all-namespaces")["items"]
    expected = plan_job(
        requirements(parse_trainingjob(manifest), replicas=8, minimum=1),
        cluster_inventory(nodes, pods),
        top_k=1,
    ).plans[0]
    jobs.apply(manifest)
    status = jobs.wait_phase("gpt-7b-hetero", "Running", timeout=120)
    assert world(status)["replicas"] == len(expected.pods)
    placed = Counter(p["node"] for p in status["placement"])
    assert placed == Counter(str(p.node) for p in expected.pods)
    plan = status["plan"]
    assert (plan["dp"], plan["tp"], plan["pp"]) == (expected.dp, expected.tp, expected.pp)
    assert plan["gpuTypes"] == {str(t.gpu_type): t.gpus for t in expected.types}
    running = jobs.pods("gpt-7b-hetero")
    assert all(p["spec"]["nodeName"] == p["metadata"]["annotations"]["elastra.dev/node"]
               for p in running)  # fmt: skip
    printed = cluster.kubectl("get", "tj", "-n", jobs.namespace).stdout
    assert "gpt-7b-hetero" in printed and f"{plan['shape']}" in printed


def test_node_deleted_under_a_running_job(
    cluster: LocalCluster, jobs: Jobs, operator: OperatorProcess, private_nodes: list[str]
) -> None:
    jobs.apply(h200_job("lose", replicas=2))
    status = jobs.wait_phase("lose", "Running")
    before = world(status)["version"]
    victim = status["placement"][1]["node"]
    cluster.kubectl("delete", "node", victim)
    lost = jobs.wait(
        "the world re-formed without the lost node",
        lambda: any(r["reason"] == "WorkerLost" for r in jobs.status("lose").get("resizes", [])),
    )
    assert lost
    record = next(r for r in jobs.status("lose")["resizes"] if r["reason"] == "WorkerLost")
    assert record["fromVersion"] == before and record["toVersion"] == before + 1
    assert record["toReplicas"] == 1
    healed = jobs.wait(
        "grown back to 2 on the spare node",
        lambda: (
            (s := jobs.status("lose")).get("world", {}).get("replicas") == 2
            and s.get("phase") == "Running"
            and s
        ),
    )
    nodes = [p["node"] for p in healed["placement"]]
    assert victim not in nodes and len(set(nodes)) == 2
    ranks = [p["rank"] for p in healed["placement"]]
    assert len(ranks) == len(set(ranks)), "no duplicate ranks"
    assert all(p["spec"].get("nodeName") != victim for p in jobs.pods("lose"))


def test_retryable_failure_is_replaced_and_counted(
    cluster: LocalCluster, jobs: Jobs, operator: OperatorProcess, private_nodes: list[str]
) -> None:
    jobs.apply(h200_job("retry", replicas=2))
    status = jobs.wait_phase("retry", "Running")
    fail_pod(cluster, jobs.namespace, status["world"]["ranks"][0], code=75)
    recovered = jobs.wait(
        "restart counted and world back at 2",
        lambda: (
            (s := jobs.status("retry")).get("restarts") == 1
            and s.get("world", {}).get("replicas") == 2
            and s.get("phase") == "Running"
            and s
        ),
    )
    reasons = [r["reason"] for r in recovered["resizes"]]
    assert "WorkerFailed" in reasons
    assert recovered["world"]["version"] >= 3


def test_permanent_failure_fails_the_job(
    cluster: LocalCluster, jobs: Jobs, operator: OperatorProcess, private_nodes: list[str]
) -> None:
    jobs.apply(h200_job("doomed", replicas=2))
    status = jobs.wait_phase("doomed", "Running")
    fail_pod(cluster, jobs.namespace, status["world"]["ranks"][1], code=2)
    failed = jobs.wait_phase("doomed", "Failed")
    condition = next(c for c in failed["conditions"] if c["type"] == "Failed")
    assert condition["reason"] == "PermanentFailure" and "code 2" in condition["message"]
    assert any(e["reason"] == "PermanentFailure" for e in jobs.events("doomed"))
    jobs.wait(
        "surviving workers stopped",
        lambda: all(
            p["status"].get("phase") in ("Failed", "Succeeded")
            or p["metadata"].get("deletionTimestamp")
            for p in jobs.pods("doomed")
        ),
    )


def test_suspend_and_resume(
    cluster: LocalCluster, jobs: Jobs, operator: OperatorProcess, private_nodes: list[str]
) -> None:
    jobs.apply(h200_job("nap", replicas=2))
    jobs.wait_phase("nap", "Running")
    cluster.kubectl(
        "patch", "tj", "nap", "-n", jobs.namespace, "--type=merge", "-p",
        json.dumps({"spec": {"suspend": True}}),
    )  # fmt: skip
    stopping = jobs.wait(
        "every worker told to stop",
        lambda: (
            (pods := jobs.pods("nap"))
            and all(
                json.loads(p["metadata"]["annotations"]["elastra.dev/assignment"])["stop"]
                for p in pods
            )
        ),
    )
    assert stopping
    # kwok pods do not run the agent: they never exit 0 themselves, so the retire timeout
    # is what deletes them here (real workers exit after their checkpoint).
    jobs.wait("workers gone", lambda: not jobs.pods("nap"))
    suspended = jobs.wait_phase("nap", "Suspended")
    assert suspended["world"]["ranks"] == []
    cluster.kubectl(
        "patch", "tj", "nap", "-n", jobs.namespace, "--type=merge", "-p",
        json.dumps({"spec": {"suspend": False}}),
    )  # fmt: skip
    resumed = jobs.wait_phase("nap", "Running")
    assert resumed["world"]["replicas"] == 2


def test_deleting_the_job_removes_its_pods_and_no_finalizers(
    cluster: LocalCluster, jobs: Jobs, operator: OperatorProcess, private_nodes: list[str]
) -> None:
    jobs.apply(h200_job("gone", replicas=2))
    jobs.wait_phase("gone", "Running")
    assert not jobs.get("gone")["metadata"].get("finalizers")
    assert all(not p["metadata"].get("finalizers") for p in jobs.pods("gone"))
    cluster.kubectl("delete", "tj", "gone", "-n", jobs.namespace, "--wait=true", "--timeout=30s")
    jobs.wait("pods garbage-collected", lambda: not jobs.pods("gone"))


def test_operator_killed_mid_reconcile_converges(
    cluster: LocalCluster, jobs: Jobs, operator: OperatorProcess, private_nodes: list[str]
) -> None:
    jobs.apply(h200_job("phoenix", replicas=12, worker={
        "gpus": 2, "gpuTypes": ["H200"], "image": "elastra-worker:dev"}))  # fmt: skip
    jobs.wait("first pods created", lambda: len(jobs.pods("phoenix")) >= 1, timeout=60)
    operator.kill()
    operator.start()
    # On a loaded machine the restarted operator can take past the join timeout (20 s here) to
    # lead, form a world of the pods Ready by then and grow it to 12 a pass later: converged
    # means the world of all 12, not the first Running.
    status = jobs.wait(
        "phoenix Running with 12 members",
        lambda: (
            (s := jobs.status("phoenix")).get("phase") == "Running"
            and len(s.get("placement") or []) == 12
            and s
        ),
        timeout=120,
    )
    pods = jobs.pods("phoenix")
    assert len(pods) == 12, "no orphans, no duplicates"
    slots = Counter(p["metadata"]["labels"]["elastra.dev/slot"] for p in pods)
    assert max(slots.values()) == 1
    ranks = [p["rank"] for p in status["placement"]]
    assert sorted(ranks) == [2 * i for i in range(12)]
    jobs.wait("two quiet passes", lambda: operator.quiet_passes("phoenix") >= 2, timeout=60)
    versions = {p["metadata"]["name"]: p["metadata"]["resourceVersion"] for p in pods}
    job_version = jobs.get("phoenix")["metadata"]["resourceVersion"]
    seen = operator.quiet_passes("phoenix")
    jobs.wait("another quiet pass", lambda: operator.quiet_passes("phoenix") > seen, timeout=60)
    assert jobs.get("phoenix")["metadata"]["resourceVersion"] == job_version
    assert {
        p["metadata"]["name"]: p["metadata"]["resourceVersion"] for p in jobs.pods("phoenix")
    } == versions


def test_unplaceable_job_says_why_once_and_creates_nothing(
    cluster: LocalCluster, jobs: Jobs, operator: OperatorProcess
) -> None:
    """Without capacity requests: with them (the default) the job first asks the autoscaler
    for an MI300X node and says so when none came (tests/integration/autoscale)."""
    operator.stop()
    operator.extra_args = ("--capacity-requests=off",)
    operator.start()
    jobs.apply(gpu_job("nowhere", replicas=2, worker={
        "gpus": 8, "gpuTypes": ["MI300X"], "image": "elastra-worker:dev"}))  # fmt: skip
    status = jobs.wait(
        "Admitted=False",
        lambda: (
            any(
                c["type"] == "Admitted" and c["status"] == "False"
                for c in jobs.status("nowhere").get("conditions", [])
            )
            and jobs.status("nowhere")
        ),
    )
    admitted = next(c for c in status["conditions"] if c["type"] == "Admitted")
    assert admitted["reason"] == "Unplaceable" and "MI300X" in admitted["message"]
    jobs.wait("three quiet passes", lambda: operator.quiet_passes("nowhere") >= 3, timeout=60)
    assert not jobs.pods("nowhere")
    warnings = [e for e in jobs.events("nowhere") if e["type"] == "Warning"]
    assert len(warnings) == 1, warnings


def test_only_the_lease_holder_writes_and_a_successor_takes_over(
    cluster: LocalCluster, jobs: Jobs, operator: OperatorProcess, private_nodes: list[str]
) -> None:
    second = OperatorProcess(cluster, jobs.namespace)
    second.start()
    try:
        jobs.wait(
            "the second operator stands by",
            lambda: any("standing by" in line for line in second.lines),
            timeout=60,
        )
        jobs.apply(h200_job("solo", replicas=2))
        jobs.wait_phase("solo", "Running")
        assert operator.quiet_passes("solo") + _passes(operator, "solo") > 0
        assert _passes(second, "solo") == 0, "a standby operator must not reconcile"
        operator.kill()
        cluster.kubectl(
            "patch", "tj", "solo", "-n", jobs.namespace, "--type=merge", "-p",
            json.dumps({"spec": {"replicas": 3}}),
        )  # fmt: skip
        grown = jobs.wait(
            "the successor acquires the Lease and grows the job",
            lambda: (s := jobs.status("solo")).get("world", {}).get("replicas") == 3 and s,
            timeout=120,
        )
        assert grown["world"]["version"] == 2
        assert _passes(second, "solo") > 0
    finally:
        second.stop()


def _passes(proc: OperatorProcess, job: str) -> int:
    return sum(1 for line in list(proc.lines) if f'"job": "{proc.namespace}/{job}"' in line)


def test_metrics_and_liveness_endpoints(
    cluster: LocalCluster, jobs: Jobs, private_nodes: list[str]
) -> None:
    metrics_port = free_ports(2)
    health_port = metrics_port + 1
    proc = OperatorProcess(
        cluster,
        jobs.namespace,
        extra_args=(f"--metrics-port={metrics_port}", f"--health-port={health_port}"),
    )
    proc.start()
    try:
        jobs.apply(h200_job("observed", replicas=2))
        jobs.wait_phase("observed", "Running")
        health = jobs.wait(
            "liveness endpoint answers",
            lambda: http_get(f"http://127.0.0.1:{health_port}/healthz"),
            timeout=60,
        )
        assert health is not None
        text = jobs.wait(
            "metrics show the running job",
            lambda: (
                (t := http_get(f"http://127.0.0.1:{metrics_port}/metrics"))
                and 'elastra_jobs{phase="Running"} 1.0' in t
                and t
            ),
        )
        for name in (
            "elastra_reconcile_duration_seconds_bucket",
            "elastra_pods_created_total",
            "elastra_resizes_total",
            "elastra_api_requests_total",
            "elastra_job_restarts",
        ):
            assert name in text, name
        assert "elastra_leader 1.0" in text and "elastra_caches_synced 1.0" in text
    finally:
        proc.stop()


def test_a_batch_refused_halfway_holds_nothing_and_starts_once_it_fits(
    cluster: LocalCluster, jobs: Jobs, operator: OperatorProcess, private_nodes: list[str]
) -> None:
    """Gang admission on the real API server: a ResourceQuota lets only two of a batch of three
    pods be created, so the two stay gated (the last pod, created without the gate, is never
    sent) and nothing runs; with the quota gone the same job forms its world of three."""
    namespace = operator.namespace
    existing = len(cluster.get("pods", "-n", namespace)["items"])
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "two-more-pods"},
        "spec": {"hard": {"pods": str(existing + 2)}},
    }
    cluster.apply(quota, namespace=namespace)
    jobs.wait(
        "the quota's usage to be counted",
        lambda: "pods" in (cluster.get("resourcequota", "two-more-pods", "-n", namespace)
                           .get("status", {}).get("used") or {}),
        timeout=60,
    )  # fmt: skip
    worker = {"gpus": 8, "gpuTypes": ["H200"], "image": "elastra-worker:dev"}
    try:
        jobs.apply(h200_job("halfway", replicas=3, worker=worker))
        refused = jobs.wait(
            "a FailedCreate Warning on the job",
            lambda: [e for e in jobs.events("halfway") if e["reason"] == "FailedCreate"],
        )
        assert refused[0]["type"] == "Warning" and "exceeded quota" in refused[0]["message"]
        jobs.wait("a retry", lambda: max(e.get("count") or 1 for e in jobs.events("halfway")
                                         if e["reason"] == "FailedCreate") >= 2)  # fmt: skip
        pods = jobs.pods("halfway")
        assert len(pods) == 2
        ungated = [p["metadata"]["name"] for p in pods if not p["spec"].get("schedulingGates")]
        assert ungated == [], f"{ungated} could run while the batch is incomplete"
        assert not any(p["spec"].get("nodeName") for p in pods), "nothing bound, nothing held"
    finally:
        cluster.kubectl("delete", "resourcequota", "two-more-pods", "-n", namespace)
    status = jobs.wait_phase("halfway", "Running", timeout=120)
    assert world(status)["replicas"] == 3 and world(status)["version"] == 1


def test_a_member_that_never_starts_is_dropped_before_the_others_give_up(
    cluster: LocalCluster, jobs: Jobs, operator: OperatorProcess, pool: NodePool
) -> None:
    """One pod of a first world lands where its image never pulls (kwok holds it in
    ImagePullBackOff) while the other two run: once they have waited the join timeout (20 s
    here, 240 s by default: below the workers' 300 s rendezvous), the world re-forms without
    it, so the running members move on instead of timing out in their rendezvous."""
    pool.add(2)
    (bad_node,) = pool.add(1, suffix="image-pull-fails")
    jobs.apply(h200_job("pull", replicas=3))
    first = jobs.wait(
        "a world of 3", lambda: world(s := jobs.status("pull")).get("replicas") == 3 and s
    )
    (stuck,) = [p["pod"] for p in first["placement"] if p["node"] == bad_node]
    (uid,) = [p["metadata"]["uid"] for p in jobs.pods("pull") if p["metadata"]["name"] == stuck]
    reformed = jobs.wait(
        "the world re-formed without the member that never started",
        lambda: (
            (s := jobs.status("pull")).get("resizes", [{}])[-1].get("reason") == "JoinTimedOut"
            and s
        ),
        timeout=120,
    )
    assert world(reformed)["replicas"] == 2 and stuck not in world(reformed)["ranks"]
    assert world(reformed)["version"] == world(first)["version"] + 1
    assert reformed["restarts"] == 1, "a member that cannot start counts toward maxRestarts"
    warnings = [e for e in jobs.events("pull") if e["reason"] == "JoinTimedOut"]
    assert warnings and warnings[0]["type"] == "Warning" and stuck in warnings[0]["message"]
    jobs.wait(
        f"{stuck} deleted (its replacement, if any, is a new pod of the same slot)",
        lambda: all(
            p["metadata"]["uid"] != uid or p["metadata"].get("deletionTimestamp")
            for p in jobs.pods("pull")
        ),
    )
    assert jobs.wait_phase("pull", "Running")["world"]["replicas"] == 2
