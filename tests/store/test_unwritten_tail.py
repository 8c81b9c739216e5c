"""A store whose commits left data.mdb shorter than its last page reopens; a copy that lost pages does not.

LMDB never writes pages a transaction allocated and freed again: a 4 MB state
put and its session deleted in one group commit leave ~1,000 unwritten pages
at the end of the file. The writer grows the file right after such a commit;
a power cut before that leaves the gap on disk, and the open-time check must
tell it (every page past the end on LMDB's free list) from a truncated copy.
"""

from __future__ import annotations

import random
import shutil
import struct
import threading
from pathlib import Path

import lmdb
import pytest

from ckpt.sidecar import DataLoss, PutRequest, Store, StoreConfig
from ckpt.sidecar.client import CheckpointClient
from ckpt.sidecar.server.process import start_sidecar_process
from ckpt.sidecar.storage import lmdb_storage
from ckpt.sidecar.store import check_not_truncated
from tests.store.support import put_later, wait_queued, writer_held
from tests.support import ckpt, free_port, start_sidecar


def _bytes(store: Store) -> tuple[int, int]:
    """(bytes of the pages the last commit's meta page says are in use, bytes data.mdb holds)."""
    return store.stats()["used_bytes"], (store.config.data_dir / "lmdb" / "data.mdb").stat().st_size


def _put_and_delete_in_one_commit(data_dir: Path) -> None:
    big = random.Random(7).randbytes(4_000_000)  # incompressible: ~1,000 overflow pages
    store = Store(StoreConfig(data_dir=data_dir))
    try:
        store.put("other", b"kept")
        rng = random.Random(8)
        store.put_many([PutRequest(f"warm{i}", rng.randbytes(300_000)) for i in range(20)])
        store.put("first", b"x")
        # The writer held in a batch of the test's own while the put and the delete queue behind it:
        # released, they share the following commit.
        with writer_held(store):
            doomed = put_later(store, PutRequest("doomed", big))
            wait_queued(store, 1)  # before the delete
            deleted: list[int] = []
            deleting = threading.Thread(target=lambda: deleted.append(store.delete_session("doomed")))
            deleting.start()
            wait_queued(store, 2)
            commits = store.counters.commits
        deleting.join()
        assert doomed.result().version == 1 and deleted == [1]
        # The held batch's commit, then the put's and the delete's together.
        assert store.counters.commits == commits + 2
        used, in_file = _bytes(store)
        assert in_file >= used, f"data.mdb holds {in_file} bytes, its meta page uses {used}"
    finally:
        store.close()


def test_a_large_put_and_its_delete_in_one_commit_leave_a_store_that_reopens(tmp_path: Path) -> None:
    _put_and_delete_in_one_commit(tmp_path / "data")
    with Store(StoreConfig(data_dir=tmp_path / "data")) as reopened:
        assert reopened.get("other").state == b"kept"
        assert "doomed" not in set(reopened.session_ids()) and "first" in set(reopened.session_ids())


