"""How long a resize stopped training, measured by the world that resumes.

A resize's cost to the user is the time no step ends: from the end of the step the new world
resumes from (for a planned resize, the old world's last step) to the end of the new world's
first step (which includes that step's own compute, so a resize that costs nothing still shows
one step time; after a failure, the steps lost since the last checkpoint count too). The old
world writes the wall-clock end of the step it checkpoints into the checkpoint's manifest
(``lastStepAt``); the new world's ranks read it when they restore and, after their first step,
know the gap. Rank 0 records it in the step
log (``resizeDowntimeSeconds``, ``stateFrom``) and reports it with its progress, which the
agent exports as ``elastra_worker_resize_downtime_seconds`` and the operator copies into the
job's ``status.resizes``.

Wall clocks of two nodes are compared (the old world's rank 0 and the new one's): the figure
is as good as the nodes' clock synchronisation (NTP keeps it to milliseconds on managed
clusters). State comes from storage today (the committed checkpoint), said in ``stateFrom``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

LAST_STEP_AT = "lastStepAt"
"""Manifest ``extra`` key: the wall-clock time (Unix seconds) the checkpointed step ended."""
FROM_STORAGE = "storage"
"""State read back from the committed checkpoint (the volume or object storage)."""


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
    """The step-end times a resize's downtime is measured between (see the module docstring)."""

    world_version: int
    last_step_at: float | None = None
    """Wall-clock end of this world's newest step."""
    restored_from: tuple[int, float] | None = None
    """(world version, its last step's end) of state restored from another world."""
    resumption: Resumption | None = None
    """Set by this world's first step after such a restore."""

    def restored(self, manifest_version: int, extra: Mapping[str, Any]) -> None:
        """State was loaded from a checkpoint written by world ``manifest_version``."""
        ended = extra.get(LAST_STEP_AT)
        if manifest_version != self.world_version and isinstance(ended, int | float):
            self.restored_from = (manifest_version, float(ended))

    def stepped(self, now: float) -> dict[str, Any]:
        """A step ended at ``now`` (wall clock): the fields its record gains (the first step
        after a restore from another world: the downtime), else none."""
        first = self.last_step_at is None
        self.last_step_at = now
        if not first or self.restored_from is None:
            return {}
        version, ended = self.restored_from
        self.resumption = Resumption(version, self.world_version, max(0.0, now - ended))
        return self.resumption.to_record()

    def manifest_extra(self) -> dict[str, Any]:
        """What a checkpoint of this world's newest step records for the next world."""
        return {} if self.last_step_at is None else {LAST_STEP_AT: self.last_step_at}

    def progress(self) -> dict[str, Any]:
        """The progress report's fields: the last resize this world resumed from, if any."""
        return {} if self.resumption is None else self.resumption.to_record()
