"""Fleet files: a declarative description of (simulated) cluster nodes.

Why: integration tests, scale tests and the trace simulator all need the same heterogeneous
GPU clusters, described once, small enough to read. A fleet file lists node groups (count, GPU
product as GPU Feature Discovery writes it, GPUs per node, CPU/memory, zone/block, network);
this module validates it and turns it into Node objects that kwok will simulate. The format is
documented in e2e/fleets/README.md. Only stdlib and PyYAML are used, so any tool can load it.

Guarantees: node names are unique across groups; the same file always yields the same nodes
in the same order; every error names the file, the group and the field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}
FLEET_LABEL = "elastra.dev/fleet"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
ZONE_LABEL = "topology.kubernetes.io/zone"
BLOCK_LABEL = "elastra.dev/block"
NETWORK_ANNOTATION = "elastra.dev/network-gbps"
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|Pi|M|G|T|P)?")


class FleetError(ValueError):
    """A fleet file is malformed; the message names the file, group and field."""


@dataclass(frozen=True)
class NodeGroup:
    """count identical nodes named <prefix>-<i>, i = 0..count-1."""

    prefix: str
    count: int
    cpu: str
    memory: str
    gpus: int = 0
    gpu_product: str | None = None
    pods: int = 110
    zone: str | None = None
    block: str | None = None
    block_size: int | None = None
    network_gbps: int | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)

    def node_names(self) -> list[str]:
        return [f"{self.prefix}-{i}" for i in range(self.count)]

    def block_of(self, index: int) -> str | None:
        """A fixed block, or runs of block_size nodes named <block>-<index // block_size>."""
        if self.block_size:
            return f"{self.block or self.prefix + '-block'}-{index // self.block_size}"
        return self.block


@dataclass(frozen=True)
class Fleet:
    name: str
    groups: tuple[NodeGroup, ...]
    taint: bool = True
    description: str = ""

    @property
    def node_count(self) -> int:
        return sum(g.count for g in self.groups)

    @property
    def gpu_count(self) -> int:
        return sum(g.count * g.gpus for g in self.groups)

    def node_manifests(self, *, kubelet_version: str = "") -> list[dict[str, Any]]:
        """Node objects for the API server (status included: kwok keeps the capacity)."""
        return [
            _node(self, group, index, kubelet_version)
            for group in self.groups
            for index in range(group.count)
        ]

    def summary(self) -> str:
        parts = [
            f"{g.count}x{g.gpus} {g.gpu_product}" if g.gpus else f"{g.count} cpu-only"
            for g in self.groups
        ]
        return f"{self.name}: {self.node_count} nodes, {self.gpu_count} GPUs ({', '.join(parts)})"


def _node(fleet: Fleet, group: NodeGroup, index: int, kubelet_version: str) -> dict[str, Any]:
    name = f"{group.prefix}-{index}"
    labels: dict[str, str] = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        FLEET_LABEL: fleet.name,
    }
    annotations: dict[str, str] = {
        KWOK_ANNOTATION: "fake",
        "node.alpha.kubernetes.io/ttl": "0",
    }
    resources = {"cpu": group.cpu, "memory": group.memory, "pods": str(group.pods)}
    if group.gpus:
        resources[GPU_RESOURCE] = str(group.gpus)
        labels["nvidia.com/gpu.present"] = "true"
        labels["nvidia.com/gpu.count"] = str(group.gpus)
        if group.gpu_product:
            labels[GPU_PRODUCT_LABEL] = group.gpu_product
    if group.zone:
        labels[ZONE_LABEL] = group.zone
    block = group.block_of(index)
    if block:
        labels[BLOCK_LABEL] = block
    if group.network_gbps is not None:
        annotations[NETWORK_ANNOTATION] = str(group.network_gbps)
    labels.update(group.labels)
    annotations.update(group.annotations)
    node: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {"taints": [dict(KWOK_TAINT)]} if fleet.taint else {},
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }
    if kubelet_version:
        node["status"]["nodeInfo"] = {"kubeletVersion": kubelet_version}
    return node


def _take(raw: dict[str, Any], key: str, kind: type, where: str, default: Any = None) -> Any:
    value = raw.pop(key, default)
    if value is None:
        return None
    if kind is int and isinstance(value, bool):
        raise FleetError(f"{where}: {key} must be an integer, not {value!r}")
    if kind is str and isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, kind):
        raise FleetError(f"{where}: {key} must be {kind.__name__}, not {value!r}")
    return value


