"""The plan search: enumerate layouts the job allows, predict each, rank them, explain the rest.

``plan_job(job, inventory)`` is a pure function: it reads the job's requirements and the typed
inventory and returns a ``PlanResult``. It never raises for an infeasible job: every candidate
that cannot run becomes a counted ``Rejection`` (capacity, divisibility, memory, precision,
constraint) and an empty result carries the most telling reason.

Enumerated: GPU type (or, for ``heterogeneous`` jobs, every mix of allowed types), tensor
degree (divides the pod's GPUs, the attention heads, the KV heads and the MLP width, so a
tensor group stays in a pod and a node), pipeline degree (divisors of the layer count and
powers of two; uneven stages allowed), number of pods (between minReplicas and replicas, in
whole replicas), micro-batch (powers of two), sharding (the modes the job allows; none when
dp = 1) and recomputation. Pruning that cannot change the answer under the model:
recomputation modes are tried cheapest first and the first that fits memory is kept (the
others only add time); of the many pod counts of one type, the largest few, the smallest and
the powers of two are evaluated. Mixes fill the fastest type first (the best tokens per dollar
first, under the cost objective).

Heterogeneous mixes give every type its own data-parallel replicas (a tensor or pipeline group
never mixes types). Every replica gets whole micro-batches, as many as make replicas of
different speeds finish a step together, and the shares add up to the global batch exactly;
where the batch does not divide, replicas of one type differ by one micro-batch, so any
number of replicas up to the global batch's micro-batches can train (256 sequences over 24
replicas: 16 x 11 and 8 x 10). Shares are therefore always whole micro-batches, as
``consistency: bitwise`` (logical shares) and pipelines (one micro-batch shape) need; a job
may pin the micro-batch size (``JobRequirements.micro_batch``).

Ranking is by tokens per second (throughput) or tokens per dollar (cost), ties broken by
fewer GPUs, lower price and then the layout itself, so the order is total and deterministic.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import combinations, product

from elastra.planner.catalog import GpuType, matches
from elastra.planner.inventory import Inventory, NodeCapacity, NodeName
from elastra.planner.job import RECOMPUTE_MODES, JobRequirements, ModelShape, Sharding
from elastra.planner.perfmodel import (
    DEFAULT_CONSTANTS,
    Layout,
    MicroBatchTime,
    ModelConstants,
    StepPrediction,
    TypeLoad,
    effective_gbs,
    in_flight,
    memory_gib,
    micro_batch_time,
    predict_step,
    token_flops,
    usable_memory_gib,
)
from elastra.planner.placement import place
from elastra.planner.plan import JobPlan, PlanResult, Rejection, TypeShare
from elastra_worker.assignment import split_layers

MICRO_BATCHES = (1, 2, 4, 8, 16, 32)
NO_MODEL = "no-model"
"""The bottleneck of a job without a model: its figures are relative speeds only."""
MAX_MIX_TYPES = 6
"""Mixes are built from the fastest six allowed types at most (63 subsets)."""
POD_COUNTS_KEPT = 3
"""Per type and layout, the largest pod counts evaluated (plus the smallest and powers of 2)."""


@dataclass(frozen=True)
class TypePool:
    """The capacity of one allowed GPU type: its nodes, free pod slots and slowest NIC."""

    gpu: GpuType
    nodes: tuple[NodeCapacity, ...]
    slots: tuple[tuple[NodeName, int], ...]
    pods: int
    network_gbs: float
    """Per-GPU share of the slowest node NIC of this type, GB/s."""

    @property
    def speed(self) -> float:
        """Relative per-GPU speed used to order types (peak x catalog efficiency)."""
        return (self.gpu.bf16_tflops or self.gpu.fp16_tflops or 0.0) * self.gpu.gemm_efficiency


class _Rejections:
    """Counts rejected candidates per category, keeping the first example of each."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.examples: dict[str, str] = {}

    def add(self, category: str, example: str | Callable[[], str], count: int = 1) -> None:
        """Count a rejection; ``example`` may be a callable, formatted only if it is kept."""
        self.counts[category] = self.counts.get(category, 0) + count
        if category not in self.examples:
            self.examples[category] = example if isinstance(example, str) else example()

    def summary(self) -> tuple[Rejection, ...]:
        ordered = sorted(self.counts, key=lambda c: (-self.counts[c], c))
        return tuple(Rejection(c, self.counts[c], self.examples[c]) for c in ordered)


@dataclass(frozen=True)
class _Scored:
    key: tuple[float, ...]
    tiebreak: tuple[object, ...]
    plan: JobPlan


