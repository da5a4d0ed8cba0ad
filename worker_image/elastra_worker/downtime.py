"""How long a resize stopped training, and the job's goodput, measured by the world that resumes.

A resize's cost to the user is the time no step ends: from the end of the step the new world
resumes from (for a planned resize, the old world's last step) to the end of the new world's
first step (which includes that step's own compute, so a resize that costs nothing still shows
one step time; after a failure, the steps lost since the last checkpoint count too). The old
world writes the wall-clock end of the step it checkpoints into the checkpoint's manifest
(``lastStepAt``); the new world's ranks read it when they restore and, after their first step,
know the gap. A survivor that moves to the new world in its own process (``session/carry.py``)
knows its own last step's end. Rank 0 records it in the step
log (``resizeDowntimeSeconds``, ``stateFrom``) and reports it with its progress, which the
agent exports as ``elastra_worker_resize_downtime_seconds`` and the operator copies into the
job's ``status.resizes``.

Wall clocks of two nodes are compared (the old world's rank 0 and the new one's): the figure
is as good as the nodes' clock synchronisation (NTP keeps it to milliseconds on managed
clusters). Where the state came from is said in ``stateFrom``: ``memory`` (a survivor kept it),
``peers`` (a joiner took it from a survivor) or ``storage`` (the committed checkpoint).

The same clock gives the job's goodput: the fraction of wall time since the job's first step
that went into steps the job kept. Within a world, the time between two consecutive step ends
is training (a periodic save's blocking part included); everything else is not: a resize's or a
restart's gap (the first step of each world included, as in its downtime), and the steps a
failed world trained past its last checkpoint, since the next world restores the trained time
recorded with that checkpoint (``trainedSeconds``, with the job's ``firstStepAt``). Queueing and
the first start before the job's first step are not counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

LAST_STEP_AT = "lastStepAt"
"""Manifest ``extra`` key: the wall-clock time (Unix seconds) the checkpointed step ended."""
FIRST_STEP_AT = "firstStepAt"
"""Manifest ``extra`` key: the wall-clock end of the job's first step (Unix seconds)."""
TRAINED_SECONDS = "trainedSeconds"
"""Manifest ``extra`` key: the training time (see the module docstring) up to the checkpointed
step."""
GOODPUT = "goodput"
"""Step-log and progress key: the job's goodput (a fraction) at that step."""
FROM_STORAGE = "storage"
"""State read back from the committed checkpoint (the volume or object storage)."""
FROM_PEERS = "peers"
"""State received from a member of the new world that held it in memory."""
FROM_MEMORY = "memory"
"""State kept in memory by a trainer that moved to the new world in its own process."""


@dataclass(frozen=True)
class Resumption:
    """One resize as the resuming world saw it."""

    from_version: int
    to_version: int
    downtime_s: float
    state_from: str = FROM_STORAGE

    def to_record(self) -> dict[str, Any]:
        """The fields of the first step's record and of the progress report."""
        return {
            "resizeDowntimeSeconds": round(self.downtime_s, 3),
            "resizeFromVersion": self.from_version,
            "stateFrom": self.state_from,
        }


@dataclass
class ResizeClock:
    """The step-end times a resize's downtime and the job's goodput are measured from (see the
    module docstring)."""

    world_version: int
    last_step_at: float | None = None
    """Wall-clock end of this world's newest step."""
    restored_from: tuple[int, float] | None = None
    """(world version, its last step's end) of state restored from another world."""
    resumption: Resumption | None = None
    """Set by this world's first step after such a restore."""
    first_step_at: float | None = None
    """Wall-clock end of the job's first step (restored, or this world's)."""
    trained_s: float = 0.0
    """The job's training time up to this world's newest step (the goodput's numerator)."""
    state_from: str = FROM_STORAGE
    """Where this world's state came from (``FROM_*``)."""

    def restored(
        self, manifest_version: int, extra: Mapping[str, Any], *, state_from: str = FROM_STORAGE
    ) -> None:
        """State was loaded from a checkpoint written by world ``manifest_version`` (or, with
        ``state_from=FROM_PEERS``, received from a peer that held that checkpoint's step)."""
        ended = extra.get(LAST_STEP_AT)
        self.state_from = state_from
        if manifest_version != self.world_version and isinstance(ended, int | float):
            self.restored_from = (manifest_version, float(ended))
        first, trained = extra.get(FIRST_STEP_AT), extra.get(TRAINED_SECONDS)
        if isinstance(first, int | float) and isinstance(trained, int | float) and trained >= 0:
            self.first_step_at, self.trained_s = float(first), float(trained)

    def moved(self, to_version: int) -> None:
        """This trainer moved to world ``to_version`` keeping its state in memory: the new
        world's first step is measured from this world's last one."""
        if self.last_step_at is not None:
            self.restored_from = (self.world_version, self.last_step_at)
        self.world_version, self.state_from = to_version, FROM_MEMORY
        self.last_step_at, self.resumption = None, None

    def stepped(self, now: float) -> dict[str, Any]:
        """A step ended at ``now`` (wall clock): the fields its record gains: the job's goodput
        once known and, on the first step after a restore from another world, the downtime."""
        first = self.last_step_at is None
        if self.last_step_at is not None:
            self.trained_s += max(0.0, now - self.last_step_at)
        if self.first_step_at is None:
            self.first_step_at = now
        self.last_step_at = now
        if first and self.restored_from is not None:
            version, ended = self.restored_from
            downtime = max(0.0, now - ended)
            self.resumption = Resumption(version, self.world_version, downtime, self.state_from)
            return {**self._goodput_field(), **self.resumption.to_record()}
        return self._goodput_field()

    def manifest_extra(self) -> dict[str, Any]:
        """What a checkpoint of this world's newest step records for the next world."""
        if self.last_step_at is None:
            return {}
        return {
            LAST_STEP_AT: self.last_step_at,
            FIRST_STEP_AT: self.first_step_at,
            TRAINED_SECONDS: round(self.trained_s, 3),
        }

    def goodput(self) -> float | None:
        """Training time over wall time from the job's first step to this world's newest step
        end (``None`` until that span is positive)."""
        if self.first_step_at is None or self.last_step_at is None:
            return None
        elapsed = self.last_step_at - self.first_step_at
        return min(1.0, self.trained_s / elapsed) if elapsed > 0 else None

    def _goodput_field(self) -> dict[str, Any]:
        goodput = self.goodput()
        return {} if goodput is None else {GOODPUT: round(goodput, 4)}

    def progress(self) -> dict[str, Any]:
        """The progress report's fields: the job's goodput once known, and the last resize this
        world resumed from, if any."""
        fields = self._goodput_field()
        return fields if self.resumption is None else {**fields, **self.resumption.to_record()}
