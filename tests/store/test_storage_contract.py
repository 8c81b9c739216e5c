"""The storage seam's contract (docs/storage.md), run against each implementation of it.

Every test here uses the seam alone (sidecar/storage/seam.py), so a second
implementation (PostgreSQL) runs the same tests by adding itself to
IMPLEMENTATIONS: how to open an empty one, and how to damage a table in it.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import lmdb
import pytest

from ckpt.sidecar import DataLoss, Unavailable
from ckpt.sidecar.limits import map_reserve_bytes
from ckpt.sidecar.storage import LmdbStorage, Storage, Table, open_lmdb


@dataclass(frozen=True)
class Implementation:
    name: str
    #: A new, empty storage in the directory (writable).
    open: Callable[[Path], Storage]
    #: Damage the stored table ``name`` of the closed storage in the directory, so that reading it fails
    #: the implementation's own checks; then the storage opened again.
    damage: Callable[[Path, str], Storage]


def _open_lmdb(root: Path) -> Storage:
    storage, _ = open_lmdb(
        root / "lmdb",
        readonly=False,
        map_size_bytes=1 << 20,
        max_map_size_bytes=1 << 22,
        max_readers=16,
        meta_sync=True,
        prepare=lambda storage: None,
    )
    return storage


def _damage_lmdb(root: Path, name: str) -> Storage:
    """Clear the page flags of the table's B-tree root: LMDB then fails its checks reading that table."""
    env = lmdb.open(str(root / "lmdb"), max_dbs=8, readonly=True)
    with env.begin() as txn:
        record = txn.get(name.encode())  # the table's MDB_db record in the main database
    page_bytes = env.stat()["psize"]
    env.close()
    root_page = struct.unpack_from("<Q", record or b"", 40)[0]  # md_root, after pad/flags/depth and 4 counters
    with (root / "lmdb" / "data.mdb").open("r+b") as f:
        f.seek(root_page * page_bytes + 10)  # mp_flags
        f.write(b"\x00\x00")
    return _open_lmdb(root)


IMPLEMENTATIONS = [Implementation("lmdb", _open_lmdb, _damage_lmdb)]


@pytest.fixture(params=IMPLEMENTATIONS, ids=lambda impl: impl.name)
def impl(request: pytest.FixtureRequest) -> Implementation:
    found: Implementation = request.param
    return found


@pytest.fixture
def storage(impl: Implementation, tmp_path: Path) -> Iterator[Storage]:
    opened = impl.open(tmp_path)
    try:
        yield opened
    finally:
        opened.close()


def _table(storage: Storage, name: str = "t") -> Table:
    table = storage.table(name, create=True)
    assert table is not None
    return table


def _fill(storage: Storage, table: Table, keys: list[bytes]) -> None:
    with storage.write() as txn:
        for key in keys:
            txn.put(key, b"v:" + key, db=table)


KEYS = [b"b", b"a", b"a\x00", b"\xff", b"ab", b"\x00\x01", b"a\x00\xff", b"\x7f"]


def test_keys_are_in_bytewise_order(storage: Storage) -> None:
    table = _table(storage)
    _fill(storage, table, KEYS)
    with storage.read() as txn:
        assert list(txn.scan_keys(table)) == sorted(KEYS)
        assert list(txn.scan(table)) == [(k, b"v:" + k) for k in sorted(KEYS)]
        assert [k for k, _ in txn.scan_back(table)] == sorted(KEYS, reverse=True)
        assert txn.count(table) == len(KEYS)


