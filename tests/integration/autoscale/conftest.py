"""Karpenter, a real autoscaler, on the test cluster: fixtures for the scale-from-zero tests.

Karpenter runs with its kwok provider (e2e/cluster/karpenter.py; built from its Go module by
e2e/toolchain/build.sh --karpenter, which the collection hook below runs when a test here is
selected). It creates kwok nodes, shaped as EKS nodes of the GPU instance types in
``e2e.cluster.karpenter.INSTANCE_TYPES``, for the pending pods that a NodePool admits, and
removes them once they have been empty for the pool's ``consolidate_after``.

How to use it:

    def test_x(cluster, node_pools, karpenter, namespace):
        pool = node_pools.create("gpu", instance_types=["g6.xlarge", "p4d.24xlarge"])
        # pods for this pool tolerate its taint (and may select it):
        #   spec.tolerations += [pool.toleration]
        #   spec.nodeSelector = pool.node_selector       (optional: this pool only)
        ...
        made = karpenter.nodes(pool.name)                # Node objects Karpenter made for it
        wait_for("the empty nodes to go", lambda: not karpenter.nodes(pool.name), timeout=180)

- ``karpenter`` (package scope: started before the first test of this folder, stopped after
  the last) is the running controller: ``nodes(pool)``, ``node_claims(pool)``, ``log_tail()``
  (put it in a wait's ``hint``). A Karpenter that ``make cluster-up AUTOSCALER=karpenter``
  started in the same cluster folder is used as it is and left running.
- ``node_pools`` (per test) creates NodePools and deletes them when the test ends, before
  the test's namespace, waiting until Karpenter has removed their nodes. ``create(prefix, *,
  instance_types, labels=None, taint=None, gpu_limit=None, consolidate_after="5s")`` returns
  a ``Pool`` named ``<prefix>-<random>``, once Karpenter reports it Ready. Every pool is
  tainted (default ``elastra.dev/karpenter-pool=<name>:NoSchedule``), so only pods that
  tolerate that taint make Karpenter create nodes: pending pods of other tests never do.
  ``labels`` go on every node of the pool; ``gpu_limit`` caps the GPUs the pool may hold.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from e2e.cluster import karpenter as kp
from e2e.cluster import procs
from e2e.cluster.api import wait_for
from e2e.cluster.components import tail
from e2e.cluster.state import default_layout

from tests.integration.conftest import LocalCluster

POOL_TAINT_KEY = "elastra.dev/karpenter-pool"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Build Karpenter (a cold cache: minutes) before any test here starts, outside timeouts."""
    here = Path(__file__).parent
    if any(here in Path(str(item.path)).parents for item in items):
        kp.karpenter_dir(build=True)


@dataclass(frozen=True)
class Karpenter:
    """The Karpenter controller running against the test cluster."""

    cluster: LocalCluster
    log: Path

    def nodes(self, pool: str | None = None) -> list[dict[str, Any]]:
        """Nodes Karpenter made (for ``pool``, or for any pool)."""
        selector = f"{kp.NODEPOOL_LABEL}={pool}" if pool else kp.NODEPOOL_LABEL
        items: list[dict[str, Any]] = self.cluster.get("nodes", "-l", selector)["items"]
        return items

    def node_claims(self, pool: str | None = None) -> list[dict[str, Any]]:
        selector = f"{kp.NODEPOOL_LABEL}={pool}" if pool else kp.NODEPOOL_LABEL
        items: list[dict[str, Any]] = self.cluster.get("nodeclaims", "-l", selector)["items"]
        return items

    def log_tail(self, lines: int = 30) -> str:
        return f"last lines of {self.log}:\n{tail(self.log, lines)}"


@pytest.fixture(scope="package")
def karpenter(
    cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Karpenter]:
    """Karpenter for the tests of this folder, stopped after the last of them."""
    if os.environ.get("ELASTRA_TEST_KUBECONFIG"):
        # A cluster this run did not start: Karpenter runs here against its kubeconfig.
        work = tmp_path_factory.mktemp("karpenter")
        target = kp.Target(cluster.bindir, cluster.kubeconfig)
        log = work / "karpenter.log"
        daemon = kp.launch(target, built=kp.karpenter_dir(build=False), workdir=work, log=log)
        try:
            yield Karpenter(cluster, log)
        finally:
            procs.stop(daemon)
        return
    layout = default_layout()
    started = kp.start(layout)
    recorded = kp.running(layout)
    assert recorded is not None, "Karpenter is not running after start"
    try:
        yield Karpenter(cluster, Path(recorded.log))
    finally:
        if started:
            kp.stop(layout)


