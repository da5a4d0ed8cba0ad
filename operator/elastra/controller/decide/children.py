"""The pod writes that make a job's children match the world recorded in its status.

Given the status a pass records and what the resize decision asked, every pod gets the
assignment that status implies (its rank, or told to checkpoint and stop), new pods are
created gated on the planned nodes, and pods that must go are deleted. The assignments are
derived from the recorded world alone, so a pass interrupted after the status write is
repaired by the next one writing the same assignments.

Pure: values in, pod bodies and patches out.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any

from elastra.api import TrainingJob, TrainingJobStatus
from elastra.controller.decide.manifests import (
    ANNOTATION_ASSIGNMENT,
    ANNOTATION_RETIRED,
    LABEL_LEADER,
    LABEL_WORLD,
    RankSpec,
    assignment_json,
    is_gated,
    pod_name,
    slot_of,
    worker_pod,
)
from elastra.controller.decide.observe import PodFacts, format_time
from elastra.controller.decide.planning import NewPod, Placement
from elastra.controller.settings import OperatorSettings
from elastra.elastic.resize import ResizeDecision
from elastra.elastic.workers import WorkerState
from elastra.planner.record import assignment_plan

MAX_SLOTS = 1 << 20
"""Slot numbers a job's pods may take (pod names end in their slot)."""


@dataclass(frozen=True)
class Children:
    """The pod writes of one pass (see ``PassWrites`` for their order)."""

    creates: tuple[dict[str, Any], ...]
    patches: tuple[tuple[str, dict[str, Any]], ...]
    deletes: tuple[str, ...]
    ungate: tuple[str, ...]


@dataclass(frozen=True)
class _Writer:
    """What every pod write of the pass depends on."""

    job: TrainingJob
    status: TrainingJobStatus
    """The status this pass records: its world is what the children must match."""
    facts: Mapping[str, PodFacts]
    settings: OperatorSettings

    def assignment(self, name: str, *, retiring: bool) -> str:
        """The assignment pod ``name`` must carry: its rank in the world, or stop."""
        job, status = self.job, self.status
        world = status.world
        rank: RankSpec | None = None
        if not retiring and name in world.ranks and status.plan is not None:
            rank = RankSpec(
                rank={p.pod: p.rank for p in status.placement}.get(name, 0),
                world_size=world.size,
                master_addr=self._leader_address(),
                plan=assignment_plan(
                    status.plan, layers=job.spec.model.layers if job.spec.model else 0
                ),
            )
        return assignment_json(
            job,
            version=world.version,
            rank=rank,
            stop=retiring,
            settings=self.settings,
            peers_lost=rank is not None and self._peers_lost,
        )

    def leader(self, name: str, *, retiring: bool) -> bool:
        """Whether pod ``name`` is the recorded world's rank 0 (labelled for its Service)."""
        return not retiring and name in self.status.world.ranks and name == self._leader

    @cached_property
    def _peers_lost(self) -> bool:
        """The recorded world dropped members that could not stop with the one before (its
        last resize says so)."""
        last = self.status.resizes[-1] if self.status.resizes else None
        return (
            last is not None
            and last.to_version == self.status.world.version
            and bool(last.peers_lost)
        )

    @cached_property
    def _leader(self) -> str:
        """Rank 0's pod (found once per pass, not once per pod)."""
        status = self.status
        return next((p.pod for p in status.placement if p.rank == 0), status.world.ranks[0])

    def _leader_address(self) -> str:
        """Rank 0's stable DNS name (the job's headless Service publishes it before the pod
        is Ready). Never its IP: a world formed as its pods are created has none to give, and
        an address that changed within a world would cost every member a second write."""
        job = self.job
        return f"{self._leader}.{job.metadata.name}.{job.metadata.namespace}.svc"


def children(
    job: TrainingJob,
    status: TrainingJobStatus,
    *,
    facts: Mapping[str, PodFacts],
    decision: ResizeDecision,
    placement: Placement,
    settings: OperatorSettings,
    now: datetime,
) -> Children:
    """Pod writes that make the children match the world recorded in ``status``."""
    writer = _Writer(job=job, status=status, facts=facts, settings=settings)
    creates = _creates(writer, placement, count=decision.create)
    return Children(
        creates=creates,
        patches=_patches(writer, decision, now),
        deletes=_deletes(facts, decision),
        ungate=_ungate(facts, decision, creates),
    )


