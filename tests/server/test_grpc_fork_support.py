"""`ckpt serve` runs its processes with gRPC's fork support off unless its environment sets it (forksupport.py).

Read from /proc/<pid>/environ, the environment each process was started with: the sidecar's own shows what
it was given; what it set itself before grpc's import shows in the store processes and workers it started
after, which inherit it (a store process starts before the sidecar imports grpc:
test_store_process_starts_first.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt.bench.output import child_pids, process_and_children
from ckpt.sidecar.client import CheckpointClient
from ckpt.sidecar.server.process import start_sidecar_process
from tests.support import free_port, start_sidecar

VARIABLE = "GRPC_ENABLE_FORK_SUPPORT"


def _fork_support_at_start(pid: int) -> str | None:
    """GRPC_ENABLE_FORK_SUPPORT in the environment the process ``pid`` was started with, if there."""
    for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        name, _, value = entry.decode(errors="replace").partition("=")
        if name == VARIABLE:
            return value
    return None


def _serves(target: str) -> None:
    with CheckpointClient(target) as client:
        client.put("agent-7", b"\x08\x01")
        assert client.get("agent-7").state == b"\x08\x01"


def _store_pids(pid: int) -> list[int]:
    return [child for child in child_pids(pid) if b"storehost" in Path(f"/proc/{child}/cmdline").read_bytes()]


def test_a_sidecar_started_without_the_variable_starts_its_store_process_with_fork_support_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(VARIABLE)  # the suite's own setting (conftest.py): the sidecar must not get it from us
    sidecar = start_sidecar(tmp_path / "data")
    try:
        assert _fork_support_at_start(sidecar.pid) is None
        [store] = _store_pids(sidecar.pid)
        assert _fork_support_at_start(store) == "false"
        _serves(sidecar.unix_target)
    finally:
        code = sidecar.stop()
    assert code == 0, sidecar.log()


def test_every_process_of_a_sidecar_with_workers_runs_with_fork_support_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(VARIABLE)
    sidecar = start_sidecar_process(
        tmp_path / "data", "--workers", "2", listen=[f"127.0.0.1:{free_port()}"], inherit_ckpt_env=False
    )
    try:
        # It serves once every worker does, each worker once its store process is ready.
        workers = child_pids(sidecar.pid)
        stores = [store for worker in workers for store in _store_pids(worker)]
        assert len(workers) == 2 and len(stores) == 2, process_and_children(sidecar.pid)
        for pid in workers + stores:
            assert _fork_support_at_start(pid) == "false", pid
    finally:
        code = sidecar.stop()
    assert code == 0, sidecar.log()


@pytest.mark.parametrize("value", ["true", "0"])
def test_a_value_set_in_the_sidecars_environment_is_kept_in_every_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(VARIABLE, value)
    sidecar = start_sidecar(tmp_path / "data")
    try:
        [store] = _store_pids(sidecar.pid)
        assert [_fork_support_at_start(pid) for pid in (sidecar.pid, store)] == [value, value]
        _serves(sidecar.unix_target)
    finally:
        code = sidecar.stop()
    assert code == 0, sidecar.log()
