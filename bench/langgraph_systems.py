"""The LangGraph savers the LangGraph benchmark replays its recorded calls against, each set up as its docs
show, with its serializer's default (``JsonPlusSerializer``) and its durability default:

- ``ckpt-sidecar``: ``CkptSaver`` on a real ``ckpt serve`` subprocess (its defaults: every commit fsynced),
  unix socket; one saver shared by the writer threads (one client per process, as an application holds it).
- ``ckpt-embedded``: ``CkptSaver.embedded(data_dir)``, the same saver on an in-process store; shared.
- ``sqlite``: ``SqliteSaver`` on one ``sqlite3`` connection (``check_same_thread=False``), as its docs
  show; its ``setup()`` sets WAL, ``synchronous`` stays SQLite's default (FULL here: recorded).
- ``lmdb``: ``LMDBSaver`` (langgraph-checkpoint-lmdb) on one ``lmdb.Environment`` (one per process is
  LMDB's rule), py-lmdb's defaults (``sync=True``: every commit fsynced).
- ``postgres``: ``PostgresSaver`` on a PostgreSQL server the benchmark starts (bench/postgres_server.py,
  ``synchronous_commit=on``), a fresh database per store; one saver and connection per writer thread,
  because a ``PostgresSaver`` holds one lock around its connection (or pool) for every call: shared, its
  64 writers would wait on each other in Python, which no deployment that scales Postgres does.

Every store is closed durably before it is measured: the files' sizes (SQLite after
``wal_checkpoint(TRUNCATE)``; LMDB's data.mdb) or, for PostgreSQL, ``pg_total_relation_size`` of the
saver's tables (their indexes and TOAST included) after ``VACUUM`` and ``CHECKPOINT``.
"""

from __future__ import annotations

import abc
import contextlib
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from ..sidecar.server import SidecarProcess, start_sidecar_process
from .events_systems import lmdb_disk
from .postgres_server import PostgresServer
from .sockets import ScratchSocket


class SaverSystem(abc.ABC):
    name: str
    label: str

    @abc.abstractmethod
    def open(self, directory: Path) -> None:
        """A new, empty store in ``directory``."""

    @abc.abstractmethod
    def saver(self) -> Any:
        """A writer thread's saver (the shared one, or one of its own); hand it back to :meth:`release`."""

    def release(self, saver: Any) -> None:
        return None

    @abc.abstractmethod
    def close(self) -> None:
        """Close every saver and the store, durably."""

    @abc.abstractmethod
    def footprint(self) -> dict[str, Any]:
        """The closed store's bytes: ``bytes`` (the figure compared) and what they are made of."""

    def shutdown(self) -> None:
        """Release what is left (processes, databases); the directory is the caller's to remove."""
        return None

    def settings(self) -> dict[str, Any]:
        """The durability settings measured, as found."""
        return {}

    def server_pid(self) -> int | None:
        """The server process whose CPU (its children's included) serves this saver; None: in process."""
        return None

    def settle(self) -> None:
        """Once the savers are released: wait until the server counts in full what they made it do."""
        return None


class SqliteSystem(SaverSystem):
    name = "sqlite"
    label = "SqliteSaver"
    _FILE = "checkpoints.sqlite"

    def __init__(self) -> None:
        self._path: Path | None = None
        self._conn: sqlite3.Connection | None = None
        self._saver: Any = None
        self._settings: dict[str, Any] = {}

    def open(self, directory: Path) -> None:
        from langgraph.checkpoint.sqlite import SqliteSaver

        directory.mkdir(parents=True, exist_ok=True)
        self._path = directory / self._FILE
        self._conn = sqlite3.connect(self._path, check_same_thread=False)
        self._saver = SqliteSaver(self._conn)
        self._saver.setup()  # its tables and WAL now, not inside the first timed put
        self._settings = {
            "journal_mode": self._conn.execute("PRAGMA journal_mode").fetchone()[0],
            "synchronous": self._conn.execute("PRAGMA synchronous").fetchone()[0],
            "sqlite_version": sqlite3.sqlite_version,
        }

    def saver(self) -> Any:
        return self._saver

    def close(self) -> None:
        if self._conn is not None:
            busy, _, _ = self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            if busy:
                raise RuntimeError("SQLite's wal_checkpoint(TRUNCATE) was blocked")
            self._conn.close()
            self._conn = self._saver = None

    def footprint(self) -> dict[str, Any]:
        assert self._path is not None
        db = self._path.stat().st_size
        wal = self._path.with_name(self._path.name + "-wal")
        wal_bytes = wal.stat().st_size if wal.exists() else 0
        return {"bytes": db + wal_bytes, "db_bytes": db, "wal_bytes": wal_bytes}

    def settings(self) -> dict[str, Any]:
        return dict(self._settings)


