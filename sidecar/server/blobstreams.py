"""PutBlob and GetBlob, served by the sidecar's gRPC process itself.

A blob may be gigabytes: its bytes must not cross the link to the store
process, nor be held whole anywhere. So this process streams a PutBlob's
chunks into a temporary file under the data directory's ``blobs/``, hashing
and counting them as they arrive, flushes it, and only then asks the store
process (a link call, RECORD_BLOB_METHOD) to move it into place and commit
its record: the call is answered once that commit is durable. A GetBlob checks
the blob's record in LMDB (read-only here, as the reply cache reads it) and
streams the file in chunks; a whole blob's chunks are hashed as they are
read, and its last is sent only if they hash to the XXH3-128 its record keeps
(its SHA-256 if the record predates that field), else DATA_LOSS.
File writes and reads run on a thread, off the event loop; a PutBlob chunk is
written while the next arrives, and a GetBlob chunk is read (and hashed)
while the one before is sent, so the memory a stream holds is one or two
chunks.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, BinaryIO, NoReturn, TypeVar, cast

import grpc
import grpc.aio
import xxhash

from ckpt.store.v1 import records_pb2
from ckpt.v1 import service_pb2

from ...codec import WireFormatError, field_spans
from ..errors import DataLoss, InvalidArgument, NotFound, StoreError, StoreFull
from ..store import Store
from ..store.blobfiles import MAX_MEDIA_TYPE_BYTES, TempBlob, check_media_type, check_sha256
from ..store.keys import session_key
from .convert import request_parser
from .failures import abort_with, failure_of
from .methods import RECORD_BLOB_METHOD
from .storelink import StoreLink

T = TypeVar("T")

#: Bytes per GetBlob message (a range's last is shorter).
BLOB_CHUNK_BYTES = 1024 * 1024
#: A GetBlobResponse's bytes besides its chunk, at most: tags and lengths, size_bytes, media_type.
_FIRST_RESPONSE_BYTES = MAX_MEDIA_TYPE_BYTES + 32

_parse_put = cast(Callable[[bytes], service_pb2.PutBlobRequest], request_parser(service_pb2.PutBlobRequest))
#: PutBlobRequest.chunk's field number, and the tag it has on the wire (length-delimited).
_CHUNK_FIELD = service_pb2.PutBlobRequest.CHUNK_FIELD_NUMBER
_WIRE_LEN = 2
_parse_get = cast(Callable[[bytes], service_pb2.GetBlobRequest], request_parser(service_pb2.GetBlobRequest))


class BlobStreams:
    """The PutBlob and GetBlob handlers (raw bytes in and out) on ``store``, a read-only Store whose
    ``blob_files`` the store process moves blobs into; ``link`` records them."""

    def __init__(
        self, store: Store, link: StoreLink, *, max_blob_bytes: int, max_message_bytes: int = 64 << 20
    ) -> None:
        self._store = store
        self._files = store.blob_files
        self._link = link
        self._max_blob_bytes = max_blob_bytes
        # GetBlob's chunks: 1 MiB, or less under a smaller --max-message-bytes, with room for the first
        # message's size and media type: the sidecar never sends a message over its own limit.
        self._chunk_bytes = min(BLOB_CHUNK_BYTES, max_message_bytes - _FIRST_RESPONSE_BYTES)

    def handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        return {
            "PutBlob": grpc.stream_unary_rpc_method_handler(self.put_blob),
            "GetBlob": grpc.unary_stream_rpc_method_handler(self.get_blob),
        }

    def _count(self, context: grpc.aio.ServicerContext) -> None:
        # Blob streams are served here, not forwarded: they count among the link's calls, so that a
        # stopping sidecar gives them its grace (frontend.stop) instead of cancelling them with the idle
        # streams; until the call is over, not the handler: a GetBlob's last messages are still being sent.
        calls = self._link.calls
        calls.began()
        context.add_done_callback(lambda _: calls.ended())

    def _report(self, rpc: str, context: grpc.aio.ServicerContext, start: float, error: BaseException | None) -> None:
        """Tell the store process's metrics of a blob call that ended (its status and how long it took),
        as a Get answered here is: its requests, errors and latency are counted there like any RPC's."""
        self._link.served_blob(rpc, _status_name(context, error), time.perf_counter() - start)

    async def put_blob(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:
        self._count(context)
        start = time.perf_counter()
        try:
            reply = await self._put_blob(requests, context)
        except BaseException as exc:
            self._report("PutBlob", context, start, exc)
            raise
        self._report("PutBlob", context, start, None)
        return reply

    async def _put_blob(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:
        if not self._link.calls.admits():
            # Its handler started once the stop began: its blob could not be recorded (StoreLink.call),
            # and reading it whole would hold the stop for up to the grace period. Refused before its
            # first message is read.
            await context.abort(grpc.StatusCode.UNAVAILABLE, _STOPPING)
        temp: TempBlob | None = None
        writing: asyncio.Future[Any] | None = None
        try:
            expected = ""
            commit = records_pb2.BlobCommit()
            ended = False
            async for raw in requests:
                message, chunk = await _checked(context, _parse_put_apart, raw)
                if ended:
                    await _abort(context, InvalidArgument("a PutBlob message came after the one that set end"))
                ended = message.end
                if temp is None:
                    expected = await _checked(context, _first_message, message, commit)
                    temp = await self._checked_file(context, self._files.new_temp, self._max_blob_bytes, _LIMIT)
                elif message.session_id or message.media_type or message.expected_sha256:
                    await _abort(context, InvalidArgument(_FIRST_ONLY))
                if chunk.nbytes:
                    if writing is not None:
                        await self._checked_write(context, writing)
                    # On a thread: a slow disk must not hold the event loop. One chunk is hashed and
                    # written while the next arrives (two received messages held at most): the hash and
                    # the write, about as long as receiving a chunk, no longer wait for each other.
                    writing = asyncio.get_running_loop().run_in_executor(None, temp.write, chunk)
            if writing is not None:
                await self._checked_write(context, writing)
            if temp is None:
                await _abort(context, InvalidArgument("the PutBlob stream sent no message; the first names session_id"))
            if not ended:
                # grpc.aio ends a cancelled call's requests as if the stream had ended: only the client's
                # own mark tells a whole blob from the first part of one.
                await _abort(
                    context,
                    InvalidArgument(
                        f"the PutBlob stream ended after {temp.size_bytes} bytes without a message setting end"
                        " (cut short): nothing was stored"
                    ),
                )
            writing = asyncio.get_running_loop().run_in_executor(None, temp.finish, expected)
            sha256: str = await self._checked_write(context, writing)
            commit.sha256, commit.size_bytes, commit.temp_name = sha256, temp.size_bytes, temp.name
            commit.xxh3_128 = temp.xxh3_128
            status, meta, body = await self._link.call(RECORD_BLOB_METHOD, commit.SerializeToString(), batched=False)
            if status:
                await abort_with(context, status, meta)
            return body
        finally:
            if temp is not None:
                if writing is not None and not writing.done():
                    # Cancelled mid-write: the thread still uses the file; close it only after.
                    with contextlib.suppress(BaseException):
                        await asyncio.wait((writing,))
                temp.discard()  # nothing if the store process moved it into place

    async def _checked_write(self, context: grpc.aio.ServicerContext, writing: Awaitable[T]) -> T:
        """A blob file operation's result; a StoreError ends the call with its status (a full disk also
        counted among the store process's full writes)."""
        try:
            return await writing
        except StoreFull as exc:
            self._link.store_full(str(exc))
            await _abort(context, exc)
        except StoreError as exc:
            await _abort(context, exc)

    async def _checked_file(self, context: grpc.aio.ServicerContext, fn: Callable[..., T], *args: Any) -> T:
        async def run() -> T:
            return fn(*args)

        return await self._checked_write(context, run())

    async def get_blob(self, raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        self._count(context)
        start = time.perf_counter()
        try:
            async with contextlib.aclosing(self._get_blob(raw, context)) as messages:
                async for message in messages:
                    yield message
        except BaseException as exc:
            self._report("GetBlob", context, start, exc)
            raise
        self._report("GetBlob", context, start, None)

    async def _get_blob(self, raw: bytes, context: grpc.aio.ServicerContext) -> AsyncGenerator[bytes, None]:
        request = await _checked(context, _parse_get, raw)
        info = await _checked(context, _blob_info, self._store, request.sha256)
        if request.offset > info.size_bytes:
            await _abort(
                context,
                InvalidArgument(
                    f"offset {request.offset} is past the end of blob {info.sha256} ({info.size_bytes} bytes)"
                ),
            )
        end = info.size_bytes if not request.length else min(info.size_bytes, request.offset + request.length)
        # Open before the first message: once open, its file stays readable whatever removes it meanwhile.
        blob = await _checked(context, self._open, info.sha256)
        size = os.fstat(blob.fileno()).st_size
        if size < info.size_bytes:  # a range inside what is left would read fine: damage all the same
            blob.close()
            await _abort(context, _cut_short(info, size))
        # A whole blob's bytes are hashed as they are read (on the thread that reads them) and the last
        # chunk is sent only once they hash to the blob's XXH3-128 (its SHA-256 if its record has none):
        # damaged bytes never end a stream OK. A range is sent as read: checking it would take reading the
        # whole blob (ckpt verify checks them all).
        hasher = _hasher(info) if request.offset == 0 and end == info.size_bytes else None
        loop = asyncio.get_running_loop()
        reading: asyncio.Future[bytes] | None = None

        def read_from(at: int) -> asyncio.Future[bytes]:
            return loop.run_in_executor(None, _read_at, blob, at, min(self._chunk_bytes, end - at), hasher)

        with blob:
            try:
                position = request.offset
                first: service_pb2.GetBlobResponse | None = service_pb2.GetBlobResponse(
                    size_bytes=info.size_bytes, media_type=info.media_type
                )
                if position == end:
                    if hasher is not None:
                        await _checked(context, _check_hash, hasher, info)
                    assert first is not None
                    yield first.SerializeToString()
                    return
                reading = read_from(position)
                while reading is not None:
                    chunk = await reading
                    reading = None
                    if not chunk:
                        await _abort(context, _cut_short(info, position))
                    position += len(chunk)
                    if position < end:
                        # The next chunk is read (and hashed) while this one is sent: two held at most.
                        reading = read_from(position)
                    elif hasher is not None:
                        await _checked(context, _check_hash, hasher, info)
                    if first is not None:
                        first.chunk = chunk
                        yield first.SerializeToString()
                        first = None
                    else:
                        yield service_pb2.GetBlobResponse(chunk=chunk).SerializeToString()
            finally:
                if reading is not None:
                    # The call ended mid-read: the thread still reads the file; close it only after.
                    with contextlib.suppress(BaseException):
                        await asyncio.wait((reading,))
                    if not reading.cancelled():
                        reading.exception()  # retrieved: a read of a file being closed is no error to log

    def _open(self, sha256: str) -> BinaryIO:
        """Blob ``sha256``'s file, open. Its record was read: a file missing is NotFound only if the record
        went too (the blob removed as it was read: a file is removed after its record, blobs.py), else it is
        damage (DataLoss). Opened twice if need be: a blob removed and stored again meanwhile is read."""
        for _ in range(2):
            try:
                return self._files.open(sha256)
            except FileNotFoundError:
                try:
                    self._store.blob(sha256)
                except NotFound:
                    raise NotFound(f"blob {sha256} does not exist (removed as it was read)") from None
        raise DataLoss(
            f"blob {sha256}: its file {self._files.path(sha256)} is missing though its record is kept:"
            " it is damaged (ckpt verify checks every blob file)"
        )


_LIMIT = " (ckpt serve --max-blob-bytes)"
_STOPPING = "the sidecar is stopping; send the blob again"
_FIRST_ONLY = "session_id, media_type and expected_sha256 go in a PutBlob stream's first message only"


def _parse_put_apart(raw: bytes) -> tuple[service_pb2.PutBlobRequest, memoryview]:
    """A PutBlobRequest parsed without its chunk, and the chunk as a view of ``raw``: parsed with the
    rest, a chunk would be a copy, a second chunk's worth held for each message received. As protobuf
    does, the last chunk field wins; InvalidArgument (as ``_parse_put``) for bytes that do not parse."""
    view = memoryview(raw)
    chunk = view[:0]
    rest: list[bytes] = []
    kept_from = 0
    try:
        for field, wire, start, end in field_spans(raw):
            if field == _CHUNK_FIELD and wire == _WIRE_LEN:
                rest.append(raw[kept_from:start])
                kept_from = end
                chunk = view[_after_varint(raw, _after_varint(raw, start)) : end]  # past the tag and length
    except WireFormatError:
        pass  # left to the parser, which names what is wrong
    if not rest:
        return _parse_put(raw), chunk
    rest.append(raw[kept_from:])
    return _parse_put(b"".join(rest)), chunk


def _after_varint(data: bytes, at: int) -> int:
    """The offset after the varint at ``at`` (one field_spans has read whole)."""
    while data[at] & 0x80:
        at += 1
    return at + 1


def _first_message(message: service_pb2.PutBlobRequest, commit: records_pb2.BlobCommit) -> str:
    """Check a PutBlob's first message into ``commit``; the SHA-256 the bytes must have ("": any)."""
    session_key(message.session_id)
    media_type = check_media_type(message.media_type)
    if message.expected_sha256:
        check_sha256(message.expected_sha256, field="expected_sha256")
    commit.session_id, commit.media_type = message.session_id, media_type
    return message.expected_sha256


def _blob_info(store: Store, sha256: str) -> Any:
    return store.blob(check_sha256(sha256))


def _read_at(blob: Any, position: int, size: int, hasher: Any) -> bytes:
    blob.seek(position)
    chunk = cast(bytes, blob.read(size))
    if hasher is not None:
        hasher.update(chunk)  # hashlib and xxhash let go of the GIL for a chunk this size
    return chunk


def _cut_short(info: Any, position: int) -> DataLoss:
    return DataLoss(
        f"blob {info.sha256}: its file ends at byte {position} of the {info.size_bytes} recorded: it is damaged"
        " (ckpt verify checks every blob file)"
    )


def _hasher(info: Any) -> Any:
    """What a whole read of blob ``info`` hashes its bytes with: XXH3-128 (a few times faster than SHA-256)
    if its record keeps that checksum, else SHA-256 (a record written before it was kept)."""
    return xxhash.xxh3_128() if info.xxh3_128 else hashlib.sha256()


def _check_hash(hasher: Any, info: Any) -> None:
    """DataLoss unless the whole blob's bytes, hashed into ``hasher`` (:func:`_hasher`), hash to its
    recorded XXH3-128, or to its SHA-256 if it has none."""
    if info.xxh3_128:
        digest = hasher.digest()
        if digest != info.xxh3_128:
            raise DataLoss(
                f"blob {info.sha256}: its file's {info.size_bytes} bytes have XXH3-128 {digest.hex()}, not the"
                f" {info.xxh3_128.hex()} recorded when it was stored: it is damaged (the bytes sent are not the"
                " blob's; ckpt verify checks every blob file)"
            )
        return
    digest = hasher.hexdigest()
    if digest != info.sha256:
        raise DataLoss(
            f"blob {info.sha256}: its file's {info.size_bytes} bytes hash to {digest}: it is damaged"
            " (the bytes sent are not the blob's; ckpt verify checks every blob file)"
        )


async def _checked(context: grpc.aio.ServicerContext, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``; a StoreError it raises ends the call with its status."""
    try:
        return fn(*args)
    except StoreError as exc:
        await _abort(context, exc)


def _status_name(context: grpc.aio.ServicerContext, error: BaseException | None) -> str:
    """The status a blob call ended with, by its handler's end (``error``: what ended it, None if it
    returned): OK, the status it aborted with, or, the call ended before (the abort not sent), what the
    client saw: DEADLINE_EXCEEDED or CANCELLED; UNKNOWN after a bug, as grpc answers it."""
    if error is None:
        return "OK"
    code = context.code()
    if isinstance(error, grpc.aio.AbortError) and isinstance(code, grpc.StatusCode):
        return str(code.name)
    if code is not None or isinstance(error, (asyncio.CancelledError, GeneratorExit)):
        # grpc.aio ends a cancelled PutBlob's requests as if whole: its abort then fails, the call over.
        remaining = context.time_remaining()
        return "DEADLINE_EXCEEDED" if remaining is not None and remaining <= 0 else "CANCELLED"
    return "UNKNOWN"


async def _abort(context: grpc.aio.ServicerContext, exc: StoreError) -> NoReturn:
    failure = failure_of(exc)
    await context.abort(failure.code, failure.details, trailing_metadata=failure.trailers)
    raise AssertionError("unreachable: context.abort raises")
