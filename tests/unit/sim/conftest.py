"""Small clusters and traces for the simulator tests."""

from __future__ import annotations

import pytest

from elastra.sim.fleet import SimCluster, parse_cluster
from elastra.sim.speed import SpeedModel

FLEET = """\
kind: Fleet
name: tiny
groups:
  - prefix: h100
    count: 2
    gpu: {product: NVIDIA-H100-80GB-HBM3, count: 8}
    cpu: "192"
    memory: 2Ti
    networkGbps: 3200
  - prefix: t4
    count: 2
    gpu: {product: Tesla-T4, count: 4}
    cpu: "48"
    memory: 192Gi
    networkGbps: 50
"""


@pytest.fixture(scope="session")
def tiny() -> SimCluster:
    return parse_cluster(FLEET, source="tiny.yaml")


@pytest.fixture(scope="session")
def speed(tiny: SimCluster) -> SpeedModel:
    """One memoized speed model for the session: planner answers never change."""
    return SpeedModel(tiny.inventory)
