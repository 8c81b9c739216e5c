"""The store's layout version: stamped in a new store, assumed for an unstamped one, a newer one refused."""

from __future__ import annotations

import contextlib
import os
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest

from ckpt.sidecar import DataLoss, IncompatibleStore, InvalidArgument, PutRequest, Store, StoreConfig
from ckpt.sidecar.store import NewEvent, keys, layout
from ckpt.sidecar.store.layout import LAYOUT_VERSION
from ckpt.sidecar.tools.backup import backup
from ckpt.store.v1 import records_pb2
from tests.store.support import layout_stamp as stamp
from tests.support import ROOT, ckpt


def set_stamp(data: Path, value: bytes | None) -> None:
    """Write ``value`` as the layout version; None drops the meta table, as in a store written before it."""
    env = lmdb.open(str(data / "lmdb"), max_dbs=8)
    try:
        meta = env.open_db(b"meta")
        with env.begin(write=True) as txn:
            if value is None:
                txn.drop(meta, delete=True)
            else:
                txn.put(b"layout_version", value, db=meta)
    finally:
        env.close()


@pytest.fixture
def data(tmp_path: Path) -> Path:
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        store.put("s", b"\x08\x01")
    return tmp_path / "data"


def test_a_new_store_is_stamped_with_the_layout_an_open_makes(data: Path) -> None:
    """Layout 7 (PREFIX frames) comes with a store's first fold, layout 8 with its first request record swept
    by its id's time, layout 9 with its first segment frame: a store with none of them stays layout 6."""
    assert LAYOUT_VERSION == 9
    assert stamp(data) == b"6"


def test_a_store_written_before_the_stamp_is_layout_1(data: Path) -> None:
    set_stamp(data, None)
    assert stamp(data) is None
    stats = ckpt("stats", "--data-dir", str(data))  # read-only: reads it, stamps nothing
    assert stats.returncode == 0, stats.stderr
    assert stamp(data) is None
    with Store(StoreConfig(data_dir=data)) as store:  # the first writable open stamps it
        assert store.get("s").state == b"\x08\x01"
    assert stamp(data) == b"6"


def test_a_store_a_newer_ckpt_wrote_is_refused_and_left_as_it_is(data: Path) -> None:
    set_stamp(data, b"10")
    before = (data / "lmdb" / "data.mdb").read_bytes()
    message = (
        f"{data / 'lmdb' / 'data.mdb'} was written by a newer ckpt (store layout 10; this ckpt reads layout 9):"
        " run that ckpt or a later one, or restore a backup this version wrote"
    )
    for readonly in (False, True):
        with pytest.raises(IncompatibleStore) as raised:
            Store(StoreConfig(data_dir=data), readonly=readonly)
        assert str(raised.value) == message
    for command in (["verify"], ["stats"], ["inspect", "s"], ["backup", str(data.parent / "backup")]):
        result = ckpt(*command, "--data-dir", str(data))
        assert result.returncode == 1 and result.stderr.decode() == f"ckpt {command[0]}: {message}\n"
    serve = subprocess.run(
        [sys.executable, "-m", "ckpt.sidecar.cli", "serve", "--data-dir", str(data)],
        capture_output=True,
        cwd=ROOT,
        timeout=60,
    )
    assert serve.returncode == 1 and message in serve.stderr.decode()
    assert (data / "lmdb" / "data.mdb").read_bytes() == before
    assert stamp(data) == b"10"
    with pytest.raises(IncompatibleStore):  # and the data directory's lock was released
        Store(StoreConfig(data_dir=data))


def test_a_store_of_a_withdrawn_layout_is_refused_naming_it_not_as_a_newer_ckpts(data: Path) -> None:
    set_stamp(data, b"5")
    message = (
        f"{data / 'lmdb' / 'data.mdb'} is in store layout 5 (request records keyed by hashes, written by"
        " development builds only and withdrawn): no ckpt reads it; restore a backup of layout 9 or earlier"
    )
    for readonly in (False, True):
        with pytest.raises(IncompatibleStore) as raised:
            Store(StoreConfig(data_dir=data), readonly=readonly)
        assert str(raised.value) == message
    result = ckpt("verify", "--data-dir", str(data))
    assert result.returncode == 1 and result.stderr.decode() == f"ckpt verify: {message}\n"
    assert stamp(data) == b"5"


def test_a_stamp_that_is_not_a_number_is_damage(data: Path) -> None:
    set_stamp(data, b"one")
    with pytest.raises(DataLoss, match=r"the store's layout version b'one' is not a number"):
        Store(StoreConfig(data_dir=data))


