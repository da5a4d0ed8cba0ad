"""Sharing a scarce GPU type between elastic jobs: minimums first, then the rest.

Elastic jobs grab what is free, so without a rule the first job to arrive keeps every GPU of
a type and a later job waits forever below its ``minReplicas``. The rule here: a job running
above its minimum gives back pods while another job that could use the same GPUs is starved
below its own minimum. Every job's operator pass computes the same answer from the same
snapshot (donors by largest surplus, then by name), so two jobs
never take turns preempting each other: once the starved job reaches its minimum it is no
longer starved, and nothing moves again (no livelock).

Pure: plain values in, a number out; the controller feeds it the TrainingJobs it listed.
Sizes are counted in pods, which is exact when the jobs sharing a type use the same number
of GPUs per pod and an approximation otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Claim:
    """One job as the sharing rule sees it."""

    key: str
    """namespace/name: unique and a stable tie-break."""
    minimum: int
    held: int
    """Pods the job occupies now: its world, standby, pending and retiring pods."""
    starved: bool
    """Below its minimum for lack of capacity."""
    gpu_types: frozenset[str]
    """GPU types its pods run on (donors) or may run on (starved jobs); empty: any."""


def overlaps(a: Claim, b: Claim, *, compatible: Callable[[str, str], bool]) -> bool:
    """Could the two jobs use the same GPUs? ``compatible(pattern, type)`` decides."""
    if not a.gpu_types or not b.gpu_types:
        return True
    return any(compatible(p, t) or compatible(t, p) for p in a.gpu_types for t in b.gpu_types)


def shared_desired(
    me: Claim,
    others: Sequence[Claim],
    *,
    desired: int,
    free: int,
    compatible: Callable[[str, str], bool],
) -> int:
    """The size ``me`` should aim for while starved jobs that could use its GPUs wait.

    Free pods go to the starved first (``me`` does not grow into them); what they still
    lack is given back by donors above their minimum, largest surplus first. ``held``
    counts every pod a job occupies, including pods it is already retiring, so a pass made
    while a donated pod is still shutting down does not give it twice.
    """
    if me.starved:
        return desired
    starved = [c for c in others if c.starved and overlaps(me, c, compatible=compatible)]
    deficit = sum(max(0, c.minimum - c.held) for c in starved)
    if deficit == 0:
        return desired
    still_needed = max(0, deficit - free)
    give = 0
    if still_needed and me.held > me.minimum:
        donors = sorted(
            (
                c
                for c in [me, *others]
                if not c.starved
                and c.held > c.minimum
                and any(overlaps(c, s, compatible=compatible) for s in starved)
            ),
            key=lambda c: (-(c.held - c.minimum), c.key),
        )
        for donor in donors:
            share = min(still_needed, donor.held - donor.minimum)
            if donor.key == me.key:
                give = share
                break
            still_needed -= share
            if still_needed <= 0:
                break
    return max(me.minimum, min(desired, me.held - give))
