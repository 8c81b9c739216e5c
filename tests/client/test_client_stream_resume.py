"""put_stream across sidecar restarts, as an agent meets them: a real `ckpt serve` process on a real unix
socket and data directory, stopped (SIGTERM, or SIGKILL for a crash) and started again on both mid-stream.

Each write carries its own request id (``w<i>``) so a test can name the first unanswered one. The sync
client reads ``puts`` lazily, so its stream is paused at chosen writes until the signal is sent (the
writes after it are pulled while the sidecar goes away). The async client reads ``puts`` whole, so its
restarts are triggered from the results instead. The client-side instruments count the streams a
put_stream opens, which changes nothing, and (one test for each client) lose the read of a stream that
ended, as grpcio can (LostRead, AsyncLostRead).
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from ckpt.sidecar.client import (
    AsyncCheckpointClient,
    CheckpointClient,
    DeadlineExceededError,
    ResourceExhaustedError,
    UnavailableError,
)
from ckpt.v1 import service_pb2
from tests.client.test_client_review import alist
from tests.server.test_stream_shutdown_review import stop_within_bound
from tests.sidecar_proc import Sidecar, free_port, start_sidecar
from tests.store.test_write_backlog import BUDGET_BYTES, lmdb_write_lock_held, queued_write_bytes, state

SESSIONS = [f"agent-{k}" for k in range(6)]
# SIGTERM: the sidecar answers the batches it read, then ends the stream UNAVAILABLE (nothing committed
# is unanswered). SIGKILL: the connection drops; writes committed but not answered come back replayed.
RESTARTS = (signal.SIGTERM, signal.SIGKILL, signal.SIGTERM)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def write(i: int) -> service_pb2.PutRequest:
    """Write i: a REPLACE (field 1) every 7th, else a MERGE patch (field 2); well-formed protobuf either way."""
    session = SESSIONS[i % len(SESSIONS)]
    payload = f"{session}/{i}:".encode() * (1 + i % 13)
    replace = i % 7 == 0
    return service_pb2.PutRequest(
        session_id=session,
        state=(b"\x0a" if replace else b"\x12") + _varint(len(payload)) + payload,
        mode=service_pb2.WRITE_MODE_REPLACE if replace else service_pb2.WRITE_MODE_MERGE,
        request_id=f"w{i}",
    )


@dataclass
class Expected:
    """What writes 0..n-1 must leave: each session's state and version count, and each write's version."""

    states: dict[str, bytes] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    versions: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, n: int) -> Expected:
        e = cls()
        for i in range(n):
            w = write(i)
            base = b"" if w.mode == service_pb2.WRITE_MODE_REPLACE else e.states.get(w.session_id, b"")
            e.states[w.session_id] = base + w.state
            e.counts[w.session_id] = e.counts.get(w.session_id, 0) + 1
            e.versions.append(e.counts[w.session_id])
        return e


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.001)


class Fleet:
    """The sidecars a test starts on one data directory and socket, in order; ``[-1]`` is the current one.

    Restarts may run on gRPC's request thread (inside ``puts``) or on a helper thread, and can still be
    under way when a failing test ends: ``close`` waits for them, refuses any later one, and kills every
    sidecar still running, so a failed test leaves no process behind. (A passing test stops its last
    sidecar itself with SIGTERM and checks that it exits 0.)
    """

    def __init__(self, data_dir: Path, *extra: str) -> None:
        self._data_dir, self._extra = data_dir, extra
        self._cond = threading.Condition()
        self._busy = 0
        self._closed = False
        self._all = [start_sidecar(data_dir, *extra)]
        self.socket_path = Path(self._all[0].unix_target.removeprefix("unix:"))

    def __getitem__(self, i: int) -> Sidecar:
        with self._cond:
            return self._all[i]

    def __len__(self) -> int:
        with self._cond:
            return len(self._all)

    def stop(self, sig: int) -> None:
        """Stop the current sidecar with ``sig`` (a SIGTERM must exit 0 within the bound)."""
        s = self[-1]
        code = stop_within_bound(s) if sig == signal.SIGTERM else s.stop(sig)
        assert code == (0 if sig == signal.SIGTERM else -sig), s.log()

    def start(self) -> Sidecar:
        """Start a sidecar on the same data directory, socket and options (the current one stopped)."""
        with self._cond:
            if self._closed:
                raise RuntimeError("the test is over: no more sidecars")
            self._busy += 1
        try:
            s = start_sidecar(self._data_dir, *self._extra, socket_path=self.socket_path)
            with self._cond:
                self._all.append(s)
            return s
        finally:
            with self._cond:
                self._busy -= 1
                self._cond.notify_all()

    def restart(self, sig: int) -> Sidecar:
        self.stop(sig)
        return self.start()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.wait_for(lambda: self._busy == 0, timeout=60)
            running = [s for s in self._all if s.process.poll() is None]
        for s in running:
            s.process.send_signal(signal.SIGCONT)
            s.stop(signal.SIGKILL)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Callable[..., Fleet]]:
    """``fleet(*options)``: a Fleet on ``tmp_path / "data"``, closed when the test ends."""
    made: list[Fleet] = []

    def make(*extra: str) -> Fleet:
        made.append(Fleet(tmp_path / "data", *extra))
        return made[-1]

    yield make
    for f in made:
        f.close()


def count_streams(client: Any) -> list[int]:
    """Count the PutStream calls ``client`` opens (one per stream; a resumed put_stream opens several)."""
    opened = [0]
    put_stream = client._stub.PutStream

    def counted(requests: Any) -> Any:
        opened[0] += 1
        return put_stream(requests)

    client._stub.PutStream = counted
    return opened


def check_results(results: list[service_pb2.PutResult], expected: Expected) -> int:
    """Every write answered once, in order, with the version it made; returns how many were replays."""
    assert len(results) == len(expected.versions)
    got = [(r.WhichOneof("outcome"), r.response.version) for r in results]
    wrong = [(i, g, v) for i, (g, v) in enumerate(zip(got, expected.versions, strict=True)) if g != ("response", v)]
    assert not wrong, wrong[:5]
    return sum(r.response.replayed for r in results)


def check_store(target: str, expected: Expected, *, prefix: bool = False) -> None:
    """Each session's head is the expected state byte for byte, with one version per write (none lost or
    doubled). ``prefix``: the writes are a prefix of those sent (a SIGKILL may have left later ones
    committed but unanswered), so the version the prefix's last write made is checked instead of the head."""
    with CheckpointClient(target) as c:
        for session, state in expected.states.items():
            count = expected.counts[session]
            got = c.get(session, version=count if prefix else 0)
            assert got.state == state, session
            assert got.version == count, session
            stored = [v.version for v in c.history(session)]
            assert stored[-count:] == list(range(count, 0, -1)), session
            assert prefix or len(stored) == count, session