def _string_map(value: Any, key: str, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise FleetError(f"{where}: {key} must be a mapping of strings")
    return {str(k): str(v) for k, v in value.items()}


def _group(raw: Any, where: str) -> NodeGroup:
    if not isinstance(raw, dict):
        raise FleetError(f"{where}: a group must be a mapping")
    raw = dict(raw)
    prefix = _take(raw, "prefix", str, where)
    if not prefix or not _DNS_LABEL.fullmatch(prefix) or len(prefix) > 50:
        raise FleetError(f"{where}: prefix must be a lower-case DNS label, got {prefix!r}")
    count = _take(raw, "count", int, where)
    if count is None or count < 0:
        raise FleetError(f"{where}: count must be a non-negative integer")
    gpu = raw.pop("gpu", None) or {}
    if not isinstance(gpu, dict):
        raise FleetError(f"{where}: gpu must be a mapping with product and count")
    gpu = dict(gpu)
    gpus = _take(gpu, "count", int, f"{where}.gpu", 0)
    product = _take(gpu, "product", str, f"{where}.gpu")
    if gpu:
        raise FleetError(f"{where}.gpu: unknown fields {sorted(gpu)}")
    if gpus and not product:
        raise FleetError(f"{where}.gpu: product is required when count > 0")
    cpu = _take(raw, "cpu", str, where)
    memory = _take(raw, "memory", str, where)
    for key, value in (("cpu", cpu), ("memory", memory)):
        if value is None or not _QUANTITY.fullmatch(value):
            raise FleetError(f"{where}: {key} must be a Kubernetes quantity, got {value!r}")
    block_size = _take(raw, "blockSize", int, where)
    if block_size is not None and block_size < 1:
        raise FleetError(f"{where}: blockSize must be >= 1")
    group = NodeGroup(
        prefix=prefix,
        count=count,
        cpu=cpu,
        memory=memory,
        gpus=gpus,
        gpu_product=product,
        pods=_take(raw, "pods", int, where, 110),
        zone=_take(raw, "zone", str, where),
        block=_take(raw, "block", str, where),
        block_size=block_size,
        network_gbps=_take(raw, "networkGbps", int, where),
        labels=_string_map(raw.pop("labels", None), "labels", where),
        annotations=_string_map(raw.pop("annotations", None), "annotations", where),
    )
    if raw:
        raise FleetError(f"{where}: unknown fields {sorted(raw)}")
    return group


def parse_fleet(data: Any, *, source: str = "<fleet>") -> Fleet:
    """Validate an already-parsed fleet document."""
    if not isinstance(data, dict) or data.get("kind") != "Fleet":
        raise FleetError(f"{source}: not a fleet file (expected 'kind: Fleet' at the top)")
    data = dict(data)
    data.pop("kind")
    data.pop("apiVersion", None)
    name = _take(data, "name", str, source)
    if not name or not _DNS_LABEL.fullmatch(name):
        raise FleetError(f"{source}: name must be a lower-case DNS label, got {name!r}")
    raw_groups = data.pop("groups", None)
    if not isinstance(raw_groups, list) or not raw_groups:
        raise FleetError(f"{source}: groups must be a non-empty list")
    groups = tuple(_group(g, f"{source}: groups[{i}]") for i, g in enumerate(raw_groups))
    taint = data.pop("taint", True)
    if not isinstance(taint, bool):
        raise FleetError(f"{source}: taint must be true or false")
    description = str(data.pop("description", "") or "")
    if data:
        raise FleetError(f"{source}: unknown fields {sorted(data)}")
    seen: dict[str, int] = {}
    for i, g in enumerate(groups):
        if g.prefix in seen:
            raise FleetError(f"{source}: groups[{i}] repeats prefix {g.prefix!r}")
        seen[g.prefix] = i
    return Fleet(name=name, groups=groups, taint=taint, description=description)


def load_fleet(path: Path | str) -> Fleet:
    """Read and validate a fleet file."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise FleetError(f"{path}: no such fleet file") from None
    except yaml.YAMLError as exc:
        raise FleetError(f"{path}: not valid YAML: {exc}") from None
    return parse_fleet(data, source=str(path))


def resolve_fleet_path(name_or_path: str, fleets_dir: Path) -> Path:
    """'hetero-small' -> e2e/fleets/hetero-small.yaml; a path is returned as is."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or candidate.exists():
        return candidate
    return fleets_dir / f"{name_or_path}.yaml"