class LmdbSystem(SaverSystem):
    name = "lmdb"
    label = "LMDBSaver"
    #: Room for the largest run (64 threads x 200 steps of whole states: ~2 GB), reserved, not written.
    MAP_SIZE_BYTES = 64 << 30

    def __init__(self) -> None:
        self._dir: Path | None = None
        self._env: Any = None
        self._saver: Any = None

    def open(self, directory: Path) -> None:
        import lmdb
        from langgraph_checkpoint_lmdb import LMDBSaver  # type: ignore[import-untyped]

        directory.mkdir(parents=True, exist_ok=True)
        self._dir = directory
        # Its two named tables (checkpoints, writes); py-lmdb's defaults otherwise (sync, metasync).
        self._env = lmdb.open(str(directory), max_dbs=2, map_size=self.MAP_SIZE_BYTES)
        self._saver = LMDBSaver(self._env)

    def saver(self) -> Any:
        return self._saver

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = self._saver = None

    def footprint(self) -> dict[str, Any]:
        assert self._dir is not None
        disk = lmdb_disk(self._dir)
        disk.pop("event_blocks_bytes", None)
        return {"bytes": disk.pop("disk_bytes"), **disk}

    def settings(self) -> dict[str, Any]:
        return {"durability": "py-lmdb defaults: sync=True, metasync=True (every commit fsynced)"}


_PG_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes", "checkpoint_migrations")


#: The longest PostgresSystem.settle waits for the backends of closed connections to be reaped.
_SETTLE_SECONDS = 5.0


