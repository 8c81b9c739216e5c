"""The writes of one put_stream, kept without I/O: events in, decisions out.

A put_stream is one or more PutStream calls in a row (streams). A
:class:`BatchBuilder` turns the caller's writes into PutStream messages
(batches) under ``batch_size`` and the message-size limit. A
:class:`StreamLedger` keeps every batch built and not yet answered; gives each
stream the batches it is to send (first the unanswered ones again, in order and
unchanged: the same request ids and batch ids; then new ones, while the bounds
on what is in flight allow); pairs each answer with the batch it is due for;
and says which results to give the caller, in order. The sidecar answers a
resent write it had committed with the first result (replayed=True), so every
write is made once and answered once, in the caller's order. The server only
echoes batch_id, so ids stay unique per put_stream and each answer is checked
against the batch due.

Nothing here reads, sends, waits or looks at a clock: the clients' stream loops
(sync_stream, async_stream) do, and tell the ledger what happened, with the
time where it counts.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ckpt.v1 import service_pb2

#: Batches, and bytes of them, a put_stream may have built and not had answered: twice the
#: sidecar's read-ahead (64 batches, 64 MiB of states), so that its queue and the connection
#: stay full while memory holds what is in flight, not the whole input. A batch always goes
#: when none is in flight, however big.
STREAM_BATCHES_AHEAD = 128
STREAM_BYTES_AHEAD = 128 * 1024 * 1024

# Room in a PutStream message for its batch id and each put's tag and length.
_MESSAGE_SLACK_BYTES = 64
_PUT_FRAMING_BYTES = 8
# A result's error code when the sidecar, stopping, did not queue the write (UNAVAILABLE).
_UNAVAILABLE = 14


@dataclass(frozen=True, kw_only=True)
class StreamLimits:
    """What a put_stream may hold: writes per message, bytes per message, and what may be in flight."""

    batch_size: int
    max_message_bytes: int
    batches_ahead: int = STREAM_BATCHES_AHEAD
    bytes_ahead: int = STREAM_BYTES_AHEAD

    @property
    def read_ahead_writes(self) -> int:
        """Writes a reader of ``puts`` may hold before they are taken: two messages' worth."""
        return 2 * self.batch_size

    def may_read_ahead(self, writes: int, held_bytes: int, size: int) -> bool:
        """Whether a reader holding ``writes`` writes of ``held_bytes`` may hold one more of ``size``
        bytes: at most ``read_ahead_writes`` writes and one message's bytes (one write however big)."""
        return writes == 0 or (writes < self.read_ahead_writes and held_bytes + size <= self.max_message_bytes)


@dataclass(frozen=True)
class End:
    """The end of ``puts``: ``error`` is what ended it (raised by ``puts``, or a write refused), None if it ran out."""

    error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class Batch:
    """A PutStream message built from ``puts``, and the bytes of its writes."""

    request: service_pb2.PutStreamRequest
    nbytes: int


class OversizedWrite(Exception):
    """A write too big for a PutStream message of ``max_message_bytes``: refused before anything is sent
    (gRPC would fail the whole stream while sending it, answers of earlier writes unread, and name no write)."""

    def __init__(self, index: int, request_id: str, message_bytes: int, max_message_bytes: int) -> None:
        super().__init__(
            f"puts[{index}] (request_id {request_id!r}) needs a {message_bytes}-byte PutStream message, over"
            f" this client's message limit (max_message_bytes = {max_message_bytes})"
        )
        self.request_id = request_id


class BrokenContract(Exception):
    """An answer that is not the next batch's, whole: pairing them is what makes each result the right write's."""

    def __init__(self, response: service_pb2.PutStreamResponse, due: service_pb2.PutStreamRequest | None) -> None:
        expected = "none" if due is None else f"batch {due.batch_id}, with {len(due.puts)}"
        super().__init__(
            f"PutStream answered batch {response.batch_id} with {len(response.results)} results where {expected}"
            " was due: the sidecar broke the stream's contract"
        )


def copied(put: Any) -> Any:
    """A copy of a PutRequest, as given now: a generator may change and give the same message again
    (one object, many writes). Anything else as it is, for BatchBuilder to name."""
    if not isinstance(put, service_pb2.PutRequest):
        return put
    mine = service_pb2.PutRequest()
    mine.CopyFrom(put)
    return mine


class SequenceSource:
    """A sequence's writes, for a BatchBuilder: all of them are there at once, so a message is always filled."""

    def __init__(self, puts: Sequence[Any]) -> None:
        self._puts = iter(puts)

    def take(self) -> Any:
        """The next write, or the End of them (with the error reading them raised, if one did)."""
        try:
            return next(self._puts)
        except StopIteration:
            return End()
        except BaseException as exc:  # whatever it is, it comes after the writes before it
            return End(exc)

    def ready(self) -> bool:
        return True


