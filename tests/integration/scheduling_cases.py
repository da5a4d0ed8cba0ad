"""Seeded random (node, pod) pairs for the planner-versus-kube-scheduler agreement test.

Each case is one Node (labels, some numeric for Gt/Lt, taints of every effect, a cordon,
allocatable CPU, memory, pods, GPUs and an extended resource), up to two pods already bound
to it (created with ``nodeName``, so the scheduler does not place them) and one pod to
schedule (tolerations, nodeSelector, required node affinity with every operator and
``matchFields``, requests from containers, init containers and native sidecars). Everything
generated is valid to the API server, which would refuse the pod otherwise; values the
scheduler cannot read (a Gt value that is no integer, a label ``1.5``) are valid API input
and are generated on purpose.

Case pod i may only ever go to node i: each of its non-empty affinity terms gets
``matchFields metadata.name In [node i]``, exactly as Elastra pins its pods
(``manifests._affinity``); an empty term matches no node and stays empty; a pod without
required affinity gets one term holding only the pin. On node i that pin always holds, so the
case's own semantics are unchanged there.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

RUN_LABEL = "elastra.dev/agreement-run"
ROLE_LABEL = "elastra.dev/agreement-role"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
GPU = "nvidia.com/gpu"
FPGA = "example.com/fpga"
H100 = "NVIDIA-H100-80GB-HBM3"

LABELS: dict[str, tuple[str, ...]] = {
    "example.com/zone": ("a", "b", "c"),
    "example.com/pool": ("ml", "batch", ""),
    "example.com/gen": ("0", "1", "3", "7", "10", "007", "1.5", "x7", "99999999999999999999"),
    "example.com/cores": ("2", "8", "64"),
}
"""Label keys and the values nodes take; ``gen`` and ``cores`` are read by Gt/Lt."""
TAINT_KEYS = ("example.com/dedicated", "example.com/spot", GPU, "team")
TAINT_VALUES = ("", "ml", "true")
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
CORDON_KEY = "node.kubernetes.io/unschedulable"
NUMBERS = ("0", "1", "2", "5", "8", "10", "x", "2.5")
"""Gt/Lt values, two of which the scheduler cannot read as integers."""


@dataclass(frozen=True)
class Case:
    """One node, the pods already bound to it, and the pod to schedule there."""

    index: int
    node: dict[str, Any]
    bound: tuple[dict[str, Any], ...]
    pod: dict[str, Any]

    @property
    def node_name(self) -> str:
        return str(self.node["metadata"]["name"])


def cases(seed: int, count: int, *, run: str) -> list[Case]:
    """``count`` cases from ``seed``; names carry ``run`` so runs never collide."""
    rng = random.Random(seed)
    return [_case(rng, i, run=run) for i in range(count)]


def _case(rng: random.Random, index: int, *, run: str) -> Case:
    name = f"agree-{run}-{index}"
    node = _node(rng, name, run=run)
    bound = tuple(
        _bound_pod(rng, f"{name}-b{k}", name, run=run) for k in range(rng.choice((0, 0, 1, 2)))
    )
    return Case(index=index, node=node, bound=bound, pod=_pod(rng, name, node, run=run))


def _node(rng: random.Random, name: str, *, run: str) -> dict[str, Any]:
    labels = {RUN_LABEL: run}
    for key, values in LABELS.items():
        if rng.random() < 0.7:
            labels[key] = rng.choice(values)
    taints = []
    pairs = [(k, e) for k in TAINT_KEYS for e in EFFECTS]
    for key, effect in rng.sample(pairs, rng.choice((0, 0, 0, 1, 1, 2))):
        taint = {"key": key, "effect": effect}
        value = rng.choice(TAINT_VALUES)
        if value:
            taint["value"] = value
        taints.append(taint)
    allocatable = {
        "cpu": rng.choice(("1500m", "4", "16", "16")),
        "memory": rng.choice(("1536Mi", "8Gi", "16Gi", "16Gi")),
        "pods": rng.choice(("1", "2", "3", "110", "110")),
    }
    gpus = rng.choice((0, 1, 4, 8, 8))
    if gpus:
        allocatable[GPU] = str(gpus)
        labels["nvidia.com/gpu.product"] = H100
    if rng.random() < 0.3:
        allocatable[FPGA] = rng.choice(("1", "2"))
    if rng.random() < 0.3:
        allocatable["ephemeral-storage"] = "10Gi"
    spec: dict[str, Any] = {"taints": taints} if taints else {}
    if rng.random() < 0.08:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {KWOK_ANNOTATION: "fake"}},
        "spec": spec,
        "status": {"capacity": dict(allocatable), "allocatable": dict(allocatable)},
    }


def _requests(rng: random.Random, *, gpus: bool) -> dict[str, str]:
    found: dict[str, str] = {}
    for resource, choices in (
        ("cpu", ("", "100m", "500m", "1", "3")),
        ("memory", ("", "128Mi", "1Gi", "1Gi", "3Gi")),
    ):
        value = rng.choice(choices)
        if value:
            found[resource] = value
    if gpus and rng.random() < 0.35:
        found[GPU] = rng.choice(("1", "1", "2", "4", "8"))
    if rng.random() < 0.1:
        found[FPGA] = "1"
    if rng.random() < 0.08:
        found["ephemeral-storage"] = "1Gi"
    return found


def _small_requests(rng: random.Random) -> dict[str, str]:
    """What a pod already bound holds: some CPU and memory, sometimes a GPU."""
    found = {"cpu": rng.choice(("100m", "500m", "1")), "memory": rng.choice(("128Mi", "512Mi"))}
    if rng.random() < 0.3:
        found[GPU] = "1"
    return found


def _container(name: str, requests: dict[str, str]) -> dict[str, Any]:
    extended = {k: v for k, v in requests.items() if "/" in k}
    resources: dict[str, Any] = {"requests": requests}
    if extended:
        resources["limits"] = extended  # extended resources need limits equal to requests
    return {"name": name, "image": "elastra-worker:dev", "resources": resources}


def _bound_pod(rng: random.Random, name: str, node: str, *, run: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {RUN_LABEL: run, ROLE_LABEL: "bound"}},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "tolerations": [{"operator": "Exists"}],
            "containers": [_container("c", _small_requests(rng))],
        },
    }


def _pod(rng: random.Random, name: str, node: dict[str, Any], *, run: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [_container("main", _requests(rng, gpus=True))],
    }
    if rng.random() < 0.3:
        init = _container("init", _requests(rng, gpus=False))
        if rng.random() < 0.5:
            init["restartPolicy"] = "Always"  # a native sidecar
        spec["initContainers"] = [init]
    taints = node["spec"].get("taints") or []
    tolerations = [_toleration(rng, t) for t in taints if rng.random() < 0.8]
    tolerations += [_toleration(rng, None) for _ in range(rng.choice((0, 0, 1)))]
    if node["spec"].get("unschedulable") and rng.random() < 0.5:
        tolerations.append(_toleration(rng, {"key": CORDON_KEY, "effect": "NoSchedule"}))
    rng.shuffle(tolerations)
    if tolerations:
        spec["tolerations"] = tolerations
    selector = _selector(rng, node)
    if selector:
        spec["nodeSelector"] = selector
    terms = _terms(rng, node) if rng.random() < 0.6 else []
    pin = {"key": "metadata.name", "operator": "In", "values": [node["metadata"]["name"]]}
    pinned = [
        {**t, "matchFields": [pin, *t.get("matchFields", [])]} if t else t for t in terms
    ] or [{"matchFields": [pin]}]
    spec["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": pinned}
        }
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {RUN_LABEL: run, ROLE_LABEL: "case"}},
        "spec": spec,
    }


def _toleration(rng: random.Random, taint: dict[str, str] | None) -> dict[str, str]:
    """A toleration aimed at ``taint`` (mostly matching it, sometimes by a wrong value or
    effect), or at any taint when ``None``; always valid API input."""
    if taint is not None:
        key, value = taint["key"], taint.get("value", "")
        effect = taint["effect"] if rng.random() < 0.7 else rng.choice((*EFFECTS, ""))
    else:
        key = rng.choice((*TAINT_KEYS, CORDON_KEY, "", ""))
        value = rng.choice(TAINT_VALUES)
        effect = rng.choice((*EFFECTS, ""))
    found = {"key": key} if key else {}
    if not key or rng.random() < 0.4:
        found["operator"] = "Exists"
    else:
        if rng.random() < 0.5:
            found["operator"] = "Equal"
        if rng.random() < 0.15:
            value = rng.choice(TAINT_VALUES)  # sometimes the wrong value
        if value:
            found["value"] = value
    if effect:
        found["effect"] = effect
    return found


def _selector(rng: random.Random, node: dict[str, Any]) -> dict[str, str]:
    labels = node["metadata"]["labels"]
    selector = {}
    for _ in range(rng.choice((0, 0, 1, 2))):
        present = sorted(k for k in LABELS if k in labels)
        key = rng.choice(present if present and rng.random() < 0.8 else sorted(LABELS))
        if key in labels and rng.random() < 0.9:
            selector[key] = labels[key]
        else:
            selector[key] = rng.choice(LABELS[key])
    return selector


def _terms(rng: random.Random, node: dict[str, Any]) -> list[dict[str, Any]]:
    terms: list[dict[str, Any]] = []
    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.1:
            terms.append({})  # matches no node
            continue
        term: dict[str, Any] = {}
        expressions = [_expression(rng, node) for _ in range(rng.choice((0, 1, 1, 2, 3)))]
        if expressions:
            term["matchExpressions"] = expressions
        if rng.random() < 0.2:
            own = node["metadata"]["name"]
            other = f"{own}-elsewhere"
            operator = rng.choice(("In", "NotIn"))
            term["matchFields"] = [
                {"key": "metadata.name", "operator": operator, "values": [rng.choice((own, other))]}
            ]
        terms.append(term)
    return terms


def _expression(rng: random.Random, node: dict[str, Any]) -> dict[str, Any]:
    """Any expression; more often one the node passes, so that terms match in about half the
    cases and each rule is tested both ways."""
    labels = node["metadata"]["labels"]
    key = rng.choice(sorted(LABELS))
    if rng.random() < 0.5:
        return _passing(rng, key, labels.get(key))
    operator = rng.choice(("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"))
    found: dict[str, Any] = {"key": key, "operator": operator}
    if operator in ("In", "NotIn"):
        pool = list(LABELS[key])
        have = node["metadata"]["labels"].get(key)
        if have is not None and rng.random() < 0.7:
            pool = [have]
        found["values"] = sorted(set(rng.sample(pool, min(len(pool), rng.randint(1, 2)))))
    elif operator in ("Gt", "Lt"):
        found["values"] = [rng.choice(NUMBERS)]
    return found


def _passing(rng: random.Random, key: str, have: str | None) -> dict[str, Any]:
    """An expression that a node with ``key=have`` (``None``: no such label) passes."""
    if have is None:
        if rng.random() < 0.5:
            return {"key": key, "operator": "DoesNotExist"}
        return {"key": key, "operator": "NotIn", "values": [rng.choice(LABELS[key])]}
    if have.isdigit() and len(have) < 10 and rng.random() < 0.5:
        number = int(have)
        if number > 0 and rng.random() < 0.5:
            return {"key": key, "operator": "Gt", "values": [str(number - 1)]}
        return {"key": key, "operator": "Lt", "values": [str(number + 1)]}
    operator = rng.choice(("In", "Exists", "NotIn"))
    if operator == "Exists":
        return {"key": key, "operator": "Exists"}
    if operator == "In":
        return {"key": key, "operator": "In", "values": sorted({have, rng.choice(LABELS[key])})}
    others = [v for v in LABELS[key] if v != have] or ["none"]
    return {"key": key, "operator": "NotIn", "values": [rng.choice(others)]}
