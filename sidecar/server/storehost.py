"""The sidecar's store process: the store and the CheckpointService, called over a link.

    python -m ckpt.sidecar.server.storehost FD [--unheld-fd FD] [--worker N]
    (a StoreHostSpec, pickled, on stdin: the ServeConfig and the server extension, if any)

Started by the sidecar's gRPC process (storespawn.py), never by hand. It
ignores SIGINT and SIGTERM (a Ctrl-C reaches the whole process group): it
stops when the gRPC process says so, or when the link closes because that
process died; either way it finishes the calls under way, commits what is
queued and closes LMDB.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import pickle
import signal
import socket
import sys
from collections.abc import AsyncIterator, Coroutine
from typing import Any, NoReturn

import grpc

from ..config import ServeConfig
from ..errors import StoreError, Unavailable
from .convert import stream_request_parser
from .extension import LinkMethod, ServerExtension
from .gctune import serving_gc
from .link import Frame, Kind, encode
from .linkprotocol import LinkProtocol, link_frame_bytes
from .loops import event_loop_factory
from .methods import PUT_METHOD, UNARY_METHODS, link_method_numbers
from .service import CheckpointService, UnaryHandler, unary_handlers
from .storeside import StoreSide
from .storespawn import StoreHostSpec

log = logging.getLogger(__name__)


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str, trailers: tuple[tuple[str, str], ...]) -> None:
        super().__init__(details)
        self.code, self.details, self.trailers = code, details, trailers


class _Context:
    """A call's context as CheckpointService uses it (service.CallContext): abort raises _Aborted."""

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: tuple[tuple[str, str], ...] = ()
    ) -> NoReturn:
        raise _Aborted(code, details, tuple(trailing_metadata))


