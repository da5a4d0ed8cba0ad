"""Cluster capacity as the planner sees it, parsed from Node objects (and optionally Pods).

Input is what ``kubectl get nodes -o yaml`` prints (a NodeList or ``kind: List``), or a plain
list of Node dicts, so a user can snapshot a real cluster and plan without one. The result is
typed and sorted by node name, so the same snapshot always gives the same inventory.

Rules (docs/architecture.md, "Cluster inventory"):
- GPU type: label ``elastra.dev/gpu-type`` if set, else ``nvidia.com/gpu.product`` (as GPU
  Feature Discovery writes it). An unknown type is a ``UserError`` naming the node and the
  label, unless the node declares its own figures: ``elastra.dev/gpu-tflops`` (dense 16-bit
  peak; fp32 is taken as half) and ``elastra.dev/gpu-memory-gib``. Those figures, and
  ``elastra.dev/gpu-interconnect-gbps`` (per GPU, per direction, Gbit/s) and
  ``elastra.dev/gpu-hourly-usd``, override the catalog for known types too. Figures may be
  annotations or labels; annotations win.
- GPUs: ``status.allocatable["nvidia.com/gpu"]`` minus what running pods on the node request.
  A node without GPUs is a CPU node; its capacity is allocatable CPU minus pod requests.
- Network: ``elastra.dev/network-gbps`` (the node's NIC total, Gbit/s), else Karpenter's
  ``instance-network-bandwidth`` label or the instance type's documented figure
  (``providers``), else the catalog's default for the type.
- Topology: ``topology.kubernetes.io/zone``, ``elastra.dev/block``, ``kubernetes.io/hostname``.
- Not capacity: not Ready. Excluded nodes are listed with the reason, so a plan can say why
  capacity is missing.
- What kube-scheduler reads of a node (labels, taints, cordon, allocatable) and what the pods
  on it request ride along on each node (``facts``, ``used``): which nodes a given job's pods
  may use is the scheduler's question, asked per job by ``eligibility.eligible``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NewType

from elastra.errors import UserError
from elastra.planner.catalog import (
    AMD_GPU,
    CPU_TYPE,
    GPU_RESOURCES,
    NVIDIA_GPU,
    GpuType,
    GpuTypeName,
    by_name,
    lookup,
)
from elastra.planner.providers import (
    GPU_LABELS,
    LABEL_GFD_PRODUCT,
    LABEL_GPU_TYPE,
    LABEL_MIG_CONFIG,
    Identified,
    identify,
    mig_partitions,
)
from elastra.planner.resources import (
    CPU,
    NOTHING,
    PODS,
    Resources,
    held_by,
    resource_list,
    rounded,
    total,
)
from elastra.planner.scheduling import NodeFacts, taints_of

NodeName = NewType("NodeName", str)

GPU_RESOURCE = NVIDIA_GPU
LABEL_PRODUCT = LABEL_GFD_PRODUCT
LABEL_BLOCK = "elastra.dev/block"
LABEL_ZONE = "topology.kubernetes.io/zone"
LABEL_HOSTNAME = "kubernetes.io/hostname"
ANN_NETWORK = "elastra.dev/network-gbps"
ANN_TFLOPS = "elastra.dev/gpu-tflops"
ANN_MEMORY = "elastra.dev/gpu-memory-gib"
ANN_INTERCONNECT = "elastra.dev/gpu-interconnect-gbps"
ANN_PRICE = "elastra.dev/gpu-hourly-usd"

UNKNOWN_GPU_TYPE = "UnknownGpuType"
"""Exclusion category (and Event reason): the node's GPUs have no type Elastra can plan with."""
MIG_PARTITIONED = "MigPartitioned"
"""Exclusion category (and Event reason): the node's GPUs are MIG partitions."""
GPUS_NOT_ADVERTISED = "GpusNotAdvertised"
"""Exclusion category: the labels name a GPU type, the device plugin advertises no GPU (yet)."""
GPU_EXCLUSIONS = frozenset({UNKNOWN_GPU_TYPE, MIG_PARTITIONED, GPUS_NOT_ADVERTISED})
"""The categories of nodes left out for what their GPUs are (shown by ``elastra status``)."""


