"""The job loops: a pass's requeue sets when the next one runs (a zero requeue: at once); a
failing pass is logged with the job's name and retried with backoff; the informers' changes
start, wake and stop exactly the loops they concern."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from datetime import timedelta
from types import SimpleNamespace
from typing import Any, cast

import pytest

from elastra.controller.engine import handlers
from elastra.controller.engine.handlers import JobLoop, Runtime, error_backoff
from elastra.controller.settings import OperatorSettings
from elastra.kube.client import ApiError
from elastra.requeue import Requeue
from tests.unit.controller.fakecluster import node
from tests.unit.controller.test_snapshot import gated_pod, synced_snapshot


def runtime(settings: OperatorSettings | None = None) -> Runtime:
    rt = Runtime(
        kube=cast(Any, None),
        settings=settings or OperatorSettings(),
        snapshot=synced_snapshot(),
        leader=cast(Any, SimpleNamespace(leading=True, renew=timedelta(seconds=1))),
    )
    rt.listen()
    return rt


async def run_until(rt: Runtime, done: asyncio.Event) -> None:
    """Run job ns/j's loop until ``done`` is set (10 s at most), then stop every loop."""
    rt.ensure(("ns", "j"))
    async with asyncio.timeout(10):
        await done.wait()
    await rt.stop_all()


@pytest.mark.parametrize(
    ("failures", "seconds"),
    [(1, 1), (2, 2), (3, 4), (9, 256), (10, 300), (1000, 300)],
)
def test_backoff_doubles_from_one_second_to_five_minutes(failures: int, seconds: int) -> None:
    assert error_backoff(failures) == timedelta(seconds=seconds)


def test_a_requeue_of_zero_runs_the_next_pass_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: ``delay or resync`` read a zero delay as none asked for; the next pass came with
    the next event or after the 300 s resync."""
    passes: list[Requeue] = [Requeue.NOW, Requeue.after(timedelta(seconds=-3))]
    done = asyncio.Event()
    rt = runtime()  # resync 300 s, and no event comes

    async def reconcile(*args: Any, **kwargs: Any) -> Requeue:
        if passes:
            return passes.pop(0)
        done.set()
        return Requeue.NEVER

    monkeypatch.setattr(handlers, "reconcile", reconcile)

    asyncio.run(run_until(rt, done))
    assert done.is_set()


def test_the_loop_waits_for_the_requeue_at_most_the_resync(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked = [
        (Requeue.NOW, 0.0),
        (Requeue.after(timedelta(seconds=5)), 5.0),
        (Requeue.after(timedelta(minutes=10)), 300.0),
        (Requeue.NEVER, 300.0),
    ]
    requeues = [requeue for requeue, _ in asked]
    waits: list[float] = []
    done = asyncio.Event()
    rt = runtime()

    async def reconcile(*args: Any, **kwargs: Any) -> Requeue:
        if not requeues:
            done.set()
            await asyncio.Event().wait()  # until stop_all
        return requeues.pop(0)

    async def wait_for(wake: Coroutine[Any, Any, Any], timeout: float) -> None:
        waits.append(timeout)  # the timer runs out at once: no event comes
        wake.close()
        await asyncio.sleep(0)
        raise TimeoutError

    monkeypatch.setattr(handlers, "reconcile", reconcile)
    monkeypatch.setattr(asyncio, "wait_for", wait_for)

    asyncio.run(run_until(rt, done))
    assert waits == [seconds for _, seconds in asked]


Outcome = BaseException | None  # an exception the pass raises, or None: it succeeds


def run_loop(monkeypatch: pytest.MonkeyPatch, outcomes: list[Outcome]) -> list[int]:
    """Run one job's loop over passes with ``outcomes`` in turn (a success wakes it again).

    Returns the consecutive-failure count of each backoff the loop waited.
    """
    calls: list[int] = []
    backoffs: list[int] = []
    done = asyncio.Event()
    rt = runtime()

    async def reconcile(*args: Any, **kwargs: Any) -> Requeue:
        calls.append(len(calls))
        if len(calls) > len(outcomes):
            done.set()
            return Requeue.NEVER
        outcome = outcomes[len(calls) - 1]
        if outcome is not None:
            raise outcome
        asyncio.get_running_loop().call_soon(rt.poke, ("ns", "j"))  # an event: next pass
        return Requeue.NEVER

    async def sleep(seconds: float) -> None:
        backoffs.append(round(seconds))

    monkeypatch.setattr(handlers, "reconcile", reconcile)
    monkeypatch.setattr(asyncio, "sleep", sleep)  # the backoff waits, recorded instead
    monkeypatch.setattr(handlers, "ERROR_BACKOFF_MIN", timedelta(seconds=1))

    async def main() -> None:
        rt.ensure(("ns", "j"))
        await asyncio.wait_for(done.wait(), timeout=10)
        assert not rt.loops[("ns", "j")].task.done()  # alive after every failure
        await rt.stop_all()
        assert not rt.loops

    asyncio.run(main())
    assert len(calls) == len(outcomes) + 1
    return backoffs


def test_an_unexpected_exception_is_logged_and_the_pass_retried(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: only ApiError, ClientError and TimeoutError were caught; the loop died silently."""
    caplog.set_level(logging.WARNING, logger="elastra.operator")
    run_loop(monkeypatch, [ValueError("cannot convert float NaN to integer"), KeyError("x")])
    failed = [r for r in caplog.records if "pass failed unexpectedly" in r.getMessage()]
    assert len(failed) == 2
    assert all("job ns/j" in r.getMessage() and r.exc_info for r in failed)
    assert "NaN" in caplog.text and "Traceback" in caplog.text


