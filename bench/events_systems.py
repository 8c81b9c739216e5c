"""The event logs the events benchmark compares, behind one interface: ckpt's and an SQLite events table.

- ``ckpt-sidecar``: a real ``ckpt serve`` subprocess on its defaults (``--durability sync``), started by
  the benchmarks' echo launcher (bench/echo_sidecar.py: the same server, serving an echo too), on a unix
  socket, one ``CheckpointClient`` shared by the writer threads (it is thread-safe, and one per process is
  how an application holds it); each event is one ``append_events`` call, with the request id the client
  generates (a retry appends nothing twice; the sidecar keeps a record of it for its TTL). Its echo, on
  the client's own channel, measures one call's ceiling (bench/events_echo.py).
- ``ckpt-embedded``: ``Store.append_events`` in this process, StoreConfig defaults, no request id.
- ``sqlite``: the table agent daemons keep, ``events(id INTEGER PRIMARY KEY, session_id TEXT, seq INTEGER,
  type TEXT, time REAL, payload TEXT, attributes TEXT)`` indexed on (session_id, seq), WAL with
  ``synchronous=FULL`` (every commit fsyncs the WAL), one connection per writer thread with a busy
  timeout, one INSERT per event in autocommit (a transaction each). The writer numbers its session's
  events itself, the cheapest way SQLite can: no read in the transaction.

Every store is closed durably before its bytes are counted (SQLite: a ``wal_checkpoint(TRUNCATE)`` first),
and its cold reader is a new one: the sidecar restarted, the store reopened, a new SQLite connection.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

import lmdb

from ckpt.v1 import service_pb2

from ..sidecar.client import CheckpointClient, EventFilter, NotFoundError, event
from ..sidecar.client.base import method_path
from ..sidecar.config import StoreConfig
from ..sidecar.errors import NotFound
from ..sidecar.server import SidecarProcess
from ..sidecar.store import EventQuery, NewEvent, Store
from .echo import ECHO_METHOD
from .echo_sidecar import start_echo_sidecar
from .events_replay import Event
from .sockets import ScratchSocket

#: Reads of a session that does not exist, made by each new reader before the timed reads: the first
#: call's one-off costs (a channel's connection, SQLite's schema parse) are not a cold read's.
WARMUP_READS = 20
_ABSENT = "bench-events-absent"
BUSY_TIMEOUT_MS = 60_000
#: The deadline of an echo call and of a reply's re-read (the client's own default).
CALL_TIMEOUT_SECONDS = 30.0
#: Bytes in, the same bytes out: an echo call.
EchoCall = Callable[[bytes], bytes]


class Appender(abc.ABC):
    """One writer thread's handle: appends one event at a time, each durable before it returns."""

    @abc.abstractmethod
    def append(self, session_id: str, seq: int, item: Event) -> None: ...

    def close(self) -> None:
        return None


class EventSystem(abc.ABC):
    name: str
    label: str

    @abc.abstractmethod
    def open(self, directory: Path) -> None:
        """A new, empty store in ``directory``."""

    @abc.abstractmethod
    def appender(self) -> Appender: ...

    @abc.abstractmethod
    def close(self) -> None:
        """Close every writer's handle and the store, durably."""

    @abc.abstractmethod
    def disk(self) -> dict[str, Any]:
        """The closed store's bytes: ``disk_bytes`` (the figure compared) and what they are made of."""

    @abc.abstractmethod
    def reopen(self) -> None:
        """A new reader on the closed store (cold), its first calls made."""

    @abc.abstractmethod
    def read_last(self, session_id: str, count: int) -> Sequence[Any]:
        """A session's newest ``count`` events, newest first, as the system hands them over."""

    @abc.abstractmethod
    def seq_and_payload(self, item: Any) -> tuple[int, bytes]:
        """An event :meth:`read_last` returned, for checking (untimed)."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Close the reader (and any process); the directory is the caller's to remove."""

    def settings(self) -> dict[str, Any]:
        """The durability settings measured, as the system reports them."""
        return {}

    def echo(self) -> EchoCall | None:
        """An echo on the channel the system's calls take, answered by the server with the bytes it was
        sent: one call's ceiling. None for a system in this process, which makes no call."""
        return None

    def read_reply(self, session_id: str, count: int) -> bytes:
        """The bytes of the reply :meth:`read_last` gets, read again (a system with an :meth:`echo`)."""
        raise NotImplementedError(f"{self.name} reads in this process: it has no reply")


