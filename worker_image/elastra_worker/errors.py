"""A mistake in the job or the training script that no new world can fix.

Library code raises ``PermanentError`` rather than exiting: a library must not end the process
of the script that called it, and a script may catch the error. Where it ends the trainer is
the hook ``install_hook`` sets (a ``Session`` installs it): an uncaught ``PermanentError``
prints its one line, with no traceback (the line says what to change), writes it as the
container's termination message, and ends the process with the permanent exit code. The agent
then exits with that code at once instead of starting world after world, and the operator puts
the line in the job's condition. No torch here.
"""

from __future__ import annotations

import logging
import os
import sys
from types import TracebackType

from .exitcodes import CONFIG
from .termination import report_permanent

HOOK_MARK = "_elastra_permanent"


class PermanentError(Exception):
    """The job or the script is wrong in a way a retry repeats; the message says how."""


def install_hook() -> None:
    """Make an uncaught ``PermanentError`` end the process as a permanent failure; every
    other exception keeps the hook it had. Installing twice changes nothing."""
    previous = sys.excepthook
    if getattr(previous, HOOK_MARK, False):
        return

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        if not isinstance(value, PermanentError):
            previous(kind, value, tb)
            return
        # Hooks installed after ours (torch.distributed's, which prefixes the rank) may have
        # pointed sys.stderr at a buffer they print only after we return: we never return.
        if sys.__stderr__ is not None:
            sys.stderr = sys.__stderr__
        report_permanent(str(value))
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        # The interpreter would exit 1 after this hook, which the agent reads as a crash
        # worth a new world; the code is the contract (exitcodes.CONFIG).
        os._exit(CONFIG)

    setattr(hook, HOOK_MARK, True)
    sys.excepthook = hook
