"""The storage seam on LMDB: one environment (a data.mdb and its lock.mdb), one named database per table.

With lmdb_txn.py (the transactions), lmdb_open.py (the checks made before an open), lmdb_rebuild.py and
lmdb_replace.py (compaction), the only modules that import lmdb. Errors are translated where they leave a
read transaction or an open (see seam.py).

LMDB requires that no transaction is open anywhere in the process while the map is resized: every read
transaction holds an RWLock shared and a resize holds it exclusive. The one write transaction is the writer
thread's, which is also the only one that grows the map; it and the other calls outside that lock are
counted (:meth:`LmdbStorage.let_go_in_child`).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import lmdb

from ..errors import DataLoss, Unavailable
from ..limits import map_reserve_bytes
from .files import PRIVATE_DIR_MODE, PRIVATE_FILE_MODE, disk_full_reason, grow_file
from .lmdb_open import KEPT_ACROSS_FORK, retry_map_resized
from .lmdb_rebuild import RebuildMismatch, rebuild
from .lmdb_txn import Committing, LmdbReadTxn, LmdbWriteTxn
from .rwlock import RWLock
from .seam import NativeErrors, ReadTxn, StorageFailure, Table

log = logging.getLogger("ckpt.store")

#: While data.mdb grows, dead readers' slots are looked for at most this often (besides before each sweep).
READER_CHECK_INTERVAL_SECONDS = 1.0
# Named databases the environment can open: the store's tables (layout.py) and room for a later layout's,
# which must open in a store an older build made (the limit is read at every open, not stored).
_MAX_TABLES = 32

# LMDB's errors for a damaged B-tree: stored data failing its checks, like a bad checksum. MDB_BAD_TXN too:
# when a table's root page fails to read as a cursor opens, LMDB marks the transaction failed without saying
# why, and the first cursor operation raises it. The store never reuses a failed transaction: it is damage.
DAMAGE: tuple[type[lmdb.Error], ...] = (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.BadTxnError)
# What opening a file that is no LMDB database (or a damaged one) fails with.
_NOT_LMDB: tuple[type[lmdb.Error], ...] = (*DAMAGE, lmdb.InvalidError, lmdb.VersionMismatchError)
# A key of the main database that release_freed() puts and deletes again in one transaction: never kept.
_RELEASE_KEY = b"ckpt:release-freed-pages"
ERRORS = NativeErrors(full=(lmdb.MapFullError,), damage=DAMAGE)


class _WriteScope(Committing):
    """:meth:`LmdbStorage.write`: LMDB's write lock from begin to commit (or abort)."""

    __slots__ = ("_storage",)

    def __init__(self, storage: LmdbStorage) -> None:
        self._storage = storage

    def __enter__(self) -> LmdbWriteTxn:
        storage = self._storage
        env = storage.env
        storage.count_calls(1)  # from before begin to after commit or abort (__exit__)
        try:
            while True:
                try:
                    self._txn = env.begin(write=True)
                except lmdb.MapResizedError:
                    # Another process (a --workers sibling) grew the map: adopt its size and begin again.
                    storage.adopt_size()
                    continue
                return LmdbWriteTxn(env, self._txn)
        except BaseException:
            storage.count_calls(-1)
            raise

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            super().__exit__(exc_type, exc, tb)
        finally:
            self._storage.count_calls(-1)


