"""The store process: the store in a child of ``ckpt serve``, and what that adds to the sidecar's promises.

What the sidecar serves is checked by test_sidecar.py; here: the processes
themselves, the link between them, and what happens when either one dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from ckpt.bench.output import child_pids
from ckpt.sidecar.client import CheckpointClient, CheckpointError, ResourceExhaustedError
from ckpt.sidecar.config import MAX_STREAM_BATCH_PUTS, ServeConfig, StoreConfig
from ckpt.sidecar.server import storehost, storeside
from ckpt.sidecar.server.link import MAX_TAG, Frame, FrameReader, Kind, encode
from ckpt.sidecar.server.methods import PUT_METHOD, UNARY_METHODS
from ckpt.sidecar.server.storelink import StoreLink
from ckpt.sidecar.status import CURRENT_VERSION_KEY
from ckpt.sidecar.store import OFF_LOOP_PATCH_BYTES, Store
from ckpt.v1 import service_pb2
from tests.store.test_commit_failure import _FailingCommits as FailingCommits  # storage whose next commits fail
from tests.support import Sidecar, start_sidecar


def _store_process(sidecar: Sidecar) -> int:
    """The pid of the sidecar's store process (its child running sidecar.storehost)."""
    for pid in child_pids(sidecar.pid):
        with contextlib.suppress(OSError):
            if b"ckpt.sidecar.server.storehost" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
    raise AssertionError(f"sidecar {sidecar.pid} has no store process")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_gone(pid: int, timeout_seconds: float = 20) -> None:
    deadline = time.monotonic() + timeout_seconds
    while _alive(pid):
        assert time.monotonic() < deadline, f"process {pid} still runs"
        time.sleep(0.02)


def _maps_data_file(pid: int) -> bool:
    return "data.mdb" in Path(f"/proc/{pid}/maps").read_text()


def _stored_versions(data_dir: Path, session: str) -> list[bytes]:
    with Store(StoreConfig(data_dir=data_dir)) as store:
        head = store.get(session).version
        return [store.get(session, v).state for v in range(1, head + 1)]


@pytest.mark.parametrize("reply_cache", ["default", "off"])
def test_the_store_lives_in_a_child_process_that_ends_with_the_sidecar(tmp_path: Path, reply_cache: str) -> None:
    extra = ("--reply-cache-bytes", "0") if reply_cache == "off" else ()
    sidecar = start_sidecar(tmp_path / "data", *extra)
    child = _store_process(sidecar)
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            client.put("s", b"\x08\x01")
        # The store process writes LMDB; the gRPC process maps it only to read: heads for its reply
        # cache (replycache.py), and blobs' records (blobstreams.py), with a reply cache or without.
        assert _maps_data_file(child)
        assert _maps_data_file(sidecar.pid)
    finally:
        assert sidecar.stop() == 0, sidecar.log()
    _wait_gone(child)
    assert _stored_versions(tmp_path / "data", "s") == [b"\x08\x01"]


def test_a_store_process_that_dies_stops_the_sidecar_with_exit_1(tmp_path: Path) -> None:
    sidecar = start_sidecar(tmp_path / "data")
    states = [b"\x08" + bytes([i]) for i in range(1, 21)]
    with CheckpointClient(sidecar.unix_target, retries=0) as client:
        for state in states:
            client.put("s", state)
        os.kill(_store_process(sidecar), signal.SIGKILL)
        # A supervisor sees a failed sidecar and restarts it; until then calls fail UNAVAILABLE.
        assert sidecar.process.wait(timeout=20) == 1, sidecar.log()
        with pytest.raises(CheckpointError):
            client.get("s")
    assert sidecar.log().count("store process ended") == 1, sidecar.log()  # once, though both links close
    assert "the store process was killed by SIGKILL" in sidecar.log()  # not "exited -9"
    assert _stored_versions(tmp_path / "data", "s") == states  # every acknowledged write


