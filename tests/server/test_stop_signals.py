"""The signals that stop a real `ckpt serve` in order (docs/operations.md, Stopping): SIGHUP as SIGTERM,
and a stop signal that arrives while the sidecar, or a worker of ``--workers``, still starts: each exits 0,
its store processes stopped, its socket and the data directory's lock let go."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from ckpt.bench.output import child_pids
from ckpt.sidecar.client import CheckpointClient
from ckpt.sidecar.server import start_sidecar_process
from ckpt.sidecar.store import lock_data_dir
from ckpt.v1 import service_pb2, service_pb2_grpc
from tests.support import ROOT, free_port, start_sidecar


def _descendants(pid: int) -> list[int]:
    """Every process under ``pid``: workers and store processes (those run in sessions of their own)."""
    out, todo = [], [pid]
    while todo:
        for child in child_pids(todo.pop()):
            out.append(child)
            todo.append(child)
    return out


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _assert_all_gone(pids: list[int], seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while any(_running(p) for p in pids):
        assert time.monotonic() < deadline, f"still running: {[p for p in pids if _running(p)]}"
        time.sleep(0.02)


def _assert_lock_free(data_dir: Path) -> None:
    lock_data_dir(data_dir).close()  # raises naming the holder if a process still holds it


def _serve(
    tmp_path: Path, *args: str, nohup: bool = False, sigint: signal.Handlers = signal.SIG_DFL
) -> tuple[subprocess.Popen[bytes], Path]:
    """`ckpt serve` with ``args``, in a process session of its own (as a terminal's job), logging to a file;
    ``nohup``: run by nohup(1), which starts it with SIGHUP ignored; ``sigint``: SIGINT's disposition at
    its start (SIG_IGN: as a shell without job control starts a background job, ``ckpt serve &``)."""
    log = tmp_path / f"serve-{time.monotonic_ns()}.log"
    with log.open("wb") as out:
        cmd = [sys.executable, "-m", "ckpt.sidecar.cli", "serve", "--data-dir", str(tmp_path / "data"), *args]
        cmd = ["nohup", *cmd] if nohup else cmd
        process = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, sigint),
        )
    return process, log


def _wait_for(what: Callable[[], bool], process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while not what():
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.001)


def _loaded(pid: int, name: str) -> bool:
    """Whether process ``pid`` has mapped a file whose path holds ``name`` (an extension module it imports)."""
    try:
        return name in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def test_sighup_stops_a_sidecar_in_order_as_sigterm_does(tmp_path: Path) -> None:
    sidecar = start_sidecar(tmp_path / "data")
    try:
        store_processes = child_pids(sidecar.pid)
        assert store_processes
        with CheckpointClient(sidecar.unix_target) as client:
            client.put("a", b"\x08\x01")
        sidecar.process.send_signal(signal.SIGHUP)  # the terminal it runs in closed
        assert sidecar.process.wait(30) == 0, sidecar.log()
    finally:
        sidecar.stop(signal.SIGKILL)
    assert "ckpt stopped" in sidecar.log()
    assert not Path(sidecar.unix_target.removeprefix("unix:")).exists()
    _assert_all_gone(store_processes)
    _assert_lock_free(tmp_path / "data")


def test_sighup_to_a_workers_process_group_stops_the_parent_and_every_worker_in_order(tmp_path: Path) -> None:
    process, log = _serve(tmp_path, "--listen", f"127.0.0.1:{free_port()}", "--workers", "2")
    try:
        _wait_for(lambda: " ckpt serving: " in log.read_text() and "workers=2" in log.read_text(), process, log)
        processes = _descendants(process.pid)
        assert len(processes) == 4  # two workers, each with its store process
        os.killpg(process.pid, signal.SIGHUP)  # what closing the terminal sends its job
        assert process.wait(60) == 0, log.read_text()
    finally:
        process.kill()
        process.wait()
    text = log.read_text()
    assert text.count("ckpt stopped") == 3 and "Traceback" not in text, text
    _assert_all_gone(processes)
    _assert_lock_free(tmp_path / "data")


def _ignores(pid: int, sig: signal.Signals) -> bool:
    ignored = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("SigIgn:"))
    return bool(int(ignored.split()[1], 16) & (1 << (sig - 1)))


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_sidecar_started_by_nohup_keeps_serving_through_sighup_in_every_process(tmp_path: Path, workers: str) -> None:
    port = free_port()
    process, log = _serve(tmp_path, "--listen", f"127.0.0.1:{port}", "--workers", workers, nohup=True)
    try:
        _wait_for(lambda: " ckpt serving: " in log.read_text(), process, log)
        processes = _descendants(process.pid)
        assert len(processes) == (1 if workers == "1" else 4)  # its store process; or two workers with theirs
        assert all(_ignores(pid, signal.SIGHUP) for pid in [process.pid, *processes])
        os.killpg(process.pid, signal.SIGHUP)  # the terminal it was started from closed
        time.sleep(1)  # a stop would have begun, and been logged, by now
        with CheckpointClient(f"127.0.0.1:{port}", retries=0) as client:
            client.put("s", b"\x08\x01")
            assert client.get("s").state == b"\x08\x01"
        assert process.poll() is None and all(_running(pid) for pid in processes), log.read_text()
        assert "ckpt stopping" not in log.read_text()
        process.send_signal(signal.SIGTERM)  # it still stops in order
        assert process.wait(60) == 0, log.read_text()
    finally:
        process.kill()
        process.wait()
    _assert_all_gone(processes)
    _assert_lock_free(tmp_path / "data")


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_sidecar_started_with_sigint_ignored_keeps_serving_through_sigint_in_every_process(
    tmp_path: Path, workers: str
) -> None:
    """Started as `ckpt serve &` from a script (a shell without job control ignores SIGINT in its background
    jobs): a Ctrl-C in the terminal, which reaches the whole process group, leaves it serving."""
    port = free_port()
    process, log = _serve(tmp_path, "--listen", f"127.0.0.1:{port}", "--workers", workers, sigint=signal.SIG_IGN)
    try:
        _wait_for(lambda: " ckpt serving: " in log.read_text(), process, log)
        processes = _descendants(process.pid)
        assert len(processes) == (1 if workers == "1" else 4)  # its store process; or two workers with theirs
        with CheckpointClient(f"127.0.0.1:{port}", retries=0) as client:
            client.put("s", b"\x08\x01")
            os.killpg(process.pid, signal.SIGINT)  # Ctrl-C in the terminal it was started from
            time.sleep(1)  # a stop would have begun, and been logged, by now
            assert client.get("s").state == b"\x08\x01"
            client.put("s", b"\x08\x02")
        assert process.poll() is None and all(_running(pid) for pid in processes), log.read_text()
        assert "ckpt stopping" not in log.read_text()
        assert all(_ignores(pid, signal.SIGINT) for pid in [process.pid, *processes])
        process.send_signal(signal.SIGTERM)  # it still stops in order
        assert process.wait(60) == 0, log.read_text()
    finally:
        process.kill()
        process.wait()
    _assert_all_gone(processes)
    _assert_lock_free(tmp_path / "data")


def _store_process_started(pid: int) -> Callable[[], bool]:
    return lambda: bool(child_pids(pid))


def _importing_grpc(pid: int) -> Callable[[], bool]:
    return lambda: _loaded(pid, "cygrpc")


@pytest.mark.parametrize(
    ("sig", "when"),
    [
        (signal.SIGTERM, _store_process_started),
        (signal.SIGTERM, _importing_grpc),
        (signal.SIGINT, _importing_grpc),
        (signal.SIGHUP, _importing_grpc),
    ],
    ids=[
        "sigterm-as-the-store-process-starts",
        "sigterm-in-grpc-import",
        "sigint-in-grpc-import",
        "sighup-in-grpc-import",
    ],
)
def test_a_stop_signal_while_the_sidecar_starts_stops_it_in_order_once_it_serves(
    tmp_path: Path, sig: signal.Signals, when: Callable[[int], Callable[[], bool]]
) -> None:
    socket_path = tmp_path / "ckpt.sock"
    process, log = _serve(tmp_path, "--listen", f"unix:{socket_path}")
    try:
        _wait_for(when(process.pid), process, log)
        store_processes = child_pids(process.pid)
        process.send_signal(sig)  # before it serves: it imports grpc and the server still
        assert process.wait(60) == 0, log.read_text()
    finally:
        process.kill()
        process.wait()
    text = log.read_text()
    assert " ckpt serving: " in text and "ckpt stopped" in text, text
    assert not socket_path.exists()
    _assert_all_gone(store_processes)
    _assert_lock_free(tmp_path / "data")


# A SIGTERM at the first import the `ckpt` command makes past its entry module: the CLI's (its parser, the
# configuration), ~0.15 s before `ckpt serve` used to record stop signals.
_SIGTERM_AS_THE_CLI_LOADS = """
import importlib.abc, os, runpy, signal, sys


class SigtermAtCliImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "ckpt.sidecar.cli.main":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGTERM)
        return None


