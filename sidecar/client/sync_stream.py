"""The sync put_stream's I/O around its StreamRun: threads reading ``puts``, gRPC's request and answer threads.

gRPC reads each stream's requests on a thread of its own; an iterator's writes
are read ahead on another (ReadAhead), a stream's answers on a third
(Responses), and a watchdog cancels a stream whose answer is overdue. What is
sent, resent, answered and given is the ledger's to say (ledger.StreamLedger),
under one lock.
"""

from __future__ import annotations

import contextvars
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal, NamedTuple

import grpc

from ckpt.v1 import service_pb2

from . import interrupts
from .ledger import End, Hold, SequenceSource, StreamLimits, copied
from .policy import ENDED_STREAM_GRACE_SECONDS
from .stream import Move, StreamRun


class ReadAhead:
    """``puts``, read on a thread of its own a few writes ahead (StreamLimits.may_read_ahead).

    So that a message goes as soon as no further write is ready to join it
    (``ready``), rather than when ``batch_size`` writes have come: an agent
    that gives one write per step would otherwise wait for 63 more before its
    first was even sent. A ``puts`` that gives writes quickly still fills
    whole messages. An exception of ``puts`` is the End of the writes, after
    the writes it gave. Each write is copied as it is read (a generator may
    change one message and give it again), and once the put_stream has ended
    the reader stops at its next write, which is not sent, like those it had
    read ahead.
    """

    def __init__(self, puts: Iterable[Any], limits: StreamLimits, queued: Callable[[], None] | None = None) -> None:
        # A SimpleQueue, whose put and get are C calls: a queue.Queue cost ~3x
        # as much per write.
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._limits = limits
        self._queued = queued  # called on the reader's thread after each write (and the End) it queues
        self._given = self._given_bytes = 0  # written by the reader only
        self._taken = self._taken_bytes = 0  # written by the consumer only
        self._room = threading.Event()
        self._closed = False
        # ``puts`` runs in the caller's contextvars, as it would if the caller iterated it.
        read = contextvars.copy_context().run
        self._thread = threading.Thread(
            target=read, args=(self._read, puts), name="ckpt-put-stream-reader", daemon=True
        )
        self._thread.start()

    def _read(self, puts: Iterable[Any]) -> None:
        end = End()
        try:
            for given in puts:
                if self._closed:  # the put_stream ended while ``puts`` gave this: it is not sent
                    return
                size = given.ByteSize() if isinstance(given, service_pb2.PutRequest) else 0
                while not self._has_room(size):
                    self._room.clear()  # before the check: a take after it sets the event again
                    if not self._has_room(size):
                        self._room.wait(0.1)  # woken now and then to see close()
                    if self._closed:
                        return
                # Copied before ``puts`` goes on (see copied).
                self._queue.put((copied(given), size))
                self._given += 1
                self._given_bytes += size
                if self._queued is not None:
                    self._queued()
        except BaseException as exc:  # whatever it is, the consumer must not wait for ever
            end = End(exc)
        self._queue.put(end)
        if self._queued is not None:
            self._queued()

    def _has_room(self, size: int) -> bool:
        return self._limits.may_read_ahead(self._given - self._taken, self._given_bytes - self._taken_bytes, size)

    def ready(self) -> bool:
        """Whether the next write (or the end of ``puts``) is here already."""
        return not self._queue.empty()

    def take(self) -> Any:
        """The next write, waiting for it; or the End of the writes."""
        item = self._queue.get()
        if isinstance(item, End):
            self._queue.put(item)  # every later take sees the end too
            return item
        put, size = item
        self._taken_bytes += size
        self._taken += 1  # before looking at the event: see _read
        if not self._room.is_set():
            self._room.set()
        return put

    def close(self) -> None:
        """Stop reading (a read under way inside ``puts`` ends on its own), and end the writes:
        a take waiting for the next one is let go."""
        self._closed = True
        self._room.set()
        self._queue.put(End())


