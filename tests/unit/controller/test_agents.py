"""The operator's one HTTP session to worker agents: shared, each request with its own
deadline, reopened after a close."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import socket
import threading
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


class _Answers(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_probe_is_not_held_behind_requests_nobody_answers() -> None:
    """More requests than aiohttp's default pool (100) hang on agents that do not answer;
    a worker that answers still answers within a probe's deadline."""
    live = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    threading.Thread(target=live.serve_forever, daemon=True).start()
    with socket.create_server(("127.0.0.1", 0), backlog=256) as silent:
        hung_port, live_port = silent.getsockname()[1], live.server_address[1]

        async def scenario() -> int:
            agents = AgentClient()

            async def hang() -> None:
                with contextlib.suppress(TimeoutError):
                    url = f"http://127.0.0.1:{hung_port}/assignment"
                    async with agents.session.get(url, timeout=deadline(3.0)):
                        pass

            hung = [asyncio.create_task(hang()) for _ in range(120)]
            await asyncio.sleep(0.2)  # every hung request holds its connection
            try:
                url = f"http://127.0.0.1:{live_port}/metrics"
                async with agents.session.get(url, timeout=deadline(1.0)) as reply:
                    return reply.status
            finally:
                await asyncio.gather(*hung)
                await agents.close()

        try:
            assert asyncio.run(scenario()) == 200
        finally:
            live.shutdown()
            live.server_close()
