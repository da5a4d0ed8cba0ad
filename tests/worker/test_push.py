"""Pushed assignments: the signature the operator computes too, how a push is answered, and
which assignment the agent acts on when the push and the file disagree."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import random
import threading
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import pytest

from elastra_worker.assignment import MAX_FILE_BYTES, parse_assignment
from elastra_worker.push import KEY_FILE, SIGNATURE_HEADER, PushedAssignments, signature

from .test_assignment import wire

POD = "gpt-w-0"
KEY = b"\x00\xffa key that ends in a newline\n"
"""Raw bytes, as the operator's Secret holds them: a stripped or decoded key signs otherwise."""


def body(version: int, **changes: Any) -> bytes:
    """A push's body: a valid assignment of world ``version``, as the annotation holds it."""
    return json.dumps(wire(worldVersion=version, **changes)).encode()


def pushes(tmp_path: Path, key: bytes | None = KEY) -> PushedAssignments:
    """The agent's side, with the key file written next to the assignment (or not at all)."""
    if key is not None:
        (tmp_path / KEY_FILE).write_bytes(key)
    return PushedAssignments(tmp_path / KEY_FILE, POD)


def push(p: PushedAssignments, payload: bytes) -> tuple[int, str]:
    """``payload`` pushed as the operator does: signed for ``POD`` with ``KEY``."""
    return p.accept(payload, signature(KEY, POD, payload))


def test_the_signature_is_hmac_sha256_of_the_pod_name_a_newline_and_the_body() -> None:
    payload = b'{"worldVersion":1}'
    mac = hmac.new(b"elastra-test-key", b"gpt-w-0\n" + payload, hashlib.sha256).hexdigest()
    assert signature(b"elastra-test-key", "gpt-w-0", payload) == "sha256=" + mac
    # A fixed vector, computed once: the operator's side must give the same header.
    assert mac == "dfaf52979ebd71e5c583ba3a6599db5baa604a824f6229ca23b2f2a1b9ea5d4f"


ANSWERS = [
    pytest.param(None, (KEY, POD), body(4), (503, "no assignment key in "), id="no-key-file"),
    pytest.param(b"", (b"", POD), body(4), (503, "no assignment key in "), id="empty-key"),
    pytest.param(KEY, None, body(4), (403, f"no {SIGNATURE_HEADER} header"), id="unsigned"),
    pytest.param(KEY, (b"other", POD), body(4), (403, "wrong "), id="wrong-key"),
    pytest.param(KEY, (KEY.strip(), POD), body(4), (403, "wrong "), id="stripped-key"),
    pytest.param(KEY, (KEY, "gpt-w-1"), body(4), (403, "wrong "), id="other-pods-name"),
    pytest.param(KEY, (KEY, POD), b"{not json", (400, "assignment is not valid JSON: "),
                 id="malformed-json"),
    pytest.param(KEY, (KEY, POD), body(4, worldSize="two"),
                 (400, "worldSize: expected an integer, got 'two'"), id="invalid-field"),
    pytest.param(KEY, (KEY, POD), b"\xff{}", (400, "assignment is not UTF-8"), id="not-utf8"),
    pytest.param(KEY, (KEY, POD), b" " * (MAX_FILE_BYTES + 1),
                 (413, f"assignment larger than {MAX_FILE_BYTES} bytes"), id="too-large"),
    pytest.param(KEY, (KEY, POD), body(4), (200, "taken"), id="valid"),
]  # fmt: skip
"""Key file bytes (None: no file), who the push is signed as (None: unsigned), its body, and
the answer's status and the start of its message."""


