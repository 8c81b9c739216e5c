"""Several callers' ops on one session id, applied in one group commit.

Each op is queued from its own thread while the writer is held, so they are
applied together, in queue order, inside one write transaction; then every
version must read back the same hot (state cache), cold (LMDB) and after a
reopen.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from ckpt.sidecar import Store, StoreConfig, WriteMode
from tests.store.support import CHAINS, patch_of, queued_ops, state_of, writer_held


def _queued(store: Store, calls: list[Callable[[], Any]]) -> list[Future[Any]]:
    """Start each blocking call on its own thread, in order, each one queued before the next starts."""
    futures: list[Future[Any]] = []
    for call in calls:
        future: Future[Any] = Future()
        queued = queued_ops(store)

        def run(call: Callable[[], Any] = call, future: Future[Any] = future) -> None:
            try:
                future.set_result(call())
            except BaseException as exc:
                future.set_exception(exc)

        threading.Thread(target=run, daemon=True).start()
        deadline = time.monotonic() + 10
        while queued_ops(store) == queued:
            assert time.monotonic() < deadline, "the op was never queued"
            time.sleep(0.001)
        futures.append(future)
    return futures


@pytest.mark.parametrize("mode", [WriteMode.REPLACE, WriteMode.MERGE])
def test_write_after_delete_and_fork_onto_the_same_id_in_one_commit(tmp_path: Path, mode: WriteMode) -> None:
    # The deleted session had one version, as the fork's new one does: the
    # deleted session's cached encoder (its head state and zstd stream) then
    # looked current for the fork, and the write was encoded against it.
    config = StoreConfig(data_dir=tmp_path / "data", chain_policy=CHAINS, sweep_interval_seconds=3600)
    source = state_of("A", 20)
    new = state_of("A", 21) if mode is WriteMode.REPLACE else patch_of(21)
    expected = new if mode is WriteMode.REPLACE else source + new
    with Store(config) as store:
        store.put("X", state_of("A", 19))  # close to the source: a REPLACE makes a DELTA, not a FULL frame
        store.put("A", source)
        commits = store.counters.commits
        with writer_held(store):
            deleted, forked, written = _queued(
                store,
                [
                    lambda: store.delete_session("X"),
                    lambda: store.fork("A", 0, "X"),
                    lambda: store.put("X", new, mode=mode),
                ],
            )
        assert deleted.result(10) == 1
        assert forked.result(10).head_version == 1
        assert written.result(10).version == 2
        assert written.result(10).frame_kind.name != "FULL"  # encoded against a base: the case at stake
        assert store.counters.commits - commits == 2  # the held op's commit, then all three in one
        assert store.get("X").state == expected
        assert store.get("X", use_cache=False).state == expected
        assert store.get("X", 1, use_cache=False).state == source
    with Store(config) as store:
        assert store.get("X").state == expected
