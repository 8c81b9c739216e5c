"""Blobs' metadata: which blobs exist, which sessions reference them, and when their files go.

Tables (keys.py lists them all):

    blobs       sha256 (32 bytes)        -> BlobRecord (size, media type, created, references, XXH3-128)
    blob_refs   session \\0 sha256        -> BlobRefRecord (when the reference was made)

A blob's bytes are a file (blobfiles.py). Its record commits in the same
transaction that moves its file into place, so a blob recorded is on disk. A
blob is kept once however many sessions store it (its reference count); when
the last reference goes (DeleteSession, or retention once no version kept
names the blob's uri: :meth:`Blobs.release_unnamed`, for each session a
sweep's pruning marked), its record goes in that transaction and its file only
after the commit, in a write transaction of its own that finds no record
again. Moves and removals of files both happen under the storage's write
lock, so a PutBlob of the same bytes racing a removal, in this process or
another worker's, either sees the record (and keeps the file) or moves its
own file in after the removal: an acknowledged blob is never lost. A record
whose transaction fails after its file was moved in (a full store) removes
that file at once unless a record names it (:meth:`Blobs.drop_unrecorded`).
A crash between a move and its commit, or between a commit and a removal,
or a removal that failed, leaves a file without a record, which a sweep
removes (:meth:`Blobs.sweep_files`): the first after opening, or the next
after a mark left in the blobs directory (BlobFiles.mark_unchecked), which
the sweeping process sees whichever process (ckpt serve --workers) left it.
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass

from ckpt.store.v1 import records_pb2

from ...codec import DecodeError, FrameKind, frame_kind, iter_versions
from ..errors import DataLoss, NotFound, Unavailable
from ..storage import ReadTxn, Storage, Table, WriteTxn
from . import keys
from .blobfiles import BlobFiles, check_sha256
from .layout import Tables, write_time
from .ops import Batch, Op
from .prefixes import is_prefix
from .records import frame_of, meta_of, printable, record

log = logging.getLogger("ckpt.store")

#: A blob's uri in an ArtifactRef, and the bytes a state names it by (the prefix, then 64 hex digits).
URI_PREFIX = "ckpt-blob:sha256:"
# Blob files checked per write transaction when files without a record are looked for.
_FILES_CHUNK = 1000
# Sessions read, and references dropped per write transaction, when those of sessions without a checkpoint are swept.
_SWEEP_CHUNK = 1000
# Past every key of a session's references (its id, SEP, a hash) and before the next session's id: a session id
# holds no control character.
_PAST_SESSION = b"\x01"


def blob_uri(sha256: str) -> str:
    return URI_PREFIX + sha256


@dataclass(frozen=True, slots=True)
class BlobInfo:
    """A stored blob: its SHA-256 (hex), size, media type, when it was first stored, its references, and
    the XXH3-128 of its bytes (16 bytes; empty if its record was written before it was kept)."""

    sha256: str
    size_bytes: int
    media_type: str
    created_unix_nanos: int
    ref_count: int
    xxh3_128: bytes = b""

    @property
    def uri(self) -> str:
        return blob_uri(self.sha256)


def _info(sha256: str, raw: bytes) -> BlobInfo:
    try:
        rec = records_pb2.BlobRecord.FromString(raw)
    except Exception:
        raise DataLoss(f"blob {sha256}: its record does not parse") from None
    return BlobInfo(sha256, rec.size_bytes, rec.media_type, rec.created_unix_nanos, rec.ref_count, rec.xxh3_128)


def ref_key(sid: bytes, sha: bytes) -> bytes:
    return sid + keys.SEP + sha


@dataclass(frozen=True, slots=True)
class Release:
    """A session's references retention may drop, and the session as read: its release is applied only to
    the same session (its creation time) at the same versions."""

    created: int
    first_version: int
    head: int
    #: When the oldest version kept was written: a reference made since (stored again) is kept.
    oldest: int
    shas: list[bytes]


class Blobs:
    """The blob tables' reads and write ops, and the removal of files nothing references."""

    def __init__(
        self,
        tables: Tables,
        storage: Storage,
        files: BlobFiles,
        read: Callable[[], AbstractContextManager[ReadTxn]],
        submit: Callable[[Op], Op],
    ) -> None:
        self._tables = tables
        self._storage = storage
        self.files = files
        self._read = read
        self._submit = submit
        #: Whether files may be left without a record (a crash, or a failed removal): the next sweep looks.
        #: Set at opening; later set in the blobs directory too (mark_unchecked), for another process's sweep.
        self.files_unchecked = True

    def mark_unchecked(self) -> None:
        """A file may be left without a record: the next sweep looks, this process's or the one that sweeps."""
        self.files_unchecked = True
        if not self.files.mark_unchecked():
            log.warning(
                "could not mark the blob files unchecked under %s: a sweep after a restart looks", self.files.root
            )

    # -- reads -------------------------------------------------------------------

    def info(self, sha256: str) -> BlobInfo:
        """Blob ``sha256``'s record; NotFound if it was never stored, or was removed."""
        sha = bytes.fromhex(check_sha256(sha256))
        if self._tables.blobs is None:
            raise NotFound(f"blob {sha256} does not exist")
        with self._read() as txn:
            raw = txn.get(sha, db=self._tables.blobs)
        if raw is None:
            raise NotFound(f"blob {sha256} does not exist (never stored, or no session references it any more)")
        return _info(sha256, raw)

    def session_refs(self, session_id: str) -> list[str]:
        """The SHA-256 of every blob ``session_id`` references."""
        sid = keys.session_key(session_id)
        if self._tables.blob_refs is None:
            return []
        with self._read() as txn:
            return [sha.hex() for sha, _ in _refs(txn, self._tables, sid)]

    def all_blobs(self, txn: ReadTxn) -> Iterator[BlobInfo]:
        """Every blob's record in ``txn``'s snapshot (for verify)."""
        if self._tables.blobs is None:
            return
        for sha, raw in txn.scan(self._tables.blobs):
            yield _info(sha.hex(), raw)

    # -- writes --------------------------------------------------------------------

    def file_damaged(self, sha256: str) -> bool:
        """Whether blob ``sha256`` is recorded and its file does not hold its bytes (missing, cut, or other
        bytes: what ``ckpt verify`` names). Reads the file whole: called before a write of the same bytes is
        submitted, not under the write lock."""
        try:
            info = self.info(sha256)
        except NotFound:
            return False
        if self.files.holds(sha256, info.size_bytes, info.xxh3_128):
            return False
        log.warning("blob %s: its file does not hold its bytes; the bytes sent again replace it", sha256)
        return True

    def record_op(self, commit: records_pb2.BlobCommit, *, replace_file: bool = False) -> Op:
        """The op recording a blob the caller wrote to a temporary file (``commit.temp_name``) and the
        session's reference to it; the blob's BlobInfo. ``replace_file``: a file in place for it is replaced
        by the one written (:meth:`file_damaged` found it damaged)."""
        sid = keys.session_key(commit.session_id)
        sha256 = check_sha256(commit.sha256)
        sha = bytes.fromhex(sha256)
        tables, files = self._tables, self.files

        def apply(batch: Batch, txn: WriteTxn) -> BlobInfo:
            # Later than every version written before (write_time, whatever the wall clock did): retention
            # keeps the reference until a version written after it is the oldest kept.
            now = write_time(txn, tables)
            raw = txn.get(sha, db=tables.blobs)
            # A recorded blob's file that is lost or damaged is restored from the bytes sent.
            if raw is None or replace_file or not files.path(sha256).is_file():
                # Moved in under the write lock: no removal (another worker's too) can come between the
                # move and this transaction's commit. If the batch is redone (the map grew), the file
                # is in place already.
                try:
                    size = files.place(commit.temp_name, sha256)
                except FileNotFoundError:
                    if not files.path(sha256).is_file():
                        raise Unavailable(
                            f"blob {sha256}: its temporary file is gone (taken for abandoned); nothing was"
                            " stored: send it again"
                        ) from None
                    size = files.path(sha256).stat().st_size
                if size != commit.size_bytes:
                    raise DataLoss(f"blob {sha256}: {size} bytes on disk, {commit.size_bytes} sent")
                rec = records_pb2.BlobRecord(
                    size_bytes=commit.size_bytes,
                    media_type=commit.media_type,
                    created_unix_nanos=now,
                    xxh3_128=commit.xxh3_128,
                )
                if raw is not None:
                    rec.MergeFrom(records_pb2.BlobRecord.FromString(raw))
            else:
                rec = records_pb2.BlobRecord.FromString(raw)
                # Stored already: the bytes sent are not needed (the file in place has the same hash).
                batch.after_commit.append(lambda: _unlink_temp(files, commit.temp_name))
                if not rec.xxh3_128:
                    # A record written before the checksum was kept gains it: the bytes sent are the blob's.
                    rec.xxh3_128 = commit.xxh3_128
            key = ref_key(sid, sha)
            if txn.get(key, db=tables.blob_refs) is None:
                rec.ref_count += 1
            # A fresh time on each PutBlob: retention keeps a reference at least as long as the versions
            # written after it (the checkpoint naming the blob comes after its upload), and no version
            # written before it has a later time (write_time).
            txn.put(key, records_pb2.BlobRefRecord(created_unix_nanos=now).SerializeToString(), db=tables.blob_refs)
            txn.put(sha, rec.SerializeToString(), db=tables.blobs)
            return _info(sha256, rec.SerializeToString())

        return Op(apply, fails_clean=False, size_bytes=0)

    def drop_session(self, batch: Batch, txn: WriteTxn, sid: bytes) -> None:
        """Inside a delete's transaction: drop every reference of session ``sid`` (files go after the commit)."""
        doomed = [self._unref(txn, sid, sha) for sha, _ in list(_refs(txn, self._tables, sid))]
        self._remove_after(batch, [sha for sha in doomed if sha is not None])

    def has_refs(self, txn: ReadTxn, sid: bytes) -> bool:
        return references_blobs(txn, self._tables, sid)

    def copy_refs(self, txn: WriteTxn, sid: bytes, new_sid: bytes, now: int) -> None:
        """Inside a fork's transaction: the new session references every blob its source does, from ``now``."""
        tables = self._tables
        ref = records_pb2.BlobRefRecord(created_unix_nanos=now).SerializeToString()
        for sha, _ in list(_refs(txn, tables, sid)):
            raw = txn.get(sha, db=tables.blobs)
            if raw is None:  # damage: verify names it; the fork goes on without the reference
                continue
            rec = records_pb2.BlobRecord.FromString(raw)
            if txn.put(ref_key(new_sid, sha), ref, db=tables.blob_refs, overwrite=False):
                rec.ref_count += 1
                txn.put(sha, rec.SerializeToString(), db=tables.blobs)

    def _unref(self, txn: WriteTxn, sid: bytes, sha: bytes) -> bytes | None:
        """Drop one reference; the blob's hash if that was its last (its record dropped too)."""
        tables = self._tables
        txn.delete(ref_key(sid, sha), db=tables.blob_refs)
        raw = txn.get(sha, db=tables.blobs)
        if raw is None:
            return None
        rec = records_pb2.BlobRecord.FromString(raw)
        if rec.ref_count > 1:
            rec.ref_count -= 1
            txn.put(sha, rec.SerializeToString(), db=tables.blobs)
            return None
        txn.delete(sha, db=tables.blobs)
        return sha

    def _remove_after(self, batch: Batch, shas: list[bytes]) -> None:
        if shas:
            batch.after_commit.append(functools.partial(self._remove_quietly, shas))

    def _remove_quietly(self, shas: list[bytes]) -> None:
        self.remove_unrecorded(shas)

    def remove_unrecorded(self, shas: list[bytes]) -> int:
        """Remove the files of those blobs that have no record, under the storage's write lock; how many.

        On the writer thread, after the commit that dropped their records (Batch.after_commit): in a
        transaction of its own, so that no batch redone or rolled back finds a file gone whose record
        it kept. Never raises: a file left behind is found by the next sweep.
        """
        removed = 0
        try:
            with self.files.no_backup_running() as allowed:
                if not allowed:  # a backup may be copying them: the first sweep after it removes them
                    self.mark_unchecked()
                    return 0
                # Under Durability.NO_META_SYNC an OS crash may undo the commit that dropped the records: it
                # must be on disk before the files go, or the records would come back naming no file.
                self._storage.flush()
                with self._storage.write() as txn:
                    for sha in shas:
                        if txn.get(sha, db=self._tables.blobs) is None and self.files.remove(sha.hex()):
                            removed += 1
        except Exception:
            self.mark_unchecked()
            log.exception("removing %d blob files failed; the next sweep removes them", len(shas))
        return removed

    def drop_unrecorded(self, sha256: str) -> None:
        """After a record of blob ``sha256`` failed (its transaction may have moved the file in and then not
        committed): remove the file now unless a record names it (a write of the same bytes committed), as
        the process that failed, which with ckpt serve --workers may sweep nothing. From any thread but the
        writer's; never raises (failing, it marks the files unchecked for the next sweep). ``sha256``: as
        :meth:`record_op` checked it."""
        try:
            self._remove_unrecorded_later([bytes.fromhex(sha256)])
        except Exception:
            self.mark_unchecked()
            log.exception("could not remove blob %s's file, whose record failed; the next sweep removes it", sha256)

    def _remove_unrecorded_later(self, shas: list[bytes]) -> int:
        """:meth:`remove_unrecorded` on the writer thread, after a commit; from any other thread."""
        removed: list[int] = []

        def apply(batch: Batch, txn: WriteTxn) -> None:
            batch.after_commit.append(lambda: removed.append(self.remove_unrecorded(shas)))

        self._submit(Op(apply)).wait()
        return sum(removed)

    # -- retention -------------------------------------------------------------------

    def release_unnamed(self, sids: list[bytes]) -> int:
        """For sessions ``sids``, marked by retention (SessionRecord.blob_refs_unchecked): drop each
        reference that no version kept names (by its uri's bytes) and that is older than the oldest version
        kept, and clear the mark; how many were dropped. A session whose release is skipped keeps its mark,
        and the next sweep looks again."""
        if self._tables.blob_refs is None:
            return 0
        dropped = 0
        for sid in sids:
            try:
                with self._read() as txn:
                    plan = self._unnamed(txn, sid)
            except (DataLoss, DecodeError) as exc:  # keep the references of a session that cannot be read
                log.warning("blob references of session %r kept: %s", printable(sid), exc)
                continue
            if plan is not None:
                dropped += self._submit(Op(self._release_op(sid, plan))).wait()
        return dropped

    def _unnamed(self, txn: ReadTxn, sid: bytes) -> Release | None:
        """What session ``sid`` is as read, and the references no version kept names and older than the
        oldest version kept; None if the session has no record."""
        tables = self._tables
        raw = txn.get(sid, db=tables.sessions)
        if raw is None:
            return None
        rec = record(raw)
        refs = list(_refs(txn, tables, sid))
        prefix = sid + keys.SEP
        chain: list[memoryview] = []
        oldest: int | None = None
        candidates: dict[bytes, bytes] = {}
        for key, value in txn.scan(tables.frames, keys.frame_key(sid, rec.first_version)) if refs else ():
            if not key.startswith(prefix):
                break
            if oldest is None:
                oldest = meta_of(value).created_unix_nanos
                candidates = {
                    sha: (URI_PREFIX + sha.hex()).encode()
                    for sha, ref in refs
                    if records_pb2.BlobRefRecord.FromString(ref).created_unix_nanos < oldest
                }
                if not candidates:
                    break
            frame = frame_of(value)
            if is_prefix(frame):
                # A PREFIX version's state is the first bytes of a newer version's, which is kept (retention
                # keeps every version after the oldest kept): whatever it names, that one names too.
                _strike_named(chain, candidates)
                chain = []
                continue
            if chain and frame_kind(frame) is FrameKind.FULL:
                _strike_named(chain, candidates)
                chain = []
            chain.append(frame)
        _strike_named(chain, candidates)
        return Release(rec.created_unix_nanos, rec.first_version, rec.head_version, oldest or 0, list(candidates))

    def _release_op(self, sid: bytes, plan: Release) -> Callable[[Batch, WriteTxn], int]:
        tables = self._tables

        def apply(batch: Batch, txn: WriteTxn) -> int:
            raw = txn.get(sid, db=tables.sessions)
            if raw is None:
                return 0
            rec = record(raw)
            # Another session under the id (deleted and written again), or versions removed since: that
            # session's mark, or that sweep's, to look at.
            if rec.created_unix_nanos != plan.created or rec.first_version != plan.first_version:
                return 0
            present: list[bytes] = []
            if plan.shas:
                # A version written since the states were read may name a blob: keep the mark, look again
                # next sweep. (With none to drop, none is until versions are removed again: they are only
                # added, and references only made newer, in between.)
                if rec.head_version != plan.head:
                    return 0
                for sha in plan.shas:
                    ref = txn.get(ref_key(sid, sha), db=tables.blob_refs)
                    # Stored again since (a fresh time): kept while a version older than that is.
                    if ref is not None and records_pb2.BlobRefRecord.FromString(ref).created_unix_nanos < plan.oldest:
                        present.append(sha)
                doomed = [self._unref(txn, sid, sha) for sha in present]
                self._remove_after(batch, [sha for sha in doomed if sha is not None])
            if rec.blob_refs_unchecked:
                rec.blob_refs_unchecked = False
                txn.put(sid, rec.SerializeToString(), db=tables.sessions)
            return len(present)

        return apply

    def release_sessionless(self, before_nanos: int) -> int:
        """Drop the references made before ``before_nanos`` by sessions with neither a checkpoint nor an
        event log: blobs stored by an agent that never wrote the checkpoint naming them (it crashed, or was
        abandoned), which no version's retention would ever look at. Retention's age applies to them as to
        a version: one that old would be gone. How many were dropped."""
        if self._tables.blob_refs is None:
            return 0
        dropped = 0
        start = b""
        while True:
            doomed: dict[bytes, list[bytes]] = {}
            with self._read() as txn:
                sids = list(itertools.islice(ref_sessions(txn, self._tables.blob_refs, start), _SWEEP_CHUNK))
                for sid in sids:
                    try:
                        if shas := self._sessionless_before(txn, sid, before_nanos):
                            doomed[sid] = shas
                    except DataLoss as exc:  # kept, as release_unnamed keeps them: `ckpt verify` names it
                        log.warning("blob references of session %r kept: %s", printable(sid), exc)
            if not sids:
                return dropped
            start = sids[-1] + _PAST_SESSION
            for part in _in_parts(doomed, _SWEEP_CHUNK):
                dropped += self._submit(Op(self._sessionless_op(part, before_nanos))).wait()

    def _sessionless_before(self, txn: ReadTxn, sid: bytes, before_nanos: int) -> list[bytes]:
        """The blobs session ``sid`` referenced before ``before_nanos`` if it has no checkpoint and no event
        log, else none."""
        if self._has_versions_or_events(txn, sid):
            return []
        return [sha for sha, ref in _refs(txn, self._tables, sid) if _ref_time(ref) < before_nanos]

    def _has_versions_or_events(self, txn: ReadTxn, sid: bytes) -> bool:
        return not holds_blobs_alone(txn, self._tables, sid)

    def _sessionless_op(self, doomed: dict[bytes, list[bytes]], before_nanos: int) -> Callable[[Batch, WriteTxn], int]:
        tables = self._tables

        def apply(batch: Batch, txn: WriteTxn) -> int:
            gone: list[bytes] = []
            dropped = 0
            for sid, shas in doomed.items():
                # Its first checkpoint or event since the read: the session is not abandoned after all.
                if self._has_versions_or_events(txn, sid):
                    continue
                for sha in shas:
                    ref = txn.get(ref_key(sid, sha), db=tables.blob_refs)
                    if ref is None or _fresh(ref, before_nanos):  # stored again since: a fresh time
                        continue
                    dropped += 1
                    if (last := self._unref(txn, sid, sha)) is not None:
                        gone.append(last)
            self._remove_after(batch, gone)
            return dropped

        return apply

    # -- files without a record ---------------------------------------------------------

    def sweep_files(self) -> int:
        """Remove abandoned temporary files and, once after opening or after a mark (a failed removal, in any
        process on the store: mark_unchecked), blob files without a record (a crash between a move and its
        commit, or a commit and a removal); how many."""
        removed = self.files.remove_abandoned()
        # The mark is taken before the files are listed: one left meanwhile stays for the next sweep.
        marked = self.files.take_unchecked_mark()
        if not (marked or self.files_unchecked):
            return removed
        self.files_unchecked = False
        pending: list[bytes] = []
        for sha256 in self.files.hashes():
            pending.append(bytes.fromhex(sha256))
            if len(pending) == _FILES_CHUNK:
                removed += self._remove_unrecorded_later(pending)
                pending = []
        if pending:
            removed += self._remove_unrecorded_later(pending)
        return removed


