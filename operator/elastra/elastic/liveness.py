"""When a node that still looks Ready is lost: its Lease is overdue and its workers are silent.

Why: the node controller marks a node whose kubelet stopped reporting NotReady only after its
grace period (``--node-monitor-grace-period``, 40 s or more), and until then the node's pods
look Running while their peers block in a collective on them. Two faster signals exist, and
each alone gives false alarms:

- The node's Lease (``kube-node-lease/<node>``): the kubelet renews it every quarter of its
  ``leaseDurationSeconds`` (10 s of 40 s by default, with a few percent of jitter). One
  renewal missed (``lease_overdue_after``: 0.3 of the duration, 12 s) means the kubelet
  did not reach the API server, but a kubelet that is slow, restarting or cut off from the
  API server leaves its pods training.
- The workers' heartbeats: each worker pod's agent answers on its metrics port whatever its
  trainers do (a pod on a lost node answers nothing). The operator asks the workers of a
  node whose Lease is overdue, every ``PROBE_INTERVAL``, each within ``PROBE_TIMEOUT``; a
  worker the operator cannot reach for a moment (a busy network) is not gone either.

A node is declared lost only when both say so: its Lease overdue and none of its workers
answering for ``SILENT_AFTER``. A node whose kubelet is slow while its pods answer is kept;
a node that renews its Lease again is never lost, whatever its workers said. Nodes with no
Lease, or with no worker the operator can ask (a simulated node), are left to the node
controller as before. Pure: the operator's ``controller/engine/nodeliveness.py`` reads the
Leases, asks the workers and applies the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

NODE_UNRESPONSIVE = "NodeUnresponsive"
"""The reason of a lost node's Warning Event, and of the Ready condition the operator reads
it with until the node controller's own condition says the same."""
DEFAULT_LEASE_DURATION = timedelta(seconds=40)
"""The kubelet's default ``nodeLeaseDurationSeconds``; used when a Lease does not say."""
LEASE_OVERDUE_FRACTION = 0.3
"""The kubelet renews at 0.25 of the duration (plus up to 4 % jitter): 0.3 is one renewal
missed with 2 s to spare at the default duration (10 s renewals, overdue after 12 s)."""
PROBE_INTERVAL = timedelta(seconds=1)
"""How often the workers of a node whose Lease is overdue are asked for a heartbeat."""
PROBE_TIMEOUT = timedelta(seconds=1)
"""How long one heartbeat request may take before it counts as no answer."""
SILENT_AFTER = timedelta(seconds=2)
"""How long none of a node's workers may answer before they count as silent: three probes
missed, so one lost packet or a worker busy for a second is not silence."""


def lease_overdue_after(duration: timedelta | None) -> timedelta:
    """How long after its last renewal a Lease of ``duration`` missed one."""
    return (duration or DEFAULT_LEASE_DURATION) * LEASE_OVERDUE_FRACTION


@dataclass(frozen=True)
class NodeSignals:
    """What the operator knows of one node's liveness beyond its Ready condition."""

    renewed: datetime | None
    """The Lease's ``renewTime``; ``None``: no Lease (never declared lost by this module)."""
    duration: timedelta | None = None
    """The Lease's ``leaseDurationSeconds``; ``None``: the kubelet's default."""
    workers: int = 0
    """Worker pods on the node the operator can ask (0: no heartbeat to consult)."""
    silent_since: datetime | None = None
    """Since when none of them answered (the first unanswered probe after the last answer);
    ``None``: one answered at the last probe, or none was asked yet."""


@dataclass(frozen=True)
class Lost:
    """A node declared lost, and why (the message of the Node's Event and the log)."""

    node: str
    lease_age: timedelta
    silent_for: timedelta
    workers: int

    @property
    def message(self) -> str:
        """One line: the two signals and their thresholds."""
        return (
            f"node {self.node}: Lease not renewed for {self.lease_age.total_seconds():.0f} s "
            f"and its {self.workers} worker pod(s) silent for "
            f"{self.silent_for.total_seconds():.0f} s (thresholds: Lease overdue after 0.3 of "
            f"its duration, workers silent after {SILENT_AFTER.total_seconds():.0f} s): "
            "its pods are counted lost before the node controller marks it NotReady"
        )


def lease_overdue(signals: NodeSignals, now: datetime) -> bool:
    """The node's kubelet missed a Lease renewal (its workers are worth asking)."""
    if signals.renewed is None:
        return False
    return now - signals.renewed > lease_overdue_after(signals.duration)


def node_lost(node: str, signals: NodeSignals, now: datetime) -> Lost | None:
    """The verdict on one node: ``Lost`` when its Lease is overdue and its workers silent."""
    if signals.renewed is None or not lease_overdue(signals, now) or signals.workers == 0:
        return None
    if signals.silent_since is None or now - signals.silent_since < SILENT_AFTER:
        return None
    return Lost(
        node=node,
        lease_age=now - signals.renewed,
        silent_for=now - signals.silent_since,
        workers=signals.workers,
    )


def silence(previous: datetime | None, *, answered: bool, probed_at: datetime) -> datetime | None:
    """Update a node's ``silent_since`` after a round of probes made at ``probed_at``: any
    answer clears it; no answer keeps the first unanswered round's time."""
    if answered:
        return None
    return previous if previous is not None else probed_at
