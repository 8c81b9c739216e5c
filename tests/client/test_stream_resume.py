"""put_stream across sidecar restarts, as an agent meets them: a real `ckpt serve` process on a real unix
socket and data directory, stopped (SIGTERM, or SIGKILL for a crash) and started again mid-stream.

Each write carries its own request id (``w<i>``) so a test can name the first unanswered one. Both
clients read ``puts`` as the stream goes, so a stream is paused at chosen writes until the signal is sent
(the writes after it are pulled while the sidecar goes away); a list's stream is restarted from its
results instead. The client-side instruments count the streams a put_stream opens, which changes
nothing, and (one test for each client's reading of answers) lose the read of a stream that ended, as
grpcio can (LostRead, AsyncLostRead).
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import grpc
import pytest

from ckpt.sidecar.client import (
    AsyncCheckpointClient,
    CheckpointClient,
    CheckpointError,
    ResourceExhaustedError,
    UnavailableError,
)
from ckpt.v1 import service_pb2
from tests.client.support import (
    FLAVOURS,
    RESTARTS,
    Expected,
    Fleet,
    check_results,
    check_store,
    count_streams,
    open_client,
    states,
    wait_for,
    write,
)
from tests.store.test_write_backlog import BUDGET_BYTES, lmdb_write_lock_held, queued_write_bytes, state
from tests.support import Sidecar, free_port

# -- restarts mid-stream ---------------------------------------------------------------------------------


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_put_stream_outlasts_sidecar_restarts_mid_stream(fleet: Callable[..., Fleet], flavour: str) -> None:
    """Three restarts (SIGTERM, SIGKILL, SIGTERM) under a 3,000-write stream with the client's default
    retries. Before, put_stream raised UnavailableError at the first one, leaving the caller to work out
    which writes had been made."""
    n = 3000
    triggers = {600: 0, 1400: 1, 2200: 2}  # write index -> restart
    sidecars = fleet()
    abandoned = threading.Event()  # the stream failed: no more restarts
    asked = [threading.Event() for _ in RESTARTS]
    signalled = [threading.Event() for _ in RESTARTS]
    answered_at_signal: list[int] = []
    results: list[service_pb2.PutResult] = []

    def restarter() -> None:
        for k, sig in enumerate(RESTARTS):
            if not asked[k].wait(60) or abandoned.is_set():
                return
            answered_at_signal.append(len(results))
            sidecars[-1].process.send_signal(sig)
            signalled[k].set()
            sidecars.restart(sig)

    def puts() -> Iterator[service_pb2.PutRequest]:
        for i in range(n):
            if i in triggers:  # once answers are coming, the writes from here on are pulled as the sidecar goes
                wait_for(lambda: len(results) >= i - 300, "answers")  # noqa: B023 (called at once)
                asked[triggers[i]].set()
                assert signalled[triggers[i]].wait(30)
            yield write(i)

    with ThreadPoolExecutor(1) as pool:
        restarts: Future[None] = pool.submit(restarter)
        try:
            with open_client(flavour, sidecars[0].unix_target) as c:
                opened = count_streams(c)
                for result in c.put_stream(puts(), batch_size=16):
                    results.append(result)
            restarts.result(timeout=60)
        finally:
            abandoned.set()
            for e in asked:
                e.set()
            restarts.result(timeout=60)
    expected = Expected.of(n)
    replays = check_results(results, expected)
    assert len(sidecars) == 1 + len(RESTARTS)
    assert all(0 < a < n for a in answered_at_signal), answered_at_signal  # mid-stream, every time
    assert opened[0] > len(RESTARTS), opened  # reopened after each restart (sidecar down: more attempts)
    check_store(sidecars[-1].unix_target, expected)
    print(f"streams opened {opened[0]}, replayed {replays}, answered at signals {answered_at_signal}")
    assert sidecars[-1].stop() == 0, sidecars[-1].log()


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_lists_put_stream_outlasts_restarts_set_off_from_its_results(
    fleet: Callable[..., Fleet], flavour: str
) -> None:
    """The same for a list of writes (batched whole): each restart is set off when a number of results is
    in: the signal goes at once, the stop and start run on a thread while the stream goes on (small
    batches keep the sidecar's read-ahead, 64 batches, well short of the rest)."""
    n = 4000
    triggers = {400: 0, 1400: 1, 2400: 2}  # results in -> restart
    sidecars = fleet()
    results: list[service_pb2.PutResult] = []
    with ThreadPoolExecutor(1) as pool:
        pending: list[Future[Sidecar]] = []
        try:
            with open_client(flavour, sidecars[0].unix_target) as c:
                opened = count_streams(c)
                for result in c.put_stream([write(i) for i in range(n)], batch_size=8):
                    results.append(result)
                    if len(results) in triggers:
                        if pending:  # the previous restart is complete before the next signal
                            pending.pop().result(60)
                        sig = RESTARTS[triggers[len(results)]]
                        sidecars[-1].process.send_signal(sig)
                        pending.append(pool.submit(sidecars.restart, sig))
        finally:
            for restarting in pending:
                restarting.result(60)
    expected = Expected.of(n)
    replays = check_results(results, expected)
    assert len(sidecars) == 1 + len(RESTARTS)
    assert opened[0] > len(RESTARTS), opened
    check_store(sidecars[-1].unix_target, expected)
    print(f"streams opened {opened[0]}, replayed {replays}")
    assert sidecars[-1].stop() == 0, sidecars[-1].log()


# -- a sidecar that stays down ------------------------------------------------------------------------------


def check_unavailable(error: UnavailableError, first_unanswered: int) -> None:
    text = str(error)
    assert error.code is grpc.StatusCode.UNAVAILABLE
    assert "gave up after 4 attempts" in text, text
    assert f"the first {first_unanswered} writes were answered" in text, text
    assert error.request_id == f"w{first_unanswered}", (error.request_id, first_unanswered)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_sidecar_that_stays_down_ends_the_stream_with_unavailable_naming_the_progress(
    fleet: Callable[..., Fleet], flavour: str
) -> None:
    """Killed mid-stream and never restarted: the client gives up after `retries` reconnects (backing
    off 0.05 + 0.1 + 0.2 s here), raising UnavailableError that says how many writes were answered and
    carries the first unanswered write's request id; the writes answered are stored. With no sidecar
    at all from the start, the first write is the one named."""
    sidecars = fleet()
    sidecar = sidecars[-1]
    results: list[service_pb2.PutResult] = []
    killed_at: list[float] = []

    def puts() -> Iterator[service_pb2.PutRequest]:
        for i in range(100_000):
            if i == 500:
                wait_for(lambda: len(results) >= 200, "answers")
                sidecar.process.send_signal(signal.SIGKILL)
                killed_at.append(time.monotonic())
            yield write(i)

    with open_client(flavour, sidecar.unix_target, retries=3) as c, pytest.raises(UnavailableError) as info:
        for result in c.put_stream(puts(), batch_size=16):
            results.append(result)
    assert killed_at and time.monotonic() - killed_at[0] < 10
    sidecar.stop(signal.SIGKILL)
    check_unavailable(info.value, len(results))
    assert 200 <= len(results) <= 500
    check_results(results, Expected.of(len(results)))

    # No sidecar at all: nothing answered, the first write named.
    nobody = f"unix:{sidecars.socket_path.parent / 'nobody.sock'}"
    with open_client(flavour, nobody, retries=2) as c, pytest.raises(UnavailableError) as none:
        list(c.put_stream(write(i) for i in range(10)))
    assert "gave up after 3 attempts" in str(none.value) and "the first 0 writes were answered" in str(none.value)
    assert none.value.request_id == "w0"

    # Every write answered before the kill is stored.
    sidecars.start()
    check_store(sidecars[-1].unix_target, Expected.of(len(results)), prefix=True)
    assert sidecars[-1].stop() == 0, sidecars[-1].log()


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_resending_what_a_stream_that_gave_up_names_writes_each_write_once(sidecar: Sidecar, flavour: str) -> None:
    """The sidecar freezes (SIGSTOP) mid-stream: the stream gives up after timeout_seconds with writes in flight,
    none with a request id of the caller's. Resent as the error says (``unanswered``, then the rest of ``puts``),
    every write is stored exactly once, in order."""
    n = 3000
    puts = [service_pb2.PutRequest(session_id="s", state=b"w%05d" % i) for i in range(n)]
    answered = 0
    try:
        with (
            open_client(flavour, sidecar.unix_target, timeout_seconds=1, retries=0) as c,
            pytest.raises(CheckpointError) as info,
        ):
            for _ in c.put_stream(puts, batch_size=16):
                answered += 1
                if answered == 200:
                    sidecar.process.send_signal(signal.SIGSTOP)
    finally:
        sidecar.process.send_signal(signal.SIGCONT)
    failure = info.value
    assert failure.code is grpc.StatusCode.DEADLINE_EXCEEDED, failure
    unanswered = failure.unanswered
    assert unanswered and all(put.request_id for put in unanswered)
    assert failure.request_id == unanswered[0].request_id
    assert f"the first {answered} writes were answered; the next {len(unanswered)}" in str(failure)
    rest = answered + len(unanswered)
    assert f"then the writes of puts after them (from puts[{rest}])" in str(failure)
    assert [p.state for p in unanswered] == [p.state for p in puts[answered:rest]]
    time.sleep(0.5)  # the thawed sidecar commits what it had queued
    with CheckpointClient(sidecar.unix_target) as again:
        results = list(again.put_stream([*unanswered, *puts[rest:]]))
    assert len(results) == n - answered
    assert states(sidecar.unix_target, "s") == [p.state for p in puts]  # each once, in order


# -- errors that are not the sidecar going away -------------------------------------------------------------------


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_failed_write_is_still_its_own_result_and_other_errors_are_not_retried(
    fleet: Callable[..., Fleet], flavour: str
) -> None:
    """A malformed MERGE patch and a version conflict are results with ``error`` set while the other
    writes go on, on a stream the sidecar restarts under (the bad write may be sent twice: it fails the
    same way, once in the results). A stream-level error that is not the sidecar going away (a write over
    the sidecar's message limit) ends the stream at once, as before, naming the progress: one stream."""
    sidecars = fleet("--max-message-bytes", str(1 << 20))
    bad_patch = b"\xff\xff"  # a tag varint that never ends
    puts = [
        service_pb2.PutRequest(session_id="ok", state=b"\x10\x01", mode=service_pb2.WRITE_MODE_MERGE)
        for _ in range(400)
    ]
    puts[150] = service_pb2.PutRequest(session_id="ok", state=bad_patch, mode=service_pb2.WRITE_MODE_MERGE)
    puts[151] = service_pb2.PutRequest(session_id="ok", state=b"\x10\x01", expected_version=1)  # conflict

    def paced() -> Iterator[service_pb2.PutRequest]:
        for i, put in enumerate(puts):
            if i == 152:  # the bad writes are in flight when the sidecar stops
                sidecars.restart(signal.SIGTERM)
            yield put

    with open_client(flavour, sidecars[0].unix_target) as c:
        results = list(c.put_stream(paced(), batch_size=8))
    outcomes = [r.WhichOneof("outcome") for r in results]
    assert outcomes == ["response"] * 150 + ["error"] * 2 + ["response"] * 248
    assert results[150].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "not a valid MERGE patch" in results[150].error.message
    assert results[151].error.code == grpc.StatusCode.ABORTED.value[0]
    assert [r.response.version for r in results if r.HasField("response")] == list(range(1, 399))

    # Over the sidecar's 1 MiB message limit, under the client's: RESOURCE_EXHAUSTED, not retried.
    big = [*puts[:20], service_pb2.PutRequest(session_id="big", state=b"\x00" * (2 << 20), request_id="big")]
    with open_client(flavour, sidecars[-1].unix_target) as c:
        opened = count_streams(c)
        got: list[service_pb2.PutResult] = []
        with pytest.raises(ResourceExhaustedError) as info:
            got.extend(c.put_stream(big, batch_size=8))
    assert opened == [1]  # not retried
    assert len(got) <= 16 and f"the first {len(got)} writes were answered" in str(info.value)
    assert info.value.request_id  # the first unanswered write's (generated)
    assert sidecars[-1].stop() == 0, sidecars[-1].log()


# -- the caller's iterator, an idle stream, a lost read ---------------------------------------------------


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_the_callers_own_error_still_comes_after_every_sent_write_is_answered_across_a_restart(
    fleet: Callable[..., Fleet], flavour: str
) -> None:
    """``puts`` raises after the sidecar was restarted under the stream: every write it gave is answered
    (the unanswered ones resent on the new stream), then its exception is raised. (330 writes: 20 whole
    batches and 10 more, which are sent when ``puts`` raises.)"""
    sidecars = fleet()
    results: list[service_pb2.PutResult] = []

    def puts() -> Iterator[service_pb2.PutRequest]:
        for i in range(330):
            if i == 200:
                wait_for(lambda: len(results) >= 50, "answers")
                sidecars.restart(signal.SIGTERM)
            yield write(i)
        raise RuntimeError("the agent's own generator failed")

    with open_client(flavour, sidecars[0].unix_target) as c, pytest.raises(RuntimeError, match="agent's own"):
        for result in c.put_stream(puts(), batch_size=16):
            results.append(result)
    assert len(sidecars) == 2
    check_results(results, Expected.of(330))
    check_store(sidecars[-1].unix_target, Expected.of(330))
    assert sidecars[-1].stop() == 0, sidecars[-1].log()


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_stream_broken_while_idle_is_reopened_for_the_next_write(fleet: Callable[..., Fleet], flavour: str) -> None:
    """An agent holds its stream open between steps. The sidecar stops while nothing is in flight and
    stays down longer than the retries' whole backoff (retries=2: 0.15 s; down ~1 s): nothing is lost,
    so the stream waits for the next write and reopens then, instead of failing on an empty stream."""
    sidecars = fleet()
    results: list[service_pb2.PutResult] = []

    def puts() -> Iterator[service_pb2.PutRequest]:
        for i in range(40):
            if i == 20:  # every write so far answered: the stream is idle
                wait_for(lambda: len(results) == 20, "answers")
                sidecars.stop(signal.SIGTERM)
                time.sleep(1.0)
                sidecars.start()
            yield write(i)

    with open_client(flavour, sidecars[0].unix_target, retries=2) as c:
        opened = count_streams(c)
        for result in c.put_stream(puts(), batch_size=4):
            results.append(result)
    assert len(sidecars) == 2 and opened[0] >= 2
    check_results(results, Expected.of(40))
    check_store(sidecars[-1].unix_target, Expected.of(40))
    assert sidecars[-1].stop() == 0, sidecars[-1].log()


class LostRead(grpc.RpcError):  # type: ignore[misc]  # as grpcio's call is its own error
    """A PutStream call whose ``next()`` never returns once the call has ended non-OK, until ``release``:
    grpcio's lost read. Everything else (cancel, code, add_done_callback) is the call's own."""

    def __init__(self, call: Any) -> None:
        super().__init__()
        self._call = call
        self.stuck = threading.Event()
        self.release = threading.Event()

    def __iter__(self) -> LostRead:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._call)
        except grpc.RpcError:
            self.stuck.set()
            self.release.wait()
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)


