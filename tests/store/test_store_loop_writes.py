"""Store.write_on_loop: asyncio writes applied and committed on their event loop's own thread (the store process)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckpt.sidecar import Overloaded, PutRequest, Store, StoreConfig, WriteMode
from ckpt.sidecar.store import gather
from tests.store.support import CHAINS, patch_of, put_request, state_of, storage_of


def _config(tmp_path: Path, **overrides: Any) -> StoreConfig:
    return StoreConfig(data_dir=tmp_path / "data", chain_policy=CHAINS, sweep_interval_seconds=3600, **overrides)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(_config(tmp_path)) as s:
        yield s


class _Input:
    """What write_on_loop holds and releases, as a log."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def hold(self) -> None:
        self.calls.append("hold")

    def release(self) -> None:
        self.calls.append("release")


def _merges(store: Store, session: str, versions: int) -> list[PutRequest]:
    first = PutRequest(session, state_of(session, 1), request_id=f"{session}-1")
    return [first] + [
        PutRequest(session, patch_of(v), WriteMode.MERGE, expected_version=v - 1, request_id=f"{session}-{v}")
        for v in range(2, versions + 1)
    ]


def _merged(session: str, versions: int) -> bytes:
    return state_of(session, 1) + b"".join(patch_of(v) for v in range(2, versions + 1))


def test_the_loops_writes_commit_in_order_in_whole_batches(store: Store) -> None:
    settled: list[int] = []  # outcomes handed back to the loop, per wake-up of it
    sessions, versions = 16, 8

    async def writer(session: str) -> list[int]:
        return [(await store.asubmit(req)).version for req in _merges(store, session, versions)]

    async def main() -> list[list[int]]:
        loop = asyncio.get_running_loop()
        wake = loop.call_soon_threadsafe

        def counting_wake(callback: Any, *args: Any) -> Any:
            settled.append(len(args[0]))
            return wake(callback, *args)

        loop.call_soon_threadsafe = counting_wake  # type: ignore[method-assign,assignment]
        store.write_on_loop(loop)
        return await asyncio.gather(*(writer(f"s{i}") for i in range(sessions)))

    assert asyncio.run(main()) == [list(range(1, versions + 1))] * sessions
    # Every write of each round of the 16 writers in one commit, answered with one wake-up of the loop.
    assert dict(store.counters.batch_sizes) == {sessions: versions}
    assert settled == [sessions] * versions
    for i in range(sessions):
        assert store.get(f"s{i}").state == _merged(f"s{i}", versions)


def _slow_storage(store: Store, monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Each write transaction waits ``seconds`` to begin: a disk that stalls, or another process holding the
    storage's write lock (a private hook: the store's storage)."""
    storage = storage_of(store)
    real_write = storage.write

    def slow_write() -> Any:
        time.sleep(seconds)
        return real_write()

    monkeypatch.setattr(storage, "write", slow_write)


def test_a_lone_writer_commits_at_the_end_of_the_loops_turn_without_waiting(store: Store) -> None:
    held = _Input()

    async def main() -> None:
        store.write_on_loop(asyncio.get_running_loop(), hold_input=held.hold, release_input=held.release)
        for req in _merges(store, "alone", 20):
            await store.asubmit(req)

    asyncio.run(main())
    assert store.get("alone").state == _merged("alone", 20)
    assert store.counters.commits == 20
    assert store.counters.commit_delays == 0
    assert held.calls == []  # no other writer's requests to hold back


def _gathers_long(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every batch of concurrent writes gathers (up to max_commit_delay_seconds), however slow the machine: a
    batch goes at once when the gather's time passed since the last was handed over. (A private hook: how
    many commits' durations a batch gathers for is a constant of the module.)"""
    monkeypatch.setattr(gather, "GATHER_COMMITS", 1000)


