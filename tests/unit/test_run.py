"""``elastra run``'s flags as worker pods see them: ``--toleration`` in the pod-spec form."""

from __future__ import annotations

import pytest

from elastra.commands.run import parse_toleration
from elastra.errors import UserError


@pytest.mark.parametrize(
    ("flag", "wire"),
    [
        ("nvidia.com/gpu", {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}),
        (
            "kwok.x-k8s.io/node=fake",
            {
                "key": "kwok.x-k8s.io/node",
                "operator": "Equal",
                "value": "fake",
                "effect": "NoSchedule",
            },
        ),
        ("spot:NoExecute", {"key": "spot", "operator": "Exists", "effect": "NoExecute"}),
        ("pool=:NoSchedule", {"key": "pool", "operator": "Equal", "effect": "NoSchedule"}),
    ],
)
def test_a_toleration_without_a_value_matches_any_value(flag: str, wire: dict[str, str]) -> None:
    assert parse_toleration(flag).to_wire() == wire


@pytest.mark.parametrize("flag", ["", "=v", "k:Sometimes"])
def test_a_malformed_toleration_names_the_flag_and_the_form(flag: str) -> None:
    with pytest.raises(UserError, match="expected KEY\\[=VALUE\\]\\[:EFFECT\\]"):
        parse_toleration(flag)