def lose_first_read(stub: Any, lost_read: Callable[[Any], Any], lost: list[Any]) -> None:
    """The stub's first PutStream call is wrapped in ``lost_read`` (kept in ``lost``); later calls are its own."""
    put_stream = stub.PutStream

    def first_lost(requests: Any) -> Any:
        call = put_stream(requests)
        if not lost:
            lost.append(lost_read(call))
            return lost[0]
        return call

    stub.PutStream = first_lost


def test_a_stream_whose_read_is_never_completed_after_it_ended_is_still_reopened(fleet: Callable[..., Fleet]) -> None:
    """grpcio (1.85) can end a stream call and leave the read that ``next(call)`` waits for pending for
    ever: a PutStream cut by a stopping sidecar's GOAWAY ("Cancelling all calls") before the sidecar took
    it, which gRPC retried on its own against the socket gone, ended UNAVAILABLE ("failed to connect to all
    addresses") with receive_initial_metadata and receive_message still due. put_stream then waited for
    ever, and its watchdog's cancel() could not end a call already over. Here the first stream's read is
    lost so at its end (LostRead) and a SIGTERM restart ends it: put_stream sees the end anyway, reopens
    and resends what was unanswered, every write answered once, in order."""
    sidecars = fleet()
    results: list[service_pb2.PutResult] = []
    lost: list[LostRead] = []

    def puts() -> Iterator[service_pb2.PutRequest]:
        for i in range(200):
            if i == 100:
                wait_for(lambda: len(results) >= 50, "answers")
                sidecars.restart(signal.SIGTERM)
            yield write(i)

    def run() -> None:
        with CheckpointClient(sidecars[0].unix_target) as c:
            lose_first_read(c._stub, LostRead, lost)
            for result in c.put_stream(puts(), batch_size=8):
                results.append(result)

    with ThreadPoolExecutor(1) as pool:
        streaming = pool.submit(run)
        try:
            streaming.result(timeout=30)  # without the fix: waits for ever in the lost read
        finally:
            for call in lost:
                call.release.set()
    assert lost[0].stuck.is_set()  # the lost read was met, and left
    check_results(results, Expected.of(200))
    check_store(sidecars[-1].unix_target, Expected.of(200))
    assert sidecars[-1].stop() == 0, sidecars[-1].log()


