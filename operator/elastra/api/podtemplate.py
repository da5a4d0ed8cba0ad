"""``spec.worker.template``: what a user may add to every worker pod, and what stays Elastra's.

A worker pod is Elastra's: it pins the pod to the planned node, holds it behind the gang
gate, shows it its assignment and sets its security context. Users still need volumes,
Secret-backed environment variables, sidecars, tolerations and the like, so the template is
a PodTemplateSpec *subset* with an allow-list, merged into the pod Elastra builds
(``controller/decide/manifests.py``).

The allow-list is modelled field by field so the CRD can say what is allowed and the CEL rules
can say why something is not. ``x-kubernetes-preserve-unknown-fields`` is used only for inner
objects Kubernetes validates itself when the pod is created (a volume's source, an affinity
term, a probe). Fields Elastra owns are declared too, only so that a rule can reject them
with a reason instead of the API server pruning them in silence.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, StringConstraints, WithJsonSchema

from elastra.api.base import ApiModel
from elastra.api.formats import (
    ABSOLUTE_PATH,
    Arg,
    DnsLabel,
    DnsName,
    EnvName,
    Quantity,
    ResourceName,
)
from elastra.api.rules import Rule
from elastra.planner.catalog import GPU_RESOURCES

WORKER_CONTAINER = "worker"
"""The container that runs the trainer; a template entry with this name adds to it."""

CACHE_VOLUME = "elastra-cache"
"""The worker's cache volume (``HF_HOME``, ``TORCH_HOME``; ``controller.decide.manifests``)."""
CACHE_DIR = "/var/cache/elastra"
"""Where the cache volume is mounted in the worker container."""
DEFAULT_CACHE_SIZE = "20Gi"
"""The cache volume's sizeLimit unless the operator or the job says otherwise: room for a 7B
model's weights in bf16 (about 14 GB) beside torch hub's downloads."""

RESERVED_VOLUMES = ("assignment", "checkpoints", "dshm", "tmp", CACHE_VOLUME)
"""Volumes Elastra adds to every worker pod."""

RESERVED_ENV = (
    "ELASTRA_ASSIGNMENT_FILE",
    "ELASTRA_METRICS_PORT",
    "POD_NAME",
    "ELASTRA_LAUNCH",
    "ELASTRA_MODEL",
    "ELASTRA_MAX_RESTARTS",
)
"""Environment variables Elastra sets in the worker container."""


def spelled(names: tuple[str, ...], last: str) -> str:
    """``a, b and c`` (``last``: ``and``/``or``): a tuple of names in a message."""
    return f"{', '.join(names[:-1])} {last} {names[-1]}" if len(names) > 1 else names[0]


RESERVED_MOUNT_PATHS = ("/etc/elastra", "/dev/shm", "/tmp")
"""Where Elastra mounts the assignment, shared memory and scratch space in the worker."""

WORKER_OWNED = ("image", "command", "args", "resources")
"""Worker container fields set through ``spec.worker``, so the planner and the pod agree."""

WORKER_CLOSED = (
    "imagePullPolicy",
    "workingDir",
    "ports",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "lifecycle",
    "restartPolicy",
)
"""Other container fields the worker entry may not set: the agent and Elastra rely on them."""

VOLUME_SOURCES = (
    "configMap",
    "secret",
    "persistentVolumeClaim",
    "emptyDir",
    "projected",
    "csi",
    "ephemeral",
    "downwardAPI",
)
"""Volume types allowed in the template: those Pod Security "restricted" allows."""

KubeObject = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]
"""An inner object Kubernetes validates when the pod is created."""

LabelKey = Annotated[str, StringConstraints(min_length=1, max_length=317)]
LabelValue = Annotated[str, StringConstraints(max_length=63)]
AnnotationValue = Annotated[str, StringConstraints(max_length=65536)]
ELASTRA_PREFIX = "elastra.dev/"


def _one_of(fields: tuple[str, ...]) -> str:
    """CEL: exactly one of ``fields`` is set."""
    return " + ".join(f"(has(self.{f}) ? 1 : 0)" for f in fields) + " == 1"


def _none_of(fields: tuple[str, ...]) -> str:
    """CEL: none of ``fields`` is set."""
    return " && ".join(f"!has(self.{f})" for f in fields)


def _in(values: tuple[str, ...]) -> str:
    """A CEL list literal."""
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _python_names(model: ApiModel, aliases: tuple[str, ...]) -> list[str]:
    """Attribute names of wire names: the Python twin of a rule reads what its CEL reads."""
    by_alias = {info.alias or name: name for name, info in type(model).model_fields.items()}
    return [by_alias[a] for a in aliases]