def test_failures_in_a_row_grow_the_backoff_and_a_success_resets_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="elastra.operator")
    api_down = ApiError(500, "InternalError", "down")
    outcomes: list[Outcome] = [api_down, TimeoutError(), RuntimeError("bug"), None, api_down]
    assert run_loop(monkeypatch, outcomes) == [1, 2, 4, 1]
    transient = [r for r in caplog.records if "pass failed (" in r.getMessage()]
    assert len(transient) == 3 and not any(r.exc_info for r in transient)


def test_passes_across_jobs_are_bounded_and_stop_all_ends_every_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: every job's pass ran at once; 3,000 jobs held 4 GiB and none reached its writes."""
    in_flight: list[tuple[str, str]] = []
    most = 0
    release = asyncio.Event()
    rt = runtime(OperatorSettings(passes_at_once=2))

    async def reconcile(kube: Any, snapshot: Any, namespace: str, name: str, **_: Any) -> None:
        nonlocal most
        in_flight.append((namespace, name))
        most = max(most, len(in_flight))
        await release.wait()
        in_flight.remove((namespace, name))

    monkeypatch.setattr(handlers, "reconcile", reconcile)

    async def main() -> list[asyncio.Task[None]]:
        for i in range(5):
            rt.ensure(("ns", f"j{i}"))
        async with asyncio.timeout(10):
            while len(in_flight) < 2:
                await asyncio.sleep(0.01)
        for _ in range(20):  # let every loop reach its pass: none beyond the two may start
            await asyncio.sleep(0)
        tasks = [loop.task for loop in rt.loops.values()]
        await rt.stop_all()
        return tasks

    tasks = asyncio.run(main())
    assert most == 2
    assert all(t.done() for t in tasks) and not rt.loops


def test_stop_all_ends_the_background_tasks_and_what_they_wait_on() -> None:
    """Kopf waits 5 s for tasks started after its own before it cancels them: a ``wait_for``
    in an informer or the leader election is such a task (Python 3.11 wraps its awaitable in
    one), so every SIGTERM took 5 s until stop_all ended them first."""
    rt = runtime()

    async def idle() -> None:  # an informer between two events
        await asyncio.wait_for(asyncio.Event().wait(), timeout=3600)

    async def main() -> set[asyncio.Task[Any]]:
        before = asyncio.all_tasks()
        rt.background = [asyncio.create_task(idle()), asyncio.create_task(idle())]
        await asyncio.sleep(0)  # both reach their wait_for
        async with asyncio.timeout(10):
            await rt.stop_all()
        return asyncio.all_tasks() - before

    left = asyncio.run(main())
    assert all(t.cancelled() for t in rt.background)
    assert not left, f"tasks still running after stop_all: {left}"


