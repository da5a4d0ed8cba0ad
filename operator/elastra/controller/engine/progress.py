"""Training progress for ``status.progress``, read from the world's rank-0 worker.

Workers have no API credentials (``automountServiceAccountToken: false``), so they cannot
write status themselves; each exports Prometheus gauges (step, samples/s, last committed
checkpoint, world version) on ``settings.metrics_port``. The operator reads rank 0's, at most
once per ``interval`` per job, and never a simulated pod's (nodes labelled with one of
``settings.skip_metrics_labels``, e.g. kwok's, whose pod addresses belong to nobody). A worker
that does not answer leaves the last recorded progress in place.

A worker is not trusted: a page larger than ``MAX_METRICS_BYTES`` is not read to the end (the
sample is ignored), and values that are not finite counts are ignored (``parse_metrics``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from elastra.api import TrainingJob
from elastra.controller.decide.observe import (
    WorkerProgress,
    agent_url,
    parse_metrics,
    rank0_address,
)
from elastra.controller.engine.agents import AgentClient, deadline
from elastra.controller.settings import OperatorSettings

JsonDict = Mapping[str, Any]
log = logging.getLogger(__name__)

MAX_METRICS_BYTES = 1 << 20
"""A worker's page is a few hundred bytes; reading stops (and the sample is ignored) past this."""
_CHUNK = 64 << 10


async def fetch_metrics(
    session: aiohttp.ClientSession, url: str, *, timeout: aiohttp.ClientTimeout | None = None
) -> WorkerProgress | None:
    """Rank 0's progress from ``url``; None when it does not answer 200 or sends too much.

    Reads at most ``MAX_METRICS_BYTES`` (plus one chunk), so a broken or hostile worker cannot
    make the operator hold its page in memory.
    """
    async with session.get(url, timeout=timeout) as reply:
        if reply.status != 200:
            return None
        if (reply.content_length or 0) > MAX_METRICS_BYTES:
            log.warning("%s: metrics page of %d bytes ignored", url, reply.content_length)
            return None
        body = bytearray()
        async for chunk in reply.content.iter_chunked(_CHUNK):
            body += chunk
            if len(body) > MAX_METRICS_BYTES:
                log.warning("%s: metrics page over %d bytes ignored", url, MAX_METRICS_BYTES)
                return None
    return parse_metrics(body.decode("utf-8", errors="replace"))


@dataclass
class ProgressReader:
    """Reads rank 0's metrics for each job, no more often than ``interval_s``."""

    settings: OperatorSettings
    agents: AgentClient
    interval_s: float = 30.0
    timeout_s: float = 2.0
    _last: dict[tuple[str, str], float] = field(default_factory=dict)

    async def read(
        self, job: TrainingJob, pods: Sequence[JsonDict], nodes: Sequence[JsonDict]
    ) -> tuple[WorkerProgress | None, bool]:
        """(progress if read now, whether this job's progress can be read at all)."""
        address = rank0_address(job, pods, nodes, self.settings.skip_metrics_labels)
        if address is None:
            return None, False
        key = (job.metadata.namespace or "", job.metadata.name)
        now = time.monotonic()
        if now - self._last.get(key, -1e9) < self.interval_s:
            return None, True
        self._last[key] = now
        url = agent_url(address, self.settings.metrics_port, "/metrics")
        try:
            page = await fetch_metrics(self.agents.session, url, timeout=deadline(self.timeout_s))
            return page, True
        except (TimeoutError, aiohttp.ClientError, OSError):
            return None, True

    def forget(self, namespace: str, name: str) -> None:
        """A deleted job's timer."""
        self._last.pop((namespace, name), None)