def test_concurrent_writers_wait_for_each_other_with_the_input_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _gathers_long(monkeypatch)
    # The gather is counted from the last hand-over: a bound well above a commit's duration on a loaded
    # machine, so every round waits; a round closes as soon as all its writers are in, not at the bound.
    store = Store(_config(tmp_path, max_commit_delay_seconds=1.0))
    held = _Input()
    sessions, versions = 8, 10

    async def writer(session: str) -> None:
        for req in _merges(store, session, versions):
            await store.asubmit(req)

    async def main() -> None:
        store.write_on_loop(asyncio.get_running_loop(), hold_input=held.hold, release_input=held.release)
        await asyncio.gather(*(writer(f"s{i}") for i in range(sessions)))

    with store:
        asyncio.run(main())
        # Every round after the first waited for the others.
        assert store.counters.commit_delays == versions - 1
        assert store.counters.commit_delay_seconds > 0
        # Every hold is released before the next, and none is left held.
        assert held.calls == ["hold", "release"] * (len(held.calls) // 2)
        assert len(held.calls) >= 2 * store.counters.commit_delays
        assert store.counters.commits == versions  # each round of the writers in one commit
        for i in range(sessions):
            assert store.get(f"s{i}").state == _merged(f"s{i}", versions)


def test_writes_of_other_threads_go_on_meanwhile(store: Store) -> None:
    versions = 12
    errors: list[BaseException] = []

    def blocking_writer(session: str) -> None:
        try:
            for req in _merges(store, session, versions):
                put_request(store, req)
        except BaseException as exc:
            errors.append(exc)

    async def writer(session: str) -> None:
        for req in _merges(store, session, versions):
            await store.asubmit(req)

    async def main() -> None:
        store.write_on_loop(asyncio.get_running_loop())
        threads = [threading.Thread(target=blocking_writer, args=(f"t{i}",)) for i in range(4)]
        for t in threads:
            t.start()
        await asyncio.gather(*(writer(f"a{i}") for i in range(8)))
        for t in threads:
            await asyncio.get_running_loop().run_in_executor(None, t.join)

    asyncio.run(main())
    assert not errors
    for session in [f"t{i}" for i in range(4)] + [f"a{i}" for i in range(8)]:
        assert store.get(session).state == _merged(session, versions)


def test_close_commits_the_writes_still_waiting_on_the_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _gathers_long(monkeypatch)
    store = Store(_config(tmp_path, max_commit_delay_seconds=1.0))
    held = _Input()

    async def main() -> list[asyncio.Future[Any]]:
        store.write_on_loop(asyncio.get_running_loop(), hold_input=held.hold, release_input=held.release)
        # Two writers once, so that the next batch waits for more.
        await asyncio.gather(*(store.asubmit(PutRequest(f"w{i}", state_of(f"w{i}", 1))) for i in range(2)))
        held.calls.clear()
        futures = [store.asubmit(PutRequest("w0", patch_of(2), WriteMode.MERGE))]
        assert held.calls == ["hold"]  # the batch is waiting for the other writer
        store.close()
        await asyncio.wait_for(asyncio.gather(*futures), 5)  # answered once the loop runs again
        return futures

    futures = asyncio.run(main())
    assert [f.result().version for f in futures] == [2]
    with Store(_config(tmp_path)) as reopened:
        assert reopened.get("w0").state == state_of("w0", 1) + patch_of(2)


def _put_on_thread(store: Store, session: str, state: bytes) -> tuple[threading.Thread, list[int | Exception]]:
    """A blocking put on another thread; its version (or its error) lands in the list."""
    outcome: list[int | Exception] = []

    def put() -> None:
        try:
            outcome.append(store.put(session, state).version)
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=put, daemon=True)
    thread.start()
    return thread, outcome


@pytest.mark.parametrize("writers", [1, 4], ids=["lone writer", "concurrent writers"])
def test_writes_waiting_on_a_loop_that_closes_still_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writers: int
) -> None:
    """A sync wrapper's pattern: run_until_complete, then close, the last writes left to a task nobody awaits.
    The batch they wait in goes to the writer at the end of the loop's turn (a lone writer) or once it
    gathered (concurrent writers): callbacks a closed loop never runs. They commit all the same, and leave
    the write backlog."""
    _gathers_long(monkeypatch)
    store = Store(_config(tmp_path, max_queued_write_bytes=1000, max_commit_delay_seconds=1.0))
    loop = asyncio.new_event_loop()

    async def first_rounds() -> None:
        store.write_on_loop(asyncio.get_running_loop())
        for _ in range(2):
            await asyncio.gather(*(store.asubmit(PutRequest(f"w{i}", b"x" * 100)) for i in range(writers)))

    async def submit_late() -> None:
        for s in ("late1", "late2"):
            store.asubmit(PutRequest(s, b"y" * 100, request_id=s))

    async def last_writes() -> None:
        asyncio.get_running_loop().create_task(submit_late())  # runs once this returns, in the loop's last turn

    try:
        loop.run_until_complete(first_rounds())
        loop.run_until_complete(last_writes())
        assert store.counters.queued_write_bytes == 200  # still on the loop, not committed
    finally:
        loop.close()
    # A blocking write from another thread needs the room the last writes hold.
    thread, versions = _put_on_thread(store, "other", b"z" * 900)
    thread.join(5)
    try:
        assert versions == [1], "the blocking put still waits for the room the closed loop's writes hold"
        assert [store.get(s).version for s in ("late1", "late2")] == [1, 1]
        assert store.counters.queued_write_bytes == 0
    finally:
        store.close()
    with Store(_config(tmp_path)) as reopened:
        assert [reopened.get(s).state for s in ("late1", "late2", "other")] == [b"y" * 100] * 2 + [b"z" * 900]


