"""Run `ckpt serve` as a child process and wait until it answers health checks.

One launcher for everything that starts a real sidecar: the integration
tests, the benchmarks, and applications that want a private sidecar.

    sidecar = start_sidecar_process(Path("data"), listen=["unix:data/ckpt.sock"])
    ...
    sidecar.stop()  # SIGTERM: in-flight writes are committed; returns the exit code
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ..storage import PRIVATE_FILE_MODE, make_dirs
from ..tls import ClientTLS, open_channel
from .frontend import SERVING_LOG


@dataclass
class SidecarProcess:
    process: subprocess.Popen[bytes]
    data_dir: Path
    #: Every --listen address, as gRPC targets ("unix:/path", "host:port").
    targets: tuple[str, ...]
    #: Where the sidecar's stdout and stderr go.
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, sig: int = signal.SIGTERM, timeout_seconds: float = 30) -> int:
        """Send ``sig`` (if it still runs) and return its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout_seconds)

    def log(self, *, tail_chars: int | None = None) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return text if tail_chars is None else text[-tail_chars:]


def start_sidecar_process(
    data_dir: Path,
    *extra_args: str,
    listen: Sequence[str],
    log_path: Path | None = None,
    env: Mapping[str, str] | None = None,
    inherit_ckpt_env: bool = True,
    timeout_seconds: float = 30.0,
    cwd: Path | None = None,
    module: str | None = None,
) -> SidecarProcess:
    """Start ``ckpt serve`` on ``listen`` and return once it serves: it logged that it serves, and
    the first address answers SERVING.

    Both, because a SERVING answer alone may come from another server already
    on that address, while this one is about to refuse to start.

    ``inherit_ckpt_env=False`` drops every CKPT_* variable of this process's
    environment, so the sidecar runs on its defaults plus ``extra_args``.
    Raises RuntimeError with the log's tail if the process exits or does not
    serve within ``timeout_seconds`` (it is killed then). ``cwd``: run it
    there; ``python -m`` imports the ``ckpt`` package of that directory
    first (another checkout's build, for side-by-side benchmarks).
    ``module``: run ``python -m module`` with ``ckpt serve``'s arguments
    instead of ``ckpt serve`` (a launcher that adds a server extension, such
    as the benchmarks' ``ckpt.bench.echo_sidecar``).
    """
    if not listen:
        raise ValueError("listen needs at least one address")
    make_dirs(data_dir)  # private, if made
    log_path = log_path or data_dir / "sidecar.log"
    # A checkout from before the ckpt namespace (a baseline build of bench.sidecar_ab) has sidecar/ on top.
    if module is None:
        cli = "ckpt.sidecar.cli" if cwd is None or (Path(cwd) / "ckpt" / "sidecar").exists() else "sidecar.cli"
        cmd = [sys.executable, "-m", cli, "serve"]
    else:
        cmd = [sys.executable, "-m", module]
    cmd += ["--data-dir", str(data_dir)]
    for address in listen:
        cmd += ["--listen", address]
    cmd += extra_args
    child_env = dict(os.environ if env is None else env)
    if not inherit_ckpt_env:
        child_env = {k: v for k, v in child_env.items() if not k.startswith("CKPT_")}
    with open(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, PRIVATE_FILE_MODE), "ab") as log:
        log_start = log.tell()  # the log may hold earlier runs' lines
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env, cwd=cwd)
    sidecar = SidecarProcess(process, data_dir, tuple(listen), log_path)
    own_pid = f" pid={process.pid}\n".encode()
    deadline = time.monotonic() + timeout_seconds
    while process.poll() is None and time.monotonic() < deadline:
        if _logged_serving(log_path, log_start, own_pid):
            with contextlib.suppress(TimeoutError):
                wait_until_serving(listen[0], timeout_seconds=1.0)
                if process.poll() is None:
                    return sidecar
        time.sleep(0.01)
    # Exited (a bad flag, a locked data directory) or never served: fail now, with its log.
    sidecar.stop(signal.SIGKILL)
    raise RuntimeError(f"ckpt serve did not start (exit code {process.returncode}):\n{sidecar.log(tail_chars=4000)}")


def _logged_serving(log_path: Path, start: int, own_pid: bytes) -> bool:
    """Whether the log, past ``start``, has the line the server ``own_pid`` writes once it serves."""
    try:
        with log_path.open("rb") as log:
            log.seek(start)
            text = log.read()
    except FileNotFoundError:
        return False
    serving = f" {SERVING_LOG} ".encode()
    return any(serving in line and line.endswith(own_pid) for line in text.splitlines(keepends=True))


def wait_until_serving(target: str, timeout_seconds: float = 10.0, *, tls: ClientTLS | None = None) -> None:
    """Block until the health service at target answers SERVING (for tests and tools)."""
    deadline = time.monotonic() + timeout_seconds
    with open_channel(target, tls, [], aio=False) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                reply: Any = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"no serving sidecar at {target} after {timeout_seconds} s")
            time.sleep(0.05)
