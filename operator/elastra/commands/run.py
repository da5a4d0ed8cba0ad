"""``elastra run``: run the operator (what the Helm chart's Deployment starts)."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

from elastra.api.formats import DNS_LABEL, SIZE, is_zero_size
from elastra.controller.settings import OperatorSettings, PodPeer
from elastra.elastic.resize import ResizePolicy
from elastra.elastic.share import Scope
from elastra.errors import UserError
from elastra.kube import resources
from elastra.kube.client import Kube, RetryPolicy
from elastra.kube.config import Connection, load_connection
from elastra.planner.scheduling import PodToleration

MIN_KEY_BYTES = 16
"""The shortest ``--assignment-key-file`` seed taken: shorter is guessable."""


def register(sub: Any) -> None:
    """Add the ``run`` subcommand."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "run",
        help="run the operator against the current cluster",
        description=(
            "Run the Elastra operator: watch TrainingJobs, plan and place their workers, "
            "resize worlds. Uses --kubeconfig, $KUBECONFIG or the pod's service account."
        ),
    )
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG)")
    parser.add_argument("--context", help="kubeconfig context (default: its current-context)")
    parser.add_argument("--namespace", help="watch one namespace (default: all)")
    parser.add_argument(
        "--toleration",
        action="append",
        default=[],
        metavar="KEY[=VALUE][:EFFECT]",
        help="add a toleration to every worker pod (repeatable), e.g. "
        "kwok.x-k8s.io/node=fake:NoSchedule for simulated nodes",
    )
    parser.add_argument(
        "--resync-seconds",
        type=int,
        default=300,
        metavar="S",
        help=(
            "longest time between passes over a job (default 300; watch events and the "
            "policy's timers wake a job sooner)"
        ),
    )
    parser.add_argument(
        "--passes-at-once",
        type=_positive,
        default=OperatorSettings.passes_at_once,
        metavar="N",
        help=(
            f"reconcile passes that run at the same time across all jobs (default "
            f"{OperatorSettings.passes_at_once}; the rest wait their turn)"
        ),
    )
    parser.add_argument(
        "--grace-seconds",
        type=int,
        default=120,
        metavar="S",
        help="workers' termination grace period, to checkpoint (default 120)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=8080,
        help="Prometheus /metrics port, 0 to disable (default 8080)",
    )
    parser.add_argument(
        "--assignment-key-file",
        metavar="PATH",
        help=(
            "file holding the seed of the key pair that signs assignments pushed to workers "
            "(the pods get its public key); without it, a key pair of this run only: after a "
            "restart, running jobs' pods learn assignments from their file alone"
        ),
    )
    parser.add_argument(
        "--health-port",
        type=int,
        default=8081,
        help="liveness /healthz port, 0 to disable (default 8081)",
    )
    parser.add_argument(
        "--peering",
        metavar="NAME",
        help="ClusterKopfPeering to join: only the highest priority runs",
    )
    parser.add_argument(
        "--priority", type=int, default=0, help="peering priority (the chart's operator uses 100)"
    )
    parser.add_argument(
        "--settle-seconds",
        type=float,
        default=2.0,
        metavar="S",
        help="wait this long after a worker breaks for others of the burst",
    )
    parser.add_argument(
        "--pending-grace-seconds",
        type=float,
        default=60.0,
        metavar="S",
        help="give up a pod the scheduler cannot place after this (default 60)",
    )
    parser.add_argument(
        "--cooldown-seconds",
        type=float,
        default=30.0,
        metavar="S",
        help="no growth within this time of the last resize (default 30)",
    )
    parser.add_argument(
        "--retire-timeout-seconds",
        type=float,
        default=120.0,
        metavar="S",
        help="delete a worker told to stop after this even if it did not exit",
    )
    parser.add_argument(
        "--join-timeout-seconds",
        type=float,
        default=240.0,
        metavar="S",
        help="drop a member of a forming world that has not started this long after a running "
        "member began waiting for it (default 240; keep it below the workers' rendezvous "
        "timeout, 300)",
    )
    parser.add_argument(
        "--lease-namespace",
        help="namespace of the elastra-operator Lease (default: $POD_NAMESPACE, else the "
        "kubeconfig's namespace); only the Lease holder writes",
    )
    parser.add_argument(
        "--no-create-lease",
        dest="create_lease",
        action="store_false",
        help="never create the Lease, only take and renew it: whoever installed the operator "
        "owns it (the Helm chart does, so that helm uninstall removes it)",
    )
    parser.add_argument(
        "--no-network-policy",
        dest="network_policy",
        action="store_false",
        help="create no NetworkPolicy per job (for CNIs that enforce none, or users who "
        "manage their own); by default a job's workers accept traffic only from their job and, "
        "on the metrics port, from the operator's pods",
    )
    parser.add_argument(
        "--operator-pod-labels",
        default=os.environ.get(OPERATOR_LABELS_ENV, ""),
        metavar="K=V,...",
        help="labels of the operator's pods, let in to the workers' metrics port by the "
        f"NetworkPolicy, in the namespace $POD_NAMESPACE (default: ${OPERATOR_LABELS_ENV}, "
        "which the chart sets; empty: no pod is, as for an operator outside the cluster)",
    )
    parser.add_argument(
        "--metrics-peer",
        action="append",
        default=[],
        type=parse_peer,
        metavar="NAMESPACE[/K=V,...]",
        help="also let these pods in to the workers' metrics port (repeatable), e.g. "
        "monitoring/app.kubernetes.io/name=prometheus; no labels: every pod of the namespace",
    )
    parser.add_argument(
        "--worker-tmp-size",
        type=_size,
        default=OperatorSettings.worker_tmp_size,
        metavar="QUANTITY",
        help="sizeLimit of each worker's /tmp, where HOME and torch's caches live: the root "
        f"file system is read-only (default {OperatorSettings.worker_tmp_size})",
    )
    parser.add_argument(
        "--worker-cache-size",
        type=_size,
        default=OperatorSettings.worker_cache_size,
        metavar="QUANTITY",
        help="sizeLimit of each worker's cache volume, where HF_HOME and TORCH_HOME point, "
        "unless the job sets spec.worker.cacheSize "
        f"(default {OperatorSettings.worker_cache_size})",
    )
    parser.add_argument(
        "--sharing",
        choices=[scope.value for scope in Scope],
        default=OperatorSettings.sharing.value,
        help="which jobs give GPUs to a job starved below its minReplicas: off, those of its "
        "namespace, or those of the whole cluster; never a job of higher priority "
        f"(PriorityClass value) than the starved one (default {OperatorSettings.sharing.value})",
    )
    parser.add_argument(
        "--capacity-requests",
        choices=["on", "off"],
        default="on" if OperatorSettings.capacity_requests else "off",
        help="when a job wants more workers than the nodes hold, ask the cluster's autoscaler "
        "(Cluster Autoscaler, Karpenter, GKE node auto-provisioning) for nodes with one pending "
        "capacity-request pod per missing worker (default on; docs/autoscaling.md)",
    )
    parser.add_argument(
        "--capacity-request-timeout-seconds",
        type=_positive,
        default=int(OperatorSettings.capacity_request_timeout.total_seconds()),
        metavar="S",
        help="withdraw and report a capacity request no autoscaler answered with usable nodes "
        "within this time (default %(default)s)",
    )
    parser.add_argument(
        "--capacity-request-priority-class",
        default=OperatorSettings.capacity_request_priority_class,
        metavar="NAME",
        help="PriorityClass of capacity-request pods, created if missing (value -1, "
        "preemptionPolicy Never) (default %(default)s)",
    )
    parser.add_argument("--log-format", choices=["json", "plain"], default="json")
    parser.add_argument("--verbose", action="store_true", help="debug logging")
    parser.set_defaults(handler=run)


