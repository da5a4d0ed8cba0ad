"""Capacity-request pods: shaped like a worker as the scheduler sees it, never a worker, never
preempting; the GPU-type terms every provider's labels answer."""

from __future__ import annotations

from typing import Any

import pytest

from elastra.api import parse_trainingjob
from elastra.controller.decide.manifests import LABEL_JOB, worker_constraints, worker_pod
from elastra.controller.decide.placeholders import (
    KARPENTER_DO_NOT_DISRUPT,
    LABEL_CAPACITY_REQUEST,
    capacity_request_pod,
    gpu_type_terms,
    index_of,
    priority_class,
    request_name,
    requester,
)
from elastra.controller.settings import OperatorSettings
from elastra.planner.resources import pod_requests
from elastra.planner.scheduling import NodeFacts, PodConstraints, PodToleration, Taint, refusal
from tests.cases.specs import FULL_TEMPLATE, apply_edits, base_manifest
from tests.unit.test_helm_chart import restricted_violations

SETTINGS = OperatorSettings(tolerations=(PodToleration(key="kwok.x-k8s.io/node", value="fake"),))


def job(edits: dict[str, Any] | None = None) -> Any:
    body = apply_edits(base_manifest("gpt"), edits or {})
    body["metadata"].update(namespace="team-a", uid="u-1")
    return parse_trainingjob(body)


def request(edits: dict[str, Any] | None = None, index: int = 0) -> dict[str, Any]:
    return capacity_request_pod(job(edits), index=index, settings=SETTINGS)


def test_a_request_is_no_worker_and_belongs_to_its_job() -> None:
    pod = request(index=3)
    meta = pod["metadata"]
    assert meta["name"] == "gpt-cr3" and meta["namespace"] == "team-a"
    assert LABEL_JOB not in meta["labels"], "the job's worker listing must never see it"
    assert meta["labels"][LABEL_CAPACITY_REQUEST] == "gpt" and requester(pod) == "gpt"
    assert meta["ownerReferences"][0]["uid"] == "u-1", "deleted with its job"
    assert meta["annotations"][KARPENTER_DO_NOT_DISRUPT] == "true"
    assert requester(worker_pod(job(), slot=0, node="n", gpu_type="H100", assignment="",
                                version=0, settings=SETTINGS)) is None  # fmt: skip


def test_a_request_never_preempts_and_goes_at_once() -> None:
    spec = request()["spec"]
    assert spec["priorityClassName"] == SETTINGS.capacity_request_priority_class
    assert "preemptionPolicy" not in spec, "admission refuses one that differs from the class's"
    assert "priority" not in spec
    klass = priority_class(SETTINGS)
    assert klass["preemptionPolicy"] == "Never" and klass["value"] < 0
    assert klass["value"] > -10, "Cluster Autoscaler ignores pods below -10"
    assert spec["terminationGracePeriodSeconds"] <= 1
    assert "schedulingGates" not in spec, "an autoscaler never acts on a gated pod"
    assert spec["restartPolicy"] == "Always", "a command that cannot start keeps its node"