def _unset(model: ApiModel, aliases: tuple[str, ...]) -> bool:
    """Python twin of ``_none_of``: the fields with these wire names are all unset."""
    return all(getattr(model, name) is None for name in _python_names(model, aliases))


def _set_count(model: ApiModel, aliases: tuple[str, ...] | None = None) -> int:
    """Python twin of ``_one_of``: how many of the fields (default: all but name) are set."""
    names = (
        _python_names(model, aliases)
        if aliases is not None
        else [n for n in type(model).model_fields if n != "name"]
    )
    return sum(getattr(model, name) is not None for name in names)


class PodSecurity(StrEnum):
    """The Pod Security level worker pods are built for.

    ``restricted``: every container runs non-root, without privilege escalation, with all
    capabilities dropped and the RuntimeDefault seccomp profile. ``baseline``: the worker
    container stays so, but Elastra adds nothing to the pod's and the other containers'
    security contexts, so a sidecar that runs as root or needs the runtime's default
    capabilities can run in a namespace whose policy is baseline.
    """

    RESTRICTED = "restricted"
    BASELINE = "baseline"


def _no_gpus_in(field: str) -> str:
    """CEL: the ResourceList ``field`` names none of the GPU resources."""
    absent = " && ".join(f"!('{name}' in self.{field})" for name in GPU_RESOURCES)
    return f"(!has(self.{field}) || ({absent}))"


class ResourceRequirements(ApiModel):
    """CPU/memory (and other non-GPU) requests and limits of a container.

    GPUs are not set here, of any vendor the catalog knows (``GPU_RESOURCES``: NVIDIA's and
    AMD's): ``worker.gpus`` is the only place, and the operator requests them by the resource
    of the planned node's type, so the planner and the pod spec cannot disagree.
    """

    requests: dict[ResourceName, Quantity] = Field(
        default_factory=dict, max_length=16, description="Resources the scheduler reserves."
    )
    limits: dict[ResourceName, Quantity] = Field(
        default_factory=dict, max_length=16, description="Most the container may use."
    )

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel=f"{_no_gpus_in('requests')} && {_no_gpus_in('limits')}",
            message=(
                f"set GPUs with worker.gpus, not in resources ({', '.join(GPU_RESOURCES)}): "
                "the planner places by it"
            ),
            check=lambda r: not set(GPU_RESOURCES) & {*r.requests, *r.limits},
        ),
    )


class TemplateMetadata(ApiModel):
    """Labels and annotations added to every worker pod (Elastra's own win on a clash)."""

    labels: dict[LabelKey, LabelValue] = Field(
        default_factory=dict, max_length=64, description="Labels added to each worker pod."
    )
    annotations: dict[LabelKey, AnnotationValue] = Field(
        default_factory=dict, max_length=64, description="Annotations added to each worker pod."
    )

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel=f"!has(self.labels) || self.labels.all(k, !k.startsWith('{ELASTRA_PREFIX}'))",
            message=(
                f"labels under {ELASTRA_PREFIX} are Elastra's (job, slot, world version): "
                "use another prefix"
            ),
            check=lambda m: not any(k.startswith(ELASTRA_PREFIX) for k in m.labels),
            field=".labels",
        ),
        Rule(
            cel=(
                "!has(self.annotations) || "
                f"self.annotations.all(k, !k.startsWith('{ELASTRA_PREFIX}'))"
            ),
            message=(
                f"annotations under {ELASTRA_PREFIX} are Elastra's (the assignment, the "
                "planned node): use another prefix"
            ),
            check=lambda m: not any(k.startswith(ELASTRA_PREFIX) for k in m.annotations),
            field=".annotations",
        ),
    )


class EnvVarSource(ApiModel):
    """Where an environment variable's value comes from: a Secret, a ConfigMap or the pod."""

    secret_key_ref: KubeObject | None = Field(
        default=None, description="A key of a Secret in the job's namespace (name, key)."
    )
    config_map_key_ref: KubeObject | None = Field(
        default=None, description="A key of a ConfigMap in the job's namespace (name, key)."
    )
    field_ref: KubeObject | None = Field(
        default=None, description="A field of the pod (fieldPath), as the downward API shows."
    )

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel=_one_of(("secretKeyRef", "configMapKeyRef", "fieldRef")),
            message="valueFrom needs exactly one of secretKeyRef, configMapKeyRef, fieldRef",
            check=lambda s: _set_count(s) == 1,
        ),
    )


