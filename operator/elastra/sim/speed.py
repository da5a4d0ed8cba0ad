"""How fast a job trains on a given allocation, and what a restart costs: the planner's model.

The simulator never has its own speed formula. The throughput of a model on ``pods`` worker
pods of ``gpus_per_pod`` GPUs of one type is the best plan ``elastra.planner.plan_job`` finds
for that job on an inventory of just those nodes (the fleet's own nodes of the type, so their
NIC figures count): sublinear scaling (data-parallel collectives, pipeline bubbles) and
per-type speed come from the performance model. Two layouts are asked for:

- ``planned``: the planner searches tensor, pipeline and data parallelism, sharding and
  recomputation, as the operator does (the ``elastra`` policy);
- not planned: data parallel only (``tensor = pipeline = 1``), with the sharding and
  recomputation that fit, which is what a user runs without a planner (the baselines). When
  data parallel alone does not fit in memory, the planner's layout stands in: such a user
  would have hand-picked a layout that fits.

A plan search costs 1-1000 ms, so every answer is memoized per (model, type, GPU count,
layout) in the ``SpeedModel`` instance; a simulation asks a few hundred distinct questions
however many events it has.

A restart (a resize, or resuming after a failure or preemption) costs a fixed part (stop at a
step boundary, new processes, NCCL rendezvous, data loader warm-up) plus saving and loading
the checkpoint: weights and Adam state (``checkpoint_bytes_per_param``) of the model's
parameters (``perfmodel.total_params``), written and read by the pods in parallel at
``storage_gbs`` each. The defaults are assumptions, stated in ``RestartModel``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

from elastra.planner.catalog import GpuType
from elastra.planner.inventory import Inventory, NodeCapacity, NodeName
from elastra.planner.job import JobRequirements
from elastra.planner.search import plan_job
from elastra.sim.models import ModelProfile


@dataclass(frozen=True)
class RestartModel:
    """What one restart costs, in seconds (see the module docstring)."""

    fixed_s: float = 30.0
    """Process restart, NCCL rendezvous and data-loader warm-up."""
    storage_gbs: float = 2.0
    """Checkpoint write (and read) bandwidth per pod, GB/s."""
    checkpoint_bytes_per_param: float = 14.0
    """fp16 weights (2) + fp32 master weights and Adam moments (12)."""

    def seconds(self, profile: ModelProfile, *, pods: int) -> float:
        """Save + load of the checkpoint by ``pods`` pods, plus the fixed part."""
        nbytes = profile.params * self.checkpoint_bytes_per_param
        transfer = nbytes / (self.storage_gbs * 1e9 * max(1, pods))
        return self.fixed_s + 2.0 * transfer


def pod_gpus(gpus: int, per_node: int) -> int:
    """GPUs per worker pod for a job of ``gpus`` on nodes of ``per_node``: the largest divisor
    of ``gpus`` that fits one node (a pod never spans nodes)."""
    return max(d for d in range(1, min(gpus, per_node) + 1) if gpus % d == 0)


class SpeedModel:
    """Memoized planner throughput (tokens/s) per (model, GPU type, GPU count, layout)."""

    def __init__(
        self,
        inventory: Inventory,
        *,
        restart: RestartModel | None = None,
    ) -> None:
        self._template: dict[str, NodeCapacity] = {}
        for node in inventory.nodes:
            if node.gpu_type.is_cpu or node.free_gpus == 0:
                continue
            seen = self._template.get(node.gpu_type.name)
            if seen is None or node.network_gbps < seen.network_gbps:
                self._template[node.gpu_type.name] = node
        self.restart = restart or RestartModel()
        self._rates: dict[tuple[str, str, int, bool], float] = {}
        self.planner_calls = 0

    @property
    def types(self) -> Mapping[str, GpuType]:
        """The GPU types the cluster has, by catalog name."""
        return {name: node.gpu_type for name, node in self._template.items()}

    def per_node(self, gpu_type: str) -> int:
        """GPUs per node of ``gpu_type`` in this cluster (the largest node's)."""
        return self._template[gpu_type].free_gpus

    def rate(self, profile: ModelProfile, gpu_type: str, gpus: int, *, planned: bool) -> float:
        """Tokens/s of ``profile`` on ``gpus`` GPUs of ``gpu_type``; 0 when nothing fits.

        The GPUs form pods of ``pod_gpus(gpus, per_node)``: pods that share a node share its
        NVLink domain, as NCCL lets them.
        """
        key = (profile.name, gpu_type, gpus, planned)
        cached = self._rates.get(key)
        if cached is None:
            cached = self._plan(profile, gpu_type, gpus, planned=planned)
            self._rates[key] = cached
        return cached

    def _plan(self, profile: ModelProfile, gpu_type: str, gpus: int, *, planned: bool) -> float:
        template = self._template.get(gpu_type)
        if template is None or gpus < 1:
            return 0.0
        per_pod = pod_gpus(gpus, template.free_gpus)
        pods = gpus // per_pod
        per_node = template.free_gpus // per_pod
        nodes = tuple(
            dataclasses.replace(template, name=NodeName(f"sim-{i}"), free_gpus=per_node * per_pod)
            for i in range(math.ceil(pods / per_node))
        )
        job = JobRequirements(
            global_batch_size=profile.global_batch_size,
            replicas=pods,
            min_replicas=1,
            gpus_per_worker=per_pod,
            precision="fp16",
            model=profile.shape,
            tensor=None if planned else 1,
            pipeline=None if planned else 1,
        )
        self.planner_calls += 1
        result = plan_job(job, Inventory(nodes=nodes), top_k=1)
        if result.plans:
            return result.plans[0].predicted.tokens_per_s
        if not planned:
            return self.rate(profile, gpu_type, gpus, planned=True)
        if gpus & (gpus - 1):
            # An odd count (7 GPUs after a failure) may divide nothing: the job trains on the
            # largest power of two it holds and idles the rest.
            return self.rate(profile, gpu_type, 1 << (gpus.bit_length() - 1), planned=True)
        return 0.0

    def pods(self, gpu_type: str, gpus: int) -> int:
        """Worker pods ``gpus`` GPUs of ``gpu_type`` form (see ``rate``)."""
        return gpus // pod_gpus(gpus, self.per_node(gpu_type))

    def restart_seconds(self, profile: ModelProfile, gpu_type: str, gpus: int) -> float:
        """What one restart of ``profile`` on ``gpus`` GPUs of ``gpu_type`` costs."""
        return self.restart.seconds(profile, pods=self.pods(gpu_type, gpus))
