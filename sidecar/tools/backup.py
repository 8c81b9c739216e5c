"""Backups: a consistent, compacted copy of a data directory, made beside a running sidecar.

A backup is itself a data directory: ``ckpt serve --data-dir BACKUP`` serves
it and ``ckpt verify --data-dir BACKUP`` checks it. It holds the store as of
one LMDB read snapshot, so every write acknowledged before the backup began
and no part of any later one: the request-id records and indexes match the
frames as they did in the store.

Copying data.mdb with ``cp`` beside a running sidecar can tear it (a commit
landing mid-copy leaves pages of two versions of the B-tree). LMDB's own copy
reads one snapshot instead, and leaves out free pages.

Blobs' files (data_dir/blobs) are copied after the snapshot, each one it
records: files never change once in place, so each copy is the blob's bytes.
No blob file is removed meanwhile (BlobFiles.backup_running, held from before
the snapshot). A file found missing is looked up again (tools/blobcheck.py):
a blob no longer recorded was released after the snapshot (possible only for a
backup that could not hold removals back), and is missing from the backup, and
logged (``ckpt verify`` of the backup names it); one stored anew since is
copied from its new file; one whose record still stands without its file is
damage, and fails the backup.

The copy is written under a hidden name beside the destination, flushed to
disk (the file and both directories), and only then renamed to it: the
destination either does not exist or holds a whole backup. A copy that
fails is removed; one whose process was killed outright (SIGKILL, power
loss) is removed by the next backup to the same destination, which tells it
from a copy still being written by the lock that copy's writer holds.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataLoss
from ..storage import PRIVATE_DIR_MODE, PRIVATE_FILE_MODE, make_dirs
from ..store import Store
from ..store.blobfiles import BlobFiles
from .blobcheck import blob_lookup, confirmed

log = logging.getLogger("ckpt")

#: Makes the copy: LMDB's environment into the given (empty) lmdb directory; the snapshot's (sessions, versions).
Copier = Callable[[Path], "tuple[int, int]"]
# How much of a blob's file a copy reads and writes at a time.
_COPY_CHUNK_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class BackupResult:
    """Where the backup is and what it holds."""

    path: Path
    sessions: int
    versions: int
    data_mdb_bytes: int


def backup(store: Store, dest: os.PathLike[str] | str) -> BackupResult:
    """Back ``store`` up into the new data directory ``dest`` (its parent must exist; ``dest`` must not)."""
    return write_backup(Path(dest), lambda lmdb_dir: copy_with_blobs(store, lmdb_dir))


def copy_with_blobs(store: Store, lmdb_dir: Path) -> tuple[int, int]:
    """:meth:`Store.copy_to` into ``lmdb_dir``, then the files of the blobs it records into the blobs
    directory beside it, each flushed to disk; the snapshot's (sessions, versions)."""
    with store.blob_files.backup_running():
        return _copy_with_blobs(store, lmdb_dir)


def _copy_with_blobs(store: Store, lmdb_dir: Path) -> tuple[int, int]:
    shas: list[str] = []
    counts = store.copy_to(lmdb_dir, blobs=shas)
    source, target = store.blob_files, BlobFiles(lmdb_dir.parent / "blobs")
    synced: set[Path] = set()

    def copy(sha256: str, size: int = 0) -> str | None:
        """Copy blob ``sha256``'s file; what is wrong if it cannot be (a :data:`blobcheck.FileCheck`)."""
        dest = target.path(sha256)
        make_dirs(dest.parent, sync=False)  # flushed below, with the files in them
        try:
            _copy_file(source.path(sha256), dest)
        except FileNotFoundError:
            return f"its file {source.path(sha256)} is missing"
        _fsync(dest)
        synced.add(dest.parent)
        return None

    missing: dict[str, tuple[str, int | None]] = {
        sha256: (problem, None) for sha256 in shas if (problem := copy(sha256)) is not None
    }
    # Looked up again: released since the snapshot (not reported), stored anew (copied again), or damage.
    damaged = confirmed(missing, copy, lambda shas: blob_lookup(store, shas)) if missing else {}
    if damaged:
        named = "; ".join(f"blob {sha256}: {problem}" for sha256, problem in sorted(damaged.items())[:10])
        more = f"; and {len(damaged) - 10} more blobs" if len(damaged) > 10 else ""
        stand = "their records stand" if len(damaged) > 1 else "its record stands"
        raise DataLoss(
            f"the store is damaged: {named}{more}, though {stand};"
            " no backup was written (`ckpt verify` names every problem)"
        )
    for directory in (*synced, *{d.parent for d in synced}, target.root):
        if directory.is_dir():
            _fsync(directory)
    released = [sha256 for sha256 in missing if not target.path(sha256).is_file()]
    if released:
        log.warning(
            "%d blobs were removed after the backup's snapshot and before their copy (their sessions deleted"
            " meanwhile): the backup records them without their bytes: %s",
            len(released),
            ", ".join(released[:10]),
        )
    return counts