class Responses:
    """A stream call's responses, read on a thread of their own, so that a wait for one ends with the call.

    ``next(call)`` waits for the call's next message to be read, and grpcio
    (1.85) can end a call and leave that read pending for ever: a PutStream
    cut by a stopping sidecar's GOAWAY ("Cancelling all calls") before the
    sidecar took it, which gRPC then retried on its own against the socket
    gone ("failed to connect to all addresses"), ended UNAVAILABLE with its
    message read still due, and ``next`` never returned; ``cancel()`` could
    not end it either, the call being over. Here a wait ends, once the call
    has, after each answer still handed over within
    ENDED_STREAM_GRACE_SECONDS, as ``next(call)`` called after the end
    would: StopIteration if it ended OK, else the call as its RpcError (the
    reader stays in its read, a daemon thread).

    The caller's thread touches no gRPC object (see interrupts): the call is
    started, and cancelled, on interrupts' worker when that thread is the
    main one, and read here on a thread of its own; its end is seen on
    gRPC's, and the errors handed over are EndedCalls.
    """

    def __init__(self, call: Any) -> None:
        self._call = call
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._ended = False
        self._end: BaseException | None = None  # once the call has ended: StopIteration, or its EndedCall
        self._last: BaseException | None = None
        threading.Thread(target=self._read, name="ckpt-put-stream-answers", daemon=True).start()
        call.add_done_callback(self._call_ended)  # at once if it has ended

    @classmethod
    def start(cls, method: Callable[[Any], Any], requests: Iterator[Any]) -> Responses:
        """``method(requests)`` (the stub's PutStream), its answers to read; started off the main thread."""
        return interrupts.run(lambda: cls(method(requests)), undo=Responses.cancel)

    def _call_ended(self, call: Any) -> None:
        self._end = _end_of(call)
        self._queue.put(_CALL_ENDED)

    def _read(self) -> None:
        end: BaseException = StopIteration()
        try:
            for response in self._call:
                self._queue.put(response)
        except BaseException as exc:  # whatever it is, the consumer must not wait for ever
            end = interrupts.ended(exc)
        self._queue.put(_ReadEnded(end))

    def cancel(self) -> None:
        """Cancel the call (a no-op once it has ended); a wait for its answers ends as at the call's end."""
        interrupts.start(self._call.cancel)
        self._queue.put(_CALL_ENDED)

    def __iter__(self) -> Responses:
        return self

    def __next__(self) -> service_pb2.PutStreamResponse:
        if self._last is not None:
            raise self._last
        while True:
            try:
                item = self._queue.get(timeout=ENDED_STREAM_GRACE_SECONDS if self._ended else None)
            except queue.Empty:
                # The end its callback saw; cancelled, before the callback came, the call's end read now.
                end = self._end
                self._last = end if end is not None else interrupts.run(lambda: _end_of(self._call))
                raise self._last from None
            if item is _CALL_ENDED:
                self._ended = True
            elif isinstance(item, _ReadEnded):
                self._last = item.error
                raise self._last
            else:
                return item  # type: ignore[no-any-return]


_CALL_ENDED = object()


def _end_of(call: Any) -> BaseException:
    """An ended call as ``next(call)`` would end: StopIteration if it ended OK, else its EndedCall."""
    return StopIteration() if call.code() is grpc.StatusCode.OK else interrupts.EndedCall(call)


class _ReadEnded(NamedTuple):
    error: BaseException


