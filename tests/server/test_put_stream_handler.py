"""PutStream's handler (CheckpointService.PutStream) on a real store: streams that end early, read-ahead, bugs.

The sidecar tests drive PutStream through a real process; ending a stream at
a chosen point between the reader and the answers needs the handler itself.
Where a test needs the writer held or a write to fail on a bug, the handler
is given a store that wraps the real one (it uses Store.asubmit alone).
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import pytest

from ckpt.sidecar import PutRequest, PutResult, Store, StoreConfig
from ckpt.sidecar.server.metrics import Metrics
from ckpt.sidecar.server.service import CheckpointService
from ckpt.sidecar.store import PreparedPut
from ckpt.v1 import service_pb2
from tests.store.test_store import CHAINS, state_of


class _Aborted(Exception):
    pass


class _Context:
    """What PutStream uses of a grpc.aio.ServicerContext: abort, which raises."""

    async def abort(self, code: object, details: str = "", trailing_metadata: object = ()) -> None:
        raise _Aborted(code, details)


class _WrappedStore:
    """The real store, as PutStream uses it (asubmit), with its writes held or failing as a test says."""

    def __init__(self, store: Store) -> None:
        self._store = store
        #: Until set, every write queued waits before it reaches the real store.
        self.released = asyncio.Event()
        self.released.set()
        #: Session ids whose write raises before it is queued, and whose queued write fails.
        self.bug_queueing: set[str] = set()
        self.bug_in_writer: set[str] = set()

    async def aencode_put(self, request: PutRequest, executor: Executor) -> PutRequest | PreparedPut:
        return await self._store.aencode_put(request, executor)

    def asubmit(self, request: PutRequest | PreparedPut) -> asyncio.Future[PutResult]:
        assert isinstance(request, PutRequest)  # these tests' writes are small: none is encoded ahead
        if request.session_id in self.bug_queueing:
            raise RuntimeError("a bug before the writer")
        if request.session_id in self.bug_in_writer:
            failed: asyncio.Future[PutResult] = asyncio.get_running_loop().create_future()
            failed.set_exception(RuntimeError("a bug in the writer"))
            return failed

        async def write() -> PutResult:
            await self.released.wait()
            return await self._store.asubmit(request)

        return asyncio.ensure_future(write())

    def service(self, pool: ThreadPoolExecutor, **options: Any) -> CheckpointService:
        return CheckpointService(cast(Store, self), Metrics(), pool, **options)


def test_an_abandoned_stream_commits_its_queued_writes_and_logs_nothing(tmp_path: Path) -> None:
    config = StoreConfig(data_dir=tmp_path / "data", chain_policy=CHAINS, sweep_interval_seconds=3600)
    reported: list[dict[str, Any]] = []

    async def main(store: Store) -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: reported.append(context))
        second_sent = asyncio.Event()

        async def requests() -> AsyncIterator[service_pb2.PutStreamRequest]:
            yield service_pb2.PutStreamRequest(
                batch_id=0, puts=[service_pb2.PutRequest(session_id="s", state=state_of("s", 1))]
            )
            # Two conflicts (their futures fail) and one good write, never answered.
            yield service_pb2.PutStreamRequest(
                batch_id=1,
                puts=[
                    service_pb2.PutRequest(session_id="s", state=state_of("s", 9), expected_version=7),
                    service_pb2.PutRequest(session_id="t", state=state_of("t", 1)),
                    service_pb2.PutRequest(session_id="s", state=state_of("s", 9), expected_version=8),
                ],
            )
            second_sent.set()
            await asyncio.Event().wait()  # the client keeps the stream open, then goes away

        with ThreadPoolExecutor(2) as pool:
            service = CheckpointService(store, Metrics(), pool)
            answers = service.PutStream(requests(), _Context())
            first = await answers.__anext__()
            assert [r.response.version for r in first.results] == [1]
            await second_sent.wait()
            await asyncio.sleep(0)  # the reader queues batch 1's writes
            await answers.aclose()  # the stream ends before batch 1 is answered
            while store.get_cached("t") is None:  # batch 1 commits all the same
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)  # its outcomes are settled on this loop
            gc.collect()

    with Store(config) as store:
        asyncio.run(main(store))
        assert store.get("t").state == state_of("t", 1)
        assert store.get("s").version == 1
    assert not reported, [c.get("message") for c in reported]


def test_a_stream_reads_ahead_of_its_answers_by_a_bounded_number_of_bytes(tmp_path: Path) -> None:
    # While nothing commits (the writer is held), a stream of 100 KB batches
    # with a 300 KB read-ahead budget has the reader take 3 batches, then wait
    # (holding the 4th it received) instead of reading everything sent. A
    # batch larger than the whole budget is still read when it is alone.
    config = StoreConfig(data_dir=tmp_path / "data", chain_policy=CHAINS, sweep_interval_seconds=3600)
    batch_bytes = 100_000

    async def main(store: Store) -> None:
        pulled: list[int] = []

        async def requests() -> AsyncIterator[service_pb2.PutStreamRequest]:
            for b in range(10):
                pulled.append(b)
                size = 4 * batch_bytes if b == 9 else batch_bytes  # the last alone exceeds the budget
                state = bytes([b]) * size
                yield service_pb2.PutStreamRequest(
                    batch_id=b, puts=[service_pb2.PutRequest(session_id=f"s{b}", state=state)]
                )

        wrapped = _WrappedStore(store)
        wrapped.released.clear()  # nothing commits
        with ThreadPoolExecutor(2) as pool:
            service = wrapped.service(pool, stream_bytes_ahead=3 * batch_bytes)
            answers = service.PutStream(requests(), _Context())
            first = asyncio.ensure_future(answers.__anext__())
            for _ in range(50):  # let the reader run as far as it may
                await asyncio.sleep(0.01)
            assert pulled == [0, 1, 2, 3], pulled
            assert not first.done()
            wrapped.released.set()
            got = [await first] + [a async for a in answers]
        assert [a.batch_id for a in got] == list(range(10))
        assert all(a.results[0].response.version == 1 for a in got)

    with Store(config) as store:
        asyncio.run(main(store))
        assert store.get("s9").state == bytes([9]) * 4 * batch_bytes


def test_a_bug_in_one_stream_write_fails_that_write_alone(tmp_path: Path) -> None:
    """An unexpected exception queueing a write (before the writer) or applying it (in the writer)
    used to end the whole stream UNKNOWN, leaving the writes before it committed and unanswered."""
    config = StoreConfig(data_dir=tmp_path / "data", chain_policy=CHAINS, sweep_interval_seconds=3600)

    def put(session: str) -> service_pb2.PutRequest:
        return service_pb2.PutRequest(session_id=session, state=state_of(session, 1))

    async def main(store: Store) -> list[service_pb2.PutStreamResponse]:
        wrapped = _WrappedStore(store)
        wrapped.bug_queueing.add("bug-queueing")
        wrapped.bug_in_writer.add("bug-in-writer")

        async def requests() -> AsyncIterator[service_pb2.PutStreamRequest]:
            yield service_pb2.PutStreamRequest(
                batch_id=1, puts=[put("a"), put("bug-queueing"), put("b"), put("bug-in-writer"), put("c")]
            )
            yield service_pb2.PutStreamRequest(batch_id=2, puts=[put("d")])

        with ThreadPoolExecutor(2) as pool:
            return [answer async for answer in wrapped.service(pool).PutStream(requests(), _Context())]

    with Store(config) as store:
        answers = asyncio.run(main(store))
        assert [a.batch_id for a in answers] == [1, 2]
        results = answers[0].results
        assert [r.WhichOneof("outcome") for r in results] == ["response", "error", "response", "error", "response"]
        for failed in (results[1], results[3]):
            assert failed.error.code == 13  # INTERNAL
            assert "failed inside the sidecar (RuntimeError); see its log" in failed.error.message
        assert answers[1].results[0].response.version == 1
        for session in ("a", "b", "c", "d"):
            assert store.get(session).state == state_of(session, 1)


def test_a_stream_opened_as_shutdown_begins_still_ends(tmp_path: Path) -> None:
    """stop_streams() cancels each stream's reader; one that had not run yet (a stream whose handler had
    just started, as SIGTERM met streams opening under load) never put the end of the batches, so its
    answers waited for ever: shutdown hung (its store process even outlived a SIGKILLed parent, holding
    the data directory). The stream must end UNAVAILABLE, as every stream stopped at shutdown does."""
    config = StoreConfig(data_dir=tmp_path / "data", chain_policy=CHAINS, sweep_interval_seconds=3600)
    pulled: list[int] = []

    async def main(store: Store) -> None:
        async def requests() -> AsyncIterator[service_pb2.PutStreamRequest]:
            pulled.append(0)
            yield service_pb2.PutStreamRequest(
                batch_id=0, puts=[service_pb2.PutRequest(session_id="s", state=state_of("s", 1))]
            )

        with ThreadPoolExecutor(2) as pool:
            service = CheckpointService(store, Metrics(), pool)
            answers = service.PutStream(requests(), _Context())
            first = asyncio.ensure_future(answers.__anext__())
            await asyncio.sleep(0)  # the handler runs until it waits for answers; its reader has not run
            assert not first.done()
            service.stop_streams()
            done, _ = await asyncio.wait((first,), timeout=10)
            assert done, "the stream did not end after stop_streams()"
            with pytest.raises(_Aborted, match="shutting down"):
                first.result()
            await answers.aclose()
            assert service.calls.idle.is_set()  # what shutdown waits for

    with Store(config) as store:
        asyncio.run(main(store))
        assert pulled == []  # nothing was read, so nothing was written
        assert store.get_cached("s") is None
