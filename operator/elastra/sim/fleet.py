"""The simulated cluster: a fleet file (``e2e/fleets/README.md``) or a NodeList, as an Inventory.

The fleet format is the one the real-cluster tooling applies with kwok; ``elastra.sim`` is part
of the installed package and ``e2e`` is not, so this is a second, small reader of the same
format that yields the same Node objects (labels, annotations, allocatable GPUs), marked
Ready, and hands them to the planner's ``parse_inventory``, so GPU types resolve exactly as the
operator resolves them. A NodeList (``kubectl get nodes -o yaml``) is accepted as is.

Errors are ``UserError``s naming the file, the line and the field (``groups[2].gpu.product``);
the whole file is checked before an inventory is returned.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from elastra.errors import UserError
from elastra.planner.inventory import Inventory, parse_inventory

GPU_RESOURCE = "nvidia.com/gpu"
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|Pi|M|G|T|P)?")
_TOP_FIELDS = {"kind", "apiVersion", "name", "description", "taint", "groups"}
_GROUP_FIELDS = {
    "prefix",
    "count",
    "gpu",
    "cpu",
    "memory",
    "pods",
    "zone",
    "block",
    "blockSize",
    "networkGbps",
    "labels",
    "annotations",
}


@dataclass(frozen=True)
class SimCluster:
    """What the simulator runs on: a name and the planner's inventory of GPU nodes."""

    name: str
    inventory: Inventory

    @property
    def gpus(self) -> int:
        """GPUs on schedulable GPU nodes."""
        return sum(n.free_gpus for n in self.inventory.nodes if not n.gpu_type.is_cpu)


def load_cluster(path: str | Path) -> SimCluster:
    """Read a fleet file or a NodeList file (see the module docstring)."""
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise UserError(f"{source}: cannot read: {err.strerror}") from None
    return parse_cluster(text, source=source)


def parse_cluster(text: str, *, source: str) -> SimCluster:
    """A fleet or NodeList document as a ``SimCluster``."""
    try:
        documents = [d for d in yaml.compose_all(text) if d is not None]
        data = [yaml.safe_load(yaml.serialize(d)) for d in documents]
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f"{mark.line + 1}" if mark is not None else "1"
        problem = getattr(err, "problem", None) or "syntax error"
        raise UserError(f"{source}:{line}: not valid YAML: {problem}") from None
    if not data:
        raise UserError(f"{source}:1: empty (expected a Fleet or a NodeList)")
    if len(data) == 1 and isinstance(data[0], dict) and data[0].get("kind") == "Fleet":
        return _fleet(data[0], _Lines(documents[0]), source=source)
    try:
        inventory = parse_inventory(data)
    except UserError as err:
        raise UserError(f"{source}:{_line_of_node(text, str(err))}: {err}") from None
    return SimCluster(name=Path(source).stem, inventory=inventory)


