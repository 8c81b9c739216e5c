"""Closing a client: calls after it are refused, calls under it end with ClientClosedError naming what is
unknown, and close() itself waits for gRPC timeout_seconds at most."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckpt.sidecar.client import AsyncCheckpointClient, CheckpointClient, ClientClosedError
from ckpt.v1 import service_pb2
from tests.client.support import CLIENT_NAMES, FLAVOURS, PATCH, alist, merge, open_client
from tests.support import Sidecar, start_sidecar


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_closed_client_says_so(sidecar: Sidecar, flavour: str) -> None:
    """Used to be ValueError('Cannot invoke RPC on closed channel!') from the sync client and
    grpc.aio.UsageError('Channel is closed.') from the async one."""
    with open_client(flavour, sidecar.unix_target) as c:
        c.put("closed", PATCH)
        c.close()
        c.close()  # twice is fine
        for call in (lambda: c.get("closed"), lambda: list(c.history("closed")), lambda: list(c.put_stream([]))):
            with pytest.raises(ValueError, match=f"this {CLIENT_NAMES[flavour]} is closed"):
                call()


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_closing_the_client_under_a_call_raises_client_closed_error_naming_the_write(
    sidecar: Sidecar, flavour: str
) -> None:
    """The sidecar is frozen, so the put waits; close() ends it with ClientClosedError (a ValueError, as
    for a call after close()) carrying the request id to resend it by. grpc-aio cancels a closing
    channel's calls: the async caller's task used to get a CancelledError nobody asked for (a TaskGroup
    took it for its own cancellation, the write silently unmade)."""
    outcome: list[Any] = []
    sidecar.process.send_signal(signal.SIGSTOP)
    try:
        with open_client(flavour, sidecar.unix_target) as c:

            def put() -> None:
                try:
                    c.put("closing", PATCH, request_id="r1")
                except ClientClosedError as exc:
                    outcome.append((str(exc), exc.request_id))

            caller = threading.Thread(target=put)
            caller.start()
            time.sleep(0.3)  # sent; no answer comes
            c.close()
            caller.join(30)
    finally:
        sidecar.process.send_signal(signal.SIGCONT)
    unknown = "the write's outcome is unknown: resend it with request_id 'r1'"
    assert outcome == [(f"this {CLIENT_NAMES[flavour]} was closed during the call; {unknown}", "r1")]


def test_the_async_callers_own_cancellation_is_still_a_cancelled_error_and_a_close_under_a_stream_is_not(
    sidecar: Sidecar,
) -> None:
    """Under a frozen sidecar: a put_stream whose client is closed ends with ClientClosedError naming its
    unanswered write; a put the caller cancels itself still raises CancelledError."""

    async def run() -> list[Any]:
        outcomes: list[Any] = []
        for kind in ("put_stream", "cancelled"):
            ac = AsyncCheckpointClient(sidecar.unix_target)
            call: Any = alist(ac.put_stream([merge("closing")])) if kind == "put_stream" else ac.put("closing", PATCH)
            task = asyncio.ensure_future(call)
            await asyncio.sleep(0.3)  # sent; no answer comes
            if kind == "cancelled":
                task.cancel()
            await ac.close()
            try:
                await task
                outcomes.append("answered")
            except ClientClosedError as exc:
                outcomes.append((str(exc), len(exc.unanswered)))
            except asyncio.CancelledError:
                outcomes.append("CancelledError")
        return outcomes

    sidecar.process.send_signal(signal.SIGSTOP)
    try:
        stream, cancelled = asyncio.run(run())
    finally:
        sidecar.process.send_signal(signal.SIGCONT)
    text, unanswered = stream
    assert text.startswith(
        "this AsyncCheckpointClient was closed during the call; put_stream: the first 0 writes were answered;"
        " the next 1"
    )
    assert unanswered == 1
    assert cancelled == "CancelledError"


def _two_steps_with_a_pause(session: str, release: threading.Event) -> Iterator[service_pb2.PutRequest]:
    """An agent's two MERGE steps, the second given only once ``release`` is set (or after a minute)."""
    yield merge(session)
    release.wait(60)
    yield merge(session)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_closing_the_client_under_an_idle_put_stream_ends_it_at_once(sidecar: Sidecar, flavour: str) -> None:
    """Every write sent was answered and ``puts`` had nothing ready: close() ended the stream, which
    then waited for ``puts``'s next write (for ever, for an agent waiting on its last result). For the
    async client, the put_stream reading an async generator whole first used to end with a plain
    ValueError saying the client "is closed", which an ``except ClientClosedError`` missed."""
    release = threading.Event()
    outcome: list[Any] = []
    with open_client(flavour, sidecar.unix_target) as c:

        def consume() -> None:
            try:
                for result in c.put_stream(_two_steps_with_a_pause("idle-close", release)):
                    outcome.append(result.response.version)
                    threading.Timer(0.3, c.close).start()
            except ClientClosedError as exc:
                outcome.append((str(exc), exc.unanswered))

        consumer = threading.Thread(target=consume)
        consumer.start()
        consumer.join(30)
        release.set()
        consumer.join(30)
    assert outcome == [
        1,
        (f"this {CLIENT_NAMES[flavour]} was closed during the call; put_stream: all 1 writes sent were answered", []),
    ]
    assert versions_of(sidecar, "idle-close") == 1  # the second step was never sent


