"""The write backlog is bounded (max_queued_write_bytes): blocking writers wait, asyncio writers
and the sidecar's unary Puts are refused UNAVAILABLE at once (clients retry), streams wait.

Store tests hold the writer with an op of their own; sidecar tests stall a real
`ckpt serve`'s writer from outside, by holding LMDB's write lock in this process
(as a stalled disk would), so the backlog builds deterministically.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import lmdb
import pytest

from ckpt.sidecar import Overloaded, PutRequest, PutResult, Store, StoreConfig, Unavailable
from ckpt.sidecar.client import AsyncCheckpointClient, CheckpointClient, UnavailableError
from ckpt.sidecar.server.metrics import Metrics
from ckpt.sidecar.server.service import CheckpointService
from ckpt.v1 import service_pb2
from tests.store.support import put_later, queued_ops, room_waiters, wait_queued, writer_held
from tests.support import Sidecar, free_port, metric, start_sidecar

STATE_BYTES = 100_000
BUDGET_BYTES = 3 * STATE_BYTES  # three states fit, the fourth waits


def state(i: int, size: int = STATE_BYTES) -> bytes:
    return bytes([i % 251]) * (size - 8) + i.to_bytes(8, "big")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(StoreConfig(data_dir=tmp_path / "data", max_queued_write_bytes=BUDGET_BYTES)) as s:
        yield s


def test_max_queued_write_bytes_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"max_queued_write_bytes must be >= 1, got 0"):
        StoreConfig(data_dir=tmp_path, max_queued_write_bytes=0)


def test_blocking_writes_wait_for_room_then_all_commit(store: Store) -> None:
    with writer_held(store) as gate, concurrent.futures.ThreadPoolExecutor(1) as pool:
        done = pool.submit(store.put_many, [PutRequest(f"s{i}", state(i)) for i in range(10)])
        time.sleep(0.3)
        # Three states fill the budget exactly; the fourth write waits for room.
        assert queued_ops(store) == 3 and room_waiters(store) == 1 and not done.done()
        assert store.counters.queued_write_bytes == BUDGET_BYTES
        gate.set()
        results = done.result(30)
    assert [r.version for r in results if isinstance(r, PutResult)] == [1] * 10
    assert store.counters.queued_write_bytes == 0
    assert all(store.get(f"s{i}").state == state(i) for i in range(10))


def test_asyncio_writes_past_the_budget_are_refused_and_a_retry_lands_once(store: Store) -> None:
    async def main() -> None:
        with writer_held(store) as gate:
            queued = [store.asubmit(PutRequest(f"s{i}", state(i), request_id=f"r{i}")) for i in range(3)]
            with pytest.raises(Overloaded) as refused:
                store.asubmit(PutRequest("s3", state(3), request_id="r3"))
            assert isinstance(refused.value, Unavailable)  # UNAVAILABLE: clients retry it
            message = str(refused.value)
            assert f"{BUDGET_BYTES} bytes of writes are queued" in message
            assert f"this {STATE_BYTES}-byte write" in message
            assert f"max_queued_write_bytes ({BUDGET_BYTES})" in message
            assert "same request_id" in message
            gate.set()
            assert [(await f).version for f in queued] == [1, 1, 1]
        retried = await store.asubmit(PutRequest("s3", state(3), request_id="r3"))
        again = await store.asubmit(PutRequest("s3", state(3), request_id="r3"))
        assert (retried.version, retried.replayed, again.replayed) == (1, False, True)

    asyncio.run(main())
    assert store.session("s3").head_version == 1
    assert store.get("s3").state == state(3)


def test_a_write_larger_than_the_budget_goes_alone(store: Store) -> None:
    big = state(7, 4 * BUDGET_BYTES)

    async def main() -> None:
        with writer_held(store) as gate:
            first = store.asubmit(PutRequest("big", big))  # nothing queued: taken
            with pytest.raises(Overloaded):
                store.asubmit(PutRequest("small", b"x"))  # anything behind it waits its turn
            gate.set()
            assert (await first).version == 1
        assert (await store.asubmit(PutRequest("small", b"x"))).version == 1

    asyncio.run(main())
    assert store.get("big").state == big


def test_a_put_interrupted_before_it_is_queued_leaves_no_bytes_counted(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ctrl-C between admitting a write and queueing it (a signal handler raising there).
    writer = store._writer
    put_locked = writer.put_locked
    interrupts = iter([True])

    def interrupted_once(op: object) -> None:
        if next(interrupts, False):
            raise KeyboardInterrupt
        put_locked(op)  # type: ignore[arg-type]

    monkeypatch.setattr(writer, "put_locked", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        store.put("s", state(1, 2 * BUDGET_BYTES), request_id="r1")
    assert store.counters.queued_write_bytes == 0
    # The retry lands once, and the budget is whole: three states still fit before the fourth waits.
    assert store.put("s", state(1, 2 * BUDGET_BYTES), request_id="r1").version == 1
    assert store.put("s", state(1, 2 * BUDGET_BYTES), request_id="r1").version == 1
    assert store.get("s").version == 1
    with writer_held(store) as gate:
        futures = [put_later(store, PutRequest(f"b{i}", state(i))) for i in range(3)]
        wait_queued(store, 3)
        assert room_waiters(store) == 0
        assert store.counters.queued_write_bytes == BUDGET_BYTES
        gate.set()
        assert [f.result(timeout=10).version for f in futures] == [1, 1, 1]
    assert store.counters.queued_write_bytes == 0


def test_close_refuses_writes_waiting_for_room_and_commits_the_queued(tmp_path: Path) -> None:
    config = StoreConfig(data_dir=tmp_path / "data", max_queued_write_bytes=BUDGET_BYTES)
    store = Store(config)
    with concurrent.futures.ThreadPoolExecutor(2) as pool, writer_held(store) as gate:
        queued = [put_later(store, PutRequest(f"s{i}", state(i))) for i in range(3)]
        wait_queued(store, 3)
        waiting = pool.submit(store.put, "s3", state(3))
        time.sleep(0.2)
        assert not waiting.done()
        closing = pool.submit(store.close)
        with pytest.raises(Unavailable, match="closing"):
            waiting.result(10)
        gate.set()
        closing.result(30)
    assert [f.result(1).version for f in queued] == [1, 1, 1]
    with Store(config) as reopened:
        assert [reopened.get(f"s{i}").state == state(i) for i in range(3)] == [True] * 3
        assert list(reopened.session_ids()) == ["s0", "s1", "s2"]


# -- a real sidecar ------------------------------------------------------------


@contextlib.contextmanager
def lmdb_write_lock_held(sidecar: Sidecar) -> Iterator[None]:
    """Stall the sidecar's writer: it waits for LMDB's write lock, which this process holds."""
    env = lmdb.open(str(sidecar.data_dir / "lmdb"), subdir=True, max_dbs=8)
    try:
        txn = env.begin(write=True)
        try:
            yield
        finally:
            txn.abort()
    finally:
        env.close()


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Sidecar]:
    metrics_port = free_port()
    s = start_sidecar(
        tmp_path / "data", "--max-queued-write-bytes", str(BUDGET_BYTES), "--metrics-port", str(metrics_port)
    )
    s.metrics_port = metrics_port  # type: ignore[attr-defined]
    try:
        yield s
    finally:
        s.stop()


def queued_write_bytes(sidecar: Sidecar) -> float:
    return metric(sidecar, "ckpt_queued_write_bytes")


def test_sidecar_refuses_unary_puts_past_the_budget_and_takes_them_once_there_is_room(sidecar: Sidecar) -> None:
    with CheckpointClient(sidecar.unix_target, retries=0) as client, concurrent.futures.ThreadPoolExecutor(10) as pool:
        with lmdb_write_lock_held(sidecar):
            calls = [pool.submit(client.put, f"s{i}", state(i)) for i in range(10)]
            deadline = time.monotonic() + 10
            while sum(c.done() for c in calls) < 7 and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.2)  # any further refusal would have come by now
            refused = [c for c in calls if c.done()]
            # Three states fill the budget exactly: those wait for the writer, the rest are refused at once.
            assert len(refused) == 7, [c.exception() for c in refused]
            for call in refused:
                error = call.exception()
                assert isinstance(error, UnavailableError), error
                assert f"max_queued_write_bytes ({BUDGET_BYTES})" in str(error)
            assert queued_write_bytes(sidecar) == BUDGET_BYTES
        taken = [c.result(30) for c in calls if c not in refused]
        assert [r.version for r in taken] == [1, 1, 1]
    assert queued_write_bytes(sidecar) == 0


def test_sidecar_clients_retry_a_refused_put_until_it_lands_once(sidecar: Sidecar) -> None:
    async def main() -> None:
        async with AsyncCheckpointClient(sidecar.unix_target) as client:  # default retries
            with lmdb_write_lock_held(sidecar):
                puts = [asyncio.ensure_future(client.put(f"s{i}", state(i))) for i in range(12)]
                await asyncio.sleep(0.3)  # every put has been refused at least once by now
                assert not any(p.done() for p in puts)
            results = await asyncio.gather(*puts)
        assert [r.version for r in results] == [1] * 12
        assert metric(sidecar, 'ckpt_errors_total{code="UNAVAILABLE",rpc="Put"}') >= 12 - 3  # refused, then retried

    asyncio.run(main())
    with CheckpointClient(sidecar.unix_target) as client:
        for i in range(12):
            got = client.get(f"s{i}")
            assert (got.version, got.state) == (1, state(i))
            assert [v.version for v in client.history(f"s{i}")] == [1]  # written once


def test_sidecar_put_stream_waits_for_room_instead_of_failing(sidecar: Sidecar) -> None:
    puts = [service_pb2.PutRequest(session_id=f"s{i % 4}", state=state(i)) for i in range(24)]
    with CheckpointClient(sidecar.unix_target) as client, concurrent.futures.ThreadPoolExecutor(1) as pool:
        with lmdb_write_lock_held(sidecar):
            streaming = pool.submit(lambda: list(client.put_stream(puts, batch_size=2)))
            time.sleep(0.5)
            assert not streaming.done()
            assert queued_write_bytes(sidecar) == BUDGET_BYTES  # the rest wait in the stream, not the queue
        results = streaming.result(30)
        assert [r.WhichOneof("outcome") for r in results] == ["response"] * 24
        assert [r.response.version for r in results] == [1 + i // 4 for i in range(24)]
        for s in range(4):
            assert client.get(f"s{s}").state == state(20 + s)


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code


class AbortingContext:
    """What PutStream needs of grpc.aio's context: abort() ends the handler with the status."""

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: object = ()) -> None:
        raise Aborted(code, details)


