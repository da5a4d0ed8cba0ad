"""A tiny in-memory stand-in for what the API server would return, for pure pass tests.

Not a mock of the API server: nothing here answers requests. It holds node and pod dicts and
applies a ``PassWrites`` the way ``elastra.controller.engine.reconcile`` would, so a test can run
passes back to back and read the cluster state like a transcript. The real API server is
exercised by tests/integration.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from elastra.api import TrainingJob, parse_trainingjob
from elastra.controller.decide.passplan import Observation, PassWrites, plan_pass
from elastra.controller.settings import OperatorSettings

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def node(name: str, *, gpus: int = 8, product: str = "NVIDIA-H100-80GB-HBM3") -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name}
    if gpus:
        labels["nvidia.com/gpu.product"] = product
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {},
        "status": {
            "allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


@dataclass
class FakeCluster:
    """Nodes, pods and one job; ``step`` runs a pass and applies it."""

    job_body: dict[str, Any]
    nodes: list[dict[str, Any]]
    settings: OperatorSettings = field(default_factory=OperatorSettings)
    now: datetime = T0
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: list[tuple[str, str]] = field(default_factory=list)
    status_written: datetime | None = None
    """When a pass last wrote the status (``pacing`` holds back counts written moments ago)."""
    requests: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The job's capacity-request pods (``placeholders``)."""
    others: list[dict[str, Any]] = field(default_factory=list)
    """Pods of other jobs and workloads (capacity the job does not have)."""

    @property
    def job(self) -> TrainingJob:
        return parse_trainingjob(self.job_body)

    def step(self, seconds: float = 1.0, *, refused: frozenset[str] = frozenset()) -> PassWrites:
        """One pass at the current time, applied; then time moves on.

        ``refused``: pods whose create the API server refuses. The pass then stops where the
        reconciler would: at a refused gated pod before the status; at the batch's last pod
        (created together with the status) after it, before any other write."""
        pods = list(self.pods.values())
        requests = list(self.requests.values())
        obs = Observation(
            self.job,
            pods,
            self.nodes,
            pods + requests + self.others,
            status_written=self.status_written,
            requests=requests,
        )
        plan = plan_pass(obs, self.settings, self.now)
        self._apply(plan, refused)
        self.now += timedelta(seconds=seconds)
        return plan

    def _apply(self, plan: PassWrites, refused: frozenset[str]) -> None:
        for name in plan.request_deletes:
            self.requests.pop(name, None)
        gated = [p for p in plan.creates if p["spec"].get("schedulingGates")]
        last = [p for p in plan.creates if not p["spec"].get("schedulingGates")]
        self._create([p for p in gated if p["metadata"]["name"] not in refused])
        if any(p["metadata"]["name"] in refused for p in gated):
            return
        self._create([p for p in last if p["metadata"]["name"] not in refused])
        last_refused = any(p["metadata"]["name"] in refused for p in last)
        if last_refused and not gated:
            return  # a lone pod is created before the status, which is then not written
        if plan.status_wait is None and plan.status.to_wire() != self.job_body.get("status"):
            self.job_body["status"] = plan.status.to_wire()
            self.status_written = self.now
        if last_refused:
            return
        for name in plan.deletes:
            self.pods.pop(name, None)
        for name, patch in plan.patches:
            meta = self.pods[name]["metadata"]
            meta["annotations"].update(patch["metadata"].get("annotations", {}))
            meta["labels"].update(patch["metadata"].get("labels", {}))
            meta["labels"] = {k: v for k, v in meta["labels"].items() if v is not None}
        for name in plan.ungate:
            self.pods[name]["spec"].pop("schedulingGates", None)
        self._create(list(plan.request_creates), into=self.requests)
        self.events.extend((e.reason, e.message) for e in plan.events)

    def _create(
        self, pods: list[dict[str, Any]], *, into: dict[str, dict[str, Any]] | None = None
    ) -> None:
        for pod in pods:
            created = copy.deepcopy(pod)
            created["metadata"]["creationTimestamp"] = self.stamp()
            created["status"] = {"phase": "Pending"}
            (self.pods if into is None else into)[created["metadata"]["name"]] = created

    def stamp(self) -> str:
        return self.now.strftime("%Y-%m-%dT%H:%M:%SZ")

    def schedule_and_run(self, *names: str) -> None:
        """What the scheduler and kubelet would do: bind ungated pods (those of ``names``, when
        given), make them Ready."""
        for name, pod in self.pods.items():
            spec = pod["spec"]
            if spec.get("schedulingGates") or pod["status"].get("phase") != "Pending":
                continue
            if names and name not in names:
                continue
            terms = spec["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"
            ]["nodeSelectorTerms"]
            spec["nodeName"] = terms[0]["matchFields"][0]["values"][0]
            pod["status"] = {
                "phase": "Running",
                "podIP": f"127.0.10.{len(spec['nodeName'])}",
                "conditions": [
                    {"type": "Ready", "status": "True", "lastTransitionTime": self.stamp()},
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": self.stamp()},
                ],
            }

    def fail(self, name: str, code: int) -> None:
        pod = self.pods[name]
        pod["status"] = {
            "phase": "Failed",
            "containerStatuses": [
                {"state": {"terminated": {"exitCode": code, "finishedAt": self.stamp()}}}
            ],
        }

    def converge(self, passes: int = 10) -> None:
        """Alternate operator passes and scheduler/kubelet until nothing changes."""
        for _ in range(passes):
            plan = self.step()
            self.schedule_and_run()
            quiet = not (plan.creates or plan.patches or plan.deletes or plan.ungate)
            if quiet and plan.requeue.is_never:
                return


def gpt_job(replicas: int, **spec: Any) -> dict[str, Any]:
    """A GPU job ``gpt`` (8 GPUs per pod) as the transcripts start from; ``spec`` overrides."""
    body: dict[str, Any] = {
        "replicas": replicas,
        "minReplicas": 1,
        "worker": {"gpus": 8, "image": "elastra-worker:dev"},
        "checkpoint": {"volume": "gpt-checkpoints"},
        "failurePolicy": {"maxRestarts": 3, "backoffSeconds": 0},
    }
    body.update(spec)
    return {
        "apiVersion": "elastra.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "gpt", "namespace": "default", "uid": "u-1", "generation": 1},
        "spec": body,
    }
