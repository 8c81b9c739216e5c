"""``ckpt serve --workers N``: N sidecar processes on one data directory and the same TCP ports.

A sidecar's gRPC process serves every RPC on one event loop, and its store
process commits every write. With N workers, each worker is such a pair, with
its own loops, writer and caches; the kernel spreads client connections over
them (SO_REUSEPORT), LMDB's write lock orders their commits, and every write
checks the session's head inside its transaction as with one process, so two
workers can never both write against the same head. What a worker's store
process caches it checks against LMDB before use (``Store(shared=True)``): the
validation a store shared by sidecars on several hosts needs as well.

The parent serves nothing itself. It

- holds the data directory's lock for the whole run. Its workers inherit the
  locked file, and pass it on to their store processes, so the lock stays
  held while any of them lives (a store process outlives a killed worker
  while it commits what it had queued): a second server is refused as it is
  with one process;
- checks the data file and opens the store once (layout, tables) before any
  worker starts;
- checks that nothing holds the ports yet, and holds them itself until it
  exits (a socket bound, not listening, with SO_REUSEPORT: listening.py's
  claim_port): the workers bind them with SO_REUSEPORT, which would let
  another server that sets it too share them silently;
- starts the workers (``python -m ckpt.sidecar.server.workerstart``, the
  config pickled on their stdin), waits until every one serves, then logs the
  one serving line (``process.py`` waits for it);
- on SIGTERM/SIGINT/SIGHUP, even before every worker serves, stops them (each
  finishes and commits its in-flight writes; one still starting stops once it
  serves, stopsignals.py) and exits 0 if they all did; if a worker exits on its
  own, it stops the others and exits 1, for a supervisor to restart the lot.

Workers die with the parent (PR_SET_PDEATHSIG), so a killed parent leaves none
serving. Only TCP: gRPC cannot share a unix socket between processes.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import errno
import logging
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import IO, Any

from ..config import ServeConfig
from ..errors import StoreError
from ..storage import make_dirs
from ..store import Store, check_not_truncated, lock_data_dir
from .childpython import child_environment, python_module_command
from .exitstatus import exit_status
from .extension import ServerExtension
from .frontend import SERVING_LOG
from .listening import claim_port
from .loops import event_loop_factory
from .serving import serve_async
from .stopsignals import STOP_SIGNALS, take_early_stop

log = logging.getLogger("ckpt")

_START_TIMEOUT_SECONDS = 60.0
# After SIGTERM, how long past the grace a worker gets before it is killed.
_STOP_SLACK_SECONDS = 30.0
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class _WorkerSpec:
    config: ServeConfig
    index: int
    parent_pid: int
    ready_fd: int
    #: The data directory's locked file, inherited (and passed on to the worker's store process).
    lock_fd: int
    #: Served beside the CheckpointService by every worker (extension.py).
    extension: ServerExtension | None = None


def serve_workers(config: ServeConfig, *, extension: ServerExtension | None = None) -> int:
    """Run ``config.workers`` serving processes until SIGTERM/SIGINT/SIGHUP; the exit code as :func:`serve`'s.

    ``extension``: every worker serves it (extension.py).
    """
    stop: list[int] = []

    def request_stop(signum: int, frame: Any) -> None:
        stop.append(signum)

    for sig in STOP_SIGNALS:
        signal.signal(sig, request_stop)
    if take_early_stop():  # asked for while `ckpt serve` started: the workers are stopped as they start
        stop.append(signal.SIGTERM)
    try:
        try:
            lock, ports = _prepare(config)
        except (StoreError, OSError) as exc:
            log.error("ckpt cannot start: %s", exc)
            return 1
        try:
            return _run(config, lock, stop, extension)
        finally:
            for port in ports:
                port.close()
            lock.close()
    finally:
        # As serve_async: a SIGTERM repeated between the clean stop and the exit must not turn 0 into -15.
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)


def _prepare(config: ServeConfig) -> tuple[IO[str], list[socket.socket]]:
    """Lock the data directory, check its file and tables, claim the ports; the lock's file and the
    sockets holding the ports (listening.claim_port), to keep open until the workers stopped."""
    data_dir = config.data_dir
    if data_dir.exists() and not data_dir.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "the data directory is not a directory", str(data_dir))
    make_dirs(data_dir)  # private, if made
    event_loop_factory(config.event_loop)  # Unavailable if it is not installed: before any worker starts
    lock: IO[str] = lock_data_dir(data_dir)
    ports: list[socket.socket] = []
    try:
        check_not_truncated(data_dir / "lmdb" / "data.mdb", extend=True)
        Store(config.store, shared=True, sweeper=False).close()
        for address in config.addresses:
            ports += claim_port(address)
    except BaseException:
        for port in ports:
            port.close()
        lock.close()
        raise
    return lock, ports


def _run(config: ServeConfig, lock: IO[str], stop: list[int], extension: ServerExtension | None) -> int:
    ready_r, ready_w = os.pipe()
    workers: list[subprocess.Popen[bytes]] = []
    try:
        env = child_environment()
        for index in range(config.workers):
            worker = subprocess.Popen(
                python_module_command("ckpt.sidecar.server.workerstart"),
                stdin=subprocess.PIPE,
                pass_fds=(lock.fileno(), ready_w),
                env=env,
            )
            workers.append(worker)
            assert worker.stdin is not None
            spec = _WorkerSpec(config, index, os.getpid(), ready_w, lock.fileno(), extension)
            worker.stdin.write(pickle.dumps(spec))
            worker.stdin.close()
        os.close(ready_w)
        ready_w = -1
        failed = _wait_until_serving(workers, ready_r, stop)
        if failed is None and not stop:
            metrics = "off"
            if config.metrics_port is not None:
                metrics = (
                    f"{config.metrics_address}:{config.metrics_port}+worker"
                    if config.metrics_port
                    else "a free port per worker"
                )
            log.info(
                SERVING_LOG + " listen=%s data_dir=%s durability=%s tls=%s metrics=%s workers=%d pid=%d",
                ",".join(config.addresses),
                config.data_dir.resolve(),
                config.store.durability.value,
                config.tls_mode,
                metrics,
                config.workers,
                os.getpid(),
            )
            failed = _wait_for_stop(workers, stop)
    finally:
        if ready_w >= 0:
            os.close(ready_w)
        if any(w.poll() is None for w in workers):
            log.info("ckpt stopping: workers=%d data_dir=%s", len(workers), config.data_dir.resolve())
        codes = _stop_all(workers, config.grace_seconds + _STOP_SLACK_SECONDS)
        # Only now: a worker stopped as it starts still writes its ready line, which a closed pipe
        # would fail (EPIPE).
        os.close(ready_r)
    log.info("ckpt stopped: data_dir=%s", config.data_dir.resolve())
    if failed is not None:
        return 1
    return 0 if all(code == 0 for code in codes) else 1


def _wait_until_serving(workers: list[subprocess.Popen[bytes]], ready_r: int, stop: list[int]) -> int | None:
    """Wait until every worker serves; the index of one that exited or timed out first, else None."""
    serving: set[int] = set()
    buffered = b""
    deadline = time.monotonic() + _START_TIMEOUT_SECONDS
    while len(serving) < len(workers) and not stop:
        readable, _, _ = select.select([ready_r], [], [], 0.1)
        if readable:
            chunk = os.read(ready_r, 4096)
            buffered += chunk
            *lines, buffered = buffered.split(b"\n")
            serving.update(int(line) for line in lines if line)
        for index, worker in enumerate(workers):
            if index not in serving and worker.poll() is not None:
                ended = exit_status(worker.returncode)
                log.error("ckpt worker %d %s before serving; stopping the others", index, ended)
                return index
        if time.monotonic() > deadline:
            late = sorted(set(range(len(workers))) - serving)
            log.error("ckpt workers %s did not serve within %.0f s; stopping them all", late, _START_TIMEOUT_SECONDS)
            return late[0]
    return None


def _wait_for_stop(workers: list[subprocess.Popen[bytes]], stop: list[int]) -> int | None:
    """Until a signal asks to stop (None), or a worker exits on its own (its index)."""
    while not stop:
        for index, worker in enumerate(workers):
            if worker.poll() is not None:
                log.error(
                    "ckpt worker %d (pid %d) %s; stopping the others", index, worker.pid, exit_status(worker.returncode)
                )
                return index
        time.sleep(0.1)
    return None


def _stop_all(workers: list[subprocess.Popen[bytes]], timeout_seconds: float) -> list[int]:
    """SIGTERM every live worker, wait for each (killing one that outlasts the timeout); exit codes,
    0 for one the SIGTERM ended before it could handle it: it had started nothing yet (workerstart.py)."""
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_seconds
    codes = []
    for worker in workers:
        try:
            code = worker.wait(max(0.0, deadline - time.monotonic()))
            codes.append(0 if code == -signal.SIGTERM else code)
        except subprocess.TimeoutExpired:
            log.error("ckpt worker (pid %d) did not stop within %.0f s; killing it", worker.pid, timeout_seconds)
            worker.kill()
            codes.append(worker.wait())
    return codes


def _die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGTERM this process when its parent dies (Linux); exit now if it already did."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is not None and sys.platform.startswith("linux"):
        libc = ctypes.CDLL(libc_name, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent_pid:
        raise SystemExit(1)


def main() -> int:
    """A worker: serve as its parent's spec says (read from stdin)."""
    spec: _WorkerSpec = pickle.load(sys.stdin.buffer)
    _die_with_parent(spec.parent_pid)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)

    def serving() -> None:
        try:
            os.write(spec.ready_fd, f"{spec.index}\n".encode())
        except BrokenPipeError:
            # The parent is gone (its pipe closes only once its workers stopped): stop as its SIGTERM
            # (PR_SET_PDEATHSIG) asks, in order.
            signal.raise_signal(signal.SIGTERM)
        finally:
            os.close(spec.ready_fd)

    # The parent made the same check before starting any worker (_prepare).
    with asyncio.Runner(loop_factory=event_loop_factory(spec.config.event_loop)) as runner:
        return runner.run(
            serve_async(spec.config, worker=spec.index, serving=serving, lock_fd=spec.lock_fd, extension=spec.extension)
        )