@dataclass(frozen=True)
class _Fit:
    """One layout tried: scored when it fits; ``out_of_memory`` when memory is why it did
    not (then a larger micro-batch cannot fit either)."""

    scored: _Scored | None
    out_of_memory: bool = False


def plan_job(
    job: JobRequirements,
    inventory: Inventory,
    *,
    top_k: int = 3,
    constants: ModelConstants = DEFAULT_CONSTANTS,
) -> PlanResult:
    """Ranked plans for ``job`` on ``inventory`` (best first), or the reason none fits."""
    rejections = _Rejections()
    for node in inventory.excluded:
        rejections.add("capacity", f"node {node.name} is not capacity: {node.reason}")
    pools = _pools(job, inventory, rejections)
    if not pools:
        return _infeasible("no allowed capacity", rejections, 0, capacity=True)
    if sum(pool.pods for pool in pools) < job.min_replicas:
        free = ", ".join(f"{p.pods} on {p.gpu.name}" for p in pools)
        rejections.add(
            "capacity", f"minReplicas={job.min_replicas} pods needed, free pod slots: {free}"
        )
        return _infeasible("not enough capacity", rejections, 0, capacity=True)
    search = _Search(job, pools, constants, rejections)
    scored = search.run(top_k)
    scored.sort(key=lambda s: (s.key, s.tiebreak))
    best = _distinct(scored, top_k)
    if not best:
        return _infeasible("no candidate fits", rejections, search.evaluated)
    placed = tuple(_with_placement(s.plan, pools, job) for s in best)
    return PlanResult(
        plans=placed, reason=None, rejections=rejections.summary(), candidates=search.evaluated
    )


