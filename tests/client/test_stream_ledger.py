"""The put_stream ledger on its own, without I/O: writes and answers in, decisions out.

Each test plays the clients' loops by hand (Loop: a builder reading a list, the ledger, the streams'
sends) and the sidecar by hand (Sidecar: commits each request id once, replays a resent one), so that
breaks, stops mid-batch and broken contracts can be placed exactly; the property test places them at
random, and checks every write against a simple oracle.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckpt.sidecar.client.ledger import (
    BatchBuilder,
    BrokenContract,
    End,
    Hold,
    OversizedWrite,
    SequenceSource,
    StreamLedger,
    StreamLimits,
)
from ckpt.v1 import service_pb2

UNAVAILABLE = 14


def writes(n: int, *, ids: bool = True) -> list[service_pb2.PutRequest]:
    """Writes 0..n-1 to one session, write i's state ``b"i"`` (its request id ``wi``, if ``ids``)."""
    return [
        service_pb2.PutRequest(session_id="s", state=b"%d" % i, request_id=f"w{i}" if ids else "") for i in range(n)
    ]


def states(batch: service_pb2.PutStreamRequest | Hold) -> list[bytes]:
    assert isinstance(batch, service_pb2.PutStreamRequest), batch
    return [put.state for put in batch.puts]


@dataclass
class Loop:
    """A client's loop over a list of writes: pulls into the builder when the ledger asks for input."""

    ledger: StreamLedger
    builder: BatchBuilder
    source: SequenceSource
    now: float = 0.0

    @classmethod
    def of(cls, puts: list[service_pb2.PutRequest], limits: StreamLimits) -> Loop:
        made = iter(range(1_000_000))
        builder = BatchBuilder(limits, owned=False, new_request_id=lambda: f"g{next(made)}")
        return cls(StreamLedger(limits), builder, SequenceSource(puts))

    def send(self, stream: int) -> service_pb2.PutStreamRequest | Hold:
        """What the stream's request iterator gives next (building batches as the ledger asks)."""
        while (step := self.ledger.next_to_send(stream)) is Hold.INPUT:
            while not (batches := self.builder.add(self.source.take())) and self.builder.end is None:
                pass
            self.ledger.built(batches, self.builder.end, self.now)
        return step

    def batch(self, stream: int) -> service_pb2.PutStreamRequest:
        """The next batch the stream sends (there must be one)."""
        step = self.send(stream)
        assert isinstance(step, service_pb2.PutStreamRequest), step
        return step


@dataclass
class Sidecar:
    """Commits each request id once, in the order received; a resent write gets the first result, replayed."""

    versions: dict[str, int] = field(default_factory=dict)  # request id -> version
    committed: list[bytes] = field(default_factory=list)  # states, in commit order

    def commit(self, put: service_pb2.PutRequest) -> service_pb2.PutResult:
        replayed = put.request_id in self.versions
        if not replayed:
            self.committed.append(put.state)
            self.versions[put.request_id] = len(self.committed)
        return service_pb2.PutResult(
            response=service_pb2.PutResponse(version=self.versions[put.request_id], replayed=replayed)
        )

    def answer(
        self, batch: service_pb2.PutStreamRequest, *, queued: int | None = None
    ) -> service_pb2.PutStreamResponse:
        """The batch's answer; with ``queued``, a stopping sidecar's: the writes after it UNAVAILABLE, not written."""
        results = [
            self.commit(put)
            if queued is None or k < queued
            else service_pb2.PutResult(error=service_pb2.PutError(code=UNAVAILABLE, message="stopping"))
            for k, put in enumerate(batch.puts)
        ]
        return service_pb2.PutStreamResponse(results=results, batch_id=batch.batch_id)


# -- building batches ------------------------------------------------------------------------------


