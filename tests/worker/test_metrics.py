"""The agent's metrics page: each figure of the trainer's progress report becomes its gauge, and
a figure the report does not carry (yet) is left out rather than exported as zero. The same port
answers the startup probe and takes the operator's pushed assignments."""

from __future__ import annotations

import http.client
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from elastra_worker.assignment import MAX_FILE_BYTES
from elastra_worker.launcher import free_port
from elastra_worker.metrics import PEERS_LOST_METRIC, READY_PATH, WorkerCollector, serve
from elastra_worker.push import PUSH_PATH, SIGNATURE_HEADER, PushedAssignments, sign
from tests.unit.controller.test_progress import worker_page as page

from .test_push import KEY, POD_UID, PUBLIC, body


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


def get(url: str | urllib.request.Request) -> tuple[int, str]:
    """The status and text of the answer to a GET of ``url`` (or to the request given)."""
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
    assert get(post(base, body(4), signed=True))[0] == 404, "no pushes given: none taken"


def post(
    base: str, payload: bytes, *, signed: bool, headers: dict[str, str] | None = None
) -> urllib.request.Request:
    """A POST of ``payload`` to ``PUSH_PATH``, signed as the operator signs it for ``POD_UID``."""
    all_headers = {SIGNATURE_HEADER: sign(KEY, POD_UID, payload)} if signed else {}
    all_headers.update(headers or {})
    return urllib.request.Request(base + PUSH_PATH, payload, all_headers, method="POST")


def test_the_push_path_takes_a_signed_assignment_by_post_and_metrics_still_serve() -> None:
    port = free_port()
    pushes = PushedAssignments(PUBLIC, POD_UID)
    serve(port, WorkerCollector(lambda: {"step": 7}, dict), warm=lambda: True, pushes=pushes)
    base = f"http://127.0.0.1:{port}"
    too_long = {"Content-Length": str(MAX_FILE_BYTES + 1)}  # declared only: nothing is read
    table = [
        (post(base, body(4), signed=True), (200, "taken\n")),
        (post(base, body(4), signed=True), (200, "not newer\n")),
        (post(base, body(5), signed=False), (403, f"no {SIGNATURE_HEADER} header\n")),
        (post(base, b"", signed=True, headers=too_long), (413, f"assignment larger than "
                                                           f"{MAX_FILE_BYTES} bytes\n")),
        (post(base, b"", signed=True, headers={"Content-Length": "4x"}),
         (400, "invalid Content-Length '4x'\n")),
        (urllib.request.Request(base + PUSH_PATH), (405, f"{PUSH_PATH} takes POST only\n")),
    ]  # fmt: skip
    assert [get(request) for request, _ in table] == [answer for _, answer in table]
    assert unsized_post(port) == 411
    pushed = pushes.newest(None)
    assert pushed is not None and pushed.world_version == 4
    status, page = get(base + "/metrics")
    assert status == 200
    assert "elastra_worker_step 7.0" in page.splitlines()
    assert get(base + READY_PATH) == (200, "warm\n")


def unsized_post(port: int) -> int:
    """The status answering a POST to ``PUSH_PATH`` without Content-Length (urllib sets one)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest("POST", PUSH_PATH)
        conn.endheaders()
        return conn.getresponse().status
    finally:
        conn.close()
