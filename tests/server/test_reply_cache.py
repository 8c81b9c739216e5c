"""Gets the sidecar's gRPC process answers from its reply cache (replycache.py), without its store process.

The sidecar tests drive a real `ckpt serve` (store process, the default) and
tell a reply-cache hit from a forwarded Get by its metrics; the unit tests
use a real LMDB directory written by one Store and read by a read-only one,
as the two processes do.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
import urllib.request
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

from ckpt.bench import synthetic
from ckpt.sidecar.client import CheckpointClient, NotFoundError
from ckpt.sidecar.config import ServeConfig, StoreConfig
from ckpt.sidecar.server.convert import version_info_pb
from ckpt.sidecar.server.replycache import INLINE_READ_MAX_OUTPUT_BYTES, ReplyCache
from ckpt.sidecar.store.engine import Store
from ckpt.v1 import service_pb2
from tests.support import (
    Sidecar,
    free_port,
    metric,
    start_sidecar,
    start_sidecar_sweeping,
    start_sidecar_with_metrics,
    wait_for_metrics,
)

FULL = service_pb2.FRAME_KIND_FULL


def _state(n: int, size: int = 2000) -> bytes:
    return (b"%08d" % n) * (size // 8)


def _scrape(sidecar: Sidecar) -> str:
    port = sidecar.metrics_port  # type: ignore[attr-defined]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text: str = reply.read().decode()
    return text


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Sidecar]:
    s = start_sidecar_with_metrics(tmp_path / "data")
    yield s
    assert s.stop() == 0, s.log()


def test_a_repeated_get_is_answered_by_the_grpc_process_and_counted(sidecar: Sidecar) -> None:
    with CheckpointClient(sidecar.unix_target) as client:
        client.put("s", _state(1))
        first = client.get("s")  # read from LMDB by this process, which keeps the reply
        again = [client.get("s"), client.get("s", 1), client.get("s")]
    assert [g.SerializeToString() for g in again] == [first.SerializeToString()] * 3
    assert first.state == _state(1) and first.version == 1
    wait_for_metrics(lambda: metric(sidecar, 'ckpt_requests_total{rpc="Get"}', missing=0.0) == 4.0)
    assert metric(sidecar, "ckpt_reply_cache_hits_total") == 3.0
    assert metric(sidecar, "ckpt_state_cache_hits_total") == 0.0  # the store process saw no Get
    assert metric(sidecar, 'ckpt_request_seconds_count{rpc="Get"}') == 4.0
    assert metric(sidecar, "ckpt_sent_bytes_total") == 4.0 * len(_state(1))


def test_a_get_of_a_large_state_is_forwarded_to_the_store_process(sidecar: Sidecar) -> None:
    """Read here, it would be decoded on the event loop every other call waits on."""
    large = _state(1, INLINE_READ_MAX_OUTPUT_BYTES + 8)
    with CheckpointClient(sidecar.unix_target) as client:
        client.put("big", large)
        client.put("small", _state(2))
        assert client.get("big").state == large  # forwarded: the store process's state cache answers
        assert client.get("small").state == _state(2)  # read here
        assert client.get("big").state == large  # the kept reply
    wait_for_metrics(lambda: metric(sidecar, 'ckpt_requests_total{rpc="Get"}', missing=0.0) == 3.0)
    assert metric(sidecar, "ckpt_state_cache_hits_total") == 1.0
    assert metric(sidecar, "ckpt_reply_cache_hits_total") == 1.0


def test_the_reply_caches_size_reaches_the_metrics(sidecar: Sidecar) -> None:
    """Reported by the gRPC process over the link: at start, then at most once a second when it changed."""
    reply_bytes = 'ckpt_cache_bytes{cache="reply_cache"}'
    wait_for_metrics(lambda: "\nckpt_reply_cache_entries 0.0\n" in _scrape(sidecar))
    assert metric(sidecar, reply_bytes) == 0.0
    with CheckpointClient(sidecar.unix_target) as client:
        client.put("a", _state(1, 3000))
        client.put("b", _state(2, 5000))
        client.get("a")  # forwarded, then kept
        client.get("b")
        client.get("b")  # a hit: nothing changes
        wait_for_metrics(lambda: metric(sidecar, "ckpt_reply_cache_entries") == 2.0)
        held = metric(sidecar, reply_bytes)
        # Each entry weighs its GetResponse's bytes (the state and a little more) plus its bookkeeping.
        assert 8000 < held < 8000 + 2 * 1000, held
        client.delete("b")
        with pytest.raises(NotFoundError):
            client.get("b")  # the kept reply is stale: dropped, and the Get forwarded
        wait_for_metrics(lambda: metric(sidecar, "ckpt_reply_cache_entries") == 1.0)
        assert 3000 < metric(sidecar, reply_bytes) < 3000 + 1000


def test_a_sidecar_without_a_reply_cache_reports_no_size(tmp_path: Path) -> None:
    port = free_port()
    s = start_sidecar(tmp_path / "data", "--metrics-port", str(port), "--reply-cache-bytes", "0")
    try:
        s.metrics_port = port  # type: ignore[attr-defined]
        with CheckpointClient(s.unix_target) as client:
            client.put("a", _state(1))
            client.get("a")
            client.get("a")
        assert metric(s, "ckpt_reply_cache_hits_total") == 0.0
        text = _scrape(s)
        assert "reply_cache_entries" not in text and 'cache="reply_cache"' not in text
    finally:
        assert s.stop() == 0, s.log()


def test_a_kept_reply_is_never_answered_once_the_head_moved(sidecar: Sidecar) -> None:
    with CheckpointClient(sidecar.unix_target) as client:
        client.put("s", _state(1))
        assert client.get("s").state == _state(1)
        client.put("s", _state(2))  # REPLACE
        assert (client.get("s").version, client.get("s").state) == (2, _state(2))
        client.merge("s", b"\x10\x07")
        got = client.get("s")
        assert (got.version, got.state) == (3, _state(2) + b"\x10\x07")
        assert client.get("s", 2).state == _state(2)  # an older version: forwarded, and not kept
        assert client.get("s").version == 3
        # Deleted, then written again to the same version number: another state, another creation time.
        client.delete("s")
        with pytest.raises(NotFoundError):
            client.get("s")
        client.put("s", _state(9))
        assert (client.get("s").version, client.get("s").state) == (1, _state(9))
        # A fork is a session of its own, read from its own head.
        client.fork("s", "t", version=1)
        assert client.get("t").state == _state(9)
    # Hits: the second Get after each write (2), the Get after the older version's, the fork's session none.
    wait_for_metrics(lambda: metric(sidecar, "ckpt_reply_cache_hits_total") >= 3.0)
    assert metric(sidecar, "ckpt_reply_cache_hits_total") == 3.0


def test_a_quiet_keyframe_is_seen_by_the_next_get(tmp_path: Path) -> None:
    """The sweeper rewrites the head's frame (not its state): a kept reply's frame kind would be stale."""
    sidecar = start_sidecar_sweeping(tmp_path / "data", 0.2, "--keyframe-after-quiet-seconds", "1")
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            for state in [s.state for s in synthetic.session(7, steps=14, memory_keys=12, plan_steps=8)]:
                client.put("agent", state)
            kept = client.get("agent")
            assert client.get("agent").info.frame_kind == kept.info.frame_kind != FULL
            deadline = time.monotonic() + 15
            while next(client.history("agent")).frame_kind != FULL and time.monotonic() < deadline:
                time.sleep(0.1)
            got = client.get("agent")
            assert got.info.frame_kind == FULL
            assert (got.version, got.state) == (kept.version, kept.state)
    finally:
        assert sidecar.stop() == 0, sidecar.log()


def test_concurrent_gets_never_return_a_version_older_than_an_acknowledged_write(sidecar: Sidecar) -> None:
    """Writers acknowledge versions; readers, each Get started after an acknowledgement, must see it or later."""
    sessions = [f"s{i}" for i in range(4)]
    acked = dict.fromkeys(sessions, 0)
    lock = threading.Lock()
    stop = threading.Event()
    failures: list[str] = []
    gets = [0]

    def write(session: str) -> None:
        with CheckpointClient(sidecar.unix_target) as client:
            n = 0
            while not stop.is_set():
                n += 1
                result = client.put(session, _state(n, 4000), expected_version=n - 1)
                with lock:
                    acked[session] = result.version

    def read(offset: int) -> None:
        with CheckpointClient(sidecar.unix_target) as client:
            i = offset
            while not stop.is_set():
                session = sessions[i % len(sessions)]
                i += 1
                with lock:
                    floor = acked[session]
                if not floor:
                    continue
                got = client.get(session)
                gets[0] += 1
                if got.version < floor or got.state != _state(got.version, 4000):
                    failures.append(f"{session}: got {got.version} after {floor} was acknowledged")

    threads = [threading.Thread(target=write, args=(s,)) for s in sessions]
    threads += [threading.Thread(target=read, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(3)
    stop.set()
    for t in threads:
        t.join()
    assert not failures, failures[:5]
    assert gets[0] > 100 and min(acked.values()) > 10
    assert metric(sidecar, "ckpt_reply_cache_hits_total") > 0


def test_reply_cache_bytes_0_forwards_every_get(tmp_path: Path) -> None:
    port = free_port()
    sidecar = start_sidecar(tmp_path / "data", "--metrics-port", str(port), "--reply-cache-bytes", "0")
    sidecar.metrics_port = port  # type: ignore[attr-defined]
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            client.put("s", _state(1))
            assert [client.get("s").state for _ in range(3)] == [_state(1)] * 3
        assert metric(sidecar, "ckpt_state_cache_hits_total") == 3.0
        assert metric(sidecar, "ckpt_reply_cache_hits_total") == 0.0
    finally:
        assert sidecar.stop() == 0, sidecar.log()


def test_reply_cache_bytes_must_not_be_negative(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"reply_cache_bytes must be >= 0 \(0 = off\), got -1"):
        ServeConfig(data_dir=tmp_path, reply_cache_bytes=-1)


# -- the cache itself, on a real LMDB directory --------------------------------------------
# LMDB opens a directory once per process: the writer is a child process, as the store process is.


def _writer_loop(data_dir: str, conn: Connection) -> None:
    with Store(StoreConfig(data_dir=Path(data_dir))) as store:
        while (op := conn.recv()) is not None:
            name, session, *args = op
            if name == "reply":
                got = store.get(session)
                info = version_info_pb(got.info)
                conn.send(service_pb2.GetResponse(version=got.version, state=got.state, info=info).SerializeToString())
            else:
                getattr(store, name)(session, *args)
                conn.send(None)


class _Writer:
    def __init__(self, data_dir: Path) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, theirs = ctx.Pipe()
        self._process = ctx.Process(target=_writer_loop, args=(str(data_dir), theirs))
        self._process.start()

    def __call__(self, *op: object) -> Any:
        self._conn.send(op)
        return self._conn.recv()

    def close(self) -> None:
        self._conn.send(None)
        self._process.join(30)


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[_Writer]:
    w = _Writer(tmp_path)
    yield w
    w.close()


def test_the_cache_answers_only_the_head_it_holds(tmp_path: Path, writer: _Writer) -> None:
    writer("put", "a", _state(1))
    cache = ReplyCache(Store(StoreConfig(data_dir=tmp_path), readonly=True), 1 << 20)
    try:
        assert cache.answer("a", 0) is None  # nothing kept yet
        body = writer("reply", "a")
        cache.remember("a", body)
        assert cache.answer("a", 0) == (body, len(_state(1)))
        assert cache.answer("a", 1) == (body, len(_state(1)))
        assert cache.answer("a", 2) is None
        assert cache.answer("b", 0) is None
        writer("put", "a", _state(2))
        assert cache.answer("a", 0) is None  # the head moved: dropped
        assert len(cache) == 0
        cache.remember("a", writer("reply", "a"))
        assert cache.answer("a", 0) is not None
        writer("delete_session", "a")
        assert cache.answer("a", 0) is None
    finally:
        cache.close()


def test_the_cache_keeps_to_its_bytes(tmp_path: Path, writer: _Writer) -> None:
    for i in range(10):
        writer("put", f"s{i}", _state(i, 10_000))
    cache = ReplyCache(Store(StoreConfig(data_dir=tmp_path), readonly=True), 35_000)
    try:
        for i in range(10):
            cache.remember(f"s{i}", writer("reply", f"s{i}"))
        assert len(cache) == 3 and cache.size_bytes <= 35_000
        assert [cache.answer(f"s{i}", 0) is not None for i in range(10)] == [False] * 7 + [True] * 3
        # A reply heavier than the whole budget is not kept, and evicts nothing.
        writer("put", "big", _state(0, 40_000))
        cache.remember("big", writer("reply", "big"))
        assert cache.answer("big", 0) is None
        assert [cache.answer(f"s{i}", 0) is not None for i in range(7, 10)] == [True] * 3
    finally:
        cache.close()


def test_the_cache_refuses_a_store_that_writes(tmp_path: Path) -> None:
    with Store(StoreConfig(data_dir=tmp_path)) as store, pytest.raises(ValueError, match="read-only Store"):
        ReplyCache(store, 1 << 20)


def test_a_closed_reader_forwards_rather_than_fails(tmp_path: Path, writer: _Writer) -> None:
    writer("put", "a", _state(1))
    store = Store(StoreConfig(data_dir=tmp_path), readonly=True)
    cache = ReplyCache(store, 1 << 20)
    cache.remember("a", writer("reply", "a"))
    store.close()
    assert cache.answer("a", 0) is None
    cache.close()


def test_a_reply_that_does_not_parse_is_not_kept(
    tmp_path: Path, writer: _Writer, caplog: pytest.LogCaptureFixture
) -> None:
    writer("put", "a", _state(1))
    cache = ReplyCache(Store(StoreConfig(data_dir=tmp_path), readonly=True), 1 << 20)
    try:
        cache.remember("a", b"\xff")  # not a GetResponse: a bug in the store process, logged
        assert len(cache) == 0 and cache.answer("a", 0) is None
        assert "does not parse" in caplog.text
    finally:
        cache.close()
