"""ttlSecondsAfterFinished against the real control plane: a job that fails is deleted by the
operator once its TTL has passed (no Kueue needed; it lives here beside the other job-lifetime
and admission tests)."""

from __future__ import annotations

from e2e.cluster.api import wait_for

from tests.integration.conftest import LocalCluster
from tests.integration.operator.conftest import Jobs, OperatorProcess, gpu_job


def test_a_failed_job_is_deleted_after_its_ttl(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, jobs: Jobs
) -> None:
    body = gpu_job(
        "short-lived",
        replicas=1,
        ttlSecondsAfterFinished=3,
        failurePolicy={"maxRestarts": 0, "backoffSeconds": 0, "permanentExitCodes": [2]},
    )
    # kwok's elastra-pod-fail stage: the Running worker exits 2 a few seconds later (after
    # the world formed), which failurePolicy calls permanent.
    body["spec"]["worker"]["template"] = {
        "metadata": {
            "labels": {"sim.elastra.dev/fail": "true"},
            "annotations": {"sim.elastra.dev/exit-code": "2", "sim.elastra.dev/fail-after": "6s"},
        }
    }
    jobs.apply(body)
    failed = jobs.wait_phase("short-lived", "Failed", timeout=120)
    assert failed["completionTime"]
    wait_for(
        "the operator to delete the job after its TTL",
        lambda: (
            cluster.kubectl(
                "get", "trainingjob", "short-lived", "-n", namespace, check=False
            ).returncode
            != 0
        ),
        timeout=60,
        interval=0.5,
    )
    reasons = {e.get("reason") for e in jobs.events("short-lived")}
    assert "PermanentFailure" in reasons
