"""Worker pods built from a job with a pod template: the template's additions, merged with
what Elastra owns, and Elastra's parts intact (pin, gate, assignment, security context, the
read-only root and its bounded /tmp); and the job's NetworkPolicy."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from elastra.api import parse_trainingjob
from elastra.controller.decide.manifests import (
    ANNOTATION_ASSIGNMENT,
    GANG_GATE,
    LABEL_JOB,
    WORKER_UID,
    RankSpec,
    assignment_json,
    headless_service,
    network_policy,
    owner_reference,
    pod_name,
    slot_of,
    worker_constraints,
    worker_pod,
)
from elastra.controller.settings import OperatorSettings, PodPeer
from elastra.errors import UserError
from elastra.planner.eligibility import WorkerConstraints, as_built_for
from elastra.planner.inventory import parse_inventory
from elastra.planner.scheduling import NodeFacts, PodConstraints, PodToleration, Taint, refusal
from elastra_worker.assignment import ParallelPlan, parse_assignment
from elastra_worker.metrics import READY_PATH
from elastra_worker.push import POD_UID_ENV, PUBLIC_KEY_ENV
from tests.cases.specs import DELETE, FULL_TEMPLATE, TEMPLATE, apply_edits, base_manifest
from tests.unit.planner.nodes import node as planner_node
from tests.unit.planner.nodes import node_list
from tests.unit.test_helm_chart import restricted_violations

NODE = "h100-3"
KWOK = PodToleration(key="kwok.x-k8s.io/node", value="fake")
SETTINGS = OperatorSettings(tolerations=(KWOK,))


def build(
    edits: dict[str, Any] | None = None, settings: OperatorSettings = SETTINGS
) -> dict[str, Any]:
    """The pod of slot 0 of the base case job with these edits, planned onto ``NODE``."""
    body = apply_edits(base_manifest("gpt"), edits or {})
    body["metadata"].update(namespace="team-a", uid="u-1")
    job = parse_trainingjob(body)
    return worker_pod(
        job,
        slot=0,
        node=NODE,
        gpu_type="H100",
        assignment='{"worldVersion": 1}',
        version=1,
        settings=settings,
    )


def templated(**worker: Any) -> dict[str, Any]:
    """The pod of a job whose worker has the full template (and these other worker fields)."""
    edits = {"spec.worker.template": copy.deepcopy(FULL_TEMPLATE)}
    edits.update({f"spec.worker.{k}": v for k, v in worker.items()})
    return build(edits)


def container(pod: dict[str, Any], name: str, key: str = "containers") -> dict[str, Any]:
    (found,) = [c for c in pod["spec"].get(key, []) if c["name"] == name]
    return found


def env_names(pod: dict[str, Any]) -> list[str]:
    return [e["name"] for e in container(pod, "worker")["env"]]


def test_secret_backed_env_reaches_the_worker_before_elastras_own() -> None:
    pod = templated(env=[{"name": "NCCL_DEBUG", "value": "WARN"}])
    env = {e["name"]: e for e in container(pod, "worker")["env"]}
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hub-token", "key": "token"}}
    assert env["RUN_NAME"]["valueFrom"]["configMapKeyRef"]["key"] == "run"
    assert env["NODE"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env_names(pod) == [
        "NCCL_DEBUG",  # spec.worker.env
        "HF_TOKEN", "RUN_NAME", "NODE", "LOG_LEVEL",  # the template's worker entry
        "ELASTRA_ASSIGNMENT_FILE", "ELASTRA_METRICS_PORT", "POD_NAME", "POD_UID", "ELASTRA_LAUNCH",
        "ELASTRA_MAX_RESTARTS", "ELASTRA_CPU_MILLIS", "ELASTRA_MODEL",  # Elastra's
        "HOME", "TMPDIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR",  # scratch
        "HF_HOME", "TORCH_HOME",  # the cache volume
        "ELASTRA_GRACE_SECONDS",  # the agent's deadline from the pod's, unless the job sets it
    ]  # fmt: skip
    assert container(pod, "worker")["envFrom"] == [{"configMapRef": {"name": "train-config"}}]
    cpu = env["ELASTRA_CPU_MILLIS"]["valueFrom"]["resourceFieldRef"]
    assert cpu == {"containerName": "worker", "resource": "requests.cpu", "divisor": "1m"}


def test_configmap_volume_is_added_and_mounted_beside_elastras() -> None:
    pod = templated()
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["config"] == {"name": "config", "configMap": {"name": "train-config"}}
    assert {"assignment", "checkpoints", "tmp", "dshm"} <= set(volumes)
    assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": "case-checkpoints"}
    mounts = {m["mountPath"]: m for m in container(pod, "worker")["volumeMounts"]}
    assert mounts["/etc/train"] == {"name": "config", "mountPath": "/etc/train", "readOnly": True}
    assert mounts["/etc/elastra"]["name"] == "assignment"
    assert mounts["/checkpoints"]["name"] == "checkpoints"


def test_the_assignment_volume_shows_the_annotation() -> None:
    pod = build()
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "assignment"]
    assert volume["downwardAPI"]["items"] == [
        {
            "path": "assignment",
            "fieldRef": {"fieldPath": f"metadata.annotations['{ANNOTATION_ASSIGNMENT}']"},
        }
    ]
    env = {e["name"]: e.get("value") for e in container(pod, "worker")["env"]}
    assert env["ELASTRA_ASSIGNMENT_FILE"] == "/etc/elastra/assignment"


@pytest.mark.parametrize("public_key", ["", "A6EHv/POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg="])
def test_the_worker_gets_its_pod_uid_and_the_operators_public_key(public_key: str) -> None:
    """What pushed assignments are checked with: the uid they are signed for, the public key
    of the running operator (none where it has none: the pod works from its file)."""
    settings = OperatorSettings(assignment_public_key=public_key)
    env = {e["name"]: e for e in container(build(settings=settings), "worker")["env"]}
    assert env[POD_UID_ENV]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    if public_key:
        assert env[PUBLIC_KEY_ENV] == {"name": PUBLIC_KEY_ENV, "value": public_key}
    else:
        assert PUBLIC_KEY_ENV not in env


def requested(resource: str) -> dict[str, str]:
    """The toleration ExtendedResourceToleration admission gives a pod requesting ``resource``."""
    return {"key": resource, "operator": "Exists", "effect": "NoSchedule"}


def test_tolerations_are_added_to_elastras() -> None:
    assert templated()["spec"]["tolerations"] == [
        KWOK.to_wire(),
        {"key": "example.com/dedicated", "operator": "Equal", "value": "nlp",
         "effect": "NoSchedule"},
        requested("nvidia.com/gpu"),
    ]  # fmt: skip


GPU_EXISTS = requested("nvidia.com/gpu")
GPU_PRESENT = {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present"}
EFA = "vpc.amazonaws.com/efa"


@pytest.mark.parametrize(
    ("edits", "gpu_type", "added"),
    [
        ({}, "H100-SXM-80GB", ["nvidia.com/gpu"]),
        ({"spec.worker.gpuTypes": ["MI300X", "H100"]}, "MI300X", ["amd.com/gpu"]),
        ({"spec.worker.gpus": 0, "spec.worker.gpuTypes": DELETE}, "CPU", []),
        # the template's own is the very toleration: not added twice
        ({"spec.worker.template": {"spec": {"tolerations": [GPU_EXISTS]}}}, "H100", []),
        # one with a value tolerates less: the plugin's is added beside it
        ({"spec.worker.template": {"spec": {"tolerations": [GPU_PRESENT]}}}, "H100",
         ["nvidia.com/gpu"]),
        # every extended resource requested, in name order; native ones never
        ({"spec.worker.resources": {"requests": {EFA: "4", "hugepages-2Mi": "1Gi"},
                                    "limits": {EFA: "4", "hugepages-2Mi": "1Gi"}}},
         "H100", ["nvidia.com/gpu", EFA]),
        # a sidecar's limit alone is a request (the API server defaults one to the other)
        ({"spec.worker.template": {"spec": {"containers": [
            {"name": "rdma", "image": "r:1", "resources": {"limits": {"rdma/ib": "1"}}}]}}},
         "H100", ["nvidia.com/gpu", "rdma/ib"]),
    ],
)  # fmt: skip
def test_a_pod_tolerates_the_taint_of_each_extended_resource_it_requests(
    edits: dict[str, Any], gpu_type: str, added: list[str]
) -> None:
    """As Kubernetes' ExtendedResourceToleration admission plugin would (read from its 1.36
    source): after the operator's and the template's, ``Exists``/``NoSchedule``."""
    job = job_of(edits)
    pod = worker_pod(
        job, slot=0, node=NODE, gpu_type=gpu_type, assignment="{}", version=1, settings=SETTINGS
    )
    own = [KWOK.to_wire(), *(job.spec.worker.template.to_wire()["spec"].get("tolerations", [])
                              if job.spec.worker.template else [])]  # fmt: skip
    assert pod["spec"]["tolerations"] == [*own, *(requested(r) for r in added)]


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ("priorityClassName", "training-high"),
        ("serviceAccountName", "trainer"),
        ("imagePullSecrets", [{"name": "registry-creds"}]),
        ("nodeSelector", {"example.com/pool": "training"}),
        ("automountServiceAccountToken", False),
        ("schedulingGates", [{"name": GANG_GATE}]),
        ("restartPolicy", "Never"),
    ],
)
def test_pod_fields_from_the_template_and_elastras_stay(field: str, expected: Any) -> None:
    assert templated()["spec"][field] == expected


def test_labels_and_annotations_merge_and_elastras_win() -> None:
    edits = {"spec.worker.template": copy.deepcopy(FULL_TEMPLATE)}
    edits["spec.worker.template"]["metadata"]["labels"]["app.kubernetes.io/managed-by"] = "me"
    meta = build(edits)["metadata"]
    assert meta["labels"]["team"] == "nlp"
    assert meta["labels"]["app.kubernetes.io/managed-by"] == "elastra"
    assert meta["labels"][LABEL_JOB] == "gpt"
    assert meta["annotations"]["example.com/owner"] == "nlp-oncall"
    assert meta["annotations"][ANNOTATION_ASSIGNMENT] == '{"worldVersion": 1}'


def test_sidecar_and_init_containers_follow_the_worker_with_restricted_contexts() -> None:
    pod = templated()
    assert [c["name"] for c in pod["spec"]["containers"]] == ["worker", "metrics-agent"]
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["fetch", "log-shipper"]
    agent = container(pod, "metrics-agent")
    assert agent["image"] == "example.com/agent:1.2"
    assert agent["ports"] == [{"containerPort": 9500, "name": "agent"}]
    assert agent["readinessProbe"] == {"httpGet": {"path": "/ready", "port": 9500}}
    assert container(pod, "log-shipper", "initContainers")["restartPolicy"] == "Always"
    assert restricted_violations(pod["spec"]) == []


def test_worker_keeps_what_elastra_owns() -> None:
    worker = container(templated(), "worker")
    assert worker["image"] == "elastra-worker:dev"
    assert worker["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert worker["ports"] == [{"name": "metrics", "containerPort": 9400}]


def test_the_worker_turns_ready_once_its_agent_is_warm() -> None:
    """The startup probe asks the agent on its metrics port, every second, for long enough
    to import torch on a crowded node."""
    probe = container(templated(), "worker")["startupProbe"]
    assert probe["httpGet"] == {"path": READY_PATH, "port": "metrics"}
    assert probe["periodSeconds"] == 1
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 600


@pytest.mark.parametrize(
    ("gpu_type", "gpu_types", "resource"),
    [
        ("MI300X", ["MI300X", "H100"], "amd.com/gpu"),
        ("H100-SXM-80GB", ["MI300X", "H100"], "nvidia.com/gpu"),
        ("", ["MI300X"], "amd.com/gpu"),  # not planned yet (a Workload's pod template)
        ("", ["MI300X", "H100"], "nvidia.com/gpu"),
        ("", [], "nvidia.com/gpu"),
    ],
)
def test_pods_request_gpus_by_their_planned_types_vendor(
    gpu_type: str, gpu_types: list[str], resource: str
) -> None:
    body = apply_edits(base_manifest("gpt"), {"spec.worker.gpuTypes": gpu_types})
    body["metadata"].update(namespace="team-a", uid="u-1")
    pod = worker_pod(
        parse_trainingjob(body), slot=0, node=NODE, gpu_type=gpu_type, assignment="{}",
        version=1, settings=SETTINGS,
    )  # fmt: skip
    resources = container(pod, "worker")["resources"]
    assert resources["limits"] == resources["requests"] == {resource: "8"}


def test_required_node_terms_are_anded_with_the_pin() -> None:
    affinity = templated()["spec"]["affinity"]
    pin = {"key": "metadata.name", "operator": "In", "values": [NODE]}
    required = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required["nodeSelectorTerms"] == [
        {
            "matchExpressions": [
                {"key": "example.com/rack", "operator": "In", "values": ["r1", "r2"]}
            ],
            "matchFields": [pin],
        }
    ]
    assert affinity["podAntiAffinity"] == FULL_TEMPLATE["spec"]["affinity"]["podAntiAffinity"]


def test_without_a_template_the_pod_is_pinned_by_one_term() -> None:
    spec = build()["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms == {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
        ]
    }
    assert [c["name"] for c in spec["containers"]] == ["worker"]
    for absent in ("initContainers", "nodeSelector", "priorityClassName", "serviceAccountName"):
        assert absent not in spec
    assert restricted_violations(spec) == []


@pytest.mark.parametrize(
    ("shm_size", "volume"),
    [
        (None, {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}),
        ("8Gi", {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}),
        ("0", None),
        ("0Mi", None),
    ],
)
def test_dev_shm_is_a_sized_memory_volume_unless_zero(
    shm_size: str | None, volume: dict[str, Any] | None
) -> None:
    pod = build({} if shm_size is None else {"spec.worker.shmSize": shm_size})
    volumes = [v for v in pod["spec"]["volumes"] if v["name"] == "dshm"]
    mounts = [m for m in container(pod, "worker")["volumeMounts"] if m["name"] == "dshm"]
    assert volumes == ([volume] if volume else [])
    assert mounts == ([{"name": "dshm", "mountPath": "/dev/shm"}] if volume else [])


def test_baseline_relaxes_the_pod_and_sidecars_but_not_the_worker() -> None:
    pod = templated(podSecurity="baseline")
    spec = pod["spec"]
    assert spec["securityContext"] == {"fsGroup": WORKER_UID}
    assert "securityContext" not in container(pod, "metrics-agent")
    assert "securityContext" not in container(pod, "fetch", "initContainers")
    worker_only = {**spec, "containers": [container(pod, "worker")], "initContainers": []}
    assert restricted_violations(worker_only) == []
    assert restricted_violations(spec) != []


def test_restricted_is_the_default() -> None:
    spec = templated()["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for c in [*spec["containers"], *spec["initContainers"]]:
        assert c["securityContext"]["allowPrivilegeEscalation"] is False, c["name"]
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}, c["name"]


@pytest.mark.parametrize(("launch", "expected"), [(None, "elastra"), ("torchrun", "torchrun")])
def test_the_launch_mode_reaches_the_agent(launch: str | None, expected: str) -> None:
    pod = build({"spec.worker.launch": launch} if launch else {})
    env = {e["name"]: e.get("value") for e in container(pod, "worker")["env"]}
    assert env["ELASTRA_LAUNCH"] == expected


@pytest.mark.parametrize(
    ("worker", "local"),
    [
        ({"gpus": 8}, 8),
        ({"gpus": 0, "cpuRanks": 2}, 2),
        ({"gpus": 0}, 1),
    ],
)
def test_each_pod_runs_one_rank_per_gpu_or_cpu_rank(worker: dict[str, Any], local: int) -> None:
    edits: dict[str, Any] = {f"spec.worker.{k}": v for k, v in worker.items()}
    if not worker["gpus"]:
        edits["spec.worker.gpuTypes"] = []
    body = apply_edits(base_manifest("gpt"), edits)
    job = parse_trainingjob(body)
    plan = ParallelPlan(dp=1, tp=local, batch_shares=(256,))
    wire = assignment_json(
        job,
        version=1,
        rank=RankSpec(rank=0, world_size=local, master_addr="gpt-w0.gpt", plan=plan),
        stop=False,
        settings=SETTINGS,
    )
    assert json.loads(wire)["localWorldSize"] == local


@pytest.mark.parametrize(
    ("edits", "precision", "gpus"),
    [
        ({}, "bf16", 8),  # training.precision's default, and the base job's 8 GPUs a pod
        ({"spec.training.precision": "fp16", "spec.worker.gpus": 2}, "fp16", 2),
        ({"spec.training.precision": "fp32", "spec.worker.gpus": 0,
          "spec.worker.gpuTypes": []}, "fp32", 0),
    ],
)  # fmt: skip
def test_the_assignment_carries_the_precision_and_the_pods_gpus(
    edits: dict[str, Any], precision: str, gpus: int
) -> None:
    job = parse_trainingjob(apply_edits(base_manifest("gpt"), edits))
    local = job.spec.worker.ranks_per_pod
    rank = RankSpec(
        rank=0, world_size=local, master_addr="gpt-w0.gpt", plan=ParallelPlan(dp=1, tp=local)
    )
    for spec in (rank, None):  # in a world, and waiting
        wire = json.loads(assignment_json(job, version=1, rank=spec, stop=False, settings=SETTINGS))
        assert (wire["precision"], wire["gpus"]) == (precision, gpus)


@pytest.mark.parametrize(("edits", "asynchronous"), [
    ({}, True),  # the default: periodic checkpoints written in the background
    ({"spec.checkpoint.asynchronous": False}, False),
])  # fmt: skip
def test_the_checkpoints_asynchronous_field_reaches_the_worker(
    edits: dict[str, Any], asynchronous: bool
) -> None:
    job = parse_trainingjob(apply_edits(base_manifest("gpt"), edits))
    local = job.spec.worker.ranks_per_pod
    rank = RankSpec(
        rank=0, world_size=local, master_addr="gpt-w0.gpt", plan=ParallelPlan(dp=1, tp=local)
    )
    text = assignment_json(job, version=1, rank=rank, stop=False, settings=SETTINGS)
    assert parse_assignment(text).checkpoint.asynchronous is asynchronous


@pytest.mark.parametrize(
    ("pod_grace", "agent_grace"), [(120, "105"), (30, "23"), (8, "6"), (1, "1")]
)
def test_the_agent_gets_the_pods_grace_period_less_a_margin(
    pod_grace: int, agent_grace: str
) -> None:
    pod = build(settings=OperatorSettings(termination_grace_seconds=pod_grace))
    assert pod["spec"]["terminationGracePeriodSeconds"] == pod_grace
    env = {e["name"]: e.get("value") for e in container(pod, "worker")["env"]}
    assert env["ELASTRA_GRACE_SECONDS"] == agent_grace
    own = build({"spec.worker.env": [{"name": "ELASTRA_GRACE_SECONDS", "value": "40"}]})
    assert [e["value"] for e in container(own, "worker")["env"]
            if e["name"] == "ELASTRA_GRACE_SECONDS"] == ["40"]  # fmt: skip


@pytest.mark.parametrize(
    ("edits", "restarts"), [({}, "10"), ({"spec.failurePolicy.maxRestarts": 3}, "3")]
)
def test_the_failure_policys_restarts_reach_the_agent(edits: dict[str, Any], restarts: str) -> None:
    """``failurePolicy.maxRestarts`` (default 10), for torchrun's ``TORCHELASTIC_MAX_RESTARTS``;
    the job's own ``worker.env`` cannot contradict the policy."""
    own = {"spec.worker.env": [{"name": "ELASTRA_MAX_RESTARTS", "value": "99"}]}
    env = container(build({**edits, **own}), "worker")["env"]
    assert {e["name"]: e.get("value") for e in env}["ELASTRA_MAX_RESTARTS"] == restarts


