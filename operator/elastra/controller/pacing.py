"""How often a status that only counts pods is written: at most once per ``STATUS_PACE``.

While a world forms, its pods are bound and start one after another, and each pass that runs
in between sees new counts: the Placed and Running conditions' messages ("5 of 8 bound",
"world forming: 3 of 8 workers running") and ``readyReplicas``. Written every time, that is a
status write per pass for news nobody acts on (on a busy two-core control plane, 0.2 writes
per job more than the two a world needs, measured). Everything else is written at once: a
condition's status or reason, any other condition's message (Kueue's answer, why the job is
Degraded), the phase, the world, the plan, the placement, progress, the clock's fields. A
pass that holds a count back asks for a pass when the pace allows it, so the last count is
written at most ``STATUS_PACE`` late.

Pure: the statuses and the time of the last write in, the wait out.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from elastra.api import ConditionType, TrainingJobStatus

STATUS_PACE = timedelta(seconds=5)
"""The least time between two writes of a job's status that differ only in counts. Short
enough that ``kubectl get`` lags a forming world by a few seconds at most; long enough that a
world forming under load is written at its start and its end, not per pass in between."""
COUNTING = frozenset({ConditionType.PLACED, ConditionType.RUNNING})
"""The conditions whose messages count pods while a world forms."""


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
    if written is None or not counts_only(before, after):
        return None
    left = min(STATUS_PACE - (now - written), STATUS_PACE)
    return left if left > timedelta(0) else None


def counts_only(before: TrainingJobStatus, after: TrainingJobStatus) -> bool:
    """True when the two differ, and only in ``COUNTING`` messages and ``readyReplicas``."""
    return before != after and _without_counts(before) == _without_counts(after)


def _without_counts(status: TrainingJobStatus) -> TrainingJobStatus:
    conditions = [
        c.model_copy(update={"message": ""}) if c.type in COUNTING else c for c in status.conditions
    ]
    return status.model_copy(update={"conditions": conditions, "ready_replicas": 0})
