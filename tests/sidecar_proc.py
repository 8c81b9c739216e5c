"""Start a real `ckpt serve` subprocess for integration tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sidecar.server import wait_until_serving

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Sidecar:
    process: subprocess.Popen[bytes]
    data_dir: Path
    unix_target: str
    tcp_target: str
    log_path: Path

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout)

    def log(self) -> str:
        return self.log_path.read_text()


def start_sidecar(data_dir: Path, *extra: str, socket_path: Path | None = None, port: int | None = None) -> Sidecar:
    socket_path = socket_path or data_dir.parent / f"{data_dir.name}.sock"
    port = port or free_port()
    log_path = data_dir.parent / f"{data_dir.name}-{time.monotonic_ns()}.log"
    cmd = [
        sys.executable, "-m", "sidecar.cli", "serve", "--data-dir", str(data_dir),
        "--listen", f"unix:{socket_path}", "--listen", f"127.0.0.1:{port}", *extra,
    ]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
    sidecar = Sidecar(process, data_dir, f"unix:{socket_path}", f"127.0.0.1:{port}", log_path)
    try:
        wait_until_serving(sidecar.unix_target, timeout_seconds=30)
    except TimeoutError:
        sidecar.stop(signal.SIGKILL)
        raise AssertionError(f"sidecar did not start:\n{sidecar.log()}") from None
    return sidecar
