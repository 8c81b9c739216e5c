"""What the LangGraph benchmark's latency goals are up against, measured beside them in the same run.

Two floors, each the part of a saver's call that no saver built on the same pieces can skip:

- **An embedded put**: LangGraph's serializer over what the step changed, as ckpt's put serializes it (a
  list continuing the one the thread's last put held in one call, and the elements it added one by one to
  tell them apart; any other list element by element), plus one durable LMDB commit of a value the
  size ckpt stores for a checkpoint, under a new key (py-lmdb's defaults, as ckpt's store commits: the
  data pages synced, then the meta page). ckpt's embedded put cannot take less than their sum. SqliteSaver's
  put has its own floor, measured the same way: the serializer over the whole checkpoint in one call plus
  one durable SQLite commit of a row the size SqliteSaver stores for a checkpoint (WAL, ``synchronous``
  FULL, as the benchmark's SqliteSaver connection: one sync of the log).
- **A call through the sidecar**: one unary gRPC call from Python (a Get of a 1-byte state, answered from
  the sidecar's reply cache) against one psycopg query (``SELECT 1``) on the benchmark's PostgreSQL server:
  the calling thread's CPU and the round trip. At 64 writer threads in one process, every call's CPU is
  taken under one interpreter lock, so a step's latency there follows the process's CPU per step.

Each is timed ``calls`` times per round; the report gives medians over the rounds.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .langgraph_replay import Put, ThreadRecord
from .stats import percentile

#: The LMDB map reserved for the commit floor (not written: the commits add ~calls x value bytes).
_MAP_SIZE_BYTES = 1 << 30
#: Calls of the transport floors, after as many untimed.
TRANSPORT_CALLS = 500


def serializer_us(records: Sequence[ThreadRecord]) -> dict[str, float]:
    """p50 over ``records``' puts of LangGraph's serializer: over the channels each put changed as ckpt's put
    serializes them (``changed``: sidecar/langgraph/elements.py's dumps_after for a list continuing the one
    the thread's last put held, else each element), and over the whole checkpoint in one call (``whole``)."""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    dumps = JsonPlusSerializer().dumps_typed
    clock = time.perf_counter_ns
    changed: list[int] = []
    whole: list[int] = []
    for rec in records:
        held: dict[str, int] = {}  # the length of each list the thread's last put held
        for call in rec.calls:
            if not isinstance(call, Put):
                continue
            values = call.checkpoint["channel_values"]
            t0 = clock()
            for k in call.new_versions:
                v = values.get(k)
                if type(v) is list:
                    start = held.get(k, 0)
                    if 2 <= start <= len(v):
                        dumps(v)
                    else:
                        start = 0
                    for e in v[start:]:
                        dumps(e)
                elif k in values:
                    dumps(v)
            t1 = clock()
            dumps(call.checkpoint)
            t2 = clock()
            changed.append(t1 - t0)
            whole.append(t2 - t1)
            held = {k: len(v) for k, v in values.items() if type(v) is list}
    return {
        "serialize_changed_p50_us": percentile(changed, 50) / 1e3,
        "serialize_whole_p50_us": percentile(whole, 50) / 1e3,
    }


def lmdb_commit_us(directory: Path, value_bytes: int, commits: int) -> float:
    """p50 of a durable py-lmdb commit (its defaults: sync, metasync) of one ``value_bytes`` value under a new
    key, in a new environment in ``directory`` (removed after)."""
    import lmdb

    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    env = lmdb.open(str(directory), map_size=_MAP_SIZE_BYTES)
    try:
        value = os.urandom(max(1, value_bytes))  # compressed states look random to the disk
        took = []
        for i in range(commits):
            t0 = time.perf_counter_ns()
            with env.begin(write=True) as txn:
                txn.put(i.to_bytes(8, "big"), value)
            took.append(time.perf_counter_ns() - t0)
    finally:
        env.close()
        shutil.rmtree(directory, ignore_errors=True)
    return percentile(took, 50) / 1e3


def sqlite_commit_us(directory: Path, value_bytes: int, commits: int) -> float:
    """p50 of a durable SQLite commit (WAL, synchronous FULL: SqliteSaver's journal on Python's default
    connection) of one ``value_bytes`` row under a new key, in a new database in ``directory`` (removed after)."""
    import sqlite3

    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    conn = sqlite3.connect(directory / "floor.sqlite", isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE floor (k INTEGER PRIMARY KEY, v BLOB)")
        value = os.urandom(max(1, value_bytes))
        took = []
        for i in range(commits):
            t0 = time.perf_counter_ns()
            conn.execute("BEGIN")
            conn.execute("INSERT INTO floor VALUES (?, ?)", (i, value))
            conn.execute("COMMIT")
            took.append(time.perf_counter_ns() - t0)
    finally:
        conn.close()
        shutil.rmtree(directory, ignore_errors=True)
    return percentile(took, 50) / 1e3


def _timed(call: Callable[[], Any], calls: int) -> dict[str, float]:
    """p50 round trip and mean CPU of the calling thread, over ``calls`` calls after as many untimed."""
    for _ in range(calls):
        call()
    walls = []
    cpu0 = time.thread_time_ns()
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        call()
        walls.append(time.perf_counter_ns() - t0)
    cpu = (time.thread_time_ns() - cpu0) / calls
    return {"p50_us": percentile(walls, 50) / 1e3, "thread_cpu_us": cpu / 1e3}


def grpc_call_us(target: str, calls: int = TRANSPORT_CALLS) -> dict[str, float]:
    """One unary Get of a 1-byte state through the sidecar at ``target`` (the session written first)."""
    from ..sidecar.client import CheckpointClient
    from ..v1 import service_pb2

    with CheckpointClient(target) as client:
        client.put("bench-floor", b"x")
        request = service_pb2.GetRequest(session_id="bench-floor")
        get = client._stub.Get  # the generated stub's call alone: no retry or argument handling of ours
        return _timed(lambda: get(request), calls)


def psycopg_call_us(conninfo: str, calls: int = TRANSPORT_CALLS) -> dict[str, float]:
    """One ``SELECT 1`` through psycopg on the server at ``conninfo``."""
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        return _timed(lambda: conn.execute("SELECT 1").fetchall(), calls)