class AsyncLostRead(grpc.RpcError):  # type: ignore[misc]  # as grpc.aio's call is its own error
    """A grpc.aio PutStream call whose ``read()`` under way when the call ends non-OK never returns, until
    ``release``: grpcio's lost read (LostRead) as grpc.aio would meet it, a core receive operation never
    completed. A read begun once the call has ended is the call's own: grpc.aio answers it at once from
    the status, with no core operation. Everything else (done, cancel, add_done_callback) is the call's."""

    def __init__(self, call: Any) -> None:
        super().__init__()
        self._call = call
        self.stuck = False
        self.release = asyncio.Event()

    async def read(self) -> Any:
        if self._call.done():
            return await self._call.read()
        try:
            return await self._call.read()
        except grpc.RpcError:
            self.stuck = True
            await self.release.wait()
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)


def test_an_async_stream_whose_read_is_never_completed_after_it_ended_is_still_reopened(
    fleet: Callable[..., Fleet],
) -> None:
    """The same lost read for AsyncCheckpointClient (AsyncLostRead). A grpc.aio ``read()`` under way ends
    only when its core operations complete (the stream's receive_initial_metadata, then one
    receive_message) or it is cancelled; the call's status, when it comes, wakes status and metadata
    waiters and done callbacks, not a read. So a read lost so waited out the answer's bound,
    timeout_seconds (30 s by default), and put_stream then gave up with DeadlineExceededError, its
    unanswered writes named but not resent, where the end should have reopened the stream. Here the
    first stream's read is lost at its end and a killed sidecar's restart ends it: put_stream sees the
    end anyway, reopens and resends what was unanswered, well within timeout_seconds (60 s here), every
    write answered once, in order. (2000 writes in batches of 8. Killed, not stopped: a stopping sidecar
    answers every write it read before it ends the stream, and the client reads no further once all it
    sent is answered, so no read was under way to be lost when the sender had fallen behind.)"""
    n = 2000
    sidecars = fleet()
    results: list[service_pb2.PutResult] = []
    lost: list[AsyncLostRead] = []

    async def run() -> None:
        loop = asyncio.get_running_loop()
        restarting: asyncio.Future[Sidecar] | None = None
        try:
            async with AsyncCheckpointClient(sidecars[0].unix_target, timeout_seconds=60) as ac:
                lose_first_read(ac._stub, AsyncLostRead, lost)
                async with asyncio.timeout(15):  # without the fix: waits out timeout_seconds in the lost read
                    async for result in ac.put_stream([write(i) for i in range(n)], batch_size=8):
                        results.append(result)
                        if len(results) == 200:
                            restarting = loop.run_in_executor(None, sidecars.restart, signal.SIGKILL)
        finally:
            for call in lost:
                call.release.set()
            if restarting is not None:
                await restarting

    asyncio.run(run())
    assert lost and lost[0].stuck  # the lost read was met, and left
    assert len(sidecars) == 2
    check_results(results, Expected.of(n))
    check_store(sidecars[-1].unix_target, Expected.of(n))
    assert sidecars[-1].stop() == 0, sidecars[-1].log()


