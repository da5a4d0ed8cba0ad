"""The scheduling policies compared, two of them driven by the operator's own resize code.

- ``static``: gang FIFO with backfill. A job runs on exactly the GPUs it asked for, of the type
  it asked for, data parallel; a failure sends it back to the queue.
- ``gavel-like``: as ``static`` (fixed size, data parallel), but heterogeneity-aware: a job
  starts on whichever type with room trains it fastest, ranked by the planner's throughput on
  each type (a row of Gavel's throughput matrix; Narayanan et al., OSDI'20). No time slicing.
- ``elastic``: elastic on the requested type only, data parallel. Jobs start on what is free
  between ``minGpus`` and ``maxGpus``, grow when GPUs free up, are shrunk (never below their
  minimum, by the operator's sharing rule, ``elastra.elastic.share``: never for a job of lower
  priority) to admit queued jobs, and continue on the survivors after a failure.
- ``elastra``: the operator's policy: elastic as above, on any GPU type (the one where the
  planner predicts the most throughput for the GPUs free now), training with the planner's
  chosen parallel layout (tensor, pipeline, data parallel, sharding, recomputation).

The elastic policies do not re-implement the resize rules: every change of a job's world
(forming it, growing, shrinking, dropping lost workers) is a ``ResizeInput`` of
``WorkerView``s handed to ``elastra.elastic.resize.decide``, and only the world it returns is
applied. Growth carries a ``GrowthEstimate`` (planner speed-up, remaining time, restart cost),
so "is the restart worth it" and the cooldown are the operator's own; shrinking goes through
its ``SCALED_DOWN`` path (which pods retire is its choice), failures through its re-forming
path (below ``minReplicas`` the job waits, keeping its checkpoint). Nor the sharing rule:
which running jobs shrink, and by how much, to admit a queued job is the operator's
``elastra.elastic.share.gifts``, fed GPU counts and the trace's ``priority`` column.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from elastra.api.reasons import Reason
from elastra.elastic.resize import GrowthEstimate, ResizeInput, ResizePolicy, decide
from elastra.elastic.share import Claim, Scope, gifts
from elastra.elastic.workers import PodName, WorkerState, WorkerView
from elastra.sim.engine import JobState, Pod, Policy, Simulation
from elastra.sim.nodes import Placement
from elastra.sim.speed import pod_gpus

T0 = datetime(2020, 1, 1, tzinfo=UTC)
"""The trace start as a wall-clock instant (the resize code compares datetimes)."""

SIM_RESIZE = ResizePolicy(settle=timedelta(0))
"""The operator's defaults, except that a fault is one instant here: no burst to wait for."""

RECLAIM_DEPTH = 4
"""Queued jobs per instant that may shrink running jobs to get their minimum."""

SLOWDOWN_LIMIT = 2.0
"""A heterogeneity-aware policy moves a job to another GPU type only if, at the size the job
asked for, the planner predicts at most this slowdown against the type it asked for: a job
is never parked on GPUs that would take it many times longer (there is no migration back)."""


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _name(job: JobState, slot: int) -> PodName:
    return PodName(f"{job.name}-w{slot}")


def candidate_types(sim: Simulation, job: JobState, *, any_type: bool) -> list[str]:
    """The GPU types ``job`` may run on: the requested one, and for a heterogeneity-aware
    policy every type that holds the requested size within ``SLOWDOWN_LIMIT`` of its speed;
    fastest first."""
    requested = job.spec.gpu_type
    gpus = job.spec.gpus
    if not any_type:
        return [requested]
    floor = sim.rate(job, requested, gpus) / SLOWDOWN_LIMIT
    usable = [
        t
        for t in sim.speed.types
        if t == requested
        or (gpus <= sim.nodes.total_by_type.get(t, 0) and sim.rate(job, t, gpus) >= floor)
    ]
    return sorted(usable, key=lambda t: (-sim.rate(job, t, gpus), t))