# -- restarts mid-stream ---------------------------------------------------------------------------------


def test_sync_put_stream_outlasts_sidecar_restarts_mid_stream(fleet: Callable[..., Fleet]) -> None:
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
            with CheckpointClient(sidecars[0].unix_target) as c:
                opened = count_streams(c)
                started = time.monotonic()
                for result in c.put_stream(puts(), batch_size=16):
                    results.append(result)
                elapsed = time.monotonic() - started
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
    print(f"streams opened {opened[0]}, replayed {replays}, answered at signals {answered_at_signal}, {elapsed=:.2f}")
    assert sidecars[-1].stop() == 0, sidecars[-1].log()


def test_async_put_stream_outlasts_sidecar_restarts_mid_stream(fleet: Callable[..., Fleet]) -> None:
    """The same for AsyncCheckpointClient. Its ``puts`` are read whole, so each restart is set off when a
    number of results is in: the signal goes at once, the stop and start run on a thread while the stream
    goes on (small batches keep the sidecar's read-ahead, 64 batches, well short of the rest)."""
    n = 4000
    triggers = {400: 0, 1400: 1, 2400: 2}  # results in -> restart
    sidecars = fleet()
    results: list[service_pb2.PutResult] = []

    async def run() -> int:
        loop = asyncio.get_running_loop()
        pending: list[asyncio.Future[Sidecar]] = []
        try:
            async with AsyncCheckpointClient(sidecars[0].unix_target) as ac:
                opened = count_streams(ac)
                async for result in ac.put_stream([write(i) for i in range(n)], batch_size=8):
                    results.append(result)
                    if len(results) in triggers:
                        if pending:  # the previous restart is complete before the next signal
                            await pending.pop()
                        sig = RESTARTS[triggers[len(results)]]
                        sidecars[-1].process.send_signal(sig)
                        pending.append(loop.run_in_executor(None, sidecars.restart, sig))
        finally:
            for restarting in pending:
                await restarting
        return opened[0]

    opened = asyncio.run(run())
    expected = Expected.of(n)
    replays = check_results(results, expected)
    assert len(sidecars) == 1 + len(RESTARTS)
    assert opened > len(RESTARTS), opened
    check_store(sidecars[-1].unix_target, expected)
    print(f"streams opened {opened}, replayed {replays}")
    assert sidecars[-1].stop() == 0, sidecars[-1].log()


