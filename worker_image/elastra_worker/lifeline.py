"""Die with the parent: no orphaned trainer keeps a port, a GPU or a half-written file.

An agent that is SIGKILLed cannot stop its trainers, and a local launcher killed by a test's
deadline cannot stop its agents. Linux's ``PR_SET_PDEATHSIG`` makes the kernel deliver SIGKILL
to a child when its parent dies; each process arms it for itself at start-up (arming it in the
parent through ``preexec_fn`` is unsafe in a process that has threads).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PARENT_PID_ENV = "ELASTRA_PARENT_PID"
_PR_SET_PDEATHSIG = 1


def die_with_parent(expected_parent: int | None) -> None:
    """Ask the kernel for SIGKILL when our parent dies; exit now if it is already gone."""
    if expected_parent is None or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        return  # not fatal: only cleanup after a crash depends on it
    if os.getppid() != expected_parent:  # the parent died before we armed it
        os._exit(1)


def arm_from_env(environ: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """``die_with_parent`` for the parent named in ``ELASTRA_PARENT_PID``, if any."""
    raw = environ.get(PARENT_PID_ENV, "")
    die_with_parent(int(raw) if raw.isdigit() else None)
