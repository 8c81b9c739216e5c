"""The gRPC process's end of the link to its store process: its start, forwarding calls, its life."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any

import grpc

from ..errors import Unavailable
from .exitstatus import exit_status
from .failures import abort_with
from .inflight import InFlight
from .link import MAX_TAG, Frame, Kind
from .linkprotocol import LinkProtocol, link_frame_bytes
from .storespawn import StoreProcess, start_store_process

if TYPE_CHECKING:
    from ..config import ServeConfig
    from .extension import ServerExtension

log = logging.getLogger(__name__)

_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]
_EXITED = "the sidecar's store process exited; retry with the same request_id"
_STOPPING = "the sidecar is stopping; retry with the same request_id"
#: Calls this process answers itself reach the store process's metrics together, this long after the
#: first of them: a frame per Get cost the link a write and the store process a wake-up, ~40 us of a
#: ~600 us Get on a 2-core VM, and a metric's scrape is seconds apart anyway.
SERVED_REPORT_SECONDS = 0.05


class _LinkProtocol(LinkProtocol):
    peer = "the store process"

    def __init__(self, *, max_frame_bytes: int) -> None:
        super().__init__(max_frame_bytes=max_frame_bytes)
        self.first: asyncio.Future[Frame | None] = asyncio.get_running_loop().create_future()
        self.pending: dict[int, asyncio.Future[tuple[int, Mapping[str, Any], bytes]]] = {}
        #: Each open stream's frames from the store process (WANT, OUT, END), by tag.
        self.streams: dict[int, asyncio.Queue[Frame]] = {}
        self.on_writes_stopped: Callable[[str], None] = lambda reason: None
        self.on_lost: Callable[[], None] = lambda: None

    def not_frames(self) -> None:
        assert self.transport is not None
        self.transport.abort()

    def frame_received(self, frame: Frame) -> None:
        if frame.kind is Kind.REPLY:
            future = self.pending.pop(frame.tag, None)
            if future is not None and not future.done():  # not if its call was cancelled
                future.set_result((frame.status, frame.meta, frame.body))
        elif frame.kind in (Kind.READY, Kind.FAILED):
            if not self.first.done():
                self.first.set_result(frame)
        elif frame.kind in (Kind.STREAM_WANT, Kind.STREAM_OUT, Kind.STREAM_END):
            stream = self.streams.get(frame.tag)
            if stream is not None:  # not if the client went away meanwhile
                stream.put_nowait(frame)
        elif frame.kind is Kind.WRITES_STOPPED:
            self.on_writes_stopped(str(frame.meta.get("reason", "")))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.first.done():
            self.first.set_result(None)
        for future in self.pending.values():
            if not future.done():
                future.set_result((_UNAVAILABLE, {"details": _EXITED}, b""))
        self.pending.clear()
        for stream in self.streams.values():
            stream.put_nowait(Frame(Kind.STREAM_END, status=_UNAVAILABLE, meta={"details": _EXITED}))
        self.on_lost()


class StoreLink:
    """Calls to the CheckpointService in the store process, and that process's life."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        protocol: _LinkProtocol,
        unheld: _LinkProtocol,
        metrics_address: str | None,
    ) -> None:
        self._process = process
        #: Puts, streams and everything but the other unary calls. The store process stops reading it
        #: while a batch of writes gathers and commits (Store.write_on_loop).
        self._protocol = protocol
        #: Every other unary call (reads, forks, deletes, listings): its reading is never held, so that a
        #: Get under write load is not kept waiting for a batch of Puts.
        self._unheld = unheld
        self._last_tag = 0
        self._closing = False
        #: Calls answered here not yet reported (served): (method, seconds, state bytes, cached).
        self._served: list[tuple[int, float, int, bool]] = []
        #: Blob calls served here not yet reported (served_blob): (rpc, status code's name, seconds).
        self._blobs: list[tuple[str, str, float]] = []
        #: Where the store process serves /metrics (None: off).
        self.metrics_address = metrics_address
        #: The store stopped taking writes, or its process ended unasked: the sidecar stops, exit 1.
        self.failed = False
        #: Called once, when ``failed`` becomes true.
        self.on_failed: Callable[[], None] = lambda: None
        #: Calls and streams forwarded and not yet answered.
        self.calls = InFlight()
        protocol.on_writes_stopped = self._writes_stopped
        protocol.on_lost = unheld.on_lost = self._lost

    @classmethod
    async def start(
        cls,
        config: ServeConfig,
        *,
        worker: int | None,
        lock_fd: int | None = None,
        extension: ServerExtension | None = None,
        started: StoreProcess | None = None,
    ) -> StoreLink:
        """Start the store process and wait until it serves; Unavailable with its reason if it cannot.

        ``started``: that process, started already for these arguments (storespawn.py), taken over here.

        ``extension``: the store process serves its link methods (extension.py).

        ``lock_fd``: the data directory's locked file, which a worker inherited from its parent: the
        store process keeps it open too, so that the lock is held while any process of the server
        lives, this store process (which may outlive its worker, finishing its commits) included.
        """
        if started is None:
            started = start_store_process(config, worker=worker, lock_fd=lock_fd, extension=extension)
        process = started.process
        link, unheld_link = started.take_links()
        loop = asyncio.get_running_loop()
        max_frame_bytes = link_frame_bytes(config.max_message_bytes)
        protocol = _LinkProtocol(max_frame_bytes=max_frame_bytes)
        unheld = _LinkProtocol(max_frame_bytes=max_frame_bytes)
        await loop.connect_accepted_socket(lambda: protocol, link)
        await loop.connect_accepted_socket(lambda: unheld, unheld_link)
        # The link closes when the process dies, whatever killed it: then first is None.
        first = await protocol.first
        if first is None or first.kind is Kind.FAILED:
            unheld.close()
            code = await loop.run_in_executor(None, process.wait)
            if first is None:
                raise Unavailable(f"the store process {exit_status(code)} before it served; see the log above")
            raise Unavailable(str(first.meta.get("error", "the store process could not start")))
        return cls(process, protocol, unheld, first.meta.get("metrics_address"))

    async def call(self, method: int, request: bytes, *, batched: bool) -> tuple[int, Mapping[str, Any], bytes]:
        """Forward one unary call: (0, {}, reply bytes) or (gRPC status code, {"details", "trailers"}, b"").

        ``batched``: a write the store process gathers into batches (a Put), sent on the link whose
        reading it holds meanwhile; every other call goes on the link it always reads.
        """
        protocol = self._protocol if batched else self._unheld
        # Once the stop began (frontend.stop), a call not counted before is refused unsent: the stop
        # cancels what is left once the calls it waits for are done, and a call sent now could be
        # committed and then cancelled, its client told it failed.
        if not protocol.is_open() or not self.calls.admits():
            return _UNAVAILABLE, {"details": _STOPPING}, b""
        tag = self._next_tag(protocol)
        future: asyncio.Future[tuple[int, Mapping[str, Any], bytes]] = asyncio.get_running_loop().create_future()
        protocol.pending[tag] = future
        self.calls.began()
        try:
            protocol.send(Frame(Kind.CALL, tag=tag, method=method, body=request))
            return await future
        finally:
            protocol.pending.pop(tag, None)
            self.calls.ended()

    async def stream(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        """Forward one PutStream: the client's messages as the store process asks for them, its answers back."""
        if not self._protocol.is_open() or not self.calls.admits():
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, "the sidecar is stopping; resend with the same request ids"
            )
        self.calls.until_done(context)
        tag = self._next_tag(self._protocol)
        frames: asyncio.Queue[Frame] = asyncio.Queue()
        self._protocol.streams[tag] = frames
        ended = False
        wants: asyncio.Queue[None] = asyncio.Queue()

        async def pump() -> None:
            # The client's next message only when asked: the store side bounds what it reads ahead.
            try:
                while True:
                    await wants.get()
                    try:
                        message = await anext(aiter(requests), None)
                    except grpc.RpcError:
                        self._send(Frame(Kind.STREAM_CANCEL, tag=tag))
                        return
                    if message is None:
                        self._send(Frame(Kind.STREAM_HALF_CLOSE, tag=tag))
                        return
                    self._send(Frame(Kind.STREAM_IN, tag=tag, body=message))
            except asyncio.CancelledError:
                pass

        reader = asyncio.create_task(pump())
        try:
            self._send(Frame(Kind.STREAM_OPEN, tag=tag))
            while True:
                frame = await frames.get()
                if frame.kind is Kind.STREAM_WANT:
                    wants.put_nowait(None)
                elif frame.kind is Kind.STREAM_OUT:
                    yield frame.body
                else:
                    ended = True
                    if frame.status:
                        await abort_with(context, frame.status, frame.meta)
                    return
        finally:
            reader.cancel()
            if not ended:
                self._send(Frame(Kind.STREAM_CANCEL, tag=tag))
            self._protocol.streams.pop(tag, None)

    def _next_tag(self, protocol: _LinkProtocol) -> int:
        """A tag no call or stream under way on ``protocol``'s link has: 1 to MAX_TAG, then from 1 again.

        A frame's tag is a u32, and a sidecar forwarding 5,000 calls a second
        uses them all up in ten days: counting on past the last made every
        forwarded call fail from then on (the header would not pack). A stream
        may stay open for as long as its client likes, so a tag still in use
        when the count comes round again is skipped.
        """
        while True:
            self._last_tag = tag = self._last_tag % MAX_TAG + 1
            if tag not in protocol.pending and tag not in protocol.streams:
                return tag

    def served(self, method: int, seconds: float, state_bytes: int, *, cached: bool) -> None:
        """Tell the store process's metrics of a call this process answered itself (``cached``: from
        its reply cache; else read from LMDB here), within SERVED_REPORT_SECONDS."""
        self._schedule_report()
        self._served.append((method, seconds, state_bytes, cached))

    def served_blob(self, rpc: str, code: str, seconds: float) -> None:
        """Tell the store process's metrics of a blob call this process served (``rpc``: PutBlob or
        GetBlob) that ended with status ``code`` (a grpc.StatusCode's name), within SERVED_REPORT_SECONDS."""
        self._schedule_report()
        self._blobs.append((rpc, code, seconds))

    def _schedule_report(self) -> None:
        if not self._served and not self._blobs:
            asyncio.get_running_loop().call_later(SERVED_REPORT_SECONDS, self._report_served)

    def _report_served(self) -> None:
        if self._served or self._blobs:
            meta: dict[str, Any] = {"calls": self._served}
            if self._blobs:
                meta["blobs"] = self._blobs
            self._served, self._blobs = [], []
            self._send(Frame(Kind.SERVED, meta=meta))

    def store_full(self, error: str) -> None:
        """Tell the store process's metrics (and log) of a write this process refused for want of disk
        space (a PutBlob's bytes): ``error``, what the client was told."""
        self._send(Frame(Kind.SERVED, meta={"calls": [], "store_full": [error]}))

    def gauges(self, *, reply_cache_bytes: int, reply_cache_entries: int, reply_cache_advanced: int) -> None:
        """Tell the store process's metrics the size of this process's reply cache, and how many heads it
        read by advancing a kept reader so far."""
        self._send(
            Frame(
                Kind.GAUGES,
                meta={
                    "reply_cache_bytes": reply_cache_bytes,
                    "reply_cache_entries": reply_cache_entries,
                    "reply_cache_advanced": reply_cache_advanced,
                },
            )
        )

    def stop_calls(self) -> None:
        """On shutdown, first: from now on a call not already under way is answered UNAVAILABLE (retry
        with the same request_id) without reaching the store process."""
        self.calls.close()

    def stop_streams(self) -> None:
        """On shutdown: the store process's streams answer what they read and end UNAVAILABLE."""
        self._send(Frame(Kind.STOP_STREAMS))

    def _send(self, frame: Frame) -> None:
        self._protocol.send(frame)

    async def close(self) -> int:
        """Tell the store process to finish its calls, commit and exit; its exit code."""
        self._closing = True
        self._report_served()
        self._send(Frame(Kind.CLOSE))
        code = await asyncio.get_running_loop().run_in_executor(None, self._process.wait)
        self._protocol.close()
        self._unheld.close()
        if code:
            self._fail()
            log.error("the store process %s", exit_status(code))
        return code

    def _writes_stopped(self, reason: str) -> None:
        log.error("the store process stopped taking writes: %s", reason)
        self._fail()

    def _lost(self) -> None:
        # Both links call it as the process ends: logged once, and not after another failure's own line.
        if not self._closing and not self.failed:
            log.error("the store process ended; the sidecar stops (exit 1) for its supervisor to restart it")
            self._fail()

    def _fail(self) -> None:
        if not self.failed:
            self.failed = True
            with contextlib.suppress(Exception):
                self.on_failed()
