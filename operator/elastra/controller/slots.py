"""The pass slots: at most ``passes_at_once`` passes run at a time, jobs without a world first.

When many jobs arrive together (a burst of submissions, an operator restart over a full
cluster), a plain first-come queue serves each job's first pass behind the later passes of
the jobs before it: every pod a pass creates wakes its job several times (created, bound,
started, Ready), and those passes only confirm a world already recorded. A job with no world
is the one waiting to start training, so its pass goes ahead. Within each class the order is
first come, first served; a job that has a world waits only while passes of jobs without one
are queued, which at most every job once per burst.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator


class PassSlots:
    """A semaphore with two queues: waiters for jobs without a world are woken first."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"pass slots must be at least 1, got {size}")
        self._free = size
        self._urgent: deque[asyncio.Future[None]] = deque()
        self._later: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        """Passes queued for a slot."""
        return sum(not f.done() for f in (*self._urgent, *self._later))

    @contextlib.asynccontextmanager
    async def slot(self, *, urgent: bool) -> AsyncIterator[None]:
        """Hold a slot for one pass; ``urgent`` passes (a job without a world) go first."""
        await self._acquire(urgent)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, urgent: bool) -> None:
        if self._free > 0 and not self.waiting:
            self._free -= 1
            return
        queue = self._urgent if urgent else self._later
        ticket: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue.append(ticket)
        try:
            await ticket
        except asyncio.CancelledError:
            if ticket.done() and not ticket.cancelled():
                self._release()  # handed a slot just as it was cancelled: pass it on
            else:
                with contextlib.suppress(ValueError):  # a release may have dropped it already
                    queue.remove(ticket)
            raise

    def _release(self) -> None:
        """Hand the slot straight to the next waiter, so no newcomer takes it in between."""
        for queue in (self._urgent, self._later):
            while queue:
                ticket = queue.popleft()
                if not ticket.done():
                    ticket.set_result(None)
                    return
        self._free += 1
