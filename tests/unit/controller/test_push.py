"""Pushed assignments, operator side: whom the operator pushes to, and what a real agent's
endpoint (``elastra_worker.metrics.serve``) makes of it.

The agent here is the worker's own HTTP endpoint on a loopback port, holding the public key
the operator puts in every worker's environment: a push it takes is one a pod would take.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client import REGISTRY

from elastra.api import TrainingJob, parse_trainingjob
from elastra.controller.decide.assignment_key import signing_key
from elastra.controller.decide.manifests import ANNOTATION_ASSIGNMENT, LABEL_JOB, assignment_json
from elastra.controller.engine.agents import AgentClient
from elastra.controller.engine.push import AssignmentPusher
from elastra.controller.settings import OperatorSettings
from elastra_worker.launcher import free_port
from elastra_worker.metrics import WorkerCollector, serve
from elastra_worker.push import PushedAssignments, public_key_text
from tests.cases.specs import base_manifest

SEED = b"operator-key-" * 3
"""``--assignment-key-file``'s bytes."""
POD_UID = "7d1e4f0a-9c2b-4e8d-a5f3-6b0c2d1e9f84"
REAL = {"metadata": {"name": "real-1", "labels": {}}}
KWOK = {"metadata": {"name": "kwok-1", "labels": {"type": "kwok"}}}
NODES = {n["metadata"]["name"]: n for n in (REAL, KWOK)}


def gpt() -> TrainingJob:
    body = base_manifest("gpt")
    body["metadata"].update(namespace="team-a", uid="u-1")
    return parse_trainingjob(body)


def pod(
    version: int, *, node: str = "real-1", phase: str = "Running", uid: str = POD_UID
) -> dict[str, Any]:
    """Pod gpt-w0 as a patch's answer shows it, carrying a waiting assignment of ``version``."""
    assignment = assignment_json(
        gpt(), version=version, rank=None, stop=False, settings=OperatorSettings()
    )
    return {
        "metadata": {
            "name": "gpt-w0",
            "namespace": "team-a",
            "uid": uid,
            "labels": {LABEL_JOB: "gpt"},
            "annotations": {ANNOTATION_ASSIGNMENT: assignment},
        },
        "spec": {"nodeName": node},
        "status": {"phase": phase, "podIP": "127.0.0.1"},
    }


@dataclass
class Agent:
    """A worker's endpoint on a loopback port, and what it was pushed."""

    port: int
    pushes: PushedAssignments

    def version(self) -> int | None:
        newest = self.pushes.newest(None)
        return None if newest is None else newest.world_version


@pytest.fixture
def agent() -> Agent:
    """The pod's agent, with the public key the operator of ``SEED`` gives its pods."""
    pushes = PushedAssignments(public_key_text(signing_key(SEED)), POD_UID)
    port = free_port()
    serve(port, WorkerCollector(dict, dict), warm=lambda: True, pushes=pushes)
    return Agent(port, pushes)


@contextlib.asynccontextmanager
async def pusher_to(port: int, seed: bytes = SEED) -> AsyncIterator[AssignmentPusher]:
    """The operator's pusher to agents on ``port``, over its own agents' session."""
    agents = AgentClient()
    pusher = AssignmentPusher(OperatorSettings(metrics_port=port), signing_key(seed), agents)
    try:
        yield pusher
    finally:
        await pusher.close()
        await agents.close()


def pushes(result: str) -> float:
    return REGISTRY.get_sample_value("elastra_assignment_pushes_total", {"result": result}) or 0.0


async def counted(result: str, before: float, *, timeout: float = 10.0) -> None:
    """Wait until one more push ended with ``result`` (pushes run beside the pass)."""
    deadline = time.monotonic() + timeout
    while pushes(result) < before + 1:
        assert time.monotonic() < deadline, f"no push counted as {result} in {timeout}s"
        await asyncio.sleep(0.02)


def test_a_patched_assignment_reaches_the_agent_signed_for_its_pod(agent: Agent) -> None:
    async def scenario() -> None:
        async with pusher_to(agent.port) as pusher:
            push = pusher.to_pods(NODES.get)
            before = pushes("taken")
            assert push(pod(3))
            await counted("taken", before)
            assert agent.version() == 3
            stale = pushes("stale")
            assert push(pod(2))  # a push overtaken by a newer one is answered, not taken
            await counted("stale", stale)
            assert agent.version() == 3

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("seed", "uid"),
    [
        pytest.param(b"another-key-" * 3, POD_UID, id="another operator's key"),
        pytest.param(SEED, "uid-of-an-earlier-pod-of-that-name", id="signed for another pod"),
    ],
)
def test_a_push_not_signed_by_this_operator_for_this_pod_is_refused(
    agent: Agent, seed: bytes, uid: str
) -> None:
    async def scenario() -> None:
        async with pusher_to(agent.port, seed) as other:
            before = pushes("refused")
            assert other.to_pods(NODES.get)(pod(3, uid=uid))
            await counted("refused", before)
            assert agent.version() is None

    asyncio.run(scenario())


def test_refused_pushes_are_logged_once_per_job(
    agent: Agent, caplog: pytest.LogCaptureFixture
) -> None:
    """Pods that hold another operator's key refuse every push: one line says so per job."""

    async def scenario() -> None:
        async with pusher_to(agent.port, b"another-key-" * 3) as other:
            push = other.to_pods(NODES.get)
            for version in (3, 4, 5):
                before = pushes("refused")
                assert push(pod(version))
                await counted("refused", before)
                if version == 4:
                    other.forget("team-a", "gpt")  # the job deleted; one of that name again

    logger = "elastra.controller.engine.push"
    caplog.set_level(logging.DEBUG, logger=logger)
    asyncio.run(scenario())
    refusals = [r for r in caplog.records if r.name == logger and "refused" in r.getMessage()]
    assert [r.levelno for r in refusals] == [logging.INFO, logging.DEBUG, logging.INFO]
    assert "later refusals in job gpt are logged at DEBUG" in refusals[0].getMessage()


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(None, id="pod gone"),
        pytest.param(pod(3, node="kwok-1"), id="simulated node: its address is nobody's"),
        pytest.param(pod(3, node="unknown"), id="node not cached"),
        pytest.param(pod(3, phase="Pending"), id="not running: no agent yet"),
    ],
)
def test_no_push_where_no_agent_of_the_pod_can_answer(
    agent: Agent, answer: dict[str, Any] | None
) -> None:
    async def scenario() -> bool:
        async with pusher_to(agent.port) as pusher:
            return pusher.to_pods(NODES.get)(answer)

    assert not asyncio.run(scenario())
    assert agent.version() is None


def test_an_agent_that_does_not_answer_costs_the_pass_nothing() -> None:
    async def scenario() -> None:
        async with pusher_to(free_port()) as pusher:  # nothing listens there
            before = pushes("unreachable")
            assert pusher.to_pods(NODES.get)(pod(3))  # returns at once, the push runs on
            await counted("unreachable", before)

    asyncio.run(scenario())