OPERATOR_LABELS_ENV = "ELASTRA_OPERATOR_POD_LABELS"


def _positive(text: str) -> int:
    """A whole number of at least 1 (argparse reports the error)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return int(text)


def _size(text: str) -> str:
    """A Kubernetes quantity of bytes such as 512Mi or 2Gi (argparse reports the error)."""
    if not re.match(SIZE, text) or is_zero_size(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 512Mi or 2Gi")
    return text


def parse_labels(text: str) -> tuple[tuple[str, str], ...]:
    """``k=v,k=v`` (empty: none) as pairs; ``ValueError`` names what is wrong."""
    pairs = [item.partition("=") for item in text.split(",")] if text else []
    if any(not key or not eq for key, eq, _ in pairs):
        raise ValueError(f"labels {text!r}: expected KEY=VALUE[,KEY=VALUE...]")
    return tuple((key, value) for key, _, value in pairs)


def parse_peer(text: str) -> PodPeer:
    """``namespace[/k=v,k=v]``: a namespace name holds no slash, so the first one splits."""
    namespace, _, labels = text.partition("/")
    if not re.match(DNS_LABEL, namespace):
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAMESPACE[/KEY=VALUE,...]")
    try:
        return PodPeer(namespace=namespace, labels=parse_labels(labels))
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r}: {err}") from None


def metrics_peers(args: argparse.Namespace, namespace: str | None) -> tuple[PodPeer, ...]:
    """The operator's own pods (when it knows its namespace and labels), then ``--metrics-peer``."""
    try:
        labels = parse_labels(args.operator_pod_labels)
    except ValueError as err:
        raise UserError(f"--operator-pod-labels: {err}") from None
    own = (PodPeer(namespace=namespace, labels=labels),) if namespace and labels else ()
    return (*own, *args.metrics_peer)


