"""Assignments the operator pushes to the agent over HTTP, ahead of the downward-API file.

The assignment file mirrors the pod annotation, but the kubelet sometimes remounts the volume
with the old content right after the annotation changed and writes the new one only at the
pod's next periodic sync: about one change in ten arrived 10-15 s late on ``make demo``'s
cluster (2026-12-07, ``e403250``), which is 60-90 s at the kubelet's default
``syncFrequency``. A resize waits for its slowest pod, so the operator, after patching a pod's
annotation, also POSTs the same JSON to the pod's agent on the metrics port (``PUSH_PATH``,
served by ``metrics.serve``).

The file stays the durable copy: a push only makes a newer world version known sooner. The
agent acts on a pushed assignment only while its world version is ahead of the file's; at the
same version the file wins, since the operator may change an assignment within a version and
the file carries that (a push may be lost, the annotation is not).

Only the operator may push: each push is signed with the operator's Ed25519 private key, and
every pod carries the matching public key in its spec (``PUBLIC_KEY_ENV``): a public key
needs no Secret, so the operator creates none and may read none. What is signed is the pod's
uid (``POD_UID_ENV``, from the downward API), a newline and the body, so a push captured on
its way to one pod is refused by any other, also by a pod created again under the same name.
The ``cryptography`` package verifies; a pod without it, or without the public key, works
from the file alone.
"""

from __future__ import annotations

import base64
import logging
import threading
from http import HTTPStatus
from typing import TYPE_CHECKING

from .assignment import MAX_FILE_BYTES, Assignment, AssignmentError, parse_assignment

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

log = logging.getLogger(__name__)

PUSH_PATH = "/assignment"
"""Where the operator POSTs an assignment, on the agent's metrics port (a contract)."""
SIGNATURE_HEADER = "X-Elastra-Signature"
"""The request header holding ``sign(key, pod_uid, body)`` (a contract)."""
PUBLIC_KEY_ENV = "ELASTRA_ASSIGNMENT_PUBLIC_KEY"
"""The operator's public key, in the worker container's environment (a contract): the 32 raw
bytes of an Ed25519 public key, base64."""
POD_UID_ENV = "POD_UID"
"""The pod's uid, given to the worker container by the downward API (a contract)."""
TAKEN = "taken"
"""The answer's message (status 200) when a push is newer than every push before it."""
NOT_NEWER = "not newer"
"""The answer's message (status 200) when it is not: the newer one is kept."""
POD_NAME_ENV = "POD_NAME"
"""The pod's name, given to the worker container by the downward API."""
_SIGNATURE_PREFIX = "ed25519="


def signed_message(pod_uid: str, body: bytes) -> bytes:
    """What a push's signature covers: the pod's uid, a newline and the body."""
    return pod_uid.encode() + b"\n" + body


def sign(key: Ed25519PrivateKey, pod_uid: str, body: bytes) -> str:
    """The ``SIGNATURE_HEADER`` value of a push of ``body`` to the pod ``pod_uid``:
    ``ed25519=`` and the base64 Ed25519 signature of ``signed_message``."""
    return _SIGNATURE_PREFIX + base64.b64encode(key.sign(signed_message(pod_uid, body))).decode()


