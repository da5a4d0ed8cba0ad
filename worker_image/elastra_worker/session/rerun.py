"""Into the next world by running the script again in the same process, its state in memory.

Why: a tensor-, pipeline- or sharded-data-parallel model is bound to its world's mesh (its
parameters are shards of it, its modules split for it), so only the script that built it can
build it for another world. Restarting the trainer for that costs a process start and a read of
the whole state back from the volume. Instead, a trainer that a standby runs (``standby.py``)
keeps its part of the state in host memory at the old world's stop (``kept.py``, every
member at once), raises ``WorldMoved`` out of ``Session.batches()``, and the standby runs
the script again in this process with the next world's variables (``assignment.session_env``);
the new Session's ``restore()`` finds the state held here (``kept.take``) and loads it, resharded to
the new plan by DCP, from the members that hold it (``peerdcp.PeerReader``). A member that left
took its part with it: then the new world reads the checkpoint committed at the stop instead.
"""

from __future__ import annotations

import os

from ..assignment import Assignment

RERUN_ENV = "ELASTRA_RERUN"
"""``1`` where the process running the script can run it again (a standby sets it)."""


class WorldMoved(BaseException):
    """Raised out of ``Session.batches()`` to end this run of the script; the standby runs it
    again for ``assignment`` (a ``BaseException``, so a script's ``except Exception`` lets it
    through, as it does ``SystemExit``)."""

    def __init__(self, assignment: Assignment, local_rank: int) -> None:
        super().__init__(f"world version {assignment.world_version}")
        self.assignment = assignment
        self.local_rank = local_rank


def can_rerun() -> bool:
    """Whether this process's script can run again in it (started by a standby)."""
    return os.environ.get(RERUN_ENV) == "1"