class _ReadScope:
    """:meth:`LmdbStorage.read`: a read transaction, holding the resize lock shared from begin to end.

    A class rather than a generator context manager: a cold read opens one, and the generator's two
    layers (this one and the lock's) cost about as much as LMDB's begin and end themselves.
    """

    __slots__ = ("_storage", "_txn")

    def __init__(self, storage: LmdbStorage) -> None:
        self._storage = storage
        self._txn: lmdb.Transaction | None = None

    def __enter__(self) -> LmdbReadTxn:
        storage = self._storage
        while True:
            storage._rw.acquire_shared()
            try:
                if storage._closed:  # closed while this reader waited for the lock
                    raise Unavailable("the store is closed")
                self._txn = storage.env.begin()
                return LmdbReadTxn(self._txn)
            except lmdb.MapResizedError:
                # Another process grew the map past ours (only a read-only store meets this: our own
                # writer grows it under the lock).
                storage._rw.release_shared()
            except lmdb.Error as exc:
                storage._rw.release_shared()
                raise storage._failure(exc) from None
            except BaseException:
                storage._rw.release_shared()
                raise
            with storage._rw.exclusive():
                storage.env.set_mapsize(0)  # adopt the size the file now has

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        storage, txn = self._storage, self._txn
        self._txn = None
        try:
            if txn is not None:
                txn.abort()  # a read transaction has nothing to commit
        finally:
            storage._rw.release_shared()
        if isinstance(exc, DAMAGE):
            raise storage.damaged(exc) from None
        if isinstance(exc, lmdb.Error):
            raise storage._failure(exc) from None


