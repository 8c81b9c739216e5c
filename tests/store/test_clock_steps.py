"""The store's times when the wall clock steps back (NTP, a restored VM snapshot): a write is never stamped
earlier than one made before it, so retention keeps a blob uploaded for the next checkpoint, and a listing by
update time finds a session written between its pages."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ckpt.sidecar.config import Retention, StoreConfig
from ckpt.sidecar.errors import NotFound
from ckpt.sidecar.storage import WriteTxn
from ckpt.sidecar.store import Store, keys
from ckpt.sidecar.store.layout import WRITE_TIME_KEY
from ckpt.sidecar.store.ops import Op

SECOND = 10**9


@pytest.fixture
def step_clock(monkeypatch: pytest.MonkeyPatch) -> Callable[[float], None]:
    """Set the wall clock the store reads (time.time_ns, time.time) that many seconds off the real one."""
    real_ns, real = time.time_ns, time.time
    offset = [0]
    monkeypatch.setattr(time, "time_ns", lambda: real_ns() + offset[0])
    monkeypatch.setattr(time, "time", lambda: real() + offset[0] / SECOND)

    def step(seconds: float) -> None:
        offset[0] = int(seconds * SECOND)

    return step


@pytest.mark.parametrize("step", [-1.0, -3600.0])
def test_a_blob_uploaded_after_the_clock_steps_back_is_kept_for_the_checkpoint_naming_it(
    tmp_path: Path, step_clock: Callable[[float], None], step: float
) -> None:
    with Store(StoreConfig(data_dir=tmp_path, retention=Retention(keep_last_versions=2))) as store:
        for _ in range(5):
            store.put("s", os.urandom(2000))
        step_clock(step)
        blob = store.put_blob("s", [b"screenshot " * 1000])  # acknowledged: the agent names it next
        store.sweep()
        assert store.blob(blob.sha256).ref_count == 1
        store.put("s", b"state naming " + blob.uri.encode())
        assert store.blob_files.path(blob.sha256).read_bytes() == b"screenshot " * 1000
        # Once no version kept names it and the versions kept were all written after it, it goes.
        for _ in range(3):
            store.put("s", os.urandom(2000))
        store.sweep()
        with pytest.raises(NotFound):
            store.blob(blob.sha256)


def test_writes_after_the_clock_steps_back_are_stamped_after_the_writes_before_them(
    tmp_path: Path, step_clock: Callable[[float], None]
) -> None:
    with Store(StoreConfig(data_dir=tmp_path)) as store:
        store.put("s", b"v1")
        store.put("other", b"v1")
        before = store.session("other").updated_unix_nanos
        step_clock(-60)
        store.put("s", b"v2")
        store.fork("s", 0, "fork")
        store.put("new", b"v1")
        blob = store.put_blob("new", [b"bytes"])
        stamped = [
            store.session("s").updated_unix_nanos,
            store.session("fork").created_unix_nanos,
            store.session("new").created_unix_nanos,
            blob.created_unix_nanos,
        ]
        assert before < stamped[0] < stamped[1] < stamped[2] < stamped[3]
        versions, _ = store.list_versions("s")
        assert versions[0].created_unix_nanos == stamped[0] > versions[1].created_unix_nanos


@pytest.mark.parametrize("step", [-5.0, -3600.0])
def test_sessions_written_between_pages_after_the_clock_steps_back_are_listed_by_update_time(
    tmp_path: Path, step_clock: Callable[[float], None], step: float
) -> None:
    with Store(StoreConfig(data_dir=tmp_path)) as store:
        after = time.time_ns() - 3600 * SECOND
        for i in range(6):  # ~2 s apart: each in an index granule of its own
            store.put(f"s{i}", b"v1")
            step_clock((i + 1) * 2)
        page, token = store.list_sessions(page_size=3, updated_after_nanos=after)
        assert [s.session_id for s in page] == ["s0", "s1", "s2"]
        step_clock(step)
        store.put("s5", b"v2")  # not listed yet
        store.put("s0", b"v2")  # listed already: moves past the listing's position
        store.put("new", b"v1")  # made between the pages
        listed = []
        while token:
            page, token = store.list_sessions(page_size=3, page_token=token, updated_after_nanos=after)
            listed += [(s.session_id, s.head_version) for s in page]
        assert sorted(listed) == [("new", 1), ("s0", 2), ("s3", 1), ("s4", 1), ("s5", 2)]


def test_a_store_written_before_it_kept_its_latest_write_time_stamps_after_its_latest_index_granule(
    tmp_path: Path, step_clock: Callable[[float], None]
) -> None:
    with Store(StoreConfig(data_dir=tmp_path)) as store:
        store.put("s", b"v1")
        latest = store.session("s").updated_unix_nanos

        def forget(batch: object, txn: WriteTxn) -> None:  # as a store written by an older ckpt
            assert txn.delete(WRITE_TIME_KEY, db=store.tables.meta)

        store._writer.submit(Op(forget)).wait()
        step_clock(-3600)
        store.put("t", b"v1")
        assert keys.updated_granule(latest) <= store.session("t").updated_unix_nanos
