"""Where an embedded put's time goes, for ckpt's embedded saver and SqliteSaver, measured inside their puts.

The floors (langgraph_floors.py) time a put's unavoidable pieces apart; this times them in the savers' own
puts: the single writer's threads replayed again, each put split into its serializer calls (LangGraph's
``JsonPlusSerializer``, both savers' default, timed call by call), its durable commit (ckpt: the
store's own count of the time its commits took, ``Store.counters.commit_seconds``; SqliteSaver: its connection's
``commit``, through a connection class that times it) and the rest: the saver's and its store's own work.
Each part is a p50 over the puts, the rest the p50 of each put's remainder.

The timers cost a little, and more for ckpt, whose put calls the serializer for each element a step added
besides the list where SqliteSaver's calls it once: the put measured here is the timed one, reported beside
its parts, not the rounds' untimed put.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from .langgraph_replay import Put, ThreadRecord
from .stats import percentile

#: The savers whose puts are split (names as langgraph_systems.py's).
SPLIT_SAVERS = ("ckpt-embedded", "sqlite")
PARTS = ("put", "serializer", "commit", "rest")


class _SerializerTimer:
    """Adds up the nanoseconds of LangGraph's ``JsonPlusSerializer.dumps_typed`` calls while it is on (a
    context manager): the class's own method wrapped, not a subclass, so that each saver, on its default
    serializer, takes the path it takes there (ckpt's put serializes a list in one call only with
    JsonPlusSerializer's own ``dumps_typed``)."""

    def __init__(self) -> None:
        self.ns = 0
        self._dumps = JsonPlusSerializer.dumps_typed

    def __enter__(self) -> _SerializerTimer:
        dumps = self._dumps

        def timed(serde: JsonPlusSerializer, obj: Any) -> tuple[str, bytes]:
            t0 = time.perf_counter_ns()
            try:
                return dumps(serde, obj)
            finally:
                self.ns += time.perf_counter_ns() - t0

        setattr(JsonPlusSerializer, "dumps_typed", timed)  # noqa: B010 - mypy refuses a method assigned
        return self

    def __exit__(self, *exc: object) -> None:
        setattr(JsonPlusSerializer, "dumps_typed", self._dumps)  # noqa: B010


class _TimedConnection(sqlite3.Connection):
    """A SQLite connection adding up the nanoseconds of its commits."""

    ns = 0

    def commit(self) -> None:
        t0 = time.perf_counter_ns()
        try:
            super().commit()
        finally:
            self.ns += time.perf_counter_ns() - t0


def _replay(
    saver: Any, serde: _SerializerTimer, commit_ns: Callable[[], int], records: Sequence[ThreadRecord]
) -> dict[str, list[int]]:
    """``records``' calls against ``saver`` on one thread, as the rounds' single writer; each put's parts."""
    parts: dict[str, list[int]] = {part: [] for part in PARTS}
    clock = time.perf_counter_ns
    for rec in records:
        for call in rec.calls:
            if not isinstance(call, Put):
                saver.put_writes(call.config, call.writes, call.task_id, call.task_path)
                continue
            s0, c0, t0 = serde.ns, commit_ns(), clock()
            saver.put(call.config, call.checkpoint, call.metadata, call.new_versions)
            took, serializer, commit = clock() - t0, serde.ns - s0, commit_ns() - c0
            for part, ns in zip(PARTS, (took, serializer, commit, took - serializer - commit), strict=True):
                parts[part].append(ns)
            saver.get_tuple(rec.latest_config)
    return parts


def put_split_us(name: str, directory: Path, records: Sequence[ThreadRecord]) -> dict[str, float]:
    """p50 of each part of saver ``name``'s puts (``put``, ``serializer``, ``commit``, ``rest``) over
    ``records`` replayed in a new store in ``directory``."""
    serde = _SerializerTimer()
    directory.mkdir(parents=True, exist_ok=True)
    close: Callable[[], None]
    if name == "ckpt-embedded":
        from ..sidecar.langgraph import CkptSaver

        saver: Any = CkptSaver.embedded(directory / "data")
        store = saver._backend.store  # the saver's own store: its commits' time, as its metrics give it

        def commit_ns() -> int:
            return int(store.counters.commit_seconds * 1e9)

        close = saver.close
    elif name == "sqlite":
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(directory / "checkpoints.sqlite", check_same_thread=False, factory=_TimedConnection)
        saver = SqliteSaver(conn)
        saver.setup()

        def commit_ns() -> int:
            return conn.ns

        close = conn.close
    else:
        raise ValueError(f"no put split for saver {name!r}: one of {', '.join(SPLIT_SAVERS)}")
    out: dict[str, list[int]] = {}
    # On a thread of its own, as the rounds' writer: ckpt's store commits a lone write on its caller's
    # thread only off the main thread.
    thread = threading.Thread(target=lambda: out.update(_replay(saver, serde, commit_ns, records)))
    try:
        with serde:
            thread.start()
            thread.join()
    finally:
        close()
    if not out:
        raise RuntimeError(f"the put split of {name} failed (its thread's error is above)")
    return {f"{part}_p50_us": percentile(out[part], 50) / 1e3 for part in PARTS}