def test_the_model_section_reaches_the_reference_trainer() -> None:
    env = {e["name"]: e.get("value") for e in container(build(), "worker")["env"]}
    model = json.loads(env["ELASTRA_MODEL"])
    assert model == base_manifest()["spec"]["model"]
    assert "ELASTRA_MODEL" not in env_names(build({"spec.model": DELETE}))


# --- read-only root, bounded /tmp -----------------------------------------------------------


@pytest.mark.parametrize("level", ["restricted", "baseline"])
def test_the_worker_root_is_read_only_and_sidecars_are_left_alone(level: str) -> None:
    pod = templated(podSecurity=level)
    assert container(pod, "worker")["securityContext"]["readOnlyRootFilesystem"] is True
    for sidecar in (container(pod, "metrics-agent"), container(pod, "fetch", "initContainers")):
        assert "readOnlyRootFilesystem" not in (sidecar.get("securityContext") or {})


@pytest.mark.parametrize(
    ("settings", "size"),
    [(SETTINGS, "1Gi"), (OperatorSettings(worker_tmp_size="256Mi"), "256Mi")],
)
def test_tmp_is_a_size_limited_volume_mounted_at_tmp(settings: OperatorSettings, size: str) -> None:
    pod = build(settings=settings)
    (tmp,) = [v for v in pod["spec"]["volumes"] if v["name"] == "tmp"]
    assert tmp == {"name": "tmp", "emptyDir": {"sizeLimit": size}}
    (mount,) = [m for m in container(pod, "worker")["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert mount == {"name": "tmp", "mountPath": "/tmp"}


def test_every_writable_mount_of_the_worker_is_a_volume() -> None:
    """What the trainer may write: /tmp, the checkpoints and /dev/shm; the assignment is not."""
    mounts = {m["mountPath"]: m for m in container(build(), "worker")["volumeMounts"]}
    writable = sorted(path for path, m in mounts.items() if not m.get("readOnly"))
    assert writable == ["/checkpoints", "/dev/shm", "/tmp", "/var/cache/elastra"]
    assert mounts["/etc/elastra"]["readOnly"] is True


def test_home_tmpdir_and_torch_caches_point_into_tmp() -> None:
    env = {e["name"]: e.get("value") for e in container(build(), "worker")["env"]}
    assert env["HOME"] == "/tmp"
    assert env["TMPDIR"] == "/tmp"
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/tmp/torchinductor"
    assert env["TRITON_CACHE_DIR"] == "/tmp/triton"


CACHE = "/var/cache/elastra"


@pytest.mark.parametrize(
    ("edits", "settings", "size"),
    [
        ({}, SETTINGS, "20Gi"),  # the default
        ({}, OperatorSettings(worker_cache_size="50Gi"), "50Gi"),  # the chart's workerCacheSize
        ({"spec.worker.cacheSize": "100Gi"}, OperatorSettings(worker_cache_size="50Gi"), "100Gi"),
    ],
)
def test_hf_and_torch_caches_are_on_a_cache_volume_whose_size_the_job_can_set(
    edits: dict[str, Any], settings: OperatorSettings, size: str
) -> None:
    pod = build(edits, settings=settings)
    (cache,) = [v for v in pod["spec"]["volumes"] if v["name"] == "elastra-cache"]
    assert cache == {"name": "elastra-cache", "emptyDir": {"sizeLimit": size}}
    worker = container(pod, "worker")
    assert {"name": "elastra-cache", "mountPath": CACHE} in worker["volumeMounts"]
    env = {e["name"]: e.get("value") for e in worker["env"]}
    assert (env["HF_HOME"], env["TORCH_HOME"]) == (f"{CACHE}/huggingface", f"{CACHE}/torch")


@pytest.mark.parametrize(
    ("where", "entry"),
    [
        ("spec.worker.env", {"name": "HF_HOME", "value": "/models/hf"}),
        (f"{TEMPLATE}.containers", {"name": "worker",
                                   "env": [{"name": "HF_HOME", "value": "/models/hf"}]}),
    ],
)  # fmt: skip
def test_the_jobs_own_hf_home_wins(where: str, entry: dict[str, Any]) -> None:
    pod = build({where: [entry]})
    env = [(e["name"], e.get("value")) for e in container(pod, "worker")["env"]]
    assert [v for k, v in env if k == "HF_HOME"] == ["/models/hf"]  # one entry: the job's
    assert ("TORCH_HOME", f"{CACHE}/torch") in env  # the other still on the cache volume


def test_a_template_volume_mounted_at_the_cache_path_wins() -> None:
    """The template's volume is the cache (a claim of downloaded models); Elastra's stays in
    the pod, unmounted, since the template may mount it elsewhere."""
    worker = {"name": "worker", "volumeMounts": [{"name": "models", "mountPath": CACHE + "/"}]}
    models = {"name": "models", "persistentVolumeClaim": {"claimName": "hf-models"}}
    pod = build({f"{TEMPLATE}.containers": [worker], f"{TEMPLATE}.volumes": [models]})
    mounts = [
        m for m in container(pod, "worker")["volumeMounts"] if m["mountPath"].rstrip("/") == CACHE
    ]
    assert mounts == [{"name": "models", "mountPath": CACHE + "/"}]
    assert "elastra-cache" in [v["name"] for v in pod["spec"]["volumes"]]
    env = {e["name"]: e.get("value") for e in container(pod, "worker")["env"]}
    assert env["HF_HOME"] == f"{CACHE}/huggingface"  # into the template's volume


@pytest.mark.parametrize(
    ("where", "name"),
    [("spec.worker.env", "HOME"), ("template", "TMPDIR"), ("template", "TRITON_CACHE_DIR")],
)
def test_the_jobs_own_scratch_variables_win(where: str, name: str) -> None:
    """HOME, TMPDIR and the caches are not Elastra's (the API allows them): the job's value
    stays, once, and Elastra's default for that variable is left out."""
    ours = {"name": name, "value": "/data/own"}
    if where == "template":
        template = copy.deepcopy(FULL_TEMPLATE)
        template["spec"]["containers"][0]["env"].append(ours)
        pod = build({"spec.worker.template": template})
    else:
        pod = build({where: [ours]})
    entries = [e for e in container(pod, "worker")["env"] if e["name"] == name]
    assert entries == [ours]


def test_a_template_may_mount_a_writable_volume_of_its_own_outside_tmp() -> None:
    """How a trainer that writes to its home directory runs on the read-only root."""
    template = copy.deepcopy(FULL_TEMPLATE)
    template["spec"]["volumes"].append({"name": "home", "emptyDir": {"sizeLimit": "1Gi"}})
    home = {"name": "home", "mountPath": "/home/elastra"}
    template["spec"]["containers"][0]["volumeMounts"].append(home)
    worker = container(build({"spec.worker.template": template}), "worker")
    assert home in worker["volumeMounts"]
    assert worker["securityContext"]["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize(
    ("addition", "reason"),
    [
        ({"volumeMounts": [{"name": "cache", "mountPath": "/tmp"}]}, "/tmp: Elastra mounts"),
        ({"securityContext": {"readOnlyRootFilesystem": False}}, "securityContext is Elastra's"),
    ],
)
def test_a_template_cannot_replace_tmp_or_make_the_root_writable(
    addition: dict[str, Any], reason: str
) -> None:
    """The API promises the worker's /tmp and security context are Elastra's: such a job is
    refused (by the same rules the CRD's CEL holds), never built with the template's value."""
    template = copy.deepcopy(FULL_TEMPLATE)
    template["spec"]["containers"][0].update(addition)
    with pytest.raises(UserError, match=reason):
        build({"spec.worker.template": template})


# --- the job's NetworkPolicy ----------------------------------------------------------------

OPERATOR = PodPeer(
    namespace="elastra-system",
    labels=(("app.kubernetes.io/name", "elastra"), ("app.kubernetes.io/component", "operator")),
)
JOB_PEERS = {"from": [{"podSelector": {"matchLabels": {LABEL_JOB: "gpt"}}}]}


def job_and_service() -> tuple[Any, dict[str, Any]]:
    body = base_manifest("gpt")
    body["metadata"].update(namespace="team-a", uid="u-1")
    job = parse_trainingjob(body)
    return job, headless_service(job)


def operator_rule(port: int) -> dict[str, Any]:
    """Ingress from the operator's pods, in its namespace, to ``port`` only."""
    namespace = {"matchLabels": {"kubernetes.io/metadata.name": "elastra-system"}}
    pods = {
        "matchLabels": {
            "app.kubernetes.io/name": "elastra",
            "app.kubernetes.io/component": "operator",
        }
    }
    peer = {"namespaceSelector": namespace, "podSelector": pods}
    return {"from": [peer], "ports": [{"protocol": "TCP", "port": port}]}


def with_scraper(rule: dict[str, Any], namespace: str) -> dict[str, Any]:
    """``rule`` letting in every pod of ``namespace`` too (a scraper listed without labels)."""
    scraper = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "podSelector": {"matchLabels": {}},
    }
    return {**rule, "from": [*rule["from"], scraper]}


@pytest.mark.parametrize(
    ("settings", "ingress"),
    [
        (OperatorSettings(metrics_peers=(OPERATOR,)), [JOB_PEERS, operator_rule(9400)]),
        (
            OperatorSettings(metrics_peers=(OPERATOR,), metrics_port=9500),
            [JOB_PEERS, operator_rule(9500)],
        ),
        (
            OperatorSettings(metrics_peers=(OPERATOR, PodPeer(namespace="monitoring"))),
            [JOB_PEERS, with_scraper(operator_rule(9400), "monitoring")],
        ),
        (OperatorSettings(), [JOB_PEERS]),  # the operator outside the cluster: no pod to name
    ],
)
def test_network_policy_admits_the_job_on_any_port_and_the_operator_on_metrics(
    settings: OperatorSettings, ingress: list[dict[str, Any]]
) -> None:
    job, service = job_and_service()
    policy = network_policy(service, settings)
    assert policy is not None
    assert policy["apiVersion"] == "networking.k8s.io/v1"
    assert policy["metadata"]["name"] == "gpt"
    assert policy["metadata"]["namespace"] == "team-a"
    assert policy["metadata"]["ownerReferences"] == [owner_reference(job)]
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {LABEL_JOB: "gpt"}}
    assert spec["policyTypes"] == ["Ingress"]  # egress open: object storage, DNS
    assert spec["ingress"] == ingress  # the job's own rule names no port: any port


