"""The checkpoint stores the harness compares, behind one interface (``System``).

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
- ``langgraph-memory``: LangGraph's ``InMemorySaver``: nothing on disk (the
  in-memory ceiling); per-channel blobs, so a put serializes changed channels only.
"""

from __future__ import annotations

import abc
import json
import os
import shutil
import signal
import sqlite3
import stat
import struct
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import lmdb
from google.protobuf import json_format

from ckpt.v1 import checkpoint_pb2

from ...sidecar import Store, StoreConfig, WriteMode
from ...sidecar.client import CheckpointClient
from ...sidecar.server import SidecarProcess, start_sidecar_process
from ...sidecar.store import RWLock
from ..output import proc_cpu_seconds
from ..trajectories import Step

if sys.version_info >= (3, 14):
    from compression import zstd
else:  # pragma: no cover - exercised on the interpreter CI runs
    from backports import zstd

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import BaseCheckpointSaver, ChannelVersions, Checkpoint, CheckpointMetadata

__all__ = [
    "SYSTEMS",
    "ChannelUpdate",
    "CkptEmbedded",
    "CkptSidecar",
    "JsonSqlite",
    "LangGraphMemory",
    "LangGraphSqlite",
    "PbZstdLmdb",
    "System",
    "make",
    "state_to_dict",
]

MODES = ("merge", "replace")


def state_to_dict(state: bytes) -> dict[str, Any]:
    """A serialized ckpt.v1.Checkpoint as the JSON-compatible dict an app would hold (proto field names)."""
    msg = checkpoint_pb2.Checkpoint.FromString(state)
    return json_format.MessageToDict(msg, preserving_proto_field_name=True)


def same_checkpoint(got: bytes, state: bytes) -> bool:
    # A MERGE-written state is the concatenation of patches: the same message,
    # not the same bytes as the re-serialized step state.
    if got == state:
        return True
    return checkpoint_pb2.Checkpoint.FromString(got) == checkpoint_pb2.Checkpoint.FromString(state)


def _dir_bytes(path: Path, *, exclude: frozenset[str] = frozenset()) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            if name in exclude:
                continue
            try:
                st = os.stat(os.path.join(root, name))
            except FileNotFoundError:  # e.g. a -shm file removed by a closing connection
                continue
            if stat.S_ISREG(st.st_mode):  # not unix sockets
                total += st.st_size
    return total


class System(abc.ABC):
    """One checkpoint store as an application uses it. See the module docstring for each system."""

    #: Stable id used in results JSON and the report (the key in SYSTEMS).
    name: str
    #: Human label for the report.
    label: str
    #: False for in-memory systems (no disk, no cold read after reopen).
    persistent: bool = True
    #: The durability setting in force, as found (filled in at open for SQLite-based systems).
    durability: str = ""

    @abc.abstractmethod
    def prepare(self, step: Step) -> Any:
        """UNTIMED: the value an application using this system holds after this step and hands to put."""

    @abc.abstractmethod
    def open(self, data_dir: Path) -> None:
        """Create or open the store under data_dir. May be called again after close(), on a new directory."""

    @abc.abstractmethod
    def put(self, session_id: str, version: int, value: Any) -> None:
        """TIMED: write version ``version`` (1, 2, ... per session); returns once durable. Thread-safe."""

    @abc.abstractmethod
    def get(self, session_id: str, version: int | None = None) -> Any:
        """TIMED: the stored value of ``version`` (None = latest). Thread-safe.

        Raises if absent: KeyError, or the ckpt systems' own NotFound / NotFoundError.
        """

    @abc.abstractmethod
    def matches(self, got: Any, step: Step) -> bool:
        """UNTIMED: does a value returned by get equal this step's state?"""

    @abc.abstractmethod
    def reopen(self) -> None:
        """Close and reopen from disk, dropping in-process caches (the next gets are cold)."""

    @abc.abstractmethod
    def close(self) -> None: ...

    @abc.abstractmethod
    def disk_bytes(self) -> int:
        """Bytes on disk under data_dir now (sum of file sizes; 0 for in-memory systems)."""

    def stored_bytes(self) -> int | None:
        """Logical bytes of stored checkpoint payloads, if the system can tell."""
        return None

    def helper_cpu_seconds(self) -> float:
        """CPU seconds (user + sys) used so far by helper processes; 0.0 without any."""
        return 0.0


# -- ckpt ---------------------------------------------------------------------


class _Ckpt(System):
    def __init__(self, mode: str = "merge") -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode = mode
        self._write_mode = WriteMode.MERGE if mode == "merge" else WriteMode.REPLACE
        self.durability = "sync: every LMDB commit fsynced (data + meta page), group commit"

    def prepare(self, step: Step) -> bytes:
        return step.patch if self.mode == "merge" else step.state

    def matches(self, got: Any, step: Step) -> bool:
        return isinstance(got, bytes) and same_checkpoint(got, step.state)


