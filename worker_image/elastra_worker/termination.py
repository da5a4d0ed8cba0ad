"""The one line a worker that fails for good leaves for the operator: its termination message.

When a container ends, the kubelet reads the file at its ``terminationMessagePath``
(``/dev/termination-log`` unless the pod names another; a file the kubelet mounts, writable by
any user even on a read-only root) into the pod's status, ``state.terminated.message``, where
the operator reads it and puts it in the job's condition. So a worker that exits with the
permanent code (``exitcodes.CONFIG``) writes why first, and the job says "worker gpt-w0 exited
with permanent code 2: worker.gpus is 8 but ...", not the code alone.

Outside a container (the local launcher, tests) there is no such file and none is created: the
line goes to stderr only. No torch here: the agent uses it too.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import NoReturn

from .exitcodes import CONFIG

TERMINATION_LOG_ENV = "ELASTRA_TERMINATION_LOG"
"""Where the message goes when not the Kubernetes default (tests point it at a file)."""
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
MAX_MESSAGE = 1024
"""Characters kept of a reason: one line of a condition (the kubelet keeps at most 4096 bytes)."""


def one_line(reason: str) -> str:
    """``reason`` on one line (whitespace runs, newlines included, become one space), bounded."""
    line = " ".join(reason.split())
    return line if len(line) <= MAX_MESSAGE else line[: MAX_MESSAGE - 3] + "..."


def report_permanent(reason: str, environ: Mapping[str, str] = os.environ) -> str:
    """Print the reason to stderr and write it as the container's termination message.

    The message file is written only where it exists (the kubelet creates it); a write that
    fails is ignored, stderr still has the line. Returns the line written.
    """
    line = one_line(reason)
    print(line, file=sys.stderr, flush=True)
    path = Path(environ.get(TERMINATION_LOG_ENV) or DEFAULT_TERMINATION_LOG)
    if path.is_file():
        with contextlib.suppress(OSError):
            path.write_text(line + "\n", encoding="utf-8")
    return line


def exit_permanent(reason: str, environ: Mapping[str, str] = os.environ) -> NoReturn:
    """``report_permanent``, then exit with the permanent code: for entry points."""
    report_permanent(reason, environ)
    raise SystemExit(CONFIG)
