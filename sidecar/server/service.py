"""The CheckpointService: each call's request turned into store calls, and their results into its reply.

It runs in the store process (storehost.py), which hands it the calls the
gRPC process forwards over the link; a failure ends a call with the status
``failures.py`` maps it to, counted in the metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn, Protocol, TypeVar, cast

import grpc
from google.protobuf import message_factory

from ckpt.store.v1 import records_pb2
from ckpt.v1 import service_pb2

from ..errors import InvalidArgument, Overloaded, StoreError, StoreFull, Unavailable
from ..limits import DEFAULT_MAX_MESSAGE_BYTES
from ..status import status_of
from ..store import PutResult, Store
from .convert import (
    get_response_pb,
    labels_arg,
    put_request,
    put_response_pb,
    request_parser,
    session_info_pb,
    time_filter_nanos,
    version_info_pb,
    versions_with_states_pb,
)
from .eventconvert import append_args, append_response_pb, event_query, read_response_pb
from .failures import (
    Failure,
    error_message,
    failed_inside,
    failure_of,
    internal_error,
    put_error_pb,
    put_stream_response,
)
from .getevents import events_query
from .heap import REPLY_PAGE_BYTES
from .inflight import InFlight
from .masking import INLINE_MASK_MAX_STATE_BYTES, Masks, mask_paths
from .methods import PUT_METHOD, RECORD_BLOB_METHOD, SERVICE, UNARY_METHODS
from .metrics import Metrics
from .storegets import StoreGets

log = logging.getLogger("ckpt")
T = TypeVar("T")

# PutStream batches a stream's reader may queue before their answers are sent,
# and their states' bytes: without a byte bound a stream of large states held
# nearly all it sent in memory (3,000 x 300 KB: 887 MiB resident), since the
# network outruns the writer. A batch is read alone when none is in flight.
_STREAM_BATCHES_AHEAD = 64
STREAM_BYTES_AHEAD = 64 * 1024 * 1024
# A stream's write that finds the store's write queue full retries after 1 ms, backing off to this.
_ROOM_POLL_MAX_SECONDS = 0.05

_STREAM_STOPPED = (
    "the sidecar is shutting down: every batch answered on this stream is committed, later ones were not"
    " read; resend them (with the same request ids) once it is back"
)

#: What Put answers: (None, "", (), reply bytes) or (status, details, trailers, b"").
PutAnswer = Callable[[grpc.StatusCode | None, str, tuple[tuple[str, str], ...], bytes], None]


class CallContext(Protocol):
    """What the service uses of a call's context (as of grpc.aio.ServicerContext): ``abort`` ends the
    call with a status, by raising."""

    async def abort(self, code: grpc.StatusCode, details: str, trailing_metadata: Any = ()) -> Any: ...


class CheckpointService:
    """Every call runs on the store process's event loop.

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
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self._store = store
        self._masks = Masks(store)
        #: Said after a size error: where the store's max_state_bytes comes from (a client cannot see it).
        self._state_limit_origin = state_limit_origin
        #: Listing replies stop short of this many bytes (0: no limit): what fits a reply.
        self._max_page_bytes = max_page_bytes
        self._max_message_bytes = max_message_bytes  # a PutStreamResponse's bound (put_stream_response)
        self._gets = StoreGets(store, self._masks, max_page_bytes=max_page_bytes)
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

    async def _call(self, rpc: str, context: CallContext, fn: Callable[[], Awaitable[T]]) -> T:
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
            failure = self._failed_inside(rpc)
            await context.abort(failure.code, failure.details)
        finally:
            latency.observe(time.perf_counter() - start)
            self.calls.ended()
        raise AssertionError("unreachable: context.abort raises")

    async def _abort(self, rpc: str, context: CallContext, exc: StoreError) -> NoReturn:
        """End an RPC with the status a store error maps to, counting it; the head goes in a trailer."""
        code, details, trailers = self._failure(rpc, exc)
        await context.abort(code, details, trailing_metadata=trailers)
        raise AssertionError("unreachable: context.abort raises")

    def _failure(self, rpc: str, exc: StoreError) -> Failure:
        """The status, details and trailers a store error ends an RPC with (counted as an error)."""
        failure = failure_of(exc, state_limit_origin=self._state_limit_origin)
        self._metrics.errors.labels(rpc, failure.code.name).inc()
        return failure

    def _failed_inside(self, rpc: str) -> Failure:
        """After a bug (logged by the caller): INTERNAL, counted."""
        self._metrics.errors.labels(rpc, "INTERNAL").inc()
        return failed_inside(rpc)

    def put(self, raw: bytes, answer: PutAnswer) -> None:
        """Put without a coroutine: ``answer`` gets (None, "", (), reply bytes) or a failure's
        (status, details, trailers, b""), once, on this loop.

        The store process answers every call of a group commit in one loop turn; without a
        Task and four coroutines per call, a unary merge took ~7% less server CPU (759 against
        812 us, both processes, ``python -m ckpt.bench.sidecar_ab``, with the link's per-turn writes).
        A large MERGE patch is checked off the loop by the store (Store.asubmit), a large put encoded in the pool.
        """
        requests, latency = self._metrics.per_rpc("Put")
        requests.inc()
        self.calls.began()
        start = time.perf_counter()
        received = 0

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
                self._count_write(received, result)
                body = put_response_pb(result).SerializeToString()
            except Exception as exc:
                failed(exc)
            else:
                finish((None, "", (), body))

        try:
            request = cast(service_pb2.PutRequest, _PUT_PARSER(raw))
            received = len(request.state)
            write = put_request(request)
            self._store.asubmit(write, encode_on=self._blocking).add_done_callback(done)
        except Exception as exc:
            failed(exc)

    def count_served(self, rpc: str, seconds: float, state_bytes: int, *, cached: bool) -> None:
        """Count a call the gRPC process answered itself (a Get, a ReadEvents), from its reply cache
        (``cached``) or read from LMDB there (its metrics are this process's)."""
        requests, latency = self._metrics.per_rpc(rpc)
        requests.inc()
        latency.observe(seconds)
        self._metrics.bytes_out.inc(state_bytes)
        if cached:
            self._metrics.reply_cache_hits.inc()
        else:
            self._metrics.read_by_grpc_process.labels(rpc).inc()

    def count_blob(self, rpc: str, code: str, seconds: float) -> None:
        """Count a blob call the gRPC process served (PutBlob, GetBlob), ended with status ``code``."""
        requests, latency = self._metrics.per_rpc(rpc)
        requests.inc()
        latency.observe(seconds)
        if code != "OK":
            self._metrics.errors.labels(rpc, code).inc()

    def count_store_full(self, error: str) -> None:
        """Count a write the gRPC process refused for want of disk space (a PutBlob's bytes) among the
        store's full writes (ckpt_store_full_writes_total), and log it as those are."""
        self._store.blob_files.count_full(StoreFull(error))

    def reply_cache_size(self, size_bytes: int, entries: int, advanced: int) -> None:
        """The gRPC process's reply cache's size and the heads it read by advancing a kept reader, as it
        last reported them (its metrics are this process's)."""
        self._metrics.reply_cache = (size_bytes, entries, advanced)

    async def Get(self, request: service_pb2.GetRequest, context: CallContext) -> service_pb2.GetResponse:
        async def run() -> service_pb2.GetResponse:
            store = self._store
            paths = mask_paths(request)
            query = events_query(request)
            if request.HasField("known_state_xxh3"):
                unchanged = await self._off_loop(functools.partial(self._gets.unchanged, request, query))
                if unchanged is not None:
                    return unchanged
            if query is not None:
                both, page = await self._off_loop(functools.partial(self._gets.read_with_events, request, paths, query))
                self._metrics.bytes_out.inc(len(both.state))
                reply = get_response_pb(both)
                reply.events.CopyFrom(read_response_pb(page))
                return reply
            got = store.get_cached(request.session_id, request.version)
            if got is None or (paths and len(got.state) > INLINE_MASK_MAX_STATE_BYTES):
                got = await self._off_loop(functools.partial(self._gets.read, request, paths, got))
            elif paths:
                got = self._masks.masked(request.session_id, got, paths)
            self._metrics.bytes_out.inc(len(got.state))
            return get_response_pb(got)

        return await self._call("Get", context, run)

    async def ListVersions(
        self, request: service_pb2.ListVersionsRequest, context: CallContext
    ) -> service_pb2.ListVersionsResponse:
        def run() -> service_pb2.ListVersionsResponse:
            store, sid, start = self._store, request.session_id, request.start_version
            size, token, limit = request.page_size, request.page_token, self._max_page_bytes
            if not request.include_states:
                page, token = store.list_versions(
                    sid, page_size=size, page_token=token, max_page_bytes=limit, start_version=start
                )
                return service_pb2.ListVersionsResponse(
                    versions=[version_info_pb(v) for v in page], next_page_token=token
                )
            got, token = store.list_versions(
                sid,
                page_size=size,
                page_token=token,
                max_page_bytes=limit,
                include_states=True,
                start_version=start,
                target_page_bytes=REPLY_PAGE_BYTES,
            )
            versions = versions_with_states_pb(got, as_suffixes=request.states_as_suffixes)
            self._metrics.bytes_out.inc(sum(len(v.state) + len(v.state_suffix) for v in versions))
            return service_pb2.ListVersionsResponse(versions=versions, next_page_token=token)

        return await self._call("ListVersions", context, lambda: self._off_loop(run))

    async def ListSessions(
        self, request: service_pb2.ListSessionsRequest, context: CallContext
    ) -> service_pb2.ListSessionsResponse:
        def run() -> service_pb2.ListSessionsResponse:
            page, token = self._store.list_sessions(
                page_size=request.page_size,
                page_token=request.page_token,
                label_filter=labels_arg(request.label_filter, "label_filter"),
                updated_after_nanos=time_filter_nanos(request, "updated_after"),
                updated_before_nanos=time_filter_nanos(request, "updated_before"),
                max_page_bytes=self._max_page_bytes,
                session_id_prefix=request.session_id_prefix,
            )
            return service_pb2.ListSessionsResponse(sessions=[session_info_pb(s) for s in page], next_page_token=token)

        return await self._call("ListSessions", context, lambda: self._off_loop(run))

    async def Fork(self, request: service_pb2.ForkRequest, context: CallContext) -> service_pb2.ForkResponse:
        def run() -> service_pb2.ForkResponse:
            info = self._store.fork(
                request.session_id,
                request.version,
                request.new_session_id,
                labels=labels_arg(request.labels, "labels"),
                copy_events=request.copy_events,
            )
            return service_pb2.ForkResponse(session=session_info_pb(info))

        return await self._call("Fork", context, lambda: self._off_loop(run))

    async def DeleteSession(
        self, request: service_pb2.DeleteSessionRequest, context: CallContext
    ) -> service_pb2.DeleteSessionResponse:
        def run() -> service_pb2.DeleteSessionResponse:
            versions, events = self._store.delete_session_counts(request.session_id)
            return service_pb2.DeleteSessionResponse(deleted_versions=versions, deleted_events=events)

        return await self._call("DeleteSession", context, lambda: self._off_loop(run))

    async def RegisterType(
        self, request: service_pb2.RegisterTypeRequest, context: CallContext
    ) -> service_pb2.RegisterTypeResponse:
        def run() -> service_pb2.RegisterTypeResponse:
            names = self._store.register_types(request.file_descriptor_set)
            return service_pb2.RegisterTypeResponse(message_types=names)

        return await self._call("RegisterType", context, lambda: self._off_loop(run))

    async def record_blob(self, commit: records_pb2.BlobCommit, context: CallContext) -> service_pb2.PutBlobResponse:
        """A PutBlob the gRPC process received (blobstreams.py): its file moved into place and its record
        committed. Not counted here: the gRPC process reports every PutBlob, however it ends (count_blob)."""

        def run() -> service_pb2.PutBlobResponse:
            info = self._store.record_blob(commit)
            self._metrics.bytes_in.inc(commit.size_bytes)
            return service_pb2.PutBlobResponse(sha256=info.sha256, size_bytes=info.size_bytes, uri=info.uri)

        self.calls.began()
        try:
            return await self._off_loop(run)
        except StoreError as exc:  # the gRPC process ends the PutBlob with it (a bug: INTERNAL, storehost.py)
            code, details, trailers = failure_of(exc, state_limit_origin=self._state_limit_origin)
            await context.abort(code, details, trailing_metadata=trailers)
            raise AssertionError("unreachable: context.abort raises") from None
        finally:
            self.calls.ended()

    async def AppendEvents(
        self, request: service_pb2.AppendEventsRequest, context: CallContext
    ) -> service_pb2.AppendEventsResponse:
        # Queued as the unary Puts are (Store.asubmit's path): into the loop's batch, so appends share
        # group commits with the Puts; a full write queue is UNAVAILABLE at once, for the client to retry.
        async def run() -> service_pb2.AppendEventsResponse:
            events, put = append_args(request)
            result = await self._store.aappend_events(
                request.session_id,
                events,
                put=put,
                request_id=request.request_id,
                expected_last_seq=request.expected_last_seq if request.HasField("expected_last_seq") else None,
            )
            self._metrics.bytes_in.inc(request.ByteSize())
            if result.put is not None:
                self._count_write(0, result.put)
            return append_response_pb(result)

        return await self._call("AppendEvents", context, run)

    async def ReadEvents(
        self, request: service_pb2.ReadEventsRequest, context: CallContext
    ) -> service_pb2.ReadEventsResponse:
        def run() -> service_pb2.ReadEventsResponse:
            page = self._store.read_events(
                request.session_id, event_query(request), max_page_bytes=self._max_page_bytes
            )
            return read_response_pb(page)

        return await self._call("ReadEvents", context, lambda: self._off_loop(run))

    async def PutStream(
        self, request_iterator: AsyncIterator[service_pb2.PutStreamRequest], context: CallContext
    ) -> AsyncGenerator[service_pb2.PutStreamResponse, None]:
        self.calls.began()
        try:
            async with contextlib.aclosing(self._put_stream(request_iterator, context)) as responses:
                async for response in responses:
                    yield response
        finally:
            self.calls.ended()

    async def _put_stream(
        self, request_iterator: AsyncIterator[service_pb2.PutStreamRequest], context: CallContext
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
                                items.append(internal_error("PutStream", exc))
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
                            outcome = internal_error("PutStream", exc)
                    if isinstance(outcome, StoreError):
                        self._metrics.errors.labels("PutStream", status_of(outcome).name).inc()
                        message = error_message(outcome, state_limit_origin=self._state_limit_origin)
                        results.append(service_pb2.PutResult(error=put_error_pb(outcome, message)))
                    else:
                        self._count_write(size, outcome)
                        results.append(service_pb2.PutResult(response=put_response_pb(outcome)))
                async with room:
                    ahead[0] -= 1
                    ahead[1] -= sum(sizes)
                    room.notify_all()
                latency.observe(time.perf_counter() - read_at)
                yield put_stream_response(results, batch_id, self._max_message_bytes)
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
        request = await self._store.aencode_put(put_request(msg), self._blocking)  # a large one, in the pool
        delay_seconds = 0.001
        while True:
            try:
                return self._store.asubmit(request)
            except Overloaded:
                await asyncio.sleep(delay_seconds)
                delay_seconds = min(2 * delay_seconds, _ROOM_POLL_MAX_SECONDS)

    def parsing_unary(
        self, rpc: str, method: Callable[[Any, CallContext], Awaitable[T]], parse: Callable[[bytes], Any]
    ) -> Callable[[bytes, CallContext], Awaitable[T]]:
        """``method`` taking the request's bytes: a request that does not parse ends the call
        INVALID_ARGUMENT through ``_call`` (counted and timed as any other call)."""

        async def handle(raw: bytes, context: CallContext) -> T:
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


def _retrieve_outcome(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


async def _raise(error: Exception) -> NoReturn:
    raise error


_PUT_PARSER = request_parser(service_pb2.PutRequest)

#: What handles a unary call's request bytes, and what serializes its reply.
UnaryHandler = tuple[Callable[[bytes, CallContext], Awaitable[Any]], Callable[[Any], bytes]]


def unary_handlers(service: CheckpointService) -> dict[int, UnaryHandler]:
    """By link method number (an index of UNARY_METHODS), every unary method but Put (``service.put``):
    what handles a call's request bytes, and what serializes its reply."""
    out: dict[int, UnaryHandler] = {}
    for number, name in enumerate(UNARY_METHODS):
        if number == PUT_METHOD:
            continue
        method = SERVICE.methods_by_name[name]
        parse = request_parser(message_factory.GetMessageClass(method.input_type))
        serialize = message_factory.GetMessageClass(method.output_type).SerializeToString
        out[number] = (service.parsing_unary(name, getattr(service, name), parse), serialize)
    record = service.parsing_unary("PutBlob", service.record_blob, request_parser(records_pb2.BlobCommit))
    out[RECORD_BLOB_METHOD] = (record, service_pb2.PutBlobResponse.SerializeToString)
    return out