def test_a_backup_of_an_unstamped_store_past_the_initial_map_opens_and_is_stamped(tmp_path: Path) -> None:
    """A compacted copy has no free pages, so its map is full: stamping it at open must grow the map
    (a backup of a store the previous release wrote, over 256 MiB, failed with MDB_MAP_FULL)."""
    config = StoreConfig(data_dir=tmp_path / "data", map_size_bytes=1 << 20)
    with Store(config) as store:
        store.put_many([PutRequest(f"s{n}", os.urandom(100_000)) for n in range(30)])  # ~3 MB: the map grew
    set_stamp(tmp_path / "data", None)
    with Store(config, readonly=True) as old:
        backup(old, tmp_path / "backup")
    assert stamp(tmp_path / "backup") is None
    with Store(StoreConfig(data_dir=tmp_path / "backup", map_size_bytes=1 << 20)) as restored:
        assert len(restored.get("s7").state) == 100_000
        assert restored.put("s7", b"\x08\x01").version == 2
    assert stamp(tmp_path / "backup") == b"6"


def test_a_newer_layout_is_refused_before_any_other_table_is_opened(data: Path) -> None:
    """A newer layout may drop a table: the tools name the layout (not MDB_NOTFOUND), and a writable open
    recreates nothing."""
    set_stamp(data, b"10")
    env = lmdb.open(str(data / "lmdb"), max_dbs=8)
    with env.begin(write=True) as txn:
        txn.drop(env.open_db(b"labels", txn=txn), delete=True)
    env.close()
    before = (data / "lmdb" / "data.mdb").read_bytes()
    for readonly in (False, True):
        with pytest.raises(IncompatibleStore, match="store layout 10"):
            Store(StoreConfig(data_dir=data), readonly=readonly)
    stats = ckpt("stats", "--data-dir", str(data))
    assert stats.returncode == 1 and b"written by a newer ckpt (store layout 10" in stats.stderr
    assert (data / "lmdb" / "data.mdb").read_bytes() == before


def _index_at_exact_update_times(data: Path, *, hours_ago: int) -> None:
    """Make ``data`` what the first builds wrote (before 45d3d3a, which keyed the updated-time index by
    ~1 s granule): no layout stamp, and each session indexed at its exact update time, here set
    ``hours_ago`` back with a non-zero nanosecond part (as a real clock gives), as are its versions' and its
    creation's times (`ckpt verify` checks them against each other)."""
    set_stamp(data, None)
    back = hours_ago * 3600 * 10**9 - 123_457
    env = lmdb.open(str(data / "lmdb"), max_dbs=8)
    try:
        sessions, updated, frames = env.open_db(b"sessions"), env.open_db(b"updated"), env.open_db(b"frames")
        with env.begin(write=True) as txn:
            txn.drop(updated, delete=False)
            for sid, raw in list(txn.cursor(db=sessions)):
                rec = records_pb2.SessionRecord.FromString(raw)
                rec.updated_unix_nanos -= back
                rec.created_unix_nanos -= back
                assert keys.updated_granule(rec.updated_unix_nanos) != rec.updated_unix_nanos
                txn.put(sid, rec.SerializeToString(), db=sessions)
                for version in range(rec.first_version, rec.head_version + 1):
                    key = keys.frame_key(sid, version)
                    value = bytes(txn.get(key, db=frames) or b"")
                    (n,) = struct.unpack_from("<H", value)
                    meta = records_pb2.VersionRecord.FromString(value[2 : 2 + n])
                    meta.created_unix_nanos -= back
                    encoded = meta.SerializeToString()
                    txn.put(key, struct.pack("<H", len(encoded)) + encoded + value[2 + n :], db=frames)
                txn.put(keys.time_key(rec.updated_unix_nanos, sid), b"", db=updated)
    finally:
        env.close()


def _updated_index(data: Path) -> set[bytes]:
    env = lmdb.open(str(data / "lmdb"), max_dbs=8, readonly=True)
    try:
        with env.begin(db=env.open_db(b"updated", create=False)) as txn:
            return {bytes(key) for key, _ in txn.cursor()}
    finally:
        env.close()


def _listed_by_update_time(store: Store) -> list[str]:
    listed, token = [], ""
    while True:
        page, token = store.list_sessions(updated_after_nanos=0, page_token=token)
        listed += [info.session_id for info in page]
        if not token:
            return sorted(listed)


