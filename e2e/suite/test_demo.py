"""The demo's own figures, judged without a cluster (the demo itself is `make demo`)."""

from __future__ import annotations

import pytest
from e2e.demo import _after_scale
from e2e.trainlog import StepRecord


@pytest.mark.parametrize(
    ("ended_at", "scaled_at", "expected"),
    [
        (104.25, [100.0], "4.2s"),
        (130.0, [100.0, 120.0], "10.0s"),  # the latest scale before the step counts
        (110.0, [100.0, 120.0], "10.0s"),  # a later scale is not this world's
        (90.0, [100.0], "?"),  # no scale before it: not a resize the demo asked for
        (None, [100.0], "?"),  # a step log without endedAt
    ],
)
def test_seconds_from_kubectl_scale_to_a_worlds_first_step(
    ended_at: float | None, scaled_at: list[float], expected: str
) -> None:
    first = StepRecord(step=5, world_version=2, world_size=2, samples=(), ended_at=ended_at)
    assert _after_scale(first, scaled_at) == expected
