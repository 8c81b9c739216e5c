"""`ckpt serve --workers N`: several real sidecar processes on one data directory and one TCP port.

Each client connection lands on one worker (the kernel spreads them); the
tests find out which, then write a session through one worker and read or
write it through the other, where that worker's caches (state, encoder) are
stale unless checked against LMDB.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckpt.codec.frame import FrameKind, parse
from ckpt.sidecar.client import (
    CheckpointClient,
    ConflictError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    parse_state,
)
from ckpt.sidecar.config import StoreConfig
from ckpt.sidecar.errors import Unavailable
from ckpt.sidecar.server.process import SidecarProcess, start_sidecar_process
from ckpt.sidecar.store import Store, lock_data_dir
from ckpt.v1 import service_pb2
from tests.support import agent_file, agent_state_class, agent_step, free_port

CONNECTIONS = 24  # all on one worker by chance: 2 in 2**24


def start_workers(data_dir: Path, *extra: str, workers: int = 2) -> tuple[SidecarProcess, list[str]]:
    """``ckpt serve --workers`` on a free TCP port; the sidecar and each worker's metrics address."""
    sidecar = start_sidecar_process(
        data_dir,
        "--workers",
        str(workers),
        "--metrics-port",
        "0",
        *extra,
        listen=[f"127.0.0.1:{free_port()}"],
        log_path=data_dir.parent / f"{data_dir.name}-{time.monotonic_ns()}.log",
        inherit_ckpt_env=False,
    )
    metrics = {}
    for line in sidecar.log().splitlines():
        if m := re.search(r"ckpt worker (\d+) serving: .* metrics=(\S+) pid=", line):
            metrics[int(m.group(1))] = m.group(2)
    assert sorted(metrics) == list(range(workers)), sidecar.log()
    return sidecar, [metrics[i] for i in range(workers)]


def _requests(metrics_address: str) -> float:
    text = urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=10).read().decode()
    return sum(float(v) for v in re.findall(r'^ckpt_requests_total\{rpc="Get"\} (\S+)$', text, re.M))


def clients_by_worker(target: str, metrics: list[str]) -> list[list[CheckpointClient]]:
    """CONNECTIONS clients, each on its own connection, grouped by the worker that serves it."""
    by_worker: list[list[CheckpointClient]] = [[] for _ in metrics]
    for _ in range(CONNECTIONS):
        client = CheckpointClient(target, own_connection=True)  # as another agent process would have
        before = [_requests(m) for m in metrics]
        with pytest.raises(NotFoundError):
            client.get("no-such-session")
        after = [_requests(m) for m in metrics]
        (served,) = [i for i, (b, a) in enumerate(zip(before, after, strict=True)) if a > b]
        by_worker[served].append(client)
    return by_worker


@contextlib.contextmanager
def serving_workers(data_dir: Path, *extra: str) -> Iterator[list[list[CheckpointClient]]]:
    """Two workers and CONNECTIONS clients grouped by worker; every group has one at least. Stopped after: exit 0."""
    sidecar, metrics = start_workers(data_dir, *extra)
    by_worker = clients_by_worker(sidecar.targets[0], metrics)
    try:
        assert all(by_worker), f"every connection landed on one worker: {[len(c) for c in by_worker]}"
        yield by_worker
    finally:
        for clients in by_worker:
            for c in clients:
                c.close()
        assert sidecar.stop() == 0, sidecar.log()


@pytest.fixture
def two_workers(tmp_path: Path) -> Iterator[tuple[CheckpointClient, CheckpointClient]]:
    with serving_workers(tmp_path / "data") as by_worker:
        yield by_worker[0][0], by_worker[1][0]


def _patch(step: int) -> bytes:
    return service_pb2.PutRequest(session_id=f"step-{step}").SerializeToString()


def test_a_session_moves_between_workers_and_every_version_reads_back(
    two_workers: tuple[CheckpointClient, CheckpointClient],
) -> None:
    a, b = two_workers
    s1, s2 = b"state one " * 50, b"state two " * 60
    assert a.put("s", s1).version == 1
    assert b.get("s").state == s1
    assert b.put("s", s2).version == 2  # b resumes the chain a wrote
    got = a.get("s")  # a's state cache holds version 1
    assert (got.version, got.state) == (2, s2)
    assert a.merge("s", _patch(3)).version == 3  # a's encoder is at version 1: resumed from LMDB
    expected = {1: s1, 2: s2, 3: s2 + _patch(3)}
    for client in (a, b):
        assert client.get("s").state == expected[3]
        for version, state in expected.items():
            assert client.get("s", version=version).state == state


