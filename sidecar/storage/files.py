"""What the LMDB storage does to its files besides LMDB's own work: growing them, and telling a full disk."""

from __future__ import annotations

import errno
import os
import resource
from pathlib import Path

from ..errors import NotFound, Unavailable

# What a commit's page writes fail with when the file cannot grow: no space,
# a quota, or a file size limit (RLIMIT_FSIZE; Python ignores SIGXFSZ).
#: What a write fails with when the disk (a quota, the file size limit) is full.
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
#: The mode of each directory ckpt makes for a store or a backup, and of each file it writes there: a store
#: holds every agent's states, events and artifacts, so only the user running ckpt may read it (the umask may
#: narrow these further). Directories that already exist, and files an older build wrote, keep their modes.
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
# Below this much free space, a commit failing with EIO is taken for a full disk.
_LOW_FREE_BYTES = 16 * 1024 * 1024


def disk_full_reason(text: str, data_file: Path, needed_bytes: int) -> str | None:
    """Why a commit that failed with the system error ``text`` could not write, if the disk (or a limit)
    is full; None for any other failure.

    py-lmdb's message for a system error ends in the C library's strerror
    text. LMDB reports a short page write as EIO, which is how a disk that
    fills mid-write usually shows; so for EIO the file size limit and the
    free space decide.
    """
    for code in DISK_FULL_ERRNOS:
        if text.endswith(os.strerror(code)):
            return f"the disk is full: {os.strerror(code)}"
    if not text.endswith(os.strerror(errno.EIO)):
        return None
    try:
        size = data_file.stat().st_size
        fs = os.statvfs(data_file.parent)
    except OSError:
        return None
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY and size + needed_bytes > limit:
        return f"the data file is {size} bytes, at this process's file size limit (RLIMIT_FSIZE {limit})"
    free = (fs.f_bfree if os.geteuid() == 0 else fs.f_bavail) * fs.f_frsize
    if free < max(_LOW_FREE_BYTES, 2 * needed_bytes):
        return f"the disk is full: {free} bytes free"
    return None


def grow_file(path: Path, size_bytes: int) -> None:
    """Grow ``path`` to ``size_bytes`` with zeros (never shrink it: checked on the open file), synced."""
    with path.open("r+b") as f:
        if os.fstat(f.fileno()).st_size < size_bytes:
            f.truncate(size_bytes)
            os.fsync(f.fileno())


def sync_dir(path: Path) -> None:
    """Flush a directory's entries (a file or directory made, renamed or removed in it) to disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as exc:  # some file systems cannot flush a directory; their entries are then as durable as can be
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def make_dirs(path: Path, *, sync: bool = True) -> None:
    """``mkdir -p path``, each directory made private (PRIVATE_DIR_MODE; one that exists keeps its mode) and
    flushed into its parent (``sync``): a power cut must not undo a directory that files acknowledged as
    durable live in (POSIX makes a new entry durable only once its directory is flushed)."""
    missing: list[Path] = []
    while not path.is_dir():
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    for made in reversed(missing):
        try:
            made.mkdir(mode=PRIVATE_DIR_MODE)
        except FileExistsError:
            if not made.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(made)) from None
            continue  # made meanwhile, by another process, which flushes it
        if sync:
            sync_dir(made.parent)


def in_use_in_this_process(data_dir: os.PathLike[str]) -> Unavailable:
    return Unavailable(f"data directory {data_dir} is in use by another Store in this process (close it first)")


def holds_nothing(data_mdb: Path) -> bool:
    """Whether LMDB's data file is missing or empty: a new store.

    LMDB writes a new file's two meta pages before anything can be committed, so an empty one (a first
    start killed before that write) lost nothing: a writable open makes it a new store. LMDB refuses to
    open it read-only (EBADF), so read-only opens check first (:func:`check_holds_a_store`).
    """
    return not data_mdb.is_file() or data_mdb.stat().st_size == 0


def check_holds_a_store(data_dir: Path, data_mdb: Path) -> None:
    """NotFound, for a read-only open, if ``data_mdb`` is missing or empty (:func:`holds_nothing`)."""
    if not data_mdb.is_file():
        raise NotFound(f"no ckpt store in {data_dir} (missing {data_mdb})")
    if data_mdb.stat().st_size == 0:
        raise NotFound(
            f"the ckpt store in {data_dir} holds nothing yet ({data_mdb} is empty: its first start stopped"
            " before anything was written)"
        )
