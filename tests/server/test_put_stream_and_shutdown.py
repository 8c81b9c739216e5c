"""PutStream and graceful shutdown as users meet them: a real `ckpt serve` process on a real unix socket.

Streams are driven from a queue, so a test decides when each batch is sent
and can hold a stream open without sending (the client's request thread
blocks on the queue, as an agent's would between steps).
"""

from __future__ import annotations

import queue
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import grpc
import pytest

from ckpt.sidecar.client import CheckpointClient, UnavailableError
from ckpt.v1 import service_pb2, service_pb2_grpc
from tests.support import Sidecar, start_sidecar

PATCH = b"\x10\x01"  # field 2 (varint) = 1: a well-formed MERGE patch
# Far longer than any test waits: a stream or call that shutdown waits out shows as a timeout.
LONG_GRACE_SECONDS = 60
LONG_GRACE = ("--grace-seconds", str(LONG_GRACE_SECONDS))
SHUTDOWN_SECONDS = 30


def merge(
    session: str, request_id: str = "", *, expected_version: int | None = None, labels: dict[str, str] | None = None
) -> service_pb2.PutRequest:
    return service_pb2.PutRequest(
        session_id=session,
        state=PATCH,
        mode=service_pb2.WRITE_MODE_MERGE,
        request_id=request_id,
        expected_version=expected_version,
        labels=labels,
    )


class Stream:
    """One raw PutStream whose batches are sent when ``send`` is called; ``answer`` reads the next reply."""

    def __init__(self, target: str) -> None:
        self._channel = grpc.insecure_channel(target)
        self._outbox: queue.SimpleQueue[service_pb2.PutStreamRequest | None] = queue.SimpleQueue()
        self.call = service_pb2_grpc.CheckpointServiceStub(self._channel).PutStream(self._requests())

    def _requests(self) -> Iterator[service_pb2.PutStreamRequest]:
        while (batch := self._outbox.get()) is not None:
            yield batch

    def send(self, batch_id: int, puts: list[service_pb2.PutRequest]) -> None:
        self._outbox.put(service_pb2.PutStreamRequest(batch_id=batch_id, puts=puts))

    def answer(self) -> service_pb2.PutStreamResponse:
        response: service_pb2.PutStreamResponse = next(self.call)
        return response

    def close(self) -> None:
        self._outbox.put(None)
        self._channel.close()


def stop_within_bound(sidecar: Sidecar) -> int:
    """SIGTERM; the exit code, or a failure naming the wait if shutdown waited out the grace period."""
    try:
        return sidecar.stop(signal.SIGTERM, timeout_seconds=SHUTDOWN_SECONDS)
    except subprocess.TimeoutExpired:
        sidecar.stop(signal.SIGKILL)
        pytest.fail(f"the sidecar was still shutting down {SHUTDOWN_SECONDS} s after SIGTERM:\n{sidecar.log()}")


def heads(sidecar_dir: Path, sessions: list[str]) -> dict[str, int]:
    restarted = start_sidecar(sidecar_dir)
    try:
        with CheckpointClient(restarted.unix_target) as c:
            return {s: c.get(s).version for s in sessions}
    finally:
        assert restarted.stop() == 0, restarted.log()


# -- shutdown ----------------------------------------------------------------------------------------------


def test_sigterm_ends_an_idle_stream_at_once_with_unavailable(tmp_path: Path) -> None:
    """A stream left open between steps used to hold shutdown for the whole grace period (10 s by
    default, here 60 s), then be cancelled ('Cancelling all calls'). Now the stream ends at once
    with UNAVAILABLE saying why, and the sidecar exits 0 with the answered write stored."""
    sidecar = start_sidecar(tmp_path / "data", *LONG_GRACE)
    stream = Stream(sidecar.unix_target)
    try:
        stream.send(0, [merge("idle", "idle-0")])
        assert stream.answer().results[0].response.version == 1
        sidecar.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            stream.answer()
        assert time.monotonic() - signalled < LONG_GRACE_SECONDS / 2  # at once, not when the grace ran out
        assert info.value.code() is grpc.StatusCode.UNAVAILABLE
        # The status says why; but gRPC's client transport, when a write of its own (a window
        # update, say) meets the closed connection first, drops it and says 'Stream removed'
        # (once in a CI run), also UNAVAILABLE.
        details = info.value.details()
        assert "shutting down" in details or details.startswith("Stream removed"), details
        assert stop_within_bound(sidecar) == 0, sidecar.log()
    finally:
        stream.close()
        sidecar.stop(signal.SIGKILL)
    assert heads(tmp_path / "data", ["idle"]) == {"idle": 1}