def test_a_request_asks_what_one_worker_asks_in_all() -> None:
    edits = {"spec.worker.template": FULL_TEMPLATE,
             "spec.worker.resources": {"requests": {"cpu": "8", "memory": "64Gi"}}}  # fmt: skip
    the_job = job(edits)
    worker = worker_pod(the_job, slot=0, node="n", gpu_type="H100", assignment="", version=0,
                        settings=SETTINGS)  # fmt: skip
    spec = capacity_request_pod(the_job, index=0, settings=SETTINGS)["spec"]
    assert pod_requests(spec, "request") == pod_requests(worker["spec"], "worker"), (
        "sidecars, native sidecars and init containers summed as the scheduler sums them"
    )
    (container,) = spec["containers"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert container["image"] == worker["spec"]["containers"][0]["image"]
    assert spec["imagePullSecrets"] == worker["spec"]["imagePullSecrets"]
    assert restricted_violations(spec) == []


def test_a_request_keeps_the_workers_constraints_without_the_pin() -> None:
    the_job = job({"spec.worker.template": FULL_TEMPLATE})
    spec = capacity_request_pod(the_job, index=0, settings=SETTINGS)["spec"]
    worker = worker_pod(the_job, slot=0, node="n", gpu_type="H100", assignment="", version=0,
                        settings=SETTINGS)["spec"]  # fmt: skip
    assert spec["tolerations"] == worker["tolerations"]
    assert spec["nodeSelector"] == {"example.com/pool": "training"}
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    for term in terms["nodeSelectorTerms"]:
        assert "matchFields" not in term, "Karpenter ignores a pod with matchFields"
        keys = [e["key"] for e in term["matchExpressions"]]
        assert keys[0] == "example.com/rack", "the template's term, ANDed with a type's"
    assert spec["affinity"]["podAntiAffinity"] == worker["affinity"]["podAntiAffinity"]


LABELLED = {
    "elastra": {"elastra.dev/gpu-type": "H100-SXM-80GB"},
    "gfd": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    "gke": {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
    "karpenter": {"karpenter.k8s.aws/instance-gpu-name": "h100"},
    "eks": {"node.kubernetes.io/instance-type": "p5.48xlarge"},
    "aks": {"node.kubernetes.io/instance-type": "Standard_ND96isr_H100_v5"},
    "gce": {"node.kubernetes.io/instance-type": "a3-highgpu-8g"},
    "a100": {"node.kubernetes.io/instance-type": "p4d.24xlarge"},
    "l4": {"cloud.google.com/gke-accelerator": "nvidia-l4"},
    "unlabelled": {},
}
POOL = {"example.com/pool": "training", "example.com/rack": "r1"}
TAINT = Taint("example.com/dedicated", "nlp", "NoSchedule")


def facts(labels: dict[str, str], **kw: Any) -> NodeFacts:
    return NodeFacts(name="n", labels={**POOL, **labels}, **kw)


@pytest.mark.parametrize(
    ("node", "worker_may", "request_may"),
    [
        *((facts(LABELLED[k]), True, True) for k in
          ("elastra", "gfd", "gke", "karpenter", "eks", "aks", "gce")),
        (facts(LABELLED["a100"]), True, False),
        (facts(LABELLED["l4"]), True, False),
        (facts(LABELLED["unlabelled"]), True, False),
        (facts(LABELLED["eks"], taints=(TAINT,)), True, True),
        (facts(LABELLED["eks"], taints=(Taint("sku", "gpu", "NoSchedule"),)), False, False),
        (NodeFacts(name="n", labels=LABELLED["eks"]), False, False),
        (facts(LABELLED["eks"], unschedulable=True), False, False),
    ],
)  # fmt: skip
def test_a_request_goes_where_a_worker_may_and_only_on_its_types(
    node: NodeFacts, worker_may: bool, request_may: bool
) -> None:
    """By the scheduler's own filters (``planner.scheduling``): the worker's constraints
    (the planner's view, whichever node the planner picks) refuse what the request refuses,
    and the request adds only the GPU type; the type's node under any provider's label."""
    the_job = job({"spec.worker.template": FULL_TEMPLATE})
    spec = capacity_request_pod(the_job, index=0, settings=SETTINGS)["spec"]
    mine = PodConstraints.of_pod_spec(spec).placement()
    worker = worker_constraints(the_job, SETTINGS).placement()
    assert (refusal(worker, node) == "") == worker_may
    assert (refusal(mine, node) == "") == request_may


def test_type_terms_name_the_type_in_each_providers_label_instance_type_last() -> None:
    terms = gpu_type_terms(["H100"])
    pairs = [(t["matchExpressions"][0]["key"], t["matchExpressions"][0]["values"]) for t in terms]
    keys = [k for k, _ in pairs]
    assert keys == [
        "elastra.dev/gpu-type",
        "nvidia.com/gpu.product",
        "cloud.google.com/gke-accelerator",
        "karpenter.k8s.aws/instance-gpu-name",
        "node.kubernetes.io/instance-type",
    ], "Karpenter keeps the last term: the instance type, which every provider knows"
    values = dict(pairs)
    assert {"p5.48xlarge", "a3-highgpu-8g", "Standard_ND96isr_H100_v5"} <= set(
        values["node.kubernetes.io/instance-type"]
    )
    assert "p4d.24xlarge" not in values["node.kubernetes.io/instance-type"]
    assert values["cloud.google.com/gke-accelerator"] == [
        "nvidia-h100-80gb", "nvidia-h100-mega-80gb"]  # fmt: skip
    assert values["karpenter.k8s.aws/instance-gpu-name"] == ["h100"]


def test_each_vendors_product_names_go_under_its_own_labellers_label() -> None:
    """GFD writes NVIDIA's product label, AMD's node labeller its own: an AMD type's products
    under NVIDIA's label could never match a node."""
    values = {
        t["matchExpressions"][0]["key"]: t["matchExpressions"][0]["values"]
        for t in gpu_type_terms(["MI300X"])
    }
    assert "nvidia.com/gpu.product" not in values
    assert "AMD_Instinct_MI300X_OAM" in values["amd.com/gpu.product-name"]
    nvidia = {t["matchExpressions"][0]["key"] for t in gpu_type_terms(["H100"])}
    assert "amd.com/gpu.product-name" not in nvidia


def test_an_ambiguous_karpenter_name_is_left_to_the_other_labels() -> None:
    """``a100`` is a 40 or an 80 GB part: only a job allowing both may ask by that name."""
    narrow = {t["matchExpressions"][0]["key"] for t in gpu_type_terms(["A100-SXM-80GB"])}
    assert "karpenter.k8s.aws/instance-gpu-name" not in narrow
    both = dict(
        (t["matchExpressions"][0]["key"], t["matchExpressions"][0]["values"])
        for t in gpu_type_terms(["A100"])
    )
    assert both["karpenter.k8s.aws/instance-gpu-name"] == ["a100"]


def test_no_types_no_type_terms() -> None:
    assert gpu_type_terms([]) == [] and gpu_type_terms(["no-such-gpu"]) == []
    spec = request({"spec.worker.gpuTypes": []})["spec"]
    assert "affinity" not in spec, "any GPU: the count is all that is asked"


@pytest.mark.parametrize(
    ("mixed", "turns"), [(True, [True, False, True, False]), (False, [True, True, True, True])]
)
def test_requests_of_a_job_of_two_types_prefer_them_in_turn_if_it_may_mix_them(
    mixed: bool, turns: list[bool]
) -> None:
    edits = {"spec.worker.gpuTypes": ["H100", "A100"], "spec.placement.heterogeneous": mixed}
    prefs = []
    for index in range(4):
        node_affinity = request(edits, index=index)["spec"]["affinity"]["nodeAffinity"]
        (preferred,) = node_affinity["preferredDuringSchedulingIgnoredDuringExecution"]
        expression = preferred["preference"]["matchExpressions"][0]
        assert expression["key"] == "node.kubernetes.io/instance-type"
        prefs.append("p5.48xlarge" in expression["values"])
        terms = node_affinity["requiredDuringSchedulingIgnoredDuringExecution"]
        allowed = terms["nodeSelectorTerms"][-1]["matchExpressions"][0]["values"]
        assert {"p5.48xlarge", "p4d.24xlarge"} <= set(allowed), "either type is acceptable"
    assert prefs == turns
    single = request()["spec"]["affinity"]["nodeAffinity"]
    assert "preferredDuringSchedulingIgnoredDuringExecution" not in single, "nothing to spread"


def test_a_request_preferring_an_amd_type_asks_for_amd_gpus() -> None:
    edits = {"spec.worker.gpuTypes": ["H100", "MI300X"], "spec.placement.heterogeneous": True}
    spec = request(edits, index=1)["spec"]
    assert spec["containers"][0]["resources"]["limits"] == {"amd.com/gpu": "8"}


@pytest.mark.parametrize(
    ("job_name", "pod", "index"),
    [("gpt", "gpt-cr0", 0), ("gpt", "gpt-cr12", 12), ("gpt", "gpt-w0", None),
     ("gpt", "gpt-crx", None), ("gpt", "other-cr0", None), ("a-cr0", "a-cr0-cr1", 1)],
)  # fmt: skip
def test_index_of_reads_back_request_name(job_name: str, pod: str, index: int | None) -> None:
    assert index_of(job_name, pod) == index
    if index is not None:
        assert request_name(job_name, index) == pod
