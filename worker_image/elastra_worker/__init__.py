"""elastra_worker: the in-pod runtime of an Elastra training job.

It turns the assignment the operator writes into a torch.distributed world, checkpoints and
reshards across world sizes, and keeps the data order independent of the world size. It never
imports ``elastra`` and never talks to the Kubernetes API: a worker needs no credentials.

``Session`` (the training-script API) is imported lazily so that the agent, which only starts
and watches trainers, never pays for importing torch. ``report_progress`` is a torchrun-mode
script's one-line progress report (``control.py``; no torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .control import report_progress

if TYPE_CHECKING:
    from .api import Session

__all__ = ["Session", "report_progress"]


def __getattr__(name: str) -> Any:
    if name == "Session":
        from .api import Session  # noqa: PLC0415 (lazy: the agent must not import torch)

        return Session
    raise AttributeError(name)