class BatchBuilder:
    """The caller's writes in, PutStream messages out.

    A message closes with ``batch_size`` writes, before a write that would take
    it past ``max_message_bytes``, when no further write is ready yet (so that
    a write is sent at once, not held for others to join it), and at the end. A
    write without a request id gets a new one (in a copy, unless the writes
    are ``owned``: copies already). A write too big to share a message goes
    alone (and the sidecar refuses it if it is over its limit). Something that
    is not a PutRequest, or a write too big for any message, ends the writes as
    an error of ``puts`` would, after the writes before it: ``end``.
    """

    def __init__(self, limits: StreamLimits, *, owned: bool, new_request_id: Callable[[], str]) -> None:
        self._limits = limits
        self._room = limits.max_message_bytes - _MESSAGE_SLACK_BYTES
        self._owned = owned
        self._new_request_id = new_request_id
        self._puts: list[service_pb2.PutRequest] = []
        self._bytes = 0
        self._made = 0  # messages built: the next one's batch_id
        self.taken = 0  # items taken from puts
        self.end: End | None = None

    def add(self, item: Any, *, more_ready: bool = True) -> list[Batch]:
        """Take the next item of ``puts`` (a write, or its End); the messages it closes, in order."""
        if self.end is not None:
            raise RuntimeError("the writes have ended")
        if isinstance(item, End):
            self.end = item
            return self._close()
        index, self.taken = self.taken, self.taken + 1
        try:
            put, size = self._accept(index, item)
        except (TypeError, OversizedWrite) as exc:
            self.end = End(exc)
            return self._close()
        out = self._close() if self._puts and self._bytes + size > self._room else []
        self._puts.append(put)
        self._bytes += size
        if len(self._puts) == self._limits.batch_size or not more_ready:
            out += self._close()
        return out

    def _accept(self, index: int, put: Any) -> tuple[service_pb2.PutRequest, int]:
        if not isinstance(put, service_pb2.PutRequest):
            raise TypeError(f"puts[{index}] is a {type(put).__name__}, not a ckpt.v1.PutRequest")
        if not put.request_id:  # the caller's message is not changed: one message given twice is two writes
            put = put if self._owned else copied(put)
            put.request_id = self._new_request_id()
        size = put.ByteSize() + _PUT_FRAMING_BYTES
        if size > self._room:
            alone = service_pb2.PutStreamRequest(puts=[put], batch_id=self._made + 1).ByteSize()
            if alone > self._limits.max_message_bytes:
                raise OversizedWrite(index, put.request_id, alone, self._limits.max_message_bytes)
        return put, size

    def _close(self) -> list[Batch]:
        if not self._puts:
            return []
        batch = Batch(service_pb2.PutStreamRequest(puts=self._puts, batch_id=self._made), self._bytes)
        self._puts, self._bytes = [], 0
        self._made += 1
        return [batch]


class Hold(enum.Enum):
    """Why a stream has no batch to send now."""

    INPUT = "input"  # every batch built is sent: build the next from puts, then ask again
    ROOM = "room"  # the bounds on what is in flight are reached: ask again after an answer
    END = "end"  # nothing more: puts ended and every batch is sent, or the stream is not the current one