def test_a_batch_closes_when_full_when_the_next_write_would_not_fit_and_when_none_is_ready() -> None:
    limits = StreamLimits(batch_size=3, max_message_bytes=1024)
    builder = BatchBuilder(limits, owned=False, new_request_id=lambda: "new")
    out = [builder.add(put) for put in writes(4)]
    assert [len(b) for b in out] == [0, 0, 1, 0]  # full at 3
    assert states(out[2][0].request) == [b"0", b"1", b"2"] and out[2][0].request.batch_id == 0
    assert states(builder.add(writes(5)[4], more_ready=False)[0].request) == [b"3", b"4"]  # none ready: goes now
    big = service_pb2.PutRequest(session_id="s", state=b"x" * 600, request_id="big")
    assert builder.add(big) == []
    closed = builder.add(service_pb2.PutRequest(session_id="s", state=b"y" * 600, request_id="big2"))
    assert [b.request.batch_id for b in closed] == [2] and states(closed[0].request) == [b"x" * 600]  # no room
    assert [b.request.batch_id for b in builder.add(End())] == [3]  # the end closes the last one
    assert builder.end == End()


def test_a_write_without_a_request_id_gets_a_new_one_in_a_copy_unless_the_writes_are_copies_already() -> None:
    limits = StreamLimits(batch_size=1, max_message_bytes=1024)
    callers = writes(1, ids=False)[0]
    (batch,) = BatchBuilder(limits, owned=False, new_request_id=lambda: "g1").add(callers)
    assert batch.request.puts[0].request_id == "g1" and callers.request_id == ""
    mine = writes(1, ids=False)[0]
    BatchBuilder(limits, owned=True, new_request_id=lambda: "g2").add(mine)
    assert mine.request_id == "g2"


def test_something_not_a_put_request_or_too_big_for_any_message_ends_the_writes_after_those_before_it() -> None:
    limits = StreamLimits(batch_size=8, max_message_bytes=1024)
    builder = BatchBuilder(limits, owned=False, new_request_id=lambda: "g")
    builder.add(writes(1)[0])
    (batch,) = builder.add({"session_id": "s"})
    assert states(batch.request) == [b"0"]
    assert isinstance(builder.end, End) and isinstance(builder.end.error, TypeError)
    assert str(builder.end.error) == "puts[1] is a dict, not a ckpt.v1.PutRequest"
    with pytest.raises(RuntimeError, match="ended"):
        builder.add(writes(1)[0])

    builder = BatchBuilder(limits, owned=False, new_request_id=lambda: "g")
    assert builder.add(service_pb2.PutRequest(session_id="s", state=b"x" * 2000, request_id="huge")) == []
    assert builder.end is not None and isinstance(builder.end.error, OversizedWrite)
    assert builder.end.error.request_id == "huge"
    assert "puts[0] (request_id 'huge') needs a" in str(builder.end.error)


def test_a_reader_holds_two_messages_of_writes_and_one_message_of_bytes_ahead() -> None:
    limits = StreamLimits(batch_size=8, max_message_bytes=1000)
    assert limits.may_read_ahead(0, 0, 5000)  # one write, however big
    assert limits.may_read_ahead(15, 900, 100) and not limits.may_read_ahead(16, 0, 1)
    assert not limits.may_read_ahead(1, 900, 101)


# -- streams, breaks and answers ---------------------------------------------------------------------


def test_a_break_mid_batch_resends_the_unanswered_batches_first_in_order_with_the_same_ids() -> None:
    loop = Loop.of(writes(10, ids=False), StreamLimits(batch_size=3, max_message_bytes=1 << 20))
    sidecar = Sidecar()
    first = loop.ledger.open_stream(0.0)
    sent = [loop.batch(first) for _ in range(3)]
    assert [states(b) for b in sent] == [[b"0", b"1", b"2"], [b"3", b"4", b"5"], [b"6", b"7", b"8"]]
    given = loop.ledger.answered(sidecar.answer(sent[0]), 1.0)
    sidecar.answer(sent[1])  # committed, its answer lost in the break
    loop.ledger.broken()
    assert [p.state for p in loop.ledger.unanswered()] == [b"3", b"4", b"5", b"6", b"7", b"8"]

    second = loop.ledger.open_stream(2.0)
    assert loop.send(first) is Hold.END  # the broken stream sends nothing more
    resent = [loop.send(second) for _ in range(3)]
    assert resent[:2] == sent[1:]  # unchanged: the same batch ids and request ids
    assert states(resent[2]) == [b"9"] and loop.send(second) is Hold.END
    for batch in resent:
        assert isinstance(batch, service_pb2.PutStreamRequest)
        given += loop.ledger.answered(sidecar.answer(batch), 3.0)
    assert loop.ledger.finished
    assert [(r.response.version, r.response.replayed) for r in given] == [
        (v, 4 <= v <= 6) for v in range(1, 11)
    ]  # each once, in order; those committed before the break replayed