def test_a_store_the_first_builds_wrote_is_indexed_by_granule_on_its_first_writable_open(tmp_path: Path) -> None:
    """The first builds indexed a session at its exact update time; this one keys, moves and deletes the
    entry at its ~1 s granule. Upgrading such a store, `ckpt verify`
    failed every session ('no entry for the record's update time') and, once written by this build, each
    session kept its old entry beside the new one, listed twice by update time for good."""
    data = tmp_path / "data"
    with Store(StoreConfig(data_dir=data)) as store:
        for sid in ("a", "b", "c", "gone"):
            store.put(sid, b"\x08\x01")
    _index_at_exact_update_times(data, hours_ago=2)
    verify = ckpt("verify", "--data-dir", str(data))  # read-only: the older layout is not damage
    assert verify.returncode == 0, verify.stderr
    assert stamp(data) is None
    with Store(StoreConfig(data_dir=data)) as store:
        assert _listed_by_update_time(store) == ["a", "b", "c", "gone"]
        store.put("a", b"\x08\x02")
        store.delete_session("gone")
        store.fork("b", 1, "b2")
        assert _listed_by_update_time(store) == ["a", "b", "b2", "c"]
        records = {sid: store.session(sid).updated_unix_nanos for sid in ("a", "b", "b2", "c")}
    assert stamp(data) == b"6"
    assert _updated_index(data) == {keys.updated_key(nanos, sid.encode()) for sid, nanos in records.items()}
    verify = ckpt("verify", "--data-dir", str(data))
    assert verify.returncode == 0, verify.stderr


def _request_keys_as_layout_1(data: Path) -> None:
    """Make ``data``'s request records what store layout 1 wrote: keyed session NUL request id (and their
    expiry entries naming those keys), stamped layout 1."""
    env = lmdb.open(str(data / "lmdb"), max_dbs=8)
    try:
        requests, expiry = env.open_db(b"requests"), env.open_db(b"req_expiry")
        with env.begin(write=True) as txn:
            for key, value in list(txn.cursor(db=requests)):
                assert key.startswith(keys.REQUEST_KEY_MARK)
                txn.delete(key, db=requests)
                txn.put(keys.layout1_request_key(key), value, db=requests)
            for key, _ in list(txn.cursor(db=expiry)):
                txn.delete(key, db=expiry)
                txn.put(key[:8] + keys.layout1_request_key(key[8:]), b"", db=expiry)
    finally:
        env.close()
    set_stamp(data, b"1")


def _request_keys(data: Path) -> tuple[list[bytes], list[bytes]]:
    env = lmdb.open(str(data / "lmdb"), max_dbs=8, readonly=True)
    try:
        with env.begin() as txn:
            requests = [bytes(k) for k in txn.cursor(db=env.open_db(b"requests", txn=txn)).iternext(values=False)]
            expiry = [bytes(k[8:]) for k in txn.cursor(db=env.open_db(b"req_expiry", txn=txn)).iternext(values=False)]
        return requests, expiry
    finally:
        env.close()


def test_request_records_of_layout_1_answer_retries_until_they_expire_and_the_store_is_stamped_anew(
    tmp_path: Path,
) -> None:
    """Layout 2 keys a request record by request id first (its records of one commit share a page or
    two); layout 1 keyed it by session. An upgraded store keeps its layout-1 records where they are:
    retries still find them, a delete still removes them with their session, the sweeper expires them,
    and `ckpt verify` passes throughout. Once this ckpt has written, an older one refuses the store: it
    would not find the new records, and a retry across the downgrade would write twice."""
    data = tmp_path / "data"
    ttl = 120.0  # outlasts the `ckpt verify` runs below on a loaded machine; the sweep is told the time
    with Store(StoreConfig(data_dir=data, request_id_ttl_seconds=ttl)) as store:
        for sid in ("a", "b"):
            store.put(sid, b"\x08\x01", request_id=f"{sid}-old")
    _request_keys_as_layout_1(data)
    assert _request_keys(data) == ([b"a\x00a-old", b"b\x00b-old"], [b"a\x00a-old", b"b\x00b-old"])
    verify = ckpt("verify", "--data-dir", str(data))
    assert verify.returncode == 0, verify.stderr
    with Store(StoreConfig(data_dir=data, sweep_interval_seconds=3600)) as store:
        retried = store.put("a", b"\x08\x01", request_id="a-old")
        assert retried.replayed and retried.version == 1
        with pytest.raises(InvalidArgument, match="request_id 'a-old' was used for a different write"):
            store.put("a", b"\x08\x02", request_id="a-old")
        assert store.put("a", b"\x08\x03", request_id="a-new").version == 2
        assert store.delete_session("b") == 1  # its layout-1 record goes with it, as layout 1 did
        assert not store.put("b", b"\x08\x01", request_id="b-old").replayed
    assert stamp(data) == b"6"
    requests, expiry = _request_keys(data)
    expected = [keys.request_key(b"a", "a-new"), keys.request_key(b"b", "b-old"), b"a\x00a-old"]
    assert requests == sorted(expected) and sorted(expiry) == sorted(expected)  # expiry entries: in time order
    verify = ckpt("verify", "--data-dir", str(data))
    assert verify.returncode == 0, verify.stderr
    with Store(StoreConfig(data_dir=data, sweep_interval_seconds=3600)) as store:
        past_ttl = time.time_ns() + int(ttl * 1e9) + 10**9
        assert store.sweep(now_nanos=past_ttl).request_ids_expired == 1  # a-old: the two above expire a day later
        # No layout-1 key is left to look under; the current records still answer.
        assert store.put("a", b"\x08\x03", request_id="a-new").replayed
        assert not store.put("a", b"\x08\x01", request_id="a-old").replayed  # expired: a new write
    requests, _ = _request_keys(data)
    assert all(key.startswith(keys.REQUEST_KEY_MARK) for key in requests)
    with pytest.raises(IncompatibleStore, match="store layout 6; this ckpt reads layout 1"), _layout_version(1):
        Store(StoreConfig(data_dir=data))