def test_no_job_loop_starts_once_stopping() -> None:
    """An informer's event while stop_all waits for the loops used to start a new loop, which
    then planned from caches no longer fed: frozen node leases read as lost nodes, and a
    stopping operator wrote worlds of 0 workers (WorkerLost)."""
    rt = runtime()

    async def main() -> None:
        rt.ensure(("ns", "old"))
        stopping = asyncio.create_task(rt.stop_all())
        await asyncio.sleep(0)  # stop_all is waiting for the old loop to end
        rt.on_job("ADDED", None, {"metadata": {"namespace": "ns", "name": "new"}})
        async with asyncio.timeout(10):
            await stopping

    asyncio.run(main())
    assert not rt.loops, f"loops left after stop_all: {sorted(rt.loops)}"


def woken(rt: Runtime) -> set[tuple[str, str]]:
    """The jobs whose loops were woken, cleared for the next step."""
    found = {key for key, loop in rt.loops.items() if loop.wake.is_set()}
    for loop in rt.loops.values():
        loop.wake.clear()
    return found


def idle_loops(rt: Runtime, *keys: tuple[str, str]) -> None:
    for key in keys:
        rt.loops[key] = JobLoop(task=cast(Any, None), wake=asyncio.Event())


def test_pod_changes_wake_their_job_and_freed_capacity_wakes_every_job() -> None:
    rt = runtime()
    idle_loops(rt, ("ns", "a"), ("ns", "b"))
    pods = rt.snapshot.pods
    pods.apply({"type": "ADDED", "object": gated_pod("a-0")})
    assert woken(rt) == {("ns", "a")}
    other = gated_pod("x-0")
    other["metadata"]["labels"] = {}
    pods.apply({"type": "ADDED", "object": other})
    assert woken(rt) == set(), "another tenant's new pod frees nothing"
    other["status"] = {"phase": "Succeeded"}
    pods.apply({"type": "MODIFIED", "object": other})
    assert woken(rt) == {("ns", "a"), ("ns", "b")}
    pods.apply({"type": "DELETED", "object": gated_pod("a-0")})
    assert woken(rt) == {("ns", "a"), ("ns", "b")}


def test_a_node_change_wakes_every_job_and_a_deleted_node_is_remembered() -> None:
    rt = runtime()
    idle_loops(rt, ("ns", "a"), ("ns", "b"))
    rt.snapshot.nodes.apply({"type": "ADDED", "object": node("n2")})
    assert woken(rt) == {("ns", "a"), ("ns", "b")}
    rt.snapshot.nodes.apply({"type": "DELETED", "object": node("n2")})
    assert woken(rt) == {("ns", "a"), ("ns", "b")}
    assert "n2" in rt.snapshot.read().lost_nodes


def test_jobs_of_the_watched_namespace_get_loops_and_lose_them_when_deleted() -> None:
    rt = runtime(OperatorSettings(namespace="ns"))

    def job(namespace: str, generation: int = 1) -> dict[str, Any]:
        meta = {"name": "j", "namespace": namespace, "generation": generation}
        return {"metadata": meta, "status": {"observedGeneration": 1}}

    async def scenario() -> None:
        rt.snapshot.jobs.apply({"type": "ADDED", "object": job("elsewhere")})
        assert rt.loops == {}
        rt.snapshot.jobs.apply({"type": "ADDED", "object": job("ns")})
        assert set(rt.loops) == {("ns", "j")}
        woken(rt)
        rt.snapshot.jobs.apply({"type": "MODIFIED", "object": {**job("ns"), "x": 1}})
        assert woken(rt) == set(), "our own status write changes no generation"
        rt.snapshot.jobs.apply({"type": "MODIFIED", "object": job("ns", generation=2)})
        assert woken(rt) == {("ns", "j")}
        rt.snapshot.jobs.apply({"type": "DELETED", "object": job("ns", generation=2)})
        assert rt.loops == {}

    asyncio.run(scenario())
