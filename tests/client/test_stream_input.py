"""put_stream reads the caller's ``puts`` as the stream goes, as both clients promise: never whole first, a
write sent at once when no other is ready, each write as it was given, the caller's own error after the
writes before it, and nothing read (or left waiting) once the put_stream has ended."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from ckpt.sidecar.client import AsyncCheckpointClient, CheckpointClient, ResourceExhaustedError
from ckpt.v1 import service_pb2
from tests.client.support import FLAVOURS, PATCH, alist, merge, open_client, states
from tests.support import Sidecar


def refilled(session: str, n: int) -> Iterator[service_pb2.PutRequest]:
    """An agent's steps, one PutRequest object refilled and given again for each (with its own request ids)."""
    put = service_pb2.PutRequest(session_id=session)
    for i in range(n):
        put.state = b"step %d" % i
        put.request_id = f"{session}-step-{i}"
        yield put


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_generator_refilling_one_message_writes_every_step(sidecar: Sidecar, flavour: str) -> None:
    """A generator that changes one PutRequest and gives it again for every step: the sync read-ahead
    went back into the generator before the message was copied (199 of 200 versions held another
    step's state), and the async client lost writes."""
    with open_client(flavour, sidecar.unix_target) as c:
        results = list(c.put_stream(refilled("steps", 200), batch_size=16))
    assert [(r.response.version, r.response.replayed) for r in results] == [(v, False) for v in range(1, 201)]
    assert states(sidecar.unix_target, "steps") == [b"step %d" % i for i in range(200)]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_repeated_request_object_is_written_each_time_and_left_unchanged(sidecar: Sidecar, flavour: str) -> None:
    """One PutRequest given three times is three writes. The client used to write the generated
    request id into the caller's message, so the 2nd and 3rd were silent replays of the 1st."""
    req = merge("same")
    with open_client(flavour, sidecar.unix_target) as c:
        results = list(c.put_stream([req, req, req]))
        assert [(r.response.version, r.response.replayed) for r in results] == [(1, False), (2, False), (3, False)]
        assert req.request_id == ""  # the caller's message is not changed
        assert c.get("same").state == PATCH * 3


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_write_is_sent_at_once_when_the_next_is_not_ready(sidecar: Sidecar, flavour: str) -> None:
    """An agent gives one write per step and waits for its result before the next step. The sync
    client used to hold each write until 64 had come (a whole message) or ``puts`` ended: here, never."""
    answered = threading.Event()
    waited_in_vain: list[int] = []

    def steps() -> Iterator[service_pb2.PutRequest]:
        for step in range(3):
            yield merge("steps")
            if not answered.wait(20):  # the next step needs this one's result
                waited_in_vain.append(step)
            answered.clear()

    with open_client(flavour, sidecar.unix_target) as c:
        versions_seen = []
        for result in c.put_stream(steps()):
            versions_seen.append(result.response.version)
            assert c.get("steps").version == result.response.version  # committed, not just sent
            answered.set()
    assert versions_seen == [1, 2, 3]
    assert waited_in_vain == []


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_puts_is_read_as_the_stream_goes_never_whole_first(sidecar: Sidecar, flavour: str) -> None:
    """The async client read ``puts`` whole before sending anything: an agent's endless generator was
    never sent, and a long one held in memory. Now the first results come while it is still being read."""
    given: list[int] = []

    def steps() -> Iterator[service_pb2.PutRequest]:
        for i in range(20_000):
            given.append(i)
            yield service_pb2.PutRequest(session_id="lazy", state=PATCH, mode=service_pb2.WRITE_MODE_MERGE)

    with open_client(flavour, sidecar.unix_target) as c:
        for _ in c.put_stream(steps(), batch_size=8):
            break
    assert len(given) < 20_000


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_every_write_given_before_the_callers_error_is_sent_and_answered_first(sidecar: Sidecar, flavour: str) -> None:
    """``puts`` gives 5 writes, less than a batch, then raises: the sync client used to drop them (the
    batch was never sent) and raise at once; the async one read ``puts`` whole first and raised before
    any write. Now they are written and answered, then the error is raised."""

    def puts(session: str) -> Iterator[service_pb2.PutRequest]:
        for _ in range(5):
            yield merge(session)
        raise RuntimeError("the agent's own generator failed")

    results: list[service_pb2.PutResult] = []
    with open_client(flavour, sidecar.unix_target) as c:
        with pytest.raises(RuntimeError, match="agent's own"):
            for result in c.put_stream(puts("given")):
                results.append(result)
        assert [r.response.version for r in results] == [1, 2, 3, 4, 5]
        assert c.get("given").state == PATCH * 5
        # A non-PutRequest among the writes: the ones before it go, then TypeError.
        mixed: list[Any] = [service_pb2.PutRequest(session_id="mixed", state=PATCH), {"session_id": "mixed"}]
        with pytest.raises(TypeError, match=r"puts\[1\] is a dict"):
            list(c.put_stream(mixed))
        assert c.get("mixed").version == 1


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_write_too_big_for_the_clients_limit_is_named_after_the_writes_before_it_are_answered(
    sidecar: Sidecar, flavour: str
) -> None:
    """gRPC failed the whole stream while sending such a write: the answers of the writes before it were
    lost, and the error named the first unanswered write, not the one too big. The async client, which
    read ``puts`` whole first, raised before writing anything."""
    limit = 128 << 10
    puts = [merge("s"), service_pb2.PutRequest(session_id="s", state=b"x" * limit, request_id="too-big"), merge("s")]
    taken: list[service_pb2.PutResult] = []
    with open_client(flavour, sidecar.unix_target, max_message_bytes=limit) as c:
        with pytest.raises(ResourceExhaustedError) as raised:
            taken.extend(c.put_stream(iter(puts)))
        assert [r.response.version for r in taken] == [1]  # the write before it: sent and answered
        assert raised.value.request_id == "too-big"
        needs = service_pb2.PutStreamRequest(puts=[puts[1]], batch_id=1).ByteSize()
        assert f"puts[1] (request_id 'too-big') needs a {needs}-byte PutStream message" in str(raised.value)
        assert f"over this client's message limit (max_message_bytes = {limit})" in str(raised.value)
        assert c.get("s").version == 1  # nothing after it was sent


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_the_writes_before_a_base_exception_of_puts_are_sent_then_it_is_raised(sidecar: Sidecar, flavour: str) -> None:
    """SystemExit (or a CancelledError) from ``puts`` killed gRPC's request thread: nothing was sent,
    and the sync put_stream waited for ever, timeout_seconds or not."""
    outcome: list[Any] = []

    def puts() -> Iterator[service_pb2.PutRequest]:
        for _ in range(2):
            yield merge("exiting")
        raise SystemExit(3)

    with open_client(flavour, sidecar.unix_target, timeout_seconds=5) as c:

        def run() -> None:
            try:
                for result in c.put_stream(puts()):
                    outcome.append(result.response.version)
            except SystemExit as exc:
                outcome.append(f"SystemExit({exc.code})")

        caller = threading.Thread(target=run, daemon=True)
        caller.start()
        caller.join(60)
        assert not caller.is_alive(), "put_stream still waiting"
        assert outcome == [1, 2, "SystemExit(3)"]
        assert c.get("exiting").version == 2


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_put_stream_stops_reading_puts_once_it_ends(sidecar: Sidecar, flavour: str) -> None:
    """The caller stops after the first result: the read-ahead thread went on running the caller's
    generator until 2 x batch_size writes waited, and dropped them (129 agent steps ran for nothing)."""
    given: list[int] = []

    def steps() -> Iterator[service_pb2.PutRequest]:
        for step in range(1000):
            given.append(step)
            yield merge("stopped")
            time.sleep(0.01)

    with open_client(flavour, sidecar.unix_target) as c:
        for _ in c.put_stream(steps()):
            break
        at_stop = len(given)
        time.sleep(1.0)
        assert len(given) <= at_stop + 1  # the one it was inside, at most
    assert at_stop <= 3


