"""Elastra: a Kubernetes operator for elastic, heterogeneity-aware distributed training.

The package is split so that decisions can be tested without a cluster: ``api`` holds the
TrainingJob models, ``planner`` and ``elastic`` are pure, ``kube`` is the only door to the
Kubernetes API and ``controller`` wires them together under Kopf.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("elastra")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