def test_events_appended_on_one_worker_are_read_at_once_on_the_other(
    two_workers: tuple[CheckpointClient, CheckpointClient],
) -> None:
    """Each worker's gRPC process reads a small ReadEvents from LMDB itself: it sees the other's appends."""
    a, b = two_workers
    for i in range(1, 6):
        writer, reader = (a, b) if i % 2 else (b, a)
        assert writer.append_events("log", [service_pb2.Event(type="step", payload=b"%d" % i)]).last_seq == i
        assert [e.payload for e in reader.events("log")] == [b"%d" % n for n in range(1, i + 1)]


def test_a_session_deleted_and_written_again_elsewhere_is_not_continued_from_a_cached_encoder(
    two_workers: tuple[CheckpointClient, CheckpointClient],
) -> None:
    a, b = two_workers
    old = [b"old incarnation %d " % v * 40 for v in range(1, 4)]
    for state in old:
        a.put("s", state)
    assert a.get("s").state == old[-1]  # a caches version 3, state and encoder
    assert b.delete("s") == 3
    new = [b"new incarnation %d " % v * 45 for v in range(1, 4)]
    for state in new:
        b.put("s", state)  # version 3 again, other bytes
    got = a.get("s")
    assert (got.version, got.state) == (3, new[-1])
    # a's cached encoder is at version 3 with the same chain start: only the
    # session's creation time tells it is another session's stream.
    assert a.merge("s", _patch(4)).version == 4
    for client in (a, b):
        assert client.get("s").state == new[-1] + _patch(4)
        for version, state in enumerate(new, start=1):
            assert client.get("s", version=version).state == state


def test_a_head_rewritten_as_a_keyframe_by_the_sweeping_worker_is_not_continued(tmp_path: Path) -> None:
    # Worker 0 sweeps for all: it rewrites a quiet head as a FULL frame, so the
    # next write through worker 1 must start a new stream after it.
    quick_keyframes = ("--keyframe-after-quiet-seconds", "0.3", "--sweep-interval-seconds", "0.1")
    with serving_workers(tmp_path / "data", *quick_keyframes) as by_worker:
        w1 = by_worker[1][0]
        rng = random.Random(7)
        states = [rng.randbytes(30_000)]
        for _ in range(3):
            states.append(states[-1] + rng.randbytes(300))  # each a small DELTA on the one before
        w1.put("k", states[0])
        assert w1.put("k", states[1]).frame_kind == service_pb2.FRAME_KIND_DELTA
        assert w1.put("k", states[2]).frame_kind == service_pb2.FRAME_KIND_DELTA
        deadline = time.monotonic() + 20
        while next(iter(w1.history("k"))).frame_kind != service_pb2.FRAME_KIND_FULL:
            assert time.monotonic() < deadline, "the sweeper never rewrote the quiet head"
            time.sleep(0.1)
        # Worker 1's state cache holds version 3 as it wrote it (a DELTA): a hot
        # Get must not describe the frame as it was before the rewrite.
        got = w1.get("k")
        assert (got.version, got.info.frame_kind) == (3, service_pb2.FRAME_KIND_FULL)
        # Worker 1's cached encoder is at the head's version, its zstd stream
        # begun at version 1: continuing it after the keyframe would leave a
        # frame whose blocks lean on blocks (repeat offsets, entropy tables)
        # the decoder no longer reads before it, so a new stream must start.
        assert w1.put("k", states[3]).frame_kind == service_pb2.FRAME_KIND_DELTA
        for client in (by_worker[0][0], w1):
            for version, state in enumerate(states, start=1):
                assert client.get("k", version=version).state == state
        with Store(StoreConfig(data_dir=tmp_path / "data"), readonly=True) as store:
            _, frames = store.frames_of("k")
        headers = {version: parse(frame)[0] for version, _, frame in frames}
        assert headers[3].kind is FrameKind.FULL
        assert not headers[4].continues_stream and headers[4].prefix_size == len(states[2])


