"""Operator settings as worker pods see them: tolerations in the pod-spec form."""

from __future__ import annotations

import pytest

from elastra.controller.settings import Toleration


@pytest.mark.parametrize(
    ("toleration", "wire"),
    [
        (
            Toleration(key="nvidia.com/gpu"),
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        ),
        (
            Toleration(key="kwok.x-k8s.io/node", value="fake"),
            {
                "key": "kwok.x-k8s.io/node",
                "operator": "Equal",
                "value": "fake",
                "effect": "NoSchedule",
            },
        ),
        (
            Toleration(key="spot", effect="NoExecute"),
            {"key": "spot", "operator": "Exists", "effect": "NoExecute"},
        ),
    ],
)
def test_a_toleration_without_a_value_matches_any_value(
    toleration: Toleration, wire: dict[str, str]
) -> None:
    assert toleration.to_wire() == wire