class _HostProtocol(LinkProtocol):
    peer = "the sidecar's gRPC process"

    def __init__(self, *, max_message_bytes: int, closed: asyncio.Event | None = None) -> None:
        """``closed``: the event another link sets when it closes (either link closing ends the serving)."""
        super().__init__(max_frame_bytes=link_frame_bytes(max_message_bytes))
        #: The gRPC process sends no message larger (--max-message-bytes), and takes no link frame
        #: larger than one such message and its status: a larger reply is refused here, as gRPC would.
        self.max_message_bytes = max_message_bytes
        self.dispatch: dict[int, UnaryHandler] = {}
        #: A server extension's link methods, by number (methods.link_method_numbers).
        self.link_methods: dict[int, LinkMethod] = {}
        self.closed = asyncio.Event() if closed is None else closed
        self.calls: set[asyncio.Task[None]] = set()
        self.service: CheckpointService | None = None
        #: Each open stream's messages from the gRPC process (STREAM_IN, HALF_CLOSE, CANCEL), by tag.
        self.streams: dict[int, asyncio.Queue[Frame]] = {}

    def not_frames(self) -> None:
        self.closed.set()

    def frame_received(self, frame: Frame) -> None:
        if frame.kind is Kind.CALL:
            if frame.method == PUT_METHOD:
                self._put(frame)
            elif (answer := self.link_methods.get(frame.method)) is not None:
                self._answer(frame.tag, answer, frame.body)
            else:
                self._start(self._call(frame))
        elif frame.kind is Kind.STREAM_OPEN:
            self.streams[frame.tag] = asyncio.Queue()
            self._start(self._stream(frame.tag))
        elif frame.kind in (Kind.STREAM_IN, Kind.STREAM_HALF_CLOSE, Kind.STREAM_CANCEL):
            stream = self.streams.get(frame.tag)
            if stream is not None:
                stream.put_nowait(frame)
        elif frame.kind is Kind.SERVED:
            if self.service is not None:
                for method, seconds, state_bytes, cached in frame.meta["calls"]:
                    self.service.count_served(UNARY_METHODS[method], seconds, state_bytes, cached=cached)
                for rpc, code, seconds in frame.meta.get("blobs", ()):
                    self.service.count_blob(rpc, code, seconds)
                for error in frame.meta.get("store_full", ()):
                    self.service.count_store_full(error)
        elif frame.kind is Kind.GAUGES:
            if self.service is not None:
                meta = frame.meta
                self.service.reply_cache_size(
                    meta["reply_cache_bytes"], meta["reply_cache_entries"], meta["reply_cache_advanced"]
                )
        elif frame.kind is Kind.STOP_STREAMS:
            if self.service is not None:
                self.service.stop_streams()
        elif frame.kind is Kind.CLOSE:
            self.closed.set()

    def hold_input(self) -> None:
        """Read no more frames until release_input: a batch of writes waits for more (Store.write_on_loop)."""
        if self.is_open():
            assert self.transport is not None
            self.transport.pause_reading()

    def release_input(self) -> None:
        if self.is_open():
            assert self.transport is not None
            self.transport.resume_reading()

    def _start(self, call: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(call)
        self.calls.add(task)
        task.add_done_callback(self.calls.discard)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set()
        for stream in self.streams.values():  # nobody is left to send them anything
            stream.put_nowait(Frame(Kind.STREAM_CANCEL))

    def _put(self, frame: Frame) -> None:
        """A Put, answered from a callback (no Task)."""
        assert self.service is not None
        tag = frame.tag

        def answer(
            code: grpc.StatusCode | None, details: str, trailers: tuple[tuple[str, str], ...], body: bytes
        ) -> None:
            if code is None:
                self.send(Frame(Kind.REPLY, tag=tag, body=body))
            else:
                self.send(_failed(Kind.REPLY, tag, code, details, trailers))

        self.service.put(frame.body, answer)

    def _answer(self, tag: int, method: LinkMethod, body: bytes) -> None:
        """A call of an extension's link method, answered at once."""
        try:
            reply = method(body)
        except Exception:
            log.exception("a forwarded call failed")
            self.send(_failed(Kind.REPLY, tag, grpc.StatusCode.INTERNAL, _FAILED_INSIDE, ()))
        else:
            self.send(Frame(Kind.REPLY, tag=tag, body=reply))

    async def _call(self, frame: Frame) -> None:
        try:
            handle, serialize = self.dispatch[frame.method]
            body = serialize(await handle(frame.body, _Context()))
        except _Aborted as aborted:
            self.send(_failed(Kind.REPLY, frame.tag, aborted.code, aborted.details, aborted.trailers))
        except Exception:  # a bug: this call fails, the others go on (the gRPC process must get an answer)
            log.exception("a forwarded call failed")
            self.send(_failed(Kind.REPLY, frame.tag, grpc.StatusCode.INTERNAL, _FAILED_INSIDE, ()))
        else:
            if len(body) > self.max_message_bytes:
                self.send(_too_large(Kind.REPLY, frame.tag, len(body), self.max_message_bytes))
            else:
                self.send(Frame(Kind.REPLY, tag=frame.tag, body=body))

    async def _stream(self, tag: int) -> None:
        assert self.service is not None
        incoming = self.streams[tag]

        async def requests() -> AsyncIterator[Any]:
            while True:
                self.send(Frame(Kind.STREAM_WANT, tag=tag))
                frame = await incoming.get()
                if frame.kind is Kind.STREAM_HALF_CLOSE:
                    return
                if frame.kind is Kind.STREAM_CANCEL:
                    raise _ClientGone
                yield _parse_stream_request(frame.body)  # InvalidArgument ends the stream, as gRPC's deserializer

        try:
            async with contextlib.aclosing(self.service.PutStream(requests(), _Context())) as responses:
                async for response in responses:
                    body = response.SerializeToString()
                    if len(body) > self.max_message_bytes:
                        # The batch's writes are done, but their results cannot be sent: the
                        # stream ends as gRPC ends it in one process.
                        self.send(_too_large(Kind.STREAM_END, tag, len(body), self.max_message_bytes))
                        return
                    self.send(Frame(Kind.STREAM_OUT, tag=tag, body=body))
        except _Aborted as aborted:
            self.send(_failed(Kind.STREAM_END, tag, aborted.code, aborted.details, aborted.trailers))
        except Exception:
            log.exception("a forwarded PutStream failed")
            self.send(_failed(Kind.STREAM_END, tag, grpc.StatusCode.INTERNAL, _FAILED_INSIDE, ()))
        else:
            self.send(Frame(Kind.STREAM_END, tag=tag))
        finally:
            del self.streams[tag]


_FAILED_INSIDE = "the call failed inside the sidecar's store process; see its log"


def _failed(kind: Kind, tag: int, code: grpc.StatusCode, details: str, trailers: tuple[tuple[str, str], ...]) -> Frame:
    """A call's or stream's end with a status (storelink.abort_with ends the client's call with it)."""
    return Frame(
        kind, tag=tag, status=code.value[0], meta={"details": details, "trailers": [list(t) for t in trailers]}
    )


def _too_large(kind: Kind, tag: int, size: int, limit: int) -> Frame:
    """The status gRPC ends a call with when its reply is over the server's message limit.

    Word for word, so that clients read it as they do from a sidecar without a
    store process (the Python clients name the limit and the option).
    """
    details = f"SERVER: Sent message larger than max ({size} vs. {limit})"
    return _failed(kind, tag, grpc.StatusCode.RESOURCE_EXHAUSTED, details, ())


class _ClientGone(grpc.RpcError):  # type: ignore[misc]  # grpc is untyped
    """What a stream's requests raise once its client went away (PutStream stops reading then)."""


_parse_stream_request = stream_request_parser()


async def host(
    config: ServeConfig,
    fd: int,
    *,
    worker: int | None,
    unheld_fd: int | None = None,
    extension: ServerExtension | None = None,
) -> int:
    """Serve the link on ``fd`` (and the one on ``unheld_fd``, whose reading is never held) until it
    closes; with ``extension``, its link methods too."""
    loop = asyncio.get_running_loop()
    protocol = _HostProtocol(max_message_bytes=config.max_message_bytes)
    await loop.connect_accepted_socket(lambda: protocol, socket.socket(fileno=fd))
    protocols = [protocol]
    if unheld_fd is not None:
        unheld = _HostProtocol(max_message_bytes=config.max_message_bytes, closed=protocol.closed)
        await loop.connect_accepted_socket(lambda: unheld, socket.socket(fileno=unheld_fd))
        protocols.append(unheld)

    def writes_stopped(reason: str) -> None:
        protocol.send(Frame(Kind.WRITES_STOPPED, meta={"reason": reason}))

    try:
        side = StoreSide(
            config,
            worker=worker,
            on_writes_stopped=lambda reason: loop.call_soon_threadsafe(writes_stopped, reason),
            # The process to stop is `ckpt serve`, this one's parent, not this one.
            lock_holder=f"pid {os.getppid()} (ckpt serve; its store process is pid {os.getpid()})",
        )
    except (StoreError, OSError) as exc:  # OSError: a data directory that is a file, say
        protocol.send(Frame(Kind.FAILED, meta={"error": str(exc)}))
        return 1
    try:
        dispatch = unary_handlers(side.service)
        numbers = link_method_numbers(extension)
        link_methods = {numbers[name]: method for name, method in extension.link_methods().items()} if extension else {}
        for each in protocols:
            each.dispatch = dispatch
            each.link_methods = link_methods
            each.service = side.service
        # The writes come in on this loop and it has little else to do: it gathers each batch and hands it
        # to the writer whole, reading no more Puts meanwhile (the calls on the unheld link are read).
        side.store.write_on_loop(loop, hold_input=protocol.hold_input, release_input=protocol.release_input)
        side.start()
        protocol.send(Frame(Kind.READY, meta={"metrics_address": side.metrics_address}))
        with serving_gc():
            await protocol.closed.wait()
        # The gRPC process gave its calls its grace before it closed the link (or it died): the calls
        # still under way here get as long again. One stuck past that must not keep this process,
        # and with it the data directory's lock, alive for ever (a restart would be refused): the
        # store is closed regardless, committing every write queued, whether or not its call answered.
        try:
            await asyncio.wait_for(_calls_done(protocols, side), timeout=config.grace_seconds)
        except TimeoutError:
            log.warning(
                "calls were still under way %.1f s (--grace-seconds) after the link to the gRPC process"
                " closed; closing the store without them (the writes queued are committed)",
                config.grace_seconds,
            )
    finally:
        side.close()
    for each in protocols:
        each.close()
    return 1 if side.store.writes_stopped is not None else 0


async def _calls_done(protocols: list[_HostProtocol], side: StoreSide) -> None:
    calls: set[asyncio.Task[None]] = set()
    for each in protocols:
        calls |= each.calls
    if calls:
        await asyncio.wait(calls)  # their replies go out while the links are up
    await side.service.calls.idle.wait()  # and those of the Puts answered from callbacks (no Task)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    parser = argparse.ArgumentParser(prog="python -m ckpt.sidecar.server.storehost")
    parser.add_argument("fd", type=int)
    parser.add_argument("--unheld-fd", type=int)
    parser.add_argument("--worker", type=int)
    args = parser.parse_args(argv)
    spec = pickle.load(sys.stdin.buffer)
    if not isinstance(spec, StoreHostSpec):
        raise TypeError(f"stdin must hold a pickled StoreHostSpec, not {type(spec).__name__}")
    config = spec.config
    try:
        loop_factory = event_loop_factory(config.event_loop)
    except Unavailable as exc:
        # An installed uvloop that fails to import. The gRPC process makes the same check and says
        # so itself: it may have closed the link already.
        with socket.socket(fileno=args.fd) as link, contextlib.suppress(OSError):
            link.sendall(encode(Frame(Kind.FAILED, meta={"error": str(exc)})))
        return 1
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(host(config, args.fd, worker=args.worker, unheld_fd=args.unheld_fd, extension=spec.extension))


if __name__ == "__main__":
    sys.exit(main())
