"""CheckpointClient: the blocking client (its I/O; what it shares with the async one is base.ClientBase)."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO

import grpc

from ckpt.v1 import checkpoint_pb2, service_pb2

from ..wholewrites import write_whole
from . import blobs, interrupts, toolcache
from .base import ClientBase, Unary
from .channel import warn_not_closed
from .errors import unknown_write
from .events import EventMethods
from .ledger import StreamLimits
from .policy import BlobReadAttempts
from .stream import Move
from .sync_stream import SyncFeed


class CheckpointClient(
    ClientBase[
        service_pb2.PutResponse,
        service_pb2.GetResponse,
        service_pb2.SessionInfo,
        int,
        Iterator[service_pb2.VersionInfo],
        Iterator[service_pb2.SessionInfo],
        Iterable[service_pb2.PutRequest],
        Iterator[service_pb2.PutResult],
        list[str],
    ],
    EventMethods[service_pb2.AppendEventsResponse, Iterator[service_pb2.Event]],
):
    """Synchronous client. Thread-safe; one per process is enough.

    Clients of one process to the same target share one connection, unless
    ``own_connection=True``: each connection is served by one worker of a
    ``ckpt serve --workers N``, so a process putting many threads' writes
    through one sidecar spreads them over its workers with a few clients of
    their own connections.

    ``timeout_seconds`` bounds each call, its retries included. Put, merge,
    get and the listings retry UNAVAILABLE up to ``retries`` times (writes
    resend the same request id, so a write lands once); fork and delete are
    not retried (a resent fork whose reply was lost would fail with
    ALREADY_EXISTS). ``get_blob`` retries until its first chunk (see there),
    put_blob not at all. ``put_stream`` reopens a broken stream and resends its
    unanswered writes (see there); ``timeout_seconds`` bounds each wait for
    one of its answers, not the stream.

    ``tls``: for a host:port target served with ``ckpt serve --tls-cert-file``,
    a :class:`ClientTLS` (the CA to trust; this client's certificate when the
    sidecar requires one), or True to trust the system's CAs. Unix sockets are
    always plaintext.
    """

    _AIO = False

    def _bind(self) -> None:
        pass

    def close(self) -> None:
        """Close the channel (idempotent); calls after it raise ValueError.

        Waits at most ``timeout_seconds`` for gRPC to end the channel's calls (see _close_within).
        """
        self._closed = True
        _close_within(self._channel.close, self._timeout)
        self._stop_reading()

    def __enter__(self) -> CheckpointClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def cached_call(self, session_id: str, tool: str, args: object, fn: Callable[[], Any]) -> Any:
        """The result of ``fn()``, the call of ``tool`` with ``args`` (JSON values), recorded in the
        session's ``Checkpoint.tool_cache`` so that it is paid for once.

        A hit (the session holds a result of the same tool with the same canonical arguments) returns it
        without calling ``fn``; an entry holding no result it can return (``is_error``, an ``artifact_id``,
        a ``result`` that is not JSON) is a miss, and the record replaces it. A miss calls ``fn`` and
        records its result (a JSON value) with a durable MERGE before returning it, so an agent killed
        after that does not call the tool again. Either way the value returned is the recorded JSON read
        back (a tuple comes back a list). An exception from ``fn`` is raised and nothing is recorded. Two
        callers missing the same key at once both call ``fn``; the later record wins, whole. The key and
        canonical JSON: ``toolcache.py``; a typed session's cache is read with a masked Get of
        ``tool_cache``; an untyped one whole, and it stays untyped.
        """
        return toolcache.cached_call(self, session_id, tool, args, fn)

    def _unary(self, call: Unary) -> Any:
        method, request, attempts = call.start(self)
        while True:
            try:
                return call.result(interrupts.call_unary(method, request, attempts.remaining()))
            except grpc.RpcError as exc:
                delay = self._retry_delay(exc, attempts)
            except ValueError:
                if self._closed:  # gRPC's "Cannot invoke RPC on closed channel!": close() came first
                    raise self._closed_during(unknown_write(attempts.request_id)) from None
                raise
            time.sleep(delay)
            self._check_not_closed_during(attempts)

    def _pages(
        self, method: str, request: Any, field: str, finish: Callable[[Any], None] | None = None
    ) -> Iterator[Any]:
        while True:
            page = self._unary(Unary(method, lambda: request, retry=True))
            if finish is not None:
                finish(page)
            yield from getattr(page, field)
            if not self._next_page(request, page):
                return

    def put_blob(
        self,
        data: blobs.BlobData,
        *,
        session_id: str,
        media_type: str = "",
        expected_sha256: str = "",
        chunk_size_bytes: int = blobs.DEFAULT_BLOB_CHUNK_BYTES,
    ) -> checkpoint_pb2.ArtifactRef:
        """Store a blob (an artifact: a screenshot, a page, a log) referenced by ``session_id``; its
        ArtifactRef, whose uri a checkpoint names it by (``ckpt-blob:sha256:<hex>``).

        ``data``: the bytes, or a binary file object, read ``chunk_size_bytes`` at a time as they are
        sent (never whole). The same bytes are stored once, whichever sessions store them; the blob
        stays while a session references it (see docs/clients.md#artifacts). ``expected_sha256``: the
        SHA-256 the bytes must have (InvalidArgumentError otherwise, nothing stored). Over the sidecar's
        --max-blob-bytes: ResourceExhaustedError, nothing stored. Not retried, and without a deadline.
        Interrupted (a KeyboardInterrupt), the stream ends at its next chunk, cut short, so nothing is
        stored (unless the file was read to its end), and is cancelled (see interrupts).
        """
        blobs.check_put_blob(data, session_id, media_type, expected_sha256)
        chunk_size = blobs.check_chunk_size(chunk_size_bytes, self._max_message_bytes)
        self._check_open()
        first = blobs.first_request(session_id, media_type, expected_sha256)
        if isinstance(data, (bytes, bytearray, memoryview)):
            rest = blobs.byte_requests(data, chunk_size)
        else:
            rest = blobs.file_requests(data, chunk_size)
        failure, cut = blobs.ReadFailure(), blobs.Cut()
        requests = cut.guard(failure.guard(itertools.chain((first,), rest, (blobs.END,))))
        try:
            response = interrupts.call_stream_unary(self._stub.PutBlob, requests, cut.cut)
        except grpc.RpcError as exc:
            if failure.error is None:
                self._blob_failed(exc)
        failure.raise_it()  # the stream was cut short: the sidecar refused it, nothing stored
        return blobs.artifact_ref(response, media_type)

    def get_blob(self, ref: checkpoint_pb2.ArtifactRef | str, *, offset: int = 0, length: int = 0) -> Iterator[bytes]:
        """A blob's bytes, or ``length`` of them (0: to the end) from ``offset``, as chunks.

        ``ref``: an ArtifactRef, its uri, "sha256:<hex>" or the hex digits. NotFoundError for a blob
        never stored or removed (no session references it any more); DataLossError for a damaged one: a
        whole blob whose bytes do not hash to its SHA-256 (the chunks before are not its bytes), or a file
        shorter than the blob or gone (a range is not hashed).

        UNAVAILABLE (a sidecar restarting) is retried as a unary read is, up to ``retries`` times, until the
        first chunk is yielded; a failure after that is raised (call again for the blob). No deadline."""
        request = blobs.get_blob_request(ref, offset, length)
        self._check_open()
        return self._blob_chunks(request)

    def _blob_chunks(self, request: service_pb2.GetBlobRequest) -> Iterator[bytes]:
        attempts = BlobReadAttempts(self._retries)
        while True:
            attempts.start()
            try:
                # Cancelled once left early: the caller stopped reading, or a Ctrl-C came.
                with interrupts.ResponseStream(self._stub.GetBlob, request) as messages:
                    for message in messages:
                        if message.chunk:
                            attempts.delivered = True
                            yield message.chunk
                return
            except grpc.RpcError as exc:
                delay = self._blob_read_delay(exc, attempts)
            except ValueError:
                if self._closed:  # gRPC's "Cannot invoke RPC on closed channel!": close() came first
                    raise self._closed_during(None) from None
                raise
            time.sleep(delay)
            self._check_not_closed_while_waiting()

    def get_blob_to(
        self, ref: checkpoint_pb2.ArtifactRef | str, file: BinaryIO, *, offset: int = 0, length: int = 0
    ) -> int:
        """Write a blob (or a range, as :meth:`get_blob`) into a binary ``file``, chunk by chunk; bytes written.

        Every byte, or OSError: a write taking fewer bytes than given (a full disk) is given the rest
        again, which raises the error; one taking none (0) raises OSError."""
        written = 0
        for chunk in self.get_blob(ref, offset=offset, length=length):
            write_whole(file, chunk)
            written += len(chunk)
        return written

    def _put_stream(self, puts: Iterable[service_pb2.PutRequest], limits: StreamLimits) -> Iterator[Any]:
        feed = SyncFeed(puts, self._stream_run(puts, limits), limits)
        self._streaming(feed, under_way=True)
        try:
            if self._closed:  # close() came between the check in put_stream and here
                feed.stop_reading()
            while True:
                self._check_open()
                error: grpc.RpcError | None = None
                try:
                    for results in feed.answers(feed.open(self._stub.PutStream)):
                        yield from results
                except grpc.RpcError as exc:
                    error = exc
                move = feed.after_stream(error, closed=self._closed)
                if move is Move.WAIT_FOR_WRITE:
                    assert error is not None
                    feed.wait_for_write()
                    move = feed.after_wait(error, closed=self._closed)
                if move is Move.DONE:
                    return
                time.sleep(move)
                feed.check_closed(self._closed)
        finally:
            feed.close()
            self._streaming(feed, under_way=False)


def _close_within(close: Callable[[], object], seconds: float) -> None:
    """Run a sync channel's ``close``, waiting for it ``seconds`` at most; past that it ends in the background.

    gRPC's close cancels the channel's calls and then waits until each has ended. A
    PutStream whose sidecar froze mid-stream (SIGSTOP, its socket full) stayed under
    way after the cancel, and close() waited until the sidecar ran again: for ever,
    had it never. The caller gets control back; the channel is freed when gRPC is done.
    """
    closing = threading.Thread(target=close, name="ckpt-client-close", daemon=True)
    closing.start()
    closing.join(seconds)
    if closing.is_alive():
        warn_not_closed(seconds)
