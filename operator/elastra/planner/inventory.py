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
- Network: ``elastra.dev/network-gbps`` (the node's NIC total, Gbit/s), else the catalog's
  default for the type.
- Topology: ``topology.kubernetes.io/zone``, ``elastra.dev/block``, ``kubernetes.io/hostname``.
- Not capacity: cordoned (``spec.unschedulable``), not Ready, or carrying a NoSchedule or
  NoExecute taint that worker pods do not tolerate. Worker pods tolerate kwok's
  ``kwok.x-k8s.io/node=fake:NoSchedule`` (simulated nodes) and ``nvidia.com/gpu`` taints
  (Kubernetes' ExtendedResourceToleration admission adds that toleration to GPU pods).
  Excluded nodes are listed with the reason, so a plan can say why capacity is missing.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NewType

from elastra.errors import UserError
from elastra.planner.catalog import CPU_TYPE, GpuType, GpuTypeName, by_name, lookup

NodeName = NewType("NodeName", str)

GPU_RESOURCE = "nvidia.com/gpu"
LABEL_PRODUCT = "nvidia.com/gpu.product"
LABEL_GPU_TYPE = "elastra.dev/gpu-type"
LABEL_BLOCK = "elastra.dev/block"
LABEL_ZONE = "topology.kubernetes.io/zone"
LABEL_HOSTNAME = "kubernetes.io/hostname"
ANN_NETWORK = "elastra.dev/network-gbps"
ANN_TFLOPS = "elastra.dev/gpu-tflops"
ANN_MEMORY = "elastra.dev/gpu-memory-gib"
ANN_INTERCONNECT = "elastra.dev/gpu-interconnect-gbps"
ANN_PRICE = "elastra.dev/gpu-hourly-usd"

TOLERATED_TAINTS: tuple[tuple[str, str | None], ...] = (
    ("kwok.x-k8s.io/node", "fake"),
    ("nvidia.com/gpu", None),
)
"""(key, value) of NoSchedule/NoExecute taints worker pods tolerate; None matches any value."""

_FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


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


@dataclass(frozen=True)
class ExcludedNode:
    """A node that is not capacity, and why."""

    name: NodeName
    reason: str


@dataclass(frozen=True)
class Inventory:
    """Schedulable nodes sorted by name, plus the excluded ones with reasons."""

    nodes: tuple[NodeCapacity, ...]
    excluded: tuple[ExcludedNode, ...] = ()

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
    *,
    tolerated: Sequence[tuple[str, str | None]] = TOLERATED_TAINTS,
) -> Inventory:
    """Typed capacity from Node objects, less what running ``pods`` already request."""
    used_gpus: dict[str, int] = {}
    used_cpu: dict[str, int] = {}
    for pod in pods:
        node_name, gpus, cpu = pod_usage(pod)
        if node_name:
            used_gpus[node_name] = used_gpus.get(node_name, 0) + gpus
            used_cpu[node_name] = used_cpu.get(node_name, 0) + cpu
    capacities: list[NodeCapacity] = []
    excluded: list[ExcludedNode] = []
    names: set[str] = set()
    for item in node_items(nodes):
        metadata = item.get("metadata") or {}
        name = str(metadata.get("name") or "")
        if not name:
            raise UserError("a Node without metadata.name")
        if name in names:
            raise UserError(f"node {name}: listed twice")
        names.add(name)
        reason = _unschedulable_reason(item, tolerated)
        if reason:
            excluded.append(ExcludedNode(NodeName(name), reason))
            continue
        capacities.append(_capacity(item, name, used_gpus.get(name, 0), used_cpu.get(name, 0)))
    capacities.sort(key=lambda n: n.name)
    excluded.sort(key=lambda n: n.name)
    _check_consistent_types(capacities)
    return Inventory(nodes=tuple(capacities), excluded=tuple(excluded))


def _capacity(item: Mapping[str, Any], name: str, used_gpus: int, used_cpu: int) -> NodeCapacity:
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

    gpus = _count(allocatable.get(GPU_RESOURCE, 0), f"node {name}", GPU_RESOURCE)
    cpu_millis = _cpu_millis(allocatable.get("cpu", 0), f"node {name}")
    gpu_type = _gpu_type(name, labels, gpus=gpus, figure=figure)
    network = figure(ANN_NETWORK) or gpu_type.node_network_gbps
    return NodeCapacity(
        name=NodeName(name),
        gpu_type=gpu_type,
        free_gpus=max(0, gpus - used_gpus) if not gpu_type.is_cpu else 0,
        free_cpu_millis=max(0, cpu_millis - used_cpu),
        network_gbps=network,
        zone=str(labels.get(LABEL_ZONE, "")),
        block=str(labels.get(LABEL_BLOCK, labels.get(LABEL_HOSTNAME, name))),
    )


def _gpu_type(name: str, labels: Mapping[str, str], *, gpus: int, figure: Any) -> GpuType:
    label_key = LABEL_GPU_TYPE if LABEL_GPU_TYPE in labels else LABEL_PRODUCT
    spelling = labels.get(label_key)
    tflops: float | None = figure(ANN_TFLOPS)
    memory: float | None = figure(ANN_MEMORY)
    if spelling is None:
        if gpus == 0:
            return by_name(CPU_TYPE)
        if tflops is None or memory is None:
            raise UserError(
                f"node {name}: has {gpus} {GPU_RESOURCE} but no {LABEL_PRODUCT} or "
                f"{LABEL_GPU_TYPE} label; label it with a catalog type, or annotate "
                f"{ANN_TFLOPS} and {ANN_MEMORY}"
            )
        spelling = f"custom-{name}"
    base = lookup(str(spelling))
    if base is None:
        if tflops is None or memory is None:
            raise UserError(
                f"node {name}: unknown GPU type {spelling!r} in label {label_key}; use a "
                f"catalog name (see `elastra.planner.catalog`), or annotate the node with "
                f"{ANN_TFLOPS} and {ANN_MEMORY}"
            )
        base = _custom_type(str(spelling), gpus=gpus)
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


def _unschedulable_reason(
    item: Mapping[str, Any], tolerated: Sequence[tuple[str, str | None]]
) -> str:
    spec = item.get("spec") or {}
    if spec.get("unschedulable"):
        return "cordoned (spec.unschedulable)"
    conditions = (item.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    if ready is None:
        return "NotReady (no Ready condition)"
    if str(ready.get("status")) != "True":
        return f"NotReady (Ready={ready.get('status')})"
    for taint in spec.get("taints") or []:
        effect = taint.get("effect")
        if effect not in {"NoSchedule", "NoExecute"}:
            continue
        key, value = taint.get("key"), taint.get("value")
        if any(key == k and (v is None or value == v) for k, v in tolerated):
            continue
        shown = f"{key}={value}" if value else str(key)
        return f"tainted {shown}:{effect}"
    return ""


def pod_usage(pod: Mapping[str, Any]) -> tuple[str, int, int]:
    """(node name, GPUs, CPU millicores) a pod holds; nothing for finished or unbound pods."""
    spec = pod.get("spec") or {}
    phase = (pod.get("status") or {}).get("phase")
    node = str(spec.get("nodeName") or "")
    if not node or phase in _FINISHED_PHASES:
        return "", 0, 0
    name = str((pod.get("metadata") or {}).get("name", "?"))

    def amounts(containers: Any, resource: str) -> list[int]:
        found = []
        for container in containers or []:
            resources = container.get("resources") or {}
            requested = (resources.get("requests") or {}).get(resource)
            if requested is None:
                requested = (resources.get("limits") or {}).get(resource)
            if requested is None:
                found.append(0)
            elif resource == "cpu":
                found.append(_cpu_millis(requested, f"pod {name}"))
            else:
                found.append(_count(requested, f"pod {name}", resource))
        return found

    def usage(resource: str) -> int:
        # Init containers run before the app containers: a pod holds the larger of the two.
        app = sum(amounts(spec.get("containers"), resource))
        init = max(amounts(spec.get("initContainers"), resource), default=0)
        return max(app, init)

    return node, usage(GPU_RESOURCE), usage("cpu")


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