def _paced_steps(session: str) -> Iterator[service_pb2.PutRequest]:
    for _ in range(3):
        yield merge(session)
        time.sleep(0.3)  # an agent's step


def test_no_thread_is_left_behind_once_a_put_stream_ends(sidecar: Sidecar) -> None:
    """The caller stops after the first result while ``puts`` is between steps: gRPC's request thread,
    waiting for the next write, was left blocked for good (holding the stream's writes), once each time."""
    with CheckpointClient(sidecar.unix_target) as c:
        list(c.put_stream([merge("leak")]))  # gRPC's own threads are started
        time.sleep(1.0)
        before = set(threading.enumerate())
        for _ in range(3):
            for _ in c.put_stream(_paced_steps("leak")):
                break
        time.sleep(1.5)  # every generator has given its next write, and ended, long ago
        # Threads an earlier test left may end meanwhile; none started here may be left.
        assert [t.name for t in set(threading.enumerate()) - before] == []


async def _apaced_steps(session: str) -> AsyncIterator[service_pb2.PutRequest]:
    for _ in range(3):
        yield merge(session)
        await asyncio.sleep(0.3)  # an agent's step


def test_no_task_is_left_behind_once_an_async_put_stream_ends(sidecar: Sidecar) -> None:
    """As for the sync client's threads: the async client's reading of ``puts``, and grpc.aio's sending of
    the stream's requests, end with the put_stream."""

    async def run() -> tuple[int, list[str]]:
        async with AsyncCheckpointClient(sidecar.unix_target) as ac:
            await alist(ac.put_stream([merge("aleak")]))
            await asyncio.sleep(1.0)  # what that stream left in grpc.aio has ended
            before = len(asyncio.all_tasks())
            for _ in range(3):
                async for _ in ac.put_stream(_apaced_steps("aleak")):
                    break
            await asyncio.sleep(1.5)
            return len(asyncio.all_tasks()) - before, [repr(t) for t in asyncio.all_tasks()]

    left, tasks = asyncio.run(run())
    assert left == 0, tasks