class TemplateEnvVar(ApiModel):
    """An environment variable: a literal ``value`` or one taken ``valueFrom`` elsewhere."""

    name: EnvName = Field(description="Variable name.")
    value: Annotated[str, StringConstraints(max_length=32768)] | None = Field(
        default=None, description="A literal value."
    )
    value_from: EnvVarSource | None = Field(
        default=None, description="A value from a Secret, a ConfigMap or the pod."
    )

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="!(has(self.value) && has(self.valueFrom))",
            message="set value or valueFrom, not both",
            check=lambda e: e.value is None or e.value_from is None,
            field=".valueFrom",
        ),
    )


class VolumeMount(ApiModel):
    """A template or Elastra volume mounted into a container."""

    name: DnsLabel = Field(description="Name of the volume.")
    mount_path: Annotated[
        str, StringConstraints(min_length=1, max_length=1024, pattern=ABSOLUTE_PATH)
    ] = Field(description="Absolute path of the mount inside the container.")
    read_only: bool | None = Field(default=None, description="Mount read-only.")
    sub_path: Annotated[str, StringConstraints(max_length=1024)] | None = Field(
        default=None, description="A path inside the volume to mount instead of its root."
    )
    sub_path_expr: Annotated[str, StringConstraints(max_length=1024)] | None = Field(
        default=None, description="Like subPath, with $(VAR) expanded from the container's env."
    )


class ContainerPort(ApiModel):
    """A port a sidecar listens on (host ports are not part of the allow-list)."""

    container_port: int = Field(ge=1, le=65535, description="Port number.")
    name: Annotated[str, StringConstraints(min_length=1, max_length=15)] | None = Field(
        default=None, description="IANA service name of the port."
    )
    protocol: Literal["TCP", "UDP", "SCTP"] | None = Field(default=None, description="Protocol.")


