"""The checkpoint stores the harness compares, behind one interface (``System``).

This package holds the registry (``SYSTEMS``, ``make``); the interface is in
``base``, ckpt's two systems in ``ckpt_stores``, the hand-rolled snapshot
baselines in ``snapshots`` and LangGraph's savers in ``langgraph_savers``.

Each system is driven the way an application using it would drive it: ``prepare``
(untimed) turns a workload step into the value such an application holds, ``put``
and ``get`` (timed) are the calls it would make. Every persistent system returns
from ``put`` only once the write is durable by that system's *default* setting,
which is listed here as found (``System.durability`` carries it at run time):

- ``ckpt-embedded``: ``sidecar.Store`` in-process, StoreConfig defaults
  (``Durability.SYNC``: every LMDB commit fsynced, data and meta page; concurrent
  puts share group commits). MERGE writes send the step's patch, REPLACE the whole
  state; both with ``expected_version`` (compare-and-set), as an agent would.
- ``ckpt-sidecar``: a real ``ckpt serve`` subprocess on a unix socket, driven
  through ``CheckpointClient``; same store defaults (``--durability sync``).
- ``json-sqlite``: the common hand-rolled approach: the whole state as JSON,
  one new row per version (history kept), one transaction per put; WAL with
  ``synchronous=FULL`` set explicitly, so every commit fsyncs the WAL.
- ``pbzstd-lmdb``: protobuf + zstd -3 full snapshot per version in LMDB, one
  write transaction per put; py-lmdb defaults ``sync=True, metasync=True``
  (fsync of data and meta page at every commit), no group commit.
- ``langgraph-sqlite``: LangGraph's ``SqliteSaver`` through its public API on a
  ``sqlite3.connect(path, check_same_thread=False)`` connection, as its docs show.
  Its ``setup()`` sets only ``PRAGMA journal_mode=WAL``; ``synchronous`` stays at
  SQLite's compiled default, which is FULL (2) in the Debian/CPython builds
  measured here (``SQLITE_DEFAULT_WAL_SYNCHRONOUS=2``): the WAL is fsynced at
  every commit. A build compiled with WAL_SYNCHRONOUS=1 (NORMAL) would not fsync
  per commit; ``durability`` records what the open connection reports. Every
  put rewrites the whole checkpoint blob (channel values inline, msgpack).
- ``langgraph-lmdb``: langgraph-checkpoint-lmdb's ``LMDBSaver`` on one ``lmdb.Environment``, py-lmdb's
  defaults (every commit fsynced); every put writes the whole checkpoint (channel values inline, msgpack).
  PostgresSaver, which needs a server, is measured by ``ckpt bench langgraph`` (bench/langgraph_bench.py).
- ``langgraph-memory``: LangGraph's ``InMemorySaver``: nothing on disk (the
  in-memory ceiling); per-channel blobs, so a put serializes changed channels only.
"""

from __future__ import annotations

from collections.abc import Callable

from .base import MODES, System, same_checkpoint, state_to_dict
from .ckpt_stores import CkptEmbedded, CkptSidecar
from .langgraph_savers import ChannelUpdate, LangGraphLmdb, LangGraphMemory, LangGraphSqlite
from .snapshots import JsonSqlite, PbZstdLmdb

__all__ = [
    "MODES",
    "SYSTEMS",
    "ChannelUpdate",
    "CkptEmbedded",
    "CkptSidecar",
    "JsonSqlite",
    "LangGraphLmdb",
    "LangGraphMemory",
    "LangGraphSqlite",
    "PbZstdLmdb",
    "System",
    "make",
    "same_checkpoint",
    "state_to_dict",
]

SYSTEMS: dict[str, Callable[..., System]] = {
    CkptEmbedded.name: CkptEmbedded,
    CkptSidecar.name: CkptSidecar,
    JsonSqlite.name: JsonSqlite,
    PbZstdLmdb.name: PbZstdLmdb,
    LangGraphSqlite.name: LangGraphSqlite,
    LangGraphLmdb.name: LangGraphLmdb,
    LangGraphMemory.name: LangGraphMemory,
}
_TAKES_MODE = frozenset({CkptEmbedded.name, CkptSidecar.name})


def make(name: str, *, mode: str = "merge") -> System:
    """A new, unopened system by name; ``mode`` ("merge" or "replace") applies to the ckpt systems only."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    factory = SYSTEMS.get(name)
    if factory is None:
        raise ValueError(f"unknown system {name!r}; known: {', '.join(SYSTEMS)}")
    return factory(mode=mode) if name in _TAKES_MODE else factory()
