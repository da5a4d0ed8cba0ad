"""Prometheus metrics of one worker pod, served by the agent on a stable port, and its readiness.

The agent, not the trainer, serves them: trainers come and go with every world version, the agent
lives as long as the pod, so the operator scrapes one address. Trainers report progress through
the control directory after every step; a scrape reads the newest report, so nothing here runs
between scrapes.

``READY_PATH`` on the same port answers 200 once the agent is warm (``Agent.warm``: it could
join a world without importing torch there) and 503 before: the worker container's startup
probe, so a pod that joins a running job turns Ready, and is added to its world, only then.

``push.PUSH_PATH`` on the same port takes the assignments the operator pushes (POST, signed):
the downward-API file sometimes shows a new assignment only at the kubelet's next periodic
sync, and the operator already reaches this port. The request is checked here only for its
length (never more than ``MAX_FILE_BYTES`` is read); ``PushedAssignments.accept`` decides.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from http import HTTPStatus
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIEnvironment

from prometheus_client import make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from .assignment import MAX_FILE_BYTES
from .downtime import FROM_PEERS, FROM_STORAGE
from .push import PUSH_PATH, SIGNATURE_HEADER, PushedAssignments

PEERS_LOST_METRIC = "elastra_worker_peers_lost_world_version"
"""Read by the operator's node liveness task too (a contract, like the exit codes)."""
METRICS_PORT_ENV = "ELASTRA_METRICS_PORT"
DEFAULT_METRICS_PORT = 9400
READY_PATH = "/readyz"
"""The startup probe's path (the operator's worker container names it too: a contract)."""


