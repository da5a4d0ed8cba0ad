"""How this operator instance runs: what every reconcile pass reads but no spec sets.

One frozen value built from the command line (``elastra run --help`` documents each flag)
and handed to the handlers through Kopf's memo, so nothing reads globals or the environment
in the middle of a decision.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from elastra.api.podtemplate import DEFAULT_CACHE_SIZE
from elastra.elastic.resize import ResizePolicy
from elastra.elastic.share import Scope
from elastra.planner.scheduling import PodToleration


@dataclass(frozen=True)
class PodPeer:
    """Pods of one namespace with these labels (none: every pod of the namespace).

    A job's NetworkPolicy lets such pods, and no others outside the job, reach the workers'
    metrics port: the operator's own (it reads rank 0's /metrics to judge a resize; the chart
    passes its release namespace and pod labels) and any scraper the installer lists.
    """

    namespace: str
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class OperatorSettings:
    """Knobs of one operator instance."""

    namespace: str | None = None
    """Watch one namespace, or all when ``None``."""
    tolerations: tuple[PodToleration, ...] = ()
    """Extra tolerations for worker pods (the local kwok fleet needs one)."""
    resync: timedelta = timedelta(seconds=300)
    """Longest time between two passes over a job when nothing happens.

    A safety net only: watch events on the job, its pods and the nodes wake a job, and every
    timed step of the policy (settle window, pending grace, cooldown, retire timeout, backoff)
    asks for its own pass. A pass reads the informers' caches, so a resync costs CPU, not
    API requests (it writes only what changed).
    """
    watch_timeout: timedelta = timedelta(seconds=600)
    """Each informer's watch asks the server to end it after between half this and this; it
    is then reopened from where it was (one request). Bookmarks keep it resumable."""
    termination_grace_seconds: int = 120
    """Time a worker has to checkpoint after SIGTERM before it is killed."""
    master_port_base: int = 29500
    """World version v rendezvouses on port base + v % 1000: never a stale port."""
    metrics_port: int = 9400
    """Port of each worker's Prometheus endpoint."""
    skip_metrics_labels: tuple[str, ...] = ("type=kwok",)
    """Pods on nodes with one of these labels are simulated: never read their metrics."""
    assignment_public_key: str = ""
    """The public key of pushed assignments' signatures, in every worker's environment
    (``decide.assignment_key``; set by the running operator); empty: pods take no pushes."""
    policy: ResizePolicy = field(default_factory=ResizePolicy)
    restart_seconds: float = 60.0
    """What a resize costs (stop, checkpoint, restart, load) when weighing growth."""
    concurrency: int = 16
    """Requests in flight per pass when creating or patching many pods."""
    passes_at_once: int = 8
    """Reconcile passes that run at the same time, across all jobs (controller-runtime's
    ``MaxConcurrentReconciles``). A pass holds its observation, its plans and its view of free
    capacity until its writes return; unbounded, 3,000 jobs started together interleaved
    3,000 passes at their awaits, held 4 GiB and planned onto the same free GPUs, and no pass
    reached its writes in two minutes. A few at once keep the API busy and the rest queued."""
    network_policy: bool = True
    """Create a NetworkPolicy per job that isolates its workers (off where the cluster's CNI
    enforces none or the users manage their own)."""
    metrics_peers: tuple[PodPeer, ...] = ()
    """Pods let in to the workers' metrics port: the operator's own when it runs in the
    cluster (outside, its reads come from no pod a policy can name), then Prometheus or other
    scrapers the installer names."""
    worker_tmp_size: str = "1Gi"
    """sizeLimit of each worker's /tmp: the root file system is read-only, so scratch files,
    HOME and the torch compiler caches live there, and a runaway writer is evicted instead of
    filling the node's disk."""
    worker_cache_size: str = DEFAULT_CACHE_SIZE
    """sizeLimit of each worker's cache volume (``HF_HOME``, ``TORCH_HOME``), which a 1Gi /tmp
    could not hold; a job's ``spec.worker.cacheSize`` overrides it."""
    sharing: Scope = Scope.NAMESPACE
    """Which jobs give GPUs to a job starved below its minimum (``elastra.elastic.share``):
    none, those of its namespace, or those of every namespace; never one of higher priority."""
    capacity_requests: bool = True
    """Ask the cluster's autoscaler for nodes when a job wants more workers than the nodes hold:
    capacity-request pods, one per missing worker (``capacity_requests``; docs/autoscaling.md)."""
    capacity_request_timeout: timedelta = timedelta(seconds=600)
    """How long a capacity request may go unanswered (a pod not bound, or bound to a node the
    job cannot use) before it is withdrawn and reported."""
    capacity_request_priority_class: str = "elastra-capacity-request"
    """The PriorityClass of capacity-request pods: below every default pod's priority and with
    ``preemptionPolicy: Never`` (a pod may not set that itself), so they never evict anyone."""
