"""Which nodes of an inventory a job's worker pods may use, and how many pods each still takes.

Why: the inventory lists every Ready node with what kube-scheduler reads of it; whether a
job's pods may go there is the scheduler's question, asked with that job's pod constraints
(the tolerations, node selector, required node affinity and requests of the very pod spec
the operator creates, see ``elastra.controller.manifests.worker_constraints``):

- A node the placement filters refuse (``scheduling.refusal``: cordon, taint, nodeSelector,
  node affinity) is not the job's capacity: it is excluded, with the reason, so a plan and
  ``elastra plan`` can say why capacity is missing.
- On the others, as many pods fit as every requested resource allows (``resources.room``:
  CPU, memory, GPUs, any extended resource, the node's pod count): the free GPUs (CPU for a
  CPU job) the planner sees are capped to that many pods' worth, so a node full of memory
  offers no GPUs. GPUs are counted in the resource the node advertises, as the operator
  requests them by the planned node's type.

``fit_reason`` is the planner's answer for one more pod on one node: "" exactly when the node
is eligible and holds at least one more pod. The integration test that compares it with
kube-scheduler's own verdicts (tests/integration/test_scheduler_agreement.py) asks it.
"""

from __future__ import annotations

import dataclasses

from elastra.planner.catalog import GPU_RESOURCES
from elastra.planner.inventory import ExcludedNode, Inventory, NodeCapacity, gpus
from elastra.planner.resources import CPU, Resources, room, shortfall
from elastra.planner.scheduling import NodeFacts, PodConstraints, refusal

CPU_MILLIS_UNREQUESTED = 1000
"""The CPU the planner counts per pod of a CPU job that requests none (``fromspec``'s 1)."""


def refused(pod: PodConstraints, node: NodeCapacity) -> str:
    """Why the scheduler's placement filters refuse ``node`` for ``pod`` ("" when they pass;
    always "" for capacity made by hand, which carries no node facts)."""
    return refusal(pod, node.facts) if node.facts is not None else ""


def pods_that_fit(pod: PodConstraints, node: NodeCapacity) -> int:
    """How many more pods like ``pod`` the node's free resources hold."""
    if node.facts is None:
        wanted = gpus(pod.requests)
        return node.free_gpus // wanted if wanted else node.free_cpu_millis // _cpu(pod)
    return room(_on(node.facts, pod.requests), allocatable=node.facts.allocatable, used=node.used)


def fit_reason(pod: PodConstraints, node: NodeCapacity) -> str:
    """Why one more ``pod`` cannot go to ``node``: refused, or short of a resource ("" when
    it fits)."""
    reason = refused(pod, node)
    if reason:
        return reason
    if node.facts is None:
        return "" if pods_that_fit(pod, node) else "no free GPUs or CPU for one more pod"
    need = _on(node.facts, pod.requests)
    return shortfall(need, allocatable=node.facts.allocatable, used=node.used)


def fitted(pod: PodConstraints, node: NodeCapacity) -> NodeCapacity:
    """``node`` with its free GPUs (CPU for a CPU job) capped to what ``pods_that_fit`` pods
    use, so the planner's own count of slots never exceeds what the scheduler admits."""
    if node.facts is None:
        return node
    count = pods_that_fit(pod, node)
    wanted = gpus(pod.requests)
    if wanted:
        capped = min(node.free_gpus, count * wanted)
        return node if capped == node.free_gpus else dataclasses.replace(node, free_gpus=capped)
    cpu = min(node.free_cpu_millis, count * _cpu(pod))
    return node if cpu == node.free_cpu_millis else dataclasses.replace(node, free_cpu_millis=cpu)


def eligible(inventory: Inventory, pod: PodConstraints) -> Inventory:
    """The part of ``inventory`` that ``pod``'s like may use: refused nodes move to
    ``excluded`` with their reason, the rest are ``fitted``."""
    nodes: list[NodeCapacity] = []
    excluded = list(inventory.excluded)
    for node in inventory.nodes:
        reason = refused(pod, node)
        if reason:
            excluded.append(ExcludedNode(node.name, reason))
        else:
            nodes.append(fitted(pod, node))
    return dataclasses.replace(
        inventory,
        nodes=tuple(nodes),
        excluded=tuple(sorted(excluded, key=lambda n: n.name)),
    )


def _on(node: NodeFacts, requests: Resources) -> Resources:
    """``requests`` with its GPUs asked for by the resource ``node`` advertises: the operator
    requests a pod's GPUs by the resource of its planned node's type (``amd.com/gpu`` on AMD
    nodes, ``nvidia.com/gpu`` on NVIDIA's)."""
    wanted = gpus(requests)
    advertised = [name for name in GPU_RESOURCES if node.allocatable.get(name)]
    if not wanted or len(advertised) != 1 or requests.get(advertised[0]) == wanted:
        return requests
    amounts = {k: v for k, v in requests.amounts if k not in GPU_RESOURCES}
    return Resources.of({**amounts, advertised[0]: wanted})


def _cpu(pod: PodConstraints) -> int:
    return pod.requests.get(CPU) or CPU_MILLIS_UNREQUESTED
