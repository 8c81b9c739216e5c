"""A commit that fails with an I/O error stops the store's writes until it is reopened.

The failure is injected at the commit of a real LMDB write transaction (the
transaction is aborted, as LMDB leaves it when a page write or fsync fails),
once; everything else is the real store, and the sidecar test runs the real
server loop.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import lmdb
import pytest

from ckpt.sidecar import PutRequest, Store, StoreConfig, Unavailable, WriteMode
from tests.store.support import patch_of, put_later, state_of, storage_of, wait_queued, writer_held

EIO = lmdb.Error("mdb_txn_commit: " + os.strerror(errno.EIO))


class _FailingCommit:
    """A write transaction whose commit fails: aborted, then ``error`` (EIO unless told)."""

    def __init__(self, scope: Any, error: lmdb.Error = EIO) -> None:
        self._scope = scope
        self._error = error

    def __enter__(self) -> Any:
        return self._scope.__enter__()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self._scope.__exit__(exc_type, exc, tb)
            return
        # aborted, as LMDB leaves a transaction whose commit failed
        self._scope.__exit__(type(self._error), self._error, None)
        raise self._error


class _FailingCommits:
    """The next ``failures`` write commits of a store's storage fail (a private hook: a disk that fails a
    write cannot be had on demand)."""

    def __init__(self, store: Store, failures: int, error: lmdb.Error = EIO) -> None:
        self.failures = failures
        storage = storage_of(store)
        real_write = storage.write

        def write() -> Any:
            scope = real_write()
            if self.failures:
                self.failures -= 1
                return _FailingCommit(scope, error)
            return scope

        storage.write = write


def test_writes_stop_after_a_failed_commit_and_resume_after_reopening(tmp_path: Path) -> None:
    # One write per commit, so the write queued behind the failed one is a batch of its own: it
    # would have committed without the one before it (a stream's next batch, out of order).
    config = StoreConfig(data_dir=tmp_path / "data", max_batch_writes=1, sweep_interval_seconds=3600)
    stopped: list[str] = []
    with Store(config, on_writes_stopped=stopped.append) as store:
        store.put("s", state_of("s", 1))
        failing = _FailingCommits(store, failures=1)
        with writer_held(store):
            failed = put_later(store, PutRequest("s", patch_of(2), mode=WriteMode.MERGE))
            wait_queued(store, 1)
            behind = put_later(store, PutRequest("s", patch_of(3), mode=WriteMode.MERGE))
            wait_queued(store, 2)
        with pytest.raises(Unavailable, match=r"a commit failed \(Error\('mdb_txn_commit: Input/output error'"):
            failed.result(10)
        with pytest.raises(Unavailable, match="the store stopped taking writes") as refused:
            behind.result(10)
        assert "nothing after it was written" in str(refused.value)
        assert failing.failures == 0 and stopped == [store.writes_stopped]
        with pytest.raises(Unavailable, match="the store stopped taking writes"):
            store.put("other", state_of("other", 1))
        assert store.get("s").state == state_of("s", 1)  # reads go on, from the last commit
        assert store.get("s", use_cache=False).version == 1
    with Store(config) as store:  # reopened: the last commit, and writes again
        assert store.get("s").version == 1
        assert store.put("s", patch_of(2), mode=WriteMode.MERGE).version == 2
        assert store.get("s").state == state_of("s", 1) + patch_of(2)