@pytest.mark.parametrize(("key", "signed_as", "payload", "answer"), ANSWERS)
def test_a_push_is_taken_only_signed_for_this_pod_and_valid(
    tmp_path: Path,
    key: bytes | None,
    signed_as: tuple[bytes, str] | None,
    payload: bytes,
    answer: tuple[int, str],
) -> None:
    p = pushes(tmp_path, key)
    header = None if signed_as is None else signature(*signed_as, payload)
    code, message = p.accept(payload, header)
    assert (code, message[: len(answer[1])]) == answer, message
    assert "\n" not in message, "the answer is one line"
    expected = parse_assignment(payload.decode()) if code == 200 else None
    assert p.newest(None) == expected, "only a taken push is ever acted on"


@pytest.mark.parametrize("second", [3, 4], ids=["older", "equal"])
def test_a_push_not_newer_than_the_last_taken_is_not_taken(tmp_path: Path, second: int) -> None:
    """Pushes may arrive out of order (retries, two operator passes): the newest one stays."""
    p = pushes(tmp_path)
    assert push(p, body(4, seed=1)) == (200, "taken")
    assert push(p, body(second, seed=2)) == (200, "not newer")
    assert p.newest(None) == parse_assignment(body(4, seed=1).decode())
    assert push(p, body(5)) == (200, "taken")
    kept = p.newest(None)
    assert kept is not None and kept.world_version == 5


def test_a_key_file_that_appears_after_the_start_is_used(tmp_path: Path) -> None:
    """The Secret is an optional source: the kubelet may add the key after the pod started."""
    p = pushes(tmp_path, key=None)
    assert push(p, body(4))[0] == 503
    (tmp_path / KEY_FILE).write_bytes(KEY)
    assert push(p, body(4)) == (200, "taken")


@pytest.mark.parametrize(
    ("file_version", "pushed_version", "acted_on"),
    [
        (None, None, None),
        (3, None, "file"),
        (3, 4, "pushed"),
        (4, 4, "file"),  # the operator may change an assignment within a version: the file has it
        (5, 4, "file"),
        (None, 4, "pushed"),
    ],
)
def test_the_agent_acts_on_a_push_only_while_it_is_ahead_of_the_file(
    tmp_path: Path, file_version: int | None, pushed_version: int | None, acted_on: str | None
) -> None:
    p = pushes(tmp_path)
    from_file = None if file_version is None else parse_assignment(wire(worldVersion=file_version))
    pushed = None
    if pushed_version is not None:
        payload = body(pushed_version, seed=99)  # told apart from the file's at the same version
        assert push(p, payload) == (200, "taken")
        pushed = parse_assignment(payload.decode())
    assert p.newest(from_file) == {"file": from_file, "pushed": pushed, None: None}[acted_on]


def test_refusals_are_logged_once_per_status_and_a_push_ahead_once_per_version(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A misconfigured pod refuses every resize's push: one warning says so, not one each."""
    p = pushes(tmp_path)
    caplog.set_level(logging.INFO, logger="elastra_worker.push")
    for _ in range(3):
        assert p.accept(body(4), None)[0] == 403
        assert p.accept(b"{", signature(KEY, POD, b"{"))[0] == 400
    assert push(p, body(4)) == (200, "taken")
    for _ in range(3):
        p.newest(parse_assignment(wire(worldVersion=3)))
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert lines[:2] == [(logging.WARNING, ANY), (logging.WARNING, ANY)]
    assert lines[2:] == [
        (logging.INFO, "assignment of world version 4 pushed by the operator"),  # taken
        (logging.INFO, "assignment of world version 4 pushed by the operator, ahead of the file"),
    ]


def test_concurrent_pushes_keep_the_newest(tmp_path: Path) -> None:
    """Pushes arrive on the HTTP server's threads, in any order."""
    p = pushes(tmp_path)
    versions = list(range(1, 81))
    random.Random(0).shuffle(versions)
    payloads = [body(v) for v in versions]
    threads = [
        threading.Thread(target=lambda part=part: [push(p, b) for b in part])
        for part in (payloads[i::4] for i in range(4))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    newest = p.newest(None)
    assert newest is not None and newest.world_version == 80
