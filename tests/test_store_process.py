"""``ckpt serve --store-process``: the store in a child process, and what that adds to the sidecar's promises.

What the sidecar serves is checked in both modes by test_sidecar.py; here: the
processes themselves, and what happens when either one dies.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from bench.output import child_pids
from sidecar.client import CheckpointClient, CheckpointError
from sidecar.config import StoreConfig
from sidecar.store import Store
from tests.sidecar_proc import Sidecar, start_sidecar


def _store_process(sidecar: Sidecar) -> int:
    """The pid of the sidecar's store process (its child running sidecar.storehost)."""
    for pid in child_pids(sidecar.pid):
        with contextlib.suppress(OSError):
            if b"sidecar.storehost" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
    raise AssertionError(f"sidecar {sidecar.pid} has no store process")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_gone(pid: int, timeout_seconds: float = 20) -> None:
    deadline = time.monotonic() + timeout_seconds
    while _alive(pid):
        assert time.monotonic() < deadline, f"process {pid} still runs"
        time.sleep(0.02)


def _maps_data_file(pid: int) -> bool:
    return "data.mdb" in Path(f"/proc/{pid}/maps").read_text()


def _stored_versions(data_dir: Path, session: str) -> list[bytes]:
    with Store(StoreConfig(data_dir=data_dir)) as store:
        head = store.get(session).version
        return [store.get(session, v).state for v in range(1, head + 1)]


def test_the_store_lives_in_a_child_process_that_ends_with_the_sidecar(tmp_path: Path) -> None:
    sidecar = start_sidecar(tmp_path / "data", "--store-process")
    child = _store_process(sidecar)
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            client.put("s", b"\x08\x01")
        # LMDB's file is mapped by the store process only: the gRPC process never opens it.
        assert _maps_data_file(child)
        assert not _maps_data_file(sidecar.pid)
    finally:
        assert sidecar.stop() == 0, sidecar.log()
    _wait_gone(child)
    assert _stored_versions(tmp_path / "data", "s") == [b"\x08\x01"]


def test_a_store_process_that_dies_stops_the_sidecar_with_exit_1(tmp_path: Path) -> None:
    sidecar = start_sidecar(tmp_path / "data", "--store-process")
    states = [b"\x08" + bytes([i]) for i in range(1, 21)]
    with CheckpointClient(sidecar.unix_target, retries=0) as client:
        for state in states:
            client.put("s", state)
        os.kill(_store_process(sidecar), signal.SIGKILL)
        # A supervisor sees a failed sidecar and restarts it; until then calls fail UNAVAILABLE.
        assert sidecar.process.wait(timeout=20) == 1, sidecar.log()
        with pytest.raises(CheckpointError):
            client.get("s")
    assert "store process ended" in sidecar.log()
    assert _stored_versions(tmp_path / "data", "s") == states  # every acknowledged write


def test_a_killed_sidecar_leaves_no_store_process_behind(tmp_path: Path) -> None:
    sidecar = start_sidecar(tmp_path / "data", "--store-process")
    child = _store_process(sidecar)
    with CheckpointClient(sidecar.unix_target) as client:
        client.put("s", b"\x08\x01")
    sidecar.process.kill()
    sidecar.process.wait()
    _wait_gone(child)  # the link closed: it committed what it had and exited
    restarted = start_sidecar(tmp_path / "data", "--store-process")
    try:
        with CheckpointClient(restarted.unix_target) as client:
            assert client.get("s").state == b"\x08\x01"
    finally:
        assert restarted.stop() == 0, restarted.log()


def test_sigterm_under_concurrent_writes_keeps_every_acknowledged_one(tmp_path: Path) -> None:
    sidecar = start_sidecar(tmp_path / "data", "--store-process")
    acknowledged: dict[str, list[bytes]] = {f"w{i}": [] for i in range(8)}
    stop = threading.Event()

    def write(session: str) -> None:
        with CheckpointClient(sidecar.unix_target, retries=0, timeout_seconds=10) as client:
            n = 0
            while not stop.is_set():
                state = b"\x08" + n.to_bytes(2, "little")
                try:
                    client.put(session, state)
                except CheckpointError:
                    return  # shutting down: not acknowledged
                acknowledged[session].append(state)
                n += 1

    threads = [threading.Thread(target=write, args=(s,)) for s in acknowledged]
    for t in threads:
        t.start()
    time.sleep(1.0)
    assert sidecar.stop() == 0, sidecar.log()
    stop.set()
    for t in threads:
        t.join()
    for session, states in acknowledged.items():
        assert states, session
        assert _stored_versions(tmp_path / "data", session)[: len(states)] == states
