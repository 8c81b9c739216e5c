"""The async put_stream's I/O around its StreamRun: ``puts`` read ahead, grpc.aio's request task, bounded waits.

grpc.aio reads each stream's requests from an async generator in a task of its
own; an async iterable's writes are read ahead by another task
(AsyncReadAhead), an iterator's on a thread (ThreadReadAhead); the caller's
task waits for the answers (AnswerWait). What is sent, resent, answered and
given is the ledger's to say (ledger.StreamLedger); everything but the reading
thread runs on one event loop, so no lock guards it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Sequence
from typing import Any

import grpc
import grpc.aio

from ckpt.v1 import service_pb2

from .ledger import End, Hold, SequenceSource, StreamLimits, copied
from .policy import ENDED_STREAM_GRACE_SECONDS
from .stream import Move, StreamRun
from .sync_stream import ReadAhead

NOT_READY = object()  # what take_now gives while the next write is not here yet


class AsyncReadAhead:
    """``puts`` (an async iterable), read by a task of its own a few writes ahead
    (StreamLimits.may_read_ahead), consumed lazily as the stream goes.

    So that a message goes as soon as no further write is ready to join it
    (``ready``): an agent's async generator that awaits each step gives one
    write a message, one that gives writes at once fills whole messages. An
    exception of ``puts`` is the End of the writes, after the writes it gave.
    Each write is copied as it is read (a generator may change one message and
    give it again); once the put_stream has ended the task is cancelled.
    """

    def __init__(self, puts: AsyncIterable[Any], limits: StreamLimits) -> None:
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._limits = limits
        self._count = self._bytes = 0  # held in the queue
        self._room = asyncio.Event()
        self._task = asyncio.ensure_future(self._read(puts))

    async def _read(self, puts: AsyncIterable[Any]) -> None:
        end = End()
        try:
            async for given in puts:
                await self._hold(given)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # close(): nothing more is read
            end = End(exc)  # raised by ``puts`` itself
        except BaseException as exc:  # whatever it is, the consumer must not wait for ever
            end = End(exc)
        self._queue.put_nowait(end)

    async def _hold(self, given: Any) -> None:
        size = given.ByteSize() if isinstance(given, service_pb2.PutRequest) else 0
        while not self._limits.may_read_ahead(self._count, self._bytes, size):
            self._room.clear()
            await self._room.wait()
        self._queue.put_nowait((copied(given), size))  # copied before ``puts`` goes on
        self._count += 1
        self._bytes += size

    def ready(self) -> bool:
        """Whether the next write (or the end of ``puts``) is here already."""
        return not self._queue.empty()

    async def take(self) -> Any:
        """The next write, waiting for it; or the End of the writes."""
        return self._taken(await self._queue.get())

    def take_now(self) -> Any:
        """The next write, or the End of the writes, if it is here already; else NOT_READY."""
        return NOT_READY if self._queue.empty() else self._taken(self._queue.get_nowait())

    def _taken(self, item: Any) -> Any:
        if isinstance(item, End):
            self._queue.put_nowait(item)  # every later take sees the end too
            return item
        put, size = item
        self._count -= 1
        self._bytes -= size
        self._room.set()
        return put

    def close(self) -> None:
        """Stop reading, and end the writes: a take waiting for the next one is let go."""
        self._task.cancel()
        self._queue.put_nowait(End())


class ThreadReadAhead:
    """``puts`` (a sync iterable, not a sequence), read on a thread of its own as the sync client reads it
    (sync_stream.ReadAhead), each write handed to the loop as it comes.

    Read on the loop, a ``puts`` whose steps block (an agent's step, a file
    read) would hold the loop while it gives writes: nothing sent meanwhile,
    the batching, grpc.aio and the waits for answers all stalled, and every
    write sent only once ``puts`` ran out (its waits past ``timeout_seconds``
    as DeadlineExceededError). Here each write is sent as soon as no further
    one is ready, as an async iterable's is. An exception of ``puts`` is the
    End of the writes, after the writes it gave. Once the put_stream has ended
    the reader stops at its next write, which is not sent: a step under way
    on the thread (a generator cannot be closed from another thread while it
    runs) ends on its own, and keeps no wait of the caller's.
    """

    def __init__(self, puts: Iterable[Any], limits: StreamLimits) -> None:
        self._loop = asyncio.get_running_loop()
        self._arrived = asyncio.Event()
        self._waiting = False  # a take waits for the reader's next write: it is to be woken
        self._reader = ReadAhead(puts, limits, queued=self._queued)
        self.ready = self._reader.ready

    def _queued(self) -> None:
        """On the reader's thread: a write (or the End) was queued; wake a take waiting for it."""
        if self._waiting:  # set before the take looks at the queue, read after the write is queued
            self._waiting = False
            with contextlib.suppress(RuntimeError):  # the loop has closed: no take is waiting
                self._loop.call_soon_threadsafe(self._arrived.set)

    async def take(self) -> Any:
        """The next write, waiting for it; or the End of the writes."""
        while not self._reader.ready():
            self._arrived.clear()
            self._waiting = True
            if not self._reader.ready():  # queued before the flag was set: not to be waited for
                await self._arrived.wait()
        self._waiting = False
        return self._reader.take()  # this task is the one consumer: what is here is its to take

    def take_now(self) -> Any:
        """The next write, or the End of the writes, if it is here already; else NOT_READY."""
        return self._reader.take() if self._reader.ready() else NOT_READY

    def close(self) -> None:
        """Stop reading, and end the writes: a take waiting for the next one is let go."""
        self._reader.close()
        self._arrived.set()


