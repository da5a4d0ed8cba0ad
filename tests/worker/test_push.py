"""Pushed assignments: the signature the operator computes too, how a push is answered, and
which assignment the agent acts on when the push and the file disagree."""

from __future__ import annotations

import base64
import json
import logging
import random
import sys
import threading
from typing import Any
from unittest.mock import ANY

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from elastra_worker.assignment import MAX_FILE_BYTES, parse_assignment
from elastra_worker.push import (
    PUBLIC_KEY_ENV,
    SIGNATURE_HEADER,
    PushedAssignments,
    public_key_text,
    sign,
    signed_message,
)

from .test_assignment import wire

POD_UID = "5f0c9a1e-2b7d-4c33-9e61-0a8f4d2c7b10"
KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
"""The operator's private key in these tests; the pod holds ``PUBLIC``."""
PUBLIC = public_key_text(KEY)
OTHER_KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(1, 33)))


def body(version: int, **changes: Any) -> bytes:
    """A push's body: a valid assignment of world ``version``, as the annotation holds it."""
    return json.dumps(wire(worldVersion=version, **changes)).encode()


def pushes(public_key: str | None = PUBLIC) -> PushedAssignments:
    """The agent's side, with ``public_key`` as its environment gives it (None: not set)."""
    return PushedAssignments(public_key, POD_UID)


def push(p: PushedAssignments, payload: bytes) -> tuple[int, str]:
    """``payload`` pushed as the operator does: signed for ``POD_UID`` with ``KEY``."""
    return p.accept(payload, sign(KEY, POD_UID, payload))


def test_the_signature_is_ed25519_of_the_pod_uid_a_newline_and_the_body() -> None:
    payload = b'{"worldVersion":1}'
    assert signed_message(POD_UID, payload) == POD_UID.encode() + b"\n" + payload
    header = sign(KEY, POD_UID, payload)
    assert header.startswith("ed25519=")
    KEY.public_key().verify(base64.b64decode(header[8:]), signed_message(POD_UID, payload))
    # Fixed vectors, computed once (Ed25519 is deterministic): another implementation of
    # either side must give and take the same values.
    assert PUBLIC == "A6EHv/POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg="
    assert header == (
        "ed25519=+RtY+kxmdCq13S3vMupsSeLQbtWVFQr3DiWNqp80bVmE7ImqsSagdLUBTHWCmt0CDK9HmuvxPIMcCbo0cD+QCA=="
    )


ANSWERS = [
    pytest.param(None, (KEY, POD_UID), body(4),
                 (503, f"no {PUBLIC_KEY_ENV} in the environment: pushes not taken"),
                 id="no-public-key"),
    pytest.param("not base64!", (KEY, POD_UID), body(4),
                 (503, f"{PUBLIC_KEY_ENV} is not base64"), id="public-key-not-base64"),
    pytest.param(base64.b64encode(b"k" * 16).decode(), (KEY, POD_UID), body(4),
                 (503, f"{PUBLIC_KEY_ENV} holds 16 bytes, an Ed25519 key 32"),
                 id="public-key-too-short"),
    pytest.param(PUBLIC, None, body(4), (403, f"no {SIGNATURE_HEADER} header"), id="unsigned"),
    pytest.param(PUBLIC, (OTHER_KEY, POD_UID), body(4), (403, "wrong "), id="other-key"),
    pytest.param(PUBLIC, (KEY, "another-pods-uid"), body(4), (403, "wrong "),
                 id="other-pods-uid"),
    pytest.param(PUBLIC, "ed25519=" + sign(KEY, POD_UID, body(5))[8:], body(4), (403, "wrong "),
                 id="signature-of-another-body"),
    pytest.param(PUBLIC, "ed25519=not base64!", body(4), (403, "wrong "),
                 id="signature-not-base64"),
    pytest.param(PUBLIC, "ed25519=\u00e9t\u00e9", body(4), (403, "wrong "),
                 id="signature-not-ascii"),
    pytest.param(PUBLIC, "sha256=" + "0" * 64, body(4), (403, "wrong "), id="hmac-header"),
    pytest.param(PUBLIC, (KEY, POD_UID), b"{not json", (400, "assignment is not valid JSON: "),
                 id="malformed-json"),
    pytest.param(PUBLIC, (KEY, POD_UID), body(4, worldSize="two"),
                 (400, "worldSize: expected an integer, got 'two'"), id="invalid-field"),
    pytest.param(PUBLIC, (KEY, POD_UID), b"\xff{}", (400, "assignment is not UTF-8"),
                 id="not-utf8"),
    pytest.param(PUBLIC, (KEY, POD_UID), b" " * (MAX_FILE_BYTES + 1),
                 (413, f"assignment larger than {MAX_FILE_BYTES} bytes"), id="too-large"),
    pytest.param(PUBLIC, (KEY, POD_UID), body(4), (200, "taken"), id="valid"),
]  # fmt: skip
"""The pod's public key (None: not set), who the push is signed as (a key and a pod uid; a
header's literal value; None: unsigned), its body, and the answer's status and the start of
its message."""