def write_backup(dest: Path, copy: Copier) -> BackupResult:
    """Create the data directory ``dest`` holding what ``copy`` writes, durably and all at once."""
    if dest.exists() or dest.is_symlink():
        raise FileExistsError(errno.EEXIST, "the backup destination already exists", str(dest))
    parent = dest.parent
    if not parent.is_dir():
        raise FileNotFoundError(errno.ENOENT, "the backup destination's parent directory does not exist", str(parent))
    stem = _stem(dest.name)
    _remove_abandoned_copies(parent, stem)
    # Private, as a data directory the sidecar creates; the copy inside is hidden until renamed.
    partial = parent / f".{stem}.partial-{os.getpid()}-{secrets.token_hex(4)}"
    # mkdir inside the try: a SIGTERM (ckpt backup raises SystemExit for it) landing between the
    # mkdir and the try left the empty partial behind (seen once in CI).
    try:
        try:
            partial.mkdir(mode=PRIVATE_DIR_MODE)
        except OSError as exc:  # named after the destination: the hidden name means nothing to its reader
            raise type(exc)(exc.errno, f"cannot write a backup in {parent} ({exc.strerror})", str(dest)) from None
        held = os.open(partial, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(held, fcntl.LOCK_EX)  # "being written": see _remove_abandoned_copies
            lmdb_dir = partial / "lmdb"
            lmdb_dir.mkdir(mode=PRIVATE_DIR_MODE)
            sessions, versions = copy(lmdb_dir)
            data_mdb = lmdb_dir / "data.mdb"
            _fsync(data_mdb)
            _fsync(lmdb_dir)
            _fsync(partial)
            if dest.exists() or dest.is_symlink():  # made while the copy ran: never replace it
                raise FileExistsError(errno.EEXIST, "the backup destination appeared while the copy ran", str(dest))
            partial.rename(dest)
            _fsync(parent)
        finally:
            os.close(held)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)  # nothing, once renamed: dest is a whole backup
        raise
    return BackupResult(dest, sessions, versions, (dest / "lmdb" / "data.mdb").stat().st_size)


# Room for the rest of a partial copy's name (".", ".partial-", a pid, "-", 8 hex digits) within
# the 255 bytes a file name may have: a long destination name is shortened in it.
_STEM_BYTES = 255 - 40
_PARTIAL = re.compile(r"\.(?P<stem>.*)\.partial-\d+-[0-9a-f]{8}", re.DOTALL)


def _stem(name: str) -> str:
    return name.encode("utf-8", "surrogateescape")[:_STEM_BYTES].decode("utf-8", "ignore")


def _remove_abandoned_copies(parent: Path, stem: str) -> None:
    """Remove partial copies for this destination that no process is writing (their writer was killed).

    A writer holds an flock on its partial directory until it is done (the
    lock goes with the process, in any PID namespace sharing the file
    system), so one that can be locked here is abandoned.
    """
    for entry in parent.iterdir():
        found = _PARTIAL.fullmatch(entry.name)
        if found is None or found["stem"] != stem or entry.is_symlink() or not entry.is_dir():
            continue
        with contextlib.suppress(OSError):
            fd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # another backup is writing it
            else:
                shutil.rmtree(entry, ignore_errors=True)
            finally:
                os.close(fd)


def _copy_file(source: Path, dest: Path) -> None:
    """Copy ``source`` to a new private file ``dest`` (FileNotFoundError, and no ``dest``, if it is gone)."""
    with open(source, "rb") as src:
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, PRIVATE_FILE_MODE)
        with open(fd, "wb") as out:
            shutil.copyfileobj(src, out, _COPY_CHUNK_BYTES)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
