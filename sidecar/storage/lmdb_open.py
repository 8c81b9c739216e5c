"""The checks made on an LMDB directory before the store opens its environment (see lmdb_storage.py)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import lmdb

from ..errors import DataLoss, Unavailable
from .files import grow_file, holds_nothing, in_use_in_this_process
from .free_pages import unwritten_tail_bytes

_T = TypeVar("_T")

# The LMDB directories (resolved) whose environment this process inherited across fork() while in use,
# and so keeps (LmdbStorage.let_go_in_child): py-lmdb refuses to open them again here.
KEPT_ACROSS_FORK: set[str] = set()

# Opens retried when MDB_MAP_RESIZED (see retry_map_resized); each retry maps
# the size the file has by then, so more than a couple are never expected.
_MAP_RESIZED_OPEN_ATTEMPTS = 50


def retry_map_resized(open_env: Callable[[], _T]) -> _T:
    """``open_env()``, again while it fails with MDB_MAP_RESIZED.

    An open beside another process writing the store (a read-only one beside
    a running sidecar, a worker's beside the other workers') maps the file at
    the size its meta page gives; py-lmdb then begins a transaction (in
    lmdb.open and in open_db). Should the other process grow the map and
    write past the old end in between, LMDB refuses that transaction
    (MDB_MAP_RESIZED) although nothing is wrong: opening again maps the new
    size. ``open_env`` must close what it opened before raising, and what it
    committed (tables made) is found committed by the next attempt.
    """
    for attempt in range(1, _MAP_RESIZED_OPEN_ATTEMPTS + 1):
        try:
            return open_env()
        except lmdb.MapResizedError:
            if attempt == _MAP_RESIZED_OPEN_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


def open_unlocked(lmdb_dir: Path) -> lmdb.Environment:
    """The environment in ``lmdb_dir``, read-only and without LMDB's lock file (for a look at its meta
    pages): Unavailable if this process has it open (py-lmdb allows one environment per file and process),
    DataLoss if it is no LMDB database."""
    try:
        return retry_map_resized(lambda: lmdb.open(str(lmdb_dir), readonly=True, lock=False, max_dbs=0))
    except lmdb.Error as exc:
        if "already open in this process" in str(exc):
            if os.path.realpath(lmdb_dir) in KEPT_ACROSS_FORK:
                raise Unavailable(
                    f"data directory {lmdb_dir.parent} cannot be opened in this process: it was forked"
                    " while a Store of its parent was reading or writing there, and LMDB forbids letting go"
                    " of an environment inherited across fork() then; fork while no Store is open, or start"
                    " processes with the 'spawn' or 'forkserver' method"
                ) from None
            raise in_use_in_this_process(lmdb_dir.parent) from None
        raise DataLoss(f"{lmdb_dir / 'data.mdb'} cannot be opened as an LMDB database: {exc}") from None


def check_not_truncated(data_mdb: Path, *, extend: bool) -> None:
    """DataLoss if data.mdb lacks a page its newest meta page's database uses.

    LMDB maps the file: reading a page past its end kills the process with
    SIGBUS, so a truncated file (a partial copy or restore) must be caught
    before anything reads the B-trees. A file may also end before its last
    page with nothing lost: LMDB never writes pages a transaction allocated
    and freed again, and a power cut (or SIGKILL) after such a commit, before
    :meth:`.LmdbStorage.committed` grew the file, leaves it short. Those pages
    are on LMDB's free list, so when the file is short the list is read from
    the file with plain reads (:mod:`.free_pages`): if every page past the
    end is on it, the store opens (with ``extend``, the writer holding the
    directory, after growing the file to its last page with zeros, synced);
    if any is not, or the list cannot be read, DataLoss.
    """
    if holds_nothing(data_mdb):
        return  # a new store (an empty file too: files.holds_nothing), or read-only, refused by the caller
    env = open_unlocked(data_mdb.parent)
    try:
        needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    finally:
        env.close()
    # The meta pages are read before the size: a writer beside us writes a commit's pages before its meta page.
    if data_mdb.stat().st_size >= needed:
        return
    needed = unwritten_tail_bytes(data_mdb)
    if extend:
        grow_file(data_mdb, needed)
