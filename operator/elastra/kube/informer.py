"""A watch-fed cache of one collection: list once, then follow a watch from that list.

Every reconcile pass used to read the job, list its pods and (once a second at most) list all
nodes, pods and TrainingJobs: a steady cluster of a few hundred jobs cost the API server
thousands of requests a minute to learn that nothing had changed. An informer pays one list
at start and one long watch; passes read its store, which costs nothing.

The loop: list (following ``continue`` pages), replace the store, tell the listeners what
differs from the store before, mark the informer synced, then watch from the list's
resourceVersion with bookmarks (so a quiet collection's resourceVersion still moves and a
reconnect does not fall out of the server's window). A watch that ends (its timeout) is
reopened from the last resourceVersion seen; a 410 Gone means that version has been
compacted away, so the informer lists again; any other failure lists again after a backoff
that doubles up to ``BACKOFF_MAX_S``. The store is replaced whole after a list, never
emptied first, so readers never see a half-listed collection.

Listeners are plain callbacks run in the informer's task, told ``(type, old, new)`` with
``type`` one of ADDED, MODIFIED, DELETED, and only when what the store keeps changed: a
``transform`` that drops heartbeats (a node's ``slim_node``) makes those events silent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from elastra.kube.client import ApiError, JsonDict, Kube

log = logging.getLogger("elastra.informer")

Key = tuple[str, str]
Listener = Callable[[str, JsonDict | None, JsonDict | None], None]
BACKOFF_MIN_S = 0.5
BACKOFF_MAX_S = 30.0
FAILURES = (ApiError, aiohttp.ClientError, TimeoutError, OSError, ValueError)
"""What ends a list or a watch: the API, the network, a stream that is not JSON."""


def key_of(obj: Mapping[str, Any]) -> Key:
    """(namespace, name); cluster-scoped objects have namespace ``""``."""
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def version_of(obj: Mapping[str, Any] | None) -> str:
    """An object's resourceVersion (``""`` when the store's transform dropped it)."""
    return str(((obj or {}).get("metadata") or {}).get("resourceVersion") or "")


def without_managed_fields(obj: JsonDict) -> JsonDict:
    """The object without ``metadata.managedFields`` (often half its size; never read)."""
    meta = obj.get("metadata") or {}
    if "managedFields" not in meta:
        return obj
    return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


@dataclass
class Informer:
    """The cached objects of one collection path, kept current by a watch."""

    kube: Kube | None
    path: str
    transform: Callable[[JsonDict], JsonDict] = without_managed_fields
    index: Callable[[JsonDict], Hashable | None] | None = None
    """Groups objects for ``indexed`` (a pod's job); ``None``: not in any group."""
    watch_timeout_s: float = 600.0
    """Each watch asks the server to end it after between half of this and all of it (the
    jitter spreads reconnects); the informer then reopens it from where it was."""
    listeners: list[Listener] = field(default_factory=list)
    version: int = 0
    """Bumped on every change to the store: readers rebuild what they derive only then."""
    lists: int = 0
    """Completed lists: a reader can tell "listed since" (a relist tells the whole truth)."""
    _store: dict[Key, JsonDict] = field(default_factory=dict)
    _groups: dict[Hashable, dict[Key, JsonDict]] = field(default_factory=dict)
    _resource_version: str = ""
    _synced: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def synced(self) -> bool:
        """True once the first list is in the store."""
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        """Return once the first list is in the store."""
        await self._synced.wait()

    def items(self) -> Iterable[JsonDict]:
        """Every cached object (a view: copy it before awaiting anything)."""
        return self._store.values()

    def get(self, namespace: str, name: str) -> JsonDict | None:
        """One cached object, or ``None``."""
        return self._store.get((namespace, name))

    def indexed(self, group: Hashable) -> list[JsonDict]:
        """The cached objects whose ``index`` is ``group``."""
        return list(self._groups.get(group, {}).values())

    async def run(self) -> None:
        """List and watch until cancelled; never raises for API or network trouble."""
        failures = 0
        while True:
            try:
                await self._list()
                failures = 0
                await self._watch()
            except FAILURES as err:
                failures += 1
                delay = min(BACKOFF_MAX_S, BACKOFF_MIN_S * 2 ** (failures - 1))
                log.warning("%s: %s; listing again in %.1f s", self.path, err, delay)
                await asyncio.sleep(delay)

    async def _list(self) -> None:
        assert self.kube is not None
        items, resource_version = await self.kube.list_versioned(self.path)
        self.replace(items, resource_version)

    async def _watch(self) -> None:
        """Follow watches from the list's version; return when it is gone (410): list again."""
        assert self.kube is not None
        while True:
            timeout = int(self.watch_timeout_s * random.uniform(0.5, 1.0))
            params = {
                "watch": "1",
                "allowWatchBookmarks": "true",
                "resourceVersion": self._resource_version,
                "timeoutSeconds": str(max(timeout, 1)),
            }
            opened, events = time.monotonic(), 0
            stream = self.kube.watch(self.path, params, read_timeout_s=timeout + 90.0)
            try:
                async with contextlib.aclosing(stream):
                    async for event in stream:
                        events += 1
                        if not self.apply(event):
                            return
            except ApiError as err:
                if err.status == 410:  # refused at once: the version is already compacted
                    return
                raise
            if events == 0 and time.monotonic() - opened < 1.0:
                await asyncio.sleep(BACKOFF_MIN_S)  # a server that ends watches at once

    def apply(self, event: Mapping[str, Any]) -> bool:
        """Apply one watch event; ``False`` when the watch's version is gone (list again)."""
        kind = str(event.get("type") or "")
        obj = event.get("object") or {}
        if kind == "ERROR":
            code = int(obj.get("code") or 0)
            if code == 410:
                log.info("%s: watch version gone; listing again", self.path)
                return False
            raise ApiError(code, str(obj.get("reason") or ""), str(obj.get("message") or ""))
        self._resource_version = version_of(obj) or self._resource_version
        if kind == "DELETED":
            self._remove(key_of(obj))
        elif kind in ("ADDED", "MODIFIED"):
            self._put(self.transform(obj))
        return True

    def replace(self, items: Iterable[JsonDict], resource_version: str) -> None:
        """Take a fresh list as the store; tell listeners what differs from the old one."""
        fresh = {key_of(o): o for o in (self.transform(i) for i in items)}
        gone = [k for k in self._store if k not in fresh]
        for key in gone:
            self._remove(key)
        for obj in fresh.values():
            self._put(obj)
        self._resource_version = resource_version
        self.lists += 1
        self._synced.set()

    def written(self, before: str, after: JsonDict) -> None:
        """Our own write returned ``after``: store it if the cache still holds ``before``.

        A pass that wrote a job's status or patched a pod would otherwise read the old
        object until the watch brings the new one, and redo its write (or see a conflict).
        Only the version the write started from is replaced, so a newer one the watch already
        delivered is kept; the watch's copy of ``after`` arrives later and changes nothing.
        """
        obj = self.transform(after)
        current = self._store.get(key_of(obj))
        if current is not None and version_of(current) == before and before:
            self._put(obj, notify=False)

    def _put(self, obj: JsonDict, *, notify: bool = True) -> None:
        key = key_of(obj)
        old = self._store.get(key)
        if old == obj:
            return
        self._store[key] = obj
        self._regroup(key, old, obj)
        self.version += 1
        if notify:
            self._tell("ADDED" if old is None else "MODIFIED", old, obj)

    def _remove(self, key: Key) -> None:
        old = self._store.pop(key, None)
        if old is None:
            return
        self._regroup(key, old, None)
        self.version += 1
        self._tell("DELETED", old, None)

    def _regroup(self, key: Key, old: JsonDict | None, new: JsonDict | None) -> None:
        if self.index is None:
            return
        before = self.index(old) if old is not None else None
        after = self.index(new) if new is not None else None
        if before is not None and before != after:
            group = self._groups.get(before, {})
            group.pop(key, None)
            if not group:
                self._groups.pop(before, None)
        if after is not None and new is not None:
            self._groups.setdefault(after, {})[key] = new

    def _tell(self, kind: str, old: JsonDict | None, new: JsonDict | None) -> None:
        for listener in self.listeners:
            try:
                listener(kind, old, new)
            except Exception:
                log.exception("%s: a listener failed on %s", self.path, kind)
