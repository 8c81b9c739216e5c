"""A commit that fails with an I/O error stops the store's writes until it is reopened.

The failure is injected at the commit of a real LMDB write transaction (the
transaction is aborted, as LMDB leaves it when a page write or fsync fails),
once; everything else is the real store, and the sidecar test runs the real
server loop.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from pathlib import Path
from typing import Any

import lmdb
import pytest

from ckpt.sidecar import PutRequest, Store, StoreConfig, Unavailable, WriteMode
from ckpt.sidecar.client import AsyncCheckpointClient, UnavailableError
from ckpt.sidecar.config import ServeConfig
from ckpt.sidecar.server import service as server_module
from tests.store.test_store import patch_of, state_of
from tests.store.test_write_backlog import writer_held

EIO = lmdb.Error("mdb_txn_commit: " + os.strerror(errno.EIO))


class _FailingCommit:
    """A write transaction whose commit fails: aborted, then EIO."""

    def __init__(self, txn: lmdb.Transaction) -> None:
        self._txn = txn

    def __enter__(self) -> lmdb.Transaction:
        return self._txn.__enter__()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self._txn.__exit__(exc_type, exc, tb)
            return
        self._txn.abort()
        raise EIO


class _Env:
    """The store's LMDB environment, with the next ``failures`` write commits failing."""

    def __init__(self, env: lmdb.Environment, failures: int) -> None:
        self._env = env
        self.failures = failures

    def begin(self, *args: Any, **kwargs: Any) -> Any:
        txn = self._env.begin(*args, **kwargs)
        if kwargs.get("write") and kwargs.get("parent") is None and self.failures:
            self.failures -= 1
            return _FailingCommit(txn)
        return txn

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)


def test_writes_stop_after_a_failed_commit_and_resume_after_reopening(tmp_path: Path) -> None:
    # One write per commit, so the write queued behind the failed one is a batch of its own: it
    # would have committed without the one before it (a stream's next batch, out of order).
    config = StoreConfig(data_dir=tmp_path / "data", max_batch_writes=1, sweep_interval_seconds=3600)
    stopped: list[str] = []
    with Store(config, on_writes_stopped=stopped.append) as store:
        store.put("s", state_of("s", 1))
        env = _Env(store._env, failures=1)
        store._env = env  # type: ignore[assignment]
        with writer_held(store):
            failed = store.submit(PutRequest("s", patch_of(2), mode=WriteMode.MERGE))
            behind = store.submit(PutRequest("s", patch_of(3), mode=WriteMode.MERGE))
        with pytest.raises(Unavailable, match=r"a commit failed \(Error\('mdb_txn_commit: Input/output error'"):
            failed.result(10)
        with pytest.raises(Unavailable, match="the store stopped taking writes") as refused:
            behind.result(10)
        assert "nothing after it was written" in str(refused.value)
        assert env.failures == 0 and stopped == [store.writes_stopped]
        with pytest.raises(Unavailable, match="the store stopped taking writes"):
            store.put("other", state_of("other", 1))
        assert store.get("s").state == state_of("s", 1)  # reads go on, from the last commit
        assert store.get("s", use_cache=False).version == 1
    with Store(config) as store:  # reopened: the last commit, and writes again
        assert store.get("s").version == 1
        assert store.put("s", patch_of(2), mode=WriteMode.MERGE).version == 2
        assert store.get("s").state == state_of("s", 1) + patch_of(2)


def test_a_sidecar_whose_store_stopped_writing_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signal_dispositions: None
) -> None:
    # Its supervisor restarts it (Docker's restart policy, systemd): the restart reopens the store.
    real_store = Store

    def failing_store(*args: Any, **kwargs: Any) -> Store:
        store = real_store(*args, **kwargs)
        store._env = _Env(store._env, failures=1)  # type: ignore[assignment]
        return store

    monkeypatch.setattr(server_module, "Store", failing_store)
    socket_path = tmp_path / "ckpt.sock"
    # In this process, where the patched Store is: the store process would import its own.
    config = ServeConfig(data_dir=tmp_path / "data", listen=(f"unix:{socket_path}",), store_process=False)
    outcome: dict[str, Any] = {}

    async def run() -> None:
        serving = asyncio.create_task(server_module.serve_async(config))
        while not socket_path.exists():
            assert not serving.done(), serving.result()
            await asyncio.sleep(0.01)
        async with AsyncCheckpointClient(f"unix:{socket_path}", retries=0) as client:
            with pytest.raises(UnavailableError, match="the store stopped taking writes"):
                await client.put("s", b"\x08\x01")
        outcome["exit"] = await asyncio.wait_for(serving, 60)

    # _serve installs signal handlers: run it on this (the main) thread's loop.
    assert threading.current_thread() is threading.main_thread()
    asyncio.run(run())
    assert outcome["exit"] == 1