def versions_of(sidecar: Sidecar, session: str) -> int:
    with CheckpointClient(sidecar.unix_target) as c:
        return c.get(session).version


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_closing_the_client_ends_a_put_stream_whose_idle_stream_the_sidecar_broke(tmp_path: Path, flavour: str) -> None:
    """The sidecar stops while the stream is idle: put_stream waits inside ``puts`` for its next write to
    reopen one, and close() could not reach it (it raised only once ``puts`` gave again)."""
    sidecar = start_sidecar(tmp_path / "data")
    release, first = threading.Event(), threading.Event()
    outcome: list[Any] = []
    with open_client(flavour, sidecar.unix_target) as c:

        def consume() -> None:
            try:
                for result in c.put_stream(_two_steps_with_a_pause("broken-idle", release)):
                    outcome.append(result.response.version)
                    first.set()
            except ClientClosedError as exc:
                outcome.append(str(exc))

        consumer = threading.Thread(target=consume)
        consumer.start()
        try:
            assert first.wait(30)
            assert sidecar.stop(signal.SIGTERM) == 0  # the idle stream breaks
            time.sleep(0.5)
            c.close()
            consumer.join(20)
            assert not consumer.is_alive(), "put_stream still waits for puts"
        finally:
            release.set()
            consumer.join(30)
    assert outcome == [
        1,
        f"this {CLIENT_NAMES[flavour]} was closed during the call; put_stream: all 1 writes sent were answered",
    ]


def test_a_close_racing_a_call_raises_the_clients_error_with_the_request_id(sidecar: Sidecar) -> None:
    """close() from another thread lands after the call checked the client is open and before gRPC
    starts it (the interleaving is forced by wrapping the stub; gRPC then raises its own ValueError).
    An async client's calls and close() share one thread: no call can be between the two."""
    c = CheckpointClient(sidecar.unix_target)
    put = c._stub.Put

    def close_then_put(*args: Any, **kwargs: Any) -> Any:
        c.close()
        return put(*args, **kwargs)

    c._stub.Put = close_then_put
    with pytest.raises(ClientClosedError, match="closed during the call; the write's outcome is unknown") as closed:
        c.put("race", b"x", request_id="r-1")
    assert closed.value.request_id == "r-1"
    assert isinstance(closed.value, ValueError)


# gRPC's own close is replaced (a private hook) because a close that never ends cannot be had from a
# real sidecar on demand: it is what a stream under way to a frozen sidecar made of gRPC's close once.