class SyncFeed:
    """The sync put_stream's writes between the caller's ``puts`` and their answers, across its streams.

    Batches are built from ``puts`` one puller at a time (a broken stream's
    request thread may still be inside the caller's iterator when the next
    stream starts), and each stream sends what the ledger gives it. A
    watchdog thread cancels a stream whose answer is overdue
    (StreamLedger.deadline): a caller slow to take results, or a ``puts``
    slow to give writes, never counts against the sidecar.
    """

    def __init__(self, puts: Iterable[Any], run: StreamRun, limits: StreamLimits) -> None:
        # Every write of a sequence is ready at once; an iterator's may come one by one (an
        # agent's steps), so it is read ahead, to see when none is.
        self._source = SequenceSource(puts) if isinstance(puts, Sequence) else ReadAhead(puts, limits)
        self.run = run
        self._ledger = run.ledger
        self._pulling = threading.Lock()  # held while inside the caller's iterator
        self._cond = threading.Condition()  # guards the run and everything below
        self._call: Responses | None = None
        self._waiting_since: float | None = None
        self._closed = False
        self._watchdog: threading.Thread | None = None
        self.timed_out = False

    # -- gRPC's request threads (and the caller's, waiting for a write to send)

    def _requests(self, stream: int) -> Iterator[service_pb2.PutStreamRequest]:
        while (batch := self._next(stream)) is not None:
            yield batch

    def _next(self, stream: int) -> service_pb2.PutStreamRequest | None:
        """The next batch ``stream`` sends, built from ``puts`` if need be; None once there is none."""
        while True:
            with self._cond:
                step = self._ledger.next_to_send(stream)
                if step is Hold.ROOM:
                    self._cond.wait()
                    continue
                if step is not Hold.INPUT:
                    return None if step is Hold.END else step
                seen = self._ledger.built_count
            self._pull(seen)

    def _pull(self, seen: int) -> None:
        """Build batches from ``puts``: until one is closed, or ``puts`` ends (unless built since ``seen``)."""
        with self._pulling:
            with self._cond:
                if self._ledger.built_count != seen or self._ledger.end is not None:
                    return  # another stream's thread built one meanwhile
            builder, source = self.run.builder, self._source
            while not (batches := builder.add(source.take(), more_ready=source.ready())) and builder.end is None:
                pass
            with self._cond:
                self._ledger.built(batches, builder.end, time.monotonic())
                self._cond.notify_all()

    # -- the caller's thread

    def open(self, method: Callable[[Any], Any]) -> Responses:
        """Start a stream (on ``method``, the stub's PutStream) that sends every unanswered batch, then the rest."""
        with self._cond:
            stream = self._ledger.open_stream(time.monotonic())
        call = Responses.start(method, self._requests(stream))
        with self._cond:
            self._call = call
            if self._watchdog is None:
                self._watchdog = threading.Thread(target=self._watch, name="ckpt-put-stream-watchdog", daemon=True)
                self._watchdog.start()
        return call

    def answers(self, responses: Responses) -> Iterator[list[service_pb2.PutResult]]:
        """A stream's answers as the results to give, until it ends, or until nothing is owed."""
        while True:
            with self._cond:
                if self._ledger.finished:
                    return  # the stream's own end is not waited for
                self._waiting_since = time.monotonic()
                self._cond.notify_all()
            try:
                response = next(responses, None)
            except grpc.RpcError:
                with self._cond:
                    self._ledger.broken()
                raise
            finally:
                with self._cond:
                    self._waiting_since = None
            with self._cond:
                results = self.run.answer(response, time.monotonic())
                self._cond.notify_all()  # room to send more, perhaps
            if results:
                yield results
            if response is None:
                return

    def after_stream(self, error: grpc.RpcError | None, *, closed: bool) -> float | Move:
        """The stream is over: its request thread sends nothing more; what next (StreamRun.after_stream)."""
        with self._cond:
            self._ledger.close_stream()
            self._cond.notify_all()
            return self.run.after_stream(error, closed=closed, timed_out=self.timed_out)

    def after_wait(self, error: grpc.RpcError, *, closed: bool) -> float | Literal[Move.DONE]:
        with self._cond:
            return self.run.after_wait(error, closed=closed)

    def check_closed(self, closed: bool) -> None:
        with self._cond:
            self.run.check_closed(closed)

    def wait_for_write(self) -> None:
        """Block until a write is built to be sent, or ``puts`` ends."""
        while True:
            with self._cond:
                if not self._ledger.idle or self._ledger.end is not None:
                    return
                seen = self._ledger.built_count
            self._pull(seen)

    def stop_reading(self) -> None:
        """Read nothing more from ``puts``: a wait for its next write ends as at its end."""
        if isinstance(self._source, ReadAhead):
            self._source.close()

    def close(self) -> None:
        """The put_stream is over: the stream is cancelled, and reading and waiting end."""
        self.stop_reading()
        with self._cond:
            self._closed = True
            self._ledger.close_stream()
            call = self._call
            self._cond.notify_all()
        if call is not None:
            call.cancel()  # a no-op once it has ended

    def _watch(self) -> None:
        with self._cond:
            while not self._closed:
                since = self._waiting_since
                deadline = None if since is None else self._ledger.deadline(since, self.run.timeout_seconds)
                if deadline is None:
                    self._cond.wait()
                    continue
                left = deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self.timed_out = True
                call = self._call
                break
            else:
                return
        assert call is not None  # set by open(), which starts this thread
        call.cancel()
