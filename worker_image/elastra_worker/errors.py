"""The two failures library code names instead of exiting: permanent and retryable.

``PermanentError``: a mistake in the job or the training script that no new world can fix.
``RetryableError``: a passing failure (storage out of reach) that a new world may not meet.
Library code raises them rather than exiting: a library must not end the process of the script
that called it, and a script may catch the error. Where they end the trainer is the hook
``install_hook`` sets (a ``Session`` installs it): an uncaught ``PermanentError`` prints its one
line, with no traceback (the line says what to change), writes it as the container's
termination message, and ends the process with the permanent exit code. The agent then exits
with that code at once instead of starting world after world, and the operator puts the line in
the job's condition. An uncaught ``RetryableError`` prints its line and ends the process with
the retryable code, so the agent asks for a new world. Any other uncaught exception that says
a collective failed (``peer_failure``: a peer is gone, gloo's "Connection closed by peer",
NCCL's errors, also from DDP's gradient hooks) keeps its traceback and ends the process with
``exitcodes.PEERS_LOST``, so the agent waits for the world of survivors instead of leaving it.
Misuse of a collective (a tensor of the wrong shape) reads the same; it only makes the pod
wait longer before it exits.
No torch here: exception classes and frames are told apart by their names.
"""

from __future__ import annotations

import logging
import os
import sys
from types import TracebackType
from typing import NoReturn

from .exitcodes import CONFIG, PEERS_LOST, RETRYABLE
from .termination import one_line, report_permanent

HOOK_MARK = "_elastra_permanent"
DISTRIBUTED_PACKAGE = os.path.join("torch", "distributed", "")
"""The folder of ``torch.distributed`` as it appears in a frame's file name."""
GLOO_TRANSPORT = "gloo/transport/"
"""In the message of every error gloo's transport raises (its source file's path): a peer's
connection closed, reset or timed out."""


class PermanentError(Exception):
    """The job or the script is wrong in a way a retry repeats; the message says how."""


class RetryableError(Exception):
    """A failure a new world may not meet (an object store out of reach); the message says
    what failed."""


def install_hook() -> None:
    """Make an uncaught ``PermanentError`` end the process as a permanent failure, an
    uncaught ``RetryableError`` as a retryable one and one that says a collective failed
    (``peer_failure``) as a lost peer; every other exception keeps the hook it had.
    Installing twice changes nothing."""
    previous = sys.excepthook
    if getattr(previous, HOOK_MARK, False):
        return

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        ours = isinstance(value, PermanentError | RetryableError)
        if not ours and not peer_failure(value, tb):
            previous(kind, value, tb)
            return
        # Hooks installed after ours (torch.distributed's, which prefixes the rank) may have
        # pointed sys.stderr at a buffer they print only after we return: we never return.
        if sys.__stderr__ is not None:
            sys.stderr = sys.__stderr__
        if not ours:  # the traceback says which collective and which peer
            previous(kind, value, tb)
            _exit_now(PEERS_LOST)
        if isinstance(value, PermanentError):
            report_permanent(str(value))
        else:  # not the container's last word: the pod goes on in a new world
            print(one_line(str(value)), file=sys.stderr, flush=True)
        # The interpreter would exit 1 after this hook, which the agent reads as a crash
        # worth a new world; the code is the contract (exitcodes.CONFIG, RETRYABLE).
        _exit_now(CONFIG if isinstance(value, PermanentError) else RETRYABLE)

    setattr(hook, HOOK_MARK, True)
    sys.excepthook = hook


def peer_failure(value: BaseException, tb: TracebackType | None) -> bool:
    """The exception says a collective failed: one of ``torch.distributed``'s errors (NCCL's,
    the store's, the network's), gloo's transport losing a peer (raised as a plain
    ``RuntimeError``, also from DDP's gradient hooks inside autograd), or anything raised
    with ``torch.distributed`` as the innermost frame."""
    if any(k.__name__ == "DistError" and k.__module__ == "torch.distributed"
           for k in type(value).__mro__):  # fmt: skip
        return True
    if GLOO_TRANSPORT in str(value):
        return True
    last = None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return last is not None and DISTRIBUTED_PACKAGE in last.tb_frame.f_code.co_filename


def _exit_now(code: int) -> NoReturn:
    """End the process with ``code`` once the logs and streams are out."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    os._exit(code)