@dataclass(frozen=True)
class NodeCapacity:
    """What one schedulable node offers the job."""

    name: NodeName
    gpu_type: GpuType
    free_gpus: int
    free_cpu_millis: int
    network_gbps: float
    zone: str
    block: str
    facts: NodeFacts | None = None
    """What kube-scheduler's filters read of the node; ``None`` for capacity made by hand
    (benchmarks, calibration), which every pod may use."""
    used: Resources = NOTHING
    """What the pods counted on the node request, ``pods`` (their count) included."""

    def holding(self, used: Resources) -> NodeCapacity:
        """This node with ``used`` held by pods instead: free GPUs and CPU follow."""
        if self.facts is None:
            raise ValueError(f"node {self.name}: capacity made by hand has no allocatable")
        allocatable = self.facts.allocatable
        return dataclasses.replace(
            self,
            used=used,
            free_gpus=0 if self.gpu_type.is_cpu else max(0, gpus(allocatable) - gpus(used)),
            free_cpu_millis=max(0, allocatable.get(CPU) - used.get(CPU)),
        )


def gpus(resources: Resources) -> int:
    """The GPUs among ``resources``, of whichever vendor's resource."""
    return sum(resources.get(name) for name in GPU_RESOURCES)


@dataclass(frozen=True)
class ExcludedNode:
    """A node that is not capacity, and why."""

    name: NodeName
    reason: str
    category: str = ""
    """One of the ``GPU_EXCLUSIONS`` for a node left out for its GPUs, else ""."""


@dataclass(frozen=True)
class NodeNote:
    """Something a node's labels say that its capacity contradicts (the capacity wins)."""

    name: NodeName
    message: str


@dataclass(frozen=True)
class Inventory:
    """Schedulable nodes sorted by name, plus the excluded ones with reasons."""

    nodes: tuple[NodeCapacity, ...]
    excluded: tuple[ExcludedNode, ...] = ()
    notes: tuple[NodeNote, ...] = ()

    def types(self) -> tuple[GpuType, ...]:
        """The distinct GPU types among schedulable nodes, sorted by name."""
        seen = {node.gpu_type.name: node.gpu_type for node in self.nodes}
        return tuple(seen[name] for name in sorted(seen))


def node_items(document: Any) -> list[Mapping[str, Any]]:
    """The Node dicts in a NodeList/List dict, a single Node dict, or a list of either."""
    if isinstance(document, list):
        return [item for part in document for item in node_items(part)]
    if not isinstance(document, Mapping):
        raise UserError("expected a NodeList, a List of Nodes or Node documents")
    kind = document.get("kind")
    if kind in {"NodeList", "List"} or (kind is None and "items" in document):
        items = document.get("items") or []
        if not isinstance(items, list):
            raise UserError(f"{kind}.items: expected a list")
        return [item for item in items if isinstance(item, Mapping) and _is_node(item)]
    if kind == "Node":
        return [document]
    raise UserError(f"expected kind Node or NodeList, got {kind!r}")


def _is_node(item: Mapping[str, Any]) -> bool:
    return bool(item.get("kind", "Node") == "Node")


def parse_inventory(
    nodes: Any,
    pods: Iterable[Mapping[str, Any]] = (),
) -> Inventory:
    """Typed capacity from Node objects, less what running ``pods`` already request."""
    held: dict[str, list[Resources]] = {}
    for pod in pods:
        node_name, requests = held_by(pod)
        if node_name:
            held.setdefault(node_name, []).append(requests)
    capacities: list[NodeCapacity] = []
    excluded: list[ExcludedNode] = []
    notes: list[NodeNote] = []
    names: set[str] = set()
    for item in node_items(nodes):
        metadata = item.get("metadata") or {}
        name = str(metadata.get("name") or "")
        if not name:
            raise UserError("a Node without metadata.name")
        if name in names:
            raise UserError(f"node {name}: listed twice")
        names.add(name)
        reason = _not_ready_reason(item)
        if reason:
            excluded.append(ExcludedNode(NodeName(name), reason))
            continue
        used = total(held.get(name, ()))
        parsed, note = _capacity(item, name, gpus(used), used.get(CPU))
        if note:
            notes.append(NodeNote(NodeName(name), note))
        if isinstance(parsed, ExcludedNode):
            excluded.append(parsed)
        else:
            capacities.append(with_facts(parsed, item, used=used))
    capacities.sort(key=lambda n: n.name)
    excluded.sort(key=lambda n: n.name)
    _check_consistent_types(capacities)
    return Inventory(nodes=tuple(capacities), excluded=tuple(excluded), notes=tuple(notes))


