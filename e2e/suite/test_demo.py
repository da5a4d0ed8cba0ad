"""The demo's own figures, judged without a cluster (the demo itself is `make demo`)."""

from __future__ import annotations

from typing import Any

import pytest
from e2e.demo import _formed_at, _ready_since, _since_scale


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
    assert _since_scale(ended_at, scaled_at) == expected


def test_a_new_pods_ready_time_is_read_from_its_condition() -> None:
    def pod(name: str, *conditions: dict[str, str]) -> dict[str, Any]:
        return {"metadata": {"name": name}, "status": {"conditions": list(conditions)}}

    ready = {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-05T03:10:07Z"}
    pods = [
        pod("job-w0", ready),  # there before the scale
        pod("job-w3", {"type": "PodScheduled", "status": "True"}, ready),
        pod("job-w4", {**ready, "status": "False"}),  # not Ready yet
    ]
    assert _ready_since(pods, {"job-w0"}) == {"job-w3": 1796440207.0}


def test_each_worlds_formation_time_comes_from_status_resizes() -> None:
    status = {
        "resizes": [
            {"toVersion": 1, "time": "2026-12-05T03:10:16Z", "reason": "WorldFormed"},
            {"toVersion": 3, "time": "2026-12-05T03:11:09Z", "reason": "ScaledUp"},
            {"toVersion": 4, "time": "not a time", "reason": "ScaledUp"},
        ]
    }
    assert _formed_at(status) == {1: 1796440216.0, 3: 1796440269.0}
    assert _formed_at({}) == {}