class CkptEmbedded(_Ckpt):
    """``sidecar.Store`` in the application's process.

    Thread-safe as is: the store hands every write to its one writer thread,
    which commits whatever is queued in one transaction (group commit).
    """

    name = "ckpt-embedded"

    def __init__(self, mode: str = "merge") -> None:
        super().__init__(mode)
        self.label = f"ckpt embedded ({mode.upper()})"
        self._config: StoreConfig | None = None
        self._store: Store | None = None

    def open(self, data_dir: Path) -> None:
        self._config = StoreConfig(data_dir=data_dir)
        self._store = Store(self._config)

    def _require(self) -> Store:
        if self._store is None:
            raise RuntimeError(f"{self.name} is not open")
        return self._store

    def put(self, session_id: str, version: int, value: Any) -> None:
        self._require().put(session_id, value, mode=self._write_mode, expected_version=version - 1)

    def get(self, session_id: str, version: int | None = None) -> bytes:
        return self._require().get(session_id, version or 0).state

    def reopen(self) -> None:
        assert self._config is not None
        self._require().close()
        self._store = Store(self._config)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    def disk_bytes(self) -> int:
        assert self._config is not None
        return _dir_bytes(self._config.data_dir)

    def stored_bytes(self) -> int:
        store = self._require()
        total, token = 0, ""
        while True:
            page, token = store.list_sessions(page_size=1000, page_token=token)
            total += sum(s.stored_bytes for s in page)
            if not token:
                return total


