"""End to end: Elastra installed with Helm runs examples/cpu-tiny.yaml in real pods.

Why: this is what a user does and sees. The tests run in file order against one install
(conftest.py) and each checks the cluster and the workers' own records: the step log rank 0
writes on the shared checkpoint volume and the worker pods' logs (e2e/trainlog.py).
"""

from __future__ import annotations

import contextlib
import time

import pytest
from e2e.cluster import ClusterDirs, apiserver_frozen
from e2e.elasticjob import RUNNING_STEPS, Elastra, complete_lines, example_job
from e2e.install import denials, denied_events, leftovers, rbac_against_golden, wait_nothing_left
from e2e.kube import KubeError, wait_for
from e2e.target import Target
from e2e.trainlog import (
    check_contiguous,
    check_resumes,
    parse_step_log,
    resumes,
    world_spans,
)

pytestmark = pytest.mark.timeout(1200)

STEPS_PER_WORLD = 3
"""Steps each new world must train before a test moves on: it really resumed and trained."""
OUTAGE_S = 60
"""How long the API server is away: an upgrade or a control-plane failover."""
RECOVER_S = 90
"""From the API server answering again to a running world that trains (issue's bound)."""


def _grow_or_shrink(elastra: Elastra, replicas: int) -> int:
    """kubectl scale, then wait for the new world to train; returns its version."""
    job = elastra.job
    before = int((job.status().get("world") or {}).get("version") or 0)
    job.scale(replicas)
    version = job.wait_world(replicas, after=before)
    job.wait_trained(version, STEPS_PER_WORLD)
    return version


