"""Each new assignment, pushed to its pod's agent as soon as the pod's patch is written.

The annotation stays the record, and the pod's downward-API file its durable copy; but the
kubelet sometimes remounts that file with the old content and writes the new one only at the
pod's next periodic sync, 10 to 90 s later (``decide.assignment_key``). So after a patch
that changes a pod's assignment, the operator also POSTs the same JSON to the pod's agent on
the metrics port it already reads progress from, signed with the operator's private key for
that pod's uid. The agent takes it only when it is a newer world version than its file says
(``elastra_worker.push``).

A push is best effort and never holds a pass: it runs as a task beside it, to pods running
on real nodes only (never to a simulated node's address, like the progress reader), and its
failure changes nothing but the time the pod learns its assignment: the file still brings it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from elastra.controller.decide.manifests import ANNOTATION_ASSIGNMENT
from elastra.controller.decide.observe import agent_url, pod_address
from elastra.controller.engine import metrics
from elastra.controller.engine.agents import AgentClient, deadline
from elastra.controller.engine.snapshot import job_of
from elastra.controller.settings import OperatorSettings
from elastra_worker.push import NOT_NEWER, PUSH_PATH, SIGNATURE_HEADER, TAKEN, public_key_text, sign

JsonDict = Mapping[str, Any]
NodeOf = Callable[[str], JsonDict | None]
"""The cached node of a name (``None``: not known)."""
PodPush = Callable[[JsonDict | None], bool]
"""Push the assignment of a pod as a patch's answer shows it (``None``: the pod is gone);
whether a push was started (none where no agent of the pod can answer)."""
MAX_ANSWER_BYTES = 512
log = logging.getLogger(__name__)


@dataclass
class AssignmentPusher:
    """Signs and sends pushed assignments; one per operator, over the agents' shared session."""

    settings: OperatorSettings
    key: Ed25519PrivateKey
    """What signs every push (``decide.assignment_key.signing_key``)."""
    agents: AgentClient
    timeout_s: float = 2.0
    _inflight: set[asyncio.Task[None]] = field(default_factory=set)
    _refusals_logged: set[tuple[str, str]] = field(default_factory=set)
    """Jobs (namespace, name) whose refused pushes were logged: a job whose pods hold another
    key (started by an operator run without ``--assignment-key-file``) refuses every push."""

    @property
    def public_key(self) -> str:
        """The public key every worker pod gets in its environment, to check pushes with."""
        return public_key_text(self.key)

    def to_pods(self, node_of: NodeOf) -> PodPush:
        """What pushes the assignments of a pass's pods, each signed for the pod's uid."""

        def push(pod: JsonDict | None) -> bool:
            if pod is None:
                return False
            node = node_of(str((pod.get("spec") or {}).get("nodeName") or ""))
            address = pod_address(pod, node, self.settings.skip_metrics_labels)
            meta = pod.get("metadata") or {}
            body = str((meta.get("annotations") or {}).get(ANNOTATION_ASSIGNMENT) or "")
            job = job_of(pod)
            if address is None or not body or job is None:
                return False
            name = str(meta.get("name") or "")
            task = asyncio.create_task(
                self._send(
                    agent_url(address, self.settings.metrics_port, PUSH_PATH),
                    body.encode(),
                    sign(self.key, str(meta.get("uid") or ""), body.encode()),
                    job=job,
                    pod=name,
                ),
                name=f"push assignment {name}",
            )
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)
            return True

        return push

    async def _send(
        self, url: str, body: bytes, signed: str, *, job: tuple[str, str], pod: str
    ) -> None:
        """POST one assignment; count and log how it went, raise nothing."""
        where = f"{job[0]}/{pod}"
        headers = {SIGNATURE_HEADER: signed, "Content-Type": "application/json"}
        post = self.agents.session.post
        try:
            async with post(
                url, data=body, headers=headers, timeout=deadline(self.timeout_s)
            ) as answer:
                said = (await answer.content.read(MAX_ANSWER_BYTES)).decode(errors="replace")
                status = answer.status
        except (TimeoutError, aiohttp.ClientError, OSError) as err:
            metrics.ASSIGNMENT_PUSHES.labels(result="unreachable").inc()
            log.debug("pod %s: assignment not pushed (%s); its file brings it", where, err)
            return
        result = _result(status, said)
        metrics.ASSIGNMENT_PUSHES.labels(result=result).inc()
        if result != "refused":
            log.debug("pod %s: assignment pushed: %s", where, said.strip())
        elif job in self._refusals_logged:
            log.debug("pod %s: its agent refused a pushed assignment (%d)", where, status)
        else:
            self._refusals_logged.add(job)
            log.info(
                "pod %s: its agent refused a pushed assignment (%d %s); its file brings it "
                "(later refusals in job %s are logged at DEBUG)",
                where, status, said.strip(), job[1],
            )  # fmt: skip

    def forget(self, namespace: str, name: str) -> None:
        """Drop what was kept about a deleted job."""
        self._refusals_logged.discard((namespace, name))

    async def close(self) -> None:
        """End the pushes in flight (the agents' session is closed by its owner)."""
        for task in list(self._inflight):
            task.cancel()
        await asyncio.gather(*self._inflight, return_exceptions=True)


def _result(status: int, said: str) -> str:
    """How an agent answered a push, for ``ASSIGNMENT_PUSHES``: an agent from before pushes
    existed answers 200 with its metrics page, which is a refusal, not a delivery."""
    if status == 200 and said.startswith(TAKEN):
        return "taken"
    if status == 200 and said.startswith(NOT_NEWER):
        return "stale"
    return "refused"
