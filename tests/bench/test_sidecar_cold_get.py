"""The sidecar benchmark's cold Get: read by a sidecar restarted on the written data, every number measured."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import pytest

from ckpt.bench import sidecar_cold, sidecar_load
from ckpt.bench.echo_sidecar import start_echo_sidecar
from ckpt.sidecar.client import CheckpointClient


def test_the_cold_get_reads_every_session_from_a_restarted_sidecar(tmp_path: Path) -> None:
    sidecar = start_echo_sidecar(tmp_path, "cold")
    first_pid = sidecar.pid
    restarted = sidecar
    try:
        restarted, cold = sidecar_cold.cold_get(sidecar, quick=True)
        assert sidecar.process.returncode == 0  # the first server was stopped cleanly before the reads
        assert restarted.pid != first_pid and cold["pid_before_restart"] == first_pid
        assert restarted.data_dir == sidecar.data_dir and restarted.targets == sidecar.targets
        assert cold["pid_after_restart"] == restarted.pid and restarted.process.poll() is None
        assert cold["sessions"] == sidecar_cold.COLD_SESSIONS_QUICK
        for key in ("get_p50_us", "get_p99_us", "echo_p50_us", "echo_p99_us"):
            assert cold[key] > 0, key
        assert cold["get_p99_us"] >= cold["get_p50_us"] and cold["echo_p99_us"] >= cold["echo_p50_us"]
        assert cold["state_bytes_median"] > sidecar_load.STATE_BYTES
        # The data survived the restart: the reads were of the versions written before it.
        with CheckpointClient(restarted.targets[0]) as client:
            assert client.get("bench-cold-0000").version == 1 + sidecar_cold.MERGES_PER_SESSION
    finally:
        assert restarted.stop() == 0, restarted.log(tail_chars=2000)


def _sockets() -> int:
    """Sockets this process holds: one more for each connection gRPC opens."""
    fds = Path("/proc/self/fd")
    count = 0
    for fd in os.listdir(fds):
        with contextlib.suppress(OSError):  # the listing's own fd, closed since
            count += os.readlink(fds / fd).startswith("socket:")
    return count


def test_the_cold_gets_use_the_connection_the_warm_up_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    held: list[tuple[int, int]] = []  # sockets before and after each Get

    class CountingClient(CheckpointClient):
        def get(self, *args: Any, **kwargs: Any) -> Any:
            before = _sockets()
            got = super().get(*args, **kwargs)
            held.append((before, _sockets()))
            return got

    monkeypatch.setattr(sidecar_cold, "CheckpointClient", CountingClient)
    sidecar = start_echo_sidecar(tmp_path, "cold")
    restarted = sidecar
    try:
        restarted, _ = sidecar_cold.cold_get(sidecar, quick=True)
    finally:
        assert restarted.stop() == 0, restarted.log(tail_chars=2000)
    assert len(held) == sidecar_cold.COLD_SESSIONS_QUICK
    first_before, first_after = held[0]
    assert first_after == first_before, "the first timed Get opened a connection"