class _Lines:
    """Line numbers of the values in a composed YAML document, by path."""

    def __init__(self, root: yaml.Node) -> None:
        self.lines: dict[tuple[str | int, ...], int] = {}
        self._walk(root, ())

    def _walk(self, node: yaml.Node, path: tuple[str | int, ...]) -> None:
        self.lines[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                name = str(key.value)
                self.lines[(*path, name)] = key.start_mark.line + 1
                self._walk(value, (*path, name))
                self.lines[(*path, name)] = key.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._walk(item, (*path, i))

    def of(self, *path: str | int) -> int:
        """The line of ``path``, or of its nearest ancestor that exists."""
        while path and path not in self.lines:
            path = path[:-1]
        return self.lines.get(path, 1)


def _fleet(data: Mapping[str, Any], lines: _Lines, *, source: str) -> SimCluster:
    def fail(path: tuple[str | int, ...], problem: str) -> UserError:
        shown = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")
        return UserError(f"{source}:{lines.of(*path)}: {shown}: {problem}")

    unknown = sorted(set(data) - _TOP_FIELDS)
    if unknown:
        raise fail((unknown[0],), "unknown field")
    name = data.get("name")
    if not isinstance(name, str) or not _DNS_LABEL.fullmatch(name):
        raise fail(("name",), f"must be a lower-case DNS label, got {name!r}")
    taint = data.get("taint", True)
    if not isinstance(taint, bool):
        raise fail(("taint",), "must be true or false")
    groups = data.get("groups")
    if not isinstance(groups, list) or not groups:
        raise fail(("groups",), "must be a non-empty list")
    nodes: list[dict[str, Any]] = []
    prefixes: set[str] = set()
    for i, group in enumerate(groups):
        where = ("groups", i)
        made = _group_nodes(group, name, taint=taint, where=where, fail=fail)
        prefix = str(group["prefix"])
        if prefix in prefixes:
            raise fail((*where, "prefix"), f"repeats prefix {prefix!r}")
        prefixes.add(prefix)
        if made:
            field = "gpu.product" if "gpu" in group else "labels"
            try:
                unusable = [n for n in parse_inventory(made[:1]).excluded if n.category]
            except UserError as err:
                raise fail((*where, *field.split(".")), str(err)) from None
            if unusable:  # a fleet's GPUs are the author's to name: a typo is an error here
                raise fail((*where, *field.split(".")), unusable[0].reason)
        nodes.extend(made)
    return SimCluster(name=name, inventory=parse_inventory(nodes))


def _group_nodes(
    group: Any, fleet: str, *, taint: bool, where: tuple[str | int, ...], fail: Any
) -> list[dict[str, Any]]:
    """The Node objects of one group, as the fleet format defines them."""
    if not isinstance(group, dict):
        raise fail(where, "a group must be a mapping")
    unknown = sorted(set(group) - _GROUP_FIELDS)
    if unknown:
        raise fail((*where, unknown[0]), "unknown field")
    prefix = group.get("prefix")
    if not isinstance(prefix, str) or not _DNS_LABEL.fullmatch(prefix) or len(prefix) > 50:
        raise fail((*where, "prefix"), f"must be a lower-case DNS label, got {prefix!r}")
    count = _integer(group, "count", where, fail, required=True)
    gpu = group.get("gpu") or {}
    if not isinstance(gpu, dict):
        raise fail((*where, "gpu"), "must be a mapping with product and count")
    extra = sorted(set(gpu) - {"product", "count"})
    if extra:
        raise fail((*where, "gpu", extra[0]), "unknown field")
    gpus = _integer(gpu, "count", (*where, "gpu"), fail) or 0
    product = gpu.get("product")
    if gpus and not isinstance(product, str):
        raise fail((*where, "gpu", "product"), "required when gpu.count > 0")
    resources: dict[str, str] = {}
    for key in ("cpu", "memory"):
        value = group.get(key)
        value = str(value) if isinstance(value, int | float | str) else None
        if value is None or not _QUANTITY.fullmatch(value):
            raise fail((*where, key), f"must be a Kubernetes quantity, got {group.get(key)!r}")
        resources[key] = value
    pods = _integer(group, "pods", where, fail) or 110
    block_size = _integer(group, "blockSize", where, fail)
    network = _integer(group, "networkGbps", where, fail)
    labels = _strings(group, "labels", where, fail)
    annotations = _strings(group, "annotations", where, fail)
    zone, block = group.get("zone"), group.get("block")
    nodes = []
    for index in range(count or 0):
        node_labels = {"kubernetes.io/hostname": f"{prefix}-{index}", "elastra.dev/fleet": fleet}
        node_annotations: dict[str, str] = {}
        allocatable = {**resources, "pods": str(pods)}
        if gpus:
            allocatable[GPU_RESOURCE] = str(gpus)
            node_labels["nvidia.com/gpu.product"] = str(product)
        if zone:
            node_labels["topology.kubernetes.io/zone"] = str(zone)
        if block_size:
            node_labels["elastra.dev/block"] = f"{block or prefix + '-block'}-{index // block_size}"
        elif block:
            node_labels["elastra.dev/block"] = str(block)
        if network is not None:
            node_annotations["elastra.dev/network-gbps"] = str(network)
        node_labels.update(labels)
        node_annotations.update(annotations)
        nodes.append(
            {
                "kind": "Node",
                "metadata": {
                    "name": f"{prefix}-{index}",
                    "labels": node_labels,
                    "annotations": node_annotations,
                },
                "spec": (
                    {
                        "taints": [
                            {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}
                        ]
                    }
                    if taint
                    else {}
                ),
                "status": {
                    "allocatable": allocatable,
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }
        )
    return nodes


def _integer(
    raw: Mapping[str, Any],
    key: str,
    where: tuple[str | int, ...],
    fail: Any,
    *,
    required: bool = False,
) -> int | None:
    value = raw.get(key)
    if value is None:
        if required:
            raise fail((*where, key), "required")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise fail((*where, key), f"must be a non-negative integer, got {value!r}")
    if key == "blockSize" and value < 1:
        raise fail((*where, key), "must be >= 1")
    return value


def _strings(
    raw: Mapping[str, Any], key: str, where: tuple[str | int, ...], fail: Any
) -> dict[str, str]:
    value = raw.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise fail((*where, key), "must be a mapping of strings")
    return {str(k): str(v) for k, v in value.items()}


def _line_of_node(text: str, message: str) -> int:
    """The line of ``name: NODE`` for the node a NodeList error names (1 if none)."""
    found = re.search(r"node (\S+?):", message)
    if found:
        pattern = re.compile(rf"^\s*name:\s*['\"]?{re.escape(found.group(1))}['\"]?\s*$")
        for number, line in enumerate(text.splitlines(), start=1):
            if pattern.match(line):
                return number
    return 1