def test_network_policy_selects_exactly_the_job_worker_pods() -> None:
    _, service = job_and_service()
    policy = network_policy(service, SETTINGS)
    assert policy is not None
    labels = build()["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    other = {**labels, LABEL_JOB: "other"}
    assert not policy["spec"]["podSelector"]["matchLabels"].items() <= other.items()


def test_no_network_policy_when_switched_off() -> None:
    _, service = job_and_service()
    assert network_policy(service, OperatorSettings(network_policy=False)) is None


@pytest.mark.parametrize(
    ("pod", "slot"),
    [
        (pod_name("gpt", 7), 7),
        ("gpt-w12", 12),
        ("gpt-w", None),
        ("gpt-wx", None),
        ("other-w3", None),  # another job's pod
        ("gpt-w-1", None),
    ],
)
def test_slot_of_reads_back_pod_name(pod: str, slot: int | None) -> None:
    assert slot_of("gpt", pod) == slot


def job_of(edits: dict[str, Any]) -> Any:
    body = apply_edits(base_manifest("gpt"), edits)
    body["metadata"].update(namespace="team-a", uid="u-1")
    return parse_trainingjob(body)


REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
RACKS = {"key": "example.com/rack", "operator": "In", "values": ["r1", "r2"]}


@pytest.mark.parametrize(
    ("terms", "pinned_terms"),
    [
        ([{"matchExpressions": [RACKS]}, {"matchFields": []}], 1),  # an empty term stays empty
        ([{"matchExpressions": [RACKS]}, {"matchExpressions": [RACKS]}], 2),
    ],
)
def test_the_planner_judges_nodes_by_the_pods_own_constraints_less_the_pin(
    terms: list[dict[str, Any]], pinned_terms: int
) -> None:
    """``worker_constraints`` and the pod the operator creates agree on every node: the pod's
    pin leaves only the planned node, and there both say the same."""
    template = copy.deepcopy(FULL_TEMPLATE)
    required = template["spec"]["affinity"]["nodeAffinity"]
    required["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] = terms
    job = job_of({"spec.worker.template": template})
    constraints = worker_constraints(job, SETTINGS)
    pod = worker_pod(
        job, slot=0, node=NODE, gpu_type="H100", assignment="{}", version=1, settings=SETTINGS
    )
    pinned = pod["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]
    assert sum(bool(t.get("matchFields")) for t in pinned) == pinned_terms
    unpinned = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": terms}}}
    assert constraints == WorkerConstraints.of(
        PodConstraints.of_pod_spec({**pod["spec"], "affinity": unpinned}),
        gpu_resource="nvidia.com/gpu",
        gpu_toleration_added=True,
    )
    assert constraints.requests.get("nvidia.com/gpu") == job.spec.worker.gpus
    keys = {t.key for t in constraints.tolerations}
    assert {"kwok.x-k8s.io/node", "nvidia.com/gpu", "example.com/dedicated"} <= keys
    as_created = PodConstraints.of_pod_spec(pod["spec"])
    labels = {"example.com/pool": "training", "example.com/rack": "r2"}
    taints = (Taint("example.com/dedicated", "nlp", "NoSchedule"),)
    for name, node_labels in [(NODE, labels), ("other", labels), (NODE, {}), ("other", {})]:
        facts = NodeFacts(name=name, labels=node_labels, taints=taints)
        planner_says = refusal(constraints, facts) == ""
        assert (refusal(as_created, facts) == "") == (planner_says and name == NODE)


GPU_NODES = {
    str(n.name): n
    for n in parse_inventory(
        node_list(
            planner_node("h100-0"),
            planner_node("mi300x-0", product=None, resource="amd.com/gpu",
                         labels={"elastra.dev/gpu-type": "MI300X"}),
        )
    ).nodes
}  # fmt: skip


def judged(pod: PodConstraints) -> tuple[Any, ...]:
    """What the scheduler's filters read, tolerations in any order."""
    return (set(pod.tolerations), pod.node_selector, pod.required_terms, pod.requests)


@pytest.mark.parametrize("node_name", sorted(GPU_NODES))
@pytest.mark.parametrize(
    ("gpu_types", "tolerations"),
    [
        ([], []),
        (["MI300X", "H100"], []),
        (["MI300X"], []),
        ([], [GPU_EXISTS]),
        (["MI300X"], [GPU_EXISTS]),
        (["MI300X", "H100"], [requested("amd.com/gpu"), GPU_EXISTS]),
    ],
)
def test_the_planner_judges_each_node_by_the_pod_built_for_its_gpu_type(
    node_name: str, gpu_types: list[str], tolerations: list[dict[str, str]]
) -> None:
    """On an AMD node the pod requests and tolerates ``amd.com/gpu``, on an NVIDIA node
    ``nvidia.com/gpu``, whichever resource the job's constraints use; a template's own GPU
    toleration stays."""
    edits: dict[str, Any] = {"spec.worker.gpuTypes": gpu_types}
    if tolerations:
        edits["spec.worker.template"] = {"spec": {"tolerations": tolerations}}
    job = job_of(edits)
    node = GPU_NODES[node_name]
    pod = worker_pod(
        job, slot=0, node=node_name, gpu_type=node.gpu_type.name, assignment="{}", version=1,
        settings=SETTINGS,
    )  # fmt: skip
    built = PodConstraints.of_pod_spec({**pod["spec"], "affinity": {}})
    assert built.requests.get(node.gpu_type.resource) == job.spec.worker.gpus
    assert judged(as_built_for(worker_constraints(job, SETTINGS), node)) == judged(built)


def test_without_a_template_the_constraints_carry_elastras_tolerations_only() -> None:
    constraints = worker_constraints(job_of({}), OperatorSettings())
    assert constraints.required_terms is None and constraints.node_selector == ()
    assert [t.key for t in constraints.tolerations] == ["nvidia.com/gpu"]
