"""The state a trainer keeps in host memory for the next run of its script in this process.

One process runs one script at a time, so one module-level slot holds it from the old world's
stop (``loop.py``) to the new run's ``restore()`` (``checkpoints.py``). Apart from
``rerun.py``, which the standby imports before torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..layout import Manifest
from .peerdcp import HeldState


@dataclass(frozen=True)
class Handoff:
    """The state a trainer carries into its next run: its part and the step's manifest."""

    held: HeldState
    manifest: Manifest


class _Slot:
    handoff: Handoff | None = None


_SLOT = _Slot()


def keep(handoff: Handoff) -> None:
    """Hold ``handoff`` for the next run of the script in this process."""
    _SLOT.handoff = handoff


def holding() -> bool:
    """Whether this process holds state for a next run of the script."""
    return _SLOT.handoff is not None


def take() -> Handoff | None:
    """The state the previous run held for this one, once (``None`` in a first run)."""
    handoff, _SLOT.handoff = _SLOT.handoff, None
    return handoff