class GangPolicy:
    """``static`` and ``gavel-like``: fixed size, gang FIFO with backfill."""

    planned = False

    def __init__(self, name: str, *, any_type: bool) -> None:
        self.name = name
        self.any_type = any_type
        self._types: dict[int, list[str]] = {}

    def schedule(self, sim: Simulation) -> None:
        """Start queued jobs, oldest first, wherever the whole gang fits now."""
        candidates = list(sim.queue) if sim.freed else list(sim.arrived)
        for job in candidates:
            if sim.nodes.free_total == 0:
                break
            if job.index not in sim.running:
                self._start(sim, job)

    def _start(self, sim: Simulation, job: JobState) -> None:
        gpus = job.spec.gpus
        types = self._types.get(job.index)
        if types is None:
            types = candidate_types(sim, job, any_type=self.any_type)
            self._types[job.index] = types
        for gpu_type in types:
            if sim.nodes.free_by_type.get(gpu_type, 0) < gpus:
                continue
            shape = pod_gpus(gpus, sim.speed.per_node(gpu_type))
            placement = sim.nodes.place(gpu_type, shape, gpus // shape)
            if placement is not None:
                sim.resize(job, sim.new_pods(job, placement, shape), gpu_type)
                return

    def lost(self, sim: Simulation, job: JobState, slots: frozenset[int]) -> None:
        """A gang cannot continue without a member: back to the queue, whole."""
        del slots
        sim.stop(job)


class ElasticPolicy:
    """``elastic`` and ``elastra``: worlds formed, grown and shrunk by ``resize.decide``."""

    def __init__(
        self,
        name: str,
        *,
        any_type: bool,
        planned: bool,
        resize: ResizePolicy = SIM_RESIZE,
    ) -> None:
        self.name = name
        self.any_type = any_type
        self.planned = planned
        self.resize = resize
        self._type_cache: dict[int, list[str]] = {}

    # -- sizes -------------------------------------------------------------------------

    def _granularity(self, sim: Simulation, job: JobState, gpu_type: str) -> int:
        """GPUs per pod on ``gpu_type``: divides both the minimum and the request."""
        common = math.gcd(job.spec.min_gpus, job.spec.gpus)
        return pod_gpus(common, sim.speed.per_node(gpu_type))

    def _sizes(self, sim: Simulation, job: JobState, gpu_type: str) -> list[int]:
        """GPU counts the job may run at on ``gpu_type``, ascending: its bounds, its request
        and the powers of two between (few counts: each is one planner question)."""
        grain = self._granularity(sim, job, gpu_type)
        low = math.ceil(job.spec.min_gpus / grain) * grain
        high = min(job.spec.max_gpus, sim.nodes.total_by_type.get(gpu_type, 0)) // grain * grain
        if high < low:
            return []
        sizes = {low, high}
        if low <= job.spec.gpus <= high:
            sizes.add(job.spec.gpus)
        power = grain
        while power <= high:
            if power >= low:
                sizes.add(power)
            power *= 2
        return sorted(sizes)

    def _types(self, sim: Simulation, job: JobState) -> list[str]:
        types = self._type_cache.get(job.index)
        if types is None:
            types = [
                t
                for t in candidate_types(sim, job, any_type=self.any_type)
                if self._sizes(sim, job, t)
            ]
            self._type_cache[job.index] = types
        return types

    # -- the round -----------------------------------------------------------------------

    def schedule(self, sim: Simulation) -> None:
        """Admit queued jobs (shrinking others if need be), then grow running ones."""
        if sim.freed or sim.arrived:
            reclaims = 0
            for job in list(sim.queue if sim.freed else sim.arrived):
                if job.index in sim.running:
                    continue
                if self._admit(sim, job):
                    continue
                if reclaims < RECLAIM_DEPTH:
                    reclaims += 1
                    if self._reclaim(sim, job):
                        self._admit(sim, job)
        if sim.nodes.free_total > 0:
            self._grow(sim)

    def _admit(self, sim: Simulation, job: JobState) -> bool:
        """Form a world on the type (and largest size) that trains fastest with what is free."""
        best: tuple[float, int, str, Placement, int] | None = None
        for gpu_type in self._types(sim, job):
            free = sim.nodes.free_by_type.get(gpu_type, 0)
            grain = self._granularity(sim, job, gpu_type)
            for size in reversed(self._sizes(sim, job, gpu_type)):
                if size > free:
                    continue
                placement = sim.nodes.place(gpu_type, grain, size // grain)
                if placement is None:
                    continue
                rate = sim.rate(job, gpu_type, size)
                if rate > 0 and (best is None or (rate, -size) > (best[0], -best[1])):
                    best = (rate, size, gpu_type, placement, grain)
                break
        if best is None:
            return False
        _, size, gpu_type, placement, grain = best
        standby = sim.new_pods(job, placement, grain)
        decision = decide(
            ResizeInput(
                desired=len(standby),
                minimum=self._min_pods(sim, job, gpu_type),
                world=(),
                workers=self._views(job, standby),
                placeable=0,
                now=_at(sim.now),
                last_resize=None,
            ),
            self.resize,
        )
        if decision.world is None or not decision.world:
            return False
        sim.resize(job, _in_order(job, standby, decision.world), gpu_type)
        return True

    def _grow(self, sim: Simulation) -> None:
        """Running jobs, least remaining time first, grow into free GPUs of their type when
        ``decide`` finds the planner's speed-up worth the restart."""
        jobs = sorted(
            (
                j
                for j in sim.running.values()
                if j.gpu_type is not None
                and sim.nodes.free_by_type.get(j.gpu_type, 0) > 0
                and j.gpus < j.spec.max_gpus
            ),
            key=lambda j: (j.remaining_s(sim.now), j.index),
        )
        for job in jobs:
            gpu_type = job.gpu_type
            assert gpu_type is not None
            free = sim.nodes.free_by_type.get(gpu_type, 0)
            grain = job.pods[0].gpus
            current = job.gpus
            for size in reversed(self._sizes(sim, job, gpu_type)):
                if size <= current:
                    break
                if size - current > free:
                    continue
                placement = sim.nodes.place(gpu_type, grain, (size - current) // grain)
                if placement is None:
                    continue
                growth = GrowthEstimate(
                    speedup=sim.rate(job, gpu_type, size) / max(job.rate, 1e-12),
                    remaining_seconds=job.remaining_s(sim.now),
                    restart_seconds=sim.restart_s(job, gpu_type, size),
                )
                self._grow_to(sim, job, placement, grain, growth)
                break

    def _grow_to(
        self,
        sim: Simulation,
        job: JobState,
        placement: Placement,
        grain: int,
        growth: GrowthEstimate,
    ) -> None:
        gpu_type = job.gpu_type
        assert gpu_type is not None
        standby = sim.new_pods(job, placement, grain)
        decision = decide(
            ResizeInput(
                desired=len(job.pods) + len(standby),
                minimum=self._min_pods(sim, job, gpu_type),
                world=tuple(_name(job, p.slot) for p in job.pods),
                workers=self._views(job, (*job.pods, *standby)),
                placeable=0,
                now=_at(sim.now),
                last_resize=None if job.last_resize is None else _at(job.last_resize),
                growth=growth,
            ),
            self.resize,
        )
        if decision.reason is Reason.SCALED_UP and decision.world:
            sim.resize(job, _in_order(job, (*job.pods, *standby), decision.world), gpu_type)
        elif not decision.recheck_after.is_never:
            sim.wake(decision.recheck_after.delay.total_seconds())

    def _reclaim(self, sim: Simulation, job: JobState) -> bool:
        """Shrink running jobs so that ``job`` gets its minimum, by the operator's sharing
        rule (``elastra.elastic.share``, in GPUs): only jobs of no higher priority give, the
        lowest priority first, then the largest surplus, never below their minimum. True when
        it now fits; nothing shrinks if it would not."""
        for gpu_type in self._types(sim, job):
            sizes = self._sizes(sim, job, gpu_type)
            if not sizes:
                continue
            grain = self._granularity(sim, job, gpu_type)
            need = sizes[0]
            shrinks, freed = self._donations(sim, job, gpu_type=gpu_type, need=need, grain=grain)
            if shrinks and sim.nodes.place(gpu_type, grain, need // grain, extra=freed):
                for victim, pods in shrinks:
                    self._shrink(sim, victim, pods)
                return True
        return False

    def _donations(
        self, sim: Simulation, job: JobState, *, gpu_type: str, need: int, grain: int
    ) -> tuple[list[tuple[JobState, int]], dict[int, int]]:
        """What ``share.gifts`` has the jobs running on ``gpu_type`` give ``job`` (starved,
        lacking ``need`` GPUs, of which the free ones cover what fits in ``grain`` pods):
        each donor's pods to keep, and the GPUs freed per node."""
        donors = {d.name: d for d in sim.running.values() if d.gpu_type == gpu_type}
        claims = [
            Claim(
                key=d.name,
                minimum=(self._sizes(sim, d, gpu_type) or [d.gpus])[0],
                held=d.gpus,
                starved=False,
                gpu_types=frozenset({gpu_type}),
                priority=d.spec.priority,
            )
            for d in donors.values()
        ]
        starved = Claim(
            key=job.name,
            minimum=need,
            held=0,
            starved=True,
            gpu_types=frozenset({gpu_type}),
            priority=job.spec.priority,
        )
        free = sim.nodes.room(gpu_type, grain) * grain
        given = gifts([starved, *claims], free=free, scope=Scope.CLUSTER, compatible=_same)
        shrinks: list[tuple[JobState, int]] = []
        freed: dict[int, int] = {}
        for name, gpus in sorted(given.items()):
            donor = donors[name]
            target = max(s for s in self._sizes(sim, donor, gpu_type) if s <= donor.gpus - gpus)
            keep = sorted(donor.pods, key=lambda p: p.slot)
            kept, held = 0, 0
            while kept < len(keep) and held + keep[kept].gpus <= target:
                held += keep[kept].gpus
                kept += 1
            for pod in keep[kept:]:
                freed[pod.node] = freed.get(pod.node, 0) + pod.gpus
            shrinks.append((donor, kept))
        return shrinks, freed

    def _shrink(self, sim: Simulation, job: JobState, pods: int) -> None:
        gpu_type = job.gpu_type
        assert gpu_type is not None
        decision = decide(
            ResizeInput(
                desired=pods,
                minimum=self._min_pods(sim, job, gpu_type),
                world=tuple(_name(job, p.slot) for p in job.pods),
                workers=self._views(job, job.pods),
                placeable=0,
                now=_at(sim.now),
                last_resize=None if job.last_resize is None else _at(job.last_resize),
            ),
            self.resize,
        )
        if decision.reason is Reason.SCALED_DOWN and decision.world:
            sim.resize(job, _in_order(job, job.pods, decision.world), gpu_type)

    def lost(self, sim: Simulation, job: JobState, slots: frozenset[int]) -> None:
        """Drop the lost workers through ``decide``: continue on the survivors, or wait."""
        gpu_type = job.gpu_type
        assert gpu_type is not None
        lost = tuple(
            WorkerView(_name(job, s), s, WorkerState.LOST, _at(sim.now)) for s in sorted(slots)
        )
        world = tuple(sorted([*(p.slot for p in job.pods), *slots]))
        decision = decide(
            ResizeInput(
                desired=len(world),
                minimum=self._min_pods(sim, job, gpu_type),
                world=tuple(_name(job, s) for s in world),
                workers=(*self._views(job, job.pods), *lost),
                placeable=0,
                now=_at(sim.now),
                last_resize=None if job.last_resize is None else _at(job.last_resize),
            ),
            self.resize,
        )
        if decision.world:
            sim.resize(job, _in_order(job, job.pods, decision.world), gpu_type)
        else:
            sim.stop(job)

    # -- helpers -------------------------------------------------------------------------

    def _min_pods(self, sim: Simulation, job: JobState, gpu_type: str) -> int:
        grain = self._granularity(sim, job, gpu_type)
        return max(1, math.ceil(job.spec.min_gpus / grain))

    def _views(self, job: JobState, pods: Sequence[Pod]) -> tuple[WorkerView, ...]:
        return tuple(
            WorkerView(_name(job, p.slot), p.slot, WorkerState.READY, T0, gpu_type=job.gpu_type)
            for p in pods
        )


def _same(pattern: str, gpu_type: str) -> bool:
    """Simulated jobs name catalog types exactly."""
    return pattern == gpu_type


def _in_order(job: JobState, pods: Sequence[Pod], world: Sequence[PodName]) -> list[Pod]:
    """The pods ``decide`` put in the world, in its rank order."""
    by_name = {_name(job, p.slot): p for p in pods}
    return [by_name[name] for name in world]


def make_policy(name: str) -> Policy:
    """A fresh policy by name (one of ``POLICY_NAMES``)."""
    if name == "static":
        return GangPolicy("static", any_type=False)
    if name == "gavel-like":
        return GangPolicy("gavel-like", any_type=True)
    if name == "elastic":
        return ElasticPolicy("elastic", any_type=False, planned=False)
    if name == "elastra":
        return ElasticPolicy("elastra", any_type=True, planned=True)
    raise ValueError(f"unknown policy {name!r}")


POLICY_NAMES = ("static", "gavel-like", "elastic", "elastra")
