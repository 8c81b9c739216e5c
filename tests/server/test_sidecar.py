"""The sidecar as users run it: a real `ckpt serve` process, driven only through clients."""

from __future__ import annotations

import asyncio
import datetime
import re
import signal
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from ckpt.sidecar.client import (
    AlreadyExistsError,
    AsyncCheckpointClient,
    CheckpointClient,
    ConflictError,
    DeadlineExceededError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
)
from ckpt.sidecar.client.policy import retry_delay_seconds as _retry_delay_seconds
from ckpt.v1 import checkpoint_pb2 as pb
from ckpt.v1 import service_pb2, service_pb2_grpc
from tests.support import Sidecar, free_port, start_sidecar


def state(n: int) -> bytes:
    cp = pb.Checkpoint(schema_version=1, step=n, goal="integration")
    for i in range(n):
        cp.messages.add(role=pb.ROLE_ASSISTANT, content=f"message {i} " + "m" * 200)
    return cp.SerializeToString(deterministic=True)


def patch(n: int) -> bytes:
    return pb.Checkpoint(step=n, messages=[pb.Message(content=f"patch {n} " + "p" * 100)]).SerializeToString()


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Sidecar]:
    metrics_port = free_port()
    s = start_sidecar(tmp_path / "data", "--metrics-port", str(metrics_port), "--max-message-bytes", str(4 << 20))
    s.metrics_port = metrics_port  # type: ignore[attr-defined]
    yield s
    assert s.stop() == 0, s.log()


def test_every_rpc_over_unix_and_tcp(sidecar: Sidecar) -> None:
    with CheckpointClient(sidecar.unix_target) as uc, CheckpointClient(sidecar.tcp_target) as tc:
        expected = {}
        merged = b""
        for n in range(1, 41):
            client = uc if n % 2 else tc
            if n % 4 == 0:
                r = client.merge("s", patch(n), labels={"team": "a"})
                merged += patch(n)
            else:
                r = client.put("s", state(n), labels={"team": "a"})
                merged = state(n)
            assert r.version == n and r.state_size == len(merged)
            expected[n] = merged
        for n, want in expected.items():
            got = tc.get("s", n)
            assert (got.version, got.state) == (n, want)
            assert got.info.version == n and got.info.state_size == len(want)
        assert uc.get("s").version == 40
        history = list(uc.history("s", page_size=7))
        assert [h.version for h in history] == list(range(40, 0, -1))
        kinds = {h.frame_kind for h in history}
        assert service_pb2.FRAME_KIND_FULL in kinds and service_pb2.FRAME_KIND_PATCH in kinds
        assert history[0].labels == {"team": "a"} and history[0].mode == service_pb2.WRITE_MODE_MERGE

        fork = uc.fork("s", "s-fork", version=10, labels={"team": "b"})
        assert (fork.head_version, fork.forked_from_session_id, fork.forked_from_version) == (1, "s", 10)
        assert tc.get("s-fork").state == expected[10]
        with pytest.raises(AlreadyExistsError):
            uc.fork("s", "s-fork")
        assert [s.session_id for s in uc.sessions(labels={"team": "a"})] == ["s"]
        assert {s.session_id for s in uc.sessions()} == {"s", "s-fork"}
        assert uc.delete("s") == 40
        with pytest.raises(NotFoundError, match="'s' does not exist"):
            tc.get("s")


def test_sessions_filtered_by_update_time(sidecar: Sidecar) -> None:
    with CheckpointClient(sidecar.unix_target) as c:
        c.put("t-old", state(1))
        time.sleep(0.01)
        mid = datetime.datetime.now(datetime.UTC)
        time.sleep(0.01)
        c.put("t-new", state(1))
        in_berlin = mid.astimezone(datetime.timezone(datetime.timedelta(hours=1)))  # the same instant
        names = {"t-old", "t-new"}
        assert [s.session_id for s in c.sessions(updated_after=in_berlin) if s.session_id in names] == ["t-new"]
        assert [s.session_id for s in c.sessions(updated_before=mid) if s.session_id in names] == ["t-old"]

        async def run() -> list[str]:
            async with AsyncCheckpointClient(sidecar.unix_target) as ac:
                return [s.session_id async for s in ac.sessions(updated_after=mid, updated_before=mid)]

        assert asyncio.run(run()) == []