class PostgresSystem(SaverSystem):
    name = "postgres"
    label = "PostgresSaver"

    def __init__(self, server: PostgresServer) -> None:
        self._server = server
        self._database = ""
        self._count = 0
        self._lock = threading.Lock()
        self._open_savers: list[Any] = []
        # The backends of released savers' connections, until settle() sees them gone.
        self._closed_backends: list[int] = []
        self._footprint: dict[str, Any] = {}

    def _admin(self) -> Any:
        import psycopg

        return psycopg.connect(self._server.conninfo, autocommit=True)

    def _conninfo(self) -> str:
        return self._server.conninfo.replace("dbname=postgres", f"dbname={self._database}")

    def open(self, directory: Path) -> None:
        self._count += 1
        self._database = f"bench_{self._count}"
        with self._admin() as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {self._database}")
            conn.execute(f"CREATE DATABASE {self._database}")
        saver = self.saver()
        saver.setup()
        self.release(saver)

    def saver(self) -> Any:
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg import Connection
        from psycopg.rows import dict_row

        # What PostgresSaver.from_conn_string opens, held open by the writer thread.
        conn = Connection.connect(self._conninfo(), autocommit=True, prepare_threshold=0, row_factory=dict_row)
        saver = PostgresSaver(conn)
        with self._lock:
            self._open_savers.append(saver)
        return saver

    def release(self, saver: Any) -> None:
        with self._lock:
            self._open_savers.remove(saver)
            self._closed_backends.append(saver.conn.info.backend_pid)
        saver.conn.close()

    def settle(self) -> None:
        # A live process's CPU reads in whole clock ticks (10 ms), each backend's apart, where the postmaster's
        # count of its reaped children adds theirs up exactly: read before the closed backends were reaped, a
        # short run's few milliseconds per backend counted as none. Waited for at most a few seconds.
        with self._lock:
            pids, self._closed_backends = self._closed_backends, []
        deadline = time.monotonic() + _SETTLE_SECONDS
        for pid in pids:
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.001)

    def close(self) -> None:
        for saver in list(self._open_savers):
            self.release(saver)
        import psycopg

        with psycopg.connect(self._conninfo(), autocommit=True) as conn:
            conn.execute("VACUUM")
            conn.execute("CHECKPOINT")
            tables = {
                table: int(conn.execute("SELECT pg_total_relation_size(%s)", (table,)).fetchone()[0])  # type: ignore[index]
                for table in _PG_TABLES
            }
        self._footprint = {"bytes": sum(tables.values()), "table_bytes": tables}

    def footprint(self) -> dict[str, Any]:
        return dict(self._footprint)

    def shutdown(self) -> None:
        for saver in list(self._open_savers):
            self.release(saver)
        if self._database:
            with self._admin() as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {self._database}")

    def settings(self) -> dict[str, Any]:
        with self._admin() as conn:
            found = {
                name: conn.execute(f"SHOW {name}").fetchone()[0]
                for name in ("synchronous_commit", "fsync", "wal_sync_method", "shared_buffers")
            }
        return {**found, "server": self._server.version, "connections": "one per writer thread"}

    def server_pid(self) -> int | None:
        # The postmaster: every backend is its child, and its reaped children's CPU counts in its own.
        try:
            return int((self._server.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None


class CkptEmbeddedSystem(SaverSystem):
    name = "ckpt-embedded"
    label = "ckpt embedded"

    def __init__(self) -> None:
        self._dir: Path | None = None
        self._saver: Any = None

    def open(self, directory: Path) -> None:
        from ..sidecar.langgraph import CkptSaver

        self._dir = directory
        self._saver = CkptSaver.embedded(directory)

    def saver(self) -> Any:
        return self._saver

    def close(self) -> None:
        if self._saver is not None:
            self._saver.close()
            self._saver = None

    def footprint(self) -> dict[str, Any]:
        assert self._dir is not None
        disk = lmdb_disk(self._dir / "lmdb")
        disk.pop("event_blocks_bytes", None)
        return {"bytes": disk.pop("disk_bytes"), **disk}

    def settings(self) -> dict[str, Any]:
        return {"durability": "sync (StoreConfig's default: every commit fsynced)"}


class CkptSidecarSystem(SaverSystem):
    name = "ckpt-sidecar"
    label = "ckpt sidecar"

    def __init__(self) -> None:
        self._dir: Path | None = None
        self._socket: ScratchSocket | None = None
        self._sidecar: SidecarProcess | None = None
        self._saver: Any = None

    def open(self, directory: Path) -> None:
        from ..sidecar.langgraph import CkptSaver

        directory.mkdir(parents=True, exist_ok=True)
        self._dir = directory
        self._socket = ScratchSocket(directory)
        # Its defaults are what is measured: no CKPT_* setting of the caller's environment reaches it.
        self._sidecar = start_sidecar_process(
            directory / "data", listen=[self._socket.target], log_path=directory / "sidecar.log", inherit_ckpt_env=False
        )
        self._saver = CkptSaver(self._socket.target)

    def saver(self) -> Any:
        return self._saver

    def close(self) -> None:
        if self._saver is not None:
            self._saver.close()
            self._saver = None
        sidecar, self._sidecar = self._sidecar, None
        if sidecar is not None:
            code = sidecar.stop()
            if code != 0:
                raise RuntimeError(f"the sidecar exited with {code} on SIGTERM:\n{sidecar.log(tail_chars=2000)}")

    def footprint(self) -> dict[str, Any]:
        assert self._dir is not None
        disk = lmdb_disk(self._dir / "data" / "lmdb")
        disk.pop("event_blocks_bytes", None)
        return {"bytes": disk.pop("disk_bytes"), **disk}

    def shutdown(self) -> None:
        with contextlib.suppress(RuntimeError):
            self.close()
        if self._socket is not None:
            self._socket.remove()
            self._socket = None

    def settings(self) -> dict[str, Any]:
        return {"durability": "sync (ckpt serve's default: every commit fsynced)"}

    def server_pid(self) -> int | None:
        return None if self._sidecar is None else self._sidecar.pid

    @property
    def target(self) -> str:
        assert self._socket is not None, "open() first"
        return self._socket.target


#: Every system, in the order they run (and are shown); postgres needs its server, made by the caller.
NAMES = ("ckpt-sidecar", "ckpt-embedded", "sqlite", "lmdb", "postgres")
