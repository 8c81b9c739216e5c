"""The gRPC sidecar: ckpt.v1.CheckpointService on top of the store.

A thin adapter: it converts messages, calls the store, and turns store errors
into status codes in one place (``CheckpointService._call``). Health checking
(grpc.health.v1) and server reflection are served too, so generic tools such
as grpcurl work against it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import ipaddress
import logging
import os
import signal
import socket
import stat
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NoReturn, TypeVar, cast

import grpc
import grpc.aio
from google.protobuf import message_factory
from google.protobuf.message import DecodeError, Message
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ckpt.v1 import service_pb2, service_pb2_grpc

from ...codec import FrameKind, count_fields
from ..config import (
    MAX_STREAM_BATCH_PUTS,
    MESSAGE_ENVELOPE_BYTES,
    ServeConfig,
)
from ..errors import InvalidArgument, StateTooLarge, StoreError, Unavailable
from ..status import CURRENT_VERSION_KEY, status_of
from ..store import (
    OFF_LOOP_PATCH_BYTES,
    PutRequest,
    PutResult,
    SessionInfo,
    Store,
    VersionInfo,
    WriteMode,
    keys,
)
from ..tls import ClientTLS, open_channel
from .gctune import serving_gc
from .heap import HeapTrimmer
from .inflight import InFlight
from .link import BENCH_LINK_ECHO
from .metrics import Metrics
from .replycache import ReplyCache
from .storelink import StoreLink, abort_with

log = logging.getLogger("ckpt")
T = TypeVar("T")

SERVICE_NAME = service_pb2.DESCRIPTOR.services_by_name["CheckpointService"].full_name
ECHO_METHOD = "/ckpt.bench.Echo/Echo"  # bytes in, same bytes out: the benchmark's ceiling
#: The echo's bytes go to the store process and back (--store-process only): the process hop's cost.
LINK_ECHO_METHOD = "/ckpt.bench.Echo/LinkEcho"
# Starts the line logged once the server serves, which ends " pid=N" (sidecar.process waits for it).
SERVING_LOG = "ckpt serving:"
# PutStream batches a stream's reader may queue before their answers are sent,
# and their states' bytes: without a byte bound a stream of large states held
# nearly all it sent in memory (3,000 x 300 KB: 887 MiB resident), since the
# network outruns the writer. A batch is read alone when none is in flight.
_STREAM_BATCHES_AHEAD = 64
STREAM_BYTES_AHEAD = 64 * 1024 * 1024
#: The most bytes of UTF-8 in the status details (or a PutError's message) the service sends. Details
#: travel as an HTTP/2 header, percent-encoded past ASCII (3x), and grpc-core clients refuse headers
#: past 8 KiB (some of the time; always past 16 KiB); with a store process they cross the link in a
#: frame no larger than a message. An error quoting the megabytes a client sent was refused by the
#: one and broke the other, stopping the sidecar. The errors quote clients' strings cut short
#: (keys.quoted); this bounds whatever else may quote one.
MAX_DETAILS_BYTES = 2048


def bounded_details(text: str) -> str:
    """``text``, cut to MAX_DETAILS_BYTES of UTF-8 (saying how long it was) if longer."""
    if len(text) > MAX_DETAILS_BYTES // 4 and len(raw := text.encode(errors="replace")) > MAX_DETAILS_BYTES:
        return f"{raw[:MAX_DETAILS_BYTES].decode(errors='ignore')}... (cut: {len(raw)} bytes)"
    return text


_STREAM_STOPPED = (
    "the sidecar is shutting down: every batch answered on this stream is committed, later ones were not"
    " read; resend them (with the same request ids) once it is back"
)


# -- conversions -------------------------------------------------------------


def _timestamp(nanos: int) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(nanos)
    return ts


# The store keys times as unsigned 64-bit nanoseconds since the Unix epoch
# (keys.time_key); earlier times act as the epoch, later ones cannot be keyed.
_MIN_TIMESTAMP_SECONDS = -62_135_596_800  # 0001-01-01T00:00:00Z, protobuf's earliest Timestamp
_TIME_RANGE = f"0001-01-01T00:00:00Z to {_timestamp(keys.MAX_TIME_NANOS).ToJsonString()}"


def time_filter_nanos(request: Message, field_name: str) -> int | None:
    """A Timestamp filter field in nanoseconds (None if unset), or InvalidArgument naming it."""
    if not request.HasField(field_name):
        return None
    ts: Timestamp = getattr(request, field_name)
    nanos = ts.seconds * 1_000_000_000 + ts.nanos
    if 0 <= ts.nanos <= 999_999_999 and ts.seconds >= _MIN_TIMESTAMP_SECONDS and nanos <= keys.MAX_TIME_NANOS:
        return nanos
    raise InvalidArgument(
        f"{field_name} (seconds={ts.seconds}, nanos={ts.nanos}) is out of range: it must be a time from"
        f" {_TIME_RANGE}, with nanos in 0..999,999,999"
    )


_FRAME_KIND_PB = {
    FrameKind.FULL: service_pb2.FRAME_KIND_FULL,
    FrameKind.DELTA: service_pb2.FRAME_KIND_DELTA,
    FrameKind.PATCH: service_pb2.FRAME_KIND_PATCH,
}
# A fork's version 1 has no write mode of its own.
_WRITE_MODE_PB = {
    WriteMode.REPLACE: service_pb2.WRITE_MODE_REPLACE,
    WriteMode.MERGE: service_pb2.WRITE_MODE_MERGE,
    WriteMode.FORK: service_pb2.WRITE_MODE_UNSPECIFIED,
}


def version_info_pb(info: VersionInfo) -> service_pb2.VersionInfo:
    msg = service_pb2.VersionInfo(
        version=info.version,
        parent_version=info.parent_version,
        created_at=_timestamp(info.created_unix_nanos),
        frame_kind=_FRAME_KIND_PB[info.frame_kind],
        stored_bytes=info.stored_bytes,
        state_size=info.state_size,
        mode=_WRITE_MODE_PB[info.mode],
    )
    if info.labels:  # an empty map given to the constructor costs ~1.3 us; most versions carry none
        msg.labels.update(info.labels)
    return msg


def session_info_pb(info: SessionInfo) -> service_pb2.SessionInfo:
    return service_pb2.SessionInfo(
        session_id=info.session_id,
        head_version=info.head_version,
        created_at=_timestamp(info.created_unix_nanos),
        updated_at=_timestamp(info.updated_unix_nanos),
        labels=info.labels,
        stored_bytes=info.stored_bytes,
        version_count=info.version_count,
        forked_from_session_id=info.forked_from_session_id,
        forked_from_version=info.forked_from_version,
    )


def put_response_pb(r: PutResult) -> service_pb2.PutResponse:
    return service_pb2.PutResponse(
        version=r.version,
        stored_bytes=r.stored_bytes,
        frame_kind=_FRAME_KIND_PB[r.frame_kind],
        replayed=r.replayed,
        state_size=r.state_size,
    )


def put_request(msg: service_pb2.PutRequest) -> PutRequest:
    if msg.mode in (service_pb2.WRITE_MODE_UNSPECIFIED, service_pb2.WRITE_MODE_REPLACE):
        mode = WriteMode.REPLACE
    elif msg.mode == service_pb2.WRITE_MODE_MERGE:
        mode = WriteMode.MERGE
    else:
        raise InvalidArgument(f"mode {msg.mode} is not a WriteMode (REPLACE = 1, MERGE = 2)")
    return PutRequest(
        session_id=msg.session_id,
        state=msg.state,
        mode=mode,
        expected_version=msg.expected_version if msg.HasField("expected_version") else None,
        request_id=msg.request_id,
        labels=labels_arg(msg.labels, "labels") if msg.labels else {},  # most writes carry none: skip a copy
    )


def labels_arg(labels: Mapping[str, str], field: str) -> dict[str, str]:
    """A request's labels map as a dict, refused (as keys.check_labels would) if it has too many
    entries before it is copied: a 10 MB Put of a million labels took 0.65 s of the event loop and
    126 MB to copy, only to be refused."""
    if len(labels) > keys.MAX_LABELS:
        raise InvalidArgument(f"{field} has {len(labels)} entries; the limit is {keys.MAX_LABELS}")
    return dict(labels)


def put_error_pb(error: StoreError, message: str) -> service_pb2.PutError:
    return service_pb2.PutError(
        code=status_of(error).value[0],
        message=message,
        current_version=getattr(error, "current_version", 0),
    )


# -- the service ---------------------------------------------------------------


class CheckpointService(service_pb2_grpc.CheckpointServiceServicer):  # type: ignore[misc]  # untyped stubs
    """Every RPC runs on the server's event loop.

    Writes are queued to the store's writer thread and awaited (one loop
    wake-up per group commit); reads the state cache answers are served on
    the loop; anything that may block on LMDB or on the writer (cache-miss
    reads, listings, forks, deletes) runs on a small thread pool.
    """

    def __init__(
        self,
        store: Store,
        metrics: Metrics,
        blocking: ThreadPoolExecutor,
        *,
        stream_bytes_ahead: int = STREAM_BYTES_AHEAD,
        max_page_bytes: int = 0,
        state_limit_origin: str = "",
    ) -> None:
        self._store = store
        #: Said after a size error: where the store's max_state_bytes comes from (a client cannot see it).
        self._state_limit_origin = state_limit_origin
        #: Listing replies stop short of this many bytes (0: no limit): what fits a reply.
        self._max_page_bytes = max_page_bytes
        self._metrics = metrics
        self._blocking = blocking
        self._stream_bytes_ahead = stream_bytes_ahead
        # Each open PutStream's reader task, for stop_streams().
        self._stream_readers: set[asyncio.Task[None]] = set()
        self._stopping = False
        #: The service's RPCs under way (each PutStream once).
        self.calls = InFlight()

    def stop_streams(self) -> None:
        """On shutdown: every PutStream stops reading, answers the batches it has read, and ends UNAVAILABLE.

        A stream is not one write but a channel that stays open for as long as
        its client likes: left alone it would take new writes for the whole
        grace period (and hold shutdown that long even when idle), then be
        cancelled with writes queued but unanswered.
        """
        self._stopping = True
        for reader in self._stream_readers:
            reader.cancel()

    async def _off_loop(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._blocking, fn)

    async def _call(self, rpc: str, context: grpc.aio.ServicerContext, fn: Callable[[], Awaitable[T]]) -> T:
        """Run one RPC: count it, time it, and translate store errors (the one boundary)."""
        m = self._metrics
        requests, latency = m.per_rpc(rpc)
        requests.inc()
        self.calls.began()
        start = time.perf_counter()
        try:
            return await fn()
        except StoreError as exc:
            await self._abort(rpc, context, exc)
        except Exception:
            log.exception("%s failed", rpc)
            code, details, _ = self._failed_inside(rpc)
            await context.abort(code, details)
        finally:
            latency.observe(time.perf_counter() - start)
            self.calls.ended()
        raise AssertionError("unreachable: context.abort raises")

    async def _abort(self, rpc: str, context: grpc.aio.ServicerContext, exc: StoreError) -> NoReturn:
        """End an RPC with the status a store error maps to, counting it; the head goes in a trailer."""
        code, details, trailers = self._failure(rpc, exc)
        await context.abort(code, details, trailing_metadata=trailers)
        raise AssertionError("unreachable: context.abort raises")

    def _failure(self, rpc: str, exc: StoreError) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
        """The status, details and trailers a store error ends an RPC with (counted as an error)."""
        code = status_of(exc)
        self._metrics.errors.labels(rpc, code.name).inc()
        current = getattr(exc, "current_version", None)
        trailers = ((CURRENT_VERSION_KEY, str(current)),) if current is not None else ()
        return code, self._message(exc), trailers

    def _failed_inside(self, rpc: str) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
        """After a bug (logged by the caller): INTERNAL, counted."""
        self._metrics.errors.labels(rpc, "INTERNAL").inc()
        return grpc.StatusCode.INTERNAL, f"{rpc} failed inside the sidecar; see its log", ()

    def put_with_callback(self, raw: bytes, answer: PutAnswer) -> bool:
        """Put without a coroutine: ``answer`` gets (None, "", (), reply bytes) or a failure's
        (status, details, trailers, b""), once, on this loop. False (nothing done) for a request
        that must take :meth:`Put` instead: a large MERGE patch, checked off the loop there.

        The store process answers every call of a group commit in one loop turn; without a
        Task and four coroutines per call, a unary merge took ~7% less server CPU (759 against
        812 us, both processes, ``python -m bench.sidecar_ab``, with the link's per-turn writes).
        """
        try:
            request = cast(service_pb2.PutRequest, _PUT_PARSER(raw))
        except InvalidArgument:
            return False  # Put's path counts and answers it
        if request.mode == service_pb2.WRITE_MODE_MERGE and len(request.state) >= OFF_LOOP_PATCH_BYTES:
            return False
        requests, latency = self._metrics.per_rpc("Put")
        requests.inc()
        self.calls.began()
        start = time.perf_counter()

        def finish(outcome: tuple[grpc.StatusCode | None, str, tuple[tuple[str, str], ...], bytes]) -> None:
            latency.observe(time.perf_counter() - start)
            self.calls.ended()
            answer(*outcome)

        def failed(exc: Exception) -> None:
            if isinstance(exc, StoreError):
                finish((*self._failure("Put", exc), b""))
            else:  # a bug, as _call answers it
                log.error("Put failed", exc_info=exc)
                finish((*self._failed_inside("Put"), b""))

        def done(future: asyncio.Future[PutResult]) -> None:
            try:
                result = future.result()
                self._count_write(len(request.state), result)
                body = put_response_pb(result).SerializeToString()
            except Exception as exc:
                failed(exc)
            else:
                finish((None, "", (), body))

        try:
            self._store.asubmit(put_request(request)).add_done_callback(done)
        except Exception as exc:
            failed(exc)
        return True

    def count_served(self, rpc: str, seconds: float, state_bytes: int) -> None:
        """Count a Get the gRPC process answered from its reply cache (its metrics are this process's)."""
        requests, latency = self._metrics.per_rpc(rpc)
        requests.inc()
        latency.observe(seconds)
        self._metrics.bytes_out.inc(state_bytes)
        self._metrics.reply_cache_hits.inc()

    def reply_cache_size(self, size_bytes: int, entries: int) -> None:
        """The gRPC process's reply cache's size, as it last reported it (its metrics are this process's)."""
        self._metrics.reply_cache = (size_bytes, entries)

    def _message(self, exc: StoreError) -> str:
        text = str(exc)
        if isinstance(exc, StateTooLarge) and self._state_limit_origin:
            text = f"{text}; {self._state_limit_origin}"
        return bounded_details(text)

    async def Put(self, request: service_pb2.PutRequest, context: grpc.aio.ServicerContext) -> service_pb2.PutResponse:
        async def run() -> service_pb2.PutResponse:
            result = await self._store.awrite(put_request(request))  # a large patch is checked off the loop
            self._count_write(len(request.state), result)
            return put_response_pb(result)

        return await self._call("Put", context, run)

    async def Get(self, request: service_pb2.GetRequest, context: grpc.aio.ServicerContext) -> service_pb2.GetResponse:
        async def run() -> service_pb2.GetResponse:
            store = self._store
            got = store.get_cached(request.session_id, request.version)
            if got is None:
                got = await self._off_loop(lambda: store.get(request.session_id, request.version, use_cache=False))
            self._metrics.bytes_out.inc(len(got.state))
            return service_pb2.GetResponse(version=got.version, state=got.state, info=version_info_pb(got.info))

        return await self._call("Get", context, run)

    async def ListVersions(
        self, request: service_pb2.ListVersionsRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.ListVersionsResponse:
        def run() -> service_pb2.ListVersionsResponse:
            page, token = self._store.list_versions(
                request.session_id,
                page_size=request.page_size,
                page_token=request.page_token,
                max_page_bytes=self._max_page_bytes,
            )
            return service_pb2.ListVersionsResponse(versions=[version_info_pb(v) for v in page], next_page_token=token)

        return await self._call("ListVersions", context, lambda: self._off_loop(run))

    async def ListSessions(
        self, request: service_pb2.ListSessionsRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.ListSessionsResponse:
        def run() -> service_pb2.ListSessionsResponse:
            page, token = self._store.list_sessions(
                page_size=request.page_size,
                page_token=request.page_token,
                label_filter=labels_arg(request.label_filter, "label_filter"),
                updated_after_nanos=time_filter_nanos(request, "updated_after"),
                updated_before_nanos=time_filter_nanos(request, "updated_before"),
                max_page_bytes=self._max_page_bytes,
            )
            return service_pb2.ListSessionsResponse(sessions=[session_info_pb(s) for s in page], next_page_token=token)

        return await self._call("ListSessions", context, lambda: self._off_loop(run))

    async def Fork(
        self, request: service_pb2.ForkRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.ForkResponse:
        def run() -> service_pb2.ForkResponse:
            info = self._store.fork(
                request.session_id, request.version, request.new_session_id, labels=labels_arg(request.labels, "labels")
            )
            return service_pb2.ForkResponse(session=session_info_pb(info))

        return await self._call("Fork", context, lambda: self._off_loop(run))

    async def DeleteSession(
        self, request: service_pb2.DeleteSessionRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.DeleteSessionResponse:
        def run() -> service_pb2.DeleteSessionResponse:
            return service_pb2.DeleteSessionResponse(deleted_versions=self._store.delete_session(request.session_id))

        return await self._call("DeleteSession", context, lambda: self._off_loop(run))

    async def PutStream(
        self, request_iterator: AsyncIterator[service_pb2.PutStreamRequest], context: grpc.aio.ServicerContext
    ) -> AsyncGenerator[service_pb2.PutStreamResponse, None]:
        self.calls.began()
        try:
            async with contextlib.aclosing(self._put_stream(request_iterator, context)) as responses:
                async for response in responses:
                    yield response
        finally:
            self.calls.ended()

    async def _put_stream(
        self, request_iterator: AsyncIterator[service_pb2.PutStreamRequest], context: grpc.aio.ServicerContext
    ) -> AsyncGenerator[service_pb2.PutStreamResponse, None]:
        """Pipelined: a reader task queues each batch's writes as it arrives,
        while this generator answers batches in order as their commits land.
        Writes to one session keep the order sent (one writer, FIFO queue)."""
        requests, latency = self._metrics.per_rpc("PutStream")
        requests.inc()
        if self._stopping:  # opened between stop_streams() and the server refusing new calls
            await self._abort("PutStream", context, Unavailable(_STREAM_STOPPED))
        # Unbounded so the reader's end marker always fits; `room` bounds how
        # many batches, and bytes of state, the reader runs ahead of the answers.
        pending: asyncio.Queue[tuple[int, list[asyncio.Future[PutResult] | StoreError], list[int], float] | None]
        pending = asyncio.Queue()
        room = asyncio.Condition()
        ahead = [0, 0]  # batches, state bytes: read and not yet answered
        bytes_ahead = self._stream_bytes_ahead

        def has_room(nbytes: int) -> bool:
            return ahead[0] == 0 or (ahead[0] < _STREAM_BATCHES_AHEAD and ahead[1] + nbytes <= bytes_ahead)

        async def read() -> None:
            try:
                async for batch in request_iterator:
                    read_at = time.perf_counter()
                    sizes = [len(msg.state) for msg in batch.puts]
                    nbytes = sum(sizes)
                    async with room:
                        await room.wait_for(functools.partial(has_room, nbytes))
                        ahead[0] += 1
                        ahead[1] += nbytes
                    items: list[asyncio.Future[PutResult] | StoreError] = []
                    try:
                        for msg in batch.puts:
                            try:
                                items.append(await self._queue_write(msg))
                            except StoreError as exc:
                                items.append(exc)
                            except Exception as exc:  # a bug: this write fails, the stream and its other writes go on
                                items.append(_internal("PutStream", exc))
                    except asyncio.CancelledError:
                        # stop_streams() while waiting for room: the batch is
                        # answered whole, its writes not queued refused.
                        items += [Unavailable(_STREAM_STOPPED)] * (len(batch.puts) - len(items))
                        raise
                    finally:
                        if len(items) == len(batch.puts):
                            pending.put_nowait((batch.batch_id, items, sizes, read_at))
            except grpc.RpcError:
                pass  # the client went away; the answering side stops too

        reader = asyncio.create_task(read())
        self._stream_readers.add(reader)
        reader.add_done_callback(self._stream_readers.discard)
        # The end of the batches, however the reader ends: put by a callback, not a `finally`
        # in read(), which a reader cancelled before its first step (stop_streams() just
        # after this handler started) never runs; its answers then waited for ever, and
        # shutdown with them.
        reader.add_done_callback(lambda _: pending.put_nowait(None))
        items: list[asyncio.Future[PutResult] | StoreError] = []
        try:
            while (item := await pending.get()) is not None:
                batch_id, items, sizes, read_at = item
                results = []
                for entry, size in zip(items, sizes, strict=True):
                    outcome: PutResult | StoreError
                    if isinstance(entry, StoreError):
                        outcome = entry
                    else:
                        try:
                            outcome = await entry
                        except StoreError as exc:
                            outcome = exc
                        except Exception as exc:  # a bug in the writer: this write failed, the others stand
                            outcome = _internal("PutStream", exc)
                    if isinstance(outcome, StoreError):
                        self._metrics.errors.labels("PutStream", status_of(outcome).name).inc()
                        results.append(service_pb2.PutResult(error=put_error_pb(outcome, self._message(outcome))))
                    else:
                        self._count_write(size, outcome)
                        results.append(service_pb2.PutResult(response=put_response_pb(outcome)))
                async with room:
                    ahead[0] -= 1
                    ahead[1] -= sum(sizes)
                    room.notify_all()
                latency.observe(time.perf_counter() - read_at)
                yield service_pb2.PutStreamResponse(results=results, batch_id=batch_id)
            await asyncio.wait((reader,))
            if reader.cancelled():  # stop_streams(): every batch read is answered above
                await self._abort("PutStream", context, Unavailable(_STREAM_STOPPED))
            try:
                await reader  # re-raises what stopped the reader, if it was not the stream's end
            except StoreError as exc:  # a message that did not parse; the batches before it are answered
                await self._abort("PutStream", context, exc)
        finally:
            reader.cancel()
            reader.add_done_callback(_retrieve_outcome)  # ended early: nobody awaits its error
            # The stream ended early (client gone, or cancelled). Writes already
            # queued still commit, but nobody reads their outcomes: retrieve
            # them, or asyncio logs each failed one as never retrieved.
            unanswered = [items]
            while not pending.empty():
                if (left := pending.get_nowait()) is not None:
                    unanswered.append(left[1])
            for batch_items in unanswered:
                for entry in batch_items:
                    if isinstance(entry, asyncio.Future):
                        entry.add_done_callback(_retrieve_outcome)

    async def _queue_write(self, msg: service_pb2.PutRequest) -> asyncio.Future[PutResult]:
        """Queue one of a stream's writes, waiting out Overloaded.

        A unary Put that finds the store's write queue full fails at once
        (UNAVAILABLE, and the client retries), so its request's memory is
        freed. A stream's write waits instead: its reader stops reading, and
        gRPC's flow control holds the client back.
        """
        return await self._store.aenqueue(put_request(msg), wait_for_room=True)

    def parsing_unary(
        self, rpc: str, method: Callable[[Any, grpc.aio.ServicerContext], Awaitable[T]], parse: Callable[[bytes], Any]
    ) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[T]]:
        """``method`` taking the request's bytes: grpc-aio answers UNKNOWN when its deserializer
        raises, so unary requests are parsed here and a malformed one goes through ``_call``."""

        async def handle(raw: bytes, context: grpc.aio.ServicerContext) -> T:
            try:
                request = parse(raw)
            except InvalidArgument as exc:
                return await self._call(rpc, context, functools.partial(_raise, exc))
            return await method(request, context)

        return handle

    def _count_write(self, received: int, result: PutResult) -> None:
        m = self._metrics
        m.bytes_in.inc(received)
        if not result.replayed:
            m.stored.inc(result.stored_bytes)
            m.chain_depth.observe(result.chain_depth)


def _internal(rpc: str, exc: Exception) -> StoreError:
    """One write of a stream failed on a bug: logged, and answered INTERNAL (a plain StoreError)."""
    log.error("a write of a %s failed", rpc, exc_info=exc)
    return StoreError(f"the write failed inside the sidecar ({type(exc).__name__}); see its log")


def _retrieve_outcome(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


async def _raise(error: Exception) -> NoReturn:
    raise error


def request_parser(request_type: type[Message]) -> Callable[[bytes], Message]:
    """``request_type.FromString``, raising InvalidArgument naming the type for bytes that do not parse."""
    name = request_type.DESCRIPTOR.full_name
    from_string = request_type.FromString

    def parse(raw: bytes) -> Message:
        try:
            return from_string(raw)
        except DecodeError as exc:
            detail = str(exc).removeprefix(f"Error parsing message with type '{name}': ")
            raise InvalidArgument(f"the request is not a valid {name}: {detail}") from None

    return parse


_PUT_PARSER = request_parser(service_pb2.PutRequest)


def stream_request_parser() -> Callable[[bytes], Message]:
    """A PutStreamRequest's parser, which refuses one of more than MAX_STREAM_BATCH_PUTS writes
    (InvalidArgument) before parsing it: parsed, each write costs ~90 bytes even if empty (2 on the wire)."""
    parse = request_parser(service_pb2.PutStreamRequest)

    def parse_batch(raw: bytes) -> Message:
        if len(raw) > 2 * MAX_STREAM_BATCH_PUTS:  # a write takes 2 bytes at least: fewer cannot be too many
            puts = count_fields(raw, 1, stop=MAX_STREAM_BATCH_PUTS + 1)  # field 1: PutStreamRequest.puts
            if puts > MAX_STREAM_BATCH_PUTS:
                raise InvalidArgument(
                    f"puts has more than {MAX_STREAM_BATCH_PUTS} entries; the limit is {MAX_STREAM_BATCH_PUTS}"
                    " writes per PutStreamRequest (send more messages)"
                )
        return parse(raw)

    return parse_batch


def add_checkpoint_service(service: CheckpointService, server: grpc.aio.Server) -> None:
    """Register ``service`` as service_pb2_grpc.add_CheckpointServiceServicer_to_server does, except
    that a request that does not parse gets INVALID_ARGUMENT (grpc-aio answers UNKNOWN).

    Unary requests arrive as bytes and are parsed by ``parsing_unary``. A stream's
    messages are parsed as the handler reads them, so the deserializer's error
    reaches PutStream, which ends the stream with it.
    """
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(handle, response_serializer=serialize)
        for name, (handle, serialize) in zip(UNARY_METHODS, unary_dispatch(service), strict=True)
    }
    for method in _SERVICE.methods:
        if method.client_streaming and method.server_streaming:
            handlers[method.name] = grpc.stream_stream_rpc_method_handler(
                getattr(service, method.name),
                request_deserializer=stream_request_parser(),
                response_serializer=message_factory.GetMessageClass(method.output_type).SerializeToString,
            )
        elif method.client_streaming or method.server_streaming:
            raise NotImplementedError(f"{method.full_name}: only unary and bidirectional methods are served")
    _register(server, handlers)


def _register(server: grpc.aio.Server, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


_SERVICE = service_pb2.DESCRIPTOR.services_by_name["CheckpointService"]
#: The CheckpointService's unary methods, in the order the link numbers them.
UNARY_METHODS = tuple(m.name for m in _SERVICE.methods if not m.client_streaming and not m.server_streaming)
#: Put's index in UNARY_METHODS: the method a link frame names for a forwarded Put.
PUT_METHOD = UNARY_METHODS.index("Put")


#: What put_with_callback answers: (None, "", (), reply bytes) or (status, details, trailers, b"").
PutAnswer = Callable[[grpc.StatusCode | None, str, tuple[tuple[str, str], ...], bytes], None]
#: What handles a unary call's request bytes, and what serializes its reply.
UnaryHandler = tuple[Callable[[bytes, Any], Awaitable[Any]], Callable[[Any], bytes]]


def unary_dispatch(service: CheckpointService) -> list[UnaryHandler]:
    """Per UNARY_METHODS: what handles a call's request bytes, and what serializes its reply."""
    out: list[UnaryHandler] = []
    for name in UNARY_METHODS:
        method = _SERVICE.methods_by_name[name]
        parse = request_parser(message_factory.GetMessageClass(method.input_type))
        serialize = message_factory.GetMessageClass(method.output_type).SerializeToString
        out.append((service.parsing_unary(name, getattr(service, name), parse), serialize))
    return out


def add_forwarded_service(link: StoreLink, server: grpc.aio.Server, replies: ReplyCache | None = None) -> None:
    """Serve the CheckpointService by forwarding each call's bytes to the store process;
    with ``replies``, a Get it holds the answer to is answered here."""
    handlers = {name: grpc.unary_unary_rpc_method_handler(_forwarder(link, i)) for i, name in enumerate(UNARY_METHODS)}
    if replies is not None:
        gauges = _ReplyCacheGauges(link, replies)
        handlers["Get"] = grpc.unary_unary_rpc_method_handler(
            _cached_get(_forwarder(link, _GET), link, replies, gauges.changed)
        )
    handlers["PutStream"] = grpc.stream_stream_rpc_method_handler(link.stream)  # raw bytes both ways
    _register(server, handlers)


_GET = UNARY_METHODS.index("Get")


def _forwarder(link: StoreLink, method: int) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]:
    """A unary handler that sends the request's bytes to the store process as a call of ``method``
    (an index of UNARY_METHODS, or link.BENCH_LINK_ECHO) and answers with its reply or status."""

    # The link echo measures the hop a Put makes, so it takes the Puts' link.
    batched = method in (PUT_METHOD, BENCH_LINK_ECHO)

    async def forward(raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        status, meta, body = await link.call(method, raw, batched=batched)
        if status:
            await abort_with(context, status, meta)
        return body

    return forward


class _ReplyCacheGauges:
    """Reports the reply cache's size to the store process's metrics: at once, then at most once every
    ``interval_seconds`` after a Get that may have changed it, and only if it did."""

    def __init__(self, link: StoreLink, replies: ReplyCache, *, interval_seconds: float = 1.0) -> None:
        self._link = link
        self._replies = replies
        self._interval_seconds = interval_seconds
        self._sent: tuple[int, int] | None = None
        self._pending: asyncio.TimerHandle | None = None
        self._send()

    def changed(self) -> None:
        if self._pending is None:
            self._pending = asyncio.get_running_loop().call_later(self._interval_seconds, self._send)

    def _send(self) -> None:
        self._pending = None
        size = (self._replies.size_bytes, len(self._replies))
        if size != self._sent:
            self._sent = size
            self._link.gauges(reply_cache_bytes=size[0], reply_cache_entries=size[1])


def _cached_get(
    forward: Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]],
    link: StoreLink,
    replies: ReplyCache,
    changed: Callable[[], None],
) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]:
    """A Get ``replies`` answers, else ``forward``ed (and its reply kept when it asked for the latest);
    ``changed`` is called after each Get that may have changed what ``replies`` holds."""

    async def get(raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        start = time.perf_counter()
        try:
            request = service_pb2.GetRequest.FromString(raw)
        except DecodeError:
            request = None  # the store process answers INVALID_ARGUMENT, naming what is wrong
        if request is not None:
            hit = replies.answer(request.session_id, request.version)
            if hit is not None:
                body, state_bytes = hit
                link.served(_GET, time.perf_counter() - start, state_bytes)
                return body
        try:
            body = await forward(raw, context)
        finally:
            # A miss may have dropped a stale reply, and one may be kept next; the report reads
            # the size a while later, after both, even if the forwarded call failed.
            changed()
        if request is not None and not request.version:
            replies.remember(request.session_id, body)
        return body

    return get


def _echo_handler(link: StoreLink | None) -> grpc.GenericRpcHandler:
    async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return request

    # No (de)serializers: raw bytes.
    methods = {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
    if link is not None:
        methods["LinkEcho"] = grpc.unary_unary_rpc_method_handler(_forwarder(link, BENCH_LINK_ECHO))
    return grpc.method_handlers_generic_handler("ckpt.bench.Echo", methods)


# -- serving -------------------------------------------------------------------


class StoreSide:
    """The store and what serves it: its metrics, the blocking pool, the CheckpointService, the heap trimmer.

    In the sidecar's process, or in its store process (``--store-process``, storehost.py).
    """

    def __init__(
        self,
        config: ServeConfig,
        *,
        worker: int | None,
        on_writes_stopped: Callable[[str], object],
        lock_holder: str | None = None,
    ) -> None:
        """``lock_holder``: who a second server on the data directory is told holds it (Store's)."""
        self.config = config
        self.store = Store(
            config.store_config(),
            on_writes_stopped=on_writes_stopped,
            shared=worker is not None,
            sweeper=not worker,  # one sweeper for all: worker 0's
            lock_holder=lock_holder,
        )
        self.metrics = Metrics()
        try:
            self.metrics.watch(self.store)
            #: Where /metrics is served (None: off); bound first, so a port in use fails before anything serves.
            self.metrics_address: str | None = None
            if config.metrics_port is not None:
                host = config.metrics_address
                host = f"[{host}]" if ":" in host else host  # an IPv6 address
                # Each worker counts its own RPCs: worker i on METRICS_PORT + i.
                wanted = config.metrics_port + (worker or 0) if config.metrics_port else 0
                try:
                    port = self.metrics.serve(wanted, config.metrics_address)
                except OSError as exc:
                    raise Unavailable(
                        f"cannot serve metrics on {host}:{wanted} (--metrics-address,"
                        f" --metrics-port{', plus the worker index' if worker else ''}): {exc.strerror or exc}"
                    ) from None
                self.metrics_address = f"{host}:{port}"
            self._blocking = ThreadPoolExecutor(max_workers=config.threads, thread_name_prefix="ckpt-blocking")
            # A listing reply keeps the same envelope clear as a Get's state does.
            self.service = CheckpointService(
                self.store,
                self.metrics,
                self._blocking,
                max_page_bytes=config.max_state_bytes,
                state_limit_origin=(
                    f"max_state_bytes is the sidecar's --max-message-bytes ({config.max_message_bytes})"
                    f" less {MESSAGE_ENVELOPE_BYTES} bytes kept for the rest of a message"
                ),
            )
            self.heap_trimmer = (
                HeapTrimmer(config.heap_trim_interval_seconds, self._activity)
                if config.heap_trim_interval_seconds
                else None
            )
        except BaseException:
            self.metrics.close()
            self.store.close()
            raise

    def _activity(self) -> int:
        # Every RPC (reads too), and the sweeper's writes, which make no RPC.
        return self.store.commits + self.service.calls.started

    def start(self) -> None:
        if self.heap_trimmer is not None:
            self.heap_trimmer.start()

    def close(self) -> None:
        """After the service's calls are done: commit queued writes, close LMDB, stop serving metrics."""
        self._blocking.shutdown(wait=True)
        if self.heap_trimmer is not None:
            self.heap_trimmer.stop()
        self.store.close()
        self.metrics.close()


class SidecarServer:
    """The gRPC server on every address, health, reflection, and the store side (here or in a store process).

    Create and use it inside a running event loop (see :func:`serve`); with
    ``link``, the store side runs in the store process at its other end.
    """

    def __init__(self, config: ServeConfig, *, worker: int | None = None, link: StoreLink | None = None) -> None:
        """``worker``: this process is worker ``worker`` of ``config.workers`` (workers.py): its
        parent holds the data directory's lock and claimed the ports, which every worker binds."""
        self.config = config
        self.worker = worker
        self.link = link
        loop = asyncio.get_running_loop()
        #: Set when the store stopped taking writes (a failed commit) or its process died: the sidecar
        #: then stops, exit 1.
        self.writes_stopped = asyncio.Event()
        self.side: StoreSide | None = None
        if link is None:
            self.side = StoreSide(
                config,
                worker=worker,
                on_writes_stopped=lambda reason: loop.call_soon_threadsafe(self.writes_stopped.set),
            )
            self.metrics_address = self.side.metrics_address
        else:
            link.on_failed = self.writes_stopped.set
            self.metrics_address = link.metrics_address
        #: With a store process: the Get replies this process answers itself (None: off).
        self.replies: ReplyCache | None = None
        if link is not None and config.reply_cache_bytes:
            # Read-only, beside the store process, which created the directory's LMDB before it said READY.
            self.replies = ReplyCache(Store(config.store_config(), readonly=True), config.reply_cache_bytes)
        # gRPC's own memory (received messages) is this process's, wherever the store runs.
        self.heap_trimmer = (
            HeapTrimmer(config.heap_trim_interval_seconds, lambda: link.calls.started)
            if link is not None and config.heap_trim_interval_seconds
            else None
        )
        try:
            self.health = health.aio.HealthServicer()
            self.server = grpc.aio.server(
                options=[
                    ("grpc.max_receive_message_length", config.max_message_bytes),
                    ("grpc.max_send_message_length", config.max_message_bytes),
                    # Without this, a second server binds the same TCP port silently.
                    # Workers share their ports; their parent checked that no one else listens there.
                    ("grpc.so_reuseport", 0 if worker is None else 1),
                ],
            )
            if self.side is not None:
                add_checkpoint_service(self.side.service, self.server)
            else:
                assert link is not None
                add_forwarded_service(link, self.server, self.replies)
            health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
            reflection.enable_server_reflection(
                (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
                self.server,
            )
            if config.bench_echo:
                self.server.add_generic_rpc_handlers((_echo_handler(link),))
            #: Each unix socket this server bound, with its (st_dev, st_ino): what stop() may remove.
            #: The addresses served, a TCP port 0 replaced by the port bound (what the log names).
            self.listening: list[str] = []
            self._tls = config.server_credentials()
            self._unix_sockets = [sock for addr in config.addresses if (sock := self._bind(addr)) is not None]
        except BaseException:
            if self.side is not None:
                self.side.close()
            if self.replies is not None:
                self.replies.close()
            raise

    @property
    def failed(self) -> bool:
        """Whether the store stopped taking writes (or its process died): exit 1."""
        if self.side is not None:
            return self.side.store.writes_stopped is not None
        assert self.link is not None
        return self.link.failed

    def _bind(self, address: str) -> tuple[Path, tuple[int, int]] | None:
        """Listen on ``address``; for a unix socket, its path and identity (device, inode)."""
        path = None
        if address.startswith("unix:"):
            path = Path(address[len("unix:") :])
            _check_unix_path_size(address[len("unix:") :])  # as given: what gRPC binds, not normalised
            _claim_unix_socket(path)
        elif self.worker is None:
            _claim_tcp_name(address)
        try:
            if path is None and self._tls is not None:
                port = self.server.add_secure_port(address, self._tls)
            else:
                port = self.server.add_insecure_port(address)
        except RuntimeError as exc:  # gRPC's own words: "Failed to bind ... set GRPC_VERBOSITY=debug"
            why = path is None and _why_unbindable(address)
            raise Unavailable(f"cannot listen on {address}: {why or exc}") from None
        if not port:
            why = path is None and _why_unbindable(address)
            raise Unavailable(f"cannot listen on {address}: {why or 'the address is in use or invalid'}")
        host, sep, asked = address.rpartition(":")
        self.listening.append(f"{host}:{port}" if path is None and sep and asked == "0" else address)
        if path is None:
            return None
        st = path.lstat()  # gRPC binds (creates the file) when the port is added
        return path, (st.st_dev, st.st_ino)

    async def start(self) -> None:
        await self.server.start()
        if self._tls is None and (exposed := [a for a in self.listening if reachable_from_other_hosts(a)]):
            log.warning(
                "serving plaintext on %s, which other hosts may reach: whoever connects can read, overwrite and"
                " delete every session; serve TLS there (--tls-cert-file, --tls-key-file, and --tls-client-ca-file"
                " to admit only your agents), or keep the port off any network you do not trust",
                ",".join(exposed),
            )
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self.health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        if self.side is not None:
            self.side.start()
        if self.heap_trimmer is not None:
            self.heap_trimmer.start()
        log.info(
            (SERVING_LOG if self.worker is None else f"ckpt worker {self.worker} serving:")
            + " listen=%s data_dir=%s durability=%s tls=%s metrics=%s pid=%d",
            ",".join(self.listening),
            self.config.data_dir.resolve(),
            self.config.durability.value,
            self.config.tls_mode,
            self.metrics_address or "off",
            os.getpid(),
        )

    async def stop(self) -> None:
        """Stop accepting, let in-flight RPCs finish, commit queued writes, close LMDB."""
        log.info("ckpt stopping: listen=%s data_dir=%s", ",".join(self.listening), self.config.data_dir.resolve())
        await self.health.enter_graceful_shutdown()
        service: CheckpointService | StoreLink
        if self.side is not None:
            service = self.side.service
        else:
            assert self.link is not None
            service = self.link
        service.stop_streams()
        stopping = asyncio.ensure_future(self.server.stop(self.config.grace_seconds))
        idle = asyncio.ensure_future(service.calls.idle.wait())
        await asyncio.wait((stopping, idle), return_when=asyncio.FIRST_COMPLETED)
        if not stopping.done():
            # The service's own calls are done; what is left is health Watch or
            # reflection streams, which stay open for as long as their clients
            # like and would hold the exit (and a restart) for the whole grace.
            await self.server.stop(None)
        await stopping
        idle.cancel()
        if self.heap_trimmer is not None:
            self.heap_trimmer.stop()
        if self.replies is not None:
            self.replies.close()
        if self.side is not None:
            self.side.close()
        else:
            assert self.link is not None
            await self.link.close()
        for path, identity in self._unix_sockets:
            # Only our own socket: once this server stopped listening (at the
            # start of the grace period), another one may have claimed the path.
            with contextlib.suppress(FileNotFoundError):
                st = path.lstat()
                if (st.st_dev, st.st_ino) == identity:
                    path.unlink()
        log.info("ckpt stopped: data_dir=%s", self.config.data_dir.resolve())


# sockaddr_un.sun_path is 108 bytes on Linux, the last kept for a NUL.
_MAX_UNIX_PATH_BYTES = 107


def _check_unix_path_size(path: str) -> None:
    size = len(os.fsencode(path))
    if size > _MAX_UNIX_PATH_BYTES:
        raise Unavailable(
            f"cannot listen on unix:{path}: the path is {size} bytes, over the {_MAX_UNIX_PATH_BYTES} a unix"
            " socket's address holds (sun_path); give --listen a shorter unix: path (or a shorter --data-dir)"
        )


def _claim_unix_socket(path: Path) -> None:
    """Refuse a socket path another live server answers on; remove a stale one.

    gRPC would otherwise unlink and rebind it silently, stealing the address.
    """
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        return
    if not stat.S_ISSOCK(mode):
        # connect() to a regular file is refused as a dead socket's is: a
        # mistyped path must not cost the user that file.
        raise Unavailable(f"cannot listen on unix:{path}: it exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        path.unlink(missing_ok=True)  # left behind by a process that died
        return
    finally:
        probe.close()
    raise Unavailable(f"another server is listening on unix:{path}")


def reachable_from_other_hosts(address: str) -> bool:
    """Whether a host:port listen address may take connections from other machines (not loopback only)."""
    host_port = None if address.startswith("unix") else _host_and_port(address)
    if host_port is None:
        return False
    try:
        ips = [ip for _, ip in tcp_addresses_of(*host_port)]
    except OSError:
        return True  # unknown: say so rather than stay quiet
    return not all(ipaddress.ip_address(ip.partition("%")[0]).is_loopback for ip in ips)


def tcp_addresses_of(host: str, port: int) -> list[tuple[int, str]]:
    """The (address family, IP) a listen host stands for, as gRPC resolves it; OSError if it does not resolve."""
    with contextlib.suppress(ValueError):
        ip = ipaddress.ip_address(host)
        return [(socket.AF_INET6 if ip.version == 6 else socket.AF_INET, host)]
    if host == "localhost":  # gRPC's resolver gives both loopbacks, whatever /etc/hosts says (RFC 6761)
        return [(socket.AF_INET6, "::1"), (socket.AF_INET, "127.0.0.1")]
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys((family, str(sockaddr[0])) for family, _, _, _, sockaddr in infos))


def _host_and_port(address: str) -> tuple[str, int] | None:
    """``host:port`` (``[v6]:port`` too) as (host, port); None if it is not that shape."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.removeprefix("[").removesuffix("]"), int(port)


def _bind_error(family: int, ip: str, port: int) -> OSError | None:
    """What binding ``ip``:``port`` as gRPC binds (SO_REUSEADDR: TIME_WAIT is no owner) fails with, if it does."""
    probe = socket.socket(family, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((ip, port))
    except OSError as exc:
        return exc
    finally:
        probe.close()
    return None


def _why_unbindable(address: str) -> str | None:
    """Why gRPC could not bind ``host:port``, found by binding it ourselves (None if that works, or cannot say)."""
    host_port = _host_and_port(address)
    if host_port is None:
        return None
    host, port = host_port
    try:
        candidates = tcp_addresses_of(host, port)
    except OSError as exc:
        return f"{host} does not resolve ({exc.strerror or exc})"
    for family, ip in candidates:
        shown = f"[{ip}]:{port}" if family == socket.AF_INET6 else f"{ip}:{port}"
        if (failed := _bind_error(family, ip, port)) is not None:
            if failed.errno == errno.EADDRINUSE:
                return f"{shown} is in use (another process listens there)"
            return f"{shown}: {failed.strerror or failed}"
    return None


def _claim_tcp_name(address: str) -> None:
    """Refuse ``host:port`` when another socket holds any address the host name stands for.

    gRPC listens on a name that resolves to several addresses (``localhost``:
    ::1 and 127.0.0.1) if it can bind any one of them, and only logs the rest:
    with 127.0.0.1:P held by another server, ``--listen localhost:P`` would
    serve on ::1 alone, and a client dialing 127.0.0.1:P would reach the other
    server. An address literal needs no check (gRPC fails to bind it), nor
    does port 0 (a free port). An address this machine lacks (::1 without
    IPv6) is skipped, as gRPC skips it.
    """
    host_port = _host_and_port(address)
    if host_port is None or not host_port[0] or not 0 < host_port[1] <= 65535:
        return  # not host:port: gRPC judges it
    host, port = host_port
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(host)
        return
    try:
        candidates = tcp_addresses_of(host, port)
    except OSError:
        return  # gRPC says what it cannot resolve
    for family, ip in candidates:
        exc = _bind_error(family, ip, port)
        if exc is not None and exc.errno == errno.EADDRINUSE:  # other errors (no ::1 here): gRPC skips it too
            shown = f"[{ip}]" if family == socket.AF_INET6 else ip
            raise Unavailable(
                f"cannot listen on {address}: {shown}:{port} is in use (another process listens there),"
                f" and {host} stands for it; gRPC would listen on {host}'s other addresses only"
            )


def serve(config: ServeConfig) -> int:
    """Run until SIGTERM or SIGINT (exit code 0), or until the store stops taking writes (1)."""
    if config.workers > 1:
        from .workers import serve_workers  # the parent of several serving processes

        return serve_workers(config)
    try:
        loop_factory = event_loop_factory(config.event_loop)
    except Unavailable as exc:
        log.error("ckpt cannot start: %s", exc)
        return 1
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(serve_async(config))


#: What ``ServeConfig.event_loop`` may name. uvloop serves the same RPCs with
#: less CPU: side by side on the 2-core VM (`bench.sidecar_ab`, 8 rounds of 64
#: clients), unary merges/s 1.12x asyncio's (higher in every round), server
#: CPU per merge 744 us against 871, per echo call 448 against 518.


def event_loop_factory(event_loop: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes a new event loop of the kind ``event_loop`` names (one of EVENT_LOOPS).

    Unavailable, naming the way out, if that is uvloop and it is not installed.
    """
    if event_loop == "asyncio":
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError:
        raise Unavailable(
            "event_loop is uvloop, which is not installed here (pip install uvloop);"
            " --event-loop asyncio runs on the standard library's loop"
        ) from None
    return uvloop.new_event_loop


async def serve_async(
    config: ServeConfig,
    *,
    worker: int | None = None,
    serving: Callable[[], None] | None = None,
    lock_fd: int | None = None,
) -> int:
    """Serve until SIGTERM/SIGINT; ``worker``: as SidecarServer's; ``serving`` is called once it serves;
    ``lock_fd``: as StoreLink.start's."""
    stop = asyncio.Event()
    with _stopped_by_signals(asyncio.get_running_loop(), stop):
        link = None
        try:
            if config.store_process:
                link = await StoreLink.start(config, worker=worker, lock_fd=lock_fd)
            sidecar = SidecarServer(config, worker=worker, link=link)
        except StoreError as exc:
            if link is not None:
                await link.close()
            log.error("ckpt cannot start: %s", exc)
            return 1
        try:
            await sidecar.start()
            if serving is not None:
                serving()
            with serving_gc():
                # A store that stopped taking writes is reopened by restarting: exit
                # (1, so that a supervisor restarts it) rather than serve reads only.
                waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(sidecar.writes_stopped.wait())]
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                for wait in waits:
                    wait.cancel()
        finally:
            await sidecar.stop()
    return 1 if sidecar.failed else 0  # also if the last commit, at close, failed


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def _stopped_by_signals(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> Iterator[None]:
    """SIGTERM and SIGINT set ``stop`` while this lasts; from its end on, both are ignored.

    Not ``loop.add_signal_handler``: removing such a handler resets the signal
    to its default action (for SIGTERM: terminate) before anything can ignore
    it, so a SIGTERM repeated by a process manager, or a second Ctrl-C, landing
    in that instant killed a sidecar that had just stopped cleanly: exit -15,
    not 0 (2 runs in 25 of a test sending SIGTERM every 0.5 ms). Here each
    signal goes from this handler straight to SIG_IGN. The wake-up fd is what
    asyncio's own handlers use too: a signal delivered to another thread while
    the loop waits in epoll still wakes it, so the Python handler runs at once.
    """
    with contextlib.ExitStack() as cleanup:  # undone in reverse: the signals are ignored first
        wake_r, wake_w = socket.socketpair()
        cleanup.enter_context(wake_r)
        cleanup.enter_context(wake_w)
        wake_r.setblocking(False)
        wake_w.setblocking(False)

        def drain() -> None:  # the byte only wakes the loop; the handler below does the work
            with contextlib.suppress(OSError):
                wake_r.recv(4096)

        def handler(signum: int, frame: object) -> None:
            loop.call_soon_threadsafe(stop.set)

        loop.add_reader(wake_r, drain)
        cleanup.callback(loop.remove_reader, wake_r)
        cleanup.callback(signal.set_wakeup_fd, signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False))
        cleanup.callback(_ignore_stop_signals)
        for sig in _STOP_SIGNALS:
            signal.signal(sig, handler)
            # As asyncio's handlers do: a system call the signal interrupts on
            # another thread (the writer's flush, gRPC's) is restarted, not
            # failed with EINTR (signal.signal makes them interruptible).
            signal.siginterrupt(sig, False)
        yield


def _ignore_stop_signals() -> None:
    # For good, not back to the default: the process is about to exit 0 (or
    # 1), and a late signal must not turn that into -15.
    for sig in _STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def wait_until_serving(target: str, timeout_seconds: float = 10.0, *, tls: ClientTLS | None = None) -> None:
    """Block until the health service at target answers SERVING (for tests and tools)."""
    deadline = time.monotonic() + timeout_seconds
    with open_channel(target, tls, [], aio=False) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                reply: Any = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"no serving sidecar at {target} after {timeout_seconds} s")
            time.sleep(0.05)
