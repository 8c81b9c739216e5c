"""The store's asyncio write path (Store.asubmit), on real LMDB directories."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ckpt.sidecar import (
    InvalidArgument,
    Overloaded,
    PutRequest,
    Store,
    StoreConfig,
    Unavailable,
    VersionConflict,
    WriteMode,
)
from ckpt.sidecar.store import OFF_LOOP_PATCH_BYTES
from tests.store.support import CHAINS, patch_of, state_of, writer_held


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(StoreConfig(data_dir=tmp_path / "data", chain_policy=CHAINS, sweep_interval_seconds=3600)) as s:
        yield s


def test_concurrent_tasks_each_get_their_commit_with_one_loop_wake_up_per_commit(store: Store) -> None:
    wake_ups: list[int] = []  # the writes each wake-up of the loop resolves
    sessions, versions = 16, 8

    async def session_writer(i: int) -> list[int]:
        got = [(await store.asubmit(PutRequest(f"s{i}", state_of(f"s{i}", 1)))).version]
        for v in range(2, versions + 1):
            req = PutRequest(f"s{i}", patch_of(v), WriteMode.MERGE, expected_version=v - 1, request_id=f"r{i}-{v}")
            got.append((await store.asubmit(req)).version)
        return got

    async def main() -> list[list[int]]:
        loop = asyncio.get_running_loop()
        wake = loop.call_soon_threadsafe

        def counting_wake(callback: Any, *args: Any) -> Any:
            wake_ups.append(len(args[0]))
            return wake(callback, *args)

        loop.call_soon_threadsafe = counting_wake  # type: ignore[method-assign,assignment]
        return await asyncio.gather(*(session_writer(i) for i in range(sessions)))

    assert asyncio.run(main()) == [list(range(1, versions + 1))] * sessions
    # Every write was resolved, and never with more than one wake-up of the
    # loop per commit (the store also committed the writes in fewer commits).
    assert sum(wake_ups) == sessions * versions
    assert len(wake_ups) <= store.counters.commits < sessions * versions
    for i in range(sessions):
        assert store.get(f"s{i}").state == state_of(f"s{i}", 1) + b"".join(patch_of(v) for v in range(2, versions + 1))


def test_errors_reach_the_awaiting_task(store: Store) -> None:
    async def main() -> None:
        await store.asubmit(PutRequest("a", state_of("a", 1)))
        with pytest.raises(VersionConflict) as conflict:
            await store.asubmit(PutRequest("a", state_of("a", 2), expected_version=0))
        assert conflict.value.current_version == 1
        # Validation happens before queueing: asubmit raises, nothing is queued.
        with pytest.raises(InvalidArgument, match="session_id is empty"):
            store.asubmit(PutRequest("", b"x"))
        with pytest.raises(InvalidArgument, match="not a valid MERGE patch"):
            store.asubmit(PutRequest("a", b"\xff", WriteMode.MERGE))

    asyncio.run(main())
    assert store.get("a").version == 1


def test_a_cancelled_wait_does_not_withdraw_the_write(store: Store) -> None:
    async def main() -> None:
        future = store.asubmit(PutRequest("kept", state_of("kept", 1), request_id="once"))
        future.cancel()
        # The writer is FIFO: once a later write is committed, so is the first.
        await store.asubmit(PutRequest("later", state_of("later", 1)))
        assert future.cancelled()

    asyncio.run(main())
    assert store.get("kept").state == state_of("kept", 1)
    # A retry with the same request id learns the outcome and writes nothing.
    again = store.put("kept", state_of("kept", 1), request_id="once")
    assert (again.version, again.replayed) == (1, True)


def test_a_write_whose_loop_closed_still_commits(store: Store) -> None:
    async def submit_and_leave() -> None:
        store.asubmit(PutRequest("orphan", state_of("orphan", 1)))

    asyncio.run(submit_and_leave())  # the loop is closed, maybe before the writer settles
    store.put("barrier", state_of("barrier", 1))  # FIFO: the orphan is committed by now
    assert store.get("orphan").version == 1


def test_the_idle_writer_keeps_no_settled_write_alive(store: Store) -> None:
    # An idle writer must not hold its last batch: those ops carry the
    # requests' states (up to max_state_bytes each) and the callers' futures.
    async def main() -> weakref.ref[asyncio.Future[Any]]:
        future = store.asubmit(PutRequest("s", state_of("s", 1)))
        await future
        return weakref.ref(future)

    settled = asyncio.run(main())
    gc.collect()
    assert settled() is None


def _large_patch(version: int) -> bytes:
    """A well-formed MERGE patch of at least OFF_LOOP_PATCH_BYTES (checked off the loop)."""
    patch = patch_of(version)
    return patch * (OFF_LOOP_PATCH_BYTES // len(patch) + 1)


def test_a_large_patch_is_checked_off_the_loop_and_its_error_reaches_the_future(store: Store) -> None:
    async def main() -> None:
        await store.asubmit(PutRequest("a", state_of("a", 1)))
        broken = store.asubmit(PutRequest("a", _large_patch(2) + b"\xff", WriteMode.MERGE))
        with pytest.raises(InvalidArgument, match="not a valid MERGE patch"):
            await broken
        assert (await store.asubmit(PutRequest("a", patch_of(2), WriteMode.MERGE))).version == 2

    asyncio.run(main())
    assert store.counters.queued_write_bytes == 0  # the refused patch no longer counts against the backlog


def test_writes_after_a_large_patch_commit_after_it(store: Store) -> None:
    """The writes submitted behind a patch being checked off the loop wait for it: the order stands."""

    async def main() -> list[int]:
        await store.asubmit(PutRequest("a", state_of("a", 1)))
        large = PutRequest("a", _large_patch(2), WriteMode.MERGE, expected_version=1)
        futures = [store.asubmit(large)]
        for v in range(3, 8):
            futures.append(store.asubmit(PutRequest("a", patch_of(v), WriteMode.MERGE, expected_version=v - 1)))
        return [(await f).version for f in futures]

    assert asyncio.run(main()) == list(range(2, 8))
    assert store.get("a").state == state_of("a", 1) + _large_patch(2) + b"".join(patch_of(v) for v in range(3, 8))


def test_a_large_patch_past_the_backlog_is_refused_at_once(tmp_path: Path) -> None:
    config = StoreConfig(data_dir=tmp_path / "data", max_queued_write_bytes=OFF_LOOP_PATCH_BYTES)

    async def main(store: Store) -> None:
        await store.asubmit(PutRequest("a", state_of("a", 1)))
        with writer_held(store) as gate:
            first = store.asubmit(PutRequest("b", _large_patch(1), WriteMode.MERGE))  # nothing queued: taken
            with pytest.raises(Overloaded):
                store.asubmit(PutRequest("a", _large_patch(2), WriteMode.MERGE))
            gate.set()
            assert (await first).version == 1

    with Store(config) as store:
        asyncio.run(main(store))
        assert store.session("a").head_version == 1


def test_closing_refuses_a_large_patch_still_being_checked_and_every_write_behind_it(tmp_path: Path) -> None:
    store = Store(StoreConfig(data_dir=tmp_path / "data"))
    store.put("a", state_of("a", 1))

    async def main() -> None:
        executor = ThreadPoolExecutor(1)
        asyncio.get_running_loop().set_default_executor(executor)
        gate = threading.Event()
        executor.submit(gate.wait)  # the check waits for the close
        large = store.asubmit(PutRequest("a", _large_patch(2), WriteMode.MERGE))
        behind = store.asubmit(PutRequest("a", patch_of(3), WriteMode.MERGE))  # checked at once, in line
        other = store.asubmit(PutRequest("b", state_of("b", 1)))
        store.close()  # before the large patch's check runs
        gate.set()
        with pytest.raises(Unavailable, match="closing; no new writes"):
            await large
        for later in (behind, other):
            with pytest.raises(Unavailable, match="a write submitted before this one on the same event loop"):
                await later

    asyncio.run(main())
    with Store(StoreConfig(data_dir=tmp_path / "data")) as reopened:
        assert list(reopened.session_ids()) == ["a"]
        assert reopened.get("a").version == 1
        assert reopened.get("a").state == state_of("a", 1)


@pytest.mark.parametrize("gathered_on_the_loop", [False, True])
def test_a_large_patch_and_the_writes_behind_it_commit_after_their_loop_closes(
    tmp_path: Path, gathered_on_the_loop: bool
) -> None:
    """A sync wrapper's pattern: ``run_until_complete`` then ``close``, the patch's check still to run."""
    config = StoreConfig(data_dir=tmp_path / "data", max_queued_write_bytes=4 * OFF_LOOP_PATCH_BYTES)
    loop = asyncio.new_event_loop()
    executor = ThreadPoolExecutor(1)
    loop.set_default_executor(executor)
    gate = threading.Event()
    executor.submit(gate.wait)  # the check runs only once the loop is closed

    async def submit(store: Store) -> None:
        if gathered_on_the_loop:
            store.write_on_loop(asyncio.get_running_loop())
        store.asubmit(PutRequest("big", _large_patch(1), WriteMode.MERGE))
        store.asubmit(PutRequest("small", state_of("small", 1)))  # in line behind it

    with Store(config) as store:
        loop.run_until_complete(submit(store))
        loop.close()
        gate.set()
        executor.shutdown(wait=True)  # the check has run
        store.put("barrier", state_of("barrier", 1))  # FIFO: whatever was queued before it is committed
        assert store.get("big").state == _large_patch(1)
        assert store.get("small").version == 1
        assert store.counters.queued_write_bytes == 0
        # A blocking put needing most of the backlog gets its room.
        done: list[int] = []
        put = threading.Thread(target=lambda: done.append(store.put("other", b"y" * 3 * OFF_LOOP_PATCH_BYTES).version))
        put.start()
        put.join(10)
        assert done == [1]