class StreamLedger:
    """The batches of one put_stream across its streams: which were sent, which answered, which are owed.

    Events: ``built`` (batches from a BatchBuilder, and the end of ``puts``),
    ``open_stream``/``close_stream``, ``answered`` (an answer), ``eof`` (a
    stream that ended OK), ``broken`` (one that failed). Decisions:
    ``next_to_send`` (a batch for a stream to send, or why there is none),
    the results to give (returned by ``answered`` and ``eof``), ``unanswered``
    (what to resend, or to name on giving up), ``finished``, and ``deadline``.
    """

    def __init__(self, limits: StreamLimits) -> None:
        self._limits = limits
        self._batches: dict[int, Batch] = {}  # built and not answered, by number (their batch_id)
        self._first = 0  # the first unanswered batch
        self._built = 0
        self._bytes = 0  # of the unanswered batches
        self._stream = 0  # the current stream
        self._cursor = 0  # the next batch the current stream sends
        self._held: list[service_pb2.PutResult] = []  # see answered
        self._clock = 0.0  # since when the answer due has been owed
        self.answered_writes = 0  # writes whose results were given
        self.end: End | None = None

    # -- puts

    def built(self, batches: Sequence[Batch], end: End | None, now: float) -> None:
        """Batches built from ``puts`` (by a BatchBuilder), and its End once met."""
        for batch in batches:
            if self._first == self._built:
                self._clock = now  # the first write in flight since every one was answered
            self._batches[self._built] = batch
            self._built += 1
            self._bytes += batch.nbytes
        if end is not None:
            self.end = end

    @property
    def built_count(self) -> int:
        return self._built

    # -- streams

    def open_stream(self, now: float) -> int:
        """A new stream (the one before sends nothing more): it sends the unanswered batches first."""
        self._stream += 1
        self._cursor = self._first
        self._clock = now
        return self._stream

    def close_stream(self) -> None:
        """The current stream ended, or is left: it sends nothing more."""
        self._stream += 1

    def next_to_send(self, stream: int) -> service_pb2.PutStreamRequest | Hold:
        """The next batch ``stream`` sends (an unanswered one again, or the next built), or why there is none."""
        if stream != self._stream:
            return Hold.END
        if self._cursor < self._built:
            self._cursor += 1
            return self._batches[self._cursor - 1].request
        if self.end is not None:
            return Hold.END
        # A batch whose last results are held back is answered but for them (see answered): it does not
        # count, or a stream whose sidecar goes on would wait for room that only its next answer makes.
        held = self._batches[self._first] if self._held else None
        ahead = self._built - self._first - (held is not None)
        nbytes = self._bytes - (held.nbytes if held is not None else 0)
        if ahead and (ahead >= self._limits.batches_ahead or nbytes >= self._limits.bytes_ahead):
            return Hold.ROOM
        return Hold.INPUT

    # -- answers

    def answered(self, response: service_pb2.PutStreamResponse, now: float) -> list[service_pb2.PutResult]:
        """The current stream's next answer: the results to give now, in order (BrokenContract unless it
        answers the first unanswered batch, sent on this stream, whole).

        A sidecar stopped while its stream waited for room in its write queue
        answers the batch whole, the writes it had not queued UNAVAILABLE (not
        written), and ends the stream: they are a batch's last results, and
        nothing after them was read. So a batch's trailing UNAVAILABLE results
        are held back: if the stream then breaks (``broken``), their writes go
        first on the next one, order kept, request ids the same; if it goes on
        (another answer) or ends (``eof``), they are given as they are.
        """
        out = self._release_held()
        due = self._batches.get(self._first) if self._first < self._cursor else None
        if due is None or response.batch_id != due.request.batch_id or len(response.results) != len(due.request.puts):
            raise BrokenContract(response, None if due is None else due.request)
        results = list(response.results)
        held = 0
        while held < len(results) and results[-1 - held].error.code == _UNAVAILABLE:
            held += 1
        if held:
            rest = due.request.puts[-held:]
            self._held, results = results[-held:], results[:-held]
            self._bytes -= due.nbytes
            self._batches[self._first] = Batch(
                service_pb2.PutStreamRequest(puts=rest, batch_id=due.request.batch_id),
                sum(put.ByteSize() + _PUT_FRAMING_BYTES for put in rest),
            )
            self._bytes += self._batches[self._first].nbytes
        else:
            self._answer_first()
        self.answered_writes += len(results)
        self._clock = now
        return out + results

    def eof(self) -> list[service_pb2.PutResult]:
        """The current stream ended OK: results held back are given after all (their batch is answered)."""
        return self._release_held()

    def broken(self) -> None:
        """The current stream failed: the writes of results held back stay unanswered (resent, or named)."""
        self._held = []

    def _release_held(self) -> list[service_pb2.PutResult]:
        out, self._held = self._held, []
        if out:
            self._answer_first()
            self.answered_writes += len(out)
        return out

    def _answer_first(self) -> None:
        self._bytes -= self._batches.pop(self._first).nbytes
        self._first += 1

    # -- what is owed

    @property
    def idle(self) -> bool:
        """Every batch built is answered."""
        return self._first == self._built

    @property
    def finished(self) -> bool:
        """``puts`` has ended and every write taken from it is answered: nothing more to send or wait for."""
        return self.end is not None and self.idle

    def unanswered(self) -> list[service_pb2.PutRequest]:
        """The writes built into batches and not answered, in order, as sent (with their request ids)."""
        return [put for n in range(self._first, self._built) for put in self._batches[n].request.puts]

    def deadline(self, waiting_since: float, timeout_seconds: float) -> float | None:
        """When a wait for an answer, begun at ``waiting_since``, is overdue: ``timeout_seconds`` after the
        later of it and the last answer (or the stream's start, or the first write built since all were
        answered); None while nothing is in flight, so a caller slow to take results, or a ``puts``
        slow to give writes, never counts against the sidecar."""
        if self.idle:
            return None
        return max(waiting_since, self._clock) + timeout_seconds
