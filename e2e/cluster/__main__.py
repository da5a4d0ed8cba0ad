"""Command line for the local test cluster: `python -m e2e.cluster up|down|status|...`.

Why: one entry point that `make cluster-up`/`cluster-down`/`fleet`, CI and developers share;
errors are one line that says what to do, progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from . import karpenter
from .api import WaitTimeoutError
from .controlplane import DEFAULT_FLEET, apply_fleet, down, status, toolchain_bindir, up
from .fleet import FleetError
from .state import ClusterDirs, ClusterError, default_layout

AUTOSCALER = "karpenter"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m e2e.cluster",
        description="A local Kubernetes control plane (etcd, kube-apiserver, "
        "kube-controller-manager, kube-scheduler) with kwok-simulated GPU nodes.",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        help="cluster folder (default: $ELASTRA_CLUSTER_DIR or <repo>/.cluster)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="start the cluster (safe when it already runs)")
    p_up.add_argument(
        "--fleet",
        default=DEFAULT_FLEET,
        help=f"fleet name in e2e/fleets or a path (default {DEFAULT_FLEET}); 'none' for no nodes",
    )
    p_up.add_argument(
        "--real-node",
        action="store_true",
        help="also start a real node here (containerd, kubelet, kube-proxy; needs root)",
    )
    p_up.add_argument(
        "--images",
        default="",
        help="with --real-node: images to build and import, comma-separated (worker,operator)",
    )
    p_up.add_argument(
        "--autoscaler",
        choices=["none", AUTOSCALER],
        default="none",
        help="also start Karpenter (kwok provider) with GPU instance types and a NodePool 'gpu' "
        "(built on first use, about 10 minutes)",
    )
    p_down = sub.add_parser("down", help="stop exactly the processes up started")
    p_down.add_argument("--purge", action="store_true", help="also delete logs and the PKI")
    sub.add_parser("status", help="print what runs (JSON); exit 1 when the cluster is not up")
    p_fleet = sub.add_parser("apply-fleet", help="make the fake nodes match a fleet file")
    p_fleet.add_argument("fleet", help="fleet name in e2e/fleets or a path")
    p_fleet.add_argument("--replace", action="store_true", help="recreate existing nodes too")
    sub.add_parser("bindir", help="print the toolchain bin dir (building it if needed)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    layout = ClusterDirs(args.dir.resolve()) if args.dir else default_layout()
    try:
        if args.command == "up":
            up(
                layout,
                fleet=None if args.fleet == "none" else args.fleet,
                real_node=args.real_node,
                images=tuple(i for i in args.images.split(",") if i),
            )
            if args.autoscaler == AUTOSCALER:
                karpenter.start(layout, default_pool=True)
        elif args.command == "down":
            down(layout, keep_logs=not args.purge)
            if args.purge:
                shutil.rmtree(layout.root, ignore_errors=True)
        elif args.command == "status":
            info = status(layout)
            print(json.dumps(info, indent=2))
            return 0 if info["running"] else 1
        elif args.command == "apply-fleet":
            apply_fleet(args.fleet, layout=layout, replace=args.replace)
        elif args.command == "bindir":
            print(toolchain_bindir())
    except (ClusterError, FleetError, WaitTimeoutError) as err:
        print(f"cluster: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("cluster: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
