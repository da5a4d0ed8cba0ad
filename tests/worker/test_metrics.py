"""The agent's metrics page: each figure of the trainer's progress report becomes its gauge, and
a figure the report does not carry (yet) is left out rather than exported as zero. The same port
answers the startup probe."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from elastra_worker.launcher import free_port
from elastra_worker.metrics import PEERS_LOST_METRIC, READY_PATH, WorkerCollector, serve
from tests.unit.controller.test_progress import worker_page as page


@pytest.mark.parametrize(
    ("key", "value", "sample"),
    [
        ("checkpointBlockingSeconds", 0.125, "elastra_worker_checkpoint_blocking_seconds 0.125"),
        ("checkpointBackgroundSeconds", 2.5, "elastra_worker_checkpoint_background_seconds 2.5"),
        (
            "stateBytesFromStorage",
            4096,
            'elastra_worker_state_loaded_bytes{state_from="storage"} 4096.0',
        ),
        (
            "stateBytesFromPeers",
            8192,
            'elastra_worker_state_loaded_bytes{state_from="peers"} 8192.0',
        ),
        ("goodput", 0.75, "elastra_worker_goodput 0.75"),
    ],
)
def test_a_reported_figure_is_exported_and_an_absent_one_left_out(
    key: str, value: float, sample: str
) -> None:
    name = sample.partition(" ")[0].partition("{")[0]
    assert sample in page({"step": 3, key: value}).splitlines()
    without = page({"step": 3, key: None})
    assert name not in without, "a figure not known yet is no sample at all"
    assert "elastra_worker_step 3.0" in without


def test_the_agents_resize_counts_are_exported_by_path() -> None:
    registry = CollectorRegistry()
    state = {"worldVersion": 4, "resizesInMemory": 2, "resizesRestarted": 1}
    registry.register(WorkerCollector(lambda: {"step": 3}, lambda: state))
    lines = generate_latest(registry).decode().splitlines()
    assert 'elastra_worker_resizes_total{path="memory"} 2.0' in lines
    assert 'elastra_worker_resizes_total{path="restart"} 1.0' in lines


@pytest.mark.parametrize(("version", "present"), [(4, True), (None, False)])
def test_a_world_whose_collectives_failed_is_exported_while_the_pod_waits(
    version: int | None, present: bool
) -> None:
    registry = CollectorRegistry()
    state = {"worldVersion": 4, "peersLostWorldVersion": version}
    registry.register(WorkerCollector(lambda: {"step": 3}, lambda: state))
    lines = generate_latest(registry).decode().splitlines()
    assert (f"{PEERS_LOST_METRIC} 4.0" in lines) is present
    assert present or not any(line.startswith(PEERS_LOST_METRIC) for line in lines)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_the_ready_path_says_whether_the_agent_is_warm_and_other_paths_serve_metrics() -> None:
    warm = [False]
    port = free_port()
    serve(port, WorkerCollector(lambda: {"step": 7}, dict), warm=lambda: warm[0])
    base = f"http://127.0.0.1:{port}"
    assert get(base + READY_PATH) == (503, "starting: torch is not imported yet\n")
    warm[0] = True
    assert get(base + READY_PATH) == (200, "warm\n")
    status, page = get(base + "/metrics")
    assert status == 200
    assert "elastra_worker_step 7.0" in page.splitlines()
