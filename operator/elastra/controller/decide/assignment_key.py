"""The key that signs assignments the operator pushes to a job's agents, and where pods find it.

A pod learns its assignment from a downward-API file that mirrors its annotation. The kubelet
sometimes remounts that volume with the old content after a patch and writes the new one only
at the pod's next periodic sync (10 s to 90 s later, by its ``syncFrequency``), so the
operator also pushes each new assignment to the pod's agent over HTTP (``engine.push``). The
agent must take a push only from the operator: each one is signed with a key that only the
operator and the job's pods know.

One key per job, derived from a key of the operator (``--assignment-key-file``) and the job's
namespace, name and uid, so the operator never stores or reads a per-job key: it creates the
job's Secret once (owned by the job, deleted with it) and derives the key again after a
restart. The operator may therefore create Secrets in its jobs' namespaces but never read one.
The pods see the Secret through their ``assignment`` volume as ``KEY_FILE``, next to the
assignment file; the source is optional, so a pod whose Secret is missing still runs, from the
file alone.

The wire format (path, header, signature, the key's file name) is ``elastra_worker.push``'s,
like the assignment's own format is ``elastra_worker.assignment``'s.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from elastra_worker.push import KEY_FILE


def secret_name(job: str) -> str:
    """The job's key Secret: one per job, named after it."""
    return f"{job}-{KEY_FILE}"


def job_key(operator_key: bytes, namespace: str, name: str, uid: str) -> bytes:
    """The job's key: a job created again under the same name (a new uid) gets a new one."""
    return hmac.new(operator_key, f"{namespace}/{name}/{uid}".encode(), hashlib.sha256).digest()


def key_source(job: str) -> dict[str, Any]:
    """The Secret as a source of the pods' projected ``assignment`` volume; optional, so a pod
    whose Secret does not exist (yet) starts and works from the file."""
    return {
        "secret": {
            "name": secret_name(job),
            "items": [{"key": KEY_FILE, "path": KEY_FILE}],
            "optional": True,
        }
    }
