"""Start the operator: Kopf with Elastra's handlers, one identity, metrics and liveness.

Kopf's own watch streams log in with the same credentials as Elastra's API client (a login
handler hands Kopf the connection ``elastra.kube.config`` loaded), so the operator never
depends on which optional client library Kopf would otherwise pick.

One active replica: the Helm chart runs a single replica with the Recreate strategy; every
operator's job loops write only while holding the ``elastra-operator`` Lease (see
``leader``), and Kopf peering (``--peering``) also pauses Kopf's own handlers in an operator
of lower priority. Priorities: the Deployment's operator runs at ``--priority 100``; a
developer's ``elastra run`` on a laptop defaults to 0, so it pauses instead of fighting the
in-cluster one; equal priorities both pause, which Kopf reports loudly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import kopf
from prometheus_client import start_http_server

from elastra.controller.handlers import Runtime, register
from elastra.controller.leader import LeaderElector, identity
from elastra.controller.progress import ProgressReader
from elastra.controller.reconcile import ClusterSnapshot
from elastra.controller.settings import OperatorSettings
from elastra.kube.client import ApiError, Kube
from elastra.kube.config import Connection

log = logging.getLogger("elastra.operator")


@dataclass(frozen=True)
class RunOptions:
    """How ``elastra run`` was asked to run."""

    connection: Connection
    settings: OperatorSettings
    metrics_port: int = 8080
    health_port: int = 8081
    peering: str | None = None
    priority: int = 0
    lease_namespace: str = "default"
    """Namespace of the ``elastra-operator`` Lease that picks the one writing operator."""
    json_logs: bool = True
    verbose: bool = False


def run(options: RunOptions, *, stop: asyncio.Event | None = None) -> None:
    """Run the operator until interrupted (or ``stop`` is set)."""
    kopf.configure(
        verbose=options.verbose,
        log_format=kopf.LogFormat.JSON if options.json_logs else kopf.LogFormat.PLAIN,
    )
    if options.metrics_port:
        start_http_server(options.metrics_port)
    asyncio.run(serve(options, stop=stop))


async def serve(options: RunOptions, *, stop: asyncio.Event | None = None) -> None:
    """The operator as a coroutine (tests run it in a thread with their own stop flag)."""
    kube = Kube(options.connection)
    leader = LeaderElector(kube=kube, namespace=options.lease_namespace, me=identity())
    progress = ProgressReader(options.settings)
    rt = Runtime(
        kube=kube,
        settings=options.settings,
        snapshot=ClusterSnapshot(kube),
        leader=leader,
        progress=progress,
    )
    electing = asyncio.create_task(leader.run(), name="leader election")
    registry = kopf.OperatorRegistry()
    register(registry)
    _register_login(registry, options.connection)
    namespaces = [options.settings.namespace] if options.settings.namespace else []
    liveness = f"http://0.0.0.0:{options.health_port}/healthz" if options.health_port else None
    try:
        await kopf.operator(
            registry=registry,
            settings=_kopf_settings(options),
            clusterwide=not namespaces,
            namespaces=namespaces,
            standalone=options.peering is None,
            peering_name=options.peering,
            priority=options.priority,
            liveness_endpoint=liveness,
            memo=kopf.Memo(runtime=rt),
            stop_flag=stop,
        )
    finally:
        electing.cancel()
        with contextlib.suppress(ApiError, OSError):
            await leader.release()
        for key in list(rt.loops):
            await rt.stop(key)
        await progress.close()
        await kube.close()


class _NoDiffBase(kopf.DiffBaseStorage):
    """Kopf's diff base, switched off: Elastra registers only event handlers.

    Before handling any event Kopf builds the object's "essence" (a deep copy of the whole
    body) to diff it for change handlers. Elastra has none, so the diff is never read; on a
    cluster of a thousand kwok nodes heartbeating and thousands of pods changing, those deep
    copies were a third of the operator's CPU. Nothing is stored, so nothing is written.
    """

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None
    ) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def _kopf_settings(options: RunOptions) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.persistence.diffbase_storage = _NoDiffBase()
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 60
    if options.peering is not None:
        settings.peering.name = options.peering
        settings.peering.priority = options.priority
        settings.peering.mandatory = True
        settings.peering.clusterwide = options.settings.namespace is None
    return settings


def _register_login(registry: Any, connection: Connection) -> None:
    def login(**_: Any) -> kopf.ConnectionInfo:
        token = connection.auth_headers().get("Authorization", "").removeprefix("Bearer ")
        return kopf.ConnectionInfo(
            server=connection.server,
            ca_data=connection.ca_pem,
            certificate_data=connection.client_cert_pem,
            private_key_data=connection.client_key_pem,
            token=token or None,
            default_namespace=connection.namespace,
        )

    kopf.on.login(registry=registry)(login)
