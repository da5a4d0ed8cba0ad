"""How often a status that only reports a forming world's progress is written: at most once
per ``STATUS_PACE``.

While a world forms, its pods are bound and start one after another, and each pass that runs
in between sees new counts: the Placed and Running conditions' messages ("5 of 8 bound",
"world forming: 3 of 8 workers running") and ``readyReplicas``. Written every time, that is a
status write per pass for news nobody acts on (on a busy two-core control plane, 0.2 writes
per job more than the two a world needs, measured). So are Placed and Running turning True
while the Resizing condition is True in the stored status and stays True: the phase reads
Resizing all along, and the write that ends it (every member Ready) carries both turns;
written at once, a pass that saw every pod bound before all ran cost a third write per world
on a slow machine (2.3 status writes per job measured in such a spell). Everything else is
written at once: Resizing itself, a condition's status or reason outside a forming world, any
other condition, the phase, the world, the plan, the placement, progress, the clock's fields.
A pass that holds a status back asks for a pass when the pace allows it, so the last one is
written at most ``STATUS_PACE`` late.

Pure: the statuses and the time of the last write in, the wait out.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from elastra.api import ConditionType, TrainingJobStatus
from elastra.controller.decide.conditions import is_true

STATUS_PACE = timedelta(seconds=5)
"""The least time between two writes of a job's status that differ only in counts. Short
enough that ``kubectl get`` lags a forming world by a few seconds at most; long enough that a
world forming under load is written at its start and its end, not per pass in between."""
COUNTING = frozenset({ConditionType.PLACED, ConditionType.RUNNING})
"""The conditions whose messages count pods while a world forms, and that turn True on its way
to running."""


def status_wait(
    before: TrainingJobStatus,
    after: TrainingJobStatus,
    *,
    written: datetime | None,
    now: datetime,
) -> timedelta | None:
    """How long ``after`` waits before it is written (``None``: write it now, if it changed).

    ``written`` is when this operator last wrote the job's status (``None``: not since it
    started, so nothing to pace against).
    """
    if written is None or not progress_only(before, after):
        return None
    left = min(STATUS_PACE - (now - written), STATUS_PACE)
    return left if left > timedelta(0) else None


def progress_only(before: TrainingJobStatus, after: TrainingJobStatus) -> bool:
    """True when the two differ, and only in ``readyReplicas`` and ``COUNTING`` messages, or,
    while a world forms in both (Resizing True), in ``COUNTING`` conditions as a whole."""
    whole = is_true(before, ConditionType.RESIZING) and is_true(after, ConditionType.RESIZING)
    return before != after and _without_progress(before, whole) == _without_progress(after, whole)


def _without_progress(status: TrainingJobStatus, whole: bool) -> TrainingJobStatus:
    """``status`` with its counts blanked, and its ``COUNTING`` conditions left out if ``whole``."""
    conditions = [
        c.model_copy(update={"message": ""}) if c.type in COUNTING else c
        for c in status.conditions
        if not (whole and c.type in COUNTING)
    ]
    return status.model_copy(update={"conditions": conditions, "ready_replicas": 0})
