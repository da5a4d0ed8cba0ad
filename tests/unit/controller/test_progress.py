"""status.progress from rank 0's metrics: parsing, whom to ask, and what gets recorded."""

from __future__ import annotations

import asyncio
import dataclasses
import resource
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from elastra.controller.decide.observe import WorkerProgress, parse_metrics, rank0_address
from elastra.controller.decide.passplan import Observation, plan_pass
from elastra.controller.engine import metrics
from elastra.controller.engine.progress import MAX_METRICS_BYTES, fetch_metrics
from elastra_worker.metrics import WorkerCollector
from tests.unit.controller.fakecluster import FakeCluster, node
from tests.unit.controller.test_passplan import SETTINGS, h100s, job

PAGE = """# HELP elastra_worker_step Optimizer steps completed
# TYPE elastra_worker_step gauge
elastra_worker_step 42.0
elastra_worker_loss 3.2
elastra_worker_samples_per_second 117.6
elastra_worker_last_checkpoint_step 40.0
elastra_worker_world_version 1.0
elastra_worker_trainer_starts_total 2.0
"""


def test_parse_reads_the_progress_gauges() -> None:
    assert parse_metrics(PAGE) == WorkerProgress(
        step=42, samples_per_second=117.6, last_checkpoint_step=40, world_version=1
    )
    assert parse_metrics("# nothing yet\nelastra_worker_world_version 1.0\n") is None
    assert parse_metrics("elastra_worker_step not-a-number\n") is None


