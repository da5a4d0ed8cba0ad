"""The ``elastra`` command line.

Each subcommand lives in its own module under ``elastra.commands`` and exposes ``register``
(adds its parser) and ``run`` (does the work, returns the exit status). This module only
wires them together, so adding a command never touches the others.

Exit statuses follow one scheme across commands: 0 success, 2 bad input (a one-line message
naming the file, field or node), 3 the API server cannot be reached (a one-line message naming
its address and the kubeconfig), other codes as each command documents.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType

from elastra.commands import crds, plan, run, simulate, status, version
from elastra.errors import UserError
from elastra.kube.client import UnreachableError

COMMANDS: tuple[ModuleType, ...] = (version, crds, plan, run, status, simulate)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subparser per command module."""
    parser = argparse.ArgumentParser(
        prog="elastra",
        description="Elastra: elastic, heterogeneity-aware distributed training on Kubernetes.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``elastra`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status: int = args.handler(args)
    except UserError as err:
        print(f"elastra: error: {err}", file=sys.stderr)
        return 2
    except UnreachableError as err:
        print(f"elastra: error: {err}", file=sys.stderr)
        return 3
    return status


if __name__ == "__main__":
    sys.exit(main())
