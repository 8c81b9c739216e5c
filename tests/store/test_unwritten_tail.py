"""A store whose commits left data.mdb shorter than its last page reopens.

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

from ckpt.sidecar import PutRequest, Store, StoreConfig
from tests.store.support import put_later, queued_ops, storage_write_lock_held, wait_queued


def _bytes(store: Store) -> tuple[int, int]:
    """(bytes of the pages the last commit's meta page says are in use, bytes data.mdb holds)."""
    return store.stats()["used_bytes"], (store.config.data_dir / "lmdb" / "data.mdb").stat().st_size


def test_a_large_put_and_its_delete_in_one_commit_leave_a_store_that_reopens(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    big = random.Random(7).randbytes(4_000_000)  # incompressible: ~1,000 overflow pages
    store = Store(StoreConfig(data_dir=data_dir))
    try:
        store.put("other", b"kept")
        rng = random.Random(8)
        store.put_many([PutRequest(f"warm{i}", rng.randbytes(300_000)) for i in range(20)])
        # Hold the storage's write lock so that the writer stops at its next batch (a first write), while
        # the put and the delete queue behind it: released, they share the following commit.
        with storage_write_lock_held(store):
            first = put_later(store, PutRequest("first", b"x"))
            while not store.queued_write_bytes or queued_ops(store):  # the writer took it, waits for the lock
                time.sleep(0.001)
            doomed = put_later(store, PutRequest("doomed", big))
            wait_queued(store, 1)  # before the delete
            deleted: list[int] = []
            deleting = threading.Thread(target=lambda: deleted.append(store.delete_session("doomed")))
            deleting.start()
            while queued_ops(store) < 2:
                time.sleep(0.001)
            commits = store.commits
        deleting.join()
        assert first.result().version == 1 and doomed.result().version == 1 and deleted == [1]
        assert store.commits == commits + 2  # the first write's commit, then the put's and the delete's together
        used, in_file = _bytes(store)
        assert in_file >= used, f"data.mdb holds {in_file} bytes, its meta page uses {used}"
    finally:
        store.close()
    with Store(StoreConfig(data_dir=data_dir)) as reopened:
        assert reopened.get("other").state == b"kept"
        assert "doomed" not in set(reopened.session_ids()) and "first" in set(reopened.session_ids())