@pytest.mark.parametrize(
    "value", ["NaN", "nan", "+Inf", "-Inf", "1e400", "-1", "-0.5", "inf", "1e999999"]
)
def test_a_value_that_is_no_count_is_ignored(value: str) -> None:
    """Before: NaN and infinities raised out of int(), negative steps were recorded."""
    for gauge in ("step", "last_checkpoint_step", "world_version", "samples_per_second"):
        page = PAGE.replace(f"elastra_worker_{gauge} ", f"elastra_worker_{gauge} {value} #")
        got = parse_metrics(page)
        if gauge == "step":
            assert got is None
        else:
            assert got is not None and got.step == 42
            assert getattr(got, gauge) in (None, 0.0)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_get("/metrics", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/metrics"
    finally:
        await runner.cleanup()


def fetch(handler: Handler) -> WorkerProgress | None:
    async def go() -> WorkerProgress | None:
        async with serving(handler) as url, aiohttp.ClientSession() as session:
            return await fetch_metrics(session, url)

    return asyncio.run(go())


async def small_page(request: web.Request) -> web.StreamResponse:
    return web.Response(text=PAGE)


async def endless_page(request: web.Request) -> web.StreamResponse:
    """200 MiB of metric lines without a Content-Length (chunked), as a hostile worker sends."""
    reply = web.StreamResponse()
    await reply.prepare(request)
    line = b"elastra_worker_step 1.0\n" * 4096
    try:
        for _ in range((200 << 20) // len(line)):
            await reply.write(line)
    except ConnectionError:
        pass  # the reader hung up, as it should
    return reply


async def declared_huge_page(request: web.Request) -> web.StreamResponse:
    return web.Response(body=b"x" * (MAX_METRICS_BYTES + 1))


def test_fetch_reads_a_page_and_stops_at_the_bound() -> None:
    assert fetch(small_page) == parse_metrics(PAGE)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    assert fetch(endless_page) is None
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 64, f"peak RSS grew {grown_mib:.0f} MiB reading a 200 MiB page"
    assert fetch(declared_huge_page) is None


def running() -> FakeCluster:
    cluster = FakeCluster(job(replicas=2), h100s(2), SETTINGS)
    cluster.converge()
    assert cluster.job.status.world.version == 1
    return cluster


def test_rank0_of_a_real_node_is_asked_and_a_simulated_one_never() -> None:
    cluster = running()
    pods: list[dict[str, Any]] = list(cluster.pods.values())
    leader = next(p.pod for p in cluster.job.status.placement if p.rank == 0)
    ip = cluster.pods[leader]["status"]["podIP"]
    assert rank0_address(cluster.job, pods, cluster.nodes, ("type=kwok",)) == ip
    kwok = [node(n["metadata"]["name"]) for n in cluster.nodes]
    for n in kwok:
        n["metadata"]["labels"]["type"] = "kwok"
    assert rank0_address(cluster.job, pods, kwok, ("type=kwok",)) is None


def pass_with(cluster: FakeCluster, report: WorkerProgress) -> Any:
    pods = list(cluster.pods.values())
    obs = Observation(cluster.job, pods, cluster.nodes, pods, progress=report)
    return plan_pass(obs, SETTINGS, cluster.now).status.progress


def test_the_current_worlds_report_is_recorded_and_an_old_worlds_ignored() -> None:
    cluster = running()
    now = WorkerProgress(
        step=42, samples_per_second=117.6, last_checkpoint_step=40, world_version=1
    )
    recorded = pass_with(cluster, now)
    assert (recorded.step, recorded.samples_per_second, recorded.last_checkpoint_step) == (
        42,
        118,
        40,
    )
    stale = WorkerProgress(step=7, samples_per_second=1.0, last_checkpoint_step=5, world_version=0)
    assert pass_with(cluster, stale) == cluster.job.status.progress


def worker_page(progress: dict[str, Any]) -> str:
    """The page a worker's agent serves for ``progress`` (the exposition format, as scraped)."""
    registry = CollectorRegistry()
    registry.register(WorkerCollector(lambda: progress, lambda: {"worldVersion": 2}))
    return generate_latest(registry).decode()


@pytest.mark.parametrize(
    ("reported", "downtime", "state_from"),
    [
        ({"resizeDowntimeSeconds": 7.25, "stateFrom": "storage"}, 7.25, "storage"),
        ({"resizeDowntimeSeconds": 0.5, "stateFrom": "memory"}, 0.5, "memory"),
        ({"resizeDowntimeSeconds": 1.5, "stateFrom": "peers"}, 1.5, "peers"),
        ({"resizeDowntimeSeconds": 7.25, "stateFrom": 'a"b'}, 7.25, None),  # unknown source
        ({}, None, None),  # a first world reports none
    ],
)
def test_the_resize_downtime_a_worker_exports_is_what_the_operator_reads(
    reported: dict[str, Any], downtime: float | None, state_from: str | None
) -> None:
    page = worker_page({"step": 9, "samplesPerSecond": 3.0, **reported})
    read = parse_metrics(page)
    assert read is not None and read.world_version == 2
    assert (read.resize_downtime_s, read.state_from) == (downtime, state_from)


def downtime_sum() -> float:
    sample = REGISTRY.get_sample_value(
        "elastra_resize_downtime_seconds_sum", {"state_from": "storage"}
    )
    return sample or 0.0


def test_the_last_resize_gains_its_downtime_once_and_the_histogram_counts_it() -> None:
    cluster = FakeCluster(job(replicas=3), h100s(3), SETTINGS)
    cluster.converge()
    cluster.job_body["spec"]["replicas"] = 2
    cluster.converge()
    last = cluster.job.status.resizes[-1]
    assert last.downtime_millis is None and last.to_version == 2
    old = WorkerProgress(step=9, samples_per_second=1.0, last_checkpoint_step=8, world_version=1,
                         resize_downtime_s=99.0, state_from="storage")  # fmt: skip
    pods = list(cluster.pods.values())

    def resizes(report: WorkerProgress) -> Any:
        obs = Observation(cluster.job, pods, cluster.nodes, pods, progress=report)
        return plan_pass(obs, SETTINGS, cluster.now).status.resizes

    assert resizes(old)[-1].downtime_millis is None, "an older world's figure is not this one's"
    new = WorkerProgress(step=12, samples_per_second=1.0, last_checkpoint_step=8, world_version=2,
                         resize_downtime_s=4.5, state_from="storage")  # fmt: skip
    measured = resizes(new)
    assert (measured[-1].downtime_millis, measured[-1].state_from) == (4500, "storage")
    assert measured[:-1] == cluster.job.status.resizes[:-1]
    before = cluster.job_body.get("status") or {}
    start = downtime_sum()
    status = cluster.job.status.model_copy(update={"resizes": measured})
    metrics.observe_downtime(before, status)
    metrics.observe_downtime(status.to_wire(), status)  # the next pass: already counted
    assert downtime_sum() - start == pytest.approx(4.5)


@pytest.mark.parametrize(
    ("reported", "percent"),
    [
        ({"goodput": 0.8734}, 87),
        ({"goodput": 1.0}, 100),
        ({"goodput": 1.5}, None),  # no fraction: a broken worker, not recorded
        ({}, None),  # before a world's second step
    ],
)
def test_the_goodput_a_worker_exports_is_recorded_in_percent(
    reported: dict[str, Any], percent: int | None
) -> None:
    cluster = running()
    read = parse_metrics(worker_page({"step": 9, "samplesPerSecond": 3.0, **reported}))
    assert read is not None
    current = dataclasses.replace(read, world_version=1)
    assert pass_with(cluster, current).goodput_percent == percent
