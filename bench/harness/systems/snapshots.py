"""The hand-rolled baselines: the whole state as JSON in SQLite, and protobuf + zstd snapshots in LMDB."""

from __future__ import annotations

import json
import sqlite3
import struct
import sys
import threading
from pathlib import Path
from typing import Any, cast

import lmdb

from ....sidecar.store import RWLock
from ...trajectories import Step
from .base import System, dir_bytes, same_checkpoint, state_to_dict

if sys.version_info >= (3, 14):
    from compression import zstd
else:  # pragma: no cover - exercised on the interpreter CI runs
    from backports import zstd


class JsonSqlite(System):
    """The whole state as JSON, one row per version, one transaction per put.

    One connection per thread, as a typical multi-threaded app does (sqlite3's
    default check_same_thread forbids sharing one): concurrent readers run in
    parallel under WAL, writers queue on SQLite's write lock via its busy
    handler. The busy timeout is raised from 5 s to 60 s because that handler is
    not fair and 64 writers each waiting on fsyncs can starve one past 5 s.
    The handler sleeps (1, 2, 5, 10 ... ms) rather than queueing, so with many
    writers throughput falls below a single writer's: measured here, not hidden.
    Connections are opened with check_same_thread=False only so that close()
    can close every thread's connection from one thread.
    """

    name = "json-sqlite"
    label = "JSON in SQLite (WAL, synchronous=FULL)"
    _FILE = "states.sqlite"

    def __init__(self) -> None:
        self._path: Path | None = None
        self._dir: Path | None = None
        self._local = threading.local()
        self._generation = 0
        self._lock = threading.Lock()
        self._conns: list[sqlite3.Connection] = []

    def prepare(self, step: Step) -> dict[str, Any]:
        return state_to_dict(step.state)

    def open(self, data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self._dir = data_dir
        self._path = data_dir / self._FILE
        self._generation += 1
        self._setup()

    def _setup(self) -> None:
        """The calling thread's connection, its PRAGMAs, and the table (created, or its schema read)."""
        conn = self._conn()
        with conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS checkpoints ("
                " session_id TEXT NOT NULL, version INTEGER NOT NULL, state TEXT NOT NULL,"
                " PRIMARY KEY (session_id, version))"
            )
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        sync = conn.execute("PRAGMA synchronous").fetchone()[0]
        self.durability = f"journal_mode={mode}, synchronous={sync} (2 = FULL: WAL fsynced at every commit)"

    def _connect(self) -> sqlite3.Connection:
        assert self._path is not None
        conn = sqlite3.connect(self._path, timeout=60.0, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")  # per connection; FULL fsyncs the WAL at each commit
        with self._lock:
            self._conns.append(conn)
        return conn

    def _conn(self) -> sqlite3.Connection:
        local = self._local
        if getattr(local, "generation", None) != self._generation:
            local.conn = self._connect()
            local.generation = self._generation
        return cast(sqlite3.Connection, local.conn)

    def put(self, session_id: str, version: int, value: Any) -> None:
        text = json.dumps(value)
        conn = self._conn()
        with conn:  # one transaction: BEGIN ... COMMIT
            conn.execute(
                "INSERT INTO checkpoints (session_id, version, state) VALUES (?, ?, ?)", (session_id, version, text)
            )

    def get(self, session_id: str, version: int | None = None) -> dict[str, Any]:
        conn = self._conn()
        if version is None:
            row = conn.execute(
                "SELECT state FROM checkpoints WHERE session_id = ? ORDER BY version DESC LIMIT 1", (session_id,)
            ).fetchone()
        else:
            row = conn.execute(
                "SELECT state FROM checkpoints WHERE session_id = ? AND version = ?", (session_id, version)
            ).fetchone()
        if row is None:
            raise KeyError(f"{session_id} v{version or 'latest'}")
        return cast(dict[str, Any], json.loads(row[0]))

    def matches(self, got: Any, step: Step) -> bool:
        return bool(got == state_to_dict(step.state))

    def _close_all(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            conn.close()
        self._generation += 1  # every thread's cached connection is now stale

    def reopen(self) -> None:
        self._close_all()
        # Open the calling thread's connection now (PRAGMAs run, schema read, as LangGraph's SqliteSaver
        # does in its setup), as the other systems open theirs in reopen: the first cold read then times
        # a read, not a connect.
        self._setup()

    def close(self) -> None:
        self._close_all()

    def disk_bytes(self) -> int:
        assert self._dir is not None
        return dir_bytes(self._dir)

    def stored_bytes(self) -> int:
        row = self._conn().execute("SELECT COALESCE(SUM(length(CAST(state AS BLOB))), 0) FROM checkpoints").fetchone()
        return int(row[0])


_VERSION = struct.Struct(">Q")


def _lmdb_key(session_id: str, version: int) -> bytes:
    return session_id.encode() + b"\0" + _VERSION.pack(version)


class PbZstdLmdb(System):
    """Protobuf bytes, zstd level 3, a full snapshot per version, in LMDB.

    The LMDB environment is shared by all threads; every put and get opens its
    own transaction (py-lmdb transactions must not cross threads) and LMDB
    serializes write transactions on its writer mutex, so concurrent puts each
    commit (and fsync) on their own: no group commit, as a straightforward
    application would write it. Each thread keeps its own compressor (zstd
    contexts are not shared between threads; reusing one avoids re-allocating
    it per put).
    """

    name = "pbzstd-lmdb"
    label = "protobuf + zstd -3 snapshots in LMDB"
    durability = "py-lmdb defaults: sync=True, metasync=True (every commit fsynced, data + meta page)"
    _INITIAL_MAP_BYTES = 256 * 1024 * 1024
    _MAX_MAP_BYTES = 1 << 40

    def __init__(self) -> None:
        self._path: Path | None = None
        self._env: Any = None
        self._map_size = self._INITIAL_MAP_BYTES
        self._rw = RWLock()
        self._local = threading.local()

    def prepare(self, step: Step) -> bytes:
        return step.state

    def open(self, data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self._path = data_dir
        self._map_size = self._INITIAL_MAP_BYTES
        self._env = self._open_env()

    def _open_env(self) -> Any:
        assert self._path is not None
        env = lmdb.open(
            str(self._path / "lmdb"),
            map_size=self._map_size,
            subdir=True,
            max_readers=1024,  # the default 126 is below 64 readers + 64 writers
            # Same as ckpt's store, so the comparison is of formats, not of LMDB flags.
            readahead=False,
        )
        self._map_size = max(self._map_size, env.info()["map_size"])
        return env

    def _compressor(self) -> Any:
        comp = getattr(self._local, "compressor", None)
        if comp is None:
            comp = self._local.compressor = zstd.ZstdCompressor(level=3)
        return comp

    def put(self, session_id: str, version: int, value: Any) -> None:
        comp = self._compressor()
        blob = comp.compress(value, mode=comp.FLUSH_FRAME)
        key = _lmdb_key(session_id, version)
        while True:
            with self._rw.shared():
                seen = self._map_size
                try:
                    with self._env.begin(write=True) as txn:
                        txn.put(key, blob)
                    return
                except lmdb.MapFullError:
                    pass  # nothing committed; grow and retry
            self._grow(seen)

    def _grow(self, seen: int) -> None:
        with self._rw.exclusive():
            if self._map_size != seen:  # another thread grew it meanwhile
                return
            if self._map_size >= self._MAX_MAP_BYTES:
                raise RuntimeError(f"{self.name}: LMDB map reached {self._MAX_MAP_BYTES} bytes")
            self._map_size *= 2
            self._env.set_mapsize(self._map_size)

    def get(self, session_id: str, version: int | None = None) -> bytes:
        with self._rw.shared(), self._env.begin() as txn:
            if version is not None:
                blob = txn.get(_lmdb_key(session_id, version))
            else:
                prefix = session_id.encode() + b"\0"
                cur = txn.cursor()
                # Keys sort session, then version: the session's last key sits just below the next prefix.
                found = cur.prev() if cur.set_range(session_id.encode() + b"\x01") else cur.last()
                blob = cur.value() if found and cur.key().startswith(prefix) else None
        if blob is None:
            raise KeyError(f"{session_id} v{version or 'latest'}")
        return zstd.decompress(blob)

    def matches(self, got: Any, step: Step) -> bool:
        return isinstance(got, bytes) and same_checkpoint(got, step.state)

    def reopen(self) -> None:
        with self._rw.exclusive():
            self._env.close()
            self._env = self._open_env()

    def close(self) -> None:
        if self._env is not None:
            with self._rw.exclusive():
                self._env.close()
                self._env = None

    def disk_bytes(self) -> int:
        assert self._path is not None
        return dir_bytes(self._path)

    def stored_bytes(self) -> int:
        with self._rw.shared(), self._env.begin() as txn:
            return sum(len(v) for v in txn.cursor().iternext(keys=False, values=True))