sys.meta_path.insert(0, SigtermAtCliImport())
module = sys.argv.pop(1)
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("entry", ["ckpt", "ckpt.sidecar.cli"], ids=["python -m ckpt", "python -m ckpt.sidecar.cli"])
def test_a_sigterm_as_the_cli_loads_stops_the_sidecar_in_order_once_it_serves(tmp_path: Path, entry: str) -> None:
    """From the entry module on (the `ckpt` command's, ckpt/command.py, or ``python -m ckpt.sidecar.cli``'s),
    a SIGTERM right after `ckpt serve` started is kept: it serves, then stops in order (exit 0)."""
    socket_path = tmp_path / "ckpt.sock"
    log = tmp_path / "serve.log"
    data = ["--data-dir", str(tmp_path / "data"), "--listen", f"unix:{socket_path}"]
    with log.open("wb") as out:
        process = subprocess.run(
            [sys.executable, "-c", _SIGTERM_AS_THE_CLI_LOADS, entry, "serve", *data],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            timeout=60,
        )
    text = log.read_text()
    assert process.returncode == 0, text
    assert " ckpt serving: " in text and "ckpt stopped" in text and "Traceback" not in text, text
    assert not socket_path.exists()
    _assert_lock_free(tmp_path / "data")


def _worker_loaded_grpc(pid: int) -> Callable[[], bool]:
    return lambda: any(_loaded(worker, "cygrpc") for worker in child_pids(pid))


