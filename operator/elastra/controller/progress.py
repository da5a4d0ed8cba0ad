"""Training progress for ``status.progress``, read from the world's rank-0 worker.

Workers have no API credentials (``automountServiceAccountToken: false``), so they cannot
write status themselves; each exports Prometheus gauges (step, samples/s, last committed
checkpoint, world version) on ``settings.metrics_port``. The operator reads rank 0's, at most
once per ``interval`` per job, and never a simulated pod's (nodes labelled with one of
``settings.skip_metrics_labels``, e.g. kwok's, whose pod addresses belong to nobody). A worker
that does not answer leaves the last recorded progress in place.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from elastra.api import TrainingJob
from elastra.controller.observe import WorkerProgress, parse_metrics, rank0_address
from elastra.controller.settings import OperatorSettings

JsonDict = Mapping[str, Any]


@dataclass
class ProgressReader:
    """Reads rank 0's metrics for each job, no more often than ``interval_s``."""

    settings: OperatorSettings
    interval_s: float = 30.0
    timeout_s: float = 2.0
    _last: dict[tuple[str, str], float] = field(default_factory=dict)
    _session: aiohttp.ClientSession | None = None

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
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            )
        host = f"[{address}]" if ":" in address else address
        url = f"http://{host}:{self.settings.metrics_port}/metrics"
        try:
            async with self._session.get(url) as reply:
                if reply.status != 200:
                    return None, True
                return parse_metrics(await reply.text()), True
        except (TimeoutError, aiohttp.ClientError, OSError):
            return None, True

    def forget(self, namespace: str, name: str) -> None:
        """A deleted job's timer."""
        self._last.pop((namespace, name), None)

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