class SqliteEvents(EventSystem):
    name = "sqlite"
    label = "SQLite events table (WAL, synchronous=FULL, one JSON row per event)"

    def __init__(self) -> None:
        self._path: Path | None = None
        self._reader: sqlite3.Connection | None = None
        self._settings: dict[str, Any] = {}

    def _connect(self) -> sqlite3.Connection:
        assert self._path is not None
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA synchronous=FULL")  # per connection: not stored in the file
        return conn

    def open(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._path = directory / "events.db"
        with contextlib.closing(self._connect()) as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(
                "CREATE TABLE events(id INTEGER PRIMARY KEY, session_id TEXT, seq INTEGER, type TEXT, time REAL,"
                " payload TEXT, attributes TEXT)"
            )
            conn.execute("CREATE INDEX events_session_seq ON events(session_id, seq)")
            self._settings = {
                "journal_mode": conn.execute("PRAGMA journal_mode").fetchone()[0],
                "synchronous": conn.execute("PRAGMA synchronous").fetchone()[0],
                "busy_timeout_ms": conn.execute("PRAGMA busy_timeout").fetchone()[0],
                "sqlite_version": sqlite3.sqlite_version,
            }

    def appender(self) -> Appender:
        return _SqliteAppender(self._connect())

    def close(self) -> None:
        with contextlib.closing(self._connect()) as conn:
            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            if busy:
                raise RuntimeError("SQLite's wal_checkpoint(TRUNCATE) was blocked: a connection is still open")

    def disk(self) -> dict[str, Any]:
        assert self._path is not None
        db = self._path.stat().st_size
        wal_path = self._path.with_name(self._path.name + "-wal")
        wal = wal_path.stat().st_size if wal_path.exists() else 0
        return {"disk_bytes": db + wal, "db_bytes": db, "wal_bytes": wal}

    def reopen(self) -> None:
        self._reader = self._connect()
        for _ in range(WARMUP_READS):
            self.read_last(_ABSENT, 1)

    def read_last(self, session_id: str, count: int) -> Sequence[Any]:
        assert self._reader is not None
        return self._reader.execute(
            "SELECT seq, type, time, payload, attributes FROM events WHERE session_id = ? ORDER BY seq DESC LIMIT ?",
            (session_id, count),
        ).fetchall()

    def seq_and_payload(self, item: Any) -> tuple[int, bytes]:
        return int(item[0]), str(item[3]).encode()

    def shutdown(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def settings(self) -> dict[str, Any]:
        return dict(self._settings)


class _SqliteAppender(Appender):
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def append(self, session_id: str, seq: int, item: Event) -> None:
        attributes = json.dumps(item.attributes) if item.attributes else None
        self._conn.execute(
            "INSERT INTO events(session_id, seq, type, time, payload, attributes) VALUES (?, ?, ?, ?, ?, ?)",
            (session_id, seq, item.type, time.time(), item.payload.decode(), attributes),
        )

    def close(self) -> None:
        self._conn.close()


class CkptSidecarEvents(EventSystem):
    name = "ckpt-sidecar"
    label = "ckpt sidecar (unix socket, one AppendEvents per event)"

    def __init__(self) -> None:
        self._dir: Path | None = None
        self._socket: ScratchSocket | None = None
        self._target = ""
        self._sidecar: SidecarProcess | None = None
        self._client: CheckpointClient | None = None

    def open(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._dir = directory
        self._socket = ScratchSocket(directory)
        self._target = self._socket.target
        self._start(keep_data=False)

    def _start(self, *, keep_data: bool) -> None:
        assert self._dir is not None
        # Its defaults are what is measured: the launcher lets no CKPT_* setting of this environment reach it.
        self._sidecar = start_echo_sidecar(self._dir, "data", listen=self._target, keep_data=keep_data)
        self._client = CheckpointClient(self._target)

    def _stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        sidecar, self._sidecar = self._sidecar, None
        if sidecar is not None:
            code = sidecar.stop()
            if code != 0:
                raise RuntimeError(f"the sidecar exited with {code} on SIGTERM:\n{sidecar.log(tail_chars=2000)}")

    def appender(self) -> Appender:
        assert self._client is not None
        return _ClientAppender(self._client)

    def close(self) -> None:
        self._stop()

    def disk(self) -> dict[str, Any]:
        assert self._dir is not None
        return lmdb_disk(self._dir / "data" / "lmdb")

    def reopen(self) -> None:
        self._start(keep_data=True)
        for _ in range(WARMUP_READS):
            with contextlib.suppress(NotFoundError):
                self.read_last(_ABSENT, 1)

    def read_last(self, session_id: str, count: int) -> Sequence[Any]:
        assert self._client is not None
        # The iterator fetches pages as it goes: taking one page's worth asks for one page.
        return list(islice(self._client.events(session_id, newest_first=True, page_size=count), count))

    def seq_and_payload(self, item: Any) -> tuple[int, bytes]:
        return int(item.seq), bytes(item.payload)

    def shutdown(self) -> None:
        self._stop()
        if self._socket is not None:
            self._socket.remove()

    def settings(self) -> dict[str, Any]:
        return {"durability": "sync (ckpt serve's default: every commit fsynced)"}

    def echo(self) -> EchoCall:
        assert self._client is not None
        # The client's own channel: the connection, and the queue, its appends and reads take.
        call = self._client._channel.unary_unary(ECHO_METHOD)  # no serializers: bytes in, bytes out
        return functools.partial(call, timeout=CALL_TIMEOUT_SECONDS)

    def read_reply(self, session_id: str, count: int) -> bytes:
        assert self._client is not None
        read = self._client._channel.unary_unary(
            method_path("ReadEvents"), request_serializer=service_pb2.ReadEventsRequest.SerializeToString
        )  # the reply left as it came: its bytes are what is wanted
        request = EventFilter(newest_first=True, page_size=count).request(session_id)
        reply: bytes = read(request, timeout=CALL_TIMEOUT_SECONDS)
        return reply


class _ClientAppender(Appender):
    def __init__(self, client: CheckpointClient) -> None:
        self._client = client

    def append(self, session_id: str, seq: int, item: Event) -> None:
        reply = self._client.append_events(session_id, [event(item.type, item.payload, attributes=item.attributes)])
        if reply.first_seq != seq:
            raise AssertionError(f"{session_id}: the sidecar appended seq {reply.first_seq}, the writer's {seq}")


class CkptEmbeddedEvents(EventSystem):
    name = "ckpt-embedded"
    label = "ckpt embedded (Store.append_events per event)"

    def __init__(self) -> None:
        self._dir: Path | None = None
        self._store: Store | None = None

    def open(self, directory: Path) -> None:
        self._dir = directory
        self._store = Store(StoreConfig(data_dir=directory))

    def appender(self) -> Appender:
        assert self._store is not None
        return _StoreAppender(self._store)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    def disk(self) -> dict[str, Any]:
        assert self._dir is not None
        return lmdb_disk(self._dir / "lmdb")

    def reopen(self) -> None:
        assert self._dir is not None
        self.open(self._dir)
        for _ in range(WARMUP_READS):
            with contextlib.suppress(NotFound):
                self.read_last(_ABSENT, 1)

    def read_last(self, session_id: str, count: int) -> Sequence[Any]:
        assert self._store is not None
        return self._store.read_events(session_id, EventQuery(newest_first=True, page_size=count)).events

    def seq_and_payload(self, item: Any) -> tuple[int, bytes]:
        return int(item.seq), bytes(item.payload)

    def shutdown(self) -> None:
        self.close()

    def settings(self) -> dict[str, Any]:
        return {"durability": "sync (StoreConfig's default: every commit fsynced)"}


class _StoreAppender(Appender):
    def __init__(self, store: Store) -> None:
        self._store = store

    def append(self, session_id: str, seq: int, item: Event) -> None:
        result = self._store.append_events(session_id, [NewEvent(item.type, item.payload, item.attributes)])
        if result.first_seq != seq:
            raise AssertionError(f"{session_id}: the store appended seq {result.first_seq}, the writer's {seq}")


SYSTEMS: dict[str, type[EventSystem]] = {
    CkptSidecarEvents.name: CkptSidecarEvents,
    CkptEmbeddedEvents.name: CkptEmbeddedEvents,
    SqliteEvents.name: SqliteEvents,
}


def lmdb_disk(lmdb_dir: Path) -> dict[str, Any]:
    """A closed store's bytes: data.mdb's size (the figure compared), the pages in use (the file less its
    free pages), each table's pages, and the event blocks' own bytes (what compression left)."""
    data_file = lmdb_dir / "data.mdb"
    env = lmdb.open(str(lmdb_dir), readonly=True, max_dbs=64, subdir=True, lock=False)
    try:
        page = env.stat()["psize"]
        main = env.stat()
        in_use = 2 + main["branch_pages"] + main["leaf_pages"] + main["overflow_pages"]  # 2: the meta pages
        tables: dict[str, int] = {}
        blocks = 0
        with env.begin() as txn:
            names = [bytes(key) for key, _ in txn.cursor()]
            for name in names:
                try:
                    db = env.open_db(name, txn=txn, create=False)
                except lmdb.IncompatibleError:  # a key of the main table, not a table's name
                    continue
                s = txn.stat(db)
                pages = s["branch_pages"] + s["leaf_pages"] + s["overflow_pages"]
                in_use += pages
                tables[name.decode()] = pages * page
                if name == b"events":
                    blocks = sum(len(value) for _, value in txn.cursor(db=db))
        return {
            "disk_bytes": data_file.stat().st_size,
            "used_pages_bytes": in_use * page,
            "event_blocks_bytes": blocks,
            "table_pages_bytes": {k: v for k, v in sorted(tables.items()) if v},
        }
    finally:
        env.close()
