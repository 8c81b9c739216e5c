"""LangGraph's checkpointers as peers: ``SqliteSaver`` (what its users run), ``LMDBSaver``
(langgraph-checkpoint-lmdb) and ``InMemorySaver`` (the ceiling)."""

from __future__ import annotations

import sqlite3
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ckpt.v1 import checkpoint_pb2

from ...trajectories import Step
from .base import System, dir_bytes, state_to_dict

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import BaseCheckpointSaver, ChannelVersions, Checkpoint, CheckpointMetadata


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


def checkpoint_id(version: int) -> str:
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
            configurable["checkpoint_id"] = checkpoint_id(version)
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
            "id": checkpoint_id(version),
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
        return dir_bytes(self._dir)

    def stored_bytes(self) -> int:
        assert self._conn is not None
        row = self._conn.execute(
            "SELECT COALESCE(SUM(length(checkpoint)), 0) + COALESCE(SUM(length(metadata)), 0) FROM checkpoints"
        ).fetchone()
        return int(row[0])


class LangGraphLmdb(_LangGraph):
    """langgraph-checkpoint-lmdb's ``LMDBSaver`` on one environment (LMDB's rule: one per process per
    path), py-lmdb's defaults (``sync=True``: every commit fsynced). Thread-safe: it takes one lock per
    environment around each write transaction."""

    name = "langgraph-lmdb"
    label = "LangGraph LMDBSaver"
    durability = "py-lmdb defaults: sync=True, metasync=True (every commit fsynced)"
    #: Room reserved for the largest workload's whole states, not written.
    _MAP_SIZE_BYTES = 64 << 30

    def __init__(self) -> None:
        super().__init__()
        self._dir: Path | None = None
        self._env: Any = None

    def open(self, data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self._dir = data_dir
        self._open()

    def _open(self) -> None:
        import lmdb
        from langgraph_checkpoint_lmdb import LMDBSaver  # type: ignore[import-untyped]

        assert self._dir is not None
        self._heads = {}
        self._env = lmdb.open(str(self._dir), max_dbs=2, map_size=self._MAP_SIZE_BYTES)
        self._saver = LMDBSaver(self._env)

    def reopen(self) -> None:
        self.close()
        self._open()

    def close(self) -> None:
        self._saver = None
        if self._env is not None:
            self._env.close()
            self._env = None

    def disk_bytes(self) -> int:
        assert self._dir is not None
        return dir_bytes(self._dir)

    def stored_bytes(self) -> int | None:
        return None


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