class TemplateContainer(ApiModel):
    """A container of the template: the worker's additions (name: worker) or a sidecar.

    The entry named ``worker`` may set only ``env``, ``envFrom`` and ``volumeMounts``; they
    are added to the worker container. Any other entry is a container of its own.
    """

    name: DnsLabel = Field(description="Container name; worker adds to the worker container.")
    image: Annotated[str, StringConstraints(min_length=1, max_length=512)] | None = Field(
        default=None, description="Image of a sidecar (the worker's is spec.worker.image)."
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        default=None, description="When the kubelet pulls the sidecar's image."
    )
    command: list[Arg] | None = Field(
        default=None, max_length=64, description="Entrypoint of a sidecar."
    )
    args: list[Arg] | None = Field(default=None, max_length=256, description="Its arguments.")
    working_dir: Annotated[str, StringConstraints(max_length=1024)] | None = Field(
        default=None, description="Working directory of a sidecar."
    )
    env: list[TemplateEnvVar] | None = Field(
        default=None,
        max_length=128,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
        description="Environment variables: literal, or from a Secret, ConfigMap or the pod.",
    )
    env_from: list[KubeObject] | None = Field(
        default=None,
        max_length=16,
        description="Whole ConfigMaps or Secrets as variables (configMapRef, secretRef, prefix).",
    )
    volume_mounts: list[VolumeMount] | None = Field(
        default=None, max_length=32, description="Volumes mounted into the container."
    )
    ports: list[ContainerPort] | None = Field(
        default=None, max_length=16, description="Ports a sidecar listens on."
    )
    resources: ResourceRequirements | None = Field(
        default=None, description="A sidecar's CPU and memory (the worker's: spec.worker)."
    )
    liveness_probe: KubeObject | None = Field(default=None, description="A sidecar's probe.")
    readiness_probe: KubeObject | None = Field(default=None, description="A sidecar's probe.")
    startup_probe: KubeObject | None = Field(default=None, description="A sidecar's probe.")
    lifecycle: KubeObject | None = Field(default=None, description="A sidecar's hooks.")
    restart_policy: Literal["Always"] | None = Field(
        default=None,
        description=(
            "Always, in initContainers only: a native sidecar, started before the worker and "
            "stopped after it, which does not keep a finished pod running."
        ),
    )
    security_context: KubeObject | None = Field(
        default=None,
        description="Not allowed: Elastra sets every container's (see spec.worker.podSecurity).",
    )

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="!has(self.securityContext)",
            message=(
                "securityContext is Elastra's: every container's comes from "
                "spec.worker.podSecurity (restricted, or baseline to relax it), so no "
                "container runs privileged"
            ),
            check=lambda c: c.security_context is None,
            field=".securityContext",
        ),
        Rule(
            cel=f"self.name != '{WORKER_CONTAINER}' || ({_none_of(WORKER_OWNED)})",
            message=(
                "the worker container's image, command, args and resources are set in "
                "spec.worker (image, command, args, resources, gpus), not in the template"
            ),
            check=lambda c: c.name != WORKER_CONTAINER or _unset(c, WORKER_OWNED),
        ),
        Rule(
            cel=f"self.name != '{WORKER_CONTAINER}' || ({_none_of(WORKER_CLOSED)})",
            message=(
                "the worker container may only add env, envFrom and volumeMounts: its ports, "
                "probes, lifecycle, workingDir and pull policy are Elastra's"
            ),
            check=lambda c: c.name != WORKER_CONTAINER or _unset(c, WORKER_CLOSED),
        ),
        Rule(
            cel=(
                f"self.name != '{WORKER_CONTAINER}' || !has(self.env) || "
                f"self.env.all(e, !(e.name in {_in(RESERVED_ENV)}))"
            ),
            message=(
                "the worker container's env may not set "
                f"{spelled(RESERVED_ENV, 'or')}: Elastra sets them (from spec.worker.launch, "
                "spec.model and spec.failurePolicy)"
            ),
            check=lambda c: (
                c.name != WORKER_CONTAINER or not any(e.name in RESERVED_ENV for e in c.env or ())
            ),
            field=".env",
        ),
        Rule(
            cel=(
                f"self.name != '{WORKER_CONTAINER}' || !has(self.volumeMounts) || "
                f"self.volumeMounts.all(m, !(m.mountPath in {_in(RESERVED_MOUNT_PATHS)}))"
            ),
            message=(
                "the worker container's volumeMounts may not use /etc/elastra, /dev/shm or "
                "/tmp: Elastra mounts the assignment, shared memory and scratch space there"
            ),
            check=lambda c: (
                c.name != WORKER_CONTAINER
                or not any(m.mount_path in RESERVED_MOUNT_PATHS for m in c.volume_mounts or ())
            ),
            field=".volumeMounts",
        ),
        Rule(
            cel=f"self.name == '{WORKER_CONTAINER}' || has(self.image)",
            message="a sidecar container needs an image",
            check=lambda c: c.name == WORKER_CONTAINER or c.image is not None,
            field=".image",
        ),
    )


class Volume(ApiModel):
    """A volume of the worker pod, with exactly one of the allowed sources."""

    name: DnsLabel = Field(description="Volume name, unique in the pod.")
    config_map: KubeObject | None = Field(default=None, description="A ConfigMap's keys.")
    secret: KubeObject | None = Field(default=None, description="A Secret's keys.")
    persistent_volume_claim: KubeObject | None = Field(
        default=None, description="A PersistentVolumeClaim (claimName, readOnly)."
    )
    empty_dir: KubeObject | None = Field(
        default=None, description="Scratch space that lives as long as the pod."
    )
    projected: KubeObject | None = Field(
        default=None, description="Secrets, ConfigMaps, downward API and tokens in one folder."
    )
    csi: KubeObject | None = Field(default=None, description="An inline CSI volume.")
    ephemeral: KubeObject | None = Field(
        default=None, description="A claim made and deleted with the pod."
    )
    downward_api: KubeObject | None = Field(
        default=None, alias="downwardAPI", description="Pod fields as files."
    )
    host_path: KubeObject | None = Field(
        default=None,
        alias="hostPath",
        description="Not allowed: use a persistentVolumeClaim.",
    )

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="!has(self.hostPath)",
            message=(
                "hostPath volumes are not allowed: Pod Security forbids them and they tie "
                "data to one node; use a persistentVolumeClaim (checkpoint.volume for "
                "checkpoints)"
            ),
            check=lambda v: v.host_path is None,
            field=".hostPath",
        ),
        Rule(
            cel=_one_of(VOLUME_SOURCES),
            message=(
                "a volume needs exactly one source: configMap, secret, persistentVolumeClaim, "
                "emptyDir, projected, csi, ephemeral or downwardAPI"
            ),
            check=lambda v: v.host_path is not None or _set_count(v, VOLUME_SOURCES) == 1,
        ),
        Rule(
            cel=f"!(self.name in {_in(RESERVED_VOLUMES)})",
            message=(
                f"volume names {spelled(RESERVED_VOLUMES, 'and')} are Elastra's: pick another name"
            ),
            check=lambda v: v.name not in RESERVED_VOLUMES,
            field=".name",
        ),
    )


