"""Running several policies over one trace and cluster, sharing one memoized speed model.

The planner's answers do not depend on the policy, so one ``SpeedModel`` serves every run:
the second policy asks the planner almost nothing new.
"""

from __future__ import annotations

from collections.abc import Sequence

from elastra.sim.engine import FaultRates, Simulation
from elastra.sim.fleet import SimCluster
from elastra.sim.metrics import SimResult
from elastra.sim.policies import make_policy
from elastra.sim.speed import SpeedModel
from elastra.sim.trace import TraceJob


def run_policies(
    cluster: SimCluster,
    jobs: Sequence[TraceJob],
    policies: Sequence[str],
    *,
    faults: FaultRates | None = None,
    source: str = "<trace>",
    speed: SpeedModel | None = None,
) -> tuple[SimResult, ...]:
    """One result per policy, in the order given.

    Every job is checked against the cluster (type present, gang fits, model fits in memory)
    before the first policy runs, so bad input simulates nothing.
    """
    speed = speed or SpeedModel(cluster.inventory)
    simulations = [
        Simulation(
            cluster, jobs, speed=speed, policy=make_policy(name), faults=faults, source=source
        )
        for name in policies
    ]
    return tuple(simulation.run() for simulation in simulations)
