"""``elastra crds``: print the CustomResourceDefinitions generated from the API models."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from elastra.api.crd import render_crds


def register(sub: Any) -> None:
    """Add the ``crds`` subcommand."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "crds",
        help="print the TrainingJob CRD (kubectl apply -f -)",
        description=(
            "Print the CustomResourceDefinition of trainingjobs.elastra.dev, generated from "
            "the pydantic models; crds/ in the repository holds the same bytes."
        ),
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Write the CRD YAML to stdout."""
    del args
    sys.stdout.write(render_crds())
    return 0
