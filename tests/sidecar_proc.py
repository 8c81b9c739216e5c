"""Start a real `ckpt serve` subprocess for integration tests (through sidecar.process)."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sidecar.process import SidecarProcess, start_sidecar_process
from sidecar.server import wait_until_serving

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Sidecar(SidecarProcess):
    """A sidecar listening on a unix socket and a TCP port."""

    @property
    def unix_target(self) -> str:
        return self.targets[0]

    @property
    def tcp_target(self) -> str:
        return self.targets[1]


def start_sidecar(data_dir: Path, *extra: str, socket_path: Path | None = None, port: int | None = None) -> Sidecar:
    socket_path = socket_path or data_dir.parent / f"{data_dir.name}.sock"
    # The log sits beside the data directory, which tests inspect and delete.
    log_path = data_dir.parent / f"{data_dir.name}-{time.monotonic_ns()}.log"
    listen = [f"unix:{socket_path}", f"127.0.0.1:{port or free_port()}"]
    p = start_sidecar_process(data_dir, *extra, listen=listen, log_path=log_path)
    return Sidecar(p.process, p.data_dir, p.targets, p.log_path)


# `ckpt serve` with the retention sweeper's interval shortened (StoreConfig.sweep_interval_seconds
# has no option: the sidecar sweeps once a minute). Everything else is the real CLI.
_SERVE_SWEEPING = """
import sys
from dataclasses import replace
from sidecar import cli, server
seconds = float(sys.argv[1])
store_config = server.ServeConfig.store_config
server.ServeConfig.store_config = lambda self: replace(store_config(self), sweep_interval_seconds=seconds)
sys.exit(cli.main(sys.argv[2:]))
"""


def start_sidecar_sweeping(data_dir: Path, sweep_seconds: float, *extra: str) -> Sidecar:
    """A real `ckpt serve` on a unix socket and a TCP port whose sweeper runs every ``sweep_seconds``."""
    data_dir.mkdir(parents=True, exist_ok=True)
    socket_path = data_dir.parent / f"{data_dir.name}.sock"
    log_path = data_dir.parent / f"{data_dir.name}-{time.monotonic_ns()}.log"
    listen = [f"unix:{socket_path}", f"127.0.0.1:{free_port()}"]
    cmd = [sys.executable, "-c", _SERVE_SWEEPING, str(sweep_seconds), "serve", "--data-dir", str(data_dir)]
    for address in listen:
        cmd += ["--listen", address]
    with log_path.open("ab") as log:
        process = subprocess.Popen([*cmd, *extra], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    sidecar = Sidecar(process, data_dir, tuple(listen), log_path)
    deadline = time.monotonic() + 30
    while process.poll() is None and time.monotonic() < deadline:
        if socket_path.exists():
            with contextlib.suppress(TimeoutError):
                wait_until_serving(listen[0], timeout_seconds=1.0)
                return sidecar
        time.sleep(0.01)
    sidecar.stop(signal.SIGKILL)
    raise RuntimeError(f"ckpt serve did not start (exit code {process.returncode}):\n{sidecar.log(tail_chars=4000)}")