@dataclass(frozen=True)
class Pool:
    """A NodePool a test created, and what its pods need to be placed in it."""

    name: str
    taint: Mapping[str, str]

    @property
    def toleration(self) -> dict[str, str]:
        return {
            "key": self.taint["key"],
            "operator": "Equal",
            "value": self.taint.get("value", ""),
            "effect": self.taint["effect"],
        }

    @property
    def node_selector(self) -> dict[str, str]:
        return {kp.NODEPOOL_LABEL: self.name}


@dataclass
class NodePools:
    """Creates NodePools for one test and deletes them (and waits for their nodes) after it."""

    karpenter: Karpenter
    created: list[Pool] = field(default_factory=list)

    def create(
        self,
        prefix: str,
        *,
        instance_types: list[str],
        labels: Mapping[str, str] | None = None,
        taint: Mapping[str, str] | None = None,
        gpu_limit: int | None = None,
        consolidate_after: str = "5s",
    ) -> Pool:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        pool = Pool(
            name, dict(taint or {"key": POOL_TAINT_KEY, "value": name, "effect": "NoSchedule"})
        )
        manifest = kp.node_pool(
            name,
            instance_types=instance_types,
            taint=pool.taint,
            labels=labels,
            consolidate_after=consolidate_after,
            gpu_limit=gpu_limit,
        )
        self.karpenter.cluster.apply(manifest)
        self.created.append(pool)
        wait_for(
            f"NodePool {name} to be Ready",
            lambda: kp.node_pool_ready(self.karpenter.cluster.get("nodepool", name)),
            timeout=60,
            interval=0.5,
            hint=self.karpenter.log_tail,
        )
        return pool

    def delete(self, pool: Pool, *, timeout: float = 180) -> None:
        """Delete the pool; Karpenter drains and removes its nodes (waited for)."""
        cluster = self.karpenter.cluster
        cluster.kubectl("delete", "nodepool", pool.name, "--ignore-not-found", "--wait=false")
        wait_for(
            f"Karpenter to remove the nodes of NodePool {pool.name}",
            lambda: (
                not self.karpenter.nodes(pool.name) and not self.karpenter.node_claims(pool.name)
            ),
            timeout=timeout,
            interval=1.0,
            hint=lambda: f"{self.karpenter.log_tail()}\n{self.left_on(pool)}",
        )
        self.created.remove(pool)

    def left_on(self, pool: Pool) -> str:
        """What keeps a deleted pool's nodes: the pods still on them, whether each is being
        deleted, its finalizers, and the state of its namespace."""
        cluster = self.karpenter.cluster
        nodes = {n["metadata"]["name"] for n in self.karpenter.nodes(pool.name)}
        lines = [f"pods on the nodes of {pool.name} ({len(nodes)} nodes):"]
        namespaces = set()
        for pod in cluster.get("pods", "-A")["items"]:
            meta = pod["metadata"]
            if pod["spec"].get("nodeName") in nodes:
                namespaces.add(meta["namespace"])
                lines.append(
                    f"  {meta['namespace']}/{meta['name']} on {pod['spec']['nodeName']}:"
                    f" phase {pod.get('status', {}).get('phase')},"
                    f" deletionTimestamp {meta.get('deletionTimestamp')},"
                    f" finalizers {meta.get('finalizers', [])}"
                )
        for name in sorted(namespaces):
            status = cluster.get("namespace", name).get("status", {})
            lines.append(f"namespace {name}: {status}")
        return "\n".join(lines)


@pytest.fixture
def node_pools(karpenter: Karpenter, namespace: str) -> Iterator[NodePools]:
    """Taking ``namespace`` orders the teardown: the pools go while the test's namespace still
    lives, so Karpenter drains their pods by eviction as on a real cluster. The other way
    round, every eviction is refused as content in a terminating namespace, and the nodes
    stay until the namespace controller has deleted the pods."""
    pools = NodePools(karpenter)
    try:
        yield pools
    finally:
        for pool in list(pools.created):
            pools.delete(pool)