def test_a_session_written_while_paging_by_update_time_comes_again_as_documented(sidecar: Sidecar) -> None:
    """What docs/clients.md and ListSessionsResponse say of listings read page by page while writes go on."""
    epoch = datetime.datetime.fromtimestamp(0, datetime.UTC)
    with CheckpointClient(sidecar.unix_target) as c:
        for sid in ("p-a", "p-b"):
            c.put(sid, state(1))
        by_time = c.sessions(updated_after=epoch, page_size=1)
        by_id = c.sessions(page_size=1)
        assert next(by_time).session_id == "p-a"
        assert next(by_id).session_id == "p-a"
        time.sleep(1.2)  # past the index's granule of about a second: the next write lands later in it
        c.put("p-a", state(2))
        assert [(s.session_id, s.head_version) for s in by_time] == [("p-b", 1), ("p-a", 2)]
        assert [s.session_id for s in by_id] == ["p-b"]


def test_conflicts_and_idempotent_retries(sidecar: Sidecar) -> None:
    with CheckpointClient(sidecar.unix_target) as c:
        c.put("c", state(1), expected_version=0)
        with pytest.raises(ConflictError) as info:
            c.put("c", state(2), expected_version=0)
        assert info.value.current_version == 1 and info.value.code is grpc.StatusCode.ABORTED
        first = c.put("c", state(2), expected_version=1, request_id="retry-me")
        again = c.put("c", state(2), expected_version=1, request_id="retry-me")  # reply lost, client retries
        assert again.replayed and again.version == first.version == 2
        assert len(list(c.history("c"))) == 2


def test_request_ids_answer_retries_for_request_id_ttl_seconds_then_a_retry_writes_again(tmp_path: Path) -> None:
    # A TTL is exact (checked on every put), not rounded up to a sweep: the
    # sweeper, every 0.2 s here, only frees the expired records.
    s = start_sidecar(tmp_path / "data", "--request-id-ttl-seconds", "3", "--sweep-interval-seconds", "0.2")
    try:
        with CheckpointClient(s.unix_target) as c:
            first = c.put("t", state(1), request_id="once")
            time.sleep(0.6)  # three sweeps: the record is not swept before its TTL
            again = c.put("t", state(1), request_id="once")
            assert (first.version, first.replayed, again.version, again.replayed) == (1, False, 1, True)
            time.sleep(2.6)  # 3.2 s after the first write
            late = c.put("t", state(1), request_id="once")
            assert (late.version, late.replayed) == (2, False)
            assert [h.version for h in c.history("t")] == [2, 1]
    finally:
        assert s.stop() == 0, s.log()


def test_the_launcher_does_not_take_another_server_on_its_socket_for_its_own(sidecar: Sidecar, tmp_path: Path) -> None:
    # The new process refuses the socket the running one answers SERVING on;
    # the launcher waited for a SERVING answer only, and returned the refused one.
    with pytest.raises(RuntimeError, match=f"another server is listening on {sidecar.unix_target}"):
        start_sidecar(tmp_path / "other", socket_path=Path(sidecar.unix_target.removeprefix("unix:")))
    with CheckpointClient(sidecar.unix_target) as c:
        c.put("still", b"\x08\x01")


