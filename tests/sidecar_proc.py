"""Start a real `ckpt serve` subprocess for integration tests (through sidecar.process)."""

from __future__ import annotations

import re
import socket
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ckpt.sidecar.server.process import SidecarProcess, start_sidecar_process

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


def start_sidecar_sweeping(data_dir: Path, sweep_seconds: float, *extra: str) -> Sidecar:
    """A real `ckpt serve` on a unix socket and a TCP port whose sweeper runs every ``sweep_seconds``."""
    return start_sidecar(data_dir, "--sweep-interval-seconds", str(sweep_seconds), *extra)


def metrics_text(sidecar: Sidecar) -> str:
    """The sidecar's /metrics (started with --metrics-port, kept as ``sidecar.metrics_port``)."""
    port = sidecar.metrics_port  # type: ignore[attr-defined]
    text: str = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return text


def metric(sidecar: Sidecar, name: str) -> float:
    """One sample of the sidecar's /metrics (see metrics_text)."""
    text = metrics_text(sidecar)
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert found, text
    return float(found.group(1))
