"""A store whose commits left data.mdb shorter than its last page reopens (found by a chaos walk, 2026-11-26).

LMDB never writes pages a transaction allocated and freed again: a 4 MB state
put and its session deleted in one group commit leave ~1,000 unwritten pages
at the end of the file, and the open-time truncation check refused the store
as "truncated" (DataLoss) on every restart after it.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

from ckpt.sidecar import PutRequest, Store, StoreConfig, WriteMode


def _pages(store: Store) -> tuple[int, int]:
    """(pages the last commit's meta page says are in use, pages data.mdb holds)."""
    last, page = store._env.info()["last_pgno"] + 1, store._env.stat()["psize"]
    return last, (store.config.data_dir / "lmdb" / "data.mdb").stat().st_size // page


def test_a_large_put_and_its_delete_in_one_commit_leave_a_store_that_reopens(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    big = random.Random(7).randbytes(4_000_000)  # incompressible: ~1,000 overflow pages
    store = Store(StoreConfig(data_dir=data_dir))
    try:
        store.put("other", b"kept")
        rng = random.Random(8)
        store.put_many([PutRequest(f"warm{i}", rng.randbytes(300_000)) for i in range(20)])
        # Hold LMDB's writer lock so that the writer stops at its next batch (a first write), while the
        # put and the delete queue behind it: released, they share the following commit.
        held = store._env.begin(write=True)
        first = store.submit(PutRequest("first", b"x", WriteMode.REPLACE, None, "", {}))
        while store._queue.qsize():  # the writer took the first write and waits for the lock
            time.sleep(0.001)
        doomed = store.submit(PutRequest("doomed", big, WriteMode.REPLACE, None, "", {}))
        deleted: list[int] = []
        deleting = threading.Thread(target=lambda: deleted.append(store.delete_session("doomed")))
        deleting.start()
        while store._queue.qsize() < 2:
            time.sleep(0.001)
        commits = store.commits
        held.abort()
        deleting.join()
        assert first.result().version == 1 and doomed.result().version == 1 and deleted == [1]
        assert store.commits == commits + 2  # the first write's commit, then the put's and the delete's together
        last, in_file = _pages(store)
        assert in_file >= last, f"data.mdb holds {in_file} pages, its meta page uses {last}"
    finally:
        store.close()
    with Store(StoreConfig(data_dir=data_dir)) as reopened:
        assert reopened.get("other").state == b"kept"
        assert "doomed" not in set(reopened.session_ids()) and "first" in set(reopened.session_ids())
