"""What a developer's walk through the Python clients found (2026-11-26), each against a real `ckpt serve`.

Each test failed on the build before its fix: a generator refilling one
PutRequest lost writes in the async put_stream; resending after put_stream
gave up wrote some twice; a close() racing a call raised gRPC's own message
without the request id; an async client used from another loop failed with
asyncio's "attached to a different loop"; a lone surrogate raised a bare
UnicodeEncodeError.
"""

from __future__ import annotations

import asyncio
import importlib.resources
import logging
import signal
import threading
import time
import tomllib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from ckpt.sidecar.client import (
    AsyncCheckpointClient,
    CheckpointClient,
    CheckpointError,
    ClientClosedError,
    DeadlineExceededError,
)
from ckpt.v1 import service_pb2
from tests.sidecar_proc import ROOT, Sidecar, start_sidecar


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Sidecar]:
    s = start_sidecar(tmp_path / "data")
    yield s
    assert s.stop() == 0, s.log()


def states(target: str, session: str) -> list[bytes]:
    with CheckpointClient(target) as c:
        head = c.get(session).version
        return [c.get(session, version=v).state for v in range(1, head + 1)]


def refilled(session: str, n: int) -> Iterator[service_pb2.PutRequest]:
    """An agent's steps, one PutRequest object refilled and given again for each (with its own request ids)."""
    put = service_pb2.PutRequest(session_id=session)
    for i in range(n):
        put.state = b"step %d" % i
        put.request_id = f"{session}-step-{i}"
        yield put


async def arefilled(session: str, n: int) -> AsyncIterator[service_pb2.PutRequest]:
    for put in refilled(session, n):
        yield put


def test_a_generator_refilling_one_message_writes_every_step_in_both_clients(sidecar: Sidecar) -> None:
    expected = [b"step %d" % i for i in range(5)]
    with CheckpointClient(sidecar.unix_target) as c:
        assert [r.response.version for r in c.put_stream(refilled("sync", 5))] == [1, 2, 3, 4, 5]

    async def run() -> None:
        async with AsyncCheckpointClient(sidecar.unix_target) as c:
            results = [r async for r in c.put_stream(refilled("async", 5))]
            assert [(r.response.version, r.response.replayed) for r in results] == [(i, False) for i in range(1, 6)]
            results = [r async for r in c.put_stream(arefilled("async-gen", 5))]  # an async generator too
            assert [r.response.version for r in results] == [1, 2, 3, 4, 5]

    asyncio.run(run())
    for session in ("sync", "async", "async-gen"):
        assert states(sidecar.unix_target, session) == expected


def test_the_sync_client_names_an_async_iterable_given_to_put_stream(sidecar: Sidecar) -> None:
    with CheckpointClient(sidecar.unix_target) as c, pytest.raises(TypeError, match="puts is an async iterable"):
        c.put_stream(arefilled("x", 1))  # type: ignore[arg-type]
    with CheckpointClient(sidecar.unix_target) as c, pytest.raises(TypeError, match="puts must be an iterable"):
        c.put_stream(3)  # type: ignore[arg-type]


@pytest.mark.parametrize("client", ["sync", "async"])
def test_resending_what_a_stream_that_gave_up_names_writes_each_write_once(sidecar: Sidecar, client: str) -> None:
    """The sidecar freezes (SIGSTOP) mid-stream: the stream gives up after timeout_seconds with writes in flight,
    none with a request id of the caller's. Resent as the error says (``unanswered``, then the rest of ``puts``),
    every write is stored exactly once, in order."""
    n = 3000
    puts = [service_pb2.PutRequest(session_id="s", state=b"w%05d" % i) for i in range(n)]
    answered = 0
    failure: CheckpointError | None = None

    def freeze_after(results: int) -> None:
        if results == 200:
            sidecar.process.send_signal(signal.SIGSTOP)

    try:
        if client == "sync":
            with CheckpointClient(sidecar.unix_target, timeout_seconds=1, retries=0) as c:
                try:
                    for _ in c.put_stream(puts, batch_size=16):
                        answered += 1
                        freeze_after(answered)
                except CheckpointError as exc:
                    failure = exc
        else:

            async def run() -> None:
                nonlocal answered, failure
                async with AsyncCheckpointClient(sidecar.unix_target, timeout_seconds=1, retries=0) as c:
                    try:
                        async for _ in c.put_stream(puts, batch_size=16):
                            answered += 1
                            freeze_after(answered)
                    except CheckpointError as exc:
                        failure = exc

            asyncio.run(run())
    finally:
        sidecar.process.send_signal(signal.SIGCONT)
    assert isinstance(failure, DeadlineExceededError), failure
    unanswered = failure.unanswered
    assert unanswered and all(put.request_id for put in unanswered)
    assert failure.request_id == unanswered[0].request_id
    assert f"the first {answered} writes were answered; the next {len(unanswered)}" in str(failure)
    rest = answered + len(unanswered)
    assert f"then the writes of puts after them (from puts[{rest}])" in str(failure)
    assert [p.state for p in unanswered] == [p.state for p in puts[answered:rest]]
    time.sleep(0.5)  # the thawed sidecar commits what it had queued
    with CheckpointClient(sidecar.unix_target) as c:
        results = list(c.put_stream([*unanswered, *puts[rest:]]))
    assert len(results) == n - answered
    assert states(sidecar.unix_target, "s") == [p.state for p in puts]  # each once, in order


