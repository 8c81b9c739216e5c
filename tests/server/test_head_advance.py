"""A Get of the latest version that the gRPC process reads itself after the head moved advances the head
it last read of the session with the frames written since (replycache.py, store/headreads.py), rather
than decoding the chain whole; whatever moved the head, every Get equals the embedded Store's read.

Each test drives a real `ckpt serve` and checks every Get against a read-only Store on the same data
directory; ckpt_reply_cache_advanced_reads_total tells the heads advanced from those decoded whole.
"""

from __future__ import annotations

import random
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckpt.sidecar.client import CheckpointClient, EventFilter, event
from ckpt.sidecar.config import StoreConfig
from ckpt.sidecar.store.engine import Store
from ckpt.v1 import service_pb2
from tests.server.test_workers import clients_by_worker, start_workers
from tests.support import (
    Sidecar,
    free_port,
    metric,
    start_sidecar,
    start_sidecar_sweeping,
    start_sidecar_with_metrics,
    wait_for_metrics,
)

ADVANCED = "ckpt_reply_cache_advanced_reads_total"
FULL = service_pb2.FRAME_KIND_FULL


def _field(data: bytes) -> bytes:
    # Field 2, length-delimited (lengths under 2**14): a well-formed MERGE patch.
    n = len(data)
    return b"\x12" + (bytes([n]) if n < 0x80 else bytes([(n & 0x7F) | 0x80, n >> 7])) + data