def test_an_answer_for_another_batch_or_with_the_wrong_number_of_results_breaks_the_contract() -> None:
    loop = Loop.of(writes(4), StreamLimits(batch_size=2, max_message_bytes=1 << 20))
    stream = loop.ledger.open_stream(0.0)
    first, second = loop.send(stream), loop.send(stream)
    assert isinstance(first, service_pb2.PutStreamRequest) and isinstance(second, service_pb2.PutStreamRequest)
    out_of_order = Sidecar().answer(second)
    with pytest.raises(BrokenContract, match="answered batch 1 with 2 results where batch 0, with 2 was due"):
        loop.ledger.answered(out_of_order, 1.0)
    short = service_pb2.PutStreamResponse(results=[service_pb2.PutResult()], batch_id=0)
    with pytest.raises(BrokenContract, match="answered batch 0 with 1 results"):
        loop.ledger.answered(short, 1.0)
    unsent = Loop.of(writes(2), StreamLimits(batch_size=2, max_message_bytes=1 << 20))
    unsent.ledger.open_stream(0.0)
    with pytest.raises(BrokenContract, match="where none was due"):
        unsent.ledger.answered(service_pb2.PutStreamResponse(batch_id=0), 1.0)


def test_writes_a_stopping_sidecar_did_not_queue_are_resent_after_a_break_or_given_if_it_goes_on() -> None:
    for breaks in (True, False):
        loop = Loop.of(writes(6), StreamLimits(batch_size=3, max_message_bytes=1 << 20))
        sidecar = Sidecar()
        stream = loop.ledger.open_stream(0.0)
        batch = loop.send(stream)
        assert isinstance(batch, service_pb2.PutStreamRequest)
        given = loop.ledger.answered(sidecar.answer(batch, queued=1), 1.0)
        assert [r.response.version for r in given] == [1]  # the two not queued are held back
        if breaks:
            loop.ledger.broken()
            stream = loop.ledger.open_stream(2.0)
            resent = loop.send(stream)
            assert states(resent) == [b"1", b"2"]  # first on the next stream, in the same batch
            assert isinstance(resent, service_pb2.PutStreamRequest) and resent.batch_id == batch.batch_id
            assert [p.request_id for p in loop.ledger.unanswered()] == ["w1", "w2"]
            given += loop.ledger.answered(sidecar.answer(resent), 3.0)
            assert [r.response.version for r in given] == [1, 2, 3]
        else:
            following = loop.send(stream)
            assert isinstance(following, service_pb2.PutStreamRequest)
            given += loop.ledger.answered(sidecar.answer(following), 2.0)
            assert [r.WhichOneof("outcome") for r in given] == ["response", "error", "error"] + ["response"] * 3


def test_at_most_batches_ahead_or_bytes_ahead_are_in_flight_and_one_batch_always_goes() -> None:
    loop = Loop.of(writes(20), StreamLimits(batch_size=2, max_message_bytes=1 << 20, batches_ahead=3))
    stream = loop.ledger.open_stream(0.0)
    sent = [loop.send(stream) for _ in range(3)]
    assert loop.send(stream) is Hold.ROOM
    assert isinstance(sent[0], service_pb2.PutStreamRequest)
    loop.ledger.answered(Sidecar().answer(sent[0]), 1.0)
    assert isinstance(loop.send(stream), service_pb2.PutStreamRequest)  # room for one more
    assert loop.send(stream) is Hold.ROOM

    big = [service_pb2.PutRequest(session_id="s", state=b"x" * 400, request_id=f"b{i}") for i in range(4)]
    loop = Loop.of(big, StreamLimits(batch_size=1, max_message_bytes=1 << 20, bytes_ahead=100))
    stream = loop.ledger.open_stream(0.0)
    assert isinstance(loop.send(stream), service_pb2.PutStreamRequest)  # over the bytes, but none in flight
    assert loop.send(stream) is Hold.ROOM