def public_key_text(key: Ed25519PrivateKey) -> str:
    """``PUBLIC_KEY_ENV``'s value for the private key ``key``."""
    from cryptography.hazmat.primitives.serialization import (  # noqa: PLC0415 - optional
        Encoding,
        PublicFormat,
    )

    raw = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def load_public_key(text: str) -> Ed25519PublicKey:
    """The public key ``PUBLIC_KEY_ENV`` holds; ValueError, saying what is wrong, for anything
    but 32 bytes in base64; ImportError without the ``cryptography`` package."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (  # noqa: PLC0415
        Ed25519PublicKey,  # optional: a worker without it takes no pushes
    )

    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError as err:  # binascii.Error, or characters outside ASCII
        raise ValueError(f"{PUBLIC_KEY_ENV} is not base64 ({err})") from None
    if len(raw) != 32:
        raise ValueError(f"{PUBLIC_KEY_ENV} holds {len(raw)} bytes, an Ed25519 key 32")
    return Ed25519PublicKey.from_public_bytes(raw)


def _verifies(key: Ed25519PublicKey, pod_uid: str, body: bytes, signed: str) -> bool:
    """Whether ``signed`` (a header's value) is ``key``'s signature of a push of ``body`` to
    ``pod_uid``."""
    from cryptography.exceptions import InvalidSignature  # noqa: PLC0415 - optional

    if not signed.startswith(_SIGNATURE_PREFIX):
        return False
    try:
        key.verify(base64.b64decode(signed[len(_SIGNATURE_PREFIX) :], validate=True),
                   signed_message(pod_uid, body))  # fmt: skip
    except (ValueError, InvalidSignature):  # not base64 (binascii.Error) or not ASCII
        return False
    return True


class PushedAssignments:
    """The newest assignment pushed to this pod, and the rule that merges it with the file.

    Pushes arrive on the HTTP server's threads (``accept``), the agent reads on its own
    (``newest``): a lock guards the state.
    """

    def __init__(self, public_key: str | None, pod_uid: str) -> None:
        """``public_key``: ``PUBLIC_KEY_ENV``'s value (``None``: not set); ``pod_uid``: this
        pod's. A key that cannot be used makes every push a 503, said once, and the file
        alone brings assignments: the pod still works."""
        self.pod_uid = pod_uid
        self._key: Ed25519PublicKey | None = None
        self._no_key = f"no {PUBLIC_KEY_ENV} in the environment"
        if public_key is not None:
            try:
                self._key = load_public_key(public_key)
            except ImportError:
                self._no_key = "the cryptography package is not installed"
            except ValueError as err:
                self._no_key = str(err)
        self._lock = threading.Lock()
        self._pushed: Assignment | None = None
        self._refusals_logged: set[int] = set()
        self._ahead_logged: int | None = None

    def accept(self, body: bytes, signed: str | None) -> tuple[int, str]:
        """Take a pushed ``body`` (the assignment JSON exactly as in the annotation) signed with
        ``signed`` (the header's value); return an HTTP status code and a one-line message.

        413: too large; 503: no public key to check with; 403: unsigned or wrongly signed; 400:
        not a valid assignment; 200 ``TAKEN`` when newer than every push so far, else 200
        ``NOT_NEWER`` (the newer one is kept: pushes may arrive out of order).
        """
        if len(body) > MAX_FILE_BYTES:
            return self.refuse(413, f"assignment larger than {MAX_FILE_BYTES} bytes")
        if self._key is None:
            return self.refuse(503, f"{self._no_key}: pushes not taken")
        if signed is None:
            return self.refuse(403, f"no {SIGNATURE_HEADER} header")
        if not _verifies(self._key, self.pod_uid, body, signed):
            return self.refuse(403, f"wrong {SIGNATURE_HEADER} for pod uid {self.pod_uid}")
        try:
            pushed = parse_assignment(body.decode("utf-8"))
        except UnicodeDecodeError as err:
            return self.refuse(400, f"assignment is not UTF-8 ({err.reason})")
        except AssignmentError as err:
            return self.refuse(400, _one_line(str(err)))
        with self._lock:
            current = self._pushed
            if current is not None and pushed.world_version <= current.world_version:
                return 200, NOT_NEWER
            self._pushed = pushed
        log.info("assignment of world version %d pushed by the operator", pushed.world_version)
        return 200, TAKEN

    def refuse(self, status: int, message: str) -> tuple[int, str]:
        """``(status, message)`` of a refused push, logged at WARNING the first time for each
        status: a misconfigured pod would otherwise log a line per resize."""
        with self._lock:
            first = status not in self._refusals_logged
            self._refusals_logged.add(status)
        if first:
            phrase = HTTPStatus(status).phrase
            log.warning(
                "pushed assignment refused (%d %s): %s (later refusals with this status are "
                "not logged)",
                status,
                phrase,
                message,
            )
        return status, message

    def newest(self, from_file: Assignment | None) -> Assignment | None:
        """What the agent acts on, given what the file says: the pushed assignment while its
        world version is ahead of the file's (or the file says nothing yet), else the file's.
        At the same version the file wins: it carries a change within the version."""
        with self._lock:
            pushed = self._pushed
            if pushed is None or (
                from_file is not None and pushed.world_version <= from_file.world_version
            ):
                return from_file
            first = self._ahead_logged != pushed.world_version
            self._ahead_logged = pushed.world_version
        if first:
            log.info(
                "assignment of world version %d pushed by the operator, ahead of the file",
                pushed.world_version,
            )
        return pushed


def _one_line(message: str) -> str:
    """``message`` on one line (the answer is one line of text)."""
    return " ".join(message.split())