def _refs(txn: ReadTxn, tables: Tables, sid: bytes) -> Iterator[tuple[bytes, bytes]]:
    """(SHA-256, BlobRefRecord bytes) of every reference of session ``sid``."""
    prefix = sid + keys.SEP
    for key, value in txn.scan(tables.blob_refs, prefix):
        if not key.startswith(prefix):
            return
        yield key[len(prefix) :], value


def references_blobs(txn: ReadTxn, tables: Tables, sid: bytes) -> bool:
    """Whether session ``sid`` references a blob."""
    return tables.blob_refs is not None and next(_refs(txn, tables, sid), None) is not None


def holds_blobs_alone(txn: ReadTxn, tables: Tables, sid: bytes) -> bool:
    """Whether session ``sid`` has neither a record, an event log nor frames (frames without a record are
    damage `ckpt verify` reports: their blobs may be what an operator recovers)."""
    if txn.get(sid, db=tables.sessions) is not None:
        return False
    if tables.event_logs is not None and txn.get(sid, db=tables.event_logs) is not None:
        return False
    return not bytes(next(txn.scan_keys(tables.frames, sid + keys.SEP), b"")).startswith(sid + keys.SEP)


def ref_sessions(txn: ReadTxn, blob_refs: Table, start: bytes = b"") -> Iterator[bytes]:
    """The ids of the sessions that reference a blob, from ``start`` on, in order: one seek per session, not
    a read of each of its references."""
    key = start
    while True:
        found = next(iter(txn.scan_keys(blob_refs, key)), None)
        if found is None:
            return
        sid = found[: found.index(keys.SEP)]
        yield sid
        key = sid + _PAST_SESSION


