"""The key pair that signs the assignments the operator pushes to its jobs' agents.

A pod learns its assignment from a downward-API file that mirrors its annotation. The kubelet
sometimes remounts that volume with the old content after a patch and writes the new one only
at the pod's next periodic sync (10 s to 90 s later, by its ``syncFrequency``), so the
operator also pushes each new assignment to the pod's agent over HTTP (``engine.push``). The
agent must take a push only from the operator: each one is signed with the operator's Ed25519
private key, and the pods carry the public key in their spec (``elastra_worker.push``).

A key pair, not a shared key: a public key may sit in the pod spec, where anyone who may read
pods sees it, so no job needs a Secret (an earlier design derived an HMAC key per job and
kept it in a Secret the job owned: one more API request per job and an operator that could
create Secrets in every namespace it serves). The private key is derived from the seed in
``--assignment-key-file`` (the chart's random Secret), so a restarted operator signs with the
same key and the pods of running jobs still take its pushes.
"""

from __future__ import annotations

import hashlib

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

_DOMAIN = b"elastra assignment signing key\n"
"""Prefixed to the seed before hashing, so the seed's bytes serve as nothing else's key."""


def signing_key(seed: bytes) -> Ed25519PrivateKey:
    """The private key of ``seed`` (``--assignment-key-file``'s bytes): the same seed, the
    same key pair, across restarts and replicas; a fresh random key without one."""
    if not seed:
        return Ed25519PrivateKey.generate()
    return Ed25519PrivateKey.from_private_bytes(hashlib.sha256(_DOMAIN + seed).digest())