class WorkerCollector(Collector):
    """Turns the agent's state and the trainer's last progress report into metrics."""

    def __init__(
        self,
        progress: Callable[[], dict[str, Any] | None],
        agent_state: Callable[[], dict[str, Any]],
    ) -> None:
        self._progress = progress
        self._agent_state = agent_state

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """One sample per metric; a metric whose value is unknown yet is left out."""
        state = self._agent_state()
        progress = self._progress() or {}
        gauges = [
            ("elastra_worker_step", "Optimizer steps completed", progress.get("step")),
            ("elastra_worker_loss", "Loss of the last step", progress.get("loss")),
            (
                "elastra_worker_samples_per_second",
                "Global samples per second over the last step",
                progress.get("samplesPerSecond"),
            ),
            (
                "elastra_worker_step_seconds",
                "Wall-clock seconds of the last step",
                progress.get("stepSeconds"),
            ),
            (
                "elastra_worker_tokens_per_second",
                "Global tokens per second over the last step (when the script gives tokens "
                "per sample)",
                progress.get("tokensPerSecond"),
            ),
            (
                "elastra_worker_last_checkpoint_step",
                "Step of the last committed checkpoint",
                progress.get("lastCheckpointStep"),
            ),
            (
                "elastra_worker_goodput",
                "The job's goodput: the fraction of wall time since its first step spent in "
                "steps it kept (resize gaps and steps lost to a failure are not)",
                progress.get("goodput"),
            ),
            (
                "elastra_worker_checkpoint_blocking_seconds",
                "Seconds the newest checkpoint of this world stopped training (staging to host "
                "memory only, for a background save)",
                progress.get("checkpointBlockingSeconds"),
            ),
            (
                "elastra_worker_checkpoint_background_seconds",
                "Seconds the newest background checkpoint took to write and commit while "
                "training went on",
                progress.get("checkpointBackgroundSeconds"),
            ),
            ("elastra_worker_world_version", "World version", state.get("worldVersion")),
            ("elastra_worker_world_size", "Trainer processes in the world", state.get("worldSize")),
            ("elastra_worker_rank", "Global rank of the pod's first trainer", state.get("rank")),
            (
                PEERS_LOST_METRIC,
                "The world version whose collectives failed in this pod because a member is "
                "gone, while the pod waits for the world of survivors (absent otherwise)",
                state.get("peersLostWorldVersion"),
            ),
        ]
        for name, doc, value in gauges:
            if isinstance(value, int | float):
                g = GaugeMetricFamily(name, doc)
                g.add_metric([], float(value))
                yield g
        by_source = [
            (
                "elastra_worker_resize_downtime_seconds",
                "Seconds from the end of the step this world resumed from to the end of its "
                "first step, by where its state came from (absent in a first world)",
                str(progress.get("stateFrom", "")),
                progress.get("resizeDowntimeSeconds"),
            ),
            (
                "elastra_worker_state_loaded_bytes",
                "Bytes of model and optimizer state this world's restore loaded into the pod's "
                "first trainer, by where they came from",
                FROM_STORAGE,
                progress.get("stateBytesFromStorage"),
            ),
            (
                "elastra_worker_state_loaded_bytes",
                "Bytes of model and optimizer state this world's restore loaded into the pod's "
                "first trainer, by where they came from",
                FROM_PEERS,
                progress.get("stateBytesFromPeers"),
            ),
        ]
        families: dict[str, GaugeMetricFamily] = {}
        for name, doc, source, value in by_source:
            if isinstance(value, int | float):
                if name not in families:
                    families[name] = GaugeMetricFamily(name, doc, labels=["state_from"])
                families[name].add_metric([source], float(value))
        yield from families.values()
        c = CounterMetricFamily(
            "elastra_worker_trainer_starts", "Trainer processes started by this agent"
        )
        c.add_metric([], float(state.get("trainerStarts", 0)))
        yield c
        resizes = CounterMetricFamily(
            "elastra_worker_resizes",
            "World changes this pod stayed in, by how its trainers crossed them: in memory "
            "(same processes) or restarted (new processes, state through the checkpoint)",
            labels=["path"],
        )
        resizes.add_metric(["memory"], float(state.get("resizesInMemory", 0)))
        resizes.add_metric(["restart"], float(state.get("resizesRestarted", 0)))
        yield resizes


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in flight never holds the agent's exit


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No line per request: the kubelet probes every second while the pod starts."""


def _push(environ: WSGIEnvironment, pushes: PushedAssignments | None) -> tuple[int, str]:
    """The answer to a request on ``PUSH_PATH``: the body goes to ``pushes.accept`` once its
    declared length is known and within ``MAX_FILE_BYTES`` (nothing more is ever read)."""
    if pushes is None:
        return 404, "this agent takes no pushed assignments (no assignment file or no POD_UID)"
    if environ.get("REQUEST_METHOD") != "POST":
        return 405, f"{PUSH_PATH} takes POST only"
    declared = environ.get("CONTENT_LENGTH") or ""
    if not declared:
        return pushes.refuse(411, "Content-Length required")
    if not (declared.isascii() and declared.isdigit()) or len(declared) > 20:
        return pushes.refuse(400, f"invalid Content-Length {declared[:40]!r}")
    length = int(declared)
    if length > MAX_FILE_BYTES:
        return pushes.refuse(413, f"assignment larger than {MAX_FILE_BYTES} bytes")
    body: bytes = environ["wsgi.input"].read(length) if length else b""
    if len(body) != length:
        return pushes.refuse(400, f"body of {len(body)} bytes, Content-Length says {length}")
    header = "HTTP_" + SIGNATURE_HEADER.upper().replace("-", "_")
    return pushes.accept(body, environ.get(header))


def serve(
    port: int,
    collector: WorkerCollector,
    *,
    warm: Callable[[], bool],
    pushes: PushedAssignments | None = None,
) -> CollectorRegistry:
    """Start the HTTP endpoint in a daemon thread: ``READY_PATH`` answers whether ``warm()``,
    ``PUSH_PATH`` takes pushed assignments into ``pushes`` (when given), any other path the
    metrics; return the metrics' registry."""
    registry = CollectorRegistry()
    registry.register(collector)
    metrics = make_wsgi_app(registry)

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO")
        if path == PUSH_PATH:
            code, message = _push(environ, pushes)
            headers = [("Content-Type", "text/plain; charset=utf-8")]
            if code == 405:
                headers.append(("Allow", "POST"))
            start_response(f"{code} {HTTPStatus(code).phrase}", headers)
            return [message.encode() + b"\n"]
        if path != READY_PATH:
            page: Iterable[bytes] = metrics(environ, start_response)
            return page
        ready = warm()
        status = "200 OK" if ready else "503 Service Unavailable"
        start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
        return [b"warm\n" if ready else b"starting: torch is not imported yet\n"]

    server = make_server("0.0.0.0", port, app, _Server, _Quiet)  # every address: the kubelet
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return registry