class Toleration(ApiModel):
    """A taint the worker pods tolerate, added to the ones Elastra adds."""

    key: Annotated[str, StringConstraints(max_length=317)] | None = Field(
        default=None, description="Taint key; empty with operator Exists: every taint."
    )
    operator: Literal["Exists", "Equal"] | None = Field(
        default=None, description="Equal (default) or Exists."
    )
    value: LabelValue | None = Field(default=None, description="Taint value, for Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect; empty: all."
    )
    toleration_seconds: int | None = Field(
        default=None, description="How long a NoExecute taint is tolerated."
    )


class NodeSelector(ApiModel):
    """Required node terms; any one term must match (each is ANDed with Elastra's pin)."""

    node_selector_terms: list[KubeObject] = Field(
        min_length=1,
        max_length=16,
        description="Terms (matchExpressions, matchFields); the node must match one.",
    )


class NodeAffinity(ApiModel):
    """Node affinity added to Elastra's pin to the planned node."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = Field(
        default=None, description="Terms the planned node must match, or the pod stays Pending."
    )
    preferred_during_scheduling_ignored_during_execution: list[KubeObject] | None = Field(
        default=None,
        max_length=32,
        description="Weighted preferences (no effect on a pinned pod; kept for completeness).",
    )


class Affinity(ApiModel):
    """Affinity added to Elastra's own (node affinity ANDed with the pin, pod terms as given)."""

    node_affinity: NodeAffinity | None = Field(default=None, description="Node affinity.")
    pod_affinity: KubeObject | None = Field(default=None, description="Pod affinity terms.")
    pod_anti_affinity: KubeObject | None = Field(
        default=None, description="Pod anti-affinity terms."
    )


class LocalObjectReference(ApiModel):
    """An object in the job's namespace, by name."""

    name: DnsName = Field(description="Name of the object.")


def _host_namespace_rule(field: str) -> Rule:
    """hostNetwork, hostPID and hostIPC share one reason; each gets a rule that blames it."""
    return Rule(
        cel=f"!has(self.{field}) || !self.{field}",
        message=(
            f"{field} is not allowed: worker pods keep their own network, process and IPC "
            "namespaces (Pod Security baseline and restricted forbid sharing the node's)"
        ),
        check=lambda s: not _set_true(s, field),
        field=f".{field}",
    )


def _set_true(model: ApiModel, alias: str) -> bool:
    """Whether a boolean field, by wire name, is set and true."""
    (name,) = _python_names(model, (alias,))
    return bool(getattr(model, name))


def _init_names_ok(spec: TemplatePodSpec) -> bool:
    """Init container names clash with neither the worker's nor a container's."""
    names = {c.name for c in spec.containers}
    return all(i.name != WORKER_CONTAINER and i.name not in names for i in spec.init_containers)


def _mounts_rule(field: str) -> Rule:
    """Mounts must name a volume the pod has, or the pod Elastra creates is refused."""
    return Rule(
        cel=(
            f"!has(self.{field}) || self.{field}.all(c, !has(c.volumeMounts) || "
            f"c.volumeMounts.all(m, m.name in {_in(RESERVED_VOLUMES)} || "
            "(has(self.volumes) && self.volumes.exists(v, v.name == m.name))))"
        ),
        message=(
            f"{field}[].volumeMounts must name a volume of the template or one of Elastra's "
            f"({', '.join(RESERVED_VOLUMES)})"
        ),
        check=lambda s: _mounts_known(s, field),
        field=f".{field}",
    )


def _mounts_known(spec: TemplatePodSpec, field: str) -> bool:
    (name,) = _python_names(spec, (field,))
    known = {*RESERVED_VOLUMES, *(v.name for v in spec.volumes)}
    containers: list[TemplateContainer] = getattr(spec, name)
    return all(m.name in known for c in containers for m in c.volume_mounts or ())