def evaluate_layout(
    job: JobRequirements,
    inventory: Inventory,
    layout: Layout,
    *,
    pods: Sequence[tuple[str, int]],
    constants: ModelConstants = DEFAULT_CONSTANTS,
) -> PlanResult:
    """Predict one given layout (``pods`` per GPU type name, in data-parallel order; the
    layout's precision, not the job's).

    For a layout that runs now (is a resize worth it?) and for checking the model against
    published runs. Infeasible layouts (memory, divisibility, capacity) give a reason.
    """
    rejections = _Rejections()
    by_name: dict[str, TypePool] = {p.gpu.name: p for p in _pools(job, inventory, rejections)}
    missing = [name for name, _ in pods if name not in by_name]
    if missing or job.model is None:
        why = f"no usable {', '.join(missing)} capacity" if missing else "job has no model"
        return _infeasible(why, rejections, 0)
    mix = tuple(by_name[name] for name, _ in pods)
    counts = tuple(count for _, count in pods)
    for pool, count in zip(mix, counts, strict=True):
        if count > pool.pods:
            rejections.add("capacity", f"{pool.gpu.name}: {count} pods > {pool.pods} slots")
            return _infeasible("not enough capacity", rejections, 0, capacity=True)
    search = _Search(job, list(mix), constants, rejections)
    per_pod = job.devices_per_worker
    replicas = tuple(c * per_pod // layout.replica_gpus for c in counts)
    bandwidth = dp_bandwidth(
        mix,
        counts,
        replica_gpus=layout.replica_gpus,
        devices_per_worker=per_pod,
        constants=constants,
    )
    fit = search.fit(job.model, mix, counts, replicas, (layout,), dp_gbs=bandwidth)
    if fit.scored is None:
        return _infeasible("layout does not fit", rejections, search.evaluated)
    plan = _with_placement(fit.scored.plan, list(mix), job)
    return PlanResult((plan,), None, rejections.summary(), search.evaluated)


def _shape(plan: JobPlan) -> tuple[object, ...]:
    """What makes two plans different enough to show both: types and GPUs, tp, pp."""
    return (tuple((s.gpu_type, s.gpus) for s in plan.types), plan.tp, plan.pp)


def _distinct(scored: Sequence[_Scored], top_k: int) -> list[_Scored]:
    """The best ``top_k`` plans, one per distinct (types, GPUs, tp, pp) shape."""
    seen: set[tuple[object, ...]] = set()
    best: list[_Scored] = []
    for item in scored:
        plan = item.plan
        shape = _shape(plan)
        if shape in seen:
            continue
        seen.add(shape)
        best.append(item)
        if len(best) == top_k:
            break
    return best


def _infeasible(
    headline: str, rejections: _Rejections, evaluated: int, *, capacity: bool = False
) -> PlanResult:
    summary = rejections.summary()
    details = "; ".join(f"{r.category} ({r.count}): {r.example}" for r in summary[:3])
    reason = f"{headline}: {details}" if details else headline
    return PlanResult(
        plans=(),
        reason=reason,
        rejections=summary,
        candidates=evaluated,
        short_of_capacity=capacity,
    )


def _pools(job: JobRequirements, inventory: Inventory, rejections: _Rejections) -> list[TypePool]:
    """Allowed, usable GPU types with their free pod slots, fastest first."""
    by_type: dict[str, list[NodeCapacity]] = {}
    for node in inventory.nodes:
        by_type.setdefault(node.gpu_type.name, []).append(node)
    pools: list[TypePool] = []
    for name in sorted(by_type):
        nodes = by_type[name]
        gpu = nodes[0].gpu_type
        if job.is_cpu != gpu.is_cpu:
            continue
        if job.gpu_types and not any(matches(p, gpu) for p in job.gpu_types):
            rejections.add("constraint", f"{name}: not in worker.gpuTypes", len(nodes))
            continue
        if gpu.peak_tflops(job.precision) is None:
            rejections.add("precision", f"{name} has no {job.precision} support", len(nodes))
            continue
        if job.model is not None and gpu.memory_gib <= 0:
            rejections.add("constraint", f"{name}: no memory figure", len(nodes))
            continue
        slots: list[tuple[NodeName, int]] = []
        for node in nodes:
            if job.is_cpu:
                count = int(node.free_cpu_millis // round(job.cpus_per_worker * 1000))
            else:
                count = node.free_gpus // job.gpus_per_worker
            if count == 0:
                free = f"{node.free_cpu_millis}m CPU" if job.is_cpu else f"{node.free_gpus} GPUs"
                rejections.add("capacity", f"node {node.name}: {free} free, less than one pod")
                continue
            slots.append((node.name, count))
        if not slots:
            continue
        used = [n for n in nodes if any(n.name == s[0] for s in slots)]
        network = min(n.network_gbps / 8.0 / max(1, gpu.gpus_per_node) for n in used)
        pools.append(
            TypePool(
                gpu=gpu,
                nodes=tuple(used),
                slots=tuple(slots),
                pods=sum(c for _, c in slots),
                network_gbs=network,
            )
        )
    pools.sort(key=lambda p: (-p.speed, p.gpu.name))
    return pools


class _Search:
    """One search over the layouts of one job; holds caches for the run, nothing global."""

    def __init__(
        self,
        job: JobRequirements,
        pools: list[TypePool],
        constants: ModelConstants,
        rejections: _Rejections,
    ) -> None:
        self.job = job
        self.pools = pools
        self.constants = constants
        self.rejections = rejections
        self.evaluated = 0
        self._memory_cache: dict[tuple[object, ...], float] = {}
        self._split_cache: dict[tuple[object, ...], tuple[tuple[int, ...], ...] | None] = {}
        self._slot_cache: dict[tuple[object, ...], MicroBatchTime] = {}

    # -- enumeration ---------------------------------------------------------------------

    def run(self, top_k: int) -> list[_Scored]:
        """Every scored candidate that could be in the top ``top_k`` distinct shapes.

        Groups (mix, pod counts, tp, pp) are visited best upper bound first; once a group's
        bound is below the ``top_k``-th best distinct score found, no later group can enter
        the result, so the search stops (branch and bound: exact under the model).
        """
        job = self.job
        groups: list[tuple[float, int, tuple[TypePool, ...], tuple[int, ...], int, int]] = []
        tps = self._tensor_options()
        pps = self._pipeline_options()
        for mix in self._mixes():
            for tp, pp in product(tps, pps):
                if job.model is None and (tp, pp) != (1, 1):
                    continue
                for counts in self._pod_counts(mix, tp, pp):
                    bound = self._bound(mix, counts, tp, pp)
                    groups.append((bound, len(groups), mix, counts, tp, pp))
        groups.sort(key=lambda g: (-g[0], g[1]))
        out: list[_Scored] = []
        best_by_shape: dict[tuple[object, ...], float] = {}
        threshold = -math.inf
        for bound, _, mix, counts, tp, pp in groups:
            if len(best_by_shape) >= top_k and bound < threshold:
                break
            for scored in self._layouts(mix, counts, tp, pp):
                out.append(scored)
                value = -scored.key[0]
                shape = _shape(scored.plan)
                if value > best_by_shape.get(shape, -math.inf):
                    best_by_shape[shape] = value
                    if len(best_by_shape) >= top_k:
                        threshold = heapq.nlargest(top_k, best_by_shape.values())[-1]
        return out

    def _bound(self, mix: tuple[TypePool, ...], counts: tuple[int, ...], tp: int, pp: int) -> float:
        """An upper bound on the primary score (tokens/s, or tokens per dollar) of any
        candidate of this group: every GPU at its best GEMM rate, no communication, the
        smallest pipeline bubble any micro-batch size allows."""
        job, model = self.job, self.job.model
        if model is None:
            return math.inf
        flops_per_token = token_flops(model).model_per_token(model.layers)
        width = model.hidden_size / tp
        shape = width / (width + self.constants.gemm_half_width)
        rate = 0.0
        cost = 0.0
        for pool, count in zip(mix, counts, strict=True):
            gpus = count * job.devices_per_worker
            peak = pool.gpu.peak_tflops(job.precision) or 0.0
            rate += gpus * peak * 1e12 * self.constants.efficiency_of(pool.gpu) * shape
            cost += gpus * pool.gpu.hourly_usd
        dp = sum(counts) * job.devices_per_worker // (tp * pp)
        # Micro-batches per replica: at most ceil(GB/dp) for one type; a mix may skew shares.
        most = -(-job.global_batch_size // max(dp, 1)) if len(mix) == 1 else job.global_batch_size
        bubble = (pp - 1) / max(_interleave_options(model, pp))
        tokens = rate / flops_per_token * most / (most + bubble)
        if job.objective == "cost":
            return tokens * 3600.0 / cost if cost > 0 else math.inf
        return tokens

    def _mixes(self) -> Iterator[tuple[TypePool, ...]]:
        pools = self.pools
        if not self.job.heterogeneous:
            for pool in pools:
                yield (pool,)
            return
        if self.job.objective == "cost":
            pools = sorted(
                pools, key=lambda p: (-p.speed / max(p.gpu.hourly_usd, 1e-9), p.gpu.name)
            )
        pools = pools[:MAX_MIX_TYPES]
        for size in range(1, len(pools) + 1):
            # One world's collectives run on one vendor's library (NCCL or RCCL): a mix never
            # spans GPU resources (nvidia.com/gpu, amd.com/gpu).
            yield from (
                m for m in combinations(pools, size) if len({p.gpu.resource for p in m}) == 1
            )

    def _tensor_options(self) -> list[int]:
        job, model = self.job, self.job.model
        per_pod = job.devices_per_worker
        if job.tensor is not None:
            wanted = [job.tensor]
        else:
            wanted = [d for d in range(1, per_pod + 1) if per_pod % d == 0]
        options = []
        for tp in wanted:
            problem = ""
            if per_pod % tp:
                problem = f"tp={tp} does not divide worker.gpus={per_pod}"
            elif model is not None:
                for what, value in (
                    ("attentionHeads", model.attention_heads),
                    ("kvHeads", model.kv_heads),
                    ("ffnHiddenSize", model.ffn_hidden_size),
                ):
                    if value % tp:
                        problem = f"tp={tp} does not divide model.{what}={value}"
                        break
            if problem:
                self.rejections.add("divisibility", problem)
            else:
                options.append(tp)
        return options

    def _pipeline_options(self) -> list[int]:
        job, model = self.job, self.job.model
        if model is None:
            return [1]
        if job.pipeline is not None:
            if job.pipeline > model.layers:
                self.rejections.add(
                    "divisibility", f"pp={job.pipeline} > model.layers={model.layers}"
                )
                return []
            return [job.pipeline]
        layers = model.layers
        divisors = {d for d in range(1, layers + 1) if layers % d == 0}
        powers = {1 << k for k in range(0, 11) if (1 << k) <= layers}
        return sorted(divisors | powers)

    def _pod_counts(self, mix: tuple[TypePool, ...], tp: int, pp: int) -> list[tuple[int, ...]]:
        """Pod counts per type (whole replicas) to evaluate for this mix and layout."""
        job = self.job
        per_pod = job.devices_per_worker
        replica = tp * pp
        if replica % per_pod and per_pod % replica:
            self.rejections.add(
                "divisibility",
                f"tp*pp={replica} neither divides nor is a multiple of worker.gpus={per_pod}",
            )
            return []
        unit = max(1, replica // per_pod)
        budget = job.replicas // unit
        caps = [pool.pods // unit for pool in mix]
        low = math.ceil(job.min_replicas / unit)
        if len(mix) == 1:
            top = min(caps[0], budget)
            if top < max(low, 1):
                self.rejections.add(
                    "capacity",
                    f"{mix[0].gpu.name}: tp*pp={replica} needs {unit} pod(s) per replica, "
                    f"{mix[0].pods} pod slots free, minReplicas={job.min_replicas}",
                )
                return []
            units = list(range(top, max(low, 1) - 1, -1))
            dp_per_unit = unit * per_pod // replica
            logical = job.global_batch_size // (job.micro_batch or 1)
            valid = [u for u in units if u * dp_per_unit <= logical]
            if not valid:
                self.rejections.add(
                    "divisibility", _too_many_replicas(job, units[-1] * dp_per_unit)
                )
                return []
            units = valid
            keep = set(units[:POD_COUNTS_KEPT]) | {units[-1]}
            keep |= {u for u in units if u & (u - 1) == 0}
            return [(u * unit,) for u in sorted(keep, reverse=True)]
        counts: list[int] = []
        left = budget
        for cap in caps:
            take = min(cap, left)
            if take == 0:
                return []
            counts.append(take * unit)
            left -= take
        if sum(counts) < job.min_replicas:
            return []
        return [tuple(counts)]

    # -- one layout ----------------------------------------------------------------------

    def _layouts(
        self, mix: tuple[TypePool, ...], counts: tuple[int, ...], tp: int, pp: int
    ) -> Iterator[_Scored]:
        job = self.job
        per_pod = job.devices_per_worker
        replicas = tuple(c * per_pod // (tp * pp) for c in counts)
        dp = sum(replicas)
        if job.model is None:
            scored = self._model_free(mix, counts, replicas)
            if scored is not None:
                yield scored
            return
        model = job.model
        if dp * (job.micro_batch or 1) > job.global_batch_size:
            self.rejections.add("divisibility", _too_many_replicas(job, dp))
            return
        # The bandwidth depends on tp and pp only: the same for every layout of this loop.
        dp_gbs = dp_bandwidth(
            mix, counts, replica_gpus=tp * pp, devices_per_worker=per_pod, constants=self.constants
        )
        shardings = _sharding_options(job.sharding, dp)
        too_big: set[tuple[Sharding, int]] = set()
        for mb in _micro_batches(job):
            if job.global_batch_size % mb or mb * dp > job.global_batch_size:
                continue
            for sharding, interleave in product(shardings, _interleave_options(model, pp)):
                if (sharding, interleave) in too_big:
                    continue  # memory grows with the micro-batch: a larger one cannot fit
                layouts = tuple(
                    Layout(tp, pp, mb, sharding, recompute, job.precision, interleave)
                    for recompute in RECOMPUTE_MODES
                )
                fit = self.fit(model, mix, counts, replicas, layouts, dp_gbs=dp_gbs)
                if fit.scored is not None:
                    yield fit.scored
                elif fit.out_of_memory:
                    too_big.add((sharding, interleave))

    def fit(
        self,
        model: ModelShape,
        mix: tuple[TypePool, ...],
        counts: tuple[int, ...],
        replicas: tuple[int, ...],
        layouts: Sequence[Layout],
        *,
        dp_gbs: float,
    ) -> _Fit:
        """The first of ``layouts`` (one layout with costlier recomputation each) that fits
        memory, scored, or why none does."""
        job = self.job
        worst: tuple[str, Layout, float, float] | None = None
        for layout in layouts:
            tp, pp, mb = layout.tp, layout.pp, layout.micro_batch
            slots = tuple(self._slot(pool, model, layout) for pool in mix)
            if any(math.isinf(s.per_slot) for s in slots):
                return _Fit(None)
            split = self._split(mix, replicas, slots, mb=mb, pp=pp, interleave=layout.interleave)
            if split is None:
                return _Fit(None)
            needs, short = self._memory_by_type(
                model, mix, split=split, layout=layout, dp=sum(replicas)
            )
            if short is not None:
                worst = short
                continue
            self.evaluated += 1
            loads = tuple(
                TypeLoad(pool.gpu, n, k, slot)
                for pool, ks, slot in zip(mix, split, slots, strict=True)
                for k, n in sorted(Counter(ks).items(), reverse=True)
            )
            predicted = self._predict(model, loads, layout, dp_gbs=dp_gbs, peak=max(needs))
            shares = _type_shares(job, mix, counts, split, mb, memory=needs)
            plan = JobPlan(
                shares,
                sum(replicas),
                tp,
                pp,
                mb,
                layout.sharding,
                layout.recompute,
                predicted,
                interleave=layout.interleave,
            )
            return _Fit(self._score(plan))
        if worst is None:
            return _Fit(None)
        name, short_layout, need, usable = worst
        self.rejections.add(
            "memory",
            lambda: (
                f"{name} tp={short_layout.tp} pp={short_layout.pp} "
                f"mb={short_layout.micro_batch} sharding={short_layout.sharding} "
                f"recompute={short_layout.recompute}: "
                f"needs {need:.1f} GiB > {usable:.1f} GiB usable"
            ),
        )
        return _Fit(None, out_of_memory=True)

    def _predict(
        self,
        model: ModelShape,
        loads: tuple[TypeLoad, ...],
        layout: Layout,
        *,
        dp_gbs: float,
        peak: float,
    ) -> StepPrediction:
        """The model's step for ``loads`` (a type's replicas with k and k - 1 micro-batches
        are two loads: the slowest sets the pace, all of them count for tokens)."""
        return predict_step(
            model, loads, layout, dp_gbs=dp_gbs, peak_memory=peak, constants=self.constants
        )

    def _split(
        self,
        mix: tuple[TypePool, ...],
        replicas: tuple[int, ...],
        slots: tuple[MicroBatchTime, ...],
        *,
        mb: int,
        pp: int,
        interleave: int,
    ) -> tuple[tuple[int, ...], ...] | None:
        """Micro-batches of every replica (cached), or None with a divisibility rejection.

        The interleaved schedule needs whole rounds of ``pp`` micro-batches per replica.
        """
        job = self.job
        unit = pp if interleave > 1 else 1
        key = (mb, replicas, pp, tuple(slot.per_slot for slot in slots), interleave)
        if key not in self._split_cache:
            self._split_cache[key] = _split_batch(
                job.global_batch_size // mb,
                replicas,
                tuple(slot.per_slot for slot in slots),
                bubble=slots[0].bubble_slots(pp),
                unit=unit,
            )
        split = self._split_cache[key]
        if split is None:
            self.rejections.add(
                "divisibility",
                lambda: (
                    f"globalBatchSize={job.global_batch_size} cannot be split into "
                    f"{'rounds of ' + str(unit) + ' ' if unit > 1 else ''}micro-batches of {mb} "
                    "over replicas "
                    + "+".join(f"{r}x{p.gpu.name}" for p, r in zip(mix, replicas, strict=True))
                ),
            )
        return split

    def _memory_by_type(
        self,
        model: ModelShape,
        mix: tuple[TypePool, ...],
        *,
        split: tuple[tuple[int, ...], ...],
        layout: Layout,
        dp: int,
    ) -> tuple[tuple[float, ...], tuple[str, Layout, float, float] | None]:
        """The most memory a GPU of each type needs, or the first type it does not fit.

        Types differ: a type whose replicas run fewer micro-batches than ``pp`` holds fewer in
        flight, so in a mix a slow type's GPU can need far less than the fast type's.
        """
        needs: list[float] = []
        for pool, ks in zip(mix, split, strict=True):
            held = in_flight(layout.pp, max(ks), layout.interleave)
            key = (*dataclasses.astuple(layout), dp, held)
            need = self._memory_cache.get(key)
            if need is None:
                need = memory_gib(model, layout, dp=dp, in_flight=held)
                self._memory_cache[key] = need
            usable = usable_memory_gib(pool.gpu, self.constants)
            needs.append(need)
            if need > usable:
                return tuple(needs), (pool.gpu.name, layout, need, usable)
        return tuple(needs), None

    def _model_free(
        self, mix: tuple[TypePool, ...], counts: tuple[int, ...], replicas: tuple[int, ...]
    ) -> _Scored | None:
        """Pure data parallel without a model: shares follow each type's relative speed.

        Times are relative: one sample takes one "second" on the fastest allowed type and
        proportionally longer on slower ones (by peak x efficiency); throughput is in samples
        per such second. Without a model there is nothing more to know.
        """
        job = self.job
        fastest = max(pool.speed for pool in self.pools)
        times = tuple(fastest / max(pool.speed, 1e-12) for pool in mix)
        dp = sum(replicas)
        mb = job.micro_batch or 1
        split = _split_batch(job.global_batch_size // mb, replicas, times, bubble=0.0)
        if split is None or job.global_batch_size % mb:
            self.rejections.add("divisibility", _too_many_replicas(job, dp))
            return None
        self.evaluated += 1
        step = max(max(ks) * mb * t for ks, t in zip(split, times, strict=True))
        predicted = StepPrediction(
            step_time_s=step,
            tokens_per_s=job.global_batch_size / step,
            tflops_per_gpu=0.0,
            mfu=0.0,
            peak_memory_gib=0.0,
            bottleneck=NO_MODEL,
            breakdown=(("compute", step),),
        )
        shares = _type_shares(job, mix, counts, split, mb)
        return self._score(JobPlan(shares, dp, 1, 1, mb, "none", "none", predicted))

    # -- helpers -------------------------------------------------------------------------

    def _slot(self, pool: TypePool, model: ModelShape, layout: Layout) -> MicroBatchTime:
        """One micro-batch's time on ``pool``'s GPUs (cached: it does not depend on sharding,
        and the precision is the search's)."""
        tp, pp = layout.tp, layout.pp
        key = (pool.gpu.name, tp, pp, layout.micro_batch, layout.recompute, layout.interleave)
        cached = self._slot_cache.get(key)
        if cached is None:
            within_pod = tp * pp <= self.job.devices_per_worker
            raw = pool.gpu.interconnect_gbs if within_pod else pool.network_gbs
            p2p = effective_gbs(raw, intra_node=within_pod, constants=self.constants)
            cached = micro_batch_time(
                pool.gpu, model, layout, p2p_gbs=p2p, constants=self.constants
            )
            self._slot_cache[key] = cached
        return cached

    def _score(self, plan: JobPlan) -> _Scored:
        tokens = plan.predicted.tokens_per_s
        if self.job.objective == "cost":
            key: tuple[float, ...] = (-plan.tokens_per_dollar, -tokens, float(plan.gpus))
        else:
            key = (-tokens, float(plan.gpus), plan.hourly_usd)
        tiebreak = (
            tuple(s.gpu_type for s in plan.types),
            plan.tp,
            plan.pp,
            plan.dp,
            plan.micro_batch,
            plan.sharding,
            plan.recompute,
        )
        return _Scored(key, tiebreak, plan)


def dp_bandwidth(
    mix: tuple[TypePool, ...],
    counts: tuple[int, ...],
    *,
    replica_gpus: int,
    devices_per_worker: int,
    constants: ModelConstants = DEFAULT_CONSTANTS,
) -> float:
    """Effective bandwidth per rank (GB/s) of the slowest link a data-parallel ring crosses.

    A world of one pod never leaves the node: the GPUs' own interconnect. Otherwise each ring
    crosses pods over the network, and a pod's GPUs belong to ``min(gpus, replica_gpus)``
    different data-parallel groups (one per position in a replica of ``replica_gpus`` = tp·pp
    GPUs), each one ring through the pod: the pod's share of its node's NIC (``gpus`` times a
    GPU's share, ``TypePool.network_gbs``) is split that many ways, and never beats the GPUs'
    own interconnect. So tp=8 on 8-GPU pods gives each ring one GPU's share of the NIC, and
    pure data parallelism the pod's whole share.
    """
    per_pod = devices_per_worker
    intra = effective_gbs(
        min(pool.gpu.interconnect_gbs for pool in mix), intra_node=True, constants=constants
    )
    if len(mix) == 1 and counts[0] == 1 and per_pod <= mix[0].gpu.gpus_per_node:
        return intra
    rings = min(per_pod, replica_gpus)
    ring_share = min(pool.network_gbs for pool in mix) * per_pod / rings
    return min(intra, effective_gbs(ring_share, intra_node=False, constants=constants))


def _sharding_options(allowed: tuple[Sharding, ...], dp: int) -> tuple[Sharding, ...]:
    """Sharding modes worth evaluating: none alone when dp = 1; and ``none`` is dominated
    by ``optimizer`` (same traffic, less memory, a shorter optimizer step) when both are
    allowed."""
    if dp == 1:
        return ("none",) if "none" in allowed else allowed[:1]
    if "optimizer" in allowed:
        return tuple(mode for mode in allowed if mode != "none")
    return allowed


def _interleave_options(model: ModelShape, pp: int) -> tuple[int, ...]:
    """Virtual stages per GPU to try: 1, and the most (up to 4) that split a stage evenly
    and leave every virtual stage a layer."""
    if pp == 1:
        return (1,)
    per_stage = math.ceil(model.layers / pp)
    fitting = (v for v in (2, 3, 4) if per_stage % v == 0 and pp * v <= model.layers)
    most = max(fitting, default=1)
    return (1,) if most == 1 else (1, most)


def _split_batch(
    micro_batches: int,
    replicas: tuple[int, ...],
    times: tuple[float, ...],
    *,
    bubble: float,
    unit: int = 1,
) -> tuple[tuple[int, ...], ...] | None:
    """Micro-batches of every data-parallel replica, type by type (in each type's replica
    order); None when impossible.

    They add up to ``micro_batches``; every replica gets at least ``unit`` and a multiple of
    ``unit`` (``pp`` for the interleaved schedule, else 1); and the slowest replica, whose
    time is ``(k + bubble) * times[i]``, finishes as early as possible. Replicas of one type
    differ by at most one unit, so any count of replicas up to ``micro_batches / unit`` can
    be formed: 256 micro-batches over 24 replicas are 16 x 11 + 8 x 10.
    """
    if micro_batches % unit or micro_batches // unit < sum(replicas):
        return None
    # In units: a replica of type i with k units takes (k + bubble / unit) * unit * t_i.
    scaled = tuple(unit * t for t in times)
    ks, last, excess = _fill(micro_batches // unit, replicas, scaled, bubble / unit)
    out = []
    for i, (r, k) in enumerate(zip(replicas, ks, strict=True)):
        fewer = excess if i == last else 0
        out.append(tuple([k * unit] * (r - fewer) + [(k - 1) * unit] * fewer))
    return tuple(out)


def _fill(
    units: int, replicas: tuple[int, ...], times: tuple[float, ...], bubble: float
) -> tuple[list[int], int | None, int]:
    """Units per replica of each type minimising ``max (k_i + bubble) * times[i]`` subject to
    ``sum replicas[i] * k_i >= units`` and ``k_i >= 1``; with the type that took the last
    unit (``None``: none was added) and by how much the total overshoots ``units``.

    Water filling: repeatedly give one more unit to every replica of the type that would
    finish it first. It starts just below the continuous optimum (types whose optimum is
    under one unit are fixed at one), so it takes a few steps per type, not one per unit.
    """
    n = len(replicas)
    fixed: set[int] = set()
    ideal = [1.0] * n
    while len(fixed) < n:
        free = [i for i in range(n) if i not in fixed]
        rest = units - sum(replicas[i] for i in fixed)
        rate = sum(replicas[i] / times[i] for i in free)
        finish = (rest + bubble * sum(replicas[i] for i in free)) / rate
        low = set()
        for i in free:
            ideal[i] = finish / times[i] - bubble
            if ideal[i] < 1:
                low.add(i)
        if not low:
            break
        fixed |= low
    ks = [1 if i in fixed else max(1, math.floor(ideal[i]) - 1) for i in range(n)]
    total = sum(r * k for r, k in zip(replicas, ks, strict=True))
    heap = [((ks[i] + 1 + bubble) * times[i], i) for i in range(n)]
    heapq.heapify(heap)
    last: int | None = None
    while total < units:
        _, i = heapq.heappop(heap)
        ks[i] += 1
        total += replicas[i]
        last = i
        heapq.heappush(heap, ((ks[i] + 1 + bubble) * times[i], i))
    return ks, last, total - units


def _micro_batches(job: JobRequirements) -> tuple[int, ...]:
    """Micro-batch sizes to try: the pinned one alone, when the job pins one."""
    return (job.micro_batch,) if job.micro_batch is not None else MICRO_BATCHES


def _too_many_replicas(job: JobRequirements, dp: int) -> str:
    """Why ``dp`` data-parallel replicas cannot share the global batch."""
    if job.micro_batch is None:
        return f"dp={dp} replicas exceed globalBatchSize={job.global_batch_size}"
    return (
        f"dp={dp} replicas exceed the {job.global_batch_size // job.micro_batch} micro-batches "
        f"of {job.micro_batch} in globalBatchSize={job.global_batch_size} "
        "(consistency bitwise keeps the micro-batch size)"
    )


def _type_shares(
    job: JobRequirements,
    mix: tuple[TypePool, ...],
    counts: tuple[int, ...],
    split: tuple[tuple[int, ...], ...],
    mb: int,
    *,
    memory: tuple[float, ...] | None = None,
) -> tuple[TypeShare, ...]:
    """Each type's part of a plan, with its replicas' shares in sequences and the memory a
    GPU of the type needs (``memory``, in mix order; none without a model)."""
    needs = memory if memory is not None else (0.0,) * len(mix)
    return tuple(
        TypeShare(
            pool.gpu.name,
            c * job.devices_per_worker,
            c,
            len(ks),
            max(ks) * mb,
            pool.gpu.hourly_usd,
            shares=tuple(k * mb for k in ks) if len(set(ks)) > 1 else (),
            peak_memory_gib=need,
        )
        for pool, c, ks, need in zip(mix, counts, split, needs, strict=True)
    )


def _with_placement(plan: JobPlan, pools: list[TypePool], job: JobRequirements) -> JobPlan:
    """The plan with its pods, ranks and (with a model) each stage's layers."""
    nodes_by_type: dict[str, Sequence[NodeCapacity]] = {p.gpu.name: p.nodes for p in pools}
    slots = {name: count for pool in pools for name, count in pool.slots}
    pods, ranks = place(
        plan.types,
        nodes_by_type,
        slots=slots,
        tp=plan.tp,
        pp=plan.pp,
        devices_per_pod=job.devices_per_worker,
    )
    stages = split_layers(job.model.layers, plan.pp * plan.interleave) if job.model else ()
    return dataclasses.replace(plan, pods=pods, ranks=ranks, stages=stages)