def test_scans_start_where_they_are_told(storage: Storage) -> None:
    table = _table(storage)
    _fill(storage, table, [b"a", b"b", b"c", b"d"])
    with storage.read() as txn:
        assert list(txn.scan_keys(table, b"b")) == [b"b", b"c", b"d"]  # from the key itself
        assert list(txn.scan_keys(table, b"bb")) == [b"c", b"d"]  # from the next one
        assert list(txn.scan_keys(table, b"e")) == []
        assert [k for k, _ in txn.scan_back(table, b"c")] == [b"b", b"a"]  # strictly before
        assert [k for k, _ in txn.scan_back(table, b"c\x00")] == [b"c", b"b", b"a"]
        assert list(txn.scan_back(table, b"a")) == []
        assert txn.last_before(table, b"c") == (b"b", b"v:b")  # scan_back's first pair
        assert txn.last_before(table, b"z") == (b"d", b"v:d")  # past the last key: the last one
        assert txn.last_before(table, b"a") is None
        assert txn.keys_after(table, b"", 2) == [b"a", b"b"]
        assert txn.keys_after(table, b"b", 10) == [b"c", b"d"]  # strictly after
        assert txn.keys_after(table, b"d", 10) == []
        scan = txn.scan(table, b"b")
        assert next(scan) == (b"b", b"v:b")  # lazily: a caller stops when past its range


def test_an_empty_table_scans_to_nothing(storage: Storage) -> None:
    table = _table(storage)
    with storage.read() as txn:
        assert list(txn.scan(table)) == [] and list(txn.scan_back(table)) == []
        assert txn.last_before(table, b"a") is None
        assert txn.keys_after(table, b"", 5) == [] and txn.count(table) == 0
        assert txn.get(b"a", db=table) is None


def test_put_get_delete(storage: Storage) -> None:
    table = _table(storage)
    with storage.write() as txn:
        txn.put(b"k", b"one", db=table)
        assert txn.get(b"k", db=table) == b"one"  # a write transaction reads its own writes
        assert not txn.put(b"k", b"two", db=table, overwrite=False)
        assert txn.get(b"k", db=table) == b"one"
        assert txn.put(b"k", b"three", db=table)
        assert txn.put(b"gone", b"x", db=table, overwrite=False)
        assert txn.delete(b"gone", db=table)
        assert not txn.delete(b"never", db=table)
    with storage.read() as txn:
        assert txn.get(b"k", db=table) == b"three"
        assert txn.get(b"gone", db=table) is None


def test_delete_range_removes_the_half_open_range(storage: Storage) -> None:
    table = _table(storage)
    _fill(storage, table, [b"a", b"b", b"b\x00", b"b\x01", b"c", b"d"])
    with storage.write() as txn:
        assert txn.delete_range(table, b"b", b"c") == 3
        assert txn.delete_range(table, b"x", b"z") == 0
        assert txn.delete_range(table, b"c", b"\xff") == 2  # through the last key
    with storage.read() as txn:
        assert list(txn.scan_keys(table)) == [b"a"]


def test_tables_are_separate(storage: Storage) -> None:
    one, two = _table(storage, "one"), _table(storage, "two")
    with storage.write() as txn:
        txn.put(b"k", b"1", db=one)
        txn.put(b"k", b"2", db=two)
    with storage.read() as txn:
        assert (txn.get(b"k", db=one), txn.get(b"k", db=two)) == (b"1", b"2")
    assert storage.table("missing", create=False) is None


def test_a_write_that_raises_leaves_nothing(storage: Storage) -> None:
    table = _table(storage)
    _fill(storage, table, [b"kept"])
    with pytest.raises(RuntimeError), storage.write() as txn:
        txn.put(b"new", b"x", db=table)
        txn.delete(b"kept", db=table)
        raise RuntimeError("abort")
    with storage.read() as txn:
        assert list(txn.scan_keys(table)) == [b"kept"]


def test_a_nested_transaction_undoes_its_own_writes_alone(storage: Storage) -> None:
    table = _table(storage)
    with storage.write() as txn:
        txn.put(b"outer", b"1", db=table)
        with pytest.raises(RuntimeError), txn.nested() as sub:
            sub.put(b"inner-undone", b"x", db=table)
            raise RuntimeError("one op fails")
        with txn.nested() as sub:
            sub.put(b"inner-kept", b"y", db=table)
        assert txn.get(b"inner-kept", db=table) == b"y"
    with storage.read() as txn:
        assert list(txn.scan_keys(table)) == [b"inner-kept", b"outer"]


