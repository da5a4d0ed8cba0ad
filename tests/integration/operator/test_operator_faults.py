"""The operator killed after each write of a resize, on the real control plane: it converges.

Why: a resize is a sequence of writes (status with the new world version first, then pod
creates, gate removals, assignment patches, deletes), and the operator pod can die between any
two of them. ``ELASTRA_FAULT_KILL_AFTER_WRITES=k`` makes the operator SIGKILL itself right after
its k-th pod or TrainingJob write; a normal operator started after it must finish the resize
from what the cluster holds: the desired number of pods, each slot once, every rank once, and
no pod left from the half-done step. Each round resizes the other way (2 -> 4 -> 2 ...).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from elastra.kube.client import KILL_AFTER_WRITES_ENV
from tests.integration.conftest import LocalCluster
from tests.integration.operator.conftest import Jobs, OperatorProcess
from tests.integration.operator.test_operator import h200_job

JOB = "crashy"
KILL_AFTER = range(1, 9)
"""Writes after which the operator dies; a resize of 2 gpus x 2 -> 4 pods writes at least 8."""


def test_operator_killed_after_each_write_of_a_resize_converges(
    cluster: LocalCluster, jobs: Jobs, operator: OperatorProcess, private_nodes: list[str]
) -> None:
    worker = {"gpus": 2, "gpuTypes": ["H200"], "image": "elastra-worker:dev"}
    jobs.apply(h200_job(JOB, replicas=2, worker=worker))
    _wait_converged(jobs, 2)
    operator.stop()
    replicas, killed = 2, []
    for k in KILL_AFTER:
        replicas = 4 if replicas == 2 else 2
        faulty = OperatorProcess(cluster, operator.namespace, env={KILL_AFTER_WRITES_ENV: str(k)})
        faulty.start()
        cluster.kubectl("scale", f"trainingjob/{JOB}", f"--replicas={replicas}",
                        "-n", operator.namespace)  # fmt: skip
        jobs.wait(
            f"the operator to die after write {k}, or the resize to finish first",
            lambda f=faulty, r=replicas: _dead(f) or _converged(jobs, r) is not None,
            timeout=120,
        )
        if _dead(faulty):
            killed.append(k)
        faulty.stop()
        operator.start()
        _wait_converged(jobs, replicas)
        operator.stop()
    assert killed == list(KILL_AFTER), f"the operator died after writes {killed} only"


def _dead(proc: OperatorProcess) -> bool:
    return proc.process is not None and proc.process.poll() is not None


def _wait_converged(jobs: Jobs, replicas: int) -> dict[str, Any]:
    found: dict[str, Any] = jobs.wait(
        f"a Running world of {replicas}, each slot and rank once, no extra pod",
        lambda: _converged(jobs, replicas),
        timeout=150,
    )
    return found


def _converged(jobs: Jobs, replicas: int) -> dict[str, Any] | None:
    """The status when the job runs ``replicas`` workers exactly as a clean resize leaves it."""
    status = jobs.status(JOB)
    conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
    pods = [p for p in jobs.pods(JOB) if not p["metadata"].get("deletionTimestamp")]
    world = status.get("world") or {}
    if conditions.get("Running") != "True" or world.get("replicas") != replicas:
        return None
    if len(pods) != replicas or len(world.get("ranks") or []) != replicas:
        return None
    slots = Counter(p["metadata"]["labels"]["elastra.dev/slot"] for p in pods)
    ranks = sorted(p["rank"] for p in status.get("placement") or [])
    assert max(slots.values()) == 1, f"a slot twice: {slots}"
    assert ranks == [2 * i for i in range(replicas)], f"ranks {ranks}"
    assert set(world["ranks"]) == {p["metadata"]["name"] for p in pods}, (world, pods)
    return status