# -- a sidecar that stays down ------------------------------------------------------------------------------


def test_a_sidecar_that_stays_down_ends_the_stream_with_unavailable_naming_the_progress(
    fleet: Callable[..., Fleet],
) -> None:
    """Killed mid-stream and never restarted: both clients give up after `retries` reconnects (backing
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

    with CheckpointClient(sidecar.unix_target, retries=3) as c, pytest.raises(UnavailableError) as info:
        for result in c.put_stream(puts(), batch_size=16):
            results.append(result)
    assert killed_at and time.monotonic() - killed_at[0] < 10
    sidecar.stop(signal.SIGKILL)
    check_unavailable(info.value, len(results))
    assert 200 <= len(results) <= 500
    check_results(results, Expected.of(len(results)))

    # The async client: the sidecar (restarted to hold the first writes) is killed after 300 results.
    sidecar = sidecars.start()
    aresults: list[service_pb2.PutResult] = []

    async def run() -> UnavailableError:
        async with AsyncCheckpointClient(sidecar.unix_target, retries=3) as ac:
            with pytest.raises(UnavailableError) as ainfo:
                async for result in ac.put_stream([write(i) for i in range(len(results), 6000)], batch_size=8):
                    aresults.append(result)
                    if len(aresults) == 300:
                        sidecar.process.send_signal(signal.SIGKILL)
            return ainfo.value

    started = time.monotonic()
    aerror = asyncio.run(run())
    assert time.monotonic() - started < 10
    sidecar.stop(signal.SIGKILL)
    check_unavailable(aerror, len(results) + len(aresults), answered=len(aresults))
    assert len(aresults) >= 300

    # No sidecar at all: nothing answered, the first write named.
    nobody = f"unix:{sidecars.socket_path.parent / 'nobody.sock'}"
    with CheckpointClient(nobody, retries=2) as c, pytest.raises(UnavailableError) as info:
        list(c.put_stream(write(i) for i in range(10)))
    assert "gave up after 3 attempts" in str(info.value) and "the first 0 writes were answered" in str(info.value)
    assert info.value.request_id == "w0"

    # Every write answered before the kills is stored.
    sidecars.start()
    check_store(sidecars[-1].unix_target, Expected.of(len(results) + len(aresults)), prefix=True)
    assert sidecars[-1].stop() == 0, sidecars[-1].log()


def check_unavailable(error: UnavailableError, first_unanswered: int, *, answered: int | None = None) -> None:
    text = str(error)
    assert error.code is grpc.StatusCode.UNAVAILABLE
    assert "gave up after 4 attempts" in text, text
    assert f"the first {first_unanswered if answered is None else answered} writes were answered" in text, text
    assert error.request_id == f"w{first_unanswered}", (error.request_id, first_unanswered)


# -- errors that are not the sidecar going away -------------------------------------------------------------------


def test_a_failed_write_is_still_its_own_result_and_other_errors_are_not_retried(fleet: Callable[..., Fleet]) -> None:
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

    with CheckpointClient(sidecars[0].unix_target) as c:
        results = list(c.put_stream(paced(), batch_size=8))
    outcomes = [r.WhichOneof("outcome") for r in results]
    assert outcomes == ["response"] * 150 + ["error"] * 2 + ["response"] * 248
    assert results[150].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "not a valid MERGE patch" in results[150].error.message
    assert results[151].error.code == grpc.StatusCode.ABORTED.value[0]
    assert [r.response.version for r in results if r.HasField("response")] == list(range(1, 399))

    async def arun() -> list[service_pb2.PutResult]:
        async with AsyncCheckpointClient(sidecars[-1].unix_target) as ac:
            return await alist(ac.put_stream(puts[140:160], batch_size=8))

    aresults = asyncio.run(arun())
    assert [r.WhichOneof("outcome") for r in aresults] == ["response"] * 10 + ["error"] * 2 + ["response"] * 8
    assert "not a valid MERGE patch" in aresults[10].error.message

    # Over the sidecar's 1 MiB message limit, under the client's: RESOURCE_EXHAUSTED, not retried.
    big = [*puts[:20], service_pb2.PutRequest(session_id="big", state=b"\x00" * (2 << 20), request_id="big")]
    with CheckpointClient(sidecars[-1].unix_target) as c:
        opened = count_streams(c)
        got: list[service_pb2.PutResult] = []
        with pytest.raises(ResourceExhaustedError, match="over the sidecar's message limit") as info:
            got.extend(c.put_stream(big, batch_size=8))
    assert opened == [1]  # not retried
    assert len(got) <= 16 and f"the first {len(got)} writes were answered" in str(info.value)
    assert info.value.request_id  # the first unanswered write's (generated)

    async def abig() -> tuple[list[int], BaseException]:
        async with AsyncCheckpointClient(sidecars[-1].unix_target) as ac:
            aopened = count_streams(ac)
            with pytest.raises(ResourceExhaustedError) as ainfo:
                await alist(ac.put_stream(big, batch_size=8))
            return aopened, ainfo.value

    aopened, aerror = asyncio.run(abig())
    assert aopened == [1] and "writes were answered" in str(aerror)
    assert sidecars[-1].stop() == 0, sidecars[-1].log()


# -- the caller's iterator, an idle stream, a frozen sidecar ---------------------------------------------------


def test_the_callers_own_error_still_comes_after_every_sent_write_is_answered_across_a_restart(
    fleet: Callable[..., Fleet],
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

    with CheckpointClient(sidecars[0].unix_target) as c, pytest.raises(RuntimeError, match="agent's own"):
        for result in c.put_stream(puts(), batch_size=16):
            results.append(result)
    assert len(sidecars) == 2
    check_results(results, Expected.of(330))
    check_store(sidecars[-1].unix_target, Expected.of(330))
    assert sidecars[-1].stop() == 0, sidecars[-1].log()


def test_a_stream_broken_while_idle_is_reopened_for_the_next_write(fleet: Callable[..., Fleet]) -> None:
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

    with CheckpointClient(sidecars[0].unix_target, retries=2) as c:
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
    ever (test_a_failed_write_is_still_its_own_result... hung in CI, and here at its 45th run), and its
    watchdog's cancel() could not end a call already over. Here the first stream's read is lost so at its
    end (LostRead) and a SIGTERM restart ends it: put_stream sees the end anyway, reopens and resends what
    was unanswered, every write answered once, in order."""
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
    first stream's read is lost at its end and a SIGTERM restart ends it: put_stream sees the end
    anyway, reopens and resends what was unanswered, well within timeout_seconds (60 s here), every
    write answered once, in order. (2000 writes in batches of 8: the sidecar's read-ahead, 64 batches,
    is well short of those left at the restart.)"""
    n = 2000
    sidecars = fleet()
    results: list[service_pb2.PutResult] = []
    lost: list[AsyncLostRead] = []

    async def run() -> float:
        loop = asyncio.get_running_loop()
        restarting: asyncio.Future[Sidecar] | None = None
        started = time.monotonic()
        try:
            async with AsyncCheckpointClient(sidecars[0].unix_target, timeout_seconds=60) as ac:
                lose_first_read(ac._stub, AsyncLostRead, lost)
                async with asyncio.timeout(15):  # without the fix: waits out timeout_seconds in the lost read
                    async for result in ac.put_stream([write(i) for i in range(n)], batch_size=8):
                        results.append(result)
                        if len(results) == 200:
                            sidecars[-1].process.send_signal(signal.SIGTERM)
                            restarting = loop.run_in_executor(None, sidecars.restart, signal.SIGTERM)
            return time.monotonic() - started
        finally:
            for call in lost:
                call.release.set()
            if restarting is not None:
                await restarting

    elapsed = asyncio.run(run())
    assert lost and lost[0].stuck  # the lost read was met, and left
    assert len(sidecars) == 2
    check_results(results, Expected.of(n))
    check_store(sidecars[-1].unix_target, Expected.of(n))
    print(f"{elapsed=:.2f}")
    assert sidecars[-1].stop() == 0, sidecars[-1].log()


def test_a_frozen_sidecar_ends_the_stream_after_timeout_seconds_without_an_answer(fleet: Callable[..., Fleet]) -> None:
    """``timeout_seconds`` bounds each wait for an answer while writes are in flight, not the stream: a
    consumer slower than it between results is fine, while a sidecar frozen (SIGSTOP) with writes in
    flight ends the stream with DeadlineExceededError naming the progress, in both clients. (The sidecar
    is resumed before each client closes: gRPC's channel close waits for a peer that does not read. It is
    also resumed 8 s after each freeze, so a client without the bound fails here instead of hanging.)"""
    sidecar = fleet()[-1]

    def freeze() -> None:
        sidecar.process.send_signal(signal.SIGSTOP)
        frozen_at.append(time.monotonic())
        thaw = threading.Timer(8, sidecar.process.send_signal, (signal.SIGCONT,))
        thaw.daemon = True
        thaw.start()

    frozen_at: list[float] = []
    with CheckpointClient(sidecar.unix_target, timeout_seconds=0.5) as c:
        slow = []
        for result in c.put_stream((write(i) for i in range(3)), batch_size=1):
            slow.append(result)
            time.sleep(0.8)  # the caller's own pace never counts against the sidecar
        check_results(slow, Expected.of(3))

        results: list[service_pb2.PutResult] = []
        try:
            with pytest.raises(DeadlineExceededError, match=r"timeout_seconds=0\.5") as info:
                for result in c.put_stream((write(i) for i in range(3, 20_000)), batch_size=16):
                    results.append(result)
                    if len(results) == 100:
                        freeze()
            assert time.monotonic() - frozen_at[0] < 5
        finally:
            sidecar.process.send_signal(signal.SIGCONT)
    assert len(results) >= 100
    assert f"the first {len(results)} writes were answered" in str(info.value)
    assert info.value.request_id == f"w{3 + len(results)}"

    async def run() -> tuple[int, DeadlineExceededError, float]:
        aresults = 0
        async with AsyncCheckpointClient(sidecar.unix_target, timeout_seconds=0.5) as ac:
            try:
                with pytest.raises(DeadlineExceededError) as ainfo:
                    async for _ in ac.put_stream([write(i) for i in range(100_000, 110_000)], batch_size=8):
                        aresults += 1
                        if aresults == 100:
                            freeze()
                waited = time.monotonic() - frozen_at[-1]
            finally:
                sidecar.process.send_signal(signal.SIGCONT)
        return aresults, ainfo.value, waited

    aresults, aerror, waited = asyncio.run(run())
    assert waited < 5
    assert aerror.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert f"the first {aresults} writes were answered" in str(aerror)
    assert aerror.request_id == f"w{100_000 + aresults}"
    assert sidecar.stop() == 0, sidecar.log()


def test_a_stream_whose_writes_are_all_answered_ends_without_waiting_for_the_sidecar(
    fleet: Callable[..., Fleet],
) -> None:
    """The sidecar freezes right after the last answer, before the stream's end: nothing is in flight,
    so the clients return every result and finish. The async client used to wait for the end with
    timeout_seconds and raise DeadlineExceededError after every write had been answered (helper-18)."""
    sidecar = fleet()[-1]

    def freeze_for(seconds: float) -> None:
        sidecar.process.send_signal(signal.SIGSTOP)
        thaw = threading.Timer(seconds, sidecar.process.send_signal, (signal.SIGCONT,))
        thaw.daemon = True
        thaw.start()

    async def run() -> tuple[list[service_pb2.PutResult], float]:
        got: list[service_pb2.PutResult] = []
        async with AsyncCheckpointClient(sidecar.unix_target, timeout_seconds=0.5) as ac:
            async for result in ac.put_stream([write(i) for i in range(200_000, 200_004)], batch_size=4):
                got.append(result)
                if len(got) == 4:
                    freeze_for(2.0)
                    frozen = time.monotonic()
            finished = time.monotonic() - frozen
            await asyncio.sleep(2.5)  # thawed before the channel closes (see the test above)
        return got, finished

    try:
        results, finished = asyncio.run(run())
    finally:
        sidecar.process.send_signal(signal.SIGCONT)
    check_results(results, Expected.of(4))
    assert finished < 1.5  # it did not wait for the frozen sidecar's end of stream
    assert sidecar.stop() == 0, sidecar.log()


def test_writes_a_stopping_sidecar_did_not_queue_are_resent_in_order(fleet: Callable[..., Fleet]) -> None:
    """SIGTERM while a stream waits for room in a full write backlog (the writer stalled: this process
    holds LMDB's write lock): the sidecar answers that batch whole, the writes it had not queued
    UNAVAILABLE (not written), and ends the stream. Those come last in the batch and nothing after them
    was read, so the clients resend them first on the next stream: every write lands, in order. Before,
    they came back as errors while the later writes to the same sessions were made."""
    port = free_port()
    sidecars = fleet("--max-queued-write-bytes", str(BUDGET_BYTES), "--metrics-port", str(port))

    def stop_while_waiting_for_room(run: Callable[[], list[service_pb2.PutResult]]) -> list[service_pb2.PutResult]:
        sidecar = sidecars[-1]
        sidecar.metrics_port = port  # type: ignore[attr-defined]
        with ThreadPoolExecutor(1) as pool:
            with lmdb_write_lock_held(sidecar):
                streaming = pool.submit(run)
                wait_for(lambda: queued_write_bytes(sidecar) == BUDGET_BYTES, "a full backlog")
                time.sleep(0.1)  # the stream's reader is waiting for room for its 4th write
                sidecar.process.send_signal(signal.SIGTERM)
                time.sleep(0.3)  # stop_streams(): the batch is answered once its 3 queued writes commit
                assert not streaming.done()
            sidecars.restart(signal.SIGTERM)  # the queued writes commit, the sidecar exits and starts again
            return streaming.result(30)

    def puts(prefix: str) -> list[service_pb2.PutRequest]:
        return [
            service_pb2.PutRequest(session_id=f"{prefix}{i % 4}", state=state(i), request_id=f"{prefix}-{i}")
            for i in range(24)
        ]

    with CheckpointClient(sidecars[-1].unix_target) as c:
        results = stop_while_waiting_for_room(lambda: list(c.put_stream(puts("q"), batch_size=8)))

    async def arun() -> list[service_pb2.PutResult]:
        async with AsyncCheckpointClient(sidecars[-1].unix_target) as ac:
            return await alist(ac.put_stream(puts("a"), batch_size=8))

    aresults = stop_while_waiting_for_room(lambda: asyncio.run(arun()))
    assert len(sidecars) == 3
    for got in (results, aresults):
        assert [r.WhichOneof("outcome") for r in got] == ["response"] * 24, [r.error.message for r in got][:8]
        assert [r.response.version for r in got] == [1 + i // 4 for i in range(24)]
    with CheckpointClient(sidecars[-1].unix_target) as c:
        for prefix in ("q", "a"):
            for s in range(4):
                head = c.get(f"{prefix}{s}")
                assert (head.version, head.state) == (6, state(20 + s))
                assert [v.version for v in c.history(f"{prefix}{s}")] == [6, 5, 4, 3, 2, 1]
    assert sidecars[-1].stop() == 0, sidecars[-1].log()
