"""What the client tests share: both clients behind one set of calls, client-side instruments, a fleet
of sidecars to restart under a stream, the writes those streams send and what they must leave, and a
real gRPC server whose PutStream a test scripts.

Faults a real sidecar cannot be made to produce on demand are provoked on the client side, and say so
where they are: a reply lost after the write committed (an interceptor that drops it), counting a
call's attempts or a put_stream's streams (instruments that only count).
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
import grpc.aio

from ckpt.sidecar.client import AsyncCheckpointClient, CheckpointClient, NotFoundError
from ckpt.sidecar.client.base import checkpoint_stub
from ckpt.sidecar.client.putbytes import PutCall
from ckpt.v1 import checkpoint_pb2, service_pb2, service_pb2_grpc
from tests.server.test_put_stream_and_shutdown import stop_within_bound
from tests.support import Sidecar, start_sidecar

T = TypeVar("T")

PATCH = b"\x10\x01"  # field 2 (varint) = 1: a well-formed MERGE patch
FLAVOURS = ["sync", "async"]
CLIENT_NAMES = {"sync": "CheckpointClient", "async": "AsyncCheckpointClient"}


def merge(session: str) -> service_pb2.PutRequest:
    return service_pb2.PutRequest(session_id=session, state=PATCH, mode=service_pb2.WRITE_MODE_MERGE)


async def alist(it: AsyncIterator[Any]) -> list[Any]:
    return [x async for x in it]


def versions(target: str, session: str) -> list[int]:
    with CheckpointClient(target) as c:
        try:
            return [v.version for v in c.history(session)]
        except NotFoundError:
            return []


def states(target: str, session: str) -> list[bytes]:
    with CheckpointClient(target) as c:
        head = c.get(session).version
        return [c.get(session, version=v).state for v in range(1, head + 1)]


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.001)


# -- both clients behind one set of calls -----------------------------------------------------------


class AsyncDriven:
    """An AsyncCheckpointClient driven from a test's thread with CheckpointClient's calls, so that one test
    checks a promise of both clients. Its event loop runs on a thread of its own. An iterator given to
    put_stream (not a sequence) reaches the client as an async generator whose every step runs on a
    worker thread, as an agent's awaited steps would: a step that waits does not stop the loop."""

    def __init__(self, target: str, *, interceptor: Any = None, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="test-client-loop", daemon=True)
        self._thread.start()
        try:
            self.client = self.run(self._open(target, interceptor, options))
        except BaseException:
            self._shut_down()
            raise

    @staticmethod
    async def _open(target: str, interceptor: Any, options: dict[str, Any]) -> AsyncCheckpointClient:
        client = AsyncCheckpointClient(target, **options)
        if interceptor is not None:  # grpc.aio takes interceptors when a channel is made: a new one
            await client._channel.close()
            client._channel = grpc.aio.insecure_channel(target, interceptors=[interceptor])
            client._stub = checkpoint_stub(client._channel)
        return client

    def run(self, awaitable: Awaitable[T]) -> T:
        """Await ``awaitable`` on the client's loop; what it raises (SystemExit too) is raised here."""

        async def boxed() -> tuple[bool, Any]:
            try:
                return True, await awaitable
            except BaseException as exc:  # a SystemExit would end the loop's thread instead
                return False, exc

        ok, value = asyncio.run_coroutine_threadsafe(boxed(), self._loop).result()
        if not ok:
            raise value
        return value  # type: ignore[no-any-return]

    @property
    def _stub(self) -> Any:
        return self.client._stub

    def put(self, *args: Any, **kwargs: Any) -> service_pb2.PutResponse:
        return self.run(self.client.put(*args, **kwargs))

    def merge(self, *args: Any, **kwargs: Any) -> service_pb2.PutResponse:
        return self.run(self.client.merge(*args, **kwargs))

    def get(self, *args: Any, **kwargs: Any) -> service_pb2.GetResponse:
        return self.run(self.client.get(*args, **kwargs))

    def fork(self, *args: Any, **kwargs: Any) -> service_pb2.SessionInfo:
        return self.run(self.client.fork(*args, **kwargs))

    def delete(self, *args: Any, **kwargs: Any) -> int:
        return self.run(self.client.delete(*args, **kwargs))

    def history(self, *args: Any, **kwargs: Any) -> Iterator[service_pb2.VersionInfo]:
        return self._iterate(self.client.history(*args, **kwargs))

    def sessions(self, *args: Any, **kwargs: Any) -> Iterator[service_pb2.SessionInfo]:
        return self._iterate(self.client.sessions(*args, **kwargs))

    def put_blob(self, *args: Any, **kwargs: Any) -> checkpoint_pb2.ArtifactRef:
        return self.run(self.client.put_blob(*args, **kwargs))

    def get_blob(self, *args: Any, **kwargs: Any) -> Iterator[bytes]:
        async def start() -> AsyncIterator[bytes]:  # in the client's loop, as its calls must be
            return self.client.get_blob(*args, **kwargs)

        return self._iterate(self.run(start()))

    def get_blob_to(self, *args: Any, **kwargs: Any) -> int:
        return self.run(self.client.get_blob_to(*args, **kwargs))

    def put_stream(self, puts: Any, **kwargs: Any) -> Iterator[service_pb2.PutResult]:
        async def start() -> AsyncIterator[service_pb2.PutResult]:  # in the client's loop, as its calls must be
            return self.client.put_stream(_stepped(puts), **kwargs)

        return self._iterate(self.run(start()))

    def _iterate(self, items: AsyncIterator[T]) -> Iterator[T]:
        try:
            while True:
                try:
                    item = self.run(items.__anext__())
                except StopAsyncIteration:
                    return
                yield item
        finally:
            if not self._loop.is_closed():
                self.run(items.aclose())  # type: ignore[attr-defined]

    def close(self) -> None:
        self.run(self.client.close())

    def __enter__(self) -> AsyncDriven:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.close()
        finally:
            self._shut_down()

    def _shut_down(self) -> None:
        """Cancel what is left on the loop (as asyncio.run does), then stop it."""

        async def cancel_the_rest() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._loop.shutdown_asyncgens()

        asyncio.run_coroutine_threadsafe(cancel_the_rest(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


_END = object()


def _stepped(puts: Any) -> Any:
    """``puts`` as an async client takes an agent's steps: a sequence as it is, an iterator as an async
    generator whose every step runs on a worker thread (anything else as it is, for the client to refuse)."""
    if isinstance(puts, Sequence) or not isinstance(puts, Iterable):
        return puts
    steps = iter(puts)

    async def stepped() -> AsyncIterator[Any]:
        while (item := await asyncio.to_thread(next, steps, _END)) is not _END:
            yield item

    return stepped()


def open_client(flavour: str, target: str, *, interceptor: Any = None, **options: Any) -> Any:
    """A client of ``flavour`` ("sync" or "async", see AsyncDriven) to ``target``, to use in a with block;
    ``interceptor``: a pair instrument (LoseFirstReply, CountCalls), its side for the flavour installed."""
    if flavour == "async":
        return AsyncDriven(target, interceptor=interceptor and interceptor.aio(), **options)
    client = CheckpointClient(target, **options)
    if interceptor is not None:
        client._stub = checkpoint_stub(grpc.intercept_channel(client._channel, interceptor))
    return client


# -- client-side instruments (the server is real) -------------------------------------------------


def _message(request: Any) -> Any:
    """The request message a call sent (a Put's PutCall as the PutRequest it encodes)."""
    return request.message() if isinstance(request, PutCall) else request


class LostReply(grpc.RpcError):  # type: ignore[misc]  # grpc is untyped
    def __init__(self, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE, details: str = "reply lost") -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[()]:
        return ()


# What grpc-aio raises when a send fails because the call already ended (grpc/grpc#36066).
MASKED_SEND_FAILURE = LostReply(grpc.StatusCode.INTERNAL, "Internal error from Core")


class LoseFirstReply(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Lets the first call reach the sidecar and commit, then drops its reply (UNAVAILABLE, or ``error``);
    ``sent``: every request, attempts included. ``aio()``: the same for an async client."""

    def __init__(self, error: LostReply | None = None) -> None:
        self.sent: list[Any] = []
        self.error = error or LostReply()

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        self.sent.append(_message(request))
        outcome = continuation(details, request)
        if len(self.sent) == 1:
            outcome.result()  # the write committed
            raise self.error
        return outcome

    def aio(self) -> grpc.aio.UnaryUnaryClientInterceptor:
        lose = self

        class AsyncLoseFirstReply(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
            async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
                lose.sent.append(_message(request))
                call = await continuation(details, request)
                if len(lose.sent) == 1:
                    await call  # the write committed
                    raise lose.error
                return call

        return AsyncLoseFirstReply()


class CountCalls(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Counts the attempts calls make and keeps their requests; changes nothing. ``aio()``: for an async client."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        self.sent.append(_message(request))
        return continuation(details, request)

    def aio(self) -> grpc.aio.UnaryUnaryClientInterceptor:
        count = self

        class AsyncCountCalls(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
            async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
                count.sent.append(_message(request))
                return await continuation(details, request)

        return AsyncCountCalls()


def count_streams(client: Any) -> list[int]:
    """Count the PutStream calls ``client`` opens (one per stream; a resumed put_stream opens several)."""
    opened = [0]
    put_stream = client._stub.PutStream

    def counted(requests: Any) -> Any:
        opened[0] += 1
        return put_stream(requests)

    client._stub.PutStream = counted
    return opened


# -- a fleet of sidecars, and the writes of a stream that outlasts them ----------------------------------

SESSIONS = [f"agent-{k}" for k in range(6)]
# SIGTERM: the sidecar answers the batches it read, then ends the stream UNAVAILABLE (nothing committed
# is unanswered). SIGKILL: the connection drops; writes committed but not answered come back replayed.
RESTARTS = (signal.SIGTERM, signal.SIGKILL, signal.SIGTERM)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def write(i: int) -> service_pb2.PutRequest:
    """Write i, with request id ``wi``: a REPLACE (field 1) every 7th, else a MERGE patch (field 2);
    well-formed protobuf either way."""
    session = SESSIONS[i % len(SESSIONS)]
    payload = f"{session}/{i}:".encode() * (1 + i % 13)
    replace = i % 7 == 0
    return service_pb2.PutRequest(
        session_id=session,
        state=(b"\x0a" if replace else b"\x12") + _varint(len(payload)) + payload,
        mode=service_pb2.WRITE_MODE_REPLACE if replace else service_pb2.WRITE_MODE_MERGE,
        request_id=f"w{i}",
    )


@dataclass
class Expected:
    """What writes 0..n-1 must leave: each session's state and version count, and each write's version."""

    states: dict[str, bytes] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    versions: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, n: int) -> Expected:
        e = cls()
        for i in range(n):
            w = write(i)
            base = b"" if w.mode == service_pb2.WRITE_MODE_REPLACE else e.states.get(w.session_id, b"")
            e.states[w.session_id] = base + w.state
            e.counts[w.session_id] = e.counts.get(w.session_id, 0) + 1
            e.versions.append(e.counts[w.session_id])
        return e


def check_results(results: list[service_pb2.PutResult], expected: Expected) -> int:
    """Every write answered once, in order, with the version it made; returns how many were replays."""
    assert len(results) == len(expected.versions)
    got = [(r.WhichOneof("outcome"), r.response.version) for r in results]
    wrong = [(i, g, v) for i, (g, v) in enumerate(zip(got, expected.versions, strict=True)) if g != ("response", v)]
    assert not wrong, wrong[:5]
    return sum(r.response.replayed for r in results)


def check_store(target: str, expected: Expected, *, prefix: bool = False) -> None:
    """Each session's head is the expected state byte for byte, with one version per write (none lost or
    doubled). ``prefix``: the writes are a prefix of those sent (a SIGKILL may have left later ones
    committed but unanswered), so the version the prefix's last write made is checked instead of the head."""
    with CheckpointClient(target) as c:
        for session, state in expected.states.items():
            count = expected.counts[session]
            got = c.get(session, version=count if prefix else 0)
            assert got.state == state, session
            assert got.version == count, session
            stored = [v.version for v in c.history(session)]
            assert stored[-count:] == list(range(count, 0, -1)), session
            assert prefix or len(stored) == count, session


class Fleet:
    """The sidecars a test starts on one data directory and socket, in order; ``[-1]`` is the current one.

    Restarts may run on a thread reading ``puts`` or on a thread of their own, and can still be under way when
    a failing test ends: ``close`` waits for them, refuses any later one, and kills every sidecar still
    running, so a failed test leaves no process behind. (A passing test stops its last sidecar itself
    with SIGTERM and checks that it exits 0.)
    """

    def __init__(self, data_dir: Path, *extra: str) -> None:
        self._data_dir, self._extra = data_dir, extra
        self._cond = threading.Condition()
        self._busy = 0
        self._closed = False
        self._all = [start_sidecar(data_dir, *extra)]
        self.socket_path = Path(self._all[0].unix_target.removeprefix("unix:"))

    def __getitem__(self, i: int) -> Sidecar:
        with self._cond:
            return self._all[i]

    def __len__(self) -> int:
        with self._cond:
            return len(self._all)

    def stop(self, sig: int) -> None:
        """Stop the current sidecar with ``sig`` (a SIGTERM must exit 0 within the bound)."""
        s = self[-1]
        code = stop_within_bound(s) if sig == signal.SIGTERM else s.stop(sig)
        assert code == (0 if sig == signal.SIGTERM else -sig), s.log()

    def start(self) -> Sidecar:
        """Start a sidecar on the same data directory, socket and options (the current one stopped)."""
        with self._cond:
            if self._closed:
                raise RuntimeError("the test is over: no more sidecars")
            self._busy += 1
        try:
            s = start_sidecar(self._data_dir, *self._extra, socket_path=self.socket_path)
            with self._cond:
                self._all.append(s)
            return s
        finally:
            with self._cond:
                self._busy -= 1
                self._cond.notify_all()

    def restart(self, sig: int) -> Sidecar:
        self.stop(sig)
        return self.start()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.wait_for(lambda: self._busy == 0, timeout=60)
            running = [s for s in self._all if s.process.poll() is None]
        for s in running:
            s.process.send_signal(signal.SIGCONT)
            s.stop(signal.SIGKILL)


# -- a real gRPC server whose PutStream a test scripts ------------------------------------------------


class _ScriptedPutStream(service_pb2_grpc.CheckpointServiceServicer):  # type: ignore[misc]
    def __init__(
        self,
        script: Callable[[Iterator[service_pb2.PutStreamRequest]], Iterator[service_pb2.PutStreamResponse]],
    ) -> None:
        self._script = script

    def PutStream(self, request_iterator: Any, context: Any) -> Iterator[service_pb2.PutStreamResponse]:
        return self._script(request_iterator)


@contextmanager
def scripted_server(
    socket_path: Path,
    script: Callable[[Iterator[service_pb2.PutStreamRequest]], Iterator[service_pb2.PutStreamResponse]],
) -> Iterator[str]:
    """A gRPC server on ``socket_path`` whose PutStream answers as ``script`` says (given the stream's
    requests, it yields the answers); its target. Every other method is gRPC's UNIMPLEMENTED."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    service_pb2_grpc.add_CheckpointServiceServicer_to_server(_ScriptedPutStream(script), server)
    target = f"unix:{socket_path}"
    server.add_insecure_port(target)
    server.start()
    try:
        yield target
    finally:
        server.stop(grace=None).wait()


def committed(batch: service_pb2.PutStreamRequest, *, first_version: int = 1) -> service_pb2.PutStreamResponse:
    """An answer to ``batch``: every write committed, versions from ``first_version`` on."""
    results = [
        service_pb2.PutResult(response=service_pb2.PutResponse(version=first_version + k))
        for k in range(len(batch.puts))
    ]
    return service_pb2.PutStreamResponse(results=results, batch_id=batch.batch_id)