def _capacity(
    item: Mapping[str, Any], name: str, used_gpus: int, used_cpu: int
) -> tuple[NodeCapacity | ExcludedNode, str]:
    """The node's capacity, or why its GPUs leave it out; and a note where its labels disagree
    with its capacity ("" when they agree)."""
    metadata = item.get("metadata") or {}
    labels: Mapping[str, str] = metadata.get("labels") or {}
    annotations: Mapping[str, str] = metadata.get("annotations") or {}
    allocatable: Mapping[str, Any] = (item.get("status") or {}).get("allocatable") or {}

    def figure(key: str) -> float | None:
        raw = annotations.get(key, labels.get(key))
        if raw is None:
            return None
        try:
            value = float(str(raw))
        except ValueError:
            raise UserError(f"node {name}: {key}={raw!r} is not a number") from None
        if value <= 0:
            raise UserError(f"node {name}: {key}={raw!r} must be > 0")
        return value

    cpu_millis = _cpu_millis(allocatable.get("cpu", 0), f"node {name}")
    devices = {r: _count(allocatable.get(r, 0), f"node {name}", r) for r in GPU_RESOURCES}
    mig = mig_partitions(labels, allocatable)
    if mig:
        return _excluded(name, category=MIG_PARTITIONED, reason=_mig_reason(mig)), ""
    resource, gpus = max(devices.items(), key=lambda kv: kv[1])
    if sum(devices.values()) != gpus:
        shown = " and ".join(f"{n} {r}" for r, n in devices.items())
        return _excluded(
            name, category=UNKNOWN_GPU_TYPE, reason=f"advertises {shown}: one vendor per node"
        ), ""
    found = identify(labels)
    gpu_type = _gpu_type(name, found, resource=resource, gpus=gpus, figure=figure)
    if isinstance(gpu_type, ExcludedNode):
        return gpu_type, ""
    network = figure(ANN_NETWORK) or found.network_gbps or gpu_type.node_network_gbps
    capacity = NodeCapacity(
        name=NodeName(name),
        gpu_type=gpu_type,
        free_gpus=max(0, gpus - used_gpus) if not gpu_type.is_cpu else 0,
        free_cpu_millis=max(0, cpu_millis - used_cpu),
        network_gbps=network,
        zone=str(labels.get(LABEL_ZONE, "")),
        block=str(labels.get(LABEL_BLOCK, labels.get(LABEL_HOSTNAME, name))),
    )
    return capacity, _count_note(found, resource=resource, gpus=gpus)


def _gpu_type(
    name: str, found: Identified, *, resource: str, gpus: int, figure: Any
) -> GpuType | ExcludedNode:
    """The type ``found`` names (or the node's own figures declare), or why there is none."""
    tflops: float | None = figure(ANN_TFLOPS)
    memory: float | None = figure(ANN_MEMORY)
    declared = tflops is not None and memory is not None
    if gpus == 0:
        if found.spelling is None:
            return by_name(CPU_TYPE)
        return _excluded(
            name,
            category=GPUS_NOT_ADVERTISED,
            reason=f"{found.source} names GPU type {found.spelling} but status.allocatable has no "
            f"{NVIDIA_GPU} or {AMD_GPU}: the device plugin has not registered its GPUs (yet)",
        )
    base = lookup(found.spelling) if found.spelling is not None else None
    if base is None and not declared:
        return _excluded(
            name,
            category=UNKNOWN_GPU_TYPE,
            reason=_unknown_reason(found, resource=resource, gpus=gpus),
        )
    if base is None:
        base = _custom_type(found.spelling or found.custom or f"custom-{name}", gpus=gpus)
    if base.resource != resource:
        return _excluded(name, category=UNKNOWN_GPU_TYPE, reason=_resource_reason(base, resource))
    changes: dict[str, Any] = {}
    if tflops is not None:
        changes.update(bf16_tflops=tflops, fp16_tflops=tflops, fp32_tflops=tflops / 2)
    if memory is not None:
        changes["memory_gib"] = memory
    interconnect = figure(ANN_INTERCONNECT)
    if interconnect is not None:
        changes["interconnect_gbs"] = interconnect / 8.0
    price = figure(ANN_PRICE)
    if price is not None:
        changes["hourly_usd"] = price
    return dataclasses.replace(base, **changes) if changes else base


def _excluded(name: str, *, category: str, reason: str) -> ExcludedNode:
    return ExcludedNode(NodeName(name), reason, category)


def _unknown_reason(found: Identified, *, resource: str, gpus: int) -> str:
    """Which labels were read and what to set, for a node whose GPUs have no known type."""
    if found.spelling is not None:  # only Elastra's own label is never looked past
        read = f"unknown GPU type {found.spelling!r} in label {found.source}"
    elif found.read:
        read = f"no known GPU type in {', '.join(found.read)}"
    else:
        read = f"none of the labels {', '.join(GPU_LABELS)}"
    hint = f" ({found.hint})" if found.hint else ""
    return (
        f"{gpus} {resource} but {read}{hint}; label the node {LABEL_GPU_TYPE} with a "
        f"catalog type (see `elastra.planner.catalog`), or annotate it with {ANN_TFLOPS} "
        f"and {ANN_MEMORY}"
    )


