"""When a node that still looks Ready is lost: its workers are silent, and its Lease is overdue
or a world with workers there lost a member.

Why: the node controller marks a node whose kubelet stopped reporting NotReady only after its
grace period (``--node-monitor-grace-period``, 40 s or more), and until then the node's pods
look Running while their peers block in a collective on them. Three faster signals exist, and
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
- A collective that failed: when a member's processes die with its node, their connections
  close and the survivors' collectives fail at once; each survivor's agent then exports
  the world version that failed (``PEERS_LOST_METRIC``) while it waits for the world of
  survivors. The operator asks one worker of every job each round for it (one on another
  node too when that one is silent), so a world that lost a member is known within a round,
  long before the Lease is overdue. Alone it says a member is gone, not which, nor whether
  its node is (an OOM-killed pod breaks the collectives as well).

A node is declared lost when its Lease is overdue and none of its workers answered for
``SILENT_AFTER``, or, sooner, when a world with workers on it reported a failed collective and
none of the node's workers answered for ``SILENT_AFTER_PEERS_LOST`` (longer, so a pod that
merely died is reported terminated by its kubelet before then and is no worker to ask). A
node whose kubelet is slow while its pods answer is kept; a node whose Lease is renewed after
it was declared is read as it is again. Nodes with no Lease, or with no worker the operator
can ask (a simulated node), are left to the node controller as before. Pure: the operator's
``controller/engine/nodeliveness.py`` reads the Leases, asks the workers and applies the
verdict.
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
SILENT_AFTER_PEERS_LOST = timedelta(seconds=3)
"""The same while the node's Lease is fresh, after a failed collective: one round more, for
the kubelet of a node that lives to report its dead pod terminated (about a second), which
takes that pod out of the node's workers."""
PEERS_LOST_METRIC = "elastra_worker_peers_lost_world_version"
"""The agent's gauge: the world version whose collectives failed in its pod (absent while
none did). The same name as ``elastra_worker.metrics.PEERS_LOST_METRIC``; a test holds both."""


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
    peers_lost: bool = False
    """A world with workers on the node reported a failed collective (a member gone)."""


@dataclass(frozen=True)
class Lost:
    """A node declared lost, and why (the message of the Node's Event and the log)."""

    node: str
    lease_age: timedelta
    silent_for: timedelta
    workers: int
    peers_lost: bool = False
    """Declared on a failed collective before its Lease was overdue."""

    @property
    def message(self) -> str:
        """One line: the signals and their thresholds."""
        silent = (
            f"its {self.workers} worker pod(s) silent for {self.silent_for.total_seconds():.0f} s"
        )
        lease = f"Lease not renewed for {self.lease_age.total_seconds():.0f} s"
        if self.peers_lost:
            why = (
                f"node {self.node}: a world with workers on it reported a failed collective and "
                f"{silent} ({lease}; threshold: silent after "
                f"{SILENT_AFTER_PEERS_LOST.total_seconds():.0f} s)"
            )
        else:
            why = (
                f"node {self.node}: {lease} and {silent} (thresholds: Lease overdue after 0.3 "
                f"of its duration, workers silent after {SILENT_AFTER.total_seconds():.0f} s)"
            )
        return f"{why}: its pods are counted lost before the node controller marks it NotReady"


def lease_overdue(signals: NodeSignals, now: datetime) -> bool:
    """The node's kubelet missed a Lease renewal (its workers are worth asking)."""
    if signals.renewed is None:
        return False
    return now - signals.renewed > lease_overdue_after(signals.duration)


def node_lost(node: str, signals: NodeSignals, now: datetime) -> Lost | None:
    """The verdict on one node: ``Lost`` when its workers are silent long enough after its
    Lease went overdue, or after a world with workers there reported a failed collective."""
    if signals.renewed is None or signals.workers == 0 or signals.silent_since is None:
        return None
    silent_for = now - signals.silent_since
    overdue = lease_overdue(signals, now)
    by_lease = overdue and silent_for >= SILENT_AFTER
    by_peers = signals.peers_lost and silent_for >= SILENT_AFTER_PEERS_LOST
    if not (by_lease or by_peers):
        return None
    return Lost(
        node=node,
        lease_age=now - signals.renewed,
        silent_for=silent_for,
        workers=signals.workers,
        peers_lost=not by_lease,
    )


def peers_lost_version(page: str) -> int | None:
    """The world version a worker's metrics page says lost a member, or ``None``."""
    for line in page.splitlines():
        name, _, value = line.partition(" ")
        if name == PEERS_LOST_METRIC:
            try:
                return int(float(value))
            except (ValueError, OverflowError):  # not a number, or NaN/inf: no version
                return None
    return None


def silence(previous: datetime | None, *, answered: bool, probed_at: datetime) -> datetime | None:
    """Update a node's ``silent_since`` after a round of probes made at ``probed_at``: any
    answer clears it; no answer keeps the first unanswered round's time."""
    if answered:
        return None
    return previous if previous is not None else probed_at