# -- a stopping sidecar -------------------------------------------------------------------------------------


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_writes_a_stopping_sidecar_did_not_queue_are_resent_in_order(fleet: Callable[..., Fleet], flavour: str) -> None:
    """SIGTERM while a stream waits for room in a full write backlog (the writer stalled: this process
    holds LMDB's write lock): the sidecar answers that batch whole, the writes it had not queued
    UNAVAILABLE (not written), and ends the stream. Those come last in the batch and nothing after them
    was read, so the client resends them first on the next stream: every write lands, in order. Before,
    they came back as errors while the later writes to the same sessions were made."""
    port = free_port()
    sidecars = fleet("--max-queued-write-bytes", str(BUDGET_BYTES), "--metrics-port", str(port))
    sidecar = sidecars[-1]
    sidecar.metrics_port = port  # type: ignore[attr-defined]
    puts = [service_pb2.PutRequest(session_id=f"q{i % 4}", state=state(i), request_id=f"q-{i}") for i in range(24)]
    with open_client(flavour, sidecar.unix_target) as c, ThreadPoolExecutor(1) as pool:
        with lmdb_write_lock_held(sidecar):
            streaming = pool.submit(lambda: list(c.put_stream(puts, batch_size=8)))
            wait_for(lambda: queued_write_bytes(sidecar) == BUDGET_BYTES, "a full backlog")
            time.sleep(0.1)  # the stream's reader is waiting for room for its 4th write
            sidecar.process.send_signal(signal.SIGTERM)
            time.sleep(0.3)  # stop_streams(): the batch is answered once its 3 queued writes commit
            assert not streaming.done()
        sidecars.restart(signal.SIGTERM)  # the queued writes commit, the sidecar exits and starts again
        results = streaming.result(30)
    assert len(sidecars) == 2
    assert [r.WhichOneof("outcome") for r in results] == ["response"] * 24, [r.error.message for r in results][:8]
    assert [r.response.version for r in results] == [1 + i // 4 for i in range(24)]
    with CheckpointClient(sidecars[-1].unix_target) as c:
        for s in range(4):
            head = c.get(f"q{s}")
            assert (head.version, head.state) == (6, state(20 + s))
            assert [v.version for v in c.history(f"q{s}")] == [6, 5, 4, 3, 2, 1]
    assert sidecars[-1].stop() == 0, sidecars[-1].log()
