"""put_stream against a real gRPC server whose PutStream a test scripts (support.scripted_server): what a
sidecar cannot be made to do on demand, such as never answering or answering out of order."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from ckpt.sidecar.client import CheckpointError
from ckpt.v1 import service_pb2
from tests.client.support import FLAVOURS, committed, merge, open_client, scripted_server, wait_for


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_at_most_128_messages_are_in_flight_and_two_of_writes_read_ahead(tmp_path: Path, flavour: str) -> None:
    """A server that reads every message and answers none: the client sends 128 (one write each) and reads
    two more from ``puts`` ahead, holding a third, then waits; memory holds what is in flight, not the
    input. When the server then ends the stream without answering, the put_stream says so, naming the
    128 writes sent without a result."""
    received: list[service_pb2.PutStreamRequest] = []
    release = threading.Event()
    given: list[int] = []

    def never_answers(requests: Iterator[service_pb2.PutStreamRequest]) -> Iterator[service_pb2.PutStreamResponse]:
        for request in requests:
            received.append(request)
            if len(received) == 128:
                break
        release.wait(60)
        return iter(())

    def steps() -> Iterator[service_pb2.PutRequest]:
        for i in range(100_000):
            given.append(i)
            yield merge("bounded")

    outcome: list[Any] = []
    with scripted_server(tmp_path / "stub.sock", never_answers) as target, open_client(flavour, target) as c:

        def consume() -> None:
            try:
                outcome.extend(c.put_stream(steps(), batch_size=1))
            except CheckpointError as exc:
                outcome.append(exc)

        consumer = threading.Thread(target=consume)
        consumer.start()
        try:
            wait_for(lambda: len(received) == 128, "128 messages")
            time.sleep(0.5)  # were there room, more would come now
            assert len(given) == 128 + 2 + 1
        finally:
            release.set()
            consumer.join(30)
    (error,) = outcome
    assert isinstance(error, CheckpointError) and error.code is grpc.StatusCode.INTERNAL
    assert "ended the stream (OK) before every write was sent and answered" in str(error)
    assert len(error.unanswered) == 128 and error.request_id == received[0].puts[0].request_id
    assert "the first 0 writes were answered; the next 128" in str(error)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_an_answer_that_is_not_the_next_batchs_ends_the_stream_saying_the_contract_is_broken(
    tmp_path: Path, flavour: str
) -> None:
    """Pairing each answer with the batch it is due for is what makes each result the right write's."""

    def out_of_order(requests: Iterator[service_pb2.PutStreamRequest]) -> Iterator[service_pb2.PutStreamResponse]:
        first, second = next(requests), next(requests)
        yield committed(second)
        yield committed(first)

    with (
        scripted_server(tmp_path / "stub.sock", out_of_order) as target,
        open_client(flavour, target) as c,
        pytest.raises(CheckpointError, match="answered batch 1 with 1 results where batch 0, with 1 was due") as info,
    ):
        list(c.put_stream([merge("a"), merge("b")], batch_size=1))
    assert info.value.code is grpc.StatusCode.INTERNAL
