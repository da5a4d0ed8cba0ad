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

PEERS_LOST = 69
"""A trainer's code only (``EX_UNAVAILABLE``): it ended on an error raised inside
``torch.distributed``, a collective that failed because a member of its world is gone (its pod
killed, its node lost). The agent then waits longer for the operator's world of survivors
(``AgentConfig.peers_lost_wait_s``) before the pod exits ``RETRYABLE``: the operator needs
the node's Lease to be overdue, or the node controller's grace period, to drop a lost node's
pods, and a survivor that gave up first would be replaced as a failed pod."""
