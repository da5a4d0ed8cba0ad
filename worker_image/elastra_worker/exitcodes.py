"""Exit codes of ``elastra-worker`` and of trainers started by it: a contract with the operator.

The operator reads a worker container's exit code to decide what to do with the pod. Codes follow
the BSD ``sysexits`` convention where one fits, so they read the same in ``kubectl describe``.
"""

from __future__ import annotations

OK = 0
"""Training finished, or the pod was asked to stop (``stop: true``) and has checkpointed."""

CONFIG = 2
"""Permanent: the assignment or the command line is malformed. Retrying will not help."""

RETRYABLE = 75
"""Retryable (``EX_TEMPFAIL``): the trainer crashed, the world broke, or a rendezvous timed out.
The operator should drop this pod from the current world and give it a rank in a new world
version; the new world resumes from the last good checkpoint."""
