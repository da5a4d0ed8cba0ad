"""Kueue admission as transcripts: a queued job waits for its Workload, runs within it, and
stops when evicted; plus the pure pieces (the Workload it asks for, how a Workload reads)."""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any, cast
from unittest import mock

from elastra.api import parse_trainingjob
from elastra.controller.decide import admission
from elastra.controller.decide.admission import GateState
from elastra.controller.decide.manifests import LABEL_JOB
from elastra.controller.decide.passplan import Observation, PassWrites, plan_pass
from elastra.controller.engine import handlers
from elastra.controller.engine.handlers import JobLoop, Runtime
from elastra.controller.settings import OperatorSettings
from elastra.elastic.resize import ResizePolicy
from tests.unit.controller import fakecluster
from tests.unit.controller.fakecluster import FakeCluster, node

SETTINGS = OperatorSettings(
    policy=ResizePolicy(
        settle=timedelta(seconds=1),
        pending_grace=timedelta(seconds=20),
        cooldown=timedelta(seconds=0),
        retire_timeout=timedelta(seconds=30),
    )
)
QUEUE = "team-a"


def queued_job(replicas: int = 4, **spec: Any) -> dict[str, Any]:
    body = fakecluster.gpt_job(replicas, minReplicas=2, **spec)
    body["metadata"]["labels"] = {admission.QUEUE_LABEL: QUEUE}
    body["spec"]["training"] = {"globalBatchSize": 96}
    return body