def test_a_killed_sidecar_leaves_no_store_process_behind(tmp_path: Path) -> None:
    sidecar = start_sidecar(tmp_path / "data")
    child = _store_process(sidecar)
    with CheckpointClient(sidecar.unix_target) as client:
        client.put("s", b"\x08\x01")
    sidecar.process.kill()
    sidecar.process.wait()
    _wait_gone(child)  # the link closed: it committed what it had and exited
    restarted = start_sidecar(tmp_path / "data")
    try:
        with CheckpointClient(restarted.unix_target) as client:
            assert client.get("s").state == b"\x08\x01"
    finally:
        assert restarted.stop() == 0, restarted.log()


def test_sigterm_under_concurrent_writes_keeps_every_acknowledged_one(tmp_path: Path) -> None:
    sidecar = start_sidecar(tmp_path / "data")
    acknowledged: dict[str, list[bytes]] = {f"w{i}": [] for i in range(8)}
    stop = threading.Event()

    def write(session: str) -> None:
        with CheckpointClient(sidecar.unix_target, retries=0, timeout_seconds=10) as client:
            n = 0
            while not stop.is_set():
                state = b"\x08" + n.to_bytes(2, "little")
                try:
                    client.put(session, state)
                except CheckpointError:
                    return  # shutting down: not acknowledged
                acknowledged[session].append(state)
                n += 1

    threads = [threading.Thread(target=write, args=(s,)) for s in acknowledged]
    for t in threads:
        t.start()
    time.sleep(1.0)
    assert sidecar.stop() == 0, sidecar.log()
    stop.set()
    for t in threads:
        t.join()
    for session, states in acknowledged.items():
        assert states, session
        assert _stored_versions(tmp_path / "data", session)[: len(states)] == states


# -- Puts, answered from callbacks (no Task a write) ----------------------------------------------


def _put_raw(session: str, state: bytes, **fields: object) -> bytes:
    return service_pb2.PutRequest(session_id=session, state=state, **fields).SerializeToString()  # type: ignore[arg-type]