def test_compare_and_set_across_workers_loses_no_update(tmp_path: Path) -> None:
    with serving_workers(tmp_path / "data") as by_worker:
        clients = [*by_worker[0][:4], *by_worker[1][:4]]  # writers on both workers
        base = b"base state " * 30
        clients[0].put("cas", base)
        wins: list[tuple[int, bytes]] = []
        lock = threading.Lock()
        errors: list[BaseException] = []

        def writer(i: int) -> None:
            try:
                made = 0
                while made < 15:
                    head = clients[i].get("cas").version
                    patch = _patch(1000 * i + made)
                    try:
                        version = clients[i].merge("cas", patch, expected_version=head).version
                    except ConflictError:
                        continue
                    assert version == head + 1
                    with lock:
                        wins.append((version, patch))
                    made += 1
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(len(clients))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        versions = sorted(v for v, _ in wins)
        assert versions == list(range(2, 2 + 15 * len(clients)))  # every win its own version, none lost
        expected = base + b"".join(p for _, p in sorted(wins))
        for client in (by_worker[0][0], by_worker[1][0]):
            assert client.get("cas").state == expected


def _worker_pids(parent: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(parent)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _wait_gone(pids: list[int], seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not all(_gone(p) for p in pids):
        assert time.monotonic() < deadline, f"workers still running: {[p for p in pids if not _gone(p)]}"
        time.sleep(0.05)


def test_a_second_server_is_refused_and_sigterm_stops_every_worker(tmp_path: Path) -> None:
    sidecar, _ = start_workers(tmp_path / "data")
    workers = _worker_pids(sidecar.process.pid)
    assert len(workers) == 2
    with pytest.raises(RuntimeError, match="in use by"):
        start_sidecar_process(tmp_path / "data", listen=[f"127.0.0.1:{free_port()}"], inherit_ckpt_env=False)
    with CheckpointClient(sidecar.targets[0]) as c:
        c.put("s", b"x")
    assert sidecar.stop() == 0
    _wait_gone(workers)
    log = sidecar.log()
    assert log.count("ckpt stopped:") == 3, log  # each worker, then the parent


def test_a_worker_that_dies_stops_the_rest_and_the_parent_exits_1(tmp_path: Path) -> None:
    sidecar, _ = start_workers(tmp_path / "data")
    workers = _worker_pids(sidecar.process.pid)
    os.kill(workers[0], signal.SIGKILL)
    assert sidecar.process.wait(timeout=60) == 1
    _wait_gone(workers)
    assert "was killed by SIGKILL; stopping the others" in sidecar.log()


def test_workers_die_with_a_killed_parent(tmp_path: Path) -> None:
    sidecar, _ = start_workers(tmp_path / "data")
    workers = _worker_pids(sidecar.process.pid)
    sidecar.process.kill()
    sidecar.process.wait(timeout=30)
    _wait_gone(workers)


def test_the_lock_is_held_while_a_killed_workers_store_process_lives(tmp_path: Path) -> None:
    """A worker's store process outlives its worker while it commits what was queued: the data directory
    stays locked until it is gone, as with one process. It did not hold the lock: with its worker and the
    parent gone, a new server could open the store beside it."""
    data_dir = tmp_path / "data"
    sidecar, _ = start_workers(data_dir)
    workers = _worker_pids(sidecar.process.pid)
    (store_process,) = _worker_pids(workers[0])
    os.kill(store_process, signal.SIGSTOP)  # it cannot see its worker go, nor exit
    try:
        os.kill(workers[0], signal.SIGKILL)
        assert sidecar.process.wait(timeout=60) == 1
        _wait_gone(workers)
        with pytest.raises(Unavailable, match="in use by"):
            lock_data_dir(data_dir)
    finally:
        os.kill(store_process, signal.SIGCONT)
    _wait_gone([store_process])  # its link closed: it commits, closes LMDB and exits
    lock_data_dir(data_dir).close()


@pytest.mark.parametrize(
    "listen",
    [None, "unix:{tmp}/ckpt.sock", "127.0.0.1:0"],
    ids=["default unix socket", "unix socket", "port 0"],
)
def test_workers_need_tcp_addresses_with_a_fixed_port(tmp_path: Path, listen: str | None) -> None:
    cmd = [sys.executable, "-m", "ckpt.sidecar.cli", "serve", "--data-dir", str(tmp_path / "data"), "--workers", "2"]
    if listen is not None:
        cmd += ["--listen", listen.format(tmp=tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "--workers > 1 needs TCP --listen addresses with a fixed port (host:port)" in proc.stderr, proc.stderr


def test_a_port_another_process_listens_on_is_refused(tmp_path: Path) -> None:
    port = free_port()
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # it would share the port with the workers
        other.bind(("127.0.0.1", port))
        other.listen()
        cmd = [sys.executable, "-m", "ckpt.sidecar.cli", "serve", "--data-dir", str(tmp_path / "data")]
        cmd += ["--workers", "2", "--listen", f"127.0.0.1:{port}"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert f"cannot listen on 127.0.0.1:{port}: 127.0.0.1:{port} is in use by another process" in proc.stderr


_GROW_CHILD = """
import random
import sys
from pathlib import Path
from ckpt.sidecar.config import StoreConfig
from ckpt.sidecar.store.engine import Store
store = Store(StoreConfig(data_dir=Path(sys.argv[1]), map_size_bytes=1 << 20, max_map_size_bytes=64 << 20), shared=True)
for i in range(40):
    store.put(f"grow-{i}", random.Random(i).randbytes(100_000) + i.to_bytes(4, "big"))  # incompressible
store.close()
print(store.counters.map_resizes)
"""


def test_a_shared_store_adopts_a_map_another_process_grew(tmp_path: Path) -> None:
    tmp_path.joinpath("data").mkdir()
    lock = lock_data_dir(tmp_path / "data")  # as the workers' parent holds it
    try:
        config = StoreConfig(data_dir=tmp_path / "data", map_size_bytes=1 << 20, max_map_size_bytes=64 << 20)
        with Store(config, shared=True, sweeper=False) as store:
            store.put("here", b"before")
            child = subprocess.run(
                [sys.executable, "-c", _GROW_CHILD, str(tmp_path / "data")],
                capture_output=True,
                text=True,
                timeout=120,
                cwd=Path(__file__).resolve().parents[2],
            )
            assert child.returncode == 0, child.stderr
            assert int(child.stdout) >= 1  # the other process grew the map
            assert store.put("here", b"after").version == 2  # begin failed with MDB_MAP_RESIZED, then adopted
            assert store.get("grow-39").state.endswith((39).to_bytes(4, "big"))
            assert store.get("here").state == b"after"
    finally:
        lock.close()


def test_sigkill_of_every_worker_under_load_keeps_every_acknowledged_write(tmp_path: Path) -> None:
    # Own sessions (REPLACE) and one session all writers merge into with
    # compare-and-set, through connections on both workers; then every process
    # is killed at once, and one plain sidecar reads what was acknowledged.
    data = tmp_path / "data"
    acked: list[tuple[str, int, bytes]] = []  # (session, version, REPLACE state or MERGE patch)
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[BaseException] = []
    sidecar, metrics = start_workers(data)
    by_worker = clients_by_worker(sidecar.targets[0], metrics)
    clients = [*by_worker[0][:4], *by_worker[1][:4]]
    assert by_worker[0] and by_worker[1], [len(g) for g in by_worker]  # writers on both workers
    clients[0].put("shared", b"base")

    def own_state(i: int, v: int) -> bytes:
        return random.Random(i * 1000 + v).randbytes(2000) + b"writer %d version %d" % (i, v)

    def writer(i: int) -> None:
        client, made = clients[i], 0
        try:
            while not stop.is_set():
                made += 1
                version = client.put(f"own-{i}", own_state(i, made)).version
                with lock:
                    acked.append((f"own-{i}", version, own_state(i, made)))
                head = client.get("shared").version
                patch = _patch(i * 100_000 + made)
                try:
                    version = client.merge("shared", patch, expected_version=head).version
                except ConflictError:
                    continue
                with lock:
                    acked.append(("shared", version, patch))
        except Exception as exc:  # the kill: calls in flight fail, with their outcome unknown
            if not stop.is_set():
                errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while len(acked) < 300 and time.monotonic() < deadline and not errors:
        time.sleep(0.01)
    workers = _worker_pids(sidecar.process.pid)
    stop.set()
    for pid in [*workers, sidecar.process.pid]:
        os.kill(pid, signal.SIGKILL)
    sidecar.process.wait(timeout=30)
    for t in threads:
        t.join(60)
    for c in clients:
        c.close()
    assert not errors, errors
    assert len(acked) >= 300
    verify = subprocess.run(
        [sys.executable, "-m", "ckpt.sidecar.cli", "verify", "--data-dir", str(data)], capture_output=True, timeout=300
    )
    assert verify.returncode == 0, verify.stderr.decode()
    checker = start_sidecar_process(data, listen=[f"127.0.0.1:{free_port()}"], inherit_ckpt_env=False)
    try:
        with CheckpointClient(checker.targets[0]) as c:
            shared = {v: p for s, v, p in acked if s == "shared"}
            for session, version, data_bytes in acked:
                state = c.get(session, version=version).state
                if session != "shared":
                    assert state == data_bytes, (session, version)
                    continue
                assert state.endswith(data_bytes), version  # the merge acknowledged as this version
                if version - 1 in shared or version == 2:
                    assert state == c.get(session, version=version - 1).state + data_bytes
    finally:
        assert checker.stop() == 0, checker.log(tail_chars=3000)


def test_a_type_registered_through_one_worker_is_known_to_the_other(
    two_workers: tuple[CheckpointClient, CheckpointClient],
) -> None:
    """A worker that does not know a type reloads the registry before refusing a put naming it; one whose
    registry is behind (a re-registration by the other) reloads it in the write's transaction."""
    a, b = two_workers
    v1, v2 = agent_state_class(), agent_state_class(agent_file(summary=True))
    with pytest.raises(FailedPreconditionError, match="is not registered"):
        b.merge("s", message=agent_step(v1, 1))
    a.register_type(v1)
    assert b.merge("s", message=agent_step(v1, 1)).version == 1  # b had never heard of it: its encoder is v1's
    with pytest.raises(InvalidArgumentError, match=r"field 2 \(log\)"):
        b.merge("s", b"\x12\x01\xff")
    a.register_type(v2)  # summary (field 5) added: b's registry is now behind
    with pytest.raises(InvalidArgumentError, match=r"field 5 \(summary\) at offset 0"):
        b.merge("s", b"\x2a\x01\xff")  # unknown to version 1, a string to version 2
    assert b.merge("s", message=v2(summary="kept")).version == 2
    assert parse_state(a.get("s"), v2).summary == "kept"


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
    return found


def test_a_second_workers_server_started_while_the_first_starts_its_workers_is_refused_the_port(
    tmp_path: Path,
) -> None:
    """The first's workers bind the port about a second after its parent checked it: a second server's
    check in between passed, and both servers' workers shared the port, writes landing in either store."""
    port = free_port()

    def serve(name: str) -> subprocess.Popen[str]:
        cmd = [sys.executable, "-m", "ckpt.sidecar.cli", "serve", "--data-dir", str(tmp_path / name)]
        cmd += ["--workers", "2", "--listen", f"127.0.0.1:{port}"]
        with open(tmp_path / f"{name}.log", "w") as log:
            return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)

    first = serve("first")
    first_log = tmp_path / "first.log"
    try:
        deadline = time.monotonic() + 30
        while not _children(first.pid):  # its parent checked the port, and starts its workers
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        second = serve("second")
        try:
            second.wait(30)
        except subprocess.TimeoutExpired:
            second.send_signal(signal.SIGTERM)
            second.wait(90)
            pytest.fail(f"the second server shares the port:\n{(tmp_path / 'second.log').read_text()}")
        out = (tmp_path / "second.log").read_text()
        assert second.returncode == 1, out
        assert f"cannot listen on 127.0.0.1:{port}: 127.0.0.1:{port} is in use by another process" in out
        while "ckpt serving:" not in first_log.read_text():  # the first serves on
            assert first.poll() is None and time.monotonic() < deadline, first_log.read_text()
            time.sleep(0.05)
        with CheckpointClient(f"127.0.0.1:{port}") as client:
            client.put("s", b"")
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(90)
    assert first.returncode == 0, first_log.read_text()