@dataclass
class QueuedCluster(FakeCluster):
    """A FakeCluster with the job's Workload and a hand-driven Kueue."""

    workload: dict[str, Any] | None = None

    def step(self, seconds: float = 1.0) -> PassWrites:
        def with_workload(
            obs: Observation, settings: OperatorSettings, now: datetime
        ) -> PassWrites:
            return plan_pass(replace(obs, workload=self.workload), settings, now)

        with mock.patch.object(fakecluster, "plan_pass", with_workload):
            plan = super().step(seconds)
        if plan.workload_delete:
            self.workload = None
        if plan.workload_create:
            self.workload = copy.deepcopy(plan.workload_create)
        return plan

    def kueue(self, **status: Any) -> None:
        assert self.workload is not None
        self.workload["status"] = status

    def admit(self, count: int) -> None:
        self.kueue(
            admission={
                "clusterQueue": "cq",
                "podSetAssignments": [{"name": admission.POD_SET, "count": count}],
            },
            conditions=[
                {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
                {"type": "Admitted", "status": "True", "reason": "Admitted"},
            ],
        )


def cluster_of(replicas: int = 4, nodes: int = 6) -> QueuedCluster:
    return QueuedCluster(queued_job(replicas), [node(f"h100-{i}") for i in range(nodes)], SETTINGS)


def suspended(cluster: FakeCluster) -> tuple[str, str]:
    cond = next(c for c in cluster.job.status.conditions if c.type == "Suspended")
    return cond.status, cond.reason


def test_a_queued_job_gets_a_workload_and_no_pods_until_admitted() -> None:
    cluster = cluster_of()
    plan = cluster.step()
    assert plan.workload_create is not None and not plan.creates
    workload = plan.workload_create
    assert workload["spec"]["queueName"] == QUEUE
    (podset,) = workload["spec"]["podSets"]
    assert podset["count"] == 4
    (worker,) = podset["template"]["spec"]["containers"]
    assert worker["resources"]["requests"]["nvidia.com/gpu"] == "8"
    assert workload["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    cluster.kueue(
        conditions=[
            {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": "no quota"}
        ]
    )
    for _ in range(3):
        cluster.schedule_and_run()
        plan = cluster.step()
        assert not plan.creates and plan.workload_create is None
    assert not cluster.pods
    status = cluster.job.status
    assert status.phase == "Suspended" and suspended(cluster) == ("True", "AwaitingAdmission")
    message = next(c.message for c in status.conditions if c.type == "Suspended")
    assert QUEUE in message and "no quota" in message
    assert status.start_time is None
    cluster.admit(4)
    cluster.converge()
    status = cluster.job.status
    assert status.phase == "Running" and status.world.replicas == 4
    assert status.admitted_replicas == 4 and status.start_time is not None
    assert suspended(cluster) == ("False", "Active")


def test_a_scale_up_stays_within_the_admitted_count_and_says_so() -> None:
    cluster = cluster_of(4)
    cluster.step()
    cluster.admit(4)
    cluster.converge()
    cluster.job_body["spec"]["replicas"] = 6
    cluster.converge()
    status = cluster.job.status
    assert status.world.replicas == 4 and len(cluster.pods) == 4
    admitted = next(c for c in status.conditions if c.type == "Admitted")
    assert admitted.reason == "CappedByAdmission" and "6" in admitted.message
    assert status.phase == "Running"  # capped is not degraded


def test_eviction_stops_like_suspend_then_releases_and_queues_again() -> None:
    cluster = cluster_of()
    cluster.step()
    cluster.admit(4)
    cluster.converge()
    assert len(cluster.pods) == 4
    cluster.kueue(
        admission=cluster.workload["status"]["admission"] if cluster.workload else None,
        conditions=[{"type": "Evicted", "status": "True", "reason": "Preempted"}],
    )
    plan = cluster.step()
    assert cluster.job.status.world.ranks == [] and suspended(cluster)[1] == "EvictedByKueue"
    assert plan.workload_delete is None  # not while pods still checkpoint
    for pod in cluster.pods.values():
        pod["status"]["phase"] = "Succeeded"  # checkpointed and exited
    cluster.step()
    assert not cluster.pods
    plan = cluster.step()
    assert plan.workload_delete == admission.workload_name("gpt")
    plan = cluster.step()
    assert plan.workload_create is not None  # queued again
    assert suspended(cluster) == ("True", "AwaitingAdmission") and not cluster.pods


def test_a_finished_job_releases_its_workload() -> None:
    cluster = cluster_of()
    cluster.step()
    cluster.admit(4)
    cluster.converge()
    for pod in cluster.pods.values():
        pod["status"] = {"phase": "Succeeded"}
    cluster.step()
    assert cluster.job.status.phase == "Succeeded"
    assert cluster.workload is None


def test_a_queued_job_resized_before_admission_asks_again() -> None:
    cluster = cluster_of(4)
    cluster.step()
    cluster.job_body["spec"]["replicas"] = 3
    assert cluster.step().workload_delete is not None
    plan = cluster.step()
    assert plan.workload_create is not None
    assert plan.workload_create["spec"]["podSets"][0]["count"] == 3


def test_read_gate() -> None:
    job = parse_trainingjob(queued_job())
    plain = queued_job()
    plain["metadata"]["labels"] = {}
    assert admission.read_gate(parse_trainingjob(plain), None) is None
    gate = admission.read_gate(job, None)
    assert gate is not None and gate.state is GateState.PENDING and gate.requested is None
    spec = {"podSets": [{"name": admission.POD_SET, "count": 4}], "active": False}
    admitted = {
        "admission": {"podSetAssignments": [{"name": admission.POD_SET, "count": 4}]},
        "conditions": [{"type": "Admitted", "status": "True"}],
    }
    off = admission.read_gate(job, {"spec": spec, "status": admitted})
    assert off is not None and off.state is GateState.PENDING and off.message == "deactivated"
    on = admission.read_gate(job, {"spec": {**spec, "active": True}, "status": admitted})
    assert on is not None and on.state is GateState.ADMITTED and on.admitted == 4


def test_priority_class_and_limits_reach_the_podset() -> None:
    body = queued_job()
    body["spec"]["worker"]["template"] = {"spec": {"priorityClassName": "training-high"}}
    body["spec"]["worker"]["resources"] = {"limits": {"memory": "8Gi"}}
    job = parse_trainingjob(body)
    pod = {
        "spec": {
            "priorityClassName": "training-high",
            "containers": [{"name": "worker", "image": "i", "resources": {"limits": {"x": "1"}}}],
        }
    }
    workload = admission.workload_manifest(job, pod=pod)
    template = workload["spec"]["podSets"][0]["template"]["spec"]
    assert template["priorityClassName"] == "training-high"
    assert template["containers"][0]["resources"]["requests"] == {"x": "1"}
    assert admission.priority_class_of(workload) == "training-high"
    ranked = admission.with_priority(workload, name="training-high", value=1000)
    assert ranked["spec"]["priority"] == 1000
    assert ranked["spec"]["priorityClassRef"]["name"] == "training-high"
    assert "priority" not in workload["spec"]  # the input is not changed


def test_long_job_names_give_valid_workload_names() -> None:
    name = admission.workload_name("j" * 253)
    assert len(name) <= 253 and name != admission.workload_name("j" * 252 + "k")


def test_a_deactivated_workload_is_left_alone_even_when_evicted() -> None:
    job = parse_trainingjob(queued_job(3))
    workload = {
        "spec": {"active": False, "podSets": [{"name": admission.POD_SET, "count": 4}]},
        "status": {"conditions": [{"type": "Evicted", "status": "True"}]},
    }
    gate = admission.read_gate(job, workload)
    assert gate is not None and gate.state is GateState.PENDING and not gate.active
    hold = admission.hold_of(job, gate)
    assert hold is not None and hold.reason == "AwaitingAdmission"
    action = admission.workload_action(job, gate, pod={}, has_pods=False, finished=False)
    assert action == admission.WorkloadAction()


def test_a_workload_event_wakes_its_job() -> None:
    """Kueue admitting or evicting a Workload wakes the job it is labelled with, and only it."""
    rt = Runtime(
        kube=cast(Any, None),
        settings=OperatorSettings(),
        snapshot=cast(Any, None),
        leader=cast(Any, SimpleNamespace(leading=True, renew=timedelta(seconds=1))),
    )
    mine, other = asyncio.Event(), asyncio.Event()
    rt.loops[("team-a", "gpt")] = JobLoop(task=cast(Any, None), wake=mine)
    rt.loops[("team-a", "other")] = JobLoop(task=cast(Any, None), wake=other)
    event = {
        "type": "MODIFIED",
        "object": {
            "metadata": {
                "name": admission.workload_name("gpt"),
                "namespace": "team-a",
                "labels": {LABEL_JOB: "gpt"},
            }
        },
    }
    asyncio.run(handlers.workload_event(cast(Any, event), SimpleNamespace(runtime=rt)))
    assert mine.is_set() and not other.is_set()
