"""``elastra version``: print the installed version."""

from __future__ import annotations

import argparse
from typing import Any

import elastra


def register(sub: Any) -> None:
    """Add the ``version`` subcommand."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "version", help="print the Elastra version", description="Print the Elastra version."
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Print ``elastra <version>``."""
    del args
    print(f"elastra {elastra.__version__}")
    return 0