def parse_toleration(text: str) -> PodToleration:
    """``key[=value][:Effect]`` as ``kubectl taint`` writes taints."""
    body, _, effect = text.partition(":")
    key, has_value, value = body.partition("=")
    effect = effect or "NoSchedule"
    if not key or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
        raise UserError(
            f"--toleration {text!r}: expected KEY[=VALUE][:EFFECT] with EFFECT one of "
            "NoSchedule, PreferNoSchedule, NoExecute"
        )
    operator = "Equal" if has_value else "Exists"
    return PodToleration(key=key, operator=operator, value=value, effect=effect)


def read_assignment_key(path: str | None) -> bytes:
    """The key in ``path`` (empty without one); a missing, unreadable or empty file is the
    installer's mistake, said with the flag's name."""
    if path is None:
        return b""
    try:
        key = Path(path).read_bytes()
    except OSError as err:
        raise UserError(f"--assignment-key-file {path}: cannot read it: {err.strerror}") from None
    if len(key) < MIN_KEY_BYTES:
        raise UserError(
            f"--assignment-key-file {path}: holds {len(key)} bytes; a key needs at least "
            f"{MIN_KEY_BYTES} (the Helm chart makes one of 48 random characters)"
        )
    return key


async def _check_reachable(connection: Connection) -> None:
    """Fail at startup with one line (``UnreachableError``), not Kopf retrying in its logs."""
    async with Kube(connection, retry=RetryPolicy(attempts=3, budget_s=10.0)) as kube:
        await resources.server_version(kube)


def run(args: argparse.Namespace) -> int:
    """Start the operator; returns when interrupted."""
    # Kopf is imported only here: every other command starts without paying for it.
    from elastra.controller.engine.operator import RunOptions  # noqa: PLC0415
    from elastra.controller.engine.operator import run as run_operator  # noqa: PLC0415

    settings = OperatorSettings(
        namespace=args.namespace,
        tolerations=tuple(parse_toleration(t) for t in args.toleration),
        resync=timedelta(seconds=args.resync_seconds),
        termination_grace_seconds=args.grace_seconds,
        passes_at_once=args.passes_at_once,
        policy=ResizePolicy(
            settle=timedelta(seconds=args.settle_seconds),
            pending_grace=timedelta(seconds=args.pending_grace_seconds),
            cooldown=timedelta(seconds=args.cooldown_seconds),
            retire_timeout=timedelta(seconds=args.retire_timeout_seconds),
            join_timeout=timedelta(seconds=args.join_timeout_seconds),
        ),
        network_policy=args.network_policy,
        metrics_peers=metrics_peers(args, os.environ.get("POD_NAMESPACE")),
        worker_tmp_size=args.worker_tmp_size,
        worker_cache_size=args.worker_cache_size,
        sharing=Scope(args.sharing),
        capacity_requests=args.capacity_requests == "on",
        capacity_request_timeout=timedelta(seconds=args.capacity_request_timeout_seconds),
        capacity_request_priority_class=args.capacity_request_priority_class,
    )
    connection = load_connection(args.kubeconfig, context=args.context)
    asyncio.run(_check_reachable(connection))
    options = RunOptions(
        connection=connection,
        lease_namespace=args.lease_namespace
        or os.environ.get("POD_NAMESPACE")
        or connection.namespace,
        create_lease=args.create_lease,
        settings=settings,
        metrics_port=args.metrics_port,
        health_port=args.health_port,
        peering=args.peering,
        priority=args.priority,
        json_logs=args.log_format == "json",
        verbose=args.verbose,
        assignment_key=read_assignment_key(args.assignment_key_file),
    )
    run_operator(options)
    return 0