class TemplatePodSpec(ApiModel):
    """The allow-listed part of a PodSpec; the rest of a worker pod's spec is Elastra's."""

    volumes: list[Volume] = Field(
        default_factory=list,
        max_length=32,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
        description=f"Volumes added to Elastra's ({', '.join(RESERVED_VOLUMES)}).",
    )
    containers: list[TemplateContainer] = Field(
        default_factory=list,
        max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
        description="worker: additions to the worker container; any other name: a sidecar.",
    )
    init_containers: list[TemplateContainer] = Field(
        default_factory=list,
        max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
        description="Run before the worker; restartPolicy: Always makes a native sidecar.",
    )
    node_selector: dict[LabelKey, LabelValue] = Field(
        default_factory=dict,
        max_length=32,
        description=(
            "Node labels the planned node must carry. Merged into the pod; the planner "
            "plans only on nodes that carry them."
        ),
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=32, description="Added to Elastra's tolerations."
    )
    affinity: Affinity | None = Field(default=None, description="Added to Elastra's affinity.")
    priority_class_name: DnsName | None = Field(
        default=None, description="PriorityClass of the worker pods."
    )
    service_account_name: DnsName | None = Field(
        default=None,
        description=(
            "ServiceAccount of the worker pods. Its token is still not mounted "
            "(automountServiceAccountToken: false); a projected volume can mount one."
        ),
    )
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list, max_length=16, description="Secrets for pulling the images."
    )
    node_name: Annotated[str, StringConstraints(max_length=253)] | None = Field(
        default=None, description="Not allowed: Elastra pins each pod to its planned node."
    )
    scheduling_gates: list[KubeObject] | None = Field(
        default=None, max_length=16, description="Not allowed: Elastra's gang gate."
    )
    host_network: bool | None = Field(default=None, description="Not allowed.")
    host_pid: bool | None = Field(default=None, alias="hostPID", description="Not allowed.")
    host_ipc: bool | None = Field(default=None, alias="hostIPC", description="Not allowed.")
    security_context: KubeObject | None = Field(
        default=None, description="Not allowed: see spec.worker.podSecurity."
    )

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="!has(self.nodeName)",
            message=(
                "nodeName is Elastra's: it pins each worker to the node the planner chose; "
                "narrow the choice with nodeSelector or affinity"
            ),
            check=lambda s: s.node_name is None,
            field=".nodeName",
        ),
        Rule(
            cel="!has(self.schedulingGates)",
            message=(
                "schedulingGates are Elastra's: its gang gate holds a batch of worker pods "
                "until every one of them exists"
            ),
            check=lambda s: s.scheduling_gates is None,
            field=".schedulingGates",
        ),
        _host_namespace_rule("hostNetwork"),
        _host_namespace_rule("hostPID"),
        _host_namespace_rule("hostIPC"),
        Rule(
            cel="!has(self.securityContext)",
            message=(
                "securityContext is Elastra's: the pod's comes from spec.worker.podSecurity "
                "(restricted, or baseline to relax it)"
            ),
            check=lambda s: s.security_context is None,
            field=".securityContext",
        ),
        Rule(
            cel=(
                "!has(self.initContainers) || self.initContainers.all(i, "
                f"i.name != '{WORKER_CONTAINER}' && "
                "(!has(self.containers) || !self.containers.exists(c, c.name == i.name)))"
            ),
            message="initContainers need names of their own: not worker, not a container's",
            check=_init_names_ok,
            field=".initContainers",
        ),
        Rule(
            cel="!has(self.containers) || self.containers.all(c, !has(c.restartPolicy))",
            message=(
                "restartPolicy is for initContainers only (Always there makes a native "
                "sidecar that stops with the worker)"
            ),
            check=lambda s: all(c.restart_policy is None for c in s.containers),
            field=".containers",
        ),
        _mounts_rule("containers"),
        _mounts_rule("initContainers"),
    )


class PodTemplate(ApiModel):
    """Additions to every worker pod, shaped like a PodTemplateSpec (an allow-listed subset)."""

    metadata: TemplateMetadata | None = Field(
        default=None, description="Labels and annotations added to each worker pod."
    )
    spec: TemplatePodSpec | None = Field(
        default=None, description="The allow-listed PodSpec fields, merged with Elastra's."
    )

    def pod_spec(self) -> TemplatePodSpec:
        """The spec part, empty when unset."""
        return self.spec or TemplatePodSpec()

    def worker_additions(self) -> TemplateContainer | None:
        """The template's entry for the worker container, if any."""
        for container in self.pod_spec().containers:
            if container.name == WORKER_CONTAINER:
                return container
        return None

    def sidecars(self) -> list[TemplateContainer]:
        """The template's containers other than the worker's additions."""
        return [c for c in self.pod_spec().containers if c.name != WORKER_CONTAINER]