def test_bad_input_gets_precise_statuses(sidecar: Sidecar) -> None:
    with CheckpointClient(sidecar.unix_target, max_message_bytes=16 << 20) as c:
        with pytest.raises(InvalidArgumentError, match="session_id is empty"):
            c.put("", b"")
        with pytest.raises(InvalidArgumentError, match="session_id is 300 bytes; the limit is 256"):
            c.get("x" * 300)
        c.put("m", state(1))
        with pytest.raises(InvalidArgumentError, match="offset 0"):
            c.merge("m", b"\x0a\x09short")
        with pytest.raises(ResourceExhaustedError, match=str(4 << 20)):
            c.put("big", b"\x00" * (5 << 20))  # over the server's 4 MiB receive limit
        with pytest.raises(NotFoundError, match="has no version 9"):
            c.get("m", 9)
        with grpc.insecure_channel(sidecar.unix_target) as channel, pytest.raises(grpc.RpcError) as info:
            stub = service_pb2_grpc.CheckpointServiceStub(channel)  # a token the server never issued
            stub.ListVersions(service_pb2.ListVersionsRequest(session_id="m", page_token="@@"))
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert c.get("m").state == state(1)  # still serving, nothing lost


def test_every_state_the_sidecar_accepts_can_be_read_back(sidecar: Sidecar) -> None:
    limit = (4 << 20) - (64 << 10)  # --max-message-bytes less the envelope kept for ids and labels
    labels = {f"k{i:02d}" + "k" * 59: "v" * 128 for i in range(64)}  # the most labels allow
    with CheckpointClient(sidecar.unix_target, max_message_bytes=16 << 20) as c:
        biggest = bytes(range(256)) * (limit // 256) + b"\x00" * (limit % 256)
        c.put("edge", biggest, labels=labels)
        assert c.get("edge").state == biggest  # the reply's VersionInfo and labels fit too
        # The client cannot see max_state_bytes: the message says where it comes from.
        origin = f"; max_state_bytes is the sidecar's --max-message-bytes ({4 << 20}) less 65536 bytes kept for the"
        with pytest.raises(ResourceExhaustedError) as too_big:
            c.put("edge", biggest + b"\x00")
        assert f"state is {limit + 1} bytes; the limit (max_state_bytes) is {limit}{origin}" in str(too_big.value)
        with pytest.raises(ResourceExhaustedError) as grows_too_big:
            c.merge("edge", b"\x10\x01")
        assert f"would make a state of {limit + 2} bytes, over max_state_bytes ({limit}){origin}" in str(
            grows_too_big.value
        )
        [streamed] = c.put_stream([service_pb2.PutRequest(session_id="edge", state=biggest + b"\x00")])
        assert streamed.error.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
        assert f"the limit (max_state_bytes) is {limit}{origin}" in streamed.error.message
        c.fork("edge", "edge-fork")
        assert c.get("edge-fork").state == biggest
    with CheckpointClient(sidecar.unix_target, max_message_bytes=1 << 20) as small:
        with pytest.raises(ResourceExhaustedError, match=r"the reply is \d+ bytes, over this client's message limit"):
            small.get("edge")
        with pytest.raises(ResourceExhaustedError, match=r"the request is \d+ bytes, over this client's message lim"):
            small.put("x", b"\x00" * (2 << 20))
    with (
        CheckpointClient(sidecar.unix_target, max_message_bytes=16 << 20) as c,
        pytest.raises(ResourceExhaustedError, match=r"the request is \d+ bytes, over the sidecar's message limit"),
    ):
        c.put("x", b"\x00" * (5 << 20))


def test_put_stream_splits_batches_that_would_pass_the_message_limit(sidecar: Sidecar) -> None:
    big = [bytes([n]) * (1 << 20) for n in range(10)]  # 10 MiB through a 4 MiB limit
    puts = [service_pb2.PutRequest(session_id=f"b{n % 3}", state=s) for n, s in enumerate(big)]
    with CheckpointClient(sidecar.unix_target, max_message_bytes=4 << 20) as c:
        results = list(c.put_stream(puts, batch_size=64))
        assert [r.WhichOneof("outcome") for r in results] == ["response"] * 10
        assert [c.get(f"b{n}").state for n in range(3)] == [big[9], big[7], big[8]]


def test_put_stream_keeps_order_and_reports_each_write(sidecar: Sidecar) -> None:
    puts = []
    for n in range(1, 201):
        for s in ("a", "b", "c"):
            puts.append(service_pb2.PutRequest(session_id=s, state=patch(n), mode=service_pb2.WRITE_MODE_MERGE))
    puts.insert(50, service_pb2.PutRequest(session_id="a", state=b"x", expected_version=1))  # a conflict
    with CheckpointClient(sidecar.tcp_target) as c:
        results = list(c.put_stream(puts, batch_size=32))
        assert len(results) == len(puts)
        assert results[50].HasField("error") and results[50].error.code == grpc.StatusCode.ABORTED.value[0]
        ok = [r.response for r in results if r.HasField("response")]
        assert len(ok) == 600
        for s in ("a", "b", "c"):
            assert c.get(s).state == b"".join(patch(n) for n in range(1, 201))
            assert [h.version for h in c.history(s)] == list(range(200, 0, -1))


@pytest.mark.parametrize("how", ["unary", "stream"])
def test_a_large_merge_patch_is_checked_without_holding_other_calls(tmp_path: Path, how: str) -> None:
    """A MERGE patch's check reads every field in Python. It ran on the event loop: one 16 MiB patch of
    small fields held every other call of the sidecar ~10 s (health checks failed). Now on a thread."""
    sidecar = start_sidecar(tmp_path / "data")
    big_patch = b"\x10\x01" * (3 << 20)  # 6 MiB of 2-byte fields: seconds of checking
    late: list[float] = []
    answered = 0
    try:
        with CheckpointClient(sidecar.unix_target) as c:
            c.put("small", b"\x08\x01")
            done = threading.Event()

            def merge_big() -> None:
                try:
                    if how == "unary":
                        c.merge("big", big_patch)
                    else:
                        req = service_pb2.PutRequest(
                            session_id="big", state=big_patch, mode=service_pb2.WRITE_MODE_MERGE
                        )
                        (result,) = c.put_stream([req])
                        assert result.response.version == 1
                finally:
                    done.set()

            merging = threading.Thread(target=merge_big)
            merging.start()
            with CheckpointClient(sidecar.unix_target, retries=0, timeout_seconds=1.0) as probe:
                while not done.is_set():
                    began = time.monotonic()
                    try:
                        probe.get("small")
                        answered += 1
                    except DeadlineExceededError:
                        late.append(time.monotonic() - began)
            merging.join()
            assert c.get("big").state == big_patch
    finally:
        assert sidecar.stop() == 0, sidecar.log()
    assert late == []  # no Get waited a second behind the check
    assert answered >= 5  # Gets ran while the patch was checked


def test_async_client(sidecar: Sidecar) -> None:
    async def run() -> None:
        async with AsyncCheckpointClient(sidecar.unix_target) as c:
            await c.put("as", state(1))
            await c.merge("as", patch(2), expected_version=1)
            got = await c.get("as")
            assert got.state == state(1) + patch(2)
            assert [h.version async for h in c.history("as")] == [2, 1]
            with pytest.raises(ConflictError) as info:
                await c.put("as", state(3), expected_version=1)
            assert info.value.current_version == 2
            results = [r async for r in c.put_stream([service_pb2.PutRequest(session_id="as", state=state(4))])]
            assert results[0].response.version == 3
            assert (await c.fork("as", "as2")).head_version == 1
            assert await c.delete("as2") == 1

    asyncio.run(run())


def test_health_reflection_and_metrics(sidecar: Sidecar) -> None:
    with grpc.insecure_channel(sidecar.tcp_target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "ckpt.v1.CheckpointService"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        db = ProtoReflectionDescriptorDatabase(channel)
        services = set(db.get_services())
        assert {"ckpt.v1.CheckpointService", "grpc.health.v1.Health"} <= services
        put = db.FindFileContainingSymbol("ckpt.v1.CheckpointService")
        assert put.name == "ckpt/v1/service.proto"
    with CheckpointClient(sidecar.unix_target) as c:
        c.put("metric", state(2))
        c.get("metric")
        c.get("metric")
        streamed = (service_pb2.PutRequest(session_id=f"streamed-{i}", state=state(1)) for i in range(5))
        assert len(list(c.put_stream(streamed, batch_size=2))) == 5  # 3 batches
    port = sidecar.metrics_port  # type: ignore[attr-defined]

    def scrape() -> str:
        return str(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode())

    # Gets the gRPC process answers reach the metrics a moment later (storelink.SERVED_REPORT_SECONDS).
    deadline = time.monotonic() + 5
    while 'ckpt_requests_total{rpc="Get"} 2.0' not in (text := scrape()) and time.monotonic() < deadline:
        time.sleep(0.02)
    for needle in (
        'ckpt_requests_total{rpc="Put"} 1.0',
        'ckpt_requests_total{rpc="Get"} 2.0',
        'ckpt_requests_total{rpc="PutStream"} 1.0',
        'ckpt_request_seconds_count{rpc="PutStream"} 3.0',  # one per batch
        "ckpt_request_seconds_bucket",
        "ckpt_stored_bytes_total",
        # The gRPC process read the first Get from LMDB and answered the second from its reply cache.
        "ckpt_state_cache_hits_total 0.0",
        "ckpt_reply_cache_hits_total 1.0",
        "ckpt_group_commit_writes_bucket",
        "ckpt_commit_delays_total",
        "ckpt_commit_delay_seconds_total",
        "ckpt_chain_depth_bucket",
        'ckpt_cache_bytes{cache="encoder_cache"}',
        'ckpt_cache_bytes{cache="state_cache"}',
    ):
        assert needle in text, needle
    # The commits' time in LMDB (the puts above committed, each with its syncs).
    committing = re.search(r"^ckpt_commit_seconds_total (\S+)$", text, re.MULTILINE)
    assert committing is not None and float(committing.group(1)) > 0, text


def test_a_second_server_is_refused(sidecar: Sidecar, tmp_path: Path) -> None:
    same_dir = start_or_fail(tmp_path / "data", sidecar.unix_target, sidecar.tcp_target)
    # It names the process to stop: `ckpt serve`, never its store process.
    assert f"data directory {tmp_path / 'data'} is in use by pid {sidecar.process.pid}" in same_dir, same_dir
    assert f"(ckpt serve; its store process is pid {sidecar.process.pid}" not in same_dir
    assert "(ckpt serve; its store process is pid " in same_dir
    other = tmp_path / "other"
    same_socket = start_or_fail(other, sidecar.unix_target, f"127.0.0.1:{free_port()}")
    assert f"another server is listening on {sidecar.unix_target}" in same_socket
    same_port = start_or_fail(tmp_path / "third", f"unix:{tmp_path / 'third.sock'}", sidecar.tcp_target)
    assert f"cannot listen on {sidecar.tcp_target}: {sidecar.tcp_target} is in use (another process listens there)" in (
        same_port
    )
    with CheckpointClient(sidecar.unix_target) as c:  # the first one is unaffected
        c.put("still", b"\x08\x01")


def test_a_host_name_with_one_of_its_addresses_taken_is_refused(tmp_path: Path) -> None:
    # gRPC binds `localhost:P` if either loopback is free; this one would have served on ::1 only.
    taken = socket.socket()
    taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    with taken:
        refused = start_or_fail(tmp_path / "data", f"unix:{tmp_path / 'a.sock'}", f"localhost:{port}")
    assert (
        f"cannot listen on localhost:{port}: 127.0.0.1:{port} is in use (another process listens there),"
        " and localhost stands for it"
    ) in refused
    assert "ckpt serving" not in refused
    sidecar = start_sidecar(tmp_path / "data", "--listen", f"localhost:{port}")  # free now: it serves
    try:
        with CheckpointClient(f"127.0.0.1:{port}") as c:
            assert c.put("by-name", b"\x08\x01").version == 1
    finally:
        assert sidecar.stop() == 0


def test_a_data_directory_that_is_a_file_is_refused_in_one_line(tmp_path: Path) -> None:
    """The store process used to die with a traceback here (NotADirectoryError is no StoreError)."""
    path = tmp_path / "data"
    path.write_text("a file")
    refused = start_or_fail(path, f"unix:{tmp_path / 'a.sock'}", f"127.0.0.1:{free_port()}")
    assert f"the data directory is not a directory: '{path}'" in refused
    assert "Traceback" not in refused and "ckpt serving" not in refused
    assert path.read_text() == "a file"


def start_or_fail(data_dir: Path, unix: str, tcp: str, *extra: str) -> str:
    import subprocess
    import sys

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ckpt.sidecar.cli",
            "serve",
            "--data-dir",
            str(data_dir),
            *("--listen", unix, "--listen", tcp),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    return proc.stderr


def test_sigterm_finishes_in_flight_writes_and_exits_0(tmp_path: Path) -> None:
    sidecar = start_sidecar(tmp_path / "data")
    acked: dict[str, int] = {}
    stop = threading.Event()
    lock = threading.Lock()

    def writer(n: int) -> None:
        with CheckpointClient(sidecar.unix_target, retries=0) as c:
            v = 0
            while not stop.is_set():
                try:
                    r = c.put(f"w{n}", state(v % 5 + 1))
                except Exception:
                    return  # the server went away: unacknowledged, may or may not be stored
                v = r.version
                with lock:
                    acked[f"w{n}"] = v

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    while sum(acked.values()) < 200:
        threading.Event().wait(0.01)
    assert sidecar.stop(signal.SIGTERM) == 0, sidecar.log()
    stop.set()
    for t in threads:
        t.join()
    log = sidecar.log()
    assert "ckpt serving" in log and "ckpt stopping" in log and "ckpt stopped" in log
    restarted = start_sidecar(tmp_path / "data")
    try:
        with CheckpointClient(restarted.unix_target) as c:
            for session, version in acked.items():
                assert c.get(session).version >= version
                assert c.get(session, version).state == state((version - 1) % 5 + 1)
    finally:
        assert restarted.stop() == 0


def test_sigkill_under_load_then_restart_keeps_every_acknowledged_write(tmp_path: Path) -> None:
    sidecar = start_sidecar(tmp_path / "data")
    acked: dict[str, list[int]] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def writer(n: int) -> None:
        session = f"k{n}"
        with CheckpointClient(sidecar.unix_target, retries=0) as c:
            while not stop.is_set():
                try:
                    r = c.merge(session, patch(n))
                except Exception:
                    return
                with lock:
                    acked.setdefault(session, []).append(r.version)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    while sum(len(v) for v in acked.values()) < 500:
        threading.Event().wait(0.01)
    sidecar.stop(signal.SIGKILL)
    stop.set()
    for t in threads:
        t.join()
    restarted = start_sidecar(tmp_path / "data")
    try:
        with CheckpointClient(restarted.unix_target) as c:
            for session, versions in acked.items():
                n = int(session[1:])
                head = c.get(session)
                assert head.version >= max(versions)
                assert head.state == patch(n) * head.version  # whole versions only
                for v in versions:
                    assert c.get(session, v).state == patch(n) * v
    finally:
        assert restarted.stop() == 0


class _Failed(grpc.RpcError):  # type: ignore[misc]  # grpc is untyped
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code


@pytest.mark.parametrize(
    ("code", "retry", "attempt", "expected"),
    [
        (grpc.StatusCode.UNAVAILABLE, True, 0, 0.05),
        (grpc.StatusCode.DEADLINE_EXCEEDED, True, 2, 0.2),
        (grpc.StatusCode.UNAVAILABLE, True, 5, 1.0),  # capped
        (grpc.StatusCode.UNAVAILABLE, True, 6, None),  # out of retries (6 allowed)
        (grpc.StatusCode.UNAVAILABLE, False, 0, None),  # fork/delete are never retried
        (grpc.StatusCode.ABORTED, True, 0, None),  # a conflict is an answer, not a failure
    ],
)
def test_both_clients_share_one_retry_policy(
    code: grpc.StatusCode, retry: bool, attempt: int, expected: float | None
) -> None:
    assert _retry_delay_seconds(_Failed(code), retry=retry, attempt=attempt, retries=6) == expected