def test_the_async_client_takes_a_sync_iterator_and_an_async_generator_lazily(sidecar: Sidecar) -> None:
    """The async client's ``puts`` can be either; neither is read whole before the first write is sent."""
    given: list[int] = []

    def steps() -> Iterator[service_pb2.PutRequest]:
        for i in range(5000):
            given.append(i)
            yield merge("sync-steps")

    async def asteps() -> AsyncIterator[service_pb2.PutRequest]:
        for put in refilled("async-steps", 5):
            yield put

    async def run() -> tuple[int, list[int]]:
        async with AsyncCheckpointClient(sidecar.unix_target) as ac:
            async for _ in ac.put_stream(steps(), batch_size=8):
                break
            read = len(given)
            return read, [r.response.version async for r in ac.put_stream(asteps())]

    read, written = asyncio.run(run())
    assert read < 5000
    assert written == [1, 2, 3, 4, 5]
    assert states(sidecar.unix_target, "async-steps") == [b"step %d" % i for i in range(5)]


_AGENT_RUN: contextvars.ContextVar[str] = contextvars.ContextVar("agent_run", default="unset")


def test_the_async_client_answers_each_write_of_a_blocking_sync_generator_before_its_next_step(
    sidecar: Sidecar,
) -> None:
    """A plain generator whose steps block (an agent's step, not awaited): the async client read it on the
    event loop, which it held for as long as the generator ran, so nothing was sent until it ran out; then
    the waits for answers, stalled meanwhile, ran past timeout_seconds=1 and it raised DeadlineExceededError
    with the first write unanswered. Each write must be answered before the step after it ends; the
    generator runs in the caller's contextvars, as it did on the loop."""
    answered: list[int] = []
    answered_at_step_end: list[int] = []
    seen: list[str] = []

    def steps() -> Iterator[service_pb2.PutRequest]:
        for i in range(4):
            if i:
                time.sleep(1.5)  # the agent's step, past timeout_seconds
                answered_at_step_end.append(len(answered))
            seen.append(_AGENT_RUN.get())
            yield service_pb2.PutRequest(session_id="blocking", state=PATCH, mode=service_pb2.WRITE_MODE_MERGE)

    async def run() -> None:
        _AGENT_RUN.set("run-7")
        async with AsyncCheckpointClient(sidecar.unix_target, timeout_seconds=1) as ac:
            async for result in ac.put_stream(steps(), batch_size=1):
                answered.append(result.response.version)

    asyncio.run(run())
    assert answered == [1, 2, 3, 4]
    assert answered_at_step_end == [1, 2, 3]
    assert seen == ["run-7"] * 4


def test_the_async_client_raises_a_sync_generators_error_after_its_writes_and_leaves_a_blocked_step(
    sidecar: Sidecar,
) -> None:
    """A plain generator read off the event loop: its error is raised after the writes it gave are answered,
    and a put_stream the caller stops while a step blocks ends at once, that step's write not sent."""
    given: list[int] = []

    def failing() -> Iterator[service_pb2.PutRequest]:
        yield merge("failing")
        time.sleep(0.2)
        yield merge("failing")
        raise RuntimeError("the agent's own generator failed")

    def blocked() -> Iterator[service_pb2.PutRequest]:
        for i in range(2):
            given.append(i)
            yield merge("blocked")
            time.sleep(2.0)  # a step under way when the caller stops

    async def run() -> tuple[list[int], float]:
        async with AsyncCheckpointClient(sidecar.unix_target) as ac:
            versions: list[int] = []
            with pytest.raises(RuntimeError, match="agent's own"):
                async for result in ac.put_stream(failing()):
                    versions.append(result.response.version)
            began = time.monotonic()
            stream = ac.put_stream(blocked())
            async for _ in stream:
                break
            await stream.aclose()  # type: ignore[attr-defined]
            return versions, time.monotonic() - began

    began = time.monotonic()
    versions, stop_seconds = asyncio.run(run())
    assert versions == [1, 2]
    assert stop_seconds < 1.0 and time.monotonic() - began < 1.5  # nor does asyncio.run wait for the step
    time.sleep(2.5)  # the blocked step has ended, and given its write
    assert given == [0, 1]
    assert states(sidecar.unix_target, "blocked") == [PATCH]


def test_the_sync_client_reads_an_iterator_in_the_callers_contextvars(sidecar: Sidecar) -> None:
    """The read-ahead thread ran ``puts`` in a context of its own: a contextvar the caller set (a trace, a
    run id) read as unset inside the generator."""
    seen: list[str] = []

    def steps() -> Iterator[service_pb2.PutRequest]:
        for _ in range(2):
            seen.append(_AGENT_RUN.get())
            yield merge("context")

    def run() -> list[int]:
        _AGENT_RUN.set("run-8")
        with CheckpointClient(sidecar.unix_target) as c:
            return [r.response.version for r in c.put_stream(steps())]

    assert contextvars.copy_context().run(run) == [1, 2]
    assert seen == ["run-8"] * 2