def _deletes(facts: Mapping[str, PodFacts], decision: ResizeDecision) -> tuple[str, ...]:
    """The pods the decision drops, and terminating pods whose node is gone (to force)."""
    stuck = {n for n, f in facts.items() if f.node_gone and f.view.state is WorkerState.TERMINATING}
    return tuple(sorted({p for p in decision.delete if p in facts} | stuck))


def _patches(
    writer: _Writer, decision: ResizeDecision, now: datetime
) -> tuple[tuple[str, dict[str, Any]], ...]:
    """Assignment (and retirement) patches for pods whose annotation is not what it must be."""
    version = writer.status.world.version
    patches: list[tuple[str, dict[str, Any]]] = []
    for name, fact in sorted(writer.facts.items()):
        if name in decision.delete or fact.view.state is WorkerState.TERMINATING:
            continue
        told = fact.view.retiring_since is not None
        retiring = told or name in decision.retire
        wanted = writer.assignment(name, retiring=retiring)
        leader = writer.leader(name, retiring=retiring)
        if wanted == fact.assignment and (told or not retiring) and leader == fact.leader:
            continue
        annotations = {ANNOTATION_ASSIGNMENT: wanted}
        if retiring and not told:
            annotations[ANNOTATION_RETIRED] = format_time(now)
        labels: dict[str, str | None] = {
            LABEL_WORLD: str(version),
            LABEL_LEADER: "true" if leader else None,  # None: a merge patch removes it
        }
        patches.append((name, {"metadata": {"annotations": annotations, "labels": labels}}))
    return tuple(patches)


def _creates(writer: _Writer, placement: Placement, *, count: int) -> tuple[dict[str, Any], ...]:
    """The first ``count`` placed pods, each in the lowest slot no pod of the job holds.

    All but the last are gated; the reconciler creates the last only once every other one
    exists, so it needs no gate (and no second write) to keep the batch all-or-nothing.
    """
    job = writer.job
    missing = [p for p in writer.status.world.ranks if p not in writer.facts]
    batch = planned_pods(job.metadata.name, writer.facts, placement, count=count, first=missing)
    return tuple(
        worker_pod(
            job,
            slot=slot,
            node=new.node,
            gpu_type=new.gpu_type,
            assignment=writer.assignment(name, retiring=False),
            version=writer.status.world.version,
            settings=writer.settings,
            gated=index < len(batch) - 1,
            leader=writer.leader(name, retiring=False),
        )
        for index, (name, slot, new) in enumerate(batch)
    )


def planned_pods(
    job: str,
    facts: Mapping[str, PodFacts],
    placement: Placement,
    *,
    count: int,
    first: Sequence[str] = (),
) -> list[tuple[str, int, NewPod]]:
    """Name, slot and place of the first ``count`` placed pods, each in the lowest slot no pod
    of the job holds: what this pass creates (and, for a first world, records as members).
    ``first``: members of the recorded world whose create failed, created again in their own
    slots before any other (their ranks are recorded under those names)."""
    used = {f.view.slot for f in facts.values()}
    again = [s for s in (slot_of(job, p) for p in first) if s is not None and s not in used]
    free = (s for s in range(MAX_SLOTS) if s not in used and s not in again)
    slots = itertools.chain(again, free)
    return [
        (pod_name(job, slot), slot, new)
        for slot, new in zip(slots, placement.pods[:count], strict=False)
    ]


def _ungate(
    facts: Mapping[str, PodFacts], decision: ResizeDecision, creates: tuple[dict[str, Any], ...]
) -> tuple[str, ...]:
    """Gang admission: the batch is created gated (but its last pod, created after the rest)
    and ungated only after every create of the pass returned (the reconciler stops at the first
    failed create), so a batch that fails halfway never holds GPUs, and one that succeeds needs
    no second pass to start."""
    gated = [name for name, f in facts.items() if f.gated and name not in decision.delete]
    created = [str(p["metadata"]["name"]) for p in creates if is_gated(p)]
    return tuple(sorted([*gated, *created]))