@contextlib.contextmanager
def _layout_version(version: int) -> Iterator[None]:
    """The store code reading only layouts up to ``version``: an older ckpt, as far as the stamp goes.
    (A private hook: the layout this code reads is a constant of its module.)"""

    before = layout.LAYOUT_VERSION
    layout.LAYOUT_VERSION = version
    try:
        yield
    finally:
        layout.LAYOUT_VERSION = before


def test_a_layout_2_store_gains_the_types_table_and_an_older_ckpt_refuses_it_from_then_on(data: Path) -> None:
    """Layout 3 adds the types table and typed sessions: an older ckpt would write a typed session's patches
    unchecked, so the first writable open stamps the store 3 (a read-only one reads it as it is)."""
    env = lmdb.open(str(data / "lmdb"), max_dbs=8)
    with env.begin(write=True) as txn:
        txn.drop(env.open_db(b"types", txn=txn), delete=True)
        txn.put(b"layout_version", b"2", db=env.open_db(b"meta", txn=txn))
    env.close()
    with Store(StoreConfig(data_dir=data), readonly=True) as old:
        assert old.tables.types is None and old.get("s").state == b"\x08\x01"
    verify = ckpt("verify", "--data-dir", str(data))
    assert verify.returncode == 0, verify.stderr
    with Store(StoreConfig(data_dir=data)) as store:
        store.put("s", b"\x08\x02", message_type="ckpt.v1.Checkpoint")
        assert store.tables.types is not None
    assert stamp(data) == b"6"
    with pytest.raises(IncompatibleStore, match="store layout 6; this ckpt reads layout 2"), _layout_version(2):
        Store(StoreConfig(data_dir=data))


def test_a_layout_3_store_gains_the_event_log_and_an_older_ckpt_refuses_it_from_then_on(data: Path) -> None:
    """Layout 4 adds the event log's tables: an older ckpt would leave a deleted session's events behind,
    so the first writable open stamps the store 4 (a read-only one reads it as it is, without events)."""
    env = lmdb.open(str(data / "lmdb"), max_dbs=10)
    with env.begin(write=True) as txn:
        for name in (b"events", b"event_logs"):
            txn.drop(env.open_db(name, txn=txn), delete=True)
        txn.put(b"layout_version", b"3", db=env.open_db(b"meta", txn=txn))
    env.close()
    with Store(StoreConfig(data_dir=data), readonly=True) as old:
        assert old.tables.events is None and old.get("s").state == b"\x08\x01"
        assert old.read_events("s").events == []  # a session without a log: no events, not an error
    verify = ckpt("verify", "--data-dir", str(data))
    assert verify.returncode == 0, verify.stderr
    with Store(StoreConfig(data_dir=data)) as store:
        assert store.append_events("s", [NewEvent("step")]).first_seq == 1
        assert store.tables.events is not None
    assert stamp(data) == b"6"
    with pytest.raises(IncompatibleStore, match="store layout 6; this ckpt reads layout 3"), _layout_version(3):
        Store(StoreConfig(data_dir=data))