class CkptSidecar(_Ckpt):
    """A real ``ckpt serve`` subprocess, driven over its unix socket by CheckpointClient.

    One client serves every thread: gRPC channels are thread-safe and the
    client keeps no per-call state (its docstring: "Thread-safe; one per
    process is enough"), which is also how an application would use it.
    """

    name = "ckpt-sidecar"
    _LOG = "sidecar.log"

    def __init__(self, mode: str = "merge") -> None:
        super().__init__(mode)
        self.label = f"ckpt sidecar ({mode.upper()})"
        self._dir: Path | None = None
        self._socket_dir: str | None = None
        self._target = ""
        self._sidecar: SidecarProcess | None = None
        self._client: CheckpointClient | None = None
        self._stopped_cpu = 0.0

    def open(self, data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self._dir = data_dir
        socket_path = str(data_dir / "ckpt.sock")
        if len(socket_path) > 100:  # sun_path holds 108 bytes; deep benchmark dirs can exceed it
            self._socket_dir = tempfile.mkdtemp(prefix="ckpt-")
            socket_path = os.path.join(self._socket_dir, "ckpt.sock")
        self._target = f"unix:{socket_path}"
        self._start()

    def _start(self) -> None:
        assert self._dir is not None
        # The sidecar's defaults are what is measured: no CKPT_* setting from
        # the caller's environment (durability, cache size, ...) leaks in.
        self._sidecar = start_sidecar_process(
            self._dir, listen=[self._target], log_path=self._dir / self._LOG, inherit_ckpt_env=False
        )
        self._client = CheckpointClient(self._target)

    def _stop(self) -> None:
        """SIGTERM the sidecar, wait for exit 0, and bank the CPU it used."""
        if self._client is not None:
            self._client.close()
            self._client = None
        sidecar, self._sidecar = self._sidecar, None
        if sidecar is None:
            return
        process = sidecar.process
        process.send_signal(signal.SIGTERM)
        # Wait for the exit without reaping it (WNOWAIT): a zombie's /proc
        # stat still holds its final CPU times, including the shutdown's.
        deadline = time.monotonic() + 60
        while os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            if time.monotonic() > deadline:
                process.kill()
                break
            time.sleep(0.01)
        self._stopped_cpu += _proc_cpu_seconds(process.pid)
        code = process.wait()
        if code != 0:
            raise RuntimeError(f"ckpt serve exited with {code} on SIGTERM:\n{sidecar.log(tail_chars=4000)}")

    def _require(self) -> CheckpointClient:
        if self._client is None:
            raise RuntimeError(f"{self.name} is not open")
        return self._client

    def put(self, session_id: str, version: int, value: Any) -> None:
        client = self._require()
        if self.mode == "merge":
            client.merge(session_id, value, expected_version=version - 1)
        else:
            client.put(session_id, value, expected_version=version - 1)

    def get(self, session_id: str, version: int | None = None) -> bytes:
        return bytes(self._require().get(session_id, version or 0).state)

    def reopen(self) -> None:
        self._stop()
        self._start()

    def close(self) -> None:
        try:
            self._stop()
        finally:
            if self._socket_dir is not None:
                shutil.rmtree(self._socket_dir, ignore_errors=True)
                self._socket_dir = None

    def disk_bytes(self) -> int:
        assert self._dir is not None
        return _dir_bytes(self._dir, exclude=frozenset({self._LOG}))

    def stored_bytes(self) -> int:
        return sum(s.stored_bytes for s in self._require().sessions(page_size=1000))

    def helper_cpu_seconds(self) -> float:
        live = _proc_cpu_seconds(self._sidecar.pid) if self._sidecar is not None else 0.0
        return self._stopped_cpu + live


def _proc_cpu_seconds(pid: int) -> float:
    """CPU seconds of the sidecar process (or its zombie); 0.0 once it is gone."""
    return proc_cpu_seconds(pid) or 0.0


# -- JSON in SQLite -------------------------------------------------------------


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

    def close(self) -> None:
        self._close_all()

    def disk_bytes(self) -> int:
        assert self._dir is not None
        return _dir_bytes(self._dir)

    def stored_bytes(self) -> int:
        row = self._conn().execute("SELECT COALESCE(SUM(length(CAST(state AS BLOB))), 0) FROM checkpoints").fetchone()
        return int(row[0])


# -- protobuf + zstd snapshots in LMDB --------------------------------------------


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
        return _dir_bytes(self._path)

    def stored_bytes(self) -> int:
        with self._rw.shared(), self._env.begin() as txn:
            return sum(len(v) for v in txn.cursor().iternext(keys=False, values=True))


# -- LangGraph ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChannelUpdate:
    """What a LangGraph app hands its checkpointer after a step: every channel's
    value (the state dict's top-level keys) and the channels the step wrote.

    The pregel loop knows which channels its nodes wrote without diffing state;
    here they are the fields present in the step's patch, found in prepare so
    that put does only what LangGraph itself does.
    """

    channel_values: dict[str, Any]
    updated: tuple[str, ...]


# The checkpoint format version LangGraph 1.x's pregel loop writes (langgraph/pregel/_checkpoint.py).
_LANGGRAPH_CHECKPOINT_V = 4
# A fixed UUIDv6 timestamp (100 ns ticks since 1582) that checkpoint ids count up from.
_ID_EPOCH = 0x1F0_0000_0000_0000
# Heads cached per session before the cache is dropped (a dropped head is
# reloaded with get_tuple, as LangGraph does when a run resumes a thread).
_MAX_HEADS = 65536


def _checkpoint_id(version: int) -> str:
    """A UUIDv6-shaped checkpoint id derived from the version: same length and
    format as LangGraph's uuid6 ids, sortable by version (both savers find the
    latest checkpoint by the greatest id), and reproducible after reopen."""
    ts = _ID_EPOCH + version
    value = ((ts >> 12) & 0xFFFF_FFFF_FFFF) << 80 | (ts & 0x0FFF) << 64 | (version & 0x3FFF) << 48
    value |= 6 << 76  # version 6
    value |= 0x8000 << 48  # RFC 4122 variant
    return str(uuid.UUID(int=value))


class _LangGraph(System):
    _saver: BaseCheckpointSaver[Any] | None

    def __init__(self) -> None:
        self._saver = None
        # session -> (version, channel_versions) of its last checkpoint, as the
        # pregel loop holds its current checkpoint between steps.
        self._heads: dict[str, tuple[int, ChannelVersions]] = {}

    def prepare(self, step: Step) -> ChannelUpdate:
        patch = checkpoint_pb2.Checkpoint.FromString(step.patch)
        updated = tuple(sorted(field.name for field, _ in patch.ListFields()))
        return ChannelUpdate(state_to_dict(step.state), updated)

    def _require(self) -> BaseCheckpointSaver[Any]:
        if self._saver is None:
            raise RuntimeError(f"{self.name} is not open")
        return self._saver

    @staticmethod
    def _config(session_id: str, version: int | None) -> RunnableConfig:
        configurable: dict[str, Any] = {"thread_id": session_id, "checkpoint_ns": ""}
        if version:
            configurable["checkpoint_id"] = _checkpoint_id(version)
        return {"configurable": configurable}

    def _head(self, saver: BaseCheckpointSaver[Any], session_id: str, version: int) -> ChannelVersions:
        head = self._heads.get(session_id)
        if head is not None and head[0] == version:
            return head[1]
        if version == 0:
            return {}
        found = saver.get_tuple(self._config(session_id, version))
        if found is None:
            raise KeyError(f"{session_id} v{version}: no parent checkpoint to write on")
        return dict(found.checkpoint["channel_versions"])

    def put(self, session_id: str, version: int, value: Any) -> None:
        saver = self._require()
        update = cast(ChannelUpdate, value)
        previous = self._head(saver, session_id, version - 1)
        new_versions: ChannelVersions = {ch: saver.get_next_version(previous.get(ch), None) for ch in update.updated}
        channel_versions = {**previous, **new_versions}
        checkpoint: Checkpoint = {
            "v": _LANGGRAPH_CHECKPOINT_V,
            "id": _checkpoint_id(version),
            "ts": datetime.now(UTC).isoformat(),
            "channel_values": update.channel_values,
            "channel_versions": channel_versions,
            "versions_seen": {"agent": previous},
            "updated_channels": list(update.updated),
        }
        metadata: CheckpointMetadata = {"source": "loop", "step": version - 1, "parents": {}}
        # The parent's id in the config, as the pregel loop passes it.
        saver.put(self._config(session_id, version - 1), checkpoint, metadata, new_versions)
        if len(self._heads) >= _MAX_HEADS:
            self._heads.clear()
        self._heads[session_id] = (version, channel_versions)

    def get(self, session_id: str, version: int | None = None) -> dict[str, Any]:
        found = self._require().get_tuple(self._config(session_id, version))
        if found is None:
            raise KeyError(f"{session_id} v{version or 'latest'}")
        return found.checkpoint["channel_values"]

    def matches(self, got: Any, step: Step) -> bool:
        return bool(got == state_to_dict(step.state))


class LangGraphSqlite(_LangGraph):
    """LangGraph's SqliteSaver on one connection, as its docs set it up.

    Thread-safe: the saver serializes every cursor (and so every commit) on one
    internal lock around its single connection; puts do not share commits.
    """

    name = "langgraph-sqlite"
    label = "LangGraph SqliteSaver"
    _FILE = "checkpoints.sqlite"

    def __init__(self) -> None:
        super().__init__()
        self._dir: Path | None = None
        self._conn: sqlite3.Connection | None = None

    def open(self, data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self._dir = data_dir
        self._open()

    def _open(self) -> None:
        from langgraph.checkpoint.sqlite import SqliteSaver

        assert self._dir is not None
        self._heads = {}
        self._conn = sqlite3.connect(str(self._dir / self._FILE), check_same_thread=False)
        saver = SqliteSaver(self._conn)
        # Creates the tables (and sets WAL) now rather than inside the first timed put.
        saver.setup()
        self._saver = saver
        mode = self._conn.execute("PRAGMA journal_mode").fetchone()[0]
        sync = self._conn.execute("PRAGMA synchronous").fetchone()[0]
        self.durability = (
            f"journal_mode={mode}, synchronous={sync} (SqliteSaver sets WAL only; synchronous is SQLite's"
            " default; 2 = FULL: WAL fsynced at every commit, 1 = NORMAL: not fsynced per commit)"
        )

    def reopen(self) -> None:
        self.close()
        self._open()

    def close(self) -> None:
        self._saver = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def disk_bytes(self) -> int:
        assert self._dir is not None
        return _dir_bytes(self._dir)

    def stored_bytes(self) -> int:
        assert self._conn is not None
        row = self._conn.execute(
            "SELECT COALESCE(SUM(length(checkpoint)), 0) + COALESCE(SUM(length(metadata)), 0) FROM checkpoints"
        ).fetchone()
        return int(row[0])


class LangGraphMemory(_LangGraph):
    """LangGraph's InMemorySaver: the in-memory ceiling, nothing durable.

    It has no lock: puts and gets are dict operations that are atomic under the
    GIL for distinct threads (sessions); safe as the harness uses it (one
    writer per session), not on a free-threaded build.
    """

    name = "langgraph-memory"
    label = "LangGraph InMemorySaver"
    persistent = False
    durability = "none (in memory)"

    def open(self, data_dir: Path) -> None:
        from langgraph.checkpoint.memory import InMemorySaver

        self._heads = {}
        self._saver = InMemorySaver()

    def reopen(self) -> None:
        pass  # nothing to reopen from; the runner skips cold reads for persistent=False

    def close(self) -> None:
        self._saver = None
        self._heads = {}

    def disk_bytes(self) -> int:
        return 0

    def stored_bytes(self) -> int:
        from langgraph.checkpoint.memory import InMemorySaver

        saver = cast(InMemorySaver, self._require())
        total = sum(len(blob) for _, blob in saver.blobs.values())
        for namespaces in saver.storage.values():
            for checkpoints in namespaces.values():
                for (_, cp), (_, meta), _parent in checkpoints.values():
                    total += len(cp) + len(meta)
        return total


# -- registry -------------------------------------------------------------------------

SYSTEMS: dict[str, Callable[..., System]] = {
    CkptEmbedded.name: CkptEmbedded,
    CkptSidecar.name: CkptSidecar,
    JsonSqlite.name: JsonSqlite,
    PbZstdLmdb.name: PbZstdLmdb,
    LangGraphSqlite.name: LangGraphSqlite,
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
