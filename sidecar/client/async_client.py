"""AsyncCheckpointClient: the asyncio client (its I/O; what it shares with the sync one is base.ClientBase)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, BinaryIO

import grpc

from ckpt.v1 import checkpoint_pb2, service_pb2

from ..wholewrites import write_whole
from . import blobs, toolcache
from .async_stream import AsyncFeed
from .base import ClientBase, Unary
from .channel import warn_not_closed
from .errors import unknown_write
from .events import EventMethods
from .ledger import StreamLimits
from .policy import BlobReadAttempts
from .stream import Move


class AsyncCheckpointClient(
    ClientBase[
        Awaitable[service_pb2.PutResponse],
        Awaitable[service_pb2.GetResponse],
        Awaitable[service_pb2.SessionInfo],
        Awaitable[int],
        AsyncIterator[service_pb2.VersionInfo],
        AsyncIterator[service_pb2.SessionInfo],
        Iterable[service_pb2.PutRequest] | AsyncIterable[service_pb2.PutRequest],
        AsyncIterator[service_pb2.PutResult],
        Awaitable[list[str]],
    ],
    EventMethods[Awaitable[service_pb2.AppendEventsResponse], AsyncIterator[service_pb2.Event]],
):
    """asyncio client with the same methods, arguments, errors and retries as CheckpointClient (awaitable).

    A write the caller cancels (``asyncio.timeout``, ``wait_for``, a TaskGroup)
    raises CancelledError, not an error carrying its request id, and the sidecar
    commits it anyway once queued: pass your own ``request_id`` to writes that
    may be cancelled, so that resending one cannot write twice.

    A client belongs to the event loop it is created in (RuntimeError
    otherwise, naming the mistake): create it in async code, one per loop.
    """

    _AIO = True

    def _bind(self) -> None:
        # grpc.aio binds a channel to the loop it is made on; used from another,
        # every call failed with asyncio's "attached to a different loop".
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "AsyncCheckpointClient must be created in the event loop that uses it (in async code, such as the"
                " coroutine asyncio.run runs); outside async code, use CheckpointClient"
            ) from None
        self._closing: asyncio.Future[None] | None = None

    async def close(self) -> None:
        """Close the channel (idempotent); calls after it raise ValueError.

        Waits at most ``timeout_seconds`` for gRPC to end the channel's calls.
        """
        self._closed = True
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._channel.close())  # kept: the loop holds tasks weakly
        done, _ = await asyncio.wait({self._closing}, timeout=self._timeout)
        self._stop_reading()
        if done:
            self._closing.result()
        else:
            warn_not_closed(self._timeout)

    async def __aenter__(self) -> AsyncCheckpointClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _check_open(self) -> None:
        super()._check_open()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not self._loop:
            raise RuntimeError(
                f"this {type(self).__name__} belongs to the event loop it was created in, not this one"
                " (a client kept from one asyncio.run to the next?): create one in each loop"
            )

    def _cancelled_by_close(self) -> bool:
        """After a CancelledError: whether close() cancelled the call (grpc-aio may cancel a closing
        channel's calls so), not the caller's own task; the call then raises ValueError, as the sync
        client's calls do."""
        task = asyncio.current_task()
        return self._closed and (task is None or not task.cancelling())

    async def cached_call(self, session_id: str, tool: str, args: object, fn: Callable[[], Any]) -> Any:
        """CheckpointClient.cached_call; ``fn`` may also be a coroutine function (its result awaited)."""
        return await toolcache.async_cached_call(self, session_id, tool, args, fn)

    async def _unary(self, call: Unary) -> Any:
        method, request, attempts = call.start(self)
        while True:
            try:
                return call.result(await method(request, timeout=attempts.remaining()))
            except grpc.RpcError as exc:
                delay = self._retry_delay(exc, attempts)
            except asyncio.CancelledError:
                if self._cancelled_by_close():
                    raise self._closed_during(unknown_write(attempts.request_id)) from None
                raise
            await asyncio.sleep(delay)
            self._check_not_closed_during(attempts)

    async def _pages(
        self, method: str, request: Any, field: str, finish: Callable[[Any], None] | None = None
    ) -> AsyncIterator[Any]:
        while True:
            page = await self._unary(Unary(method, lambda: request, retry=True))
            if finish is not None:
                finish(page)
            for item in getattr(page, field):
                yield item
            if not self._next_page(request, page):
                return

    async def put_blob(
        self,
        data: blobs.BlobData,
        *,
        session_id: str,
        media_type: str = "",
        expected_sha256: str = "",
        chunk_size_bytes: int = blobs.DEFAULT_BLOB_CHUNK_BYTES,
    ) -> checkpoint_pb2.ArtifactRef:
        """CheckpointClient.put_blob; a file is read on a thread, a chunk at a time. Cancelled, its stream
        ends without :data:`blobs.END` (grpc.aio cancels the call), so nothing is stored unless all was sent."""
        blobs.check_put_blob(data, session_id, media_type, expected_sha256)
        chunk_size = blobs.check_chunk_size(chunk_size_bytes, self._max_message_bytes)
        self._check_open()

        failure = blobs.ReadFailure()

        async def requests() -> AsyncIterator[service_pb2.PutBlobRequest]:
            yield blobs.first_request(session_id, media_type, expected_sha256)
            if isinstance(data, (bytes, bytearray, memoryview)):
                for request in blobs.byte_requests(data, chunk_size):
                    yield request
            else:
                while True:
                    try:
                        piece = blobs.chunk_of(await asyncio.to_thread(data.read, chunk_size))
                    except Exception as exc:  # as ReadFailure.guard: the stream ends cut short; raised below
                        failure.error = exc
                        return
                    if not piece:
                        break
                    yield service_pb2.PutBlobRequest(chunk=piece)
            yield blobs.END

        try:
            response = await self._stub.PutBlob(requests())
        except grpc.RpcError as exc:
            if failure.error is None:
                self._blob_failed(exc)
        except asyncio.CancelledError:
            if self._cancelled_by_close():  # a cut stream stores nothing: no outcome is unknown
                raise self._closed_during(None) from None
            raise
        failure.raise_it()  # the stream was cut short: the sidecar refused it, nothing stored
        return blobs.artifact_ref(response, media_type)

    def get_blob(
        self, ref: checkpoint_pb2.ArtifactRef | str, *, offset: int = 0, length: int = 0
    ) -> AsyncGenerator[bytes, None]:
        """CheckpointClient.get_blob: an async iterator of the chunks."""
        request = blobs.get_blob_request(ref, offset, length)
        self._check_open()
        return self._blob_chunks(request)

    async def _blob_chunks(self, request: service_pb2.GetBlobRequest) -> AsyncGenerator[bytes, None]:
        self._check_open()  # where it is iterated: a client of another event loop is refused by name
        attempts = BlobReadAttempts(self._retries)
        while True:
            attempts.start()
            call = self._stub.GetBlob(request)
            try:
                async for message in call:
                    if message.chunk:
                        attempts.delivered = True
                        yield message.chunk
                return
            except grpc.RpcError as exc:
                delay = self._blob_read_delay(exc, attempts)
            except asyncio.CancelledError:
                if self._cancelled_by_close():
                    raise self._closed_during(None) from None
                raise
            finally:
                # Left early (the caller's break, or its task cancelled): the stream is ended now, not at
                # close(), which it would keep open with its blob file and a grpc.aio task.
                call.cancel()
            await asyncio.sleep(delay)
            self._check_not_closed_while_waiting()

    async def get_blob_to(
        self, ref: checkpoint_pb2.ArtifactRef | str, file: BinaryIO, *, offset: int = 0, length: int = 0
    ) -> int:
        """CheckpointClient.get_blob_to (the file written on a thread)."""
        written = 0
        # Closed on the way out (cancelled, or a write failing), so that its stream ends then.
        async with contextlib.aclosing(self.get_blob(ref, offset=offset, length=length)) as chunks:
            async for chunk in chunks:
                await asyncio.to_thread(write_whole, file, chunk)
                written += len(chunk)
        return written

    async def _put_stream(self, puts: Any, limits: StreamLimits) -> AsyncIterator[service_pb2.PutResult]:
        feed = AsyncFeed(puts, self._stream_run(puts, limits), limits)
        self._streaming(feed, under_way=True)
        try:
            while True:
                self._check_open()
                error: grpc.RpcError | None = None
                try:
                    async for results in feed.answers(self._stub.PutStream):
                        for result in results:
                            yield result
                except grpc.RpcError as exc:
                    error = exc
                except asyncio.CancelledError:
                    if self._cancelled_by_close():
                        feed.run.give_up_closed()
                    raise
                move = feed.after_stream(error, closed=self._closed)
                if move is Move.WAIT_FOR_WRITE:
                    assert error is not None
                    await feed.wait_for_write()
                    move = feed.run.after_wait(error, closed=self._closed)
                if move is Move.DONE:
                    return
                await asyncio.sleep(move)
                feed.run.check_closed(self._closed)
        finally:
            feed.close()
            self._streaming(feed, under_way=False)
