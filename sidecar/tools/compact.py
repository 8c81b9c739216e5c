"""Compaction: a data directory's data.mdb written again in full pages, without its free pages. Offline.

LMDB's file never shrinks. Pages that deletes and retention free are reused by later writes, never given
back; and a page split by a write landing among other sessions' keys is left half full until writes fill
it again: many sessions written at once leave the frames table about 55% full (bench/HISTORY.md, "Disk use
and map growth"). LMDB's own compacted copy, the one a backup makes, leaves the free pages out but copies
each page as it is. :func:`compact` writes every table again in key order instead (storage/lmdb_rebuild.py:
full pages, no free ones) into a copy beside the store (made as a backup is, hidden until whole and
flushed: tools/backup.py), checks that it holds the sessions and versions the store does, and renames it
over data.mdb. Killed at any point, the directory holds the old file or the new one, whole;
a copy left behind is removed by the next compaction.

Nothing else may have the store open: the data directory's lock (which a running sidecar or writable
embedded store holds) is held throughout, and LMDB's own lock says whether another process has the
environment open (storage/lmdb_replace.py): the compaction refuses then, before copying, and again before
the rename if one opened it while the copy was made, having changed nothing. Blob files are not touched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..config import StoreConfig
from ..errors import DataLoss
from ..storage import check_holds_a_store
from ..storage.lmdb_replace import held_alone, replace_data_file
from ..store import Store, count_sessions, lock_data_dir
from .backup import write_backup

#: Makes the compacted copy of the data directory's store into the given (empty) lmdb directory; the
#: snapshot's (sessions, versions).
Copier = Callable[[Path], "tuple[int, int]"]
#: What the data directory given holds: (sessions, versions).
Counter = Callable[[Path], "tuple[int, int]"]

#: The copy's data directory, inside the store's (so on its file system: the rename is atomic).
COPY_DIR_NAME = ".compacted"
_NOTHING_CHANGED = "stop it, then compact again; nothing was changed"


@dataclass(frozen=True, slots=True)
class CompactResult:
    """What the store holds and data.mdb's size before and after."""

    sessions: int
    versions: int
    data_mdb_bytes_before: int
    data_mdb_bytes_after: int


def held_counts(store: Store) -> tuple[int, int]:
    """The sessions and versions ``store`` holds, as a backup's copy counts them (one read snapshot)."""
    with store.read() as txn:
        return count_sessions(txn, store.tables), txn.count(store.tables.frames)


def _read_here(data_dir: Path) -> Store:
    return Store(StoreConfig(data_dir=data_dir), readonly=True)


def compact(
    data_dir: os.PathLike[str] | str, *, copy: Copier | None = None, count: Counter | None = None
) -> CompactResult:
    """Compact the store in ``data_dir`` (no process may have it open). ``copy`` makes the compacted copy
    from one read snapshot and ``count`` reads what a data directory holds (run on the copy, to check it);
    by default both open the store read-only in this process (`ckpt compact` runs them in a child, which a
    damaged page may kill)."""
    data_dir = Path(data_dir)
    if copy is None:

        def copy(lmdb_dir: Path) -> tuple[int, int]:
            with _read_here(data_dir) as store:
                return store.copy_to(lmdb_dir, rebuilt=True)

    if count is None:

        def count(directory: Path) -> tuple[int, int]:
            with _read_here(directory) as store:
                return held_counts(store)

    lmdb_dir = data_dir / "lmdb"
    data_mdb = lmdb_dir / "data.mdb"
    check_holds_a_store(data_dir, data_mdb)
    lock = lock_data_dir(data_dir, holder=f"ckpt compact (pid {os.getpid()})")
    try:
        copy_dir = data_dir / COPY_DIR_NAME
        shutil.rmtree(copy_dir, ignore_errors=True)  # left by a compaction killed after its copy was made
        with held_alone(lmdb_dir, why=_NOTHING_CHANGED):
            pass  # refused before copying anything
        before = data_mdb.stat().st_size
        try:
            made = write_backup(copy_dir, copy)
            found = count(copy_dir)
            if found != (made.sessions, made.versions):
                raise DataLoss(
                    f"the compacted copy of {data_dir} holds {found[0]} sessions and {found[1]} versions where the"
                    f" store holds {made.sessions} and {made.versions}; nothing was changed"
                )
            opened_meanwhile = f"it was opened while the copy was made; {_NOTHING_CHANGED}"
            with held_alone(lmdb_dir, why=opened_meanwhile), _signals_held():
                replace_data_file(lmdb_dir, copy_dir / "lmdb" / "data.mdb")
        finally:
            shutil.rmtree(copy_dir, ignore_errors=True)
        return CompactResult(made.sessions, made.versions, before, data_mdb.stat().st_size)
    finally:
        lock.close()


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP held back (on this thread) until the new file is in place and LMDB's lock
    file set from it: stopped between the two, the lock file would still describe the old file."""
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