class _Listed:
    """A sequence's writes, as the async feed takes them (all there at once)."""

    def __init__(self, puts: Sequence[Any]) -> None:
        self._source = SequenceSource(puts)
        self.take_now = self._source.take

    async def take(self) -> Any:
        return self._source.take()

    def ready(self) -> bool:
        return True

    def close(self) -> None:
        pass


class AnswerWait:
    """The waits for a stream's answers: each bounded by StreamLedger.deadline, and once the call has
    ended by ENDED_STREAM_GRACE_SECONDS, so that a wait ends with the call as sync_stream.Responses' do.

    A ``read()`` under way returns only when gRPC completes the read's
    operations (the stream's receive_initial_metadata, which grpc.aio's read
    waits for first, then a receive_message), or is cancelled; the call's
    end (its status) wakes done callbacks and status and metadata waiters,
    not a read. So the read grpcio (1.85) can leave pending for ever on a
    call it has ended would wait out ``timeout_seconds`` and end the
    put_stream with DeadlineExceededError, its unanswered writes named but
    not resent, where the stream's end should reopen it. Here the call's
    done callback shortens the wait under way to the grace; if that runs out
    with the call ended, the read ends as a ``read()`` begun after the end
    does (grpc.aio answers that from the status at once): EOF if the call
    ended OK, else the call's error. A wait past its deadline raises
    TimeoutError (grpc.aio then cancels the call: it cancels a call whose
    read is cancelled).
    """

    def __init__(self, call: Any, run: StreamRun) -> None:
        self._call = call
        self._run = run
        self._loop = asyncio.get_running_loop()
        self._bound: asyncio.Timeout | None = None  # the wait under way
        self._waiting_since = 0.0
        self._ended_at: float | None = None
        call.add_done_callback(self._call_ended)  # at once if it has ended

    def _call_ended(self, _call: Any) -> None:
        bound = self._bound
        if bound is not None and bound.expired():
            return  # ended by the wait's expiry
        self._ended_at = self._loop.time()
        self.rearm()

    def rearm(self) -> None:
        """Bound the wait under way anew: the ledger's deadline may have changed (a write sent
        after all were answered), or the call ended."""
        bound = self._bound
        if bound is None or bound.expired():
            return
        when = self._run.ledger.deadline(self._waiting_since, self._run.timeout_seconds)
        if self._ended_at is not None:
            grace = max(self._ended_at, self._waiting_since) + ENDED_STREAM_GRACE_SECONDS
            when = grace if when is None else min(when, grace)
        bound.reschedule(when)

    async def read(self) -> Any:
        """The call's next answer, or EOF, or the call's error as ``read()`` raises it; TimeoutError once
        the deadline passes without an answer (the call not ended before)."""
        try:
            async with asyncio.timeout(None) as bound:
                self._bound = bound
                self._waiting_since = self._loop.time()
                try:
                    self.rearm()
                    return await self._call.read()
                finally:
                    self._bound = None
        except TimeoutError:
            if self._ended_at is None:
                raise
        return await self._call.read()  # ended, and its read never completed: the read after the end

    def cancel(self) -> None:
        self._call.cancel()  # a no-op once it has ended


