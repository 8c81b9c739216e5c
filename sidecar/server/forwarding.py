"""The gRPC process's handlers: each call's bytes forwarded to the store process, a Get answered from the
reply cache when it can be, a small ReadEvents read here, and a server extension's methods."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import grpc
import grpc.aio
from google.protobuf.message import DecodeError

from ckpt.v1 import service_pb2

from ..errors import InvalidArgument
from ..store import EventQuery, Store
from .extension import BytesHandler, ServerExtension
from .failures import abort_with
from .getevents import events_part, events_query, state_part
from .inlineevents import INLINE_EVENTS_BOUND, inline_read_events
from .knownstate import answered_here, known_state, known_state_get
from .methods import GET_METHOD, PUT_METHOD, READ_EVENTS_METHOD, SERVICE_NAME, UNARY_METHODS, link_method_numbers
from .replycache import ReplyCache
from .storelink import StoreLink


def add_forwarded_service(
    link: StoreLink,
    server: grpc.aio.Server,
    replies: ReplyCache | None = None,
    served_here: dict[str, grpc.RpcMethodHandler] | None = None,
    *,
    reader: Store | None = None,
    max_page_bytes: int = 0,
) -> None:
    """Serve the CheckpointService by forwarding each call's bytes to the store process;
    with ``replies``, a Get it holds the answer to is answered here; with ``reader`` (read-only), a small
    ReadEvents is read here, its pages ending short of ``max_page_bytes`` as the store process's do
    (inlineevents.py); ``served_here``: methods this process serves itself (blobstreams.py)."""
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(_forwarder(link, i, batched=i == PUT_METHOD))
        for i, name in enumerate(UNARY_METHODS)
    }
    get = _forwarder(link, GET_METHOD, batched=False)
    if replies is not None:
        gauges = _ReplyCacheGauges(link, replies)
        get = _cached_get(get, link, replies, gauges.changed, reader, max_page_bytes)
    elif reader is not None:
        get = known_state_get(get, link, reader, max_page_bytes=max_page_bytes)
    handlers["Get"] = grpc.unary_unary_rpc_method_handler(get)
    if reader is not None:
        handlers["ReadEvents"] = grpc.unary_unary_rpc_method_handler(
            inline_read_events(
                _forwarder(link, READ_EVENTS_METHOD, batched=False), link, reader, max_page_bytes=max_page_bytes
            )
        )
    handlers["PutStream"] = grpc.stream_stream_rpc_method_handler(link.stream)  # raw bytes both ways
    handlers.update(served_here or {})
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


def _forwarder(
    link: StoreLink, method: int, *, batched: bool
) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]:
    """A unary handler that sends the request's bytes to the store process as a call of ``method``
    (an index of UNARY_METHODS, or an extension's link method) and answers with its reply or status.
    ``batched``: on the link Puts take, whose reading the store process holds while a batch gathers."""

    async def forward(raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        # Until its answer is sent: a stopping sidecar waits for that much (inflight.py). Counted after the
        # stop began, it is refused (StoreLink.call), and that answer is waited for instead.
        link.calls.until_done(context)
        status, meta, body = await link.call(method, raw, batched=batched)
        if status:
            # The abort's exception and this frame end in a reference cycle inside grpc.aio, freed only
            # by the collector (rare here: gctune.py): it must not keep the request (up to the message
            # limit) alive until then, once per refused call.
            del raw, body
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
        self._sent: tuple[int, int, int] | None = None
        self._pending: asyncio.TimerHandle | None = None
        self._send()

    def changed(self) -> None:
        if self._pending is None:
            self._pending = asyncio.get_running_loop().call_later(self._interval_seconds, self._send)

    def _send(self) -> None:
        self._pending = None
        size = (self._replies.size_bytes, len(self._replies), self._replies.advanced)
        if size != self._sent:
            self._sent = size
            self._link.gauges(reply_cache_bytes=size[0], reply_cache_entries=size[1], reply_cache_advanced=size[2])


def _cached_get(
    forward: Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]],
    link: StoreLink,
    replies: ReplyCache,
    changed: Callable[[], None],
    reader: Store | None = None,
    max_page_bytes: int = 0,
) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]:
    """A Get ``replies`` answers, else ``forward``ed (and its reply kept when it asked for the latest);
    ``changed`` is called after each Get that may have changed what ``replies`` holds. A Get with events
    is answered here only with ``reader`` to read them (within INLINE_EVENTS_BOUND, pages ending short of
    ``max_page_bytes`` as the store process's do), else forwarded whole."""

    async def get(raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        start = time.perf_counter()
        request: service_pb2.GetRequest | None
        known = None
        try:
            request = service_pb2.GetRequest.FromString(raw)
            query = events_query(request)
            known = known_state(request)
        except (DecodeError, InvalidArgument):
            request = query = None  # the store process answers INVALID_ARGUMENT, naming what is wrong
        with_events = query is not None
        paths = request.field_mask.paths if request is not None else ()
        generation = None
        if request is not None and known is not None and reader is not None:
            body = answered_here(reader, link, request, known, query, max_page_bytes=max_page_bytes, start=start)
            if body is not None:
                return body
        if request is not None and (reader is not None or not with_events):
            answered = _answer(replies, reader, request, query, max_page_bytes)
            if answered is not None:
                body, state_bytes, cached, may_change = answered
                if may_change:
                    changed()
                link.served(GET_METHOD, time.perf_counter() - start, state_bytes, cached=cached)
                return body
        if request is not None and paths:
            generation = replies.types_generation()
        try:
            body = await forward(raw, context)
        finally:
            # A miss may have dropped a stale reply, and one may be kept next; the report reads
            # the size a while later, after both, even if the forwarded call failed.
            changed()
        # A masked reply is kept apart from the whole ones; one naming a known state may have left it out.
        if request is not None and not request.version and not request.HasField("known_state_xxh3"):
            try:
                kept = state_part(body) if with_events else body
            except DecodeError:  # a bug; the Get itself is answered all the same
                return body
            if paths:
                if generation is not None:
                    replies.remember_masked(request.session_id, paths, kept, generation)
            else:
                replies.remember(request.session_id, kept)
        return body

    return get


def _answer(
    replies: ReplyCache,
    reader: Store | None,
    request: service_pb2.GetRequest,
    query: EventQuery | None,
    max_page_bytes: int,
) -> tuple[bytes, int, bool, bool] | None:
    """A Get answered in this process: its reply, its state's size, whether from a reply kept, and whether
    what ``replies`` holds may have changed; None: forward it. With ``query``, the state comes as a Get's
    would and its events are read with it (one read transaction) when the state is read here, else after
    the reply kept was found to be the head's."""
    sid, version, paths = request.session_id, request.version, request.field_mask.paths
    page = None
    if paths:
        masked = replies.masked(sid, version, paths, query, max_page_bytes=max_page_bytes)
        if masked is None:
            return None
        body, state_bytes, cached, page = masked
        may_change = True
    else:
        hit = replies.answer(sid, version)
        if hit is not None:
            (body, state_bytes), cached, may_change = hit, True, False
        else:
            read = replies.read(sid, version, query, max_page_bytes=max_page_bytes)
            if read is None:
                return None
            (body, state_bytes, page), cached, may_change = read, False, True
    if query is None:
        return body, state_bytes, cached, may_change
    if page is None:
        assert reader is not None
        try:
            page = reader.read_events(
                sid, query, max_page_bytes=max_page_bytes, bound=INLINE_EVENTS_BOUND, beside_bytes=state_bytes
            )
        except Exception:  # past the bound, or anything the store process answers with its status
            return None
    return body + events_part(page), state_bytes, cached, may_change


def add_extension(extension: ServerExtension, link: StoreLink, server: grpc.aio.Server) -> None:
    """Serve ``extension``'s gRPC handlers, their ``forward`` reaching its link methods (extension.py)."""
    numbers = link_method_numbers(extension)

    def forward(name: str) -> BytesHandler:
        if name not in numbers:
            raise ValueError(f"{name!r} is not one of the extension's link methods ({', '.join(numbers)})")
        # On the Puts' link: what it measures or does crosses the hop a write makes.
        return _forwarder(link, numbers[name], batched=True)

    server.add_generic_rpc_handlers(tuple(extension.grpc_handlers(forward)))
