"""The operator's one HTTP client to worker agents.

Three tasks talk to the agents on the same metrics port: the progress reader (rank 0's page,
``progress.py``), the liveness probes (the workers of a suspect node, ``nodeliveness.py``) and
the pushed assignments (``push.py``). One session gives them one pool of connections and one
place that closes it at shutdown (the agent's server closes each connection after its answer,
so the pool saves sessions, not handshakes). Each request sets its own deadline
(``timeout``): a probe must answer within a second, a page or a push within two.

The pool has no cap on connections (aiohttp's default is 100 per session): a deadline counts
the wait for a free connection, so with a cap, a burst of pushes to pods that do not answer
(a lost node's, each held for its two seconds) would keep a liveness probe of a live worker
waiting past its second, and a live node would read as silent. Each caller bounds itself
instead: a probe per worker of a suspect node, a page per job, a push per changed pod.
"""

from __future__ import annotations

import aiohttp


def deadline(seconds: float) -> aiohttp.ClientTimeout:
    """A request's whole time limit (connect, send, read)."""
    return aiohttp.ClientTimeout(total=seconds)


class AgentClient:
    """The shared session, opened at its first request (it needs a running event loop)."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """The session; requests give their own ``timeout`` (``deadline``)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        return self._session

    async def close(self) -> None:
        """Close the pool (the operator's shutdown; tests at their end)."""
        if self._session is not None:
            await self._session.close()
            self._session = None
