"""Backups: a consistent, compacted copy of a data directory, made beside a running sidecar.

A backup is itself a data directory: ``ckpt serve --data-dir BACKUP`` serves
it and ``ckpt verify --data-dir BACKUP`` checks it. It holds the store as of
one LMDB read snapshot, so every write acknowledged before the backup began
and no part of any later one: the request-id records and indexes match the
frames as they did in the store.

Copying data.mdb with ``cp`` beside a running sidecar can tear it (a commit
landing mid-copy leaves pages of two versions of the B-tree). LMDB's own copy
reads one snapshot instead, and leaves out free pages.

The copy is written under a hidden name beside the destination, flushed to
disk (the file and both directories), and only then renamed to it: the
destination either does not exist or holds a whole backup.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .store import Store

#: Makes the copy: LMDB's environment into the given (empty) lmdb directory; the snapshot's (sessions, versions).
Copier = Callable[[Path], "tuple[int, int]"]


@dataclass(frozen=True, slots=True)
class BackupResult:
    """Where the backup is and what it holds."""

    path: Path
    sessions: int
    versions: int
    data_mdb_bytes: int


def backup(store: Store, dest: os.PathLike[str] | str) -> BackupResult:
    """Back ``store`` up into the new data directory ``dest`` (its parent must exist; ``dest`` must not)."""
    return write_backup(Path(dest), store.copy_to)


def write_backup(dest: Path, copy: Copier) -> BackupResult:
    """Create the data directory ``dest`` holding what ``copy`` writes, durably and all at once."""
    if dest.exists() or dest.is_symlink():
        raise FileExistsError(errno.EEXIST, "the backup destination already exists", str(dest))
    parent = dest.parent
    if not parent.is_dir():
        raise FileNotFoundError(errno.ENOENT, "the backup destination's parent directory does not exist", str(parent))
    # Not mkdtemp: a plain mkdir gives the mode a data directory the sidecar creates gets (the umask's).
    partial = parent / f".{dest.name}.partial-{os.getpid()}-{secrets.token_hex(4)}"
    partial.mkdir()
    try:
        lmdb_dir = partial / "lmdb"
        lmdb_dir.mkdir()
        sessions, versions = copy(lmdb_dir)
        data_mdb = lmdb_dir / "data.mdb"
        _fsync(data_mdb)
        _fsync(lmdb_dir)
        _fsync(partial)
        if dest.exists() or dest.is_symlink():  # made while the copy ran: never replace it
            raise FileExistsError(errno.EEXIST, "the backup destination appeared while the copy ran", str(dest))
        partial.rename(dest)
        _fsync(parent)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return BackupResult(dest, sessions, versions, (dest / "lmdb" / "data.mdb").stat().st_size)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
