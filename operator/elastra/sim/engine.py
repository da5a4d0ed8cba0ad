"""The event-driven simulation: jobs arrive, run at the planner's speed, restart, fail, finish.

Time jumps from event to event (arrival, finish, node failure or preemption, node back,
a wake-up a policy asked for); after every instant the policy looks at the cluster and acts
through the few primitives here (``start``, ``resize``, ``stop``). Progress is measured in
tokens: a job's work is its trace duration times the planner's throughput at the requested
size and type (data parallel, as a user without a planner runs it); on any other allocation
it advances at the planner's throughput for that allocation. A restart (a resize, or resuming
after a failure or preemption) stalls the job for the restart cost of ``SpeedModel``; the first
start does not (the trace's duration includes its own start-up).

Faults are one seeded Poisson process over all GPUs of the fleet (rate per GPU-hour), so
every policy sees the same faults at the same times on the same nodes: a failure takes a node
down for ``repair_s`` and loses the work since the job's last checkpoint (one every
``checkpoint_interval_s`` of training); a preemption takes it for ``preemption_s`` and loses
nothing (the worker checkpoints on SIGTERM). What the job does next is the policy's call.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import IntEnum
from typing import Protocol

from elastra.errors import UserError
from elastra.sim.fleet import SimCluster
from elastra.sim.metrics import SimResult, summarize
from elastra.sim.models import ModelProfile, profile
from elastra.sim.nodes import NodePool, Placement
from elastra.sim.speed import SpeedModel, pod_gpus
from elastra.sim.trace import TraceJob


@dataclass(frozen=True)
class FaultRates:
    """Injected failures and preemptions (rates per GPU-hour), seeded."""

    failures_per_gpu_hour: float = 0.0
    preemptions_per_gpu_hour: float = 0.0
    repair_s: float = 1800.0
    preemption_s: float = 600.0
    checkpoint_interval_s: float = 1800.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.failures_per_gpu_hour < 0 or self.preemptions_per_gpu_hour < 0:
            raise UserError("failure and preemption rates must be >= 0 per GPU-hour")


@dataclass(frozen=True)
class Pod:
    """One worker pod of a job: its stable slot, its node and its GPUs."""

    slot: int
    node: int
    gpus: int


class JobState:
    """A job during the run (mutable, owned by one ``Simulation``)."""

    __slots__ = (
        "done",
        "epoch",
        "finished",
        "gpu_type",
        "index",
        "last_resize",
        "next_slot",
        "paused_until",
        "pods",
        "profile",
        "rate",
        "restarts",
        "run_start",
        "since",
        "spec",
        "work",
    )

    def __init__(self, index: int, spec: TraceJob, model: ModelProfile, work: float) -> None:
        self.index = index
        self.spec = spec
        self.profile = model
        self.work = work
        self.done = 0.0
        self.gpu_type: str | None = None
        self.pods: tuple[Pod, ...] = ()
        self.rate = 0.0
        self.paused_until = 0.0
        self.since = 0.0
        self.run_start = 0.0
        self.finished: float | None = None
        self.restarts = 0
        self.last_resize: float | None = None
        self.epoch = 0
        self.next_slot = 0

    @property
    def gpus(self) -> int:
        """GPUs the job holds now."""
        return sum(p.gpus for p in self.pods)

    @property
    def name(self) -> str:
        """The trace's job name."""
        return self.spec.name

    def remaining_s(self, now: float) -> float:
        """Predicted seconds to finish at the current rate (inf when not running)."""
        if self.rate <= 0:
            return math.inf
        return max(0.0, self.paused_until - now) + (self.work - self.done) / self.rate


class Policy(Protocol):
    """A scheduling policy: decides who runs where, reacting to the cluster after each instant."""

    name: str
    planned: bool
    """Whether jobs run the planner's chosen layout (else data parallel only)."""

    def schedule(self, sim: Simulation) -> None:
        """Start, grow, shrink jobs (called after every instant with events)."""

    def lost(self, sim: Simulation, job: JobState, slots: frozenset[int]) -> None:
        """Pods ``slots`` of a running job were lost (their GPUs are already released)."""


class _Event(IntEnum):
    FINISH = 0
    NODE_UP = 1
    ARRIVE = 2
    FAULT = 3
    WAKE = 4