class AsyncFeed:
    """The async put_stream's writes between the caller's ``puts`` and their answers, across its streams.

    Batches are built from ``puts`` one puller at a time (a broken stream's
    request task may still be waiting inside ``puts`` when the next stream
    starts), and each stream sends what the ledger gives it.
    """

    def __init__(self, puts: Any, run: StreamRun, limits: StreamLimits) -> None:
        self._source: _Listed | AsyncReadAhead | ThreadReadAhead
        if isinstance(puts, Sequence):
            self._source = _Listed(puts)
        elif isinstance(puts, AsyncIterable):
            self._source = AsyncReadAhead(puts, limits)
        else:
            self._source = ThreadReadAhead(puts, limits)
        self.run = run
        self._ledger = run.ledger
        self._loop = asyncio.get_running_loop()
        self._pulling = asyncio.Lock()
        self._changed = asyncio.Event()  # an answer came, or the stream ended: room to send, perhaps
        self._wait: AnswerWait | None = None

    # -- grpc.aio's request tasks (and the caller's, waiting for a write to send)

    async def _requests(self, stream: int) -> AsyncIterator[service_pb2.PutStreamRequest]:
        while (batch := await self._next(stream)) is not None:
            yield batch

    async def _next(self, stream: int) -> service_pb2.PutStreamRequest | None:
        while True:
            step = self._ledger.next_to_send(stream)
            if step is Hold.ROOM:
                self._changed.clear()
                await self._changed.wait()
                continue
            if step is not Hold.INPUT:
                return None if step is Hold.END else step
            await self._pull(self._ledger.built_count)

    async def _pull(self, seen: int) -> None:
        async with self._pulling:
            if self._ledger.built_count != seen or self._ledger.end is not None:
                return  # another stream's task built one meanwhile
            builder, source = self.run.builder, self._source
            while True:
                # Awaited only when no write is here yet: a coroutine a write cost a list's stream ~2 us each.
                item = source.take_now()
                if item is NOT_READY:
                    item = await source.take()
                if (batches := builder.add(item, more_ready=source.ready())) or builder.end is not None:
                    break
            self._ledger.built(batches, builder.end, self._loop.time())
        if self._wait is not None:
            self._wait.rearm()

    # -- the caller's task

    async def answers(self, method: Callable[[Any], Any]) -> AsyncIterator[list[service_pb2.PutResult]]:
        """Open a stream (on ``method``, the stub's PutStream) that sends every unanswered batch, then the
        rest; its answers as the results to give, until it ends, or until nothing is owed."""
        stream = self._ledger.open_stream(self._loop.time())
        self._wait = wait = AnswerWait(method(self._requests(stream)), self.run)
        try:
            while not self._ledger.finished:  # the stream's own end is not waited for
                try:
                    response = await wait.read()
                except grpc.RpcError:
                    self._ledger.broken()
                    raise
                except TimeoutError:
                    self.run.give_up_overdue()
                ended = response is grpc.aio.EOF
                results = self.run.answer(None if ended else response, self._loop.time())
                self._changed.set()
                if results:
                    yield results
                if ended:
                    return
        finally:
            self._ledger.close_stream()
            self._changed.set()
            wait.cancel()

    def after_stream(self, error: grpc.RpcError | None, *, closed: bool) -> float | Move:
        self._ledger.close_stream()
        self._changed.set()
        return self.run.after_stream(error, closed=closed)

    async def wait_for_write(self) -> None:
        """Wait until a write is built to be sent, or ``puts`` ends."""
        while self._ledger.idle and self._ledger.end is None:
            await self._pull(self._ledger.built_count)

    def stop_reading(self) -> None:
        """Read nothing more from ``puts``: a wait for its next write ends as at its end."""
        self._source.close()

    def close(self) -> None:
        """The put_stream is over: the stream is cancelled, and reading and waiting end."""
        self.stop_reading()
        self._ledger.close_stream()
        self._changed.set()
        if self._wait is not None:
            self._wait.cancel()
