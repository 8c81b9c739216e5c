"""Starting and stopping a real `ckpt serve`: what it does to its socket path and how long it takes."""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from ckpt.sidecar.client import CheckpointClient
from ckpt.sidecar.config import ServeConfig
from ckpt.sidecar.server.serving import serve_async
from tests.store.test_write_backlog import lmdb_write_lock_held
from tests.support import ROOT, free_port, start_sidecar

#: tgkill(2)'s number by machine: a signal to one thread of another process (os.kill picks the thread itself).
_SYS_TGKILL = {"x86_64": 234, "aarch64": 131}


def test_a_listen_path_that_is_not_a_socket_is_refused_and_left_alone(tmp_path: Path) -> None:
    # connect() to a regular file is refused as a dead socket's is; the file was deleted and replaced.
    path = tmp_path / "notes.txt"
    path.write_text("keep me")
    data_dir = tmp_path / "data"
    proc = subprocess.run(
        [sys.executable, "-m", "ckpt.sidecar.cli", "serve", "--data-dir", str(data_dir), "--listen", f"unix:{path}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    assert f"cannot listen on unix:{path}: it exists and is not a socket" in proc.stderr
    assert path.read_text() == "keep me"


def test_a_unix_path_too_long_for_a_socket_address_is_named_with_the_limit(tmp_path: Path) -> None:
    # gRPC's own error said only "Failed to bind"; its log line named the limit.
    path = tmp_path / ("s" * max(1, 108 - len(str(tmp_path)) - 1))
    assert len(str(path)) == 108
    args = ["serve", "--data-dir", str(tmp_path / "data"), "--listen", f"unix:{path}"]
    proc = subprocess.run(
        [sys.executable, "-m", "ckpt.sidecar.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    assert f"cannot listen on unix:{path}: the path is 108 bytes, over the 107 a unix socket's address holds" in (
        proc.stderr
    )


def test_the_log_names_the_port_bound_for_port_0(tmp_path: Path) -> None:
    sidecar = start_sidecar(tmp_path / "data", "--listen", "127.0.0.1:0")
    try:
        found = re.search(r"ckpt serving: listen=unix:\S+,127\.0\.0\.1:\d+,127\.0\.0\.1:(\d+) ", sidecar.log())
        assert found and found.group(1) != "0", sidecar.log()
        with CheckpointClient(f"127.0.0.1:{found.group(1)}") as c:  # the port the log names serves
            assert c.put("port-0", b"\x08\x01").version == 1
    finally:
        assert sidecar.stop() == 0
    assert re.search(rf"ckpt stopping: listen=\S+,127\.0\.0\.1:{found.group(1)} data_dir=", sidecar.log())


def test_the_start_and_stop_lines_name_the_data_directory_alike(tmp_path: Path) -> None:
    # The serving line gave the resolved path, the stopping and stopped lines the one given
    # (relative, or here with a ".."): a search of the logs for one directory missed its stops.
    (tmp_path / "elsewhere").mkdir()
    sidecar = start_sidecar(tmp_path / "elsewhere" / ".." / "data")
    assert sidecar.stop() == 0
    named = re.findall(r"ckpt (serving|stopping|stopped): .*?data_dir=(\S+)", sidecar.log())
    assert [line for line, _ in named] == ["serving", "stopping", "stopped"], sidecar.log()
    assert {path for _, path in named} == {str(tmp_path / "data")}, sidecar.log()


def test_health_watch_and_reflection_streams_do_not_hold_shutdown(tmp_path: Path) -> None:
    # Both stay open for as long as their clients like; the grace period is for the service's calls.
    sidecar = start_sidecar(tmp_path / "data", "--grace-seconds", "600")
    channel = grpc.insecure_channel(sidecar.unix_target)
    watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
    asks = threading.Event()

    def reflection_requests() -> Iterator[reflection_pb2.ServerReflectionRequest]:
        yield reflection_pb2.ServerReflectionRequest(list_services="")
        asks.wait(600)  # the stream stays open

    reflecting = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(reflection_requests())
    assert next(reflecting).list_services_response.service
    try:
        # 600 s of grace would make this wait time out: the exit must not wait for either stream.
        assert sidecar.stop(signal.SIGTERM, timeout_seconds=60) == 0, sidecar.log()
        assert "ckpt stopped" in sidecar.log()
    finally:
        asks.set()
        channel.close()
        if sidecar.process.poll() is None:
            sidecar.process.kill()


def test_a_stopping_server_keeps_its_hands_off_the_socket_of_the_server_that_took_its_path(tmp_path: Path) -> None:
    # A stops listening when its grace period starts, while a write keeps it running; B, on another
    # data directory, claims the free path meanwhile. A's exit used to delete B's socket.
    socket_path = tmp_path / "shared.sock"
    a = start_sidecar(tmp_path / "a", "--grace-seconds", "600", socket_path=socket_path)
    b = None
    try:
        with CheckpointClient(a.unix_target, retries=0) as client, concurrent.futures.ThreadPoolExecutor(1) as pool:
            with lmdb_write_lock_held(a):
                write = pool.submit(client.put, "s", b"\x08\x01")
                time.sleep(0.2)  # the write is in A's writer, waiting for the lock
                a.process.send_signal(signal.SIGTERM)
                deadline = time.monotonic() + 30
                while "ckpt stopping" not in a.log():
                    assert time.monotonic() < deadline, a.log()
                    time.sleep(0.02)
                b = start_sidecar(tmp_path / "b", socket_path=socket_path, port=free_port())
                assert not write.done()
            assert write.result(30).version == 1  # A finished its write
        assert a.stop() == 0, a.log()
        assert socket_path.is_socket()
        with CheckpointClient(b.unix_target, retries=0) as client:
            assert client.put("on-b", b"\x08\x01").version == 1
    finally:
        for sidecar in (a, b):
            if sidecar is not None and sidecar.process.poll() is None:
                sidecar.stop()


def test_a_metrics_port_in_use_is_named_before_anything_serves_and_port_0_is_logged(tmp_path: Path) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    socket_path = tmp_path / "ckpt.sock"
    with taken:
        args = ["serve", "--data-dir", str(tmp_path / "data"), "--listen", f"unix:{socket_path}"]
        proc = subprocess.run(
            [sys.executable, "-m", "ckpt.sidecar.cli", *args, "--metrics-port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 1, proc.stderr
    assert (
        f"ckpt cannot start: cannot serve metrics on 127.0.0.1:{port} (--metrics-address, --metrics-port):"
        " Address already in use"
    ) in proc.stderr
    assert "ckpt serving" not in proc.stderr and not socket_path.exists()  # failed before gRPC bound anything
    sidecar = start_sidecar(tmp_path / "data", "--metrics-port", "0")  # any free port: the log says which
    try:
        found = re.search(r"ckpt serving: .* metrics=127\.0\.0\.1:(\d+) pid=", sidecar.log())
        assert found, sidecar.log()
        text = urllib.request.urlopen(f"http://127.0.0.1:{found.group(1)}/metrics", timeout=10).read()
        assert b"ckpt_commits" in text
    finally:
        assert sidecar.stop() == 0


def _scrape(host: str, port: int) -> bytes:
    return urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10).read()  # type: ignore[no-any-return]


def test_metrics_listen_on_the_address_asked_for(tmp_path: Path) -> None:
    # 127.0.0.2 is this host too, but reaches only a socket bound to every
    # address: what a Prometheus outside a container needs (0.0.0.0).
    sidecar = start_sidecar(tmp_path / "one", "--metrics-port", "0")
    try:
        port = int(re.search(r"metrics=127\.0\.0\.1:(\d+) pid=", sidecar.log()).group(1))  # type: ignore[union-attr]
        assert b"ckpt_commits" in _scrape("127.0.0.1", port)
        with pytest.raises(urllib.error.URLError):
            _scrape("127.0.0.2", port)
    finally:
        assert sidecar.stop() == 0
    sidecar = start_sidecar(tmp_path / "two", "--metrics-port", "0", "--metrics-address", "0.0.0.0")
    try:
        port = int(re.search(r"metrics=0\.0\.0\.0:(\d+) pid=", sidecar.log()).group(1))  # type: ignore[union-attr]
        assert b"ckpt_commits" in _scrape("127.0.0.2", port)
    finally:
        assert sidecar.stop() == 0


def test_a_metrics_address_that_does_not_resolve_is_named(tmp_path: Path) -> None:
    args = ["serve", "--data-dir", str(tmp_path / "data"), "--listen", f"unix:{tmp_path / 'ckpt.sock'}"]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ckpt.sidecar.cli",
            *args,
            "--metrics-port",
            "0",
            "--metrics-address",
            "no-such-host.invalid",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    assert "cannot serve metrics on no-such-host.invalid:0 (--metrics-address, --metrics-port):" in proc.stderr
    assert "ckpt serving" not in proc.stderr


def test_sigterm_never_goes_back_to_its_default_action_while_a_sidecar_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signal_dispositions: None
) -> None:
    """Every disposition SIGTERM gets, from start to exit: never SIG_DFL, which a repeated SIGTERM
    would turn into exit -15 (asyncio's remove_signal_handler resets to it: 2 runs in 25 of
    test_a_repeated_sigterm_still_exits_0 failed so)."""
    real_signal = signal.signal
    dispositions: list[object] = []

    def recording(sig: int, handler: Any) -> Any:
        if sig == signal.SIGTERM:
            dispositions.append(handler)
        return real_signal(sig, handler)

    monkeypatch.setattr(signal, "signal", recording)
    real_siginterrupt = signal.siginterrupt
    restarting: list[int] = []  # signals whose interrupted system calls restart (SA_RESTART), as asyncio set them

    def recording_siginterrupt(sig: int, flag: bool) -> None:
        if not flag:
            restarting.append(sig)
        real_siginterrupt(sig, flag)

    monkeypatch.setattr(signal, "siginterrupt", recording_siginterrupt)
    config = ServeConfig(data_dir=tmp_path / "data", listen=(f"unix:{tmp_path / 'ckpt.sock'}",))
    # serve_async handles signals: run it on this (the main) thread's loop.
    assert threading.current_thread() is threading.main_thread()
    hangup = signal.getsignal(signal.SIGHUP)
    try:
        exit_code = asyncio.run(serve_async(config, serving=lambda: os.kill(os.getpid(), signal.SIGTERM)))
    finally:
        real_signal(signal.SIGHUP, hangup)  # serve_async leaves it ignored too; signal_dispositions does the others
    assert exit_code == 0
    assert dispositions, "serving set no SIGTERM handler"
    assert signal.SIG_DFL not in dispositions, dispositions
    assert dispositions[-1] is signal.SIG_IGN
    # Else a signal landing on the writer thread mid-flush could fail the commit with EINTR.
    assert set(restarting) == {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
    assert real_signal(signal.SIGTERM, signal.SIG_IGN) is signal.SIG_IGN  # still ignored after the loop closed


def test_sigterm_delivered_to_another_thread_stops_an_idle_sidecar(tmp_path: Path) -> None:
    # The kernel may hand a process's signal to any of its threads (gRPC's, the writer); the event
    # loop, idle in epoll, must still wake: without a wake-up fd it slept on for over 15 s.
    sidecar = start_sidecar(tmp_path / "data")
    try:
        others = [int(t) for t in os.listdir(f"/proc/{sidecar.pid}/task") if int(t) != sidecar.pid]
        assert others
        # Looked up here, not at import: on another machine this test alone fails, naming it.
        assert platform.machine() in _SYS_TGKILL, f"tgkill's syscall number for {platform.machine()} is not known"
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syscall(_SYS_TGKILL[platform.machine()], sidecar.pid, others[0], signal.SIGTERM) != 0:
            raise OSError(ctypes.get_errno(), "tgkill failed")
        assert sidecar.process.wait(30) == 0, sidecar.log()
        assert "ckpt stopped" in sidecar.log()
    finally:
        sidecar.stop(signal.SIGKILL)


def _runs_uvloop(pid: int) -> bool:
    """Whether uvloop's extension is loaded into process ``pid``."""
    return "/uvloop/loop." in Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.parametrize("event_loop", [None, "asyncio"])
def test_the_sidecar_serves_on_uvloop_by_default_and_on_asyncio_when_asked(
    tmp_path: Path, event_loop: str | None
) -> None:
    sidecar = start_sidecar(tmp_path / "data", *(["--event-loop", event_loop] if event_loop else []))
    try:
        assert _runs_uvloop(sidecar.pid) is (event_loop is None)
        with CheckpointClient(sidecar.unix_target) as c:
            assert c.put("s", b"\x08\x01").version == 1
            assert c.merge("s", b"\x10\x02", expected_version=1).version == 2
            assert c.get("s").state == b"\x08\x01\x10\x02"
        with CheckpointClient(sidecar.targets[1]) as c:  # TCP too
            assert c.get("s", version=1).state == b"\x08\x01"
    finally:
        code = sidecar.stop()
    assert code == 0, sidecar.log()


def test_uvloop_asked_for_and_not_installed_is_named(tmp_path: Path) -> None:
    # A `uvloop` that fails to import, first on the path: as on a machine without it.
    (tmp_path / "shadow" / "uvloop").mkdir(parents=True)
    (tmp_path / "shadow" / "uvloop" / "__init__.py").write_text("raise ImportError('not here')\n")
    for extra in ([], ["--workers", "2", "--listen", f"127.0.0.1:{free_port()}"]):
        proc = subprocess.run(
            [sys.executable, "-m", "ckpt.sidecar.cli", "serve", "--data-dir", str(tmp_path / "data"), *extra],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": f"{tmp_path / 'shadow'}{os.pathsep}{ROOT}"},
            cwd=ROOT,
        )
        assert proc.returncode == 1, proc.stderr
        assert "event_loop is uvloop, which is not installed here (pip install uvloop);" in proc.stderr
        assert "--event-loop asyncio runs on the standard library's loop" in proc.stderr


def test_event_loop_must_be_one_offered(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="event_loop must be one of uvloop, asyncio, got 'trio'"):
        ServeConfig(data_dir=tmp_path, event_loop="trio")


@pytest.mark.parametrize(
    ("listen", "named"),
    [
        (["unix:{tmp}/x.sock", "unix:{tmp}/x.sock"], "twice"),
        (["unix:{tmp}/x.sock", "unix:{tmp}/./x.sock"], "both bind {tmp}/x.sock"),
        (["127.0.0.1:{port}", "127.0.0.1:{port}"], "twice"),
        (["localhost:{port}", "127.0.0.1:{port}"], "both bind 127.0.0.1:{port}"),
        # gRPC binds either wildcard on every address, IPv4 and IPv6: the second failed "in use by another process".
        (["0.0.0.0:{port}", "127.0.0.1:{port}"], "both bind 127.0.0.1:{port} (0.0.0.0 stands for every address)"),
        (["127.0.0.1:{port}", "0.0.0.0:{port}"], "both bind 127.0.0.1:{port} (0.0.0.0 stands for every address)"),
        (["[::]:{port}", "0.0.0.0:{port}"], "both bind port {port} of every address"),
        (["localhost:{port}", "[::]:{port}"], "both bind ::1:{port} ([::] stands for every address)"),
        (["0.0.0.0:{port}", "0.0.0.0:{port}"], "twice"),
    ],
)
def test_an_address_given_twice_is_refused_naming_listen_not_another_server(
    tmp_path: Path, listen: list[str], named: str
) -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "ckpt.sidecar.cli", "serve", "--data-dir", str(tmp_path / "data")]
    for address in listen:
        cmd += ["--listen", address.format(tmp=tmp_path, port=port)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "--listen gives" in proc.stderr and named.format(tmp=tmp_path, port=port) in proc.stderr, proc.stderr
    assert "another" not in proc.stderr
    assert not list(tmp_path.glob("*.sock"))


def test_wildcard_addresses_on_port_0_clash_with_no_other(tmp_path: Path) -> None:
    """Port 0 binds a free port for each address: beside each other and the fixed 127.0.0.1 port."""
    sidecar = start_sidecar(tmp_path / "data", "--listen", "0.0.0.0:0", "--listen", "[::]:0")
    try:
        found = re.search(
            r"ckpt serving: listen=unix:\S+,127\.0\.0\.1:(\d+),0\.0\.0\.0:(\d+),\[::\]:(\d+) ", sidecar.log()
        )
        assert found and "0" not in found.groups() and len(set(found.groups())) == 3, sidecar.log()
    finally:
        assert sidecar.stop() == 0


def test_a_unix_socket_bound_before_a_later_address_fails_is_removed(tmp_path: Path) -> None:
    port = free_port()
    with socket.socket() as other:
        other.bind(("127.0.0.1", port))
        other.listen()
        cmd = [sys.executable, "-m", "ckpt.sidecar.cli", "serve", "--data-dir", str(tmp_path / "data")]
        cmd += ["--listen", f"unix:{tmp_path}/x.sock", "--listen", f"127.0.0.1:{port}"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr
    assert not (tmp_path / "x.sock").exists()
