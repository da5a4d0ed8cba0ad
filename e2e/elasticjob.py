"""Drive the cpu-tiny TrainingJob on a real cluster and collect what its workers recorded.

Why: the e2e suite and `make demo` do the same things to the job (apply the example, wait
for a world of a given size to train, `kubectl scale`, read the step log and the worker logs)
and must wait on conditions with deadlines, never for a fixed time. Worker pods start slowly
(the worker image imports torch's CUDA build: 10-60 s on a busy machine), so the deadlines
are minutes, and every timeout says what the job and its pods looked like.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from e2e.install import EXAMPLE, Setup
from e2e.kube import Kubectl, KubeError, wait_for
from e2e.trainlog import StepRecord, check_data_order, parse_step_log

STEP_LOG = "/checkpoints/steps.jsonl"
POD_START_S = 420.0  # pods of the 5 GB worker image, torch import, rendezvous, on 2 busy cores
WORKER_TAIL_LINES = 40  # per worker pod in a timeout's picture: a stuck rank's stack dump fits


RUNNING_STEPS = 100_000
"""Steps of the cpu-tiny job the suite and the demo drive: they act on a job that is still
training. As shipped it trains 400 steps, which a world of two finishes in under a minute on a
quiet machine; a CI run's replacement worker came after the job had ended."""


def example_job(
    namespace: str, example: Path = EXAMPLE, *, steps: int | None = None
) -> dict[str, Any]:
    """An example (examples/cpu-tiny.yaml unless told) as shipped, placed in ``namespace``;
    with ``steps``, its trainer's ``--steps`` and ``training.totalSteps`` set to that."""
    job: dict[str, Any] = copy.deepcopy(yaml.safe_load(example.read_text()))
    job["metadata"]["namespace"] = namespace
    if steps is not None:
        job["spec"]["training"]["totalSteps"] = steps
        args: list[str] = job["spec"]["worker"]["args"]
        args[args.index("--steps") + 1] = str(steps)
    return job


