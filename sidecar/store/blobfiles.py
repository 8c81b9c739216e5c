"""Blob bytes as files: one file per blob under ``data_dir/blobs``, named by its SHA-256.

The seam between the blobs' metadata (LMDB, blobs.py) and where their bytes
live: a directory today, an object store later. Blobs may be gigabytes, so
they never pass through LMDB (whose pages would hold them twice over in a
copy-on-write commit) nor the link between the sidecar's processes:

    blobs/sha256/ab/ab01...ef   a blob's bytes (two hex digits fan the files out)
    blobs/tmp/<random>.part     a blob being written
    blobs/unchecked             a mark: some blob file may have no record (BlobFiles.mark_unchecked)

A writer streams into a temporary file, hashing as it goes (SHA-256, the
blob's name, and XXH3-128, the fast checksum its record keeps for a read to
check), flushes it, and the store moves it into place only inside the write
transaction that records it (blobs.py), after a flush of its directory: a
blob recorded is a blob on disk. A writer holds an flock on its temporary file while it writes, so a
temporary file that can be locked was abandoned (its writer died; the lock
goes with the process): :meth:`BlobFiles.remove_abandoned` removes those.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import xxhash

from ..errors import InvalidArgument, ResourceExhausted, StoreError, StoreFull, Unavailable
from ..ids import quoted
from ..storage import DISK_FULL_ERRNOS, PRIVATE_FILE_MODE, make_dirs, sync_dir

log = logging.getLogger("ckpt.store")

SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_TEMP = re.compile(r"[0-9a-f]{32}\.part")
#: How much of a blob's file one read takes, checking it.
_READ_BYTES = 1 << 20
#: A temporary file younger than this is never taken for abandoned: its writer may not have locked it yet.
_TEMP_GRACE_SECONDS = 60.0


def check_sha256(text: str, *, field: str = "sha256") -> str:
    """``text`` if it is a SHA-256 in 64 lowercase hex digits, else InvalidArgument naming ``field``."""
    if not isinstance(text, str) or SHA256_HEX.fullmatch(text) is None:
        shown = repr(text[:80]) if isinstance(text, str) else type(text).__name__
        raise InvalidArgument(f"{field} must be a SHA-256 in 64 lowercase hex digits, got {shown}")
    return text


#: Longest media type a blob takes (IANA's are far shorter): a GetBlob reply's first message counts on it.
MAX_MEDIA_TYPE_BYTES = 255


def check_media_type(media_type: str) -> str:
    """``media_type`` if it is at most MAX_MEDIA_TYPE_BYTES bytes of printable characters, else
    InvalidArgument naming it and the limit."""
    if (
        not isinstance(media_type, str)
        or len(media_type) > MAX_MEDIA_TYPE_BYTES
        or not media_type.isprintable()  # before encoding: a lone surrogate is not printable
        or len(media_type.encode()) > MAX_MEDIA_TYPE_BYTES
    ):
        shown = quoted(media_type) if isinstance(media_type, str) else type(media_type).__name__
        raise InvalidArgument(
            f"media_type {shown} must be at most {MAX_MEDIA_TYPE_BYTES} bytes of printable characters"
        )
    return media_type


class TempBlob:
    """A blob being written: its bytes go to a temporary file, hashed (SHA-256 and XXH3-128) and counted
    as they arrive."""

    def __init__(self, files: BlobFiles, max_bytes: int, limit_origin: str) -> None:
        self._files = files
        self._max_bytes = max_bytes
        self._limit_origin = limit_origin
        self.name = f"{secrets.token_hex(16)}.part"
        self.path = files.temp_dir / self.name
        self._fd = -1
        self._hash = hashlib.sha256()
        self._xxh3 = xxhash.xxh3_128()
        self.size_bytes = 0
        try:
            make_dirs(files.temp_dir, sync=files.sync)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE_MODE)
            fcntl.flock(self._fd, fcntl.LOCK_EX)  # "being written": see BlobFiles.remove_abandoned
        except OSError as exc:
            raise self._failed("create", exc) from exc

    def write(self, chunk: bytes | memoryview) -> None:
        """Append ``chunk``; ResourceExhausted (and nothing kept) once the blob would pass its limit."""
        if not isinstance(chunk, (bytes, bytearray, memoryview)):
            self.discard()
            raise InvalidArgument(f"a blob's chunks must be bytes, not {type(chunk).__name__}")
        view = memoryview(chunk)
        size = view.nbytes  # not len(): a memoryview's items may be wider than a byte
        if self.size_bytes + size > self._max_bytes:
            self.discard()
            raise ResourceExhausted(
                f"the blob is larger than max_blob_bytes ({self._max_bytes}{self._limit_origin}); nothing was stored"
            )
        if view.format != "B" or not view.c_contiguous:  # os.write counts bytes, and slices count items
            view = memoryview(view.tobytes())
        self._hash.update(view)
        self._xxh3.update(view)
        try:
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as exc:
            raise self._failed("write", exc) from exc
        self.size_bytes += size

    def finish(self, expected_sha256: str = "") -> str:
        """Flush the file to disk; the blob's SHA-256 (hex). The file stays locked until :meth:`close`.
        InvalidArgument, before any flush, if ``expected_sha256`` is given and the bytes hash otherwise."""
        sha256 = self._hash.hexdigest()
        if expected_sha256 and sha256 != expected_sha256:
            raise InvalidArgument(
                f"expected_sha256 is {expected_sha256} but the {self.size_bytes} bytes sent hash to {sha256};"
                " nothing was stored"
            )
        if self._files.sync:
            try:
                os.fsync(self._fd)
            except OSError as exc:
                raise self._failed("flush", exc) from exc
        return sha256

    @property
    def xxh3_128(self) -> bytes:
        """The XXH3-128 of the bytes written so far (16 bytes, xxhash's digest())."""
        return self._xxh3.digest()

    def close(self) -> None:
        """Let go of the file (it stays where it is: moved into place, or discarded, or abandoned)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def discard(self) -> None:
        """Remove the temporary file (if it is still there) and close it."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self.close()

    def _failed(self, doing: str, exc: OSError) -> StoreError:
        """The error for a system error ``exc`` on the temporary file (removed): StoreFull (counted) if the
        disk is full, else Unavailable; nothing was stored either way."""
        self.discard()
        where = f"{doing} the blob's temporary file {self.path} ({self.size_bytes} bytes written)"
        if exc.errno in DISK_FULL_ERRNOS:
            full = StoreFull(
                f"no space to write blob bytes under {self._files.root} (the disk is full: {os.strerror(exc.errno)}):"
                f" could not {where}; nothing was stored: free disk space, then send the blob again"
            )
            self._files.count_full(full)
            return full
        return Unavailable(f"could not {where}: {exc}; nothing was stored")


class BlobFiles:
    """The blobs directory of one data directory."""

    def __init__(self, root: Path, *, sync: bool = True, on_full: Callable[[StoreFull], object] | None = None) -> None:
        self.root = root
        self.temp_dir = root / "tmp"
        self._files = root / "sha256"
        self._unchecked = root / "unchecked"
        #: Held shared by each backup, from before its snapshot until its copies of the blob files are made,
        #: and exclusively by a removal of files (no_backup_running): a file a backup's snapshot records is
        #: never removed before the backup has copied it.
        self._backups = root / "backups.lock"
        #: Whether files and directories are flushed to disk (off only where durability is not wanted: tests).
        self.sync = sync
        self._on_full = on_full

    def count_full(self, error: StoreFull) -> None:
        """Count a blob refused for want of disk space among the store's full writes (and log it)."""
        if self._on_full is not None:
            self._on_full(error)

    def path(self, sha256: str) -> Path:
        return self._files / sha256[:2] / sha256

    @contextlib.contextmanager
    def backup_running(self) -> Iterator[None]:
        """Hold back the removal of blob files while a backup copies them (waits for one under way). A
        blobs directory the backup cannot write (another user's, read-only) is copied unheld, as before."""
        try:
            make_dirs(self.root, sync=self.sync)
            fd = os.open(self._backups, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE_MODE)
        except OSError as exc:
            log.warning(
                "could not hold back blob removals during the backup (%s): a blob deleted meanwhile may be left out",
                exc,
            )
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def no_backup_running(self) -> Iterator[bool]:
        """Whether blob files may be removed now (no backup holds them back); if so, no backup's snapshot
        begins until the block ends."""
        try:
            fd = os.open(self._backups, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE_MODE)
        except FileNotFoundError:  # no blobs directory: no file to remove either
            yield True
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)

    def new_temp(self, max_bytes: int, limit_origin: str = "") -> TempBlob:
        """A temporary file to stream a blob into (``limit_origin``: said after the limit in its error)."""
        return TempBlob(self, max_bytes, limit_origin)

    def place(self, temp_name: str, sha256: str) -> int:
        """Move the temporary file ``temp_name`` into place as blob ``sha256``, durably; its size.

        Called with the storage's write lock held (blobs.py), as :meth:`remove` is: a file is never
        removed between its move here and the commit of its record. FileNotFoundError if the
        temporary file is gone (its writer's process died, and it was taken for abandoned).
        """
        if _TEMP.fullmatch(temp_name) is None:
            raise InvalidArgument(f"temp_name {temp_name!r} is not a temporary blob file's name")
        check_sha256(sha256)
        final = self.path(sha256)
        source = self.temp_dir / temp_name
        size = source.stat().st_size
        make_dirs(final.parent, sync=self.sync)  # blobs/sha256/ab, and blobs/sha256 or blobs first
        os.replace(source, final)
        self._sync_dir(final.parent)
        return size

    def holds(self, sha256: str, size_bytes: int, xxh3_128: bytes) -> bool:
        """Whether blob ``sha256``'s file holds its bytes: ``size_bytes`` of them, hashing to ``xxh3_128`` (its
        record's checksum), or to ``sha256`` for a record that keeps none. Reads the file whole."""
        digest = xxhash.xxh3_128() if xxh3_128 else hashlib.sha256()
        size = 0
        try:
            with self.open(sha256) as f:
                while chunk := f.read(_READ_BYTES):
                    digest.update(chunk)
                    size += len(chunk)
        except FileNotFoundError:
            return False
        if size != size_bytes:
            return False
        return digest.digest() == xxh3_128 if xxh3_128 else digest.hexdigest() == sha256

    def remove(self, sha256: str) -> bool:
        """Remove blob ``sha256``'s file: whether it was there."""
        try:
            self.path(check_sha256(sha256)).unlink()
        except FileNotFoundError:
            return False
        return True

    def open(self, sha256: str) -> BinaryIO:
        """Blob ``sha256``'s file, open for reading (FileNotFoundError if there is none)."""
        return open(self.path(check_sha256(sha256)), "rb")  # the caller closes it

    def hashes(self) -> Iterator[str]:
        """The SHA-256 of every blob file, in no order (names that are not one are left alone)."""
        if not self._files.is_dir():
            return
        for fan in os.scandir(self._files):
            if not fan.is_dir(follow_symlinks=False):
                continue
            for entry in os.scandir(fan.path):
                if SHA256_HEX.fullmatch(entry.name) and entry.name[:2] == fan.name:
                    yield entry.name

    def remove_abandoned(self) -> int:
        """Remove temporary files no writer holds (their writer died); how many."""
        if not self.temp_dir.is_dir():
            return 0
        removed = 0
        now = time.time()
        for entry in os.scandir(self.temp_dir):
            if _TEMP.fullmatch(entry.name) is None:
                continue
            try:
                fd = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue  # moved into place meanwhile
            try:
                if now - os.fstat(fd).st_mtime < _TEMP_GRACE_SECONDS:
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # its writer is alive
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                    removed += 1
            finally:
                os.close(fd)
        return removed

    def mark_unchecked(self) -> bool:
        """Leave a mark that a blob file may have no record, for whichever process sweeps (with ckpt serve
        --workers, worker 0's store process, not necessarily this one); whether it was left."""
        try:
            make_dirs(self.root, sync=self.sync)
            self._unchecked.touch(mode=PRIVATE_FILE_MODE)
        except OSError:
            return False
        return True

    def take_unchecked_mark(self) -> bool:
        """Remove the mark :meth:`mark_unchecked` leaves: whether there was one."""
        try:
            self._unchecked.unlink()
        except FileNotFoundError:
            return False
        return True

    def _sync_dir(self, path: Path) -> None:
        if self.sync:
            sync_dir(path)