def test_a_stream_stopped_while_waiting_for_room_answers_its_batch_whole(tmp_path: Path) -> None:
    # stop_streams() (SIGTERM) cancels a stream's reader; one waiting for room
    # mid-batch answers that batch all the same: the writes it queued with
    # their outcomes, the others UNAVAILABLE (not queued, so not written).
    config = StoreConfig(data_dir=tmp_path / "data", max_queued_write_bytes=BUDGET_BYTES)
    puts = [service_pb2.PutRequest(session_id=f"s{i}", state=state(i)) for i in range(5)]

    async def main(store: Store) -> list[service_pb2.PutStreamResponse]:
        async def requests() -> AsyncIterator[service_pb2.PutStreamRequest]:
            yield service_pb2.PutStreamRequest(batch_id=0, puts=puts)
            await asyncio.Event().wait()

        with ThreadPoolExecutor(2) as pool, writer_held(store) as gate:
            service = CheckpointService(store, Metrics(), pool)
            answers = service.PutStream(requests(), AbortingContext())
            first = asyncio.ensure_future(answers.__anext__())
            while store.counters.queued_write_bytes < BUDGET_BYTES:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)  # the reader is waiting for room for the fourth write
            service.stop_streams()
            gate.set()
            got = [await first]
            with pytest.raises(Aborted) as ended:
                got += [a async for a in answers]
            assert ended.value.code is grpc.StatusCode.UNAVAILABLE
            return got

    with Store(config) as store:
        got = asyncio.run(main(store))
        assert len(got) == 1 and len(got[0].results) == 5
        outcomes = [r.WhichOneof("outcome") for r in got[0].results]
        assert outcomes == ["response"] * 3 + ["error"] * 2
        assert {r.error.code for r in got[0].results[3:]} == {grpc.StatusCode.UNAVAILABLE.value[0]}
        assert "shutting down" in got[0].results[3].error.message
        assert [store.get(f"s{i}").state == state(i) for i in range(3)] == [True] * 3
        assert sorted(store.session_ids()) == ["s0", "s1", "s2"]