def _in_parts(doomed: dict[bytes, list[bytes]], most: int) -> Iterator[dict[bytes, list[bytes]]]:
    """``doomed`` (references by session) in parts of at most ``most`` references: a write transaction each,
    however many blobs one session stored."""
    part: dict[bytes, list[bytes]] = {}
    count = 0
    for sid, shas in doomed.items():
        for i in range(0, len(shas), most):
            piece = shas[i : i + most]
            if count + len(piece) > most:
                yield part
                part, count = {}, 0
            part.setdefault(sid, []).extend(piece)
            count += len(piece)
    if part:
        yield part


def _fresh(raw: bytes, before_nanos: int) -> bool:
    """Whether a reference was made at or after ``before_nanos``; a record that does not parse counts as fresh:
    kept for `ckpt verify` to name."""
    try:
        return _ref_time(raw) >= before_nanos
    except DataLoss:
        return True


def ref_times(txn: ReadTxn, tables: Tables, sid: bytes) -> list[int]:
    """When each reference of session ``sid`` was made (or last stored again)."""
    return [_ref_time(ref) for _, ref in _refs(txn, tables, sid)]


def _ref_time(raw: bytes) -> int:
    try:
        return int(records_pb2.BlobRefRecord.FromString(raw).created_unix_nanos)
    except Exception:
        raise DataLoss("a blob reference's record does not parse") from None


def _strike_named(chain: list[memoryview], candidates: dict[bytes, bytes]) -> None:
    """Drop from ``candidates`` every blob a state of ``chain`` names."""
    if not chain or not candidates:
        return
    for version in iter_versions(chain):
        for sha in [sha for sha, uri in candidates.items() if uri in version.state]:
            del candidates[sha]
        if not candidates:
            return


def _unlink_temp(files: BlobFiles, temp_name: str) -> None:
    (files.temp_dir / temp_name).unlink(missing_ok=True)