def test_close_waits_timeout_seconds_at_most_for_grpc_to_end_the_channels_calls(
    sidecar: Sidecar, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """gRPC's Channel.close waits until every call of the channel has ended. In one CI run the test above hung
    there: the stream it had cancelled stayed under way in gRPC while the sidecar was frozen, and close() waited
    for the sidecar to run again (the test thaws it after close). close() now gives gRPC timeout_seconds."""
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
    with caplog.at_level(logging.WARNING, logger="ckpt.sidecar.client.clients"):
        closing.start()
        closing.join(10)
        assert not closing.is_alive(), "close() waited for gRPC's close"
    assert not grpc_closed.is_set()
    assert "had not closed after 0.5 s (timeout_seconds)" in caplog.text
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
        with caplog.at_level(logging.WARNING, logger="ckpt.sidecar.client.clients"):
            await asyncio.wait_for(client.close(), 10)
        assert not grpc_closed.is_set()
        assert "had not closed after 0.5 s (timeout_seconds)" in caplog.text
        with pytest.raises(ValueError, match="is closed"):
            await client.put("s", b"y")
        released.set()
        await client.close()  # waits for the same close, now done
        assert grpc_closed.is_set()

    asyncio.run(run())


def test_a_close_racing_a_call_raises_the_clients_error_with_the_request_id(sidecar: Sidecar) -> None:
    """close() lands after the call checked the client is open and before gRPC starts it (the
    interleaving is forced by wrapping the stub; gRPC then raises its own ValueError)."""
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


def test_closing_the_async_client_while_put_stream_reads_puts_raises_client_closed_error(sidecar: Sidecar) -> None:
    """The async put_stream reads an async iterable whole before sending; a close() meanwhile raised a
    plain ValueError saying the client "is closed" (as for a call made after close()), which an
    ``except ClientClosedError`` missed; the sync client says ClientClosedError there."""

    async def run() -> None:
        c = AsyncCheckpointClient(sidecar.unix_target)
        reading = asyncio.Event()

        async def steps() -> AsyncIterator[service_pb2.PutRequest]:
            yield service_pb2.PutRequest(session_id="slow", state=b"step 0")
            reading.set()
            await asyncio.sleep(0.2)  # the next step is slow to come; the client is closed meanwhile
            yield service_pb2.PutRequest(session_id="slow", state=b"step 1")

        async def consume() -> None:
            async for _ in c.put_stream(steps()):
                pass

        task = asyncio.create_task(consume())
        await reading.wait()
        await c.close()
        with pytest.raises(ClientClosedError, match="closed during the call; put_stream: all 0 writes") as closed:
            await task
        assert closed.value.unanswered == []  # nothing was sent

    asyncio.run(run())
    with CheckpointClient(sidecar.unix_target) as c, pytest.raises(CheckpointError, match="does not exist"):
        c.get("slow")


def test_an_async_client_belongs_to_the_loop_it_was_made_in(sidecar: Sidecar) -> None:
    with pytest.raises(RuntimeError, match="must be created in the event loop that uses it"):
        AsyncCheckpointClient(sidecar.unix_target)

    async def make() -> AsyncCheckpointClient:
        c = AsyncCheckpointClient(sidecar.unix_target)
        await c.put("loop", b"first")
        return c

    kept = asyncio.run(make())

    async def reuse() -> None:
        with pytest.raises(RuntimeError, match="belongs to the event loop it was created in, not this one"):
            await kept.get("loop")

    asyncio.run(reuse())


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c: c.put("s\udc80", b"x"), r"session_id is not valid UTF-8: a lone surrogate '\\udc80' at index 1"),
        (lambda c: c.put("s", b"x", request_id="r\udc80"), "request_id is not valid UTF-8"),
        (lambda c: c.put("s", b"x", labels={"k": "v\udc80"}), r"labels\['k'\] is not valid UTF-8"),
        (lambda c: c.put("s", b"x", labels={"k\udc80": "v"}), "labels key 'k\\\\udc80' is not valid UTF-8"),
        (lambda c: c.fork("s", "t\udc80"), "new_session_id is not valid UTF-8"),
    ],
)
def test_a_lone_surrogate_is_named_by_its_field(sidecar: Sidecar, call: Any, message: str) -> None:
    with CheckpointClient(sidecar.unix_target) as c, pytest.raises(ValueError, match=message):
        call(c)


def test_the_packages_are_marked_typed_for_type_checkers() -> None:
    for package in ("sidecar", "codec", "ckpt"):
        assert importlib.resources.files(package).joinpath("py.typed").is_file(), package
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for package in ("sidecar", "codec", "ckpt"):
        assert "py.typed" in data.get(package, []), package
