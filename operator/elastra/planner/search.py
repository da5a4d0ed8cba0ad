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
never mixes types) and choose per-type micro-batch counts so that replicas of different speeds
finish a step together, while the shares still add up to the global batch exactly.

Ranking is by tokens per second (throughput) or tokens per dollar (cost), ties broken by
fewer GPUs, lower price and then the layout itself, so the order is total and deterministic.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import combinations, product

from elastra.planner.catalog import GpuType, matches
from elastra.planner.inventory import Inventory, NodeCapacity, NodeName
from elastra.planner.job import RECOMPUTE_MODES, JobRequirements, ModelShape, Recompute, Sharding
from elastra.planner.perfmodel import (
    DEFAULT_CONSTANTS,
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
from elastra.planner.plan import Plan, PlanResult, Rejection, TypeShare

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
    plan: Plan


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
        return _infeasible("no allowed capacity", rejections, 0)
    if sum(pool.pods for pool in pools) < job.min_replicas:
        free = ", ".join(f"{p.pods} on {p.gpu.name}" for p in pools)
        rejections.add(
            "capacity", f"minReplicas={job.min_replicas} pods needed, free pod slots: {free}"
        )
        return _infeasible("not enough capacity", rejections, 0)
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
    *,
    pods: Sequence[tuple[str, int]],
    tp: int,
    pp: int,
    micro_batch: int,
    sharding: Sharding,
    recompute: Recompute,
    interleave: int = 1,
    constants: ModelConstants = DEFAULT_CONSTANTS,
) -> PlanResult:
    """Predict one given layout (``pods`` per GPU type name, in data-parallel order).

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
            return _infeasible("not enough capacity", rejections, 0)
    search = _Search(job, list(mix), constants, rejections)
    per_pod = job.devices_per_worker
    replicas = tuple(c * per_pod // (tp * pp) for c in counts)
    scored = search._fit(
        job.model,
        mix,
        counts,
        replicas,
        tp=tp,
        pp=pp,
        mb=micro_batch,
        sharding=sharding,
        dp_gbs=search._dp_bandwidth(mix, counts, tp, pp),
        interleave=interleave,
        recomputes=(recompute,),
    )
    if scored is None:
        return _infeasible("layout does not fit", rejections, search.evaluated)
    plan = _with_placement(scored.plan, list(mix), job)
    return PlanResult((plan,), None, rejections.summary(), search.evaluated)


def _shape(plan: Plan) -> tuple[object, ...]:
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


def _infeasible(headline: str, rejections: _Rejections, evaluated: int) -> PlanResult:
    summary = rejections.summary()
    details = "; ".join(f"{r.category} ({r.count}): {r.example}" for r in summary[:3])
    reason = f"{headline}: {details}" if details else headline
    return PlanResult(plans=(), reason=reason, rejections=summary, candidates=evaluated)


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
        self._out_of_memory = False
        self._memory_cache: dict[tuple[object, ...], float] = {}
        self._split_cache: dict[tuple[object, ...], tuple[int, ...] | None] = {}
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
        # Micro-batches per replica: at most GB/dp for one type; a mix may skew shares.
        most = job.global_batch_size // max(dp, 1) if len(mix) == 1 else job.global_batch_size
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
            yield from combinations(pools, size)

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
            if self.job.model is not None:
                valid = [u for u in units if job.global_batch_size % (u * dp_per_unit) == 0]
                if not valid:
                    self.rejections.add(
                        "divisibility",
                        f"{mix[0].gpu.name} tp={tp} pp={pp}: globalBatchSize="
                        f"{job.global_batch_size} not divisible by any dp from "
                        f"{units[-1] * dp_per_unit} to {units[0] * dp_per_unit}",
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
        if dp * 1 > job.global_batch_size:
            self.rejections.add(
                "divisibility", f"dp={dp} replicas exceed globalBatchSize={job.global_batch_size}"
            )
            return
        dp_gbs = self._dp_bandwidth(mix, counts, tp, pp)
        shardings = _sharding_options(job.sharding, dp)
        too_big: set[tuple[Sharding, int]] = set()
        for mb in MICRO_BATCHES:
            if job.global_batch_size % mb or mb * dp > job.global_batch_size:
                continue
            for sharding, interleave in product(shardings, _interleave_options(model, pp)):
                if (sharding, interleave) in too_big:
                    continue  # memory grows with the micro-batch: a larger one cannot fit
                scored = self._fit(
                    model,
                    mix,
                    counts,
                    replicas,
                    tp=tp,
                    pp=pp,
                    mb=mb,
                    sharding=sharding,
                    dp_gbs=dp_gbs,
                    interleave=interleave,
                )
                if scored is not None:
                    yield scored
                elif self._out_of_memory:
                    too_big.add((sharding, interleave))

    def _fit(
        self,
        model: ModelShape,
        mix: tuple[TypePool, ...],
        counts: tuple[int, ...],
        replicas: tuple[int, ...],
        *,
        tp: int,
        pp: int,
        mb: int,
        sharding: Sharding,
        dp_gbs: float,
        interleave: int = 1,
        recomputes: tuple[Recompute, ...] = RECOMPUTE_MODES,
    ) -> _Scored | None:
        """The cheapest recomputation that fits memory for this layout, scored; or None."""
        job = self.job
        dp = sum(replicas)
        worst: tuple[str, Recompute, float, float] | None = None
        self._out_of_memory = False
        for recompute in recomputes:
            slots = tuple(
                self._slot(
                    pool, model, tp=tp, pp=pp, mb=mb, recompute=recompute, interleave=interleave
                )
                for pool in mix
            )
            if any(math.isinf(s.per_slot) for s in slots):
                return None
            split_key = (mb, replicas, pp, tuple(slot.per_slot for slot in slots), interleave)
            if split_key in self._split_cache:
                split = self._split_cache[split_key]
            else:
                split = _split_batch(job.global_batch_size // mb, replicas, slots, pp)
                self._split_cache[split_key] = split
            if split is not None and interleave > 1 and any(k % pp for k in split):
                return None  # the interleaved schedule needs whole rounds of pp micro-batches
            if split is None:
                self.rejections.add(
                    "divisibility",
                    lambda: (
                        f"globalBatchSize={job.global_batch_size} cannot be split into "
                        f"micro-batches of {mb} over replicas "
                        + "+".join(f"{r}x{p.gpu.name}" for p, r in zip(mix, replicas, strict=True))
                    ),
                )
                return None
            peak = 0.0
            fits = True
            for pool, k in zip(mix, split, strict=True):
                held = in_flight(pp, k, interleave)
                memory_key = (tp, pp, mb, sharding, recompute, dp, held)
                need = self._memory_cache.get(memory_key)
                if need is None:
                    need = memory_gib(
                        model,
                        tp=tp,
                        pp=pp,
                        micro_batch=mb,
                        sharding=sharding,
                        recompute=recompute,
                        precision=job.precision,
                        dp=dp,
                        in_flight=held,
                    )
                    self._memory_cache[memory_key] = need
                usable = usable_memory_gib(pool.gpu, self.constants)
                peak = max(peak, need)
                if need > usable:
                    fits = False
                    worst = (pool.gpu.name, recompute, need, usable)
                    break
            if not fits:
                continue
            self.evaluated += 1
            loads = tuple(
                TypeLoad(pool.gpu, r, k, s)
                for pool, r, k, s in zip(mix, replicas, split, slots, strict=True)
            )
            predicted = predict_step(
                model,
                loads,
                tp=tp,
                pp=pp,
                micro_batch=mb,
                sharding=sharding,
                recompute=recompute,
                precision=job.precision,
                dp_gbs=dp_gbs,
                peak_memory=peak,
                constants=self.constants,
            )
            shares = tuple(
                TypeShare(
                    pool.gpu.name, c * job.devices_per_worker, c, r, k * mb, pool.gpu.hourly_usd
                )
                for pool, c, r, k in zip(mix, counts, replicas, split, strict=True)
            )
            plan = Plan(shares, dp, tp, pp, mb, sharding, recompute, predicted)
            return self._score(dataclasses.replace(plan, interleave=interleave))
        if worst is not None:
            name, recompute, need, usable = worst
            self._out_of_memory = True
            self.rejections.add(
                "memory",
                lambda: (
                    f"{name} tp={tp} pp={pp} mb={mb} sharding={sharding} recompute={recompute}: "
                    f"needs {need:.1f} GiB > {usable:.1f} GiB usable"
                ),
            )
        return None

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
        slots = tuple(
            MicroBatchTime(fastest / max(pool.speed, 1e-12), 0.0, 0.0, 0.0) for pool in mix
        )
        dp = sum(replicas)
        split = _split_batch(job.global_batch_size, replicas, slots, 1)
        if split is None:
            self.rejections.add(
                "divisibility", f"globalBatchSize={job.global_batch_size} < replicas={dp}"
            )
            return None
        self.evaluated += 1
        step = max(k * s.per_slot for k, s in zip(split, slots, strict=True))
        predicted = StepPrediction(
            step_time_s=step,
            tokens_per_s=job.global_batch_size / step,
            tflops_per_gpu=0.0,
            mfu=0.0,
            peak_memory_gib=0.0,
            bottleneck=NO_MODEL,
            breakdown=(("compute", step),),
        )
        shares = tuple(
            TypeShare(pool.gpu.name, c * job.devices_per_worker, c, r, k, pool.gpu.hourly_usd)
            for pool, c, r, k in zip(mix, counts, replicas, split, strict=True)
        )
        return self._score(Plan(shares, dp, 1, 1, 1, "none", "none", predicted))

    # -- helpers -------------------------------------------------------------------------

    def _slot(
        self,
        pool: TypePool,
        model: ModelShape,
        *,
        tp: int,
        pp: int,
        mb: int,
        recompute: Recompute,
        interleave: int,
    ) -> MicroBatchTime:
        key = (pool.gpu.name, tp, pp, mb, recompute, interleave)
        cached = self._slot_cache.get(key)
        if cached is None:
            within_pod = tp * pp <= self.job.devices_per_worker
            raw = pool.gpu.interconnect_gbs if within_pod else pool.network_gbs
            p2p = effective_gbs(raw, intra_node=within_pod, constants=self.constants)
            cached = micro_batch_time(
                pool.gpu,
                model,
                tp=tp,
                pp=pp,
                micro_batch=mb,
                recompute=recompute,
                precision=self.job.precision,
                p2p_gbs=p2p,
                interleave=interleave,
                constants=self.constants,
            )
            self._slot_cache[key] = cached
        return cached

    def _dp_bandwidth(
        self, mix: tuple[TypePool, ...], counts: tuple[int, ...], tp: int, pp: int
    ) -> float:
        """Effective bandwidth of the slowest link the data-parallel group crosses."""
        per_pod = self.job.devices_per_worker
        if len(mix) == 1 and counts[0] == 1 and per_pod <= mix[0].gpu.gpus_per_node:
            return effective_gbs(
                mix[0].gpu.interconnect_gbs, intra_node=True, constants=self.constants
            )
        slowest = min(pool.network_gbs for pool in mix)
        return effective_gbs(slowest, intra_node=False, constants=self.constants)

    def _score(self, plan: Plan) -> _Scored:
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
    """Virtual stages per GPU to try: 1, and the most (up to 4) that split a stage evenly."""
    if pp == 1:
        return (1,)
    per_stage = math.ceil(model.layers / pp)
    most = max((v for v in (2, 3, 4) if per_stage % v == 0), default=1)
    return (1,) if most == 1 else (1, most)


def _split_batch(
    micro_batches: int,
    replicas: tuple[int, ...],
    slots: tuple[MicroBatchTime, ...],
    pp: int,
) -> tuple[int, ...] | None:
    """Micro-batches per replica of each type: ``sum(replicas[i] * k[i]) == micro_batches``,
    every ``k >= 1``, minimising the time of the slowest replica; None when impossible.

    A single type needs ``micro_batches`` divisible by its replicas. For a mix the continuous
    optimum (all types finish together) is rounded: all but the last two types try the two
    integers around their optimum, and the last two solve
    ``r_a·k_a + r_b·k_b = rest`` exactly (a linear Diophantine equation) nearest the optimum.
    """
    if len(replicas) == 1:
        k, rest = divmod(micro_batches, replicas[0])
        return (k,) if rest == 0 and k >= 1 else None
    if micro_batches < sum(replicas):
        return None
    times = [slot.per_slot for slot in slots]
    bubble = slots[0].bubble_slots(pp)
    # Everyone finishes at T: k_i = T / t_i - bubble; sum r_i k_i = M.
    rate = sum(r / t for r, t in zip(replicas, times, strict=True))
    finish = (micro_batches + bubble * sum(replicas)) / rate
    ideal = [finish / t - bubble for t in times]
    *head, a, b = range(len(replicas))
    windows = [range(max(1, math.floor(ideal[i])), max(1, math.floor(ideal[i])) + 2) for i in head]
    best: tuple[float, tuple[int, ...]] | None = None
    for choice in product(*windows):
        rest = micro_batches - sum(replicas[i] * k for i, k in zip(head, choice, strict=True))
        for k_a, k_b in _pair_solutions(rest, replicas[a], replicas[b], ideal[a]):
            ks = (*choice, k_a, k_b)
            slowest = max((k + bubble) * t for k, t in zip(ks, times, strict=True))
            if best is None or (slowest, ks) < best:
                best = (slowest, ks)
    return None if best is None else best[1]


def _pair_solutions(rest: int, r_a: int, r_b: int, near: float) -> list[tuple[int, int]]:
    """Positive (k_a, k_b) with ``r_a·k_a + r_b·k_b == rest``, k_a nearest ``near``."""
    g = math.gcd(r_a, r_b)
    if rest < r_a + r_b or rest % g:
        return []
    step = r_b // g
    base = (rest // g) * pow(r_a // g, -1, step) % step if step > 1 else 0
    # k_a = base + t·step; k_b = (rest - r_a·k_a) / r_b must stay >= 1.
    highest = (rest - r_b) // r_a
    centre = math.floor((near - base) / step)
    found = []
    for t in (centre - 1, centre, centre + 1, centre + 2):
        k_a = base + t * step
        if 1 <= k_a <= highest:
            found.append((k_a, (rest - r_a * k_a) // r_b))
    if not found and highest >= 1:
        for k_a in (
            base + step * ((1 - base + step - 1) // step),
            base + step * ((highest - base) // step),
        ):
            if 1 <= k_a <= highest:
                found.append((k_a, (rest - r_a * k_a) // r_b))
    return found


def _with_placement(plan: Plan, pools: list[TypePool], job: JobRequirements) -> Plan:
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
    return dataclasses.replace(plan, pods=pods, ranks=ranks)
