"""The operator's Lease has one owner: an operator installed by the chart never creates it.

The race this pins down: ``helm install`` creates the release's objects one by one, the Lease
last; on a quiet machine the operator pod started and created the Lease first, and Helm's create
then failed with "already exists". The test plays that order deterministically against the real
API server: the operator runs as the chart runs it (``--no-create-lease``) and has had its
chance to create the Lease (it says it is standing by) before the chart's create happens. With
an operator that still created the Lease, that create fails every time.
"""

from __future__ import annotations

import json
from typing import Any

from elastra.controller.leader import LEASE_NAME
from tests.integration.conftest import Cluster
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
    cluster: Cluster, jobs: Jobs
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
