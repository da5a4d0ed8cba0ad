"""One writer at a time: a coordination.k8s.io Lease that job loops check before each pass.

Kopf peering pauses Kopf's own handlers when an operator of higher priority is alive, but
Elastra's job loops are its own tasks and would keep writing. So the loops also hold a Lease:
only the holder reconciles. The holder renews it every ``renew`` seconds; another operator
takes it over once ``duration`` has passed without renewal (a killed operator's successor
waits at most that long). Both writes carry the Lease's resourceVersion, so two operators
racing for an expired Lease cannot both win.

The Lease has one owner. Installed by the Helm chart, the chart creates it (so that
``helm uninstall`` removes it) and the operator, started with ``--no-create-lease``, only takes
and renews it: it may not even create Leases (the chart's Role grants get and update only).
Before this, both created it, and on a quiet machine the operator pod started and created the
Lease while Helm was still creating the release's objects, so ``helm install`` failed with
"already exists". Run by hand (``elastra run``), the operator creates the Lease itself.

The decision (``can_take``) is pure and clock-injected; ``LeaderElector`` does the I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from elastra.controller.engine import metrics
from elastra.kube import resources
from elastra.kube.client import ApiError, ConflictError, JsonDict, Kube

log = logging.getLogger("elastra.leader")

LEASE_NAME = "elastra-operator"


def identity() -> str:
    """A name for this operator process: host, pid and a random suffix."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def _time(value: Any) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None


def can_take(lease: dict[str, Any] | None, me: str, now: datetime) -> bool:
    """May ``me`` hold this Lease now? Yes if unheld, held by me, or expired."""
    if lease is None:
        return True
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity")
    if not holder or holder == me:
        return True
    renewed = _time(spec.get("renewTime")) or _time(spec.get("acquireTime"))
    duration = timedelta(seconds=int(spec.get("leaseDurationSeconds") or 0))
    return renewed is None or now - renewed > duration


@dataclass
class LeaderElector:
    """Acquire and renew the Lease; ``leading`` says whether this process may write."""

    kube: Kube
    namespace: str
    me: str
    duration: timedelta = timedelta(seconds=15)
    renew: timedelta = timedelta(seconds=5)
    create: bool = True
    """Create the Lease when it is missing; ``False`` when the Helm chart owns it."""
    leading: bool = False
    _held: JsonDict | None = None
    """The Lease as this operator last wrote it: the next renewal writes on top of it without
    reading it first, as client-go's leader election does (one request per renewal instead of
    two); a write that finds it changed meets its resourceVersion precondition, and the
    attempt reads the Lease and decides again."""
    _told: bool = False
    _told_missing: bool = False

    async def run(self) -> None:
        """Loop forever (cancel to stop); never raises for API trouble, it just retries."""
        while True:
            try:
                self._set(await self.try_acquire(datetime.now(UTC)))
            except (ApiError, OSError, TimeoutError) as err:
                log.warning("lease %s/%s: %s", self.namespace, LEASE_NAME, err)
                self._set(False)
            await asyncio.sleep(self.renew.total_seconds())

    async def try_acquire(self, now: datetime) -> bool:
        """One attempt to take or renew the Lease."""
        held, self._held = self._held, None
        if held is not None and await self._renew(held, now):
            return True
        lease = await resources.get_lease(self.kube, self.namespace, LEASE_NAME)
        if lease is None and not self.create:
            self._missing()
            return False
        if not can_take(lease, self.me, now):
            return False
        stamp = now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        spec: dict[str, Any] = {
            "holderIdentity": self.me,
            "leaseDurationSeconds": int(self.duration.total_seconds()),
            "renewTime": stamp,
        }
        try:
            if lease is None:
                spec["acquireTime"] = stamp
                created = await resources.create_lease(self.kube, self.namespace, LEASE_NAME, spec)
                self._held = created
                return created is not None
            else:
                if (lease.get("spec") or {}).get("holderIdentity") != self.me:
                    spec["acquireTime"] = stamp
                    spec["leaseTransitions"] = (
                        int((lease.get("spec") or {}).get("leaseTransitions") or 0) + 1
                    )
                self._held = await resources.replace_lease(self.kube, {**lease, "spec": spec})
        except ConflictError:
            return False
        return True

    async def _renew(self, held: JsonDict, now: datetime) -> bool:
        """Renew the Lease as last written, unread; ``False``: someone wrote it since."""
        spec = {**(held.get("spec") or {}), "renewTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}
        try:
            self._held = await resources.replace_lease(self.kube, {**held, "spec": spec})
        except ConflictError:
            return False
        return True

    async def release(self) -> None:
        """Give the Lease up on a clean stop, so a successor need not wait for it to expire."""
        if not self.leading:
            return
        self.leading = False
        self._held = None
        metrics.LEADER.set(0)
        lease = await resources.get_lease(self.kube, self.namespace, LEASE_NAME)
        if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.me:
            return
        spec = {**(lease.get("spec") or {}), "holderIdentity": None}
        with contextlib.suppress(ConflictError):
            await resources.replace_lease(self.kube, {**lease, "spec": spec})

    def _missing(self) -> None:
        if not self._told_missing:
            self._told_missing = True
            log.warning(
                "lease %s/%s does not exist; the Helm chart creates it (this operator runs "
                "with --no-create-lease): standing by until it does",
                self.namespace,
                LEASE_NAME,
            )

    def _set(self, leading: bool) -> None:
        if leading != self.leading or not self._told:
            self._told = True
            log.info("lease %s/%s: %s", self.namespace, LEASE_NAME,
                     "acquired, reconciling" if leading else "not held, standing by")  # fmt: skip
        self.leading = leading
        metrics.LEADER.set(1 if leading else 0)