@pytest.mark.parametrize(("public_key", "signed_as", "payload", "answer"), ANSWERS)
def test_a_push_is_taken_only_signed_by_the_operator_for_this_pod_and_valid(
    public_key: str | None,
    signed_as: tuple[Ed25519PrivateKey, str] | str | None,
    payload: bytes,
    answer: tuple[int, str],
) -> None:
    p = pushes(public_key)
    header = sign(*signed_as, payload) if isinstance(signed_as, tuple) else signed_as
    code, message = p.accept(payload, header)
    assert (code, message[: len(answer[1])]) == answer, message
    assert "\n" not in message, "the answer is one line"
    expected = parse_assignment(payload.decode()) if code == 200 else None
    assert p.newest(None) == expected, "only a taken push is ever acted on"


def test_without_the_cryptography_package_pushes_are_refused_and_the_file_rules(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker image built without it still runs: it takes assignments from its file."""
    monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives.asymmetric.ed25519", None)
    p = pushes()
    assert push(p, body(4)) == (
        503, "the cryptography package is not installed: pushes not taken"
    )  # fmt: skip
    from_file = parse_assignment(wire(worldVersion=3))
    assert p.newest(from_file) == from_file


@pytest.mark.parametrize("second", [3, 4], ids=["older", "equal"])
def test_a_push_not_newer_than_the_last_taken_is_not_taken(second: int) -> None:
    """Pushes may arrive out of order (retries, two operator passes): the newest one stays."""
    p = pushes()
    assert push(p, body(4, seed=1)) == (200, "taken")
    assert push(p, body(second, seed=2)) == (200, "not newer")
    assert p.newest(None) == parse_assignment(body(4, seed=1).decode())
    assert push(p, body(5)) == (200, "taken")
    kept = p.newest(None)
    assert kept is not None and kept.world_version == 5


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
    file_version: int | None, pushed_version: int | None, acted_on: str | None
) -> None:
    p = pushes()
    from_file = None if file_version is None else parse_assignment(wire(worldVersion=file_version))
    pushed = None
    if pushed_version is not None:
        payload = body(pushed_version, seed=99)  # told apart from the file's at the same version
        assert push(p, payload) == (200, "taken")
        pushed = parse_assignment(payload.decode())
    assert p.newest(from_file) == {"file": from_file, "pushed": pushed, None: None}[acted_on]


def test_refusals_are_logged_once_per_status_and_a_push_ahead_once_per_version(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A misconfigured pod refuses every resize's push: one warning says so, not one each."""
    p = pushes()
    caplog.set_level(logging.INFO, logger="elastra_worker.push")
    for _ in range(3):
        assert p.accept(body(4), None)[0] == 403
        assert p.accept(b"{", sign(KEY, POD_UID, b"{"))[0] == 400
    assert push(p, body(4)) == (200, "taken")
    for _ in range(3):
        p.newest(parse_assignment(wire(worldVersion=3)))
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert lines[:2] == [(logging.WARNING, ANY), (logging.WARNING, ANY)]
    assert lines[2:] == [
        (logging.INFO, "assignment of world version 4 pushed by the operator"),  # taken
        (logging.INFO, "assignment of world version 4 pushed by the operator, ahead of the file"),
    ]


def test_concurrent_pushes_keep_the_newest() -> None:
    """Pushes arrive on the HTTP server's threads, in any order."""
    p = pushes()
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