def test_operator_is_admitted_under_restricted_and_holds_the_golden_rbac(
    elastra: Elastra,
) -> None:
    kube, setup = elastra.kube, elastra.setup
    pods = kube.items(
        "pods", "-n", setup.operator_namespace, "-l", f"app.kubernetes.io/instance={setup.release}"
    )
    assert [p["status"]["phase"] for p in pods] == ["Running"], pods
    for namespace in (setup.operator_namespace, setup.job_namespace):
        labels = kube.get("namespace", namespace)["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    diffs = rbac_against_golden(kube, setup)
    assert diffs == {what: (set(), set()) for what in diffs}, "(extra, missing) per role"


def test_job_trains_in_a_world_of_three(elastra: Elastra) -> None:
    job = elastra.job
    elastra.kube.apply(example_job(elastra.setup.job_namespace, steps=RUNNING_STEPS))
    version = job.wait_world(3, after=0)
    last = job.wait_trained(version, STEPS_PER_WORLD)
    pods = job.running_pods()
    assert len(pods) == 3
    for node in {p["spec"]["nodeName"] for p in pods}:
        labels = elastra.kube.get("node", node)["metadata"].get("labels") or {}
        assert labels.get("type") != "kwok", f"worker on simulated node {node}"
    assert all(c["imageID"] for p in pods for c in p["status"]["containerStatuses"]), (
        "every worker runs the real image"
    )
    assert last >= STEPS_PER_WORLD - 1


def test_status_progress_advances(elastra: Elastra) -> None:
    """The operator reads rank 0's metrics about every 30 s into status.progress."""
    job = elastra.job

    def step() -> int:
        return int((job.status().get("progress") or {}).get("step") or 0)

    first = step()
    wait_for(
        "status.progress.step to advance",
        lambda: step() > first,
        timeout=150,  # up to two reads 30 s apart, and a slow trainer start in the pod
        interval=2,
        hint=job.describe,
    )
    progress = job.status()["progress"]
    assert progress["samplesPerSecond"] > 0, progress


def test_scale_down_to_two_then_up_to_three(elastra: Elastra) -> None:
    job = elastra.job
    seen_before = list(job.versions)
    two = _grow_or_shrink(elastra, 2)
    stayed = set(job.status()["world"]["ranks"])
    three = _grow_or_shrink(elastra, 3)
    assert seen_before[-1] < two < three, job.versions
    assert job.versions == sorted(set(job.versions)), "world versions only grow"
    # The pods that stayed had each new assignment pushed to their agent by the operator (signed
    # with the job's key), not only written to their annotation.
    logs = {
        pod: elastra.kube.kubectl("logs", "-n", job.namespace, pod, "-c", "worker", check=False)
        for pod in sorted(stayed)
    }
    for version in (two, three):
        line = f"assignment of world version {version} pushed by the operator"
        unpushed = [pod for pod, text in logs.items() if line not in text]
        assert unpushed == [], (line, {pod: logs[pod][-3000:] for pod in unpushed})


def test_a_deleted_worker_pod_is_replaced_and_training_resumes(elastra: Elastra) -> None:
    job = elastra.job
    status = job.status()
    before = int(status["world"]["version"])
    ranks = status["world"]["ranks"]
    victim = ranks[-1]  # not rank 0: its log holds the commits the checks read
    job.snapshot_logs()
    elastra.kube.kubectl("delete", "pod", victim, "-n", job.namespace, "--wait=false")
    version = job.wait_world(3, after=before)
    job.wait_trained(version, STEPS_PER_WORLD)
    assert version > before


def test_operator_killed_in_the_middle_of_a_resize_converges(elastra: Elastra) -> None:
    kube, setup, job = elastra.kube, elastra.setup, elastra.job
    before = int(job.status()["world"]["version"])
    selector = f"app.kubernetes.io/instance={setup.release}"
    (operator,) = kube.items("pods", "-n", setup.operator_namespace, "-l", selector)
    job.scale(2)
    # The operator has seen the new replicas (a new world or Resizing) when it is killed.
    wait_for(
        "the resize to start",
        lambda: (
            int((job.status().get("world") or {}).get("version") or 0) > before
            or (job.status().get("world") or {}).get("size") == 2
        ),
        timeout=120,
        interval=0.5,
        hint=job.describe,
    )
    kube.kubectl(
        "delete", "pod", operator["metadata"]["name"], "-n", setup.operator_namespace,
        "--grace-period=0", "--force",
    )  # fmt: skip
    version = job.wait_world(2, after=before)
    job.wait_trained(version, STEPS_PER_WORLD)
    (successor,) = wait_for(
        "a new operator pod Running",
        lambda: (
            [
                p
                for p in kube.items("pods", "-n", setup.operator_namespace, "-l", selector)
                if p["status"].get("phase") == "Running"
                and p["metadata"]["uid"] != operator["metadata"]["uid"]
            ]
            or None
        ),
        timeout=180,
        interval=1,
    )
    assert successor["metadata"]["name"] != operator["metadata"]["name"]
    assert job.versions == sorted(set(job.versions))


def test_a_minute_without_the_api_server_is_ridden_out(elastra: Elastra, target: Target) -> None:
    """The API server frozen for a minute (nothing answers, connections hang): the workers
    train on without it, and once it answers again the job is Running at its desired size and
    training within RECOVER_S. The next chapter checks that no step was lost."""
    if target.local_root is None or elastra.setup.volume is None:
        pytest.skip("freezes the local cluster's API server; an external cluster's cannot be")
    job = elastra.job
    host_log = elastra.setup.volume.host / "steps.jsonl"
    desired = int(job.job()["spec"]["replicas"])
    before = job.step_log()[-1].step
    with apiserver_frozen(ClusterDirs(target.local_root)):
        time.sleep(OUTAGE_S)  # the fault itself: it lasts this long, nothing is waited on
        during = [
            r for r in parse_step_log(complete_lines(host_log.read_text())) if r.step > before
        ]
    assert during, "no step was trained while the API server was away"
    resumed = time.monotonic()

    def trained_since_resume() -> int | None:
        with contextlib.suppress(KubeError):
            world = job.status().get("world") or {}
            running = job.running_pods()
            records = job.step_log()
            if world.get("size") == desired and len(running) == desired and records:
                newest = records[-1]
                fresh = newest.step >= during[-1].step + STEPS_PER_WORLD
                return newest.step if fresh and newest.world_version >= world["version"] else None
        return None

    wait_for(
        f"a running world of {desired} training again after the outage",
        trained_since_resume, timeout=RECOVER_S, interval=2, hint=job.describe,
    )  # fmt: skip
    print(
        f"API server frozen {OUTAGE_S}s: {len(during)} steps trained meanwhile; "
        f"world of {desired} training again {time.monotonic() - resumed:.0f}s after it answered"
    )


def test_no_step_lost_and_the_data_order_held(elastra: Elastra) -> None:
    job = elastra.job
    records = job.step_log()
    check_contiguous(records)
    spans = world_spans(records)
    assert len(spans) >= 5, spans  # 3, 2, 3, 3 (replaced pod), 2 (operator killed)
    assert [s.size for s in spans[:3]] == [3, 2, 3], spans
    # 4096: train_tiny_gpt.py's default --dataset-size
    assert job.check_data_order(records, dataset_size=4096) == len(records)
    found = resumes(job.log_lines())
    # Every world after the first restored a checkpoint, the newest one committed before it.
    assert len(found) >= len(spans) - 1, (found, spans)
    check_resumes(found)
    first_steps = {s.first_step for s in spans[1:]}
    assert first_steps <= {r.step for r in found}, (spans, found)


def test_nothing_was_denied(elastra: Elastra) -> None:
    """Pod Security "restricted" admitted everything: no warning at install, no refusal
    event, and the operator (which creates the worker pods itself) was never refused."""
    kube, setup = elastra.kube, elastra.setup
    assert denials(elastra.install_warnings) == []
    assert denied_events(kube, (setup.operator_namespace, setup.job_namespace)) == []
    operator_log = kube.kubectl(
        "logs", "-n", setup.operator_namespace, f"deployment/{setup.release}", "--tail=-1"
    )
    assert operator_log.strip(), "the operator logged nothing"
    assert denials(operator_log) == []


def test_helm_uninstall_leaves_nothing_behind(elastra: Elastra) -> None:
    kube, setup = elastra.kube, elastra.setup
    elastra.job.delete()
    assert leftovers(kube, setup) != [], "the release exists before uninstall"
    kube.helm("uninstall", setup.release, f"--namespace={setup.operator_namespace}", "--wait")
    elastra.installed = False
    wait_nothing_left(kube, setup)
