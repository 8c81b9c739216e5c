"""What a store has done and what it holds, for metrics and operators: ``Store.counters``.

Each figure is read live off the collaborator that keeps it (the writer, the caches, the storage, the
sweeper), without its lock or thread: each is one int or float, read atomically. ``stats`` adds the
counts LMDB keeps of the tables, read in a read transaction.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from ..storage import LmdbStorage, ReadTxn
from .cache import StateCache
from .encoders import Encoders
from .layout import Tables
from .retention import Retention
from .types import SweepResult
from .writer import Writer


class StoreCounters:
    """A store's counts, read when asked."""

    def __init__(
        self,
        *,
        writer: Writer,
        states: StateCache,
        encoders: Encoders,
        storage: LmdbStorage,
        retention: Retention,
        tables: Tables,
        read: Callable[[], AbstractContextManager[ReadTxn]],
    ) -> None:
        self._writer = writer
        self._states = states
        self._encoders = encoders
        self._storage = storage
        self._retention = retention
        self._tables = tables
        self._read = read

    @property
    def cache_hits(self) -> int:
        """Reads answered from the state cache."""
        return self._states.hits

    @property
    def cache_misses(self) -> int:
        """Reads that hydrated their state from storage."""
        return self._states.misses

    @property
    def memory_bytes(self) -> dict[str, int]:
        """What the state cache and the cached encoders hold (the encoders' by estimate)."""
        return {"state_cache": self._states.size_bytes, "encoder_cache": self._encoders.lru.weight}

    @property
    def queued_write_bytes(self) -> int:
        """Bytes of states queued for the writer and not yet answered."""
        return self._writer.queued_bytes

    @property
    def commits(self) -> int:
        """Write transactions committed since the store opened."""
        return self._writer.commits

    @property
    def batch_sizes(self) -> Counter[int]:
        """Commits by how many writes each held."""
        return self._writer.batch_sizes

    @property
    def commit_delays(self) -> int:
        """Times the writer waited for writers it expected before a commit."""
        return self._writer.commit_delays

    @property
    def commit_delay_seconds(self) -> float:
        """The seconds it waited for them in all."""
        return self._writer.commit_delay_seconds

    @property
    def commit_seconds(self) -> float:
        """The seconds its commits took in all (storage's page writes and syncs), over :attr:`commits`."""
        return self._writer.commit_seconds

    @property
    def store_full_refusals(self) -> int:
        """Writes refused because the store was full (the map at its cap, or the disk)."""
        return self._writer.store_full_refusals

    @property
    def map_resizes(self) -> int:
        """Times the storage grew (the LMDB map doubling, up to its cap)."""
        return self._storage.resizes

    @property
    def sweeps(self) -> int:
        """Retention sweeps completed since the store opened."""
        return self._retention.sweeps

    @property
    def swept(self) -> SweepResult:
        """What those sweeps did in all: an operator's evidence that retention runs."""
        return self._retention.swept

    @property
    def last_sweep_unix_seconds(self) -> float | None:
        """When the last sweep ended (time.time()); None: none yet."""
        return self._retention.last_sweep_unix_seconds

    def stats(self) -> dict[str, Any]:
        """Every count at once, with the tables' sizes and the storage's."""
        # Counts LMDB keeps, no scan: a metrics scrape reads them in the writer's process (count_sessions scans).
        with self._read() as txn:
            tables = self._tables
            sessions, versions = txn.count(tables.sessions), txn.count(tables.frames)
            event_logs = txn.count(tables.event_logs) if tables.event_logs is not None else 0
        map_size_bytes, used_bytes = self._storage.sizes()
        memory = self.memory_bytes
        return {
            "sessions": sessions,
            "event_logs": event_logs,
            "versions": versions,
            "map_size_bytes": map_size_bytes,
            "used_bytes": used_bytes,
            "commits": self.commits,
            "map_resizes": self.map_resizes,
            "batch_sizes": dict(self.batch_sizes),
            "commit_delays": self.commit_delays,
            "commit_delay_seconds": self.commit_delay_seconds,
            "commit_seconds": self.commit_seconds,
            "state_cache_hits": self.cache_hits,
            "state_cache_misses": self.cache_misses,
            "state_cache_bytes": memory["state_cache"],
            "encoders_cached": len(self._encoders.lru),
            "encoder_cache_bytes": memory["encoder_cache"],
            "queued_write_bytes": self.queued_write_bytes,
        }
