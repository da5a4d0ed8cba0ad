"""Start the operator: the informers, Kopf with Elastra's handlers, one identity, metrics
and liveness.

The informers (nodes, pods, TrainingJobs, PriorityClasses; see ``snapshot``) run as tasks
beside Kopf and wake the job loops and the node warnings (``nodewarnings``: a Warning Event,
once, on a Node whose GPUs cannot be planned with); the node liveness task (``nodeliveness``)
watches the node Leases and declares a node lost within seconds when its Lease is overdue and
its workers silent; Kopf runs the Workload handler, peering and the liveness endpoint.

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
import dataclasses
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import kopf
from prometheus_client import start_http_server

from elastra.controller.decide.assignment_key import signing_key
from elastra.controller.decide.placeholders import priority_class
from elastra.controller.engine import metrics
from elastra.controller.engine.agents import AgentClient
from elastra.controller.engine.handlers import Runtime, register
from elastra.controller.engine.leader import LeaderElector, identity
from elastra.controller.engine.nodeliveness import NodeLiveness
from elastra.controller.engine.nodewarnings import NodeWarnings
from elastra.controller.engine.progress import ProgressReader
from elastra.controller.engine.push import AssignmentPusher
from elastra.controller.engine.snapshot import ClusterSnapshot
from elastra.controller.settings import OperatorSettings
from elastra.elastic.share import Scope
from elastra.kube import resources
from elastra.kube.client import ApiError, Kube
from elastra.kube.config import Connection
from elastra.kube.credentials import REFRESH_MARGIN

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
    create_lease: bool = True
    """Create that Lease if missing (``False``: the Helm chart owns it)."""
    json_logs: bool = True
    verbose: bool = False
    assignment_key: bytes = b""
    """The seed of the key pair that signs pushed assignments (``--assignment-key-file``);
    empty: a key pair of this run only (``_assignment_pusher``)."""


async def _tell_synced(snapshot: ClusterSnapshot) -> None:
    """Set ``elastra_caches_synced`` once every informer has its first list."""
    await snapshot.wait_synced()
    metrics.SYNCED.set(1)


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
    leader = LeaderElector(
        kube=kube, namespace=options.lease_namespace, me=identity(), create=options.create_lease
    )
    agents = AgentClient()
    progress = ProgressReader(options.settings, agents)
    pusher = _assignment_pusher(options, agents)
    snapshot = ClusterSnapshot.watching(
        kube,
        watch_timeout_s=options.settings.watch_timeout.total_seconds(),
        priority_classes=options.settings.sharing is not Scope.OFF,
    )
    # Every worker pod gets the public key of the pushes' signatures in its environment.
    settings = dataclasses.replace(options.settings, assignment_public_key=pusher.public_key)
    rt = Runtime(
        kube=kube,
        settings=await _with_request_class(kube, settings),
        snapshot=snapshot,
        leader=leader,
        progress=progress,
        pusher=pusher,
    )
    rt.listen()
    electing = asyncio.create_task(leader.run(), name="leader election")
    informing = [
        asyncio.create_task(i.run(), name=f"informer {i.path}") for i in snapshot.informers
    ]
    informing.append(asyncio.create_task(_tell_synced(snapshot), name="caches synced"))
    warnings = NodeWarnings(kube=kube, snapshot=snapshot, leader=leader)
    warnings.listen()
    informing.append(asyncio.create_task(warnings.run(), name="node warnings"))
    liveness = NodeLiveness.watching(
        kube, snapshot, leader=leader, settings=rt.settings, wake_jobs=rt.poke_all, agents=agents
    )
    informing.append(asyncio.create_task(liveness.run(), name="node liveness"))
    rt.background = [electing, *informing]
    registry = kopf.OperatorRegistry()
    register(registry)
    _register_login(registry, options.connection)
    namespaces = [options.settings.namespace] if options.settings.namespace else []
    endpoint = f"http://0.0.0.0:{options.health_port}/healthz" if options.health_port else None
    try:
        await kopf.operator(
            registry=registry,
            settings=_kopf_settings(options),
            clusterwide=not namespaces,
            namespaces=namespaces,
            standalone=options.peering is None,
            peering_name=options.peering,
            priority=options.priority,
            liveness_endpoint=endpoint,
            memo=kopf.Memo(runtime=rt),
            stop_flag=stop,
        )
    finally:
        electing.cancel()
        for task in informing:
            task.cancel()
        with contextlib.suppress(ApiError, OSError):
            await leader.release()
        await rt.stop_all()
        await pusher.close()
        await agents.close()
        await kube.close()


def _assignment_pusher(options: RunOptions, agents: AgentClient) -> AssignmentPusher:
    """The pusher, its key pair the seed's or, without one, a key pair of this run: then a
    restarted operator's pushes to the pods of jobs it found running are refused (their spec
    holds the old public key), and those pods learn assignments from their file alone."""
    if not options.assignment_key:
        log.info(
            "no --assignment-key-file: assignments pushed to workers are signed with a key of "
            "this run only; after a restart, jobs already running learn theirs from the pod "
            "file alone (the Helm chart gives the operator a lasting key)"
        )
    return AssignmentPusher(options.settings, signing_key(options.assignment_key), agents)


async def _with_request_class(kube: Kube, settings: OperatorSettings) -> OperatorSettings:
    """``settings``, with capacity requests on only if their PriorityClass exists or could be
    created (``placeholders.priority_class``): without it the API server refuses every one, so
    the operator says so once and runs without them."""
    if not settings.capacity_requests:
        return settings
    body = priority_class(settings)
    try:
        await resources.ensure_priority_class(kube, body)
    except ApiError as err:
        log.warning(
            "capacity requests are off: PriorityClass %s does not exist and could not be "
            "created (%s); create it (the Helm chart does) or run with --capacity-requests=off",
            body["metadata"]["name"],
            err.message,
        )
        return dataclasses.replace(settings, capacity_requests=False)
    return settings


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
    """Kopf logs in with Elastra's credentials, renewed as they expire.

    ``expiration`` makes Kopf call this again before an exec plugin's token dies; Kopf also
    calls it after a 401. Any call after the first therefore means "these were refused or
    are old": the credentials are invalidated, so an exec plugin runs again and a token file
    is re-read.
    """
    calls = 0

    def login(**_: Any) -> kopf.ConnectionInfo:
        nonlocal calls
        calls += 1
        if calls > 1:
            connection.credentials.invalidate()
        identity = connection.credentials.identity()
        return kopf.ConnectionInfo(
            server=connection.server,
            ca_data=connection.ca_pem,
            insecure=connection.insecure or None,
            certificate_data=identity.cert_pem,
            private_key_data=identity.key_pem,
            token=identity.token,
            default_namespace=connection.namespace,
            expiration=identity.expires - REFRESH_MARGIN if identity.expires else None,
        )

    kopf.on.login(registry=registry)(login)