def _resource_reason(gpu: GpuType, resource: str) -> str:
    if lookup(gpu.name) is None:
        return (
            f"its GPUs are {resource}, and a type declared by a node's own figures is "
            f"requested as {gpu.resource}: label it {LABEL_GPU_TYPE} with a catalog type"
        )
    return (
        f"its GPUs are {resource}, but pods of GPU type {gpu.name} request {gpu.resource}; "
        f"correct the node's {LABEL_GPU_TYPE} or product label"
    )


def _mig_reason(evidence: str) -> str:
    return (
        f"MIG partitions are not planned ({evidence}): Elastra places whole GPUs; disable "
        f"MIG on this node ({LABEL_MIG_CONFIG}=all-disabled with NVIDIA's MIG manager) or "
        f"give Elastra other nodes"
    )


def _count_note(found: Identified, *, resource: str, gpus: int) -> str:
    """Where the instance type's GPU count and the device plugin's disagree ("" if not)."""
    if found.count is None or not gpus or found.count == gpus:
        return ""
    return (
        f"{found.count_source} has {found.count} GPUs but status.allocatable {resource} is "
        f"{gpus}: planned with {gpus}, the device plugin's count"
    )


def _custom_type(spelling: str, *, gpus: int) -> GpuType:
    """A type known only from a node's own figures: conservative defaults for the rest."""
    family = re.split(r"[-_\s]+", spelling.strip())[0] or spelling
    return GpuType(
        name=GpuTypeName(spelling),
        family=family,
        bf16_tflops=None,
        fp16_tflops=None,
        fp32_tflops=None,
        memory_gib=0.0,
        memory_bandwidth_gbs=1000.0,
        interconnect_gbs=32.0,
        gpus_per_node=max(gpus, 1),
        node_network_gbps=100.0,
        hourly_usd=1.0,
        gemm_efficiency=0.5,
    )


def _check_consistent_types(nodes: Sequence[NodeCapacity]) -> None:
    first: dict[str, NodeCapacity] = {}
    for node in nodes:
        seen = first.setdefault(node.gpu_type.name, node)
        if seen.gpu_type != node.gpu_type:
            raise UserError(
                f"node {node.name}: its figures for GPU type {node.gpu_type.name} differ from "
                f"node {seen.name}'s; give one of them its own {LABEL_GPU_TYPE} label"
            )


def with_facts(node: NodeCapacity, item: Mapping[str, Any], *, used: Resources) -> NodeCapacity:
    """``node`` carrying what the scheduler reads of ``item`` (its Node object), ``used`` held."""
    spec = item.get("spec") or {}
    allocatable = dict((item.get("status") or {}).get("allocatable") or {})
    allocatable.setdefault(PODS, UNCOUNTED_PODS)
    facts = NodeFacts(
        name=str(node.name),
        labels=dict((item.get("metadata") or {}).get("labels") or {}),
        taints=taints_of(spec.get("taints")),
        unschedulable=bool(spec.get("unschedulable")),
        allocatable=rounded(resource_list(allocatable, f"node {node.name}: allocatable")),
    )
    return dataclasses.replace(node, facts=facts).holding(used)


UNCOUNTED_PODS = 1_000_000
"""The pod count of a node whose allocatable has none (a hand-written snapshot: a kubelet
always reports one): not a limit."""


def _not_ready_reason(item: Mapping[str, Any]) -> str:
    """Why the node is not Ready ("" when it is): the one exclusion no toleration lifts."""
    conditions = (item.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    if ready is None:
        return "NotReady (no Ready condition)"
    if str(ready.get("status")) != "True":
        return f"NotReady (Ready={ready.get('status')})"
    return ""


def _count(raw: Any, where: str, resource: str) -> int:
    try:
        value = int(str(raw))
    except ValueError:
        raise UserError(f"{where}: {resource}={raw!r} is not a whole number") from None
    if value < 0:
        raise UserError(f"{where}: {resource}={raw!r} is negative")
    return value


def _cpu_millis(raw: Any, where: str) -> int:
    text = str(raw).strip()
    try:
        if text.endswith("m"):
            return int(float(text[:-1]))
        return int(float(text) * 1000)
    except ValueError:
        raise UserError(f"{where}: cpu={raw!r} is not a CPU quantity") from None