class LmdbStorage:
    """An open LMDB environment behind the seam (:class:`~.seam.Storage`); make one with :func:`open_lmdb`."""

    errors = ERRORS

    def __init__(
        self,
        lmdb_dir: Path,
        *,
        readonly: bool,
        map_size_bytes: int,
        max_map_size_bytes: int,
        max_readers: int,
        meta_sync: bool,
    ) -> None:
        self.readonly = readonly
        self._meta_sync = meta_sync
        self.data_file = lmdb_dir / "data.mdb"
        self.location = str(self.data_file)
        # Writes other than deletes grow the map to the cap less a reserve, so that a store full of them
        # can still delete (every delete copies the pages it changes): open_reserve.
        self._max_map_size = max_map_size_bytes
        self._reserve_bytes = map_reserve_bytes(max_map_size_bytes)
        self._writes_cap = max_map_size_bytes - self._reserve_bytes  # the map's size for other writes
        self._reserve_open = False
        self.resizes = 0
        self._rw = RWLock()
        # LMDB calls under way outside the lock, write transactions among them (let_go_in_child).
        self._calls = 0
        self._calls_lock = threading.Lock()
        self._closed = False  # set under the exclusive lock, as LMDB closes
        self.env = lmdb.open(
            str(lmdb_dir),
            map_size=min(map_size_bytes, self._writes_cap),
            max_dbs=_MAX_TABLES,
            max_readers=max_readers,
            sync=True,
            metasync=meta_sync,
            readahead=False,  # random reads of small values; readahead only pollutes the page cache
            subdir=True,
            readonly=readonly,
            mode=PRIVATE_DIR_MODE,  # py-lmdb: data.mdb and lock.mdb are made with it less the execute bits (0600)
        )
        # Opened at the size the file already has (it may have grown before).
        self._map_size = max(min(map_size_bytes, self._writes_cap), self.env.info()["map_size"])
        self._page_bytes = int(self.env.stat()["psize"])
        # The highest page the writer has seen committed, and when it may next look for dead readers.
        self._last_pgno_seen = 0 if readonly else self.env.info()["last_pgno"]
        self._next_reader_check = 0.0
        # The size data.mdb was last seen to have (it only grows): committed() stats it only past that.
        self._file_bytes_seen = 0
        # The transaction release_freed() last committed (0: none).
        self._released_at = 0

    # -- tables and transactions --------------------------------------------------

    def table(self, name: str, *, create: bool) -> Table | None:
        try:
            with self.calling():  # py-lmdb begins a transaction
                return self.env.open_db(name.encode(), create=create)
        except lmdb.NotFoundError:
            return None

    def count_calls(self, change: int) -> None:
        with self._calls_lock:
            self._calls += change

    @contextlib.contextmanager
    def calling(self) -> Iterator[None]:
        """Count an LMDB call (or a transaction) made outside the resize lock while the block runs."""
        self.count_calls(1)
        try:
            yield
        finally:
            self.count_calls(-1)

    def let_go_in_child(self) -> None:
        """In a child forked while this was open: close the inherited environment if that is safe.

        py-lmdb refuses to open an environment twice in one process, so while
        the child holds this one it can open no Store on the directory. Closing
        it is safe only with no transaction or call under way at the fork:
        py-lmdb would abort a parent's transaction in the child (freeing its
        reader slot under the parent) or wait forever for a writer thread the
        child lacks. With none, closing unmaps the child's copy and closes its
        descriptors only: the parent's locks stay (fcntl locks are not
        inherited), and nothing of the shared lock table the parent uses is
        touched. Else the environment is kept, and the child's opens of the
        directory say why (:func:`.lmdb_open.check_not_truncated`).
        """
        if self._closed:
            return
        if self._calls or not self._rw.idle:
            KEPT_ACROSS_FORK.add(os.path.realpath(self.data_file.parent))
            return
        self._closed = True
        self.env.close()

    def read(self) -> _ReadScope:
        return _ReadScope(self)

    def write(self) -> _WriteScope:
        return _WriteScope(self)

    def damaged(self, exc: BaseException) -> DataLoss:
        return DataLoss(f"the LMDB data file is damaged ({exc}); `ckpt verify` names what it affects")

    def _failure(self, exc: lmdb.Error) -> StorageFailure:
        return StorageFailure(f"LMDB failed on {self.data_file}: {exc}")

    # -- map growth and full stores ---------------------------------------------------

    @property
    def over_cap(self) -> bool:
        """Whether the map is already larger than max_map_size_bytes (a data file grown under a larger cap)."""
        return self._map_size > self._max_map_size

    def grow(self) -> bool:
        cap = self._max_map_size if self._reserve_open else self._writes_cap
        if self._map_size >= cap:
            return False
        self._resize(min(self._map_size * 2, cap))
        return True

    def open_reserve(self) -> bool:
        if self._reserve_open or self._map_size >= self._max_map_size:
            return False
        self._reserve_open = True
        self._resize(self._max_map_size)
        return True

    def close_reserve(self) -> None:
        if not self._reserve_open:
            return
        self._reserve_open = False
        with self.calling():  # the map stays at least as large as the pages in use: what a delete took
            used = (self.env.info()["last_pgno"] + 1) * self._page_bytes
        self._resize(max(self._writes_cap, used))

    def _resize(self, new_size: int) -> None:
        with self._rw.exclusive():
            self.env.set_mapsize(new_size)
            self._map_size = max(new_size, self.env.info()["map_size"])
        self.resizes += 1

    def release_freed(self) -> bool:
        """After a full error: if a transaction committed since the last one this made, commit one that
        leaves every table as it was (a key put and deleted again); whether it committed one.

        LMDB reuses pages freed by transaction N only in N + 2 and later: the
        writer's own snapshot, N, still counts as a reader of them. A session
        deleted in the last commit thus makes no room for the next; after this
        commit it does (unless a reader's older snapshot still holds them).
        """
        with self.calling():
            if self.env.info()["last_txnid"] == self._released_at:
                return False
            try:
                with self.write() as txn:
                    txn.put(_RELEASE_KEY, b"")
                    txn.delete(_RELEASE_KEY)
                    txnid = self.env.info()["last_txnid"] + 1  # this one's: no other writer commits meanwhile
            except lmdb.Error:  # no room even for this: nothing was committed
                return False
        self._released_at = txnid
        self.committed()
        return True

    def adopt_size(self) -> None:
        """Map the size another process grew the map to."""
        with self._rw.exclusive():
            self.env.set_mapsize(0)  # the size the file's meta page now gives
        with self.calling():
            self._map_size = max(self._map_size, self.env.info()["map_size"])

    def cap_reached(self) -> str:
        cap = (
            f"max_map_size_bytes ({self._max_map_size}, less {self._reserve_bytes} kept for deletes;"
            " ckpt serve --max-map-size-bytes)"
        )
        if self.over_cap:
            return f"the LMDB map is {self._map_size} bytes, the size of {self.data_file}, already over {cap}"
        return f"the LMDB map reached {cap}"

    def why_full(self, exc: BaseException, needed_bytes: int) -> str | None:
        # py-lmdb raises lmdb.DiskError for ENOSPC and a plain lmdb.Error for the system errors it has no
        # class for (EIO, EDQUOT, EFBIG); its other subclasses (map full, corruption, ...) are not the disk.
        if type(exc) not in (lmdb.Error, lmdb.DiskError):
            return None
        return disk_full_reason(str(exc), self.data_file, needed_bytes)

    # -- upkeep --------------------------------------------------------------------

    def flush(self) -> None:
        """Make every commit so far durable: without meta sync, the last commit's meta page is not yet."""
        if not self._meta_sync:
            with self.calling():
                self.env.sync(True)

    def committed(self) -> None:
        """After a commit: grow data.mdb to the committed last page if LMDB left it shorter.

        LMDB never writes pages a transaction allocated and freed again (a large
        state put and its session deleted in one group commit: a thousand pages
        for 4 MB), so the file can end far before its last page number, and
        every open would have to read the free list to tell the gap from a
        truncated copy (check_not_truncated: a power cut before this growth
        leaves the gap, and the next open grows the file). Grown with zeros
        (free pages: nothing reads them) and synced, under LMDB's writer lock,
        so no other worker's pages past the end can be cut. The file is looked
        at only when its last page passes the size last seen: data.mdb never
        shrinks while it is open, and with a stat on each commit this took
        ~25 us of the writer's time per commit (~10 us without, p50, in a
        LangGraph replay on a busy 2-core VM).
        """
        with self.calling():
            self._grow_to_last_page()

    def _grow_to_last_page(self) -> None:
        try:
            page_bytes = self._page_bytes
            last_pgno = self.env.info()["last_pgno"]
            if last_pgno > self._last_pgno_seen:
                self._last_pgno_seen = last_pgno
                self._check_readers_on_growth()
            needed = (last_pgno + 1) * page_bytes
            if self._file_bytes_seen >= needed:
                return
            self._file_bytes_seen = os.stat(self.data_file).st_size
            if self._file_bytes_seen >= needed:
                return
            txn = self.env.begin(write=True)  # LMDB's writer lock: no --workers sibling writes meanwhile
            try:
                needed = (self.env.info()["last_pgno"] + 1) * page_bytes
                grow_file(self.data_file, needed)
                self._file_bytes_seen = needed
            finally:
                txn.abort()
        except (OSError, lmdb.Error) as exc:  # the commit stands; the next open grows the file
            log.warning("could not grow %s to its last page after a commit: %s", self.data_file, exc)

    def _check_readers_on_growth(self) -> None:
        """The file grew: free dead readers' slots now, at most once every READER_CHECK_INTERVAL_SECONDS.

        A slot left by a process killed inside a read transaction pins its
        snapshot: every page written since is new, none freed is reused, so
        the file grows by all the pages the writes copy (under a steady churn
        of small writes here, ~50 MB a second: one such slot, kept until the
        next sweep, grew a 104 MB data.mdb to 2.8 GB), and LMDB never shrinks
        it. Growing is the sign; the check costs a look at the reader table.
        """
        now = time.monotonic()
        if now >= self._next_reader_check:
            self._next_reader_check = now + READER_CHECK_INTERVAL_SECONDS
            self.forget_dead_readers()

    def forget_dead_readers(self) -> None:
        """Free the LMDB reader slots of processes that died inside a read transaction.

        mdb_reader_check clears only slots whose process is gone; data.mdb is not touched.
        """
        with self._rw.shared():
            if not self._closed:
                try:
                    self.env.reader_check()
                except lmdb.Error as exc:
                    log.warning("could not check LMDB's reader table: %s", exc)

    def readers(self) -> str:
        """LMDB's reader table as mdb_reader_list prints it (a header, then pid, thread and txnid per slot)."""
        with self._rw.shared():
            return self.env.readers()

    def sizes(self) -> tuple[int, int]:
        with self._rw.shared():  # info() reads the map: not while it is resized
            info = self.env.info()
        return info["map_size"], (info["last_pgno"] + 1) * self._page_bytes

    def copy_to(self, dest: Path, txn: ReadTxn, *, rebuilt: bool = False) -> None:
        assert isinstance(txn, LmdbReadTxn)
        try:
            if rebuilt:
                rebuild(self.env, txn._txn, dest, max_dbs=_MAX_TABLES)
                return
            # Into a file made here, private (env.copy would make it 0666 less the umask), set as LMDB
            # sets its own copy's: not cached (O_DIRECT where the file system takes it), the source is.
            fd = os.open(dest / "data.mdb", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE_MODE)
            try:
                if hasattr(os, "O_DIRECT") and self._page_bytes >= os.sysconf("SC_PAGE_SIZE"):
                    with contextlib.suppress(OSError):
                        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_DIRECT)
                # compact: free pages are left out, so the copy is the size of the live data.
                self.env.copyfd(fd, compact=True, txn=txn._txn)
            finally:
                os.close(fd)
        except DAMAGE as exc:
            raise self.damaged(exc) from None
        except RebuildMismatch as exc:
            raise DataLoss(f"{exc}; `ckpt verify` tells what is damaged") from None
        except lmdb.Error as exc:
            # LMDB reports a write that failed (no space, a file size limit) and some page damage
            # alike, e.g. as EINVAL or MDB_INCOMPATIBLE.
            raise OSError(
                f"copying the store failed: {exc} (the copy could not be written, or the"
                " store is damaged: `ckpt verify` tells which)"
            ) from None

    def close(self) -> None:
        with self._rw.exclusive():
            self.env.close()
            self._closed = True