def _base(seed: int, size: int = 40_000) -> bytes:
    rng = random.Random(seed)
    return b"".join(_field(bytes(rng.randrange(97, 123) for _ in range(100))) for _ in range(size // 102))


def _step(i: int) -> bytes:
    return _field(f"step {i}: the tool answered, the plan moved on".encode() * 4)


def _advanced(sidecar: Sidecar) -> float:
    return metric(sidecar, ADVANCED, missing=0.0)


def _worker_advanced(metrics_address: str) -> float:
    text = urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=10).read().decode()
    found = re.search(rf"^{ADVANCED} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


class EmbeddedHeads:
    """A read-only Store on the sidecar's data directory: what every Get of a head must equal (shared with
    test_large_head_reads)."""

    def __init__(self, data_dir: Path) -> None:
        self.store = Store(StoreConfig(data_dir=data_dir), readonly=True)

    def check(self, got: service_pb2.GetResponse, session_id: str) -> None:
        head = self.store.get(session_id, use_cache=False)
        assert (got.version, got.state) == (head.version, head.state)
        assert got.info.state_size == head.info.state_size == len(got.state)
        assert got.info.stored_bytes == head.info.stored_bytes


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Sidecar]:
    s = start_sidecar_with_metrics(tmp_path / "data")
    yield s
    assert s.stop() == 0, s.log()


def test_gets_after_puts_advance_the_head_read_last(sidecar: Sidecar, tmp_path: Path) -> None:
    embedded = EmbeddedHeads(tmp_path / "data")
    with CheckpointClient(sidecar.unix_target) as client:
        client.put("thread", _base(1))
        embedded.check(client.get("thread"), "thread")  # decoded whole, its reader kept
        for i in range(40):
            if i % 7 == 6:  # a REPLACE that grows the state: a DELTA frame in the same stream, or a new one
                client.put("thread", embedded.store.get("thread", use_cache=False).state + _step(i))
            else:
                client.merge("thread", _step(i))
            if i % 3 == 0:  # a second write before the Get: two frames to advance by
                client.merge("thread", _step(1000 + i))
            # A LangGraph saver's get_tuple reads the head with its pending writes: half the Gets with events.
            if i % 2:
                client.append_events("thread", [event("write", b"w%d" % i)])
                got = client.get("thread", events=EventFilter(types=["write"]))
                assert [e.payload for e in got.events.events][-1] == b"w%d" % i
            else:
                got = client.get("thread")
            embedded.check(got, "thread")
            assert client.get("thread") == got.__class__(version=got.version, state=got.state, info=got.info)
        wait_for_metrics(lambda: _advanced(sidecar) >= 35, timeout_seconds=10.0)
    embedded.store.close()


def test_a_session_deleted_and_written_again_is_read_whole(sidecar: Sidecar, tmp_path: Path) -> None:
    embedded = EmbeddedHeads(tmp_path / "data")
    with CheckpointClient(sidecar.unix_target) as client:
        client.put("thread", _base(1))
        for i in range(6):
            client.merge("thread", _step(i))
            embedded.check(client.get("thread"), "thread")  # version 2 decoded whole, 3..7 advanced
        client.delete("thread")
        # The same versions, the same sizes, another state: version 8 follows a version 7 that is not the
        # one kept, and does not link to it.
        client.put("thread", _base(2))
        for i in range(7):
            client.merge("thread", _step(i))
        embedded.check(client.get("thread"), "thread")  # decoded whole
        client.merge("thread", _step(7))
        embedded.check(client.get("thread"), "thread")  # advanced
        wait_for_metrics(lambda: _advanced(sidecar) == 6, timeout_seconds=10.0)
    embedded.store.close()


def test_a_fork_reads_its_own_chain(sidecar: Sidecar, tmp_path: Path) -> None:
    embedded = EmbeddedHeads(tmp_path / "data")
    with CheckpointClient(sidecar.unix_target) as client:
        client.put("a", _base(1))
        for i in range(4):
            client.merge("a", _step(i))
            embedded.check(client.get("a"), "a")
        client.fork("a", "b", version=3)
        embedded.check(client.get("b"), "b")
        for i in range(4):
            client.merge("b", _step(100 + i))
            client.merge("a", _step(200 + i))
            embedded.check(client.get("b"), "b")
            embedded.check(client.get("a"), "a")
        wait_for_metrics(lambda: _advanced(sidecar) >= 10, timeout_seconds=10.0)
    embedded.store.close()


@pytest.mark.parametrize(
    "quiet",
    [
        ("--keyframe-after-quiet-seconds", "1", "--fold-after-quiet-seconds", "0"),
        ("--fold-after-quiet-seconds", "1"),  # the run before the head becomes PREFIX frames too
    ],
    ids=["keyframe", "fold"],
)
def test_a_quiet_keyframe_under_the_kept_head_is_seen(tmp_path: Path, quiet: tuple[str, ...]) -> None:
    """The sweeper rewrites the head's frame as a FULL one (a new chain) of the same state (a quiet
    keyframe, or a fold of its run); the next Gets are right, and the kept reader still advances."""
    port = free_port()
    sidecar = start_sidecar_sweeping(tmp_path / "data", 0.2, *quiet, "--metrics-port", str(port))
    sidecar.metrics_port = port  # type: ignore[attr-defined]
    embedded = EmbeddedHeads(tmp_path / "data")
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            client.put("thread", _base(1))
            for i in range(6):
                client.merge("thread", _step(i))
                kept = client.get("thread")
                embedded.check(kept, "thread")
            assert kept.info.frame_kind != FULL
            deadline = time.monotonic() + 15
            while next(client.history("thread")).frame_kind != FULL and time.monotonic() < deadline:
                time.sleep(0.1)
            assert next(client.history("thread")).frame_kind == FULL
            advanced = _advanced(sidecar)
            for i in range(3):
                client.merge("thread", _step(10 + i))
                embedded.check(client.get("thread"), "thread")
            # The FULL frame holds the state the reader holds, and a zstd stream's back-references reach
            # only into the window's last bytes: the frames after it decode the same from the kept stream,
            # which their xxh3 confirms.
            wait_for_metrics(lambda: _advanced(sidecar) == advanced + 3, timeout_seconds=10.0)
    finally:
        embedded.store.close()
        assert sidecar.stop() == 0, sidecar.log()


def test_another_workers_writes_are_read_right(tmp_path: Path) -> None:
    sidecar, metrics = start_workers(tmp_path / "data")
    embedded = EmbeddedHeads(tmp_path / "data")
    try:
        by_worker = clients_by_worker(sidecar.targets[0], metrics)
        reader, writers = by_worker[0][0], by_worker[1]
        writers[0].put("thread", _base(1))
        for i in range(12):
            (writers[0] if i % 2 else reader).merge("thread", _step(i))
            if i % 3 == 0:
                writers[0].merge("thread", _step(100 + i))
            embedded.check(reader.get("thread"), "thread")
            embedded.check(writers[0].get("thread"), "thread")
        # A write after another process's starts a new chain (its encoder is stale); writes in a row by
        # one continue it, and the other worker's gRPC process advances the head it read by them.
        for i in range(4):
            writers[0].merge("thread", _step(200 + i))
            embedded.check(reader.get("thread"), "thread")
        wait_for_metrics(lambda: _worker_advanced(metrics[0]) >= 3, timeout_seconds=10.0)
        for group in by_worker:
            for client in group:
                client.close()
    finally:
        embedded.store.close()
        assert sidecar.stop() == 0, sidecar.log()


def test_kept_readers_stay_within_the_reply_cache_budget(tmp_path: Path) -> None:
    """A reader weighs its state, its stream's window and a fixed part: six sessions' readers and replies
    do not fit in 600 KB, and the least recently used go."""
    budget, port = 600_000, free_port()
    sidecar = start_sidecar(tmp_path / "data", "--reply-cache-bytes", str(budget), "--metrics-port", str(port))
    sidecar.metrics_port = port  # type: ignore[attr-defined]
    embedded = EmbeddedHeads(tmp_path / "data")
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            sessions = [f"thread-{n}" for n in range(6)]
            for n, session in enumerate(sessions):
                client.put(session, _base(n))
            for i in range(3):
                for session in sessions:
                    client.merge(session, _step(i))
                    embedded.check(client.get(session), session)
            # The last session read: its reader is the most recently used, and advances.
            for i in range(3, 6):
                client.merge(sessions[-1], _step(i))
                embedded.check(client.get(sessions[-1]), sessions[-1])
            wait_for_metrics(lambda: _advanced(sidecar) >= 3, timeout_seconds=10.0)
            held = metric(sidecar, 'ckpt_cache_bytes{cache="reply_cache"}')
            assert 0 < held <= budget
    finally:
        embedded.store.close()
        assert sidecar.stop() == 0, sidecar.log()