def test_a_loop_attached_after_one_closed_with_writes_waiting_takes_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _gathers_long(monkeypatch)
    with Store(_config(tmp_path, max_commit_delay_seconds=1.0)) as store:
        first = asyncio.new_event_loop()

        async def on_first() -> None:
            store.write_on_loop(asyncio.get_running_loop())
            await asyncio.gather(*(store.asubmit(PutRequest(f"w{i}", b"x")) for i in range(4)))
            store.asubmit(PutRequest("late", b"y"))  # gathers (for 3 more) on a timer the loop never runs

        try:
            first.run_until_complete(on_first())
        finally:
            first.close()

        async def on_second() -> int:
            store.write_on_loop(asyncio.get_running_loop())
            return (await asyncio.wait_for(store.asubmit(PutRequest("next", b"z")), 5)).version

        assert asyncio.run(on_second()) == 1
        assert store.get("late").state == b"y"


def test_the_write_backlog_bound_holds_on_the_loop(tmp_path: Path) -> None:
    state = state_of("a", 1)
    with Store(_config(tmp_path, max_queued_write_bytes=len(state) + 10)) as store:

        async def main() -> None:
            store.write_on_loop(asyncio.get_running_loop())
            first = store.asubmit(PutRequest("a", state, request_id="a1"))
            # Both in one turn of the loop: the first is still queued, so the second does not fit.
            with pytest.raises(Overloaded, match="max_queued_write_bytes"):
                store.asubmit(PutRequest("b", state_of("b", 1), request_id="b1"))
            assert (await first).version == 1
            # Answered, its bytes no longer count: the retry lands.
            assert (await store.asubmit(PutRequest("b", state_of("b", 1), request_id="b1"))).version == 1

        asyncio.run(main())
        assert store.counters.queued_write_bytes == 0


def test_a_read_only_store_refuses_to_write_on_a_loop(tmp_path: Path) -> None:
    with Store(_config(tmp_path)) as writer:
        writer.put("a", state_of("a", 1))
    with Store(_config(tmp_path), readonly=True) as store, pytest.raises(ValueError, match="read-only"):
        asyncio.run(_attach(store))


async def _attach(store: Store) -> None:
    store.write_on_loop(asyncio.get_running_loop())


def test_a_stalled_commit_holds_the_input_only_briefly(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    held = _Input()
    _slow_storage(store, monkeypatch, 0.5)

    async def main() -> None:
        store.write_on_loop(asyncio.get_running_loop(), hold_input=held.hold, release_input=held.release)
        writes = [store.asubmit(PutRequest(s, state_of(s, 1))) for s in ("a", "b")]  # one batch of two
        await asyncio.sleep(0.2)
        # Reading goes on (so the loop can refuse writes past the backlog bound, and serve reads).
        assert held.calls == ["hold", "release"]
        assert not any(w.done() for w in writes)
        assert [(await asyncio.wait_for(w, 5)).version for w in writes] == [1, 1]

    asyncio.run(main())
    assert held.calls == ["hold", "release"]


def test_a_batch_whose_gather_time_passed_during_the_last_commit_goes_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = _Input()
    with Store(_config(tmp_path, max_commit_delay_seconds=0.005)) as store:
        _slow_storage(store, monkeypatch, 0.03)  # each commit outlasts the longest gather (5 ms)

        async def writer(session: str) -> None:
            for req in _merges(store, session, 5):
                await store.asubmit(req)

        async def main() -> None:
            store.write_on_loop(asyncio.get_running_loop(), hold_input=held.hold, release_input=held.release)
            await asyncio.gather(*(writer(f"s{i}") for i in range(4)))

        asyncio.run(main())
        # The writers' next writes, read once a commit answered them, went at once: no batch waited.
        assert store.counters.commit_delays == 0
        assert store.counters.commits == 5
        for i in range(4):
            assert store.get(f"s{i}").state == _merged(f"s{i}", 5)