_T = TypeVar("_T")


def open_lmdb(
    lmdb_dir: Path,
    *,
    readonly: bool,
    map_size_bytes: int,
    max_map_size_bytes: int,
    max_readers: int,
    meta_sync: bool,
    prepare: Callable[[LmdbStorage], _T],
) -> tuple[LmdbStorage, _T]:
    """Open the environment in ``lmdb_dir`` and ``prepare(storage)`` it (open the tables, check the layout).

    The open is begun again on a fresh environment while LMDB refuses it with
    MDB_MAP_RESIZED (see :func:`.lmdb_open.retry_map_resized`): read-only beside a
    sidecar, or writable beside the other processes of ``--workers``. An error
    of LMDB's is DataLoss if the file is no LMDB database (or a damaged one),
    else StorageFailure; both name the file.
    """

    def once() -> tuple[LmdbStorage, _T]:
        storage = LmdbStorage(
            lmdb_dir,
            readonly=readonly,
            map_size_bytes=map_size_bytes,
            max_map_size_bytes=max_map_size_bytes,
            max_readers=max_readers,
            meta_sync=meta_sync,
        )
        try:
            return storage, prepare(storage)
        except BaseException:
            storage.env.close()
            raise

    try:
        opened = retry_map_resized(once)
    except lmdb.Error as exc:
        text = f"{lmdb_dir / 'data.mdb'} cannot be opened as an LMDB database: {exc}"
        raise (DataLoss(text) if isinstance(exc, _NOT_LMDB) else StorageFailure(text)) from None
    storage = opened[0]
    if not readonly and storage.over_cap:
        log.warning(
            "%s: the map cannot grow, so writes are refused once its free pages are used: raise"
            " max_map_size_bytes to at least the file's size",
            storage.cap_reached(),
        )
    return opened
