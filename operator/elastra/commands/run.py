"""``elastra run``: run the operator (what the Helm chart's Deployment starts)."""

from __future__ import annotations

import argparse
import os
from datetime import timedelta
from typing import Any

from elastra.controller.settings import OperatorSettings, Toleration
from elastra.elastic.resize import ResizePolicy
from elastra.errors import UserError
from elastra.kube.config import load_connection


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
        "--lease-namespace",
        help="namespace of the elastra-operator Lease (default: $POD_NAMESPACE, else the "
        "kubeconfig's namespace); only the Lease holder writes",
    )
    parser.add_argument("--log-format", choices=["json", "plain"], default="json")
    parser.add_argument("--verbose", action="store_true", help="debug logging")
    parser.set_defaults(handler=run)


def parse_toleration(text: str) -> Toleration:
    """``key[=value][:Effect]`` as ``kubectl taint`` writes taints."""
    body, _, effect = text.partition(":")
    key, has_value, value = body.partition("=")
    effect = effect or "NoSchedule"
    if not key or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
        raise UserError(
            f"--toleration {text!r}: expected KEY[=VALUE][:EFFECT] with EFFECT one of "
            "NoSchedule, PreferNoSchedule, NoExecute"
        )
    return Toleration(key=key, value=value if has_value else None, effect=effect)


def run(args: argparse.Namespace) -> int:
    """Start the operator; returns when interrupted."""
    # Kopf is imported only here: every other command starts without paying for it.
    from elastra.controller.operator import RunOptions  # noqa: PLC0415
    from elastra.controller.operator import run as run_operator  # noqa: PLC0415

    settings = OperatorSettings(
        namespace=args.namespace,
        tolerations=tuple(parse_toleration(t) for t in args.toleration),
        resync=timedelta(seconds=args.resync_seconds),
        termination_grace_seconds=args.grace_seconds,
        policy=ResizePolicy(
            settle=timedelta(seconds=args.settle_seconds),
            pending_grace=timedelta(seconds=args.pending_grace_seconds),
            cooldown=timedelta(seconds=args.cooldown_seconds),
            retire_timeout=timedelta(seconds=args.retire_timeout_seconds),
        ),
    )
    connection = load_connection(args.kubeconfig)
    options = RunOptions(
        connection=connection,
        lease_namespace=args.lease_namespace
        or os.environ.get("POD_NAMESPACE")
        or connection.namespace,
        settings=settings,
        metrics_port=args.metrics_port,
        health_port=args.health_port,
        peering=args.peering,
        priority=args.priority,
        json_logs=args.log_format == "json",
        verbose=args.verbose,
    )
    run_operator(options)
    return 0
