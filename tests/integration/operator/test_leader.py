"""The operator's Lease has one owner: an operator installed by the chart never creates it.

The race this pins down: ``helm install`` creates the release's objects one by one, the Lease
last; on a quiet machine the operator pod started and created the Lease first, and Helm's create
then failed with "already exists". The test plays that order deterministically against the real
API server: the operator runs as the chart runs it (``--no-create-lease``) and has had its
chance to create the Lease (it says it is standing by) before the chart's create happens. With
an operator that still created the Lease, that create fails every time.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from elastra.controller.engine.leader import LEASE_NAME, LeaderElector
from elastra.kube.client import Kube
from elastra.kube.config import load_connection
from tests.integration.conftest import LocalCluster
from tests.integration.operator.conftest import Jobs, OperatorProcess


def chart_lease(namespace: str) -> dict[str, Any]:
    """The Lease exactly as ``helm/elastra/templates/lease.yaml`` renders it."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": LEASE_NAME, "namespace": namespace},
        "spec": {},
    }


def test_an_operator_started_before_the_charts_lease_leaves_its_creation_to_the_chart(
    cluster: LocalCluster, jobs: Jobs
) -> None:
    operator = OperatorProcess(cluster, jobs.namespace, extra_args=("--no-create-lease",))
    operator.start()
    try:
        jobs.wait(
            "the operator finds no Lease and stands by",
            lambda: any("does not exist" in line for line in operator.lines),
            timeout=60,
        )
        created = cluster.kubectl(
            "create", "-f", "-", stdin=json.dumps(chart_lease(jobs.namespace)), check=False
        )
        assert created.returncode == 0, f"the chart's create of the Lease failed: {created.stderr}"
        jobs.wait(
            "the operator takes the chart's Lease",
            lambda: any("acquired, reconciling" in line for line in operator.lines),
            timeout=60,
        )
        lease = cluster.get("lease", LEASE_NAME, "-n", jobs.namespace)
        assert lease["spec"]["holderIdentity"], lease
    finally:
        operator.stop()


def test_a_holder_renews_with_one_write_and_yields_to_a_lease_taken_from_it(
    cluster: LocalCluster, jobs: Jobs
) -> None:
    """Two electors on the real API server: the holder renews by writing the Lease it last
    wrote (one request, no read); once the other took the Lease over (the holder's renewals
    stopped for longer than the duration, by the clocks the test passes), the holder's write
    meets the resourceVersion precondition, it reads the Lease and stands by."""
    connection = load_connection(str(cluster.kubeconfig))
    t0 = datetime.now(UTC)

    async def play() -> list[tuple[str, bool, int]]:
        async with Kube(connection) as kube:
            a = LeaderElector(kube, jobs.namespace, "a")
            b = LeaderElector(kube, jobs.namespace, "b")
            seen: list[tuple[str, bool, int]] = []

            async def attempt(name: str, elector: LeaderElector, at: timedelta) -> None:
                before = sum(kube.requests.values())
                won = await elector.try_acquire(t0 + at)
                seen.append((name, won, sum(kube.requests.values()) - before))

            await attempt("a takes", a, timedelta(0))
            await attempt("a renews", a, timedelta(seconds=5))
            await attempt("b waits", b, timedelta(seconds=6))
            await attempt("b takes the expired Lease", b, timedelta(seconds=30))
            await attempt("a finds it taken", a, timedelta(seconds=31))
            await attempt("a still finds it taken", a, timedelta(seconds=36))
            return seen

    seen = asyncio.run(play())
    assert seen == [
        ("a takes", True, 2),  # read (none there), create
        ("a renews", True, 1),  # the write alone
        ("b waits", False, 1),  # read: a holds it
        ("b takes the expired Lease", True, 2),  # read, write
        ("a finds it taken", False, 2),  # its write conflicts, then it reads
        ("a still finds it taken", False, 1),  # read only
    ]
    lease = cluster.get("lease", LEASE_NAME, "-n", jobs.namespace)
    assert lease["spec"]["holderIdentity"] == "b"
    assert lease["spec"]["leaseTransitions"] == 1
