"""Caches for values derived from the shared cluster listings.

Every job's pass derives the same things (parsed nodes, node health, pod usage, job claims)
from the listings all passes share. ``LastOf`` computes a value once per listing instead of
once per pass; only tuples are cached, as they cannot change under the cache (the snapshot
hands out its listings as tuples). ``PerObject`` computes a per-object value once per
object, so a new listing after one watch event costs one object's work, not all of them.
Together they keep the operator's CPU flat as jobs multiply.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LastOf(Generic[K, V]):
    """A one-entry cache keyed by the identity of a tuple (held, so its id stays unique)."""

    def __init__(self) -> None:
        self._key: K | None = None
        self._value: V | None = None

    def get(self, key: K, compute: Callable[[K], V]) -> V:
        """``compute(key)``, reused while ``key`` is the same tuple as last time."""
        if not isinstance(key, tuple):
            return compute(key)
        if self._key is not key or self._value is None:
            self._value = compute(key)
            self._key = key
        return self._value


class LastOfAll(Generic[V]):
    """A one-entry cache keyed by the identities of several values (each held, as above).

    For a value derived from two cached ones (the capacity left from the parsed nodes and the
    pods' usage): reused while both are the very objects of last time."""

    def __init__(self) -> None:
        self._keys: tuple[object, ...] = ()
        self._value: V | None = None

    def get(self, keys: tuple[object, ...], compute: Callable[[], V]) -> V:
        """``compute()``, reused while every one of ``keys`` is the object of last time."""
        same = len(keys) == len(self._keys) and all(
            a is b for a, b in zip(keys, self._keys, strict=True)
        )
        if not same or self._value is None:
            self._value = compute()
            self._keys = keys
        return self._value


class PerObject(Generic[K, V]):
    """``compute`` of each object of a listing, kept while the next listing holds the same
    object (informers replace an object on change, never edit it in place).

    After a watch event the next listing is the last one with one object changed: this
    computes that one again instead of all of them. It holds each object, so an ``id`` stays
    unique while its entry lives.
    """

    def __init__(self, compute: Callable[[K], V]) -> None:
        self._compute = compute
        self._known: dict[int, tuple[K, V]] = {}

    def map(self, objects: Iterable[K]) -> list[V]:
        """``[compute(o) for o in objects]``, computing only objects not seen last time."""
        known: dict[int, tuple[K, V]] = {}
        found = []
        for obj in objects:
            hit = self._known.get(id(obj))
            entry = hit if hit is not None and hit[0] is obj else (obj, self._compute(obj))
            known[id(obj)] = entry
            found.append(entry[1])
        self._known = known
        return found


class PerKeyOf(Generic[K, V]):
    """Values per hashable key, derived from the objects of last time (held, as above).

    For what each job derives from the same shared value with its own key (the nodes its pod
    constraints allow, from the capacity every pass shares): computed once per key while the
    shared objects stay the very ones of last time, all dropped when they change. At most
    ``limit`` keys are kept, the oldest dropped first.
    """

    def __init__(self, limit: int = 64) -> None:
        self._owners: tuple[object, ...] = ()
        self._values: dict[K, V] = {}
        self._limit = limit

    def get(self, owners: tuple[object, ...], key: K, compute: Callable[[], V]) -> V:
        """``compute()``, reused while ``owners`` are the objects of last time and ``key`` is
        one asked before."""
        same = len(owners) == len(self._owners) and all(
            a is b for a, b in zip(owners, self._owners, strict=True)
        )
        if not same:
            self._values = {}
            self._owners = owners
        if key in self._values:
            return self._values[key]
        if len(self._values) >= self._limit:
            del self._values[next(iter(self._values))]
        value = self._values[key] = compute()
        return value
