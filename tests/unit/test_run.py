"""``elastra run``'s flags as worker pods see them: ``--toleration`` in the pod-spec form."""

from __future__ import annotations

from pathlib import Path

import pytest

from elastra.commands.run import MIN_KEY_BYTES, parse_toleration, read_assignment_key
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


def test_an_assignment_key_file_is_read_as_it_is(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_bytes(b"\x00binary key, not stripped\n")
    assert read_assignment_key(str(key)) == b"\x00binary key, not stripped\n"
    assert read_assignment_key(None) == b""  # no flag: the operator makes a key of its run


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, "cannot read it: No such file or directory"),
        (b"", f"holds 0 bytes; a key needs at least {MIN_KEY_BYTES}"),
        (b"short", f"holds 5 bytes; a key needs at least {MIN_KEY_BYTES}"),
    ],
)
def test_a_bad_assignment_key_file_names_the_flag_and_what_is_wrong(
    tmp_path: Path, content: bytes | None, said: str
) -> None:
    key = tmp_path / "key"
    if content is not None:
        key.write_bytes(content)
    with pytest.raises(UserError) as err:
        read_assignment_key(str(key))
    assert str(err.value).startswith(f"--assignment-key-file {key}: {said}")
