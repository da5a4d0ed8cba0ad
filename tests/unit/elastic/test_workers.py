"""WorkerState's groups: which states run, are kept, and hold GPUs, named once."""

from __future__ import annotations

import pytest

from elastra.elastic.workers import WorkerState

S = WorkerState


GROUPS = [
    (S.GATED, False, True, True),  # not scheduled, but the job keeps it
    (S.PENDING, True, True, True),
    (S.READY, True, True, True),
    (S.TERMINATING, False, False, True),  # its GPUs are busy until it is gone
    (S.SUCCEEDED, False, False, False),
    (S.FAILED, False, False, False),
    (S.LOST, False, False, False),
]


@pytest.mark.parametrize(("state", "started", "alive", "holds_gpus"), GROUPS)
def test_state_groups(state: WorkerState, started: bool, alive: bool, holds_gpus: bool) -> None:
    assert (state.started, state.alive, state.holds_gpus) == (started, alive, holds_gpus)


def test_every_state_is_in_the_table() -> None:
    """A new state must be placed in the groups on purpose."""
    assert {row[0] for row in GROUPS} == set(WorkerState)