@pytest.fixture(scope="module")
def cut_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The data directory as a power cut leaves it right after the put's and the delete's commit.

    data.mdb is copied as the writer begins to grow it after that commit:
    LMDB has then written (and synced) the commit's pages and its meta page,
    so the copy is what the disk holds at that instant.
    """
    root = tmp_path_factory.mktemp("cut")
    image = root / "image"
    grow = lmdb_storage.LmdbStorage.committed

    def committed(self: lmdb_storage.LmdbStorage) -> None:
        if not image.exists() and self.data_file.stat().st_size < self.sizes()[1]:
            (image / "lmdb").mkdir(parents=True)
            shutil.copyfile(self.data_file, image / "lmdb" / "data.mdb")
        grow(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lmdb_storage.LmdbStorage, "committed", committed)
        _put_and_delete_in_one_commit(root / "data")
    assert image.exists(), "no commit left data.mdb short of its last page"
    return image


@pytest.fixture
def cut(cut_image: Path, tmp_path: Path) -> Path:
    shutil.copytree(cut_image, tmp_path / "data")
    return tmp_path / "data"


def _meta(data_mdb: Path) -> tuple[int, int, int]:
    """(page size, bytes its newest meta page's database spans, the free list's root page)."""
    env = lmdb.open(str(data_mdb.parent), readonly=True, lock=False)
    psize, last = env.stat()["psize"], env.info()["last_pgno"]
    env.close()
    raw = data_mdb.read_bytes()[: 2 * psize]
    # MDB_meta after the 16-byte page header: mm_dbs[0] (the free list) md_root at 80, mm_txnid at 144.
    newest = max((0, psize), key=lambda base: struct.unpack_from("<Q", raw, base + 144)[0])
    return psize, (last + 1) * psize, struct.unpack_from("<Q", raw, newest + 80)[0]


def test_a_power_cut_before_the_file_grew_leaves_a_store_that_reopens(cut: Path) -> None:
    data_mdb = cut / "lmdb" / "data.mdb"
    psize, needed, _ = _meta(data_mdb)
    short = data_mdb.stat().st_size
    assert needed - short > 64 * psize, f"the gap is {(needed - short) // psize} pages"  # past any tolerance
    verify = ckpt("verify", "--data-dir", str(cut))  # a read-only open: it leaves the file as it is
    assert verify.returncode == 0, verify
    assert data_mdb.stat().st_size == short
    sidecar = start_sidecar(cut)
    try:
        with CheckpointClient(sidecar.unix_target, retries=0) as c:
            assert c.get("other").state == b"kept"
            sessions = {s.session_id for s in c.sessions()}
            assert "first" in sessions and "doomed" not in sessions
            c.put("after", b"written")
            assert c.get("after").state == b"written"
    finally:
        assert sidecar.stop() == 0
    assert data_mdb.stat().st_size >= needed  # grown with zeros at the open


def _backup_missing_its_last_page(cut: Path) -> Path:
    with Store(StoreConfig(data_dir=cut)):  # grows the file: a backup needs a whole store
        pass
    backup = cut.parent / "backup"
    out = ckpt("backup", "--data-dir", str(cut), str(backup))
    assert out.returncode == 0, out
    return backup


@pytest.mark.parametrize("copy", ["meta pages only", "a compact backup missing its last page"])
def test_a_copy_missing_pages_its_database_uses_is_refused(cut: Path, copy: str) -> None:
    """A compact copy has no free pages: any page it lacks is one its database uses, however few."""
    data = cut if copy == "meta pages only" else _backup_missing_its_last_page(cut)
    data_mdb = data / "lmdb" / "data.mdb"
    psize, needed, _ = _meta(data_mdb)
    with data_mdb.open("r+b") as f:
        f.truncate(2 * psize if copy == "meta pages only" else needed - psize)
    size = data_mdb.stat().st_size
    # The pages past the end the database uses, or the free list's own (read to tell which are free).
    lost = r"data\.mdb is truncated: .*(pages past its end are in use|of its free-page list is past its end)"
    with pytest.raises(DataLoss, match=lost):
        Store(StoreConfig(data_dir=data))
    verify = ckpt("verify", "--data-dir", str(data))
    assert verify.returncode == 1 and b"is truncated" in verify.stderr, verify
    assert data_mdb.stat().st_size == size  # not grown: nothing was served as if whole


def _free_list_leaf(data_mdb: Path) -> tuple[bytearray, int, int, list[tuple[int, int]]]:
    """(the file, page size, the free list's root leaf, (node offset, data offset in the file) per node)."""
    psize, _, root = _meta(data_mdb)
    buf = bytearray(data_mdb.read_bytes())
    base = root * psize
    assert struct.unpack_from("<H", buf, base + 10)[0] == 0x02, "the free list is more than its root leaf"
    nodes = []
    for i in range((struct.unpack_from("<H", buf, base + 12)[0] - 16) // 2):
        offset = struct.unpack_from("<H", buf, base + 16 + 2 * i)[0]
        flags, ksize = struct.unpack_from("<HH", buf, base + offset + 4)
        data = base + offset + 8 + ksize
        if flags & 0x01:  # F_BIGDATA: on an overflow run, after its page header
            data = struct.unpack_from("<Q", buf, data)[0] * psize + 16
        nodes.append((offset, data))
    return buf, psize, base, nodes


def _damage(buf: bytearray, psize: int, base: int, nodes: list[tuple[int, int]], damage: str) -> None:
    if damage == "leaf zeroed":
        buf[base : base + psize] = bytes(psize)
    elif damage == "leaf overwritten":
        buf[base : base + psize] = random.Random(1).randbytes(psize)
    elif damage == "node past the page":
        struct.pack_into("<H", buf, base + 16, psize - 4)
    elif damage == "record count past its bytes":
        struct.pack_into("<Q", buf, max(nodes, key=lambda n: n[1])[1], 2**40)
    elif damage == "page number past the last page":
        struct.pack_into("<Q", buf, max(nodes, key=lambda n: n[1])[1] + 8, 2**40)
    elif damage == "overflow run in the gap":
        offset = next(o for o, d in nodes if d % psize == 16)  # a record on an overflow run
        ksize = struct.unpack_from("<H", buf, base + offset + 6)[0]
        struct.pack_into("<Q", buf, base + offset + 8 + ksize, len(buf) // psize + 1)


@pytest.mark.parametrize(
    "damage",
    [
        "leaf zeroed",
        "leaf overwritten",
        "node past the page",
        "record count past its bytes",
        "page number past the last page",
        "overflow run in the gap",
    ],
)
def test_a_damaged_free_list_past_a_short_file_is_refused(cut: Path, damage: str) -> None:
    data_mdb = cut / "lmdb" / "data.mdb"
    buf, psize, base, nodes = _free_list_leaf(data_mdb)
    _damage(buf, psize, base, nodes, damage)
    data_mdb.write_bytes(buf)
    with pytest.raises(DataLoss, match=r"data\.mdb is truncated: .*free-page list"):
        Store(StoreConfig(data_dir=cut))
    assert data_mdb.stat().st_size == len(buf)


def test_random_damage_to_the_free_list_is_refused_or_left_whole(cut: Path) -> None:
    """Bytes of the free list's pages changed at random: the check refuses the file (DataLoss) or finds
    every page past the end still free, never another error or a hang."""
    data_mdb = cut / "lmdb" / "data.mdb"
    whole, psize, base, nodes = _free_list_leaf(data_mdb)
    pages = sorted({base // psize} | {data // psize for _, data in nodes})
    rng = random.Random(3)
    refused = 0  # of 300
    for _ in range(300):
        buf = bytearray(whole)
        for _ in range(rng.randint(1, 8)):
            at = rng.choice(pages) * psize + rng.choice([rng.randrange(16), rng.randrange(psize)])
            buf[at] = rng.randrange(256)
        data_mdb.write_bytes(buf)
        try:
            check_not_truncated(data_mdb, extend=False)
        except DataLoss as exc:
            assert "is truncated" in str(exc) or "cannot be opened" in str(exc), exc
            refused += 1
    assert 100 < refused < 300  # damage to bytes LMDB does not read (a page's gap, a key) leaves it whole


def _killed_first_start(data: Path, *, lock_file: bool) -> Path:
    """The data directory a first start killed before LMDB's first write leaves: data.mdb made and empty
    (LMDB writes a new file's meta pages first, so nothing was committed), and LMDB's lock file or not."""
    (data / "lmdb").mkdir(parents=True)
    (data / "lmdb" / "data.mdb").touch()
    if lock_file:
        lmdb.open(str(data.parent / "other"), max_dbs=0).close()
        shutil.copyfile(data.parent / "other" / "lock.mdb", data / "lmdb" / "lock.mdb")
    return data / "lmdb" / "data.mdb"


@pytest.mark.parametrize("lock_file", [True, False], ids=["with-lock-mdb", "without-lock-mdb"])
def test_a_first_start_killed_before_lmdb_wrote_leaves_a_store_that_starts_empty(
    tmp_path: Path, lock_file: bool
) -> None:
    data_mdb = _killed_first_start(tmp_path / "data", lock_file=lock_file)
    for command in (("verify",), ("inspect", "s")):
        out = ckpt(*command, "--data-dir", str(tmp_path / "data"))  # read-only: it holds nothing yet
        assert out.returncode == 1 and b"holds nothing yet" in out.stderr, out
        assert b"cannot be opened" not in out.stderr and b"Traceback" not in out.stderr, out
    assert data_mdb.stat().st_size == 0
    sidecar = start_sidecar(tmp_path / "data")
    try:
        with CheckpointClient(sidecar.unix_target, retries=0) as c:
            assert list(c.sessions()) == []
            c.put("s", b"\x08\x01")
            assert c.get("s").state == b"\x08\x01"
    finally:
        assert sidecar.stop() == 0
    verify = ckpt("verify", "--data-dir", str(tmp_path / "data"))
    assert verify.returncode == 0 and b"1 ok" in verify.stdout, verify


def test_workers_and_an_embedded_store_start_on_a_data_file_left_empty(tmp_path: Path) -> None:
    _killed_first_start(tmp_path / "data", lock_file=True)
    port = free_port()
    sidecar = start_sidecar_process(
        tmp_path / "data", "--workers", "2", listen=[f"127.0.0.1:{port}"], inherit_ckpt_env=False
    )
    try:
        with CheckpointClient(f"127.0.0.1:{port}", retries=0) as c:
            c.put("s", b"\x08\x01")
            assert c.get("s").state == b"\x08\x01"
    finally:
        assert sidecar.stop() == 0, sidecar.log()
    _killed_first_start(tmp_path / "embedded", lock_file=False)
    with Store(StoreConfig(data_dir=tmp_path / "embedded")) as store:
        assert store.put("s", b"kept").version == 1
    with Store(StoreConfig(data_dir=tmp_path / "embedded"), readonly=True) as store:
        assert store.get("s").state == b"kept"