def test_close_waits_timeout_seconds_at_most_for_grpc_to_end_the_channels_calls(
    sidecar: Sidecar, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """gRPC's Channel.close waits until every call of the channel has ended. In one CI run a test hung
    there: the stream it had cancelled stayed under way in gRPC while the sidecar was frozen, and close()
    waited for the sidecar to run again. close() now gives gRPC timeout_seconds."""
    client = CheckpointClient(sidecar.unix_target, timeout_seconds=0.5)
    assert client.put("s", b"x").version == 1
    released, grpc_closed = threading.Event(), threading.Event()
    grpc_close = client._channel.close

    def stuck_close() -> None:  # as gRPC's close with a call that does not end
        released.wait()
        grpc_close()
        grpc_closed.set()

    monkeypatch.setattr(client._channel, "close", stuck_close)
    closing = threading.Thread(target=client.close)
    with caplog.at_level(logging.WARNING, logger="ckpt.sidecar.client"):
        closing.start()
        closing.join(10)
        assert not closing.is_alive(), "close() waited for gRPC's close"
    assert not grpc_closed.is_set()
    assert "had not closed after 0.5 s (timeout_seconds)" in caplog.text
    assert caplog.records[-1].name.startswith("ckpt")
    with pytest.raises(ValueError, match="is closed"):
        client.put("s", b"y")
    released.set()
    assert grpc_closed.wait(10)  # the channel still closes, in the background


def test_the_async_close_waits_timeout_seconds_at_most_too(sidecar: Sidecar, caplog: pytest.LogCaptureFixture) -> None:
    async def run() -> None:
        client = AsyncCheckpointClient(sidecar.unix_target, timeout_seconds=0.5)
        assert (await client.put("s", b"x")).version == 1
        released, grpc_closed = asyncio.Event(), asyncio.Event()
        grpc_close = client._channel.close

        async def stuck_close(grace: float | None = None) -> None:
            await released.wait()
            await grpc_close(grace)
            grpc_closed.set()

        client._channel.close = stuck_close
        with caplog.at_level(logging.WARNING, logger="ckpt.sidecar.client"):
            await asyncio.wait_for(client.close(), 10)
        assert not grpc_closed.is_set()
        assert "had not closed after 0.5 s (timeout_seconds)" in caplog.text
        with pytest.raises(ValueError, match="is closed"):
            await client.put("s", b"y")
        released.set()
        await client.close()  # waits for the same close, now done
        assert grpc_closed.is_set()

    asyncio.run(run())


def test_closing_the_client_under_a_blob_stream_raises_client_closed_error(sidecar: Sidecar) -> None:
    """PutBlob and GetBlob under a frozen sidecar, their client closed: ClientClosedError, as every other
    call gets (a cut blob stream stores nothing, so no outcome is unknown). The async client's used to
    raise a CancelledError nobody asked for, which a TaskGroup took for its own cancellation and
    swallowed; the sync client's an UnavailableError telling to resend by a request id blobs have not."""
    with CheckpointClient(sidecar.unix_target) as c:
        c.put("blobs", PATCH)
        stored = c.put_blob(b"kept" * 1000, session_id="blobs")
    closed = "this {} was closed during the call"
    outcomes: list[Any] = []

    @contextlib.contextmanager
    def frozen() -> Iterator[None]:
        # Frozen once the client is connected: a blob call (not retried) then waits for an answer.
        sidecar.process.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            sidecar.process.send_signal(signal.SIGCONT)

    def sync_call(kind: str) -> None:
        c = CheckpointClient(sidecar.unix_target)
        c.get("blobs")

        def call() -> None:
            try:
                if kind == "put_blob":
                    c.put_blob(b"x" * 1000, session_id="blobs")
                else:
                    list(c.get_blob(stored))
                outcomes.append((kind, "answered"))
            except ClientClosedError as exc:
                outcomes.append((kind, str(exc)))

        with frozen():
            caller = threading.Thread(target=call)
            caller.start()
            time.sleep(0.3)  # sent; no answer comes
            c.close()
            caller.join(30)

    async def async_call(kind: str) -> None:
        ac = AsyncCheckpointClient(sidecar.unix_target)
        await ac.get("blobs")
        call: Any = ac.put_blob(b"x" * 1000, session_id="blobs") if kind == "put_blob" else alist(ac.get_blob(stored))
        with frozen():
            try:
                async with asyncio.TaskGroup() as group:
                    group.create_task(call)
                    await asyncio.sleep(0.3)  # sent; no answer comes
                    await ac.close()
                outcomes.append((f"async {kind}", "answered"))
            except* ClientClosedError as raised:
                outcomes.append((f"async {kind}", str(raised.exceptions[0])))

    for kind in ("put_blob", "get_blob"):
        sync_call(kind)
        asyncio.run(async_call(kind))
    assert outcomes == [
        ("put_blob", closed.format("CheckpointClient")),
        ("async put_blob", closed.format("AsyncCheckpointClient")),
        ("get_blob", closed.format("CheckpointClient")),
        ("async get_blob", closed.format("AsyncCheckpointClient")),
    ]
