"""Putting another data.mdb in place of an LMDB environment's own, with no process holding it open.

LMDB's lock file (lock.mdb) says, besides its reader table, which transaction is the newest: a reader
takes the meta page that transaction's parity names. It is set from the data file's meta pages by the
first process to open the environment, the one that finds itself alone (LMDB takes a write lock on the
lock file's first byte, and every process with the environment open holds a read lock on it). A data file
put in place of another must not be read under the old file's lock: the new file's meta pages are numbered
by its own transactions (a rebuilt file's older one holds the rebuild short of its last commit; LMDB's
compacted copy's, an empty database), so the old newest transaction's parity may name the older one.

:func:`held_alone` takes that byte's write lock itself (Unavailable if another process has the environment
open), so that no process opens it meanwhile: one that tries waits. :func:`replace_data_file` renames the
new file over data.mdb and, still alone, opens the environment once, so that LMDB sets the lock file from
the new file before anyone waiting reads it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import lmdb

from ..errors import Unavailable
from .files import PRIVATE_FILE_MODE, sync_dir
from .lmdb_open import open_unlocked


@contextlib.contextmanager
def held_alone(lmdb_dir: Path, *, why: str) -> Iterator[None]:
    """Hold LMDB's exclusive lock on the environment in ``lmdb_dir`` (``why``: what Unavailable says is
    refused when another process has it open). Leaving releases it, and every lock this process holds on
    the lock file (POSIX record locks are the process's: an environment this process opened and closed
    meanwhile released it already)."""
    fd = os.open(lmdb_dir / "lock.mdb", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE_MODE)
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0, os.SEEK_SET)
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EAGAIN):
                raise
            raise Unavailable(
                f"the store in {lmdb_dir.parent} is open in another process (ckpt verify, inspect, stats or"
                f" backup, or a store read in place): {why}"
            ) from None
        # Record locks are the process's own: the lock byte says nothing of an environment open in this one.
        open_unlocked(lmdb_dir).close()
        yield
    finally:
        os.close(fd)


def replace_data_file(lmdb_dir: Path, new_file: Path) -> None:
    """Rename ``new_file`` (a whole, flushed LMDB data file on the same file system) over ``lmdb_dir``'s
    data.mdb, durably, and have LMDB set its lock file from it. Call it inside :func:`held_alone`."""
    os.replace(new_file, lmdb_dir / "data.mdb")
    sync_dir(lmdb_dir)
    sync_dir(new_file.parent)
    # Alone (this process holds the lock byte), so LMDB resets the lock file from the meta pages it reads.
    lmdb.open(str(lmdb_dir), readonly=True, max_dbs=0).close()
