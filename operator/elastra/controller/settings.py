"""How this operator instance runs: what every reconcile pass reads but no spec sets.

One frozen value built from the command line (``elastra run --help`` documents each flag)
and handed to the handlers through Kopf's memo, so nothing reads globals or the environment
in the middle of a decision.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from elastra.elastic.resize import ResizePolicy


@dataclass(frozen=True)
class Toleration:
    """A toleration added to every worker pod (e.g. for GPU nodes' taints)."""

    key: str
    value: str | None = None
    effect: str = "NoSchedule"

    def to_wire(self) -> dict[str, str]:
        """The pod-spec form."""
        if self.value is None:
            return {"key": self.key, "operator": "Exists", "effect": self.effect}
        return {"key": self.key, "operator": "Equal", "value": self.value, "effect": self.effect}


GPU_TOLERATION = Toleration(key="nvidia.com/gpu")
"""GPU nodes are commonly tainted so that only GPU pods land there."""


@dataclass(frozen=True)
class OperatorSettings:
    """Knobs of one operator instance."""

    namespace: str | None = None
    """Watch one namespace, or all when ``None``."""
    tolerations: tuple[Toleration, ...] = ()
    """Extra tolerations for worker pods (the local kwok fleet needs one)."""
    resync: timedelta = timedelta(seconds=300)
    """Longest time between two passes over a job when nothing happens.

    A safety net only: watch events on the job, its pods and the nodes wake a job, and every
    timed step of the policy (settle window, pending grace, cooldown, retire timeout, backoff)
    asks for its own pass. Each pass reads the job and lists its pods, so 300 jobs resyncing
    every 30 s spent most of what a small API server serves on polling.
    """
    termination_grace_seconds: int = 120
    """Time a worker has to checkpoint after SIGTERM before it is killed."""
    master_port_base: int = 29500
    """World version v rendezvouses on port base + v % 1000: never a stale port."""
    metrics_port: int = 9400
    """Port of each worker's Prometheus endpoint."""
    skip_metrics_labels: tuple[str, ...] = ("type=kwok",)
    """Pods on nodes with one of these labels are simulated: never read their metrics."""
    policy: ResizePolicy = field(default_factory=ResizePolicy)
    restart_seconds: float = 60.0
    """What a resize costs (stop, checkpoint, restart, load) when weighing growth."""
    concurrency: int = 16
    """Requests in flight per pass when creating or patching many pods."""
