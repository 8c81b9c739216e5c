"""Bounded LRU caches: latest states (shared by readers) and encoders (writer only)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, NamedTuple, TypeVar

from ...codec import StateSnapshot

if TYPE_CHECKING:
    from .types import VersionInfo

V = TypeVar("V")


class CachedState(NamedTuple):
    #: Joined into bytes by the first reader, not by the writer: see StateSnapshot.
    state: StateSnapshot
    info: VersionInfo


# What a state cache entry keeps besides its state's bytes: the key, the
# snapshot and its chunk list, the VersionInfo and its labels dict, and the
# OrderedDict's node (~680 B measured with tracemalloc on CPython 3.11 for a
# 16-byte id and no labels). Counting only the state let a cache of tiny or
# empty states keep every session ever written (~670 B each, never evicted).
_ENTRY_BYTES = 640
# Each label of the write the entry holds: a dict slot and two str objects
# (~50 B of header each), plus their characters.
_LABEL_BYTES = 120


def entry_bytes(sid: bytes, state: StateSnapshot, info: VersionInfo) -> int:
    """Estimated memory of one state cache entry: what its budget counts."""
    labels = sum(_LABEL_BYTES + len(k) + len(v) for k, v in info.labels.items()) if info.labels else 0
    return _ENTRY_BYTES + len(sid) + len(state) + labels


class StateCache:
    """Latest committed state per session, bounded by total bytes.

    The writer thread puts a state only after its transaction committed, and
    before acknowledging the write; deletes and forks evict. So a hit is
    always the committed head as of the moment of the lookup. The version's
    metadata is kept beside it, so a hit needs no storage read at all.

    An entry weighs its state plus what it keeps besides (``entry_bytes``),
    so the budget bounds the cache's memory whatever the states' sizes.
    """

    def __init__(self, capacity_bytes: int) -> None:
        self._capacity = capacity_bytes
        self._size = 0
        self._items: OrderedDict[bytes, tuple[CachedState, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, sid: bytes) -> CachedState | None:
        with self._lock:
            item = self._items.get(sid)
            if item is None:
                self.misses += 1
                return None
            self._items.move_to_end(sid)
            self.hits += 1
            return item[0]

    def peek(self, sid: bytes) -> CachedState | None:
        """The entry of ``sid``, if cached, as no use of it: neither counted a hit or miss nor moved."""
        with self._lock:
            item = self._items.get(sid)
            return None if item is None else item[0]

    def put(self, sid: bytes, state: StateSnapshot, info: VersionInfo) -> None:
        weight = entry_bytes(sid, state, info)
        with self._lock:
            old = self._items.pop(sid, None)
            if old is not None:
                self._size -= old[1]
            if weight > self._capacity:
                return
            self._items[sid] = (CachedState(state, info), weight)
            self._size += weight
            while self._size > self._capacity:
                _, (_, evicted) = self._items.popitem(last=False)
                self._size -= evicted

    def discard(self, sid: bytes) -> None:
        with self._lock:
            old = self._items.pop(sid, None)
            if old is not None:
                self._size -= old[1]

    def restate(self, sid: bytes, info: VersionInfo, *, state: bytes | None = None) -> None:
        """New metadata for the cached version ``info.version`` (its frame was rewritten), if cached; and its
        new ``state`` if the rewrite changed its bytes (a head compacted by a fold).

        The entry keeps its place: this is no use of the session.
        """
        with self._lock:
            item = self._items.get(sid)
            if item is None or item[0].info.version != info.version:
                return
            if state is None:
                self._items[sid] = (CachedState(item[0].state, info), item[1])
                return
            snapshot = StateSnapshot([state], 1, len(state))
            weight = entry_bytes(sid, snapshot, info)
            self._items[sid] = (CachedState(snapshot, info), weight)
            self._size += weight - item[1]

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._size = 0

    @property
    def size_bytes(self) -> int:
        return self._size

    def __len__(self) -> int:
        return len(self._items)


class LRU(Generic[V]):
    """An LRU bounded by entry count and by total weight; not thread-safe
    (the writer thread owns it).

    ``weigh`` is called on every put, so a value that grew since its last put
    (an encoder after a MERGE) is re-weighed then. A value heavier than the
    whole budget is not kept (and what was kept under its key is dropped),
    without evicting anything else: kept, it would evict every other value
    and then itself.
    """

    def __init__(
        self, capacity: int, *, max_weight: int | None = None, weigh: Callable[[V], int] | None = None
    ) -> None:
        self._capacity = capacity
        self._max_weight = max_weight
        self._weigh = weigh
        self._items: OrderedDict[bytes, tuple[V, int]] = OrderedDict()
        self._weight = 0

    def get(self, key: bytes) -> V | None:
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def put(self, key: bytes, value: V) -> None:
        if self._capacity <= 0:
            return
        weight = self._weigh(value) if self._weigh is not None else 0
        old = self._items.pop(key, None)
        if old is not None:
            self._weight -= old[1]
        limit = self._max_weight
        if limit is not None and weight > limit:
            return
        self._items[key] = (value, weight)
        self._weight += weight
        while len(self._items) > self._capacity or (limit is not None and self._weight > limit):
            _, (_, evicted) = self._items.popitem(last=False)
            self._weight -= evicted

    def discard(self, key: bytes) -> None:
        old = self._items.pop(key, None)
        if old is not None:
            self._weight -= old[1]

    def clear(self) -> None:
        self._items.clear()
        self._weight = 0

    @property
    def weight(self) -> int:
        return self._weight

    def __len__(self) -> int:
        return len(self._items)
