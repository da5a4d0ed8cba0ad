"""Which nodes of an inventory a job's worker pods may use, and how many pods each still takes.

Why: the inventory lists every Ready node with what kube-scheduler reads of it; whether a
job's pods may go there is the scheduler's question, asked with that job's pod constraints
(the tolerations, node selector, required node affinity and requests of the very pod spec
the operator creates, see ``elastra.controller.decide.manifests.worker_constraints``):

- A node the placement filters refuse (``scheduling.refusal``: cordon, taint, nodeSelector,
  node affinity) is not the job's capacity: it is excluded, with the reason, so a plan and
  ``elastra plan`` can say why capacity is missing.
- On the others, as many pods fit as every requested resource allows (``resources.room``:
  CPU, memory, GPUs, any extended resource, the node's pod count): the free GPUs (CPU for a
  CPU job) the planner sees are capped to that many pods' worth, so a node full of memory
  offers no GPUs.

The operator builds each worker pod for the node it is planned on: the pod requests its GPUs
by the resource of that node's GPU type (``amd.com/gpu`` on an MI300X node, ``nvidia.com/gpu``
on NVIDIA's) and, as Kubernetes' ExtendedResourceToleration admission plugin would, tolerates
the ``NoSchedule`` taint of each extended resource it requests. A job's constraints
(``WorkerConstraints``) hold them for one GPU resource; ``as_built_for`` gives the pod as built
for a node, which is what every verdict here judges. Any other ``PodConstraints`` is judged as
it is, as kube-scheduler would.

``fit_reason`` is the planner's answer for one more pod on one node: "" exactly when the node
is eligible and holds at least one more pod. The integration test that compares it with
kube-scheduler's own verdicts (tests/integration/test_scheduler_agreement.py) asks it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from elastra.planner.inventory import ExcludedNode, Inventory, NodeCapacity, gpus
from elastra.planner.resources import CPU, NOTHING, Resources, room, shortfall
from elastra.planner.scheduling import NO_SCHEDULE, PodConstraints, PodToleration, refusal

CPU_MILLIS_UNREQUESTED = 1000
"""The CPU the planner counts per pod of a CPU job that requests none (``fromspec``'s 1)."""
QUOTA_PREFIX = "requests."
"""Names with this prefix are quota names, never extended resources."""
NATIVE_DOMAIN = "kubernetes.io/"
"""Resources in this domain (and unprefixed ones: ``cpu``, ``hugepages-2Mi``) are native."""


def is_extended(resource: str) -> bool:
    """Whether Kubernetes counts ``resource`` as an extended resource (a device such as
    ``nvidia.com/gpu``): a domain-prefixed name outside ``kubernetes.io``, not a quota name."""
    return (
        "/" in resource and NATIVE_DOMAIN not in resource and not resource.startswith(QUOTA_PREFIX)
    )


def requested_toleration(resource: str) -> PodToleration:
    """What the ExtendedResourceToleration admission plugin adds to a pod requesting the
    extended ``resource``: its taint tolerated with any value, effect ``NoSchedule``."""
    return PodToleration(key=resource, operator="Exists", effect=NO_SCHEDULE)


@dataclass(frozen=True)
class WorkerConstraints(PodConstraints):
    """A job's worker pods as the scheduler reads them, for a node of any GPU vendor.

    ``requests`` name the pod's GPUs by ``gpu_resource`` and, where ``gpu_toleration_added``,
    ``tolerations`` end with ``requested_toleration(gpu_resource)`` that the operator added for
    it (rather than the template's own): on a node whose GPU type another resource requests,
    the pod the operator builds has that resource instead, in both (``as_built_for``).
    """

    gpu_resource: str = ""
    """The GPU resource ``requests`` count the pod's GPUs in ("" for a CPU job)."""
    gpu_toleration_added: bool = False
    """Whether the operator added ``gpu_resource``'s toleration (the pod's own had none)."""

    @classmethod
    def of(
        cls, pod: PodConstraints, *, gpu_resource: str, gpu_toleration_added: bool
    ) -> WorkerConstraints:
        """``pod``'s constraints, its GPUs requested by ``gpu_resource``."""
        return cls(
            tolerations=pod.tolerations,
            node_selector=pod.node_selector,
            required_terms=pod.required_terms,
            requests=pod.requests,
            gpu_resource=gpu_resource,
            gpu_toleration_added=gpu_toleration_added,
        )

    def placement(self) -> WorkerConstraints:
        """These constraints without the requests; the GPU resource still known per node."""
        return dataclasses.replace(self, requests=NOTHING)


def as_built_for(pod: PodConstraints, node: NodeCapacity) -> PodConstraints:
    """``pod`` as the operator builds it for ``node``: for ``WorkerConstraints`` of a GPU job
    on a node whose GPU type is requested by another resource, the GPUs requested and the
    taint tolerated by that resource; any other ``pod`` as it is."""
    if not isinstance(pod, WorkerConstraints) or not pod.gpu_resource or node.gpu_type.is_cpu:
        return pod
    resource = node.gpu_type.resource
    if resource == pod.gpu_resource:
        return pod
    tolerations = list(pod.tolerations)
    if pod.gpu_toleration_added:
        tolerations.remove(requested_toleration(pod.gpu_resource))
    if requested_toleration(resource) not in tolerations:
        tolerations.append(requested_toleration(resource))
    amounts = pod.requests.as_dict()
    wanted = amounts.pop(pod.gpu_resource, 0)
    if wanted:
        amounts[resource] = amounts.get(resource, 0) + wanted
    return PodConstraints(
        tolerations=tuple(tolerations),
        node_selector=pod.node_selector,
        required_terms=pod.required_terms,
        requests=Resources.of(amounts),
    )


def refused(pod: PodConstraints, node: NodeCapacity) -> str:
    """Why the scheduler's placement filters refuse ``node`` for ``pod`` ("" when they pass;
    always "" for capacity made by hand, which carries no node facts)."""
    if node.facts is None:
        return ""
    return refusal(as_built_for(pod, node), node.facts)


def pods_that_fit(pod: PodConstraints, node: NodeCapacity) -> int:
    """How many more pods like ``pod`` (as built for ``node``) the node's free resources hold."""
    if node.facts is None:
        wanted = gpus(pod.requests)
        return node.free_gpus // wanted if wanted else node.free_cpu_millis // _cpu(pod)
    need = as_built_for(pod, node).requests
    return room(need, allocatable=node.facts.allocatable, used=node.used)


def fit_reason(pod: PodConstraints, node: NodeCapacity) -> str:
    """Why one more ``pod`` (as built for ``node``) cannot go to ``node``: refused, or short
    of a resource ("" when it fits)."""
    reason = refused(pod, node)
    if reason:
        return reason
    if node.facts is None:
        return "" if pods_that_fit(pod, node) else "no free GPUs or CPU for one more pod"
    need = as_built_for(pod, node).requests
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


def _cpu(pod: PodConstraints) -> int:
    return pod.requests.get(CPU) or CPU_MILLIS_UNREQUESTED
