"""What the resize policy knows about each worker pod, reduced to what it decides on.

The controller classifies every pod of a job (from the pod object and the node inventory)
into a ``WorkerView``; the policy never sees a Kubernetes object. Classification lives here,
as a pure function of plain values, so the rules (what counts as lost, as failed, as
retryable) are tested without a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import NewType

PodName = NewType("PodName", str)
NodeName = NewType("NodeName", str)


class WorkerState(StrEnum):
    """The life of a worker pod as far as resizing is concerned."""

    GATED = "Gated"
    """Created, held back by the gang scheduling gate."""
    PENDING = "Pending"
    """Ungated, not yet running: being scheduled, pulling images, starting."""
    READY = "Ready"
    """Running and ready: can be (or is) in a world."""
    SUCCEEDED = "Succeeded"
    """Exited 0: training finished, or a stop it was asked for."""
    FAILED = "Failed"
    """Exited non-zero (see ``exit_code``)."""
    LOST = "Lost"
    """Evicted, deleted by someone, or its node is gone, NotReady or cordoned and drained."""
    TERMINATING = "Terminating"
    """Has a deletion timestamp: going away (preemption, drain, our own delete)."""

    @property
    def started(self) -> bool:
        """Ungated and not ended: runs, or is being scheduled or started (a retiring pod in
        these states is still checkpointing)."""
        return self in (WorkerState.READY, WorkerState.PENDING)

    @property
    def waiting(self) -> bool:
        """Created and not yet running: gated, or being scheduled or started."""
        return self in (WorkerState.GATED, WorkerState.PENDING)

    @property
    def alive(self) -> bool:
        """Runs or is on its way to: a failed job stops these; unless retiring, they are the
        pods a job keeps (placement counts them, a move may use them)."""
        return self.started or self is WorkerState.GATED

    @property
    def holds_gpus(self) -> bool:
        """Occupies its GPUs: alive, or terminating (the scheduler places no successor until
        it is gone, so a donor whose donated pod is still shutting down holds it)."""
        return self.alive or self is WorkerState.TERMINATING


@dataclass(frozen=True)
class WorkerView:
    """One worker pod, as the policy sees it.

    ``since`` is when the pod entered its state (creation time for gated or pending pods,
    the transition time otherwise); the policy compares it with the injected clock.
    """

    pod: PodName
    slot: int
    state: WorkerState
    since: datetime
    node: NodeName | None = None
    gpu_type: str | None = None
    exit_code: int | None = None
    unschedulable: bool = False
    retiring_since: datetime | None = None
    """When the pod was told to checkpoint and stop (it left the world); ``None``: it wasn't."""
    node_down: bool = False
    """Its node is gone or NotReady: a pod being deleted there is not running its trainers."""

    @property
    def dead(self) -> bool:
        """Its trainers are not running: they exited, or their node or pod is gone. A pod
        deleted gracefully on a live node is not: its agent checkpoints with its world."""
        if self.state is WorkerState.TERMINATING:
            return self.node_down
        return self.state in (WorkerState.FAILED, WorkerState.LOST)

    @property
    def healthy(self) -> bool:
        """Can take part in the next world."""
        return self.state is WorkerState.READY

    @property
    def broken(self) -> bool:
        """Can never take part again: it must be dropped from the world and replaced."""
        return self.state in (WorkerState.FAILED, WorkerState.LOST, WorkerState.TERMINATING)


@dataclass(frozen=True)
class NodeHealth:
    """What the classifier needs to know about the node a pod is bound to."""

    exists: bool
    ready: bool
    schedulable: bool

    @property
    def down(self) -> bool:
        """Gone or NotReady: its pods are lost (or, being deleted, not running)."""
        return not (self.exists and self.ready)


def classify(
    *,
    phase: str,
    ready: bool,
    gated: bool,
    deleting: bool,
    reason: str | None,
    node: NodeHealth | None,
) -> WorkerState:
    """The state of a pod from its phase and conditions and the health of its node.

    A pod whose node vanished or went NotReady is LOST at once: waiting for the node
    lifecycle controller to evict it (minutes) is exactly the hang Elastra exists to avoid.
    A cordoned node alone does not lose a running pod (drain does, by evicting it).
    """
    if deleting:
        return WorkerState.TERMINATING
    if phase == "Succeeded":
        return WorkerState.SUCCEEDED
    if phase == "Failed":
        return WorkerState.LOST if reason in ("Evicted", "Preempted") else WorkerState.FAILED
    if node is not None and node.down:
        return WorkerState.LOST
    if gated:
        return WorkerState.GATED
    if phase == "Running" and ready:
        return WorkerState.READY
    return WorkerState.PENDING