class _Host:
    """A StoreSide on one event loop, as the store process runs it."""

    def __init__(self, data_dir: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.side = storeside.StoreSide(
            ServeConfig(data_dir=data_dir), worker=None, on_writes_stopped=lambda reason: None
        )
        self.side.start()
        self.service, self.store = self.side.service, self.side.store

    def put(self, raw: bytes) -> list[tuple[object, ...]]:
        """One Put, run until answered: its answers (one, if all is well)."""
        answers: list[tuple[object, ...]] = []

        async def run() -> None:
            self.service.put(raw, lambda *answer: answers.append(answer))
            await self.service.calls.idle.wait()

        self.loop.run_until_complete(run())
        return answers

    def close(self) -> None:
        self.side.close()
        self.loop.close()


@pytest.fixture
def host(tmp_path: Path) -> Iterator[_Host]:
    host = _Host(tmp_path / "data")
    try:
        yield host
    finally:
        host.close()


def test_a_put_is_answered_with_its_version_and_a_retry_is_replayed(host: _Host) -> None:
    answers = host.put(_put_raw("s", b"\x08\x01", request_id="r1"))
    assert len(answers) == 1
    code, details, trailers, body = answers[0]
    assert (code, details, trailers) == (None, "", ())
    reply = service_pb2.PutResponse.FromString(body)  # type: ignore[arg-type]
    assert reply.version == 1 and reply.state_size == 2 and not reply.replayed
    # The same request id again: replayed, nothing written.
    (again,) = host.put(_put_raw("s", b"\x08\x01", request_id="r1"))
    assert service_pb2.PutResponse.FromString(again[3]).replayed  # type: ignore[arg-type]
    assert host.store.get("s").version == 1
    assert host.service.calls.idle.is_set()


def test_a_put_conflict_carries_the_head_in_a_trailer(host: _Host) -> None:
    host.put(_put_raw("s", b"\x08\x01"))
    ((code, details, trailers, body),) = host.put(_put_raw("s", b"\x08\x02", expected_version=7))
    assert code in (grpc.StatusCode.ABORTED, grpc.StatusCode.FAILED_PRECONDITION)
    assert "7" in str(details) and (CURRENT_VERSION_KEY, "1") in trailers and body == b""  # type: ignore[operator]


def test_a_bad_put_names_the_field(host: _Host) -> None:
    ((code, details, _, _),) = host.put(_put_raw("", b"\x08\x01"))
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "session" in str(details)


def test_a_bug_under_a_put_answers_internal_and_the_next_put_works(
    host: _Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(request: object) -> object:
        raise RuntimeError("a bug")

    with monkeypatch.context() as patched:
        patched.setattr(host.store, "asubmit", broken)
        ((code, details, _, _),) = host.put(_put_raw("s", b"\x08\x01"))
    assert code is grpc.StatusCode.INTERNAL and details == "Put failed inside the sidecar; see its log"
    assert host.service.calls.idle.is_set()  # counted as ended: shutdown does not wait for it
    ((code, _, _, _),) = host.put(_put_raw("s", b"\x08\x01"))
    assert code is None


def test_a_put_that_does_not_parse_is_answered_invalid_argument_and_counted(host: _Host) -> None:
    ((code, details, _, body),) = host.put(b"\xff\xff")
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "not a valid ckpt.v1.PutRequest" in str(details)
    assert body == b"" and host.store.stats()["commits"] == 0
    assert host.service.calls.idle.is_set()


def test_a_large_merge_patch_is_checked_off_the_loop_and_written(host: _Host) -> None:
    assert host.put(_put_raw("s", b"\x08\x01"))[0][0] is None
    patch = b"\x10\x01" * (OFF_LOOP_PATCH_BYTES // 2)
    ((code, _, _, body),) = host.put(_put_raw("s", patch, mode=service_pb2.WRITE_MODE_MERGE))
    assert code is None
    assert service_pb2.PutResponse.FromString(body).version == 2  # type: ignore[arg-type]
    assert host.store.get("s").state == b"\x08\x01" + patch


def test_call_tags_wrap_past_the_u32_a_frame_carries_skipping_those_in_use(tmp_path: Path) -> None:
    # A frame's tag is a u32: a sidecar that forwarded 2**32 - 1 calls (ten
    # days at 5,000 a second) failed every call after (the header did not
    # pack). Set the count where those calls would have left it, with tag 1
    # still in use (a stream left open since the count last started): a
    # private hook, as 2**32 calls cannot be made in a test.
    async def run() -> list[tuple[int, int]]:
        link = await StoreLink.start(ServeConfig(data_dir=tmp_path / "data"), worker=None)
        try:
            link._last_tag = MAX_TAG - 1
            link._protocol.pending[1] = asyncio.get_running_loop().create_future()  # in use
            tags = []
            for i in range(3):
                status, meta, body = await link.call(
                    PUT_METHOD, _put_raw("s", b"\x08\x01", request_id=f"r{i}"), batched=True
                )
                assert status == 0, meta
                tags.append((link._last_tag, service_pb2.PutResponse.FromString(body).version))
            link._protocol.pending.pop(1)
            return tags
        finally:
            await link.close()

    assert asyncio.run(run()) == [(MAX_TAG, 1), (2, 2), (3, 3)]


async def _frames_from(loop: asyncio.AbstractEventLoop, sock: socket.socket, reader: FrameReader) -> list[Frame]:
    """The frames of the next bytes read from ``sock`` (reading on until one is whole)."""
    frames: list[Frame] = []
    while not frames:
        frames += reader.feed(await loop.sock_recv(sock, 1 << 16))
    return frames


def test_a_call_stuck_when_the_link_closes_does_not_keep_the_store_process_or_its_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A store process whose gRPC process died waited for every forwarded call to end: one that never did
    (a PutStream whose end was lost to a shutdown race, fixed apart) kept it, and the data directory's
    lock, alive for ever, and each restart was refused as 'in use'. It now gives them --grace-seconds."""

    # A private hook: no request makes a call hang on purpose.
    async def stuck(self: object, frame: Frame) -> None:  # any call that never ends
        await asyncio.Event().wait()

    monkeypatch.setattr(storehost._HostProtocol, "_call", stuck)
    config = ServeConfig(data_dir=tmp_path / "data", grace_seconds=0.5)
    ours, theirs = socket.socketpair()

    async def run() -> tuple[int, float]:
        loop = asyncio.get_running_loop()
        hosting = asyncio.ensure_future(storehost.host(config, theirs.detach(), worker=None))
        ours.setblocking(False)
        frames = await _frames_from(loop, ours, FrameReader(max_frame_bytes=1 << 20))
        assert frames[0].kind is Kind.READY, frames
        put, get = PUT_METHOD, UNARY_METHODS.index("Get")
        request = service_pb2.GetRequest(session_id="s").SerializeToString()
        await loop.sock_sendall(ours, encode(Frame(Kind.CALL, tag=1, method=get, body=request)))
        await loop.sock_sendall(ours, encode(Frame(Kind.CALL, tag=2, method=put, body=_put_raw("s", b"\x08\x07"))))
        await asyncio.sleep(0.2)
        ours.close()  # the gRPC process died, its calls unanswered
        closed_at = loop.time()
        code = await asyncio.wait_for(hosting, 30)
        return code, loop.time() - closed_at

    with caplog.at_level(logging.WARNING, logger=storehost.__name__):
        code, seconds = asyncio.run(run())
    assert code == 0
    assert seconds >= 0.5 * 0.9  # the calls got their grace
    assert "still under way 0.5 s (--grace-seconds) after the link to the gRPC process closed" in caplog.text
    with Store(config.store) as store:  # closed, lock released, and the write it had was committed
        assert store.get("s").state == b"\x08\x07"


def test_a_store_process_whose_commit_failed_answers_unavailable_says_so_and_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit that fails (an I/O error) stops the store's writes until it is reopened: the store process
    tells the gRPC process (WRITES_STOPPED: it stops, exit 1, for its supervisor to restart the sidecar),
    and exits 1 itself once told to close."""
    real_store = Store

    def failing_store(*args: Any, **kwargs: Any) -> Store:
        store = real_store(*args, **kwargs)
        # A private hook: no request makes the storage's commit fail (the I/O error it stands for).
        FailingCommits(store, failures=1)
        return store

    monkeypatch.setattr(storeside, "Store", failing_store)
    config = ServeConfig(data_dir=tmp_path / "data")
    ours, theirs = socket.socketpair()

    async def run() -> tuple[list[Frame], int]:
        loop = asyncio.get_running_loop()
        hosting = asyncio.ensure_future(storehost.host(config, theirs.detach(), worker=None))
        ours.setblocking(False)
        reader = FrameReader(max_frame_bytes=1 << 20)
        (ready,) = await _frames_from(loop, ours, reader)
        assert ready.kind is Kind.READY, ready
        put = Frame(Kind.CALL, tag=1, method=PUT_METHOD, body=_put_raw("s", b"\x08\x01"))
        await loop.sock_sendall(ours, encode(put))
        frames: list[Frame] = []
        while {f.kind for f in frames} != {Kind.REPLY, Kind.WRITES_STOPPED}:
            frames += await asyncio.wait_for(_frames_from(loop, ours, reader), 10)
        await loop.sock_sendall(ours, encode(Frame(Kind.CLOSE)))
        return frames, await asyncio.wait_for(hosting, 30)

    try:
        frames, code = asyncio.run(run())
    finally:
        ours.close()
    (reply,) = (f for f in frames if f.kind is Kind.REPLY)
    assert reply.status == grpc.StatusCode.UNAVAILABLE.value[0], reply
    assert "a commit failed" in reply.meta["details"]
    (stopped,) = (f for f in frames if f.kind is Kind.WRITES_STOPPED)
    assert "a commit failed" in stopped.meta["reason"]
    assert code == 1


async def _host_on_two_links(
    config: ServeConfig,
    theirs: socket.socket,
    theirs_unheld: socket.socket,
    puts_link: socket.socket,
    puts: FrameReader,
) -> asyncio.Future[int]:
    """storehost.host on the far ends of two socketpairs, once it is READY and has answered a first Put
    (b"\x08\x07" to session "s", tag 1) on the Puts' link; its result is host()'s."""
    loop = asyncio.get_running_loop()
    hosting = asyncio.ensure_future(
        storehost.host(config, theirs.detach(), worker=None, unheld_fd=theirs_unheld.detach())
    )
    puts_link.setblocking(False)
    (ready,) = await _frames_from(loop, puts_link, puts)
    assert ready.kind is Kind.READY, ready
    await loop.sock_sendall(
        puts_link, encode(Frame(Kind.CALL, tag=1, method=PUT_METHOD, body=_put_raw("s", b"\x08\x07")))
    )
    (reply,) = await _frames_from(loop, puts_link, puts)
    assert (reply.kind, reply.tag, reply.status) == (Kind.REPLY, 1, 0), reply
    return hosting


def test_a_get_is_answered_while_the_puts_link_is_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While a batch of Puts gathers and commits, the store process stops reading the link Puts come on
    (Store.write_on_loop): a Get sent on it waited up to a gather and a commit (~30 ms at most). Every call
    but a Put now comes on a second link, which is always read."""
    holds: list[tuple[Callable[[], object], Callable[[], object]]] = []
    write_on_loop = Store.write_on_loop

    def keep_hold(self: Store, loop: asyncio.AbstractEventLoop, *, hold_input: Any, release_input: Any) -> None:
        holds.append((hold_input, release_input))
        write_on_loop(self, loop, hold_input=hold_input, release_input=release_input)

    monkeypatch.setattr(Store, "write_on_loop", keep_hold)
    config = ServeConfig(data_dir=tmp_path / "data")
    puts_link, theirs = socket.socketpair()
    calls_link, theirs_unheld = socket.socketpair()

    async def run() -> None:
        loop = asyncio.get_running_loop()
        puts, calls = FrameReader(max_frame_bytes=1 << 20), FrameReader(max_frame_bytes=1 << 20)
        hosting = await _host_on_two_links(config, theirs, theirs_unheld, puts_link, puts)
        calls_link.setblocking(False)

        ((hold_input, release_input),) = holds
        hold_input()  # as a batch of writes does while it gathers and commits
        put2 = Frame(Kind.CALL, tag=2, method=PUT_METHOD, body=_put_raw("s", b"\x08\x08"))
        await loop.sock_sendall(puts_link, encode(put2))
        get, get_s = UNARY_METHODS.index("Get"), service_pb2.GetRequest(session_id="s").SerializeToString()
        await loop.sock_sendall(calls_link, encode(Frame(Kind.CALL, tag=1, method=get, body=get_s)))
        (got,) = await asyncio.wait_for(_frames_from(loop, calls_link, calls), 10)
        assert (got.kind, got.tag, got.status) == (Kind.REPLY, 1, 0), got
        assert service_pb2.GetResponse.FromString(got.body).state == b"\x08\x07"
        with pytest.raises(TimeoutError):  # the Put waits, unread, until the input is released
            await asyncio.wait_for(_frames_from(loop, puts_link, puts), 0.3)
        release_input()
        (reply,) = await asyncio.wait_for(_frames_from(loop, puts_link, puts), 10)
        assert (reply.kind, reply.tag, reply.status) == (Kind.REPLY, 2, 0), reply
        assert service_pb2.PutResponse.FromString(reply.body).version == 2

        await loop.sock_sendall(puts_link, encode(Frame(Kind.CLOSE)))
        assert await asyncio.wait_for(hosting, 30) == 0

    try:
        asyncio.run(run())
    finally:
        puts_link.close()
        calls_link.close()


def test_the_other_link_closing_alone_ends_the_store_process_serving(tmp_path: Path) -> None:
    """The two links end together: the store process serves until either closes (a gRPC process that
    closed one is going away), then closes the store, committing what it took, and returns 0."""
    config = ServeConfig(data_dir=tmp_path / "data")
    puts_link, theirs = socket.socketpair()
    calls_link, theirs_unheld = socket.socketpair()

    async def run() -> int:
        hosting = await _host_on_two_links(
            config, theirs, theirs_unheld, puts_link, FrameReader(max_frame_bytes=1 << 20)
        )
        calls_link.close()  # the Puts' link stays open
        return await asyncio.wait_for(hosting, 30)

    try:
        assert asyncio.run(run()) == 0
    finally:
        puts_link.close()
        calls_link.close()
    with Store(config.store) as store:  # closed (its lock released), the write committed
        assert store.get("s").state == b"\x08\x07"


# What a reply over --max-message-bytes does: gRPC refuses to send it (RESOURCE_EXHAUSTED, that call only).
# The store process must refuse it the same way: the gRPC process takes no link frame larger than one
# message, and took a larger one for a broken link, stopping the sidecar (exit 1).
def test_a_state_stored_under_a_larger_message_limit_fails_its_get_and_the_sidecar_serves_on(tmp_path: Path) -> None:
    big = os.urandom(2 << 20)
    sidecar = start_sidecar(tmp_path / "data", "--max-message-bytes", str(4 << 20))
    try:
        with CheckpointClient(sidecar.unix_target, max_message_bytes=4 << 20) as client:
            client.put("big", big)
            client.put("small", b"\x08\x01")
    finally:
        assert sidecar.stop() == 0, sidecar.log()
    # The operator lowers the limit: the state is over it now, by more than a link frame's room for a status.
    limit = 256 << 10
    sidecar = start_sidecar(tmp_path / "data", "--max-message-bytes", str(limit))
    try:
        with CheckpointClient(sidecar.unix_target, max_message_bytes=4 << 20, retries=0) as client:
            with pytest.raises(ResourceExhaustedError, match=f"over the sidecar's message limit .* = {limit}"):
                client.get("big")
            assert sidecar.process.poll() is None, sidecar.log()
            assert client.get("small").state == b"\x08\x01"
            assert [v.version for v in client.history("big")] == [1]
            client.fork("big", "big-copy")  # the state never crosses gRPC
            with pytest.raises(ResourceExhaustedError, match="over the sidecar's message limit"):
                client.get("big-copy")
    finally:
        assert sidecar.stop() == 0, sidecar.log()
    assert _stored_versions(tmp_path / "data", "big-copy") == [big]


def test_a_put_stream_batch_whose_results_would_pass_the_message_limit_is_answered_within_it(
    tmp_path: Path,
) -> None:
    limit = 128 << 10  # the least --max-message-bytes allowed; states up to 64 KiB
    sidecar = start_sidecar(tmp_path / "data", "--max-message-bytes", str(limit))
    try:
        with CheckpointClient(sidecar.unix_target, retries=0) as client:
            client.put("full", b"\x0a\x80\x80\x03" + b"x" * (limit - (64 << 10) - 10))  # 6 bytes under
        # ~19 bytes a write, ~205 a result (an error naming the state limit and where it comes from):
        # a whole batch (MAX_STREAM_BATCH_PUTS writes) fits the limit, its answer in full would be ~10x it.
        merge = service_pb2.PutRequest(session_id="full", state=b"\x12\x08abcdefgh", mode=service_pb2.WRITE_MODE_MERGE)
        batch = service_pb2.PutStreamRequest(puts=[merge] * MAX_STREAM_BATCH_PUTS)
        assert batch.ByteSize() < limit
        with grpc.insecure_channel(sidecar.unix_target, options=[("grpc.max_receive_message_length", 64 << 20)]) as ch:
            stream = ch.stream_stream(
                "/ckpt.v1.CheckpointService/PutStream",
                request_serializer=service_pb2.PutStreamRequest.SerializeToString,
                response_deserializer=service_pb2.PutStreamResponse.FromString,
            )
            (answer,) = list(stream(iter([batch]), timeout=60))
        # One result per write, every one refused naming the state limit, the messages cut to fit.
        assert answer.ByteSize() <= limit
        assert len(answer.results) == MAX_STREAM_BATCH_PUTS
        assert {r.error.code for r in answer.results} == {grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]}
        assert all("state" in r.error.message and "bytes" in r.error.message for r in answer.results), answer.results[0]
        assert sidecar.process.poll() is None, sidecar.log()
        with CheckpointClient(sidecar.unix_target, retries=0) as client:
            assert client.put("s", b"\x08\x01").version == 1
            assert client.get("full").version == 1  # no merge fit
    finally:
        assert sidecar.stop() == 0, sidecar.log()