def test_the_answers_deadline_counts_only_while_writes_are_in_flight() -> None:
    """From the later of the wait's start and the last answer (or the first write since all were answered)."""
    loop = Loop.of(writes(4), StreamLimits(batch_size=2, max_message_bytes=1 << 20))
    stream = loop.ledger.open_stream(0.0)
    assert loop.ledger.deadline(0.0, 5.0) is None  # nothing built: a slow puts does not count
    loop.now = 10.0
    batch = loop.send(stream)
    assert loop.ledger.deadline(3.0, 5.0) == 15.0  # from the first write sent since all were answered
    assert loop.ledger.deadline(12.0, 5.0) == 17.0  # from the wait's start, when later
    assert isinstance(batch, service_pb2.PutStreamRequest)
    loop.ledger.answered(Sidecar().answer(batch), 20.0)
    assert loop.ledger.deadline(12.0, 5.0) is None  # all answered: a slow caller does not count


# -- the property: whatever the breaks, every write is answered once, in order ---------------------------


@given(st.data())
def test_every_write_is_answered_once_in_order_and_committed_at_most_once_whatever_the_breaks(
    data: st.DataObject,
) -> None:
    n = data.draw(st.integers(0, 30), label="writes")
    limits = StreamLimits(
        batch_size=data.draw(st.integers(1, 5), label="batch_size"),
        max_message_bytes=1 << 20,
        batches_ahead=data.draw(st.integers(1, 4), label="batches_ahead"),
    )
    puts = [
        service_pb2.PutRequest(session_id="s", state=b"%d" % i, request_id=f"w{i}" if i % 3 else "") for i in range(n)
    ]
    loop = Loop.of(puts, limits)
    sidecar = Sidecar()
    given: list[service_pb2.PutResult] = []
    breaks = 0
    while not loop.ledger.finished:
        stream = loop.ledger.open_stream(loop.now)
        received: deque[service_pb2.PutStreamRequest] = deque()
        sending, room = True, True
        # After a stopping sidecar's answer with writes it did not queue, it read nothing more: none of the
        # batches it received after commits until its next answer (it ends the stream, or goes on).
        read_nothing_after = False
        while True:
            actions = (["send"] if sending and room else []) + (["answer", "stop"] if received else [])
            if breaks < 5:
                actions.append("break")
            if not actions:  # half-closed and every batch received answered: the stream ends OK
                given += loop.ledger.eof()
                assert loop.ledger.finished
                break
            action = data.draw(st.sampled_from(actions))
            loop.now += 1.0
            if action == "send":
                step = loop.send(stream)
                if isinstance(step, service_pb2.PutStreamRequest):
                    received.append(step)
                else:
                    sending, room = step is not Hold.END, step is not Hold.ROOM
            elif action == "answer":
                given += loop.ledger.answered(sidecar.answer(received.popleft()), loop.now)
                room, read_nothing_after = True, False
            elif action == "stop":  # a stopping sidecar answers one batch, not queuing its last writes
                batch = received.popleft()
                queued = data.draw(st.integers(0, len(batch.puts)), label="queued")
                given += loop.ledger.answered(sidecar.answer(batch, queued=queued), loop.now)
                room, read_nothing_after = True, queued < len(batch.puts)
                if breaks < 5 and data.draw(st.booleans(), label="stream ends"):
                    breaks += 1
                    loop.ledger.broken()
                    break
            else:  # the connection breaks; some batches received may have committed, unanswered
                breaks += 1
                committed = 0 if read_nothing_after else data.draw(st.integers(0, len(received)), label="committed")
                for batch in list(received)[:committed]:
                    sidecar.answer(batch)
                loop.ledger.broken()
                break
        loop.ledger.close_stream()

    # The oracle: write i has one result, the i-th; a response is the version its one commit made; an
    # error is a stopping sidecar's, on a stream that went on: given as it is (the write not queued then,
    # though an attempt before may have committed it).
    assert len(given) == n
    committed_at = {state: version for version, state in enumerate(sidecar.committed, 1)}
    assert len(committed_at) == len(sidecar.committed)  # no write committed twice
    assert sidecar.committed == sorted(sidecar.committed, key=int)  # in the caller's order
    for i, result in enumerate(given):
        if result.HasField("error"):
            assert result.error.code == UNAVAILABLE
        else:
            assert result.response.version == committed_at[b"%d" % i]