def test_sigterm_under_streams_and_unary_writes_keeps_every_acknowledged_write(tmp_path: Path) -> None:
    """Busy streams used to go on taking new writes for the whole grace period after SIGTERM. Now
    each stream answers what it read, then ends UNAVAILABLE; unary writes finish or are refused;
    the sidecar exits 0 and every acknowledged write is there after a restart."""
    sidecar = start_sidecar(tmp_path / "data", *LONG_GRACE)
    acked: dict[str, int] = {}
    ended: dict[str, BaseException] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def streamer(n: int) -> None:
        session = f"stream{n}"

        def puts() -> Iterator[service_pb2.PutRequest]:
            k = 0
            while not stop.is_set():
                k += 1
                yield merge(session, f"{session}-{k}")

        with CheckpointClient(sidecar.unix_target, retries=0) as c:
            try:
                for result in c.put_stream(puts(), batch_size=8):
                    with lock:
                        acked[session] = result.response.version
            except Exception as exc:
                ended[session] = exc

    def unary(n: int) -> None:
        session = f"unary{n}"
        with CheckpointClient(sidecar.unix_target, retries=0) as c:
            while not stop.is_set():
                try:
                    version = c.merge(session, PATCH).version
                except Exception as exc:
                    ended[session] = exc
                    return
                with lock:
                    acked[session] = version

    threads = [threading.Thread(target=streamer, args=(n,)) for n in range(3)]
    threads += [threading.Thread(target=unary, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    try:
        while not ended and (len(acked) < len(threads) or min(acked.values()) < 20):
            threading.Event().wait(0.01)
        code = stop_within_bound(sidecar)
    finally:
        stop.set()
        for t in threads:
            t.join()
        sidecar.stop(signal.SIGKILL)
    assert code == 0, sidecar.log()
    # Every stream and unary writer is refused with UNAVAILABLE, never left hanging. (A stream
    # still sending may see its connection close before the status: 'Stream removed', also UNAVAILABLE.)
    for session in ("stream0", "stream1", "stream2", "unary0", "unary1", "unary2"):
        assert isinstance(ended[session], UnavailableError), (session, ended[session])
    stored = heads(tmp_path / "data", sorted(acked))
    for session, version in acked.items():
        assert stored[session] >= version, (session, stored[session], version)


def test_unary_writes_refused_at_shutdown_are_unavailable_and_retried(tmp_path: Path) -> None:
    """Writes the sidecar has received but not yet started when SIGTERM comes are cancelled by
    gRPC itself. The clients reported that as a bare CheckpointError('CANCELLED') and did not
    retry it, though nothing was written and a resend with the same request id is safe. Frozen
    with SIGSTOP, the sidecar gets the writes and SIGTERM together when it resumes."""
    sidecar = start_sidecar(tmp_path / "data", *LONG_GRACE)
    # Half never retry; half retry twice (the sidecar stays down, so they give up after 3 attempts).
    clients = [CheckpointClient(sidecar.unix_target, retries=n % 2 * 2, timeout_seconds=60) for n in range(16)]
    outcomes: dict[int, object] = {}

    def write(n: int) -> None:
        try:
            outcomes[n] = clients[n].merge(f"refused{n}", PATCH)
        except Exception as exc:
            outcomes[n] = exc

    try:
        for n, c in enumerate(clients):  # connected, so the writes below reach the frozen sidecar's socket
            c.merge(f"refused{n}", PATCH)
        sidecar.process.send_signal(signal.SIGSTOP)
        threads = [threading.Thread(target=write, args=(n,)) for n in range(len(clients))]
        for t in threads:
            t.start()
        threading.Event().wait(0.5)  # the writes are sent (no answer can come)
        sidecar.process.send_signal(signal.SIGTERM)
        sidecar.process.send_signal(signal.SIGCONT)
        for t in threads:
            t.join()
        assert stop_within_bound(sidecar) == 0, sidecar.log()
    finally:
        for c in clients:
            c.close()
        sidecar.stop(signal.SIGKILL)
    refused = {n: e for n, e in outcomes.items() if isinstance(e, Exception)}
    for n, error in refused.items():
        assert isinstance(error, UnavailableError), error
        assert error.code is grpc.StatusCode.UNAVAILABLE and error.request_id
        if n % 2:
            assert "gave up after 3 attempts" in str(error), error
    restarted = start_sidecar(tmp_path / "data")
    try:
        with CheckpointClient(restarted.unix_target) as c:
            for n, error in refused.items():  # the resend lands once
                assert isinstance(error, UnavailableError)
                assert c.merge(f"refused{n}", PATCH, request_id=error.request_id).version == 2
            for n in range(len(clients)):
                assert [v.version for v in c.history(f"refused{n}")] == [2, 1]
    finally:
        assert restarted.stop() == 0, restarted.log()


# -- streams -------------------------------------------------------------------------------------------------


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Sidecar]:
    s = start_sidecar(tmp_path / "data", "--max-message-bytes", str(1 << 20))
    yield s
    assert s.stop() == 0, s.log()


def test_each_write_of_a_batch_gets_its_own_answer_and_the_session_keeps_order(sidecar: Sidecar) -> None:
    bad_patch = b"\xff\xff"  # a tag varint that never ends
    puts = [
        merge("a", "a-1"),
        merge(""),  # no session id
        merge("a", expected_version=5),  # conflict: the head is 1
        service_pb2.PutRequest(session_id="a", state=bad_patch, mode=service_pb2.WRITE_MODE_MERGE),
        service_pb2.PutRequest(session_id="a", state=b"x" * ((1 << 20) - 1000)),  # over max_state_bytes
        service_pb2.PutRequest(session_id="a", state=PATCH, mode=cast(service_pb2.WriteMode, 7)),  # not a WriteMode
        merge("a", labels={"k" * 64: "v"}),
        merge("a", "a-2"),
        merge("a", "a-3", expected_version=2),
        merge("a", "a-2"),  # a replay of the write that made version 2
        service_pb2.PutRequest(session_id="a", state=b"\x10\x02", request_id="a-2"),  # another write, same id
        merge("a", "r" * 129),
    ]
    with CheckpointClient(sidecar.unix_target) as c:
        results = list(c.put_stream(puts, batch_size=5))
        outcome: list[tuple[int, bool | str]] = [
            (r.response.version, r.response.replayed) if r.HasField("response") else (r.error.code, r.error.message)
            for r in results
        ]
        messages = [r.error.message for r in results]
        ok, invalid = (1, False), grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert outcome[0] == ok and outcome[7] == (2, False) and outcome[8] == (3, False) and outcome[9] == (2, True)
        assert outcome[1] == (invalid, "session_id is empty; it must be 1-256 bytes of UTF-8")
        assert outcome[2] == (
            grpc.StatusCode.ABORTED.value[0],
            "session 'a': expected_version 5 but the head is version 1",
        )
        assert results[2].error.current_version == 1
        assert outcome[3][0] == invalid and "not a valid MERGE patch" in messages[3] and "offset 0" in messages[3]
        assert outcome[4] == (
            grpc.StatusCode.RESOURCE_EXHAUSTED.value[0],
            f"state is {(1 << 20) - 1000} bytes; the limit (max_state_bytes) is {(1 << 20) - (64 << 10)};"
            f" max_state_bytes is the sidecar's --max-message-bytes ({1 << 20}) less 65536 bytes kept for the rest"
            " of a message",
        )
        assert outcome[5] == (invalid, "mode 7 is not a WriteMode (REPLACE = 1, MERGE = 2)")
        assert outcome[6][0] == invalid and "is 64 bytes; it must be 1-63" in messages[6]
        assert outcome[10][0] == invalid and "request_id 'a-2' was used for a different write" in messages[10]
        assert outcome[11] == (invalid, "request_id is 129 bytes; the limit is 128")
        assert c.get("a").state == PATCH * 3
        assert [v.version for v in c.history("a")] == [3, 2, 1]


def test_a_cancelled_stream_keeps_what_was_answered_and_the_sidecar_serves_on(sidecar: Sidecar) -> None:
    answered = {}
    for n in range(30):
        stream = Stream(sidecar.unix_target)
        session = f"c{n % 3}"
        stream.send(0, [merge(session, f"{n}-0")])
        answered[session] = stream.answer().results[0].response.version
        for b in range(1, 4):  # queued, never answered
            stream.send(b, [merge(session, f"{n}-{b}-{k}") for k in range(20)] + [merge(session, expected_version=0)])
        stream.call.cancel()
        stream.close()
    with CheckpointClient(sidecar.unix_target) as c:
        for session, version in answered.items():
            head = c.get(session)
            assert head.version >= version and head.state == PATCH * head.version  # whole writes only
        assert c.merge("after", PATCH).version == 1


def test_two_streams_on_one_session_each_keep_their_order(sidecar: Sidecar) -> None:
    mine, theirs = Stream(sidecar.unix_target), Stream(sidecar.unix_target)
    try:
        versions: dict[str, list[int]] = {"mine": [], "theirs": []}
        for b in range(20):
            mine.send(b, [merge("shared", f"mine-{b}-{k}") for k in range(10)])
            theirs.send(b, [merge("shared", f"theirs-{b}-{k}") for k in range(10)])
        for _ in range(20):
            versions["mine"] += [r.response.version for r in mine.answer().results]
            versions["theirs"] += [r.response.version for r in theirs.answer().results]
    finally:
        mine.close()
        theirs.close()
    for got in versions.values():
        assert got == sorted(got) and len(got) == 200
    assert sorted(versions["mine"] + versions["theirs"]) == list(range(1, 401))


def test_many_sessions_in_one_stream_an_empty_batch_and_an_empty_stream(sidecar: Sidecar) -> None:
    puts = [merge(f"many{n % 2000}") for n in range(6000)]
    with CheckpointClient(sidecar.unix_target) as c:
        results = list(c.put_stream(puts, batch_size=500))
        assert [r.response.version for r in results] == [n // 2000 + 1 for n in range(6000)]
        assert c.get("many1999").state == PATCH * 3
        assert list(c.put_stream([])) == []
    stream = Stream(sidecar.unix_target)
    try:
        stream.send(41, [])
        empty = stream.answer()
        assert (empty.batch_id, list(empty.results)) == (41, [])
    finally:
        stream.close()


def test_a_repeated_sigterm_still_exits_0(tmp_path: Path) -> None:
    """SIGTERM sent again and again until the sidecar is gone (as a process manager may): a clean
    stop must end in exit 0, not -15 from a signal landing after the handlers were removed."""
    sidecar = start_sidecar(tmp_path / "data")
    with CheckpointClient(sidecar.unix_target) as c:
        c.merge("kept", PATCH)
    try:
        while sidecar.process.poll() is None:
            sidecar.process.send_signal(signal.SIGTERM)
            threading.Event().wait(0.0005)
        assert sidecar.process.returncode == 0, sidecar.log()
    finally:
        sidecar.stop(signal.SIGKILL)
    assert heads(tmp_path / "data", ["kept"]) == {"kept": 1}