def _a_worker_served(log: Path) -> Callable[[], bool]:
    return lambda: " ckpt worker " in log.read_text()


@pytest.mark.parametrize("when", ["a worker imports grpc", "one worker serves"])
def test_a_workers_parent_stopped_before_its_workers_serve_stops_them_all_in_order(tmp_path: Path, when: str) -> None:
    """Its workers stop as they start: each once it serves (the ready line it still writes then did not
    reach a parent that had stopped reading: BrokenPipeError, exit 1), nothing left behind."""
    process, log = _serve(tmp_path, "--listen", f"127.0.0.1:{free_port()}", "--workers", "2")
    processes: list[int] = []
    try:
        _wait_for(
            _worker_loaded_grpc(process.pid) if when == "a worker imports grpc" else _a_worker_served(log), process, log
        )
        assert " ckpt serving: " not in log.read_text()
        process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 60
        while process.poll() is None and time.monotonic() < deadline:  # the store processes started from now
            processes = sorted(set(processes) | set(_descendants(process.pid)))
            time.sleep(0.005)
        assert process.wait(60) == 0, log.read_text()
    finally:
        process.kill()
        process.wait()
    text = log.read_text()
    assert "Traceback" not in text and "ERROR" not in text, text
    _assert_all_gone(processes)
    _assert_lock_free(tmp_path / "data")


# A window widened: the stop waits 0 s between closing the count of calls and stopping the gRPC server
# (its health service's graceful shutdown), in which gRPC still starts handlers. Here it waits until the
# test is done with it (a file appears), so that a PutBlob starts its handler there every time.
_LAUNCHER = """
import os, runpy, sys, time

from grpc_health.v1 import _async

_shutdown = _async.HealthServicer.enter_graceful_shutdown


async def _held_shutdown(self):
    import asyncio

    deadline = time.monotonic() + 30
    while not os.path.exists(os.environ["RELEASE_STOP"]) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    await _shutdown(self)


_async.HealthServicer.enter_graceful_shutdown = _held_shutdown
sys.argv = ["ckpt", "serve", *sys.argv[1:]]
runpy.run_module("ckpt", run_name="__main__", alter_sys=True)
"""


def _held_blob(first_sent: threading.Event, done: threading.Event) -> Iterator[service_pb2.PutBlobRequest]:
    yield service_pb2.PutBlobRequest(session_id="a", chunk=b"x" * 1000)
    first_sent.set()
    done.wait(30)  # the rest only once the call is over: a handler reading on would wait for it
    yield service_pb2.PutBlobRequest(chunk=b"y" * 1000, end=True)


def test_a_put_blob_whose_handler_starts_once_the_stop_began_is_refused_at_once(tmp_path: Path) -> None:
    """Refused UNAVAILABLE before it reads the blob, not read whole (holding the stop for up to the grace
    period) and refused only then."""
    (tmp_path / "launcher").mkdir()
    (tmp_path / "launcher" / "held_stop_serve.py").write_text(_LAUNCHER)
    release = tmp_path / "release"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'launcher'}{os.pathsep}{ROOT}", "RELEASE_STOP": str(release)}
    socket_path = tmp_path / "ckpt.sock"
    sidecar = start_sidecar_process(
        tmp_path / "data",
        "--grace-seconds",
        "30",
        listen=[f"unix:{socket_path}"],
        env=env,
        module="held_stop_serve",
        cwd=ROOT,
    )
    done = threading.Event()
    try:
        with CheckpointClient(f"unix:{socket_path}") as client:
            client.put("a", b"\x08\x01")
        with grpc.insecure_channel(f"unix:{socket_path}") as channel:
            stub = service_pb2_grpc.CheckpointServiceStub(channel)
            grpc.channel_ready_future(channel).result(timeout=10)
            sidecar.process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 30
            while "ckpt stopping" not in sidecar.log():  # the count of calls is closed
                assert time.monotonic() < deadline, sidecar.log()
                time.sleep(0.01)
            first_sent = threading.Event()
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as refused:
                stub.PutBlob(_held_blob(first_sent, done), timeout=5)
            took = time.monotonic() - started
        release.touch()
        assert sidecar.process.wait(30) == 0, sidecar.log()
    finally:
        done.set()
        release.touch()
        sidecar.stop(signal.SIGKILL)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
    assert (refused.value.details() or "").startswith("the sidecar is stopping; "), refused.value
    assert took < 5
