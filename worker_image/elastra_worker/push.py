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

Only the operator may push: each push is signed with HMAC-SHA256 under a per-job key that the
operator projects next to the assignment file (``KEY_FILE``, from the job's Secret). The pod's
name is part of what is signed, so a push captured on its way to one pod is refused by any
other. The key source is optional (a pod without it works from the file alone) and may appear
after the pod starts, so the key is read at every push, never cached.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
from http import HTTPStatus
from pathlib import Path

from .assignment import MAX_FILE_BYTES, Assignment, AssignmentError, parse_assignment

log = logging.getLogger(__name__)

PUSH_PATH = "/assignment"
"""Where the operator POSTs an assignment, on the agent's metrics port (a contract)."""
SIGNATURE_HEADER = "X-Elastra-Signature"
"""The request header holding ``signature(key, pod, body)`` (a contract)."""
KEY_FILE = "assignment-key"
"""The key file's name, in the assignment file's directory (a contract): its raw bytes."""
TAKEN = "taken"
"""The answer's message (status 200) when a push is newer than every push before it."""
NOT_NEWER = "not newer"
"""The answer's message (status 200) when it is not: the newer one is kept."""
POD_NAME_ENV = "POD_NAME"
"""The pod's name, given to the worker container by the downward API."""
_SIGNATURE_PREFIX = "sha256="


def signature(key: bytes, pod: str, body: bytes) -> str:
    """The ``SIGNATURE_HEADER`` value of a push of ``body`` to ``pod``:
    ``sha256=`` and the hex HMAC-SHA256 of the pod's name, a newline and the body."""
    mac = hmac.new(key, pod.encode() + b"\n" + body, hashlib.sha256)
    return _SIGNATURE_PREFIX + mac.hexdigest()


class PushedAssignments:
    """The newest assignment pushed to this pod, and the rule that merges it with the file.

    Pushes arrive on the HTTP server's threads (``accept``), the agent reads on its own
    (``newest``): a lock guards the state.
    """

    def __init__(self, key_file: Path, pod: str) -> None:
        self.key_file = key_file
        self.pod = pod
        self._lock = threading.Lock()
        self._pushed: Assignment | None = None
        self._refusals_logged: set[int] = set()
        self._ahead_logged: int | None = None

    def accept(self, body: bytes, signed: str | None) -> tuple[int, str]:
        """Take a pushed ``body`` (the assignment JSON exactly as in the annotation) signed with
        ``signed`` (the header's value); return an HTTP status code and a one-line message.

        413: too large; 503: no key to check with (yet); 403: unsigned or wrongly signed; 400:
        not a valid assignment; 200 ``TAKEN`` when newer than every push so far, else 200
        ``NOT_NEWER`` (the newer one is kept: pushes may arrive out of order).
        """
        if len(body) > MAX_FILE_BYTES:
            return self.refuse(413, f"assignment larger than {MAX_FILE_BYTES} bytes")
        key = self._key()
        if key is None:
            return self.refuse(503, f"no assignment key in {self.key_file}: pushes not taken")
        if signed is None:
            return self.refuse(403, f"no {SIGNATURE_HEADER} header")
        expected = signature(key, self.pod, body)
        if not hmac.compare_digest(expected.encode(), signed.encode()):
            return self.refuse(403, f"wrong {SIGNATURE_HEADER} for pod {self.pod}")
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

    def _key(self) -> bytes | None:
        """The key's raw bytes (never stripped: it is binary), or None while there is none.
        An empty key signs nothing: anyone could compute its signatures."""
        try:
            key = self.key_file.read_bytes()
        except OSError:
            return None
        return key or None


def _one_line(message: str) -> str:
    """``message`` on one line (the answer is one line of text)."""
    return " ".join(message.split())
