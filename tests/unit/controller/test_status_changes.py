"""controller/decide/status_changes.py: the debug log names the fields each status write changes."""

from __future__ import annotations

from typing import Any

import pytest

from elastra.controller.decide.status_changes import changed_fields


def cond(kind: str, status: str = "True", reason: str = "R", message: str = "") -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": message}


BASE: dict[str, Any] = {
    "phase": "Resizing",
    "readyReplicas": 0,
    "conditions": [cond("Placed", "False", "Binding", "0 of 8 bound"), cond("Resizing")],
}


@pytest.mark.parametrize(
    ("after", "want"),
    [
        pytest.param(BASE, [], id="nothing"),
        pytest.param({**BASE, "phase": "Running", "readyReplicas": 8},
                     ["phase", "readyReplicas"], id="top-level fields, sorted"),
        pytest.param(
            {**BASE, "conditions": [cond("Placed", "False", "Binding", "5 of 8 bound"),
                                    cond("Resizing")]},
            ["conditions.Placed.message"], id="a count in a condition's message",
        ),
        pytest.param(
            {**BASE, "conditions": [cond("Placed", "True", "Placed", "8 of 8 bound"),
                                    cond("Resizing")]},
            ["conditions.Placed.message", "conditions.Placed.reason", "conditions.Placed.status"],
            id="a transition names each field",
        ),
        pytest.param(
            {**BASE, "conditions": [cond("Placed", "False", "Binding", "0 of 8 bound"),
                                    cond("Running")]},
            ["conditions.Resizing", "conditions.Running"], id="a condition that comes or goes",
        ),
        pytest.param({k: v for k, v in BASE.items() if k != "phase"}, ["phase"],
                     id="a field that goes"),
    ],
)  # fmt: skip
def test_changed_fields_name_what_a_write_changes(after: dict[str, Any], want: list[str]) -> None:
    assert changed_fields(BASE, after) == want


def test_a_first_status_names_every_field() -> None:
    assert changed_fields({}, BASE) == [
        "conditions.Placed",
        "conditions.Resizing",
        "phase",
        "readyReplicas",
    ]
