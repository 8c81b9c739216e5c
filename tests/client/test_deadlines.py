"""``timeout_seconds`` bounds a whole call, its retries included, and each wait for a put_stream's answer
while writes are in flight: never the caller's own pace, nor a stream with nothing owed."""

from __future__ import annotations

import signal
import threading
import time

import grpc
import pytest

from ckpt.sidecar.client import CheckpointError, DeadlineExceededError
from ckpt.v1 import service_pb2
from tests.client.support import FLAVOURS, CountCalls, Expected, check_results, open_client, write
from tests.support import Sidecar


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_the_timeout_bounds_the_whole_call_not_each_attempt(sidecar: Sidecar, flavour: str) -> None:
    """A sidecar that does not answer (frozen with SIGSTOP): once the call's timeout has passed, the
    client must not send the write again (it used to resend it `retries` times, each with a fresh
    timeout, so timeout_seconds=1 meant 4 s and four copies queued in the sidecar)."""
    count = CountCalls()
    with open_client(flavour, sidecar.unix_target, interceptor=count, timeout_seconds=1.0) as c:
        c.put("frozen", b"\x08\x01")  # connected
        count.sent.clear()
        sidecar.process.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(CheckpointError) as info:
                c.put("frozen", b"\x08\x02")
        finally:
            sidecar.process.send_signal(signal.SIGCONT)
    assert info.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert len(count.sent) == 1
    assert "timeout_seconds=1.0" in str(info.value)
    assert f"the sidecar at {sidecar.unix_target} did not answer" in str(info.value)  # which one, of several
    assert info.value.request_id  # the write can be retried idempotently


def _freeze(sidecar: Sidecar, *, thaw_after_seconds: float) -> float:
    """SIGSTOP ``sidecar``, resumed after ``thaw_after_seconds`` whatever happens; when it froze."""
    sidecar.process.send_signal(signal.SIGSTOP)
    thaw = threading.Timer(thaw_after_seconds, sidecar.process.send_signal, (signal.SIGCONT,))
    thaw.daemon = True
    thaw.start()
    return time.monotonic()


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_frozen_sidecar_ends_the_stream_after_timeout_seconds_without_an_answer(
    sidecar: Sidecar, flavour: str
) -> None:
    """``timeout_seconds`` bounds each wait for an answer while writes are in flight, not the stream: a
    consumer slower than it between results is fine, while a sidecar frozen (SIGSTOP) with writes in
    flight ends the stream with DeadlineExceededError naming the progress. (The sidecar is resumed
    before the client closes: gRPC's channel close waits for a peer that does not read. It is also
    resumed 8 s after the freeze, so a client without the bound fails here instead of hanging.)"""
    frozen_at: list[float] = []
    results: list[service_pb2.PutResult] = []
    with open_client(flavour, sidecar.unix_target, timeout_seconds=0.5) as c:
        slow = []
        for result in c.put_stream((write(i) for i in range(3)), batch_size=1):
            slow.append(result)
            time.sleep(0.8)  # the caller's own pace never counts against the sidecar
        check_results(slow, Expected.of(3))
        try:
            with pytest.raises(DeadlineExceededError, match=r"timeout_seconds=0\.5") as info:
                for result in c.put_stream((write(i) for i in range(3, 20_000)), batch_size=16):
                    results.append(result)
                    if len(results) == 100:
                        frozen_at.append(_freeze(sidecar, thaw_after_seconds=8))
            assert time.monotonic() - frozen_at[0] < 5
        finally:
            sidecar.process.send_signal(signal.SIGCONT)
    assert len(results) >= 100
    assert f"the first {len(results)} writes were answered" in str(info.value)
    assert f"the sidecar at {sidecar.unix_target} did not answer the stream" in str(info.value)
    assert info.value.request_id == f"w{3 + len(results)}"


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_stream_whose_writes_are_all_answered_ends_without_waiting_for_the_sidecar(
    sidecar: Sidecar, flavour: str
) -> None:
    """The sidecar freezes right after the last answer, before the stream's end: nothing is in flight,
    so the client returns every result and finishes. The async client used to wait for the end with
    timeout_seconds and raise DeadlineExceededError after every write had been answered."""
    got: list[service_pb2.PutResult] = []
    try:
        with open_client(flavour, sidecar.unix_target, timeout_seconds=0.5) as c:
            for result in c.put_stream([write(i) for i in range(4)], batch_size=4):
                got.append(result)
                if len(got) == 4:
                    frozen = _freeze(sidecar, thaw_after_seconds=2.0)
            finished = time.monotonic() - frozen
            time.sleep(2.5)  # thawed before the channel closes (see the test above)
    finally:
        sidecar.process.send_signal(signal.SIGCONT)
    check_results(got, Expected.of(4))
    assert finished < 1.5  # it did not wait for the frozen sidecar's end of stream