@dataclass
class JobRun:
    """One TrainingJob: its status, pods, the world versions seen, and its workers' logs."""

    kube: Kubectl
    namespace: str
    name: str
    versions: list[int] = field(default_factory=list)
    pod_logs: dict[str, str] = field(default_factory=dict)
    """Logs per pod uid, kept after the pod is gone (snapshot before deleting a pod)."""
    operator: str | None = None
    """"namespace/deployment" of the operator, whose lines about the job timeouts show."""

    # ---- reading ----------------------------------------------------------------------

    def job(self) -> dict[str, Any]:
        found: dict[str, Any] = self.kube.get("trainingjob", self.name, "-n", self.namespace)
        return found

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = self.job().get("status") or {}
        world = status.get("world") or {}
        version = int(world.get("version") or 0)
        if version and (not self.versions or self.versions[-1] != version):
            self.versions.append(version)
        return status

    def pods(self) -> list[dict[str, Any]]:
        return self.kube.items("pods", "-n", self.namespace, "-l", f"elastra.dev/job={self.name}")

    def running_pods(self) -> list[dict[str, Any]]:
        return [
            p
            for p in self.pods()
            if (p.get("status") or {}).get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
        ]

    def describe(self) -> str:
        """A picture of the job for timeout messages: conditions with their messages, the last
        resizes, the pods (deleting ones marked), the job's newest events and the last lines of
        each worker's log, so a failure in CI says why the operator and the workers did what
        they did."""
        try:
            status = self.status()
            found = self.pods()
            pods = [
                f"{p['metadata']['name']}:{(p.get('status') or {}).get('phase')}"
                + (":deleting" if p["metadata"].get("deletionTimestamp") else "")
                for p in found
            ]
            events = self.events()[-8:]
            said = self.operator_lines()[-12:]
            workers = self.worker_tails([p["metadata"]["name"] for p in found])
        except KubeError as err:
            return f"(cannot read the job: {err})"
        conditions = {
            c["type"]: f"{c['status']}/{c.get('reason')}: {c.get('message', '')}"[:160]
            for c in status.get("conditions") or []
        }
        picture = {
            "world": status.get("world"),
            "progress": status.get("progress"),
            "conditions": conditions,
            "resizes": (status.get("resizes") or [])[-3:],
            "pods": pods,
            "events": events,
            "operator": said,
            "workers": workers,
        }
        return json.dumps(picture, default=str)[:24000]

    def worker_tails(self, names: list[str]) -> dict[str, list[str]]:
        """The last lines of these worker pods' logs, by pod name (empty before it started)."""
        tail = f"--tail={WORKER_TAIL_LINES}"
        return {
            name: self.kube.kubectl(
                "logs", "-n", self.namespace, name, "-c", "worker", tail, check=False
            ).splitlines()
            for name in names
        }

    def operator_lines(self) -> list[str]:
        """The operator's log lines that name this job (none when the operator is unknown)."""
        if self.operator is None:
            return []
        namespace, deployment = self.operator.split("/", 1)
        text = self.kube.kubectl(
            "logs", "-n", namespace, f"deployment/{deployment}", "--tail=2000", check=False
        )
        return [line[:300] for line in text.splitlines() if self.name in line]

    def events(self) -> list[str]:
        """The job's events, oldest first, as "time reason (xcount): message"."""
        found = self.kube.items(
            "events", "-n", self.namespace,
            "--field-selector", f"involvedObject.name={self.name},involvedObject.kind=TrainingJob",
        )  # fmt: skip
        found.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        return [
            f"{e.get('lastTimestamp') or e.get('eventTime')} {e.get('reason')}"
            f" (x{e.get('count') or 1}): {str(e.get('message'))[:200]}"
            for e in found
        ]

    def step_log(self) -> list[StepRecord]:
        """Rank 0's step log on the shared checkpoint volume, read through a running worker."""
        for pod in self.running_pods():
            out = self.kube.kubectl(
                "exec", "-n", self.namespace, pod["metadata"]["name"], "-c", "worker", "--",
                "cat", STEP_LOG, check=False,
            )  # fmt: skip
            if out:
                return parse_step_log(complete_lines(out))
        return []

    def check_data_order(self, records: list[StepRecord], *, dataset_size: int) -> int:
        """Every step's samples are a static run's, for the seed and global batch size in the
        job's spec (trainlog.check_data_order); returns how many steps were checked."""
        training = self.job()["spec"]["training"]
        return check_data_order(
            records,
            seed=int(training["seed"]),
            dataset_size=dataset_size,
            global_batch_size=int(training["globalBatchSize"]),
        )

    def snapshot_logs(self) -> dict[str, str]:
        """Fetch every worker pod's log now (kept by uid); returns all logs seen so far."""
        for pod in self.pods():
            uid, name = pod["metadata"]["uid"], pod["metadata"]["name"]
            text = self.kube.kubectl("logs", "-n", self.namespace, name, check=False)
            if text and len(text) >= len(self.pod_logs.get(uid, "")):
                self.pod_logs[uid] = text
        return self.pod_logs

    def log_lines(self) -> list[str]:
        return [line for text in self.snapshot_logs().values() for line in text.splitlines()]

    # ---- waiting ----------------------------------------------------------------------

    def wait_world(self, size: int, *, after: int, timeout: float = POD_START_S) -> int:
        """A world of ``size`` with a version above ``after`` is Running; returns its version."""

        def probe() -> int | None:
            status = self.status()
            world = status.get("world") or {}
            version, running = int(world.get("version") or 0), _running(status)
            return version if version > after and world.get("size") == size and running else None

        return wait_for(
            f"{self.name}: a running world of {size} newer than version {after}",
            probe, timeout=timeout, interval=1, hint=self.describe,
        )  # fmt: skip

    def wait_trained(self, version: int, steps: int, *, timeout: float = POD_START_S) -> int:
        """World ``version`` (or a newer one) trained ``steps`` steps; returns the last step."""

        def probe() -> int | None:
            self.status()  # keeps the record of world versions seen
            records = [r for r in self.step_log() if r.world_version >= version]
            return records[-1].step if len(records) >= steps else None

        return wait_for(
            f"{self.name}: {steps} steps trained by world version {version} or newer",
            probe, timeout=timeout, interval=2, hint=self.describe,
        )  # fmt: skip

    def wait_for_log(self, text: str, *, after: int, timeout: float = POD_START_S) -> int:
        """More than ``after`` worker log lines contain ``text``; returns how many do."""

        def probe() -> int | None:
            count = sum(text in line for line in self.log_lines())
            return count if count > after else None

        return wait_for(
            f"{self.name}: a worker log line with {text!r}",
            probe, timeout=timeout, interval=2, hint=self.describe,
        )  # fmt: skip

    # ---- acting -----------------------------------------------------------------------

    def scale(self, replicas: int) -> None:
        self.kube.kubectl(
            "scale", f"trainingjob/{self.name}", "-n", self.namespace, f"--replicas={replicas}"
        )

    def delete(self, timeout: float = 300) -> None:
        """Delete the job and wait until its pods are gone (they checkpoint on SIGTERM)."""
        self.kube.kubectl(
            "delete", "trainingjob", self.name, "-n", self.namespace, "--ignore-not-found",
            "--wait=false",
        )  # fmt: skip
        wait_for(
            f"{self.name}: its worker pods to be gone",
            lambda: self.pods() == [], timeout=timeout, interval=2, hint=self.describe,
        )  # fmt: skip


def _running(status: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Running" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def complete_lines(text: str) -> str:
    """Drop a last line rank 0 is still writing (no newline yet)."""
    return text if text.endswith("\n") else text.rsplit("\n", 1)[0]


@dataclass
class Elastra:
    """The installed operator and the cpu-tiny job of one run."""

    kube: Kubectl
    setup: Setup
    job: JobRun
    installed: bool = True
    install_warnings: str = ""
    """helm install's stderr."""
