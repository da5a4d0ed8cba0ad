"""The operator's one HTTP session to worker agents: shared, each request with its own
deadline, reopened after a close."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from elastra.controller.engine.agents import AgentClient, deadline


def test_one_session_for_every_caller_until_closed() -> None:
    async def scenario() -> None:
        agents = AgentClient()
        first = agents.session
        assert agents.session is first
        await agents.close()
        assert first.closed
        again = agents.session  # a caller after the close gets a working session
        assert again is not first and not again.closed
        await agents.close()

    asyncio.run(scenario())


def test_a_request_ends_at_its_own_deadline() -> None:
    """A worker that accepts the connection and never answers costs a probe its second."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]

        async def scenario() -> float:
            agents = AgentClient()
            started = time.monotonic()
            try:
                with pytest.raises(TimeoutError):
                    async with agents.session.get(
                        f"http://127.0.0.1:{port}/metrics", timeout=deadline(0.3)
                    ):
                        pass
            finally:
                await agents.close()
            return time.monotonic() - started

        assert asyncio.run(scenario()) < 5.0