def test_a_read_sees_one_snapshot_while_writes_commit(storage: Storage) -> None:
    table = _table(storage)
    _fill(storage, table, [b"a", b"b"])
    committed = threading.Event()

    def write() -> None:
        with storage.write() as txn:
            txn.put(b"a", b"changed", db=table)
            txn.put(b"c", b"new", db=table)
            txn.delete(b"b", db=table)
        committed.set()

    with storage.read() as txn:
        assert txn.get(b"a", db=table) == b"v:a"
        writer = threading.Thread(target=write)
        writer.start()
        assert committed.wait(10)  # a read does not hold writes back
        assert txn.get(b"a", db=table) == b"v:a"
        assert list(txn.scan_keys(table)) == [b"a", b"b"]
        assert txn.count(table) == 2
    writer.join()
    with storage.read() as txn:  # a read begun after the commit sees all of it
        assert list(txn.scan(table)) == [(b"a", b"changed"), (b"c", b"new")]


def test_commits_are_serialised(storage: Storage) -> None:
    table = _table(storage)
    with storage.write() as first:
        first.put(b"n", b"0", db=table)

    def increment() -> None:
        for _ in range(50):
            with storage.write() as txn:
                txn.put(b"n", b"%d" % (int(txn.get(b"n", db=table) or b"") + 1), db=table)

    threads = [threading.Thread(target=increment) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    with storage.read() as txn:
        assert txn.get(b"n", db=table) == b"200"  # no increment lost to another writer


def test_damage_is_data_loss_when_the_read_ends(impl: Implementation, tmp_path: Path) -> None:
    storage = impl.open(tmp_path)
    table = _table(storage, "fragile")
    _fill(storage, table, [b"k%03d" % i for i in range(300)])
    storage.close()
    storage = impl.damage(tmp_path, "fragile")
    try:
        table = _table(storage, "fragile")
        with pytest.raises(DataLoss, match="damaged"), storage.read() as txn:
            list(txn.scan(table))
    finally:
        storage.close()


def test_a_closed_storage_refuses_reads(impl: Implementation, tmp_path: Path) -> None:
    storage = impl.open(tmp_path)
    storage.close()
    with pytest.raises(Unavailable, match="closed"), storage.read():
        pass


# -- what only the LMDB implementation does ------------------------------------------------


def test_lmdb_signals_a_full_map_and_grows_up_to_its_cap(tmp_path: Path) -> None:
    storage = _open_lmdb(tmp_path)  # a 1 MiB map, capped at 4 MiB
    assert isinstance(storage, LmdbStorage)
    table = _table(storage)
    value = bytes(range(256)) * 1024  # 256 KiB: an overflow run of pages, never shared
    try:
        written = grown = 0
        while True:
            try:
                with storage.write() as txn:
                    txn.put(b"k%03d" % written, value, db=table)
                written += 1
            except storage.errors.full:
                if not storage.grow():
                    break
                grown += 1
        assert grown == 2 and storage.resizes == 2  # 1 -> 2 -> 4 MiB less the reserve kept for deletes
        soft = (1 << 22) - map_reserve_bytes(1 << 22)
        assert storage.sizes()[0] == soft
        assert "max_map_size_bytes (4194304, less 65536 kept for deletes" in storage.cap_reached()
        with storage.read() as txn:
            assert txn.count(table) == written  # every write that was refused left nothing
        assert storage.open_reserve() and not storage.open_reserve()
        assert storage.sizes()[0] == 1 << 22
        with storage.write() as txn:  # what a delete may take
            txn.put(b"small", b"x" * 1000, db=table)
        storage.close_reserve()
        assert storage.sizes()[0] == soft and not storage.grow()
    finally:
        storage.close()