class Simulation:
    """One run of one policy over one trace on one cluster."""

    def __init__(
        self,
        cluster: SimCluster,
        jobs: Sequence[TraceJob],
        *,
        speed: SpeedModel,
        policy: Policy,
        faults: FaultRates | None = None,
        source: str = "<trace>",
    ) -> None:
        self.cluster = cluster
        self.speed = speed
        self.policy = policy
        self.faults = faults or FaultRates()
        self.nodes = NodePool(cluster.inventory)
        self.jobs = [self._job(i, spec, source) for i, spec in enumerate(jobs)]
        self.now = 0.0
        self.queue: list[JobState] = []
        """Jobs waiting to (re)start, oldest submission first."""
        self.running: dict[int, JobState] = {}
        self.arrived: list[JobState] = []
        """Jobs that arrived at this instant (policies may look at them alone)."""
        self.freed = False
        """Whether capacity was freed at this instant (finish, loss, node back)."""
        self.allocated = 0
        self._heap: list[tuple[float, int, int, int, int]] = []
        self._seq = 0
        self._wakes: set[float] = set()
        self._rng = random.Random(self.faults.seed)

    # -- setup -------------------------------------------------------------------------

    def _job(self, index: int, spec: TraceJob, source: str) -> JobState:
        where = f"{source}:{spec.line}"
        model = profile(spec.model)
        if model is None:
            raise UserError(f"{where}: model: unknown model {spec.model!r}")
        total = self.nodes.total_by_type.get(spec.gpu_type, 0)
        if total == 0:
            raise UserError(
                f"{where}: gpuType: the cluster {self.cluster.name} has no {spec.gpu_type} GPUs"
            )
        per_node = self.speed.per_node(spec.gpu_type)
        shape = pod_gpus(spec.gpus, per_node)
        if self.nodes.place(spec.gpu_type, shape, spec.gpus // shape) is None:
            raise UserError(
                f"{where}: gpus: {spec.gpus} {spec.gpu_type} GPUs do not fit the cluster "
                f"{self.cluster.name} ({total} such GPUs, {per_node} per node)"
            )
        base = self.speed.rate(model, spec.gpu_type, spec.gpus, planned=False)
        if base <= 0:
            raise UserError(
                f"{where}: model: {model.name} does not fit in memory on {spec.gpus} "
                f"{spec.gpu_type} GPUs"
            )
        return JobState(index, spec, model, work=spec.duration_s * base)

    # -- what policies call ------------------------------------------------------------

    def rate(self, job: JobState, gpu_type: str, gpus: int) -> float:
        """Tokens/s ``job`` would train at on ``gpus`` GPUs of ``gpu_type`` under the policy."""
        return self.speed.rate(job.profile, gpu_type, gpus, planned=self.policy.planned)

    def restart_s(self, job: JobState, gpu_type: str, gpus: int) -> float:
        """What restarting ``job`` on ``gpus`` GPUs of ``gpu_type`` costs."""
        return self.speed.restart_seconds(job.profile, gpu_type, gpus)

    def new_pods(self, job: JobState, placement: Placement, gpus_per_pod: int) -> tuple[Pod, ...]:
        """Pods for ``placement`` with fresh slots (nothing is taken until ``resize``)."""
        pods = []
        for node, count in placement:
            for _ in range(count):
                pods.append(Pod(job.next_slot, node, gpus_per_pod))
                job.next_slot += 1
        return tuple(pods)

    def resize(self, job: JobState, pods: Sequence[Pod], gpu_type: str) -> None:
        """Run ``job`` on exactly ``pods`` of ``gpu_type`` from now (a start or a restart)."""
        self._advance(job)
        keep = {p.slot for p in pods}
        for pod in job.pods:
            if pod.slot not in keep:
                self._give(pod)
        held = {p.slot for p in job.pods}
        for pod in pods:
            if pod.slot not in held:
                self.nodes.take(pod.node, pod.gpus)
                self.allocated += pod.gpus
        was_running = bool(job.pods)
        resumed = not was_running and job.done > 0
        job.pods = tuple(pods)
        job.gpu_type = gpu_type
        gpus = job.gpus
        job.rate = self.rate(job, gpu_type, gpus)
        pause = 0.0
        if was_running or resumed:
            pause = self.restart_s(job, gpu_type, gpus)
            job.restarts += 1
            job.last_resize = self.now
        job.paused_until = self.now + pause
        job.run_start = job.paused_until
        if not was_running:
            self.queue.remove(job)
            self.running[job.index] = job
        self._schedule_finish(job)

    def stop(self, job: JobState) -> None:
        """Release every pod of ``job`` and queue it again (it keeps its progress)."""
        self._advance(job)
        for pod in job.pods:
            self._give(pod)
        job.pods = ()
        job.rate = 0.0
        job.epoch += 1
        del self.running[job.index]
        self._enqueue(job)

    def wake(self, after_s: float) -> None:
        """Call the policy again ``after_s`` from now even if nothing else happens."""
        when = self.now + max(after_s, 1e-6)
        if when not in self._wakes:
            self._wakes.add(when)
            self._push(when, _Event.WAKE, 0)

    # -- the loop ----------------------------------------------------------------------

    def run(self) -> SimResult:
        """Simulate until every job has finished; the result of the policy."""
        started = time.perf_counter()
        for job in self.jobs:
            self._push(job.spec.submit_s, _Event.ARRIVE, job.index)
        rate = self.faults.failures_per_gpu_hour + self.faults.preemptions_per_gpu_hour
        if rate > 0 and self.nodes.total > 0:
            self._next_fault()
        timeline: list[tuple[float, int]] = [(0.0, 0)]
        unfinished = len(self.jobs)
        while unfinished:
            if not self._heap:
                waiting = ", ".join(j.name for j in self.queue[:3])
                raise RuntimeError(f"{self.policy.name}: stuck with jobs waiting: {waiting}")
            self.now = self._heap[0][0]
            self.arrived = []
            self.freed = False
            while self._heap and self._heap[0][0] == self.now:
                _, kind, _, payload, epoch = heapq.heappop(self._heap)
                unfinished -= self._handle(_Event(kind), payload, epoch)
            if unfinished:
                self.policy.schedule(self)
            if timeline[-1][1] != self.allocated:
                if timeline[-1][0] == self.now:
                    timeline[-1] = (self.now, self.allocated)
                else:
                    timeline.append((self.now, self.allocated))
        jcts = [
            (j.finished if j.finished is not None else self.now) - j.spec.submit_s
            for j in self.jobs
        ]
        makespan = max((j.finished or 0.0) for j in self.jobs)
        result = summarize(
            self.policy.name,
            jcts=jcts,
            makespan_s=makespan,
            timeline=timeline,
            cluster_gpus=self.nodes.total,
            restarts=sum(j.restarts for j in self.jobs),
        )
        return _with_cost(result, time.perf_counter() - started, self.speed.planner_calls)

    def _handle(self, kind: _Event, payload: int, epoch: int) -> int:
        """Apply one event; 1 when it finished a job."""
        if kind is _Event.ARRIVE:
            job = self.jobs[payload]
            self._enqueue(job)
            self.arrived.append(job)
        elif kind is _Event.FINISH:
            job = self.jobs[payload]
            if job.epoch != epoch or job.finished is not None:
                return 0
            self._advance(job)
            job.done = job.work
            for pod in job.pods:
                self._give(pod)
            job.pods = ()
            job.rate = 0.0
            job.finished = self.now
            del self.running[job.index]
            self.freed = True
            return 1
        elif kind is _Event.NODE_UP:
            self.nodes.set_up(payload, True)
            self.freed = True
        elif kind is _Event.FAULT:
            self._fault(payload, failure=bool(epoch))
            self._next_fault()
        else:
            self._wakes.discard(self.now)
        return 0

    def _fault(self, node: int, *, failure: bool) -> None:
        if not self.nodes.up[node]:
            return
        self.nodes.set_up(node, False)
        back = self.faults.repair_s if failure else self.faults.preemption_s
        self._push(self.now + back, _Event.NODE_UP, node)
        for job in [j for j in self.running.values() if any(p.node == node for p in j.pods)]:
            self._advance(job)
            if failure and self.now > job.run_start:
                since_checkpoint = (self.now - job.run_start) % self.faults.checkpoint_interval_s
                job.done = max(0.0, job.done - job.rate * since_checkpoint)
            lost = frozenset(p.slot for p in job.pods if p.node == node)
            for pod in job.pods:
                if pod.slot in lost:
                    self._give(pod)
            job.pods = tuple(p for p in job.pods if p.slot not in lost)
            job.epoch += 1
            job.rate = 0.0
            self.freed = True
            self.policy.lost(self, job, lost)
            if job.pods and job.rate == 0.0:
                raise RuntimeError(f"{self.policy.name}: {job.name} kept pods but no world")

    def _next_fault(self) -> None:
        failures = self.faults.failures_per_gpu_hour
        total = failures + self.faults.preemptions_per_gpu_hour
        after = self._rng.expovariate(total * self.nodes.total / 3600.0)
        gpu = self._rng.randrange(self.nodes.total)
        is_failure = self._rng.random() < failures / total
        node = 0
        for node, capacity in enumerate(self.nodes.capacity):  # noqa: B007
            if gpu < capacity:
                break
            gpu -= capacity
        self._push(self.now + after, _Event.FAULT, node, epoch=int(is_failure))

    # -- bookkeeping -------------------------------------------------------------------

    def _advance(self, job: JobState) -> None:
        if job.rate > 0:
            start = max(job.since, job.paused_until)
            if self.now > start:
                job.done = min(job.work, job.done + job.rate * (self.now - start))
        job.since = self.now

    def _schedule_finish(self, job: JobState) -> None:
        job.epoch += 1
        job.since = self.now
        if job.rate > 0:
            end = job.paused_until + (job.work - job.done) / job.rate
            self._push(end, _Event.FINISH, job.index, epoch=job.epoch)

    def _give(self, pod: Pod) -> None:
        self.nodes.give(pod.node, pod.gpus)
        self.allocated -= pod.gpus
        self.freed = True

    def _enqueue(self, job: JobState) -> None:
        key = (job.spec.submit_s, job.index)
        low, high = 0, len(self.queue)
        while low < high:
            mid = (low + high) // 2
            other = self.queue[mid]
            if (other.spec.submit_s, other.index) < key:
                low = mid + 1
            else:
                high = mid
        self.queue.insert(low, job)

    def _push(self, when: float, kind: _Event, payload: int, *, epoch: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (when, int(kind), self._seq, payload, epoch))


def _with_cost(result: SimResult, wall_s: float, planner_calls: int) -> SimResult:
    return replace(result, wall_s=wall_s, planner_calls=planner_calls)
