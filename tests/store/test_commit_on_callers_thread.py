"""A lone put or append from a thread other than the main one, finding the writer idle, commits on its own
thread (Writer.run_or_submit): the same batch, durable when it returns, one batch at a time; the main
thread's writes and the writes of many threads at once still go through the writer thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ckpt.sidecar import Store, StoreConfig, WriteMode
from ckpt.sidecar.errors import Unavailable
from ckpt.sidecar.store import NewEvent, PutRequest
from tests.store.support import committing_threads, queued_ops, storage_write_lock_held

#: A state and a MERGE patch onto it (protobuf fields 1 and 2).
ONE, TWO = b"\x0a\x03one", b"\x12\x03two"


def _on_a_thread(name: str, body: Callable[[], object]) -> None:
    thread = threading.Thread(target=body, name=name)
    thread.start()
    thread.join(30)
    assert not thread.is_alive()


def test_a_lone_thread_commits_its_own_puts_and_appends(tmp_path: Path) -> None:
    config = StoreConfig(data_dir=tmp_path / "data")
    with Store(config) as store, committing_threads(store) as threads:

        def agent() -> None:
            store.put("s", ONE)
            store.put("s", TWO, mode=WriteMode.MERGE)
            store.append_events("s", [NewEvent("tool", b"ls")])
            store.append_events("s", [NewEvent("tool", b"cat")], put=PutRequest("", b"three"))

        _on_a_thread("agent", agent)
        assert threads == ["agent"] * 4
    with Store(config) as store:  # durable when each call returned
        assert [store.get("s", v).state for v in (1, 2, 3)] == [ONE, ONE + TWO, b"three"]
        assert [e.payload for e in store.read_events("s").events] == [b"ls", b"cat"]


def test_the_main_threads_writes_commit_on_the_writer_thread(tmp_path: Path) -> None:
    # A signal handler may raise in the main thread between any two steps of a commit.
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store, committing_threads(store) as threads:
        store.put("s", b"one")
        store.append_events("s", [NewEvent("tool", b"ls")])
        assert threads == ["ckpt-writer", "ckpt-writer"]


def test_many_threads_share_commits_and_every_write_stays(tmp_path: Path) -> None:
    config = StoreConfig(data_dir=tmp_path / "data")
    writers, puts = 16, 25

    def agent(i: int) -> None:
        for n in range(puts):
            store.put(f"s{i}", b"%d" % n)
            store.append_events(f"s{i}", [NewEvent("step", b"%d" % n)])

    with Store(config) as store:
        with ThreadPoolExecutor(writers) as pool:
            list(pool.map(agent, range(writers)))
        # Callers committing alone would leave every batch at one write.
        assert max(store.stats()["batch_sizes"]) > 1
    with Store(config) as store:
        for i in range(writers):
            assert store.get(f"s{i}").version == puts
            assert [e.payload for e in store.read_events(f"s{i}").events] == [b"%d" % n for n in range(puts)]


def test_close_waits_for_a_commit_running_on_a_callers_thread(tmp_path: Path) -> None:
    config = StoreConfig(data_dir=tmp_path / "data")
    store = Store(config)
    outcome: list[object] = []
    closed = threading.Event()
    with committing_threads(store) as threads:
        # The caller's commit waits for the storage's write lock, held here as another process would.
        with storage_write_lock_held(store):
            putter = threading.Thread(target=lambda: outcome.append(store.put("s", b"kept")), name="agent")
            putter.start()
            deadline = time.monotonic() + 10
            while not store.counters.queued_write_bytes or queued_ops(store):
                assert time.monotonic() < deadline, "the put was never admitted"
                time.sleep(0.001)

            def close() -> None:
                store.close()
                closed.set()

            closer = threading.Thread(target=close)
            closer.start()
            time.sleep(0.3)
            assert not closed.is_set(), "close() returned while a write it had admitted was committing"
        putter.join(30)
        closer.join(30)
        assert closed.is_set()
        assert threads == ["agent"]
    assert len(outcome) == 1 and outcome[0].version == 1  # type: ignore[attr-defined]
    with Store(config) as store:
        assert store.get("s").state == b"kept"


def test_a_closed_store_refuses_a_callers_write_as_the_writer_does(tmp_path: Path) -> None:
    store = Store(StoreConfig(data_dir=tmp_path / "data"))
    store.close()
    refused: list[BaseException] = []

    def agent() -> None:
        try:
            store.put("s", b"late")
        except Unavailable as exc:
            refused.append(exc)

    _on_a_thread("agent", agent)
    assert len(refused) == 1 and "closing" in str(refused[0])


def test_a_readonly_store_refuses_a_callers_write(tmp_path: Path) -> None:
    config = StoreConfig(data_dir=tmp_path / "data")
    with Store(config) as store:
        store.put("s", b"one")
    with Store(config, readonly=True) as store:
        refused: list[BaseException] = []

        def agent() -> None:
            with pytest.raises(Unavailable, match="read-only") as info:
                store.append_events("s", [NewEvent("tool", b"ls")])
            refused.append(info.value)

        _on_a_thread("agent", agent)
        assert len(refused) == 1
