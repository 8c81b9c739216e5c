"""The checkpoint store: the codec's chains on the storage seam, with one group-committing writer.

Store is the facade; the work is done by its collaborators, one job each: the writer thread and its queue
(writer.py, loopwrites.py, gather.py), the write ops (writeops.py) and their entry points (writes.py,
checkline.py), chain reads (reads.py, prefixes.py), listings (listings.py), request ids (requestids.py),
retention and the sweeper (retention.py), quiet folds and keyframes (keyframes.py, folds.py), registered
message types (registry.py), blobs (blobs.py, blobfiles.py), the caches (cache.py, encoders.py) and their
checks against shared storage (coherence.py). Storage is reached only through the seam (sidecar/storage).
Reads run in their own read transactions, concurrently with the writer. No gRPC here: the server maps
StoreErrors to status codes.
"""

from __future__ import annotations

import errno
import functools
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Literal, overload

from google.protobuf.message import Message

from ckpt.store.v1 import records_pb2

from ..config import Durability, StoreConfig
from ..errors import DataLoss, NotFound, Unavailable
from ..storage import ReadTxn, check_holds_a_store, check_not_truncated, holds_nothing, make_dirs, open_lmdb, sync_dir
from . import keys
from .blobfiles import BlobFiles, check_media_type, check_sha256
from .blobs import BlobInfo, Blobs
from .cache import CachedState, StateCache
from .checkline import CheckLine
from .coherence import Coherence
from .counters import StoreCounters
from .dirlock import lock_data_dir
from .encoders import Encoders
from .eventapi import EventEntryPoints
from .eventlog import EventLog
from .forks import OneProcess
from .history import list_states
from .keyframes import QuietSweeps
from .layout import Tables, open_layout
from .listings import count_sessions, list_sessions, list_versions
from .loopwrites import LoopBatches
from .ops import upkeep_submit
from .reads import check_version_arg, frames_of, read_state, session_ids
from .records import record, session_info
from .registry import Registry
from .requestids import RequestIds
from .retention import Retention, Sweeper
from .types import GetResult, SessionInfo, SweepResult, VersionInfo
from .writeops import WriteOps
from .writer import Writer
from .writes import WriteEntryPoints


class Store(WriteEntryPoints, EventEntryPoints, OneProcess):
    """A durable, versioned checkpoint store on one data directory.

    Thread-safe: call it from any number of threads. Use as a context manager or call close(); close()
    finishes and commits every queued write first.

    ``readonly=True`` opens the data directory for reading only, without the directory lock and without a
    writer: for inspection tools running beside a live server (LMDB serves readers in other processes
    consistently).

    ``shared=True``: other processes write this data directory too (the workers of one ``ckpt serve
    --workers N``, whose parent holds the directory's lock: this store takes none). The storage's write lock
    orders their commits and every write checks the head inside its transaction as always; what this store
    caches is checked against storage before use (coherence.py), since another process may have moved a
    session on. ``sweeper=False`` runs no retention sweeper (one worker sweeps for all).
    """

    def __init__(
        self,
        config: StoreConfig,
        *,
        readonly: bool = False,
        on_writes_stopped: Callable[[str], object] | None = None,
        shared: bool = False,
        sweeper: bool = True,
        lock_holder: str | None = None,
    ) -> None:
        self.config = config
        self.readonly = readonly
        self.shared = shared
        lmdb_dir = config.data_dir / "lmdb"
        data_mdb = lmdb_dir / "data.mdb"
        if readonly:
            check_holds_a_store(config.data_dir, data_mdb)  # missing or empty: LMDB cannot open it read-only
            self._lock_file, made = None, False
        else:
            if config.data_dir.exists() and not config.data_dir.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, "the data directory is not a directory", str(config.data_dir))
            made = holds_nothing(data_mdb)  # LMDB makes (or writes an empty) data.mdb, but flushes no directory
            make_dirs(config.data_dir if lmdb_dir.exists() else lmdb_dir)  # each made flushed into its parent
            self._lock_file = None if shared else lock_data_dir(config.data_dir, holder=lock_holder)
        try:
            # Shared: the parent checked (and extended) the file before any
            # worker started; extending here could cut pages another worker
            # appended since this one read the file's size.
            check_not_truncated(data_mdb, extend=not readonly and not shared)
            self._storage, layout = open_lmdb(
                lmdb_dir,
                readonly=readonly,
                map_size_bytes=config.map_size_bytes,
                max_map_size_bytes=config.max_map_size_bytes,
                max_readers=config.max_readers,
                meta_sync=config.durability is Durability.SYNC,
                prepare=functools.partial(
                    open_layout, writable=not readonly, max_map_size_bytes=config.max_map_size_bytes
                ),
            )
            if made:
                sync_dir(lmdb_dir)
        except BaseException:
            # The caller never gets a store to close(): release the directory now.
            if self._lock_file is not None:
                self._lock_file.close()
            raise
        self._tables = layout.tables
        #: Whether the store carries a layout stamp (layout.Layout.stamped): `ckpt verify` reads it.
        self.layout_stamped = layout.stamped
        self._closed = self._storage_closed = self._close_finished = self._folded_at_close = False
        self._close_lock = threading.Lock()
        self._states = StateCache(config.cache_size_bytes)
        self._coherence = Coherence(self._read, self._tables)
        validate = self._coherence if shared else None
        self._encoders = Encoders(config, self._tables, self._states, validate)
        self._requests = RequestIds.of(layout, ttl_seconds=config.request_id_ttl_seconds)
        self._registry = Registry(self._tables, self._read, shared=shared)
        self._writer = Writer(
            config, self._storage, self._encoders, readonly=readonly, on_writes_stopped=on_writes_stopped
        )
        self._loop = LoopBatches(config, self._writer)
        self._line = CheckLine(self._writer, self._queue_locked, self._gather_on_loop)
        submit = upkeep_submit(self._writer.submit)  # the sweeps' writes, not a client's
        self._quiet = QuietSweeps(config, self._tables, self._encoders, self._read, submit, self._registry.resolve)
        self._events = EventLog(config, self._tables, self._requests, self._read)
        self._ops = WriteOps(
            config, self._tables, self._encoders, self._requests, self._quiet, validate, self._registry, self._events,
            self._read,
        )  # fmt: skip
        self._retention = Retention(config, self._tables, self._read, submit, self._requests, self._quiet, self._events)
        #: Blob files (blobfiles.py): the gRPC process streams PutBlob into them and GetBlob out of them.
        full = None if readonly else self._writer.count_store_full  # the gRPC process tells the store's
        self.blob_files = BlobFiles(config.data_dir / "blobs", on_full=full)
        self._blobs = Blobs(self._tables, self._storage, self.blob_files, self._read, submit)
        self._ops.blobs = self._retention.blobs = self._blobs
        #: What the store has done and holds (counters.py): metrics and operators read it.
        self.counters = StoreCounters(
            writer=self._writer, states=self._states, encoders=self._encoders, storage=self._storage,
            retention=self._retention, tables=self._tables, read=self._read,
        )  # fmt: skip
        self._sweeper: Sweeper | None = None
        if not readonly:
            self._writer.start()
            if sweeper:
                self._sweeper = Sweeper(
                    config, self._tables, self._read, self.sweep, self.forget_dead_readers, self._writer.closing
                )
                self._sweeper.start()
        self._track_process()

    # -- lifecycle ---------------------------------------------------------

    def close(self) -> None:
        """Stop accepting writes, commit every queued one, fold the heads written since the last sweep
        (the store that sweeps, within fold_on_close_seconds), close the storage."""
        # Each step is safe to repeat: a close interrupted (Ctrl-C) is finished by the next; one waits for another.
        with self._close_lock:
            self._closed = True
            if self._close_finished:
                return
            # A batch gathering on the loop commits too, and the checked writes in line.
            self._writer.close_queue(lambda: self._loop.take_pending() + self._line.take_locked())
            if self._sweeper is not None:
                self._sweeper.join()  # its next write is refused: it ends its sweep
                if not self._folded_at_close:
                    self._folded_at_close = True
                    self._quiet.fold_at_close(self._writer.submit_own)
            self._writer.stop()
            if not self._storage_closed:
                self._storage.close()
                self._storage_closed = True
            if self._lock_file is not None:
                self._lock_file.close()
            self._close_finished = True

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writes (the rest: writes.py) ------------------------------------------

    def fork(
        self,
        session_id: str,
        version: int,
        new_session_id: str,
        *,
        labels: dict[str, str] | None = None,
        copy_events: bool = False,
    ) -> SessionInfo:
        """A new session whose version 1 is ``version`` (0 = latest) of another (``copy_events``: with a copy
        of its event log, seqs and times as they are)."""
        op = self._ops.fork_op(session_id, version, new_session_id, dict(labels or {}), copy_events=copy_events)
        return self._writer.submit(op).wait()  # type: ignore[no-any-return]

    def delete_session(self, session_id: str) -> int:
        """Remove a session, every version, its event log and every index entry; returns versions removed."""
        return self.delete_session_counts(session_id)[0]

    def delete_session_counts(self, session_id: str) -> tuple[int, int]:
        """:meth:`delete_session`, returning the versions and the events removed (NotFound only if the session
        has neither)."""
        return self._writer.submit(self._ops.delete_op(session_id)).wait()  # type: ignore[no-any-return]

    def register_types(self, file_descriptor_set: bytes) -> list[str]:
        """Register the message types of a serialized FileDescriptorSet, durably; the full names it defines.

        The set holds a file and every file it imports that the store does not know yet (built in:
        ckpt.v1.Checkpoint's files, google.protobuf's well-known types; ``descriptors.descriptor_set(cls)``
        builds one). A file registered before is replaced if its changes are compatible (fields and
        messages added): FailedPrecondition names a field number given another type or cardinality, or a
        message dropped. A set that does not parse, is empty or over 4 MiB, imports a file it lacks, or
        that protobuf refuses: InvalidArgument. Nothing is stored unless all of it is.
        """
        return self._writer.submit(self._registry.register_op(file_descriptor_set)).wait()  # type: ignore[no-any-return]

    def message_class(self, message_type: str) -> type[Message] | None:
        """The dynamic message class of a registered or built-in type (None if the store knows none):
        what typed sessions' states are parsed with."""
        return self._registry.resolve(message_type)

    # -- blobs (blobs.py) ----------------------------------------------------------

    def record_blob(self, commit: records_pb2.BlobCommit) -> BlobInfo:
        """Record a blob whose bytes a caller streamed into ``self.blob_files`` (a temporary file, flushed):
        the file moves into place and the blob's record and the session's reference commit together."""
        check_media_type(commit.media_type)
        # The same bytes stored again mend the file in place if it no longer holds them (read here, outside
        # the write lock): the upload a user repeats after `ckpt verify` named the blob damaged.
        damaged = self._blobs.file_damaged(check_sha256(commit.sha256))
        op = self._blobs.record_op(commit, replace_file=damaged)  # refused arguments moved no file: nothing to drop
        try:
            return self._writer.submit(op).wait()  # type: ignore[no-any-return]
        except BaseException:  # its file may be in place unrecorded, and this process may sweep none (--workers)
            self._blobs.drop_unrecorded(commit.sha256)
            raise

    def put_blob(
        self, session_id: str, chunks: Iterable[bytes], *, media_type: str = "", expected_sha256: str = ""
    ) -> BlobInfo:
        """Store a blob referenced by ``session_id`` from its bytes, ``chunks`` (never held whole), once
        however many sessions store it. ResourceExhausted past max_blob_bytes, InvalidArgument if
        ``expected_sha256`` is given and the bytes hash otherwise, or for a ``media_type`` over 255 bytes
        or not printable: nothing is stored then."""
        keys.session_key(session_id)
        check_media_type(media_type)
        if expected_sha256:
            check_sha256(expected_sha256, field="expected_sha256")
        temp = self.blob_files.new_temp(self.config.max_blob_bytes)
        try:
            for chunk in chunks:
                temp.write(chunk)
            commit = records_pb2.BlobCommit(session_id=session_id, sha256=temp.finish(expected_sha256))
            commit.size_bytes, commit.media_type, commit.temp_name = temp.size_bytes, media_type, temp.name
            commit.xxh3_128 = temp.xxh3_128
            return self.record_blob(commit)
        finally:
            temp.discard()  # gone if moved into place

    def blob(self, sha256: str) -> BlobInfo:
        """Blob ``sha256``'s record: NotFound if never stored or removed (no session references it)."""
        return self._blobs.info(sha256)

    def blob_refs(self, session_id: str) -> list[str]:
        """The SHA-256 of every blob ``session_id`` references."""
        return self._blobs.session_refs(session_id)

    def blobs(self, txn: ReadTxn) -> Iterator[BlobInfo]:
        """Every blob's record in ``txn`` (from :meth:`read`), for tools."""
        return self._blobs.all_blobs(txn)

    def current_message_class(self, message_type: str) -> type[Message] | None:
        """:meth:`message_class` as storage has it now (see :meth:`types_generation`), so that a field added
        or renamed since is known by its name."""
        self.types_generation()
        return self._registry.resolve(message_type)

    def types_generation(self) -> int:
        """The registered types' generation (one more at each registration that changed them), as storage
        has it now: in a store other processes register types in (a read-only one, or ``shared``) the
        registry is reloaded first if it changed (one read)."""
        if self.readonly or self.shared:
            with self._read() as txn:
                self._registry.sync(txn)
        return self._registry.current.generation

    # -- reads -----------------------------------------------------------------

    def get(
        self, session_id: str, version: int = 0, *, use_cache: bool = True, max_state_bytes: int | None = None
    ) -> GetResult:
        """The state of ``version`` (0 = latest), verified.

        ``use_cache=False`` reads storage even if the state cache holds the
        answer: for a caller that just missed in :meth:`get_cached`.
        ``max_state_bytes``: StateTooLarge, before anything is decompressed,
        for a larger state (a caller bounding how long one read may take; a
        folded version is read from the newer state it is a prefix of: that one's).
        """
        sid = keys.session_key(session_id)
        check_version_arg(version)
        if use_cache and (hit := self._cached(sid, version)) is not None:
            return hit
        self._check_open_for_reads()
        with self._storage.read() as txn:  # not self._read(): a call less on the cold read
            return read_state(txn, self._tables, sid, session_id, version, max_state_bytes=max_state_bytes)

    def get_cached(self, session_id: str, version: int = 0) -> GetResult | None:
        """:meth:`get` if the state cache holds the answer, else None: never touches storage.

        For callers that must not block (an event loop): on None, call
        ``get(..., use_cache=False)`` off the loop.
        """
        sid = keys.session_key(session_id)
        check_version_arg(version)
        return self._cached(sid, version)

    def cached_info(self, session_id: str) -> VersionInfo | None:
        """The head's VersionInfo if the state cache holds the head, else None: :meth:`get_cached` without
        the state, for a caller that holds a state and asks only whether it is the head's (``state_xxh3``).
        Never touches storage, nor copies the state."""
        entry = self._cached_entry(keys.session_key(session_id), 0)
        return None if entry is None else entry.info

    def _cached(self, sid: bytes, version: int) -> GetResult | None:
        entry = self._cached_entry(sid, version)
        return None if entry is None else GetResult(entry.info.version, entry.state.tobytes(), entry.info)

    def _cached_entry(self, sid: bytes, version: int) -> CachedState | None:
        self._check_open_for_reads()
        cached = self._states.get(sid)
        if cached is None or not (version == 0 or version == cached.info.version):
            return None
        if self.shared and not self._coherence.still_head(sid, cached.info):
            return None  # another process wrote (or deleted) the session since
        return cached

    def is_head(self, session_id: str, version: int, created_unix_nanos: int, *, full_frame: bool) -> bool:
        """Whether the version written at ``created_unix_nanos`` (and stored as a FULL frame, or not)
        is the session's committed head now: one read transaction, nothing decoded.

        For a cache outside this store (the gRPC process's replies to Gets),
        which must never answer with a state that is not the committed head.
        """
        return self._coherence.is_head_arg(session_id, version, created_unix_nanos, full_frame=full_frame)

    def session(self, session_id: str) -> SessionInfo:
        sid = keys.session_key(session_id)
        with self._read() as txn:
            raw = txn.get(sid, db=self._tables.sessions)
            if raw is None:
                raise NotFound(f"session {session_id!r} does not exist")
            return session_info(session_id, record(raw))

    @overload
    def list_versions(
        self, session_id: str, *, page_size: int = ..., page_token: str = ..., max_page_bytes: int = ...,
        include_states: Literal[False] = ..., start_version: int = ..., target_page_bytes: int = ...,
    ) -> tuple[list[VersionInfo], str]: ...  # fmt: skip
    @overload
    def list_versions(
        self, session_id: str, *, page_size: int = ..., page_token: str = ..., max_page_bytes: int = ...,
        include_states: Literal[True], start_version: int = ..., target_page_bytes: int = ...,
    ) -> tuple[list[GetResult], str]: ...  # fmt: skip
    def list_versions(
        self,
        session_id: str,
        *,
        page_size: int = 0,
        page_token: str = "",
        max_page_bytes: int = 0,
        include_states: bool = False,
        start_version: int = 0,
        target_page_bytes: int = 0,
    ) -> tuple[list[VersionInfo], str] | tuple[list[GetResult], str]:
        """A page of a session's versions, newest first, and the next page's token ("" at the end).

        ``max_page_bytes`` (0: no limit) ends a page early rather than pass
        that many bytes encoded (an upper bound: listings.version_info_bytes),
        so that a page fits a size-limited reply; a page holds one version at least.
        ``include_states``: each as what :meth:`get` returns, each chain the page touches decoded once
        (history.py); a first state over ``max_page_bytes`` is StateTooLarge. ``target_page_bytes`` (0: none)
        ends a page early as ``max_page_bytes`` does, but a first version over it is listed all the same.
        ``start_version``: list from it back (0: from the head).
        """
        listing = list_states if include_states else list_versions
        return listing(
            self._read,
            self._tables,
            session_id,
            page_size=page_size,
            page_token=page_token,
            max_page_bytes=max_page_bytes,
            start_version=start_version,
            target_page_bytes=target_page_bytes,
        )

    def list_sessions(
        self,
        *,
        page_size: int = 0,
        page_token: str = "",
        label_filter: dict[str, str] | None = None,
        updated_after_nanos: int | None = None,
        updated_before_nanos: int | None = None,
        max_page_bytes: int = 0,
        session_id_prefix: str = "",
    ) -> tuple[list[SessionInfo], str]:
        """A page of sessions matching every filter, and the next page's token.

        Uses the label index (first label of the filter) or the updated-time index, so filtered listings
        do not scan every session; a ``session_id_prefix`` alone reads only its own ids. A page may hold
        fewer than ``page_size`` sessions when many candidates did not match; keep following
        ``next_page_token`` until it is empty. ``max_page_bytes`` as for :meth:`list_versions`.
        """
        return list_sessions(
            self._read,
            self._tables,
            page_size=page_size,
            page_token=page_token,
            label_filter=label_filter,
            updated_after_nanos=updated_after_nanos,
            updated_before_nanos=updated_before_nanos,
            max_page_bytes=max_page_bytes,
            session_id_prefix=session_id_prefix,
        )

    def frames_of(self, session_id: str) -> tuple[SessionInfo, list[tuple[int, VersionInfo | DataLoss, bytes]]]:
        """A session's record and every stored frame, oldest first, read in one transaction, all held at once
        (`ckpt verify` and `inspect` hold one chain at a time: store.stored_frames).

        One snapshot, so the frames match the record even beside a writer. A version whose metadata or
        frame header is corrupt comes with the DataLoss saying so instead of its VersionInfo.
        """
        return frames_of(self._read, self._tables, session_id)

    def session_ids(self) -> Iterator[str]:
        """Every session id, in key order; read a chunk at a time, holding no transaction between chunks."""
        return session_ids(self._read, self._tables)

    def read(self) -> AbstractContextManager[ReadTxn]:
        """One read transaction of the storage (one snapshot of every table), for tools that read the
        tables raw (verify's cross-checks); :attr:`tables` names them."""
        return self._read()

    @property
    def tables(self) -> Tables:
        """The store's tables, for :meth:`read` (keys.py gives their keys)."""
        return self._tables

    # -- retention -----------------------------------------------------------

    def sweep(self, *, now_nanos: int | None = None) -> SweepResult:
        """Apply retention to every session and expire old request ids, now.

        The background sweeper calls this every sweep_interval_seconds. Each
        chunk of sessions is one write operation, so writes keep flowing.
        """
        return self._retention.sweep(time.time_ns() if now_nanos is None else now_nanos)

    # -- introspection -------------------------------------------------------

    @property
    def writes_stopped(self) -> str | None:
        """Why the store stopped taking writes (a commit failed with an I/O error), or None."""
        return self._writer.writes_stopped

    def stats(self) -> dict[str, Any]:
        """Every count of :attr:`counters` at once, with the tables' sizes and the storage's."""
        return self.counters.stats()

    def copy_to(self, lmdb_dir: Path, *, blobs: list[str] | None = None, rebuilt: bool = False) -> tuple[int, int]:
        """Write a compacted copy of the storage into ``lmdb_dir`` (an existing directory without a
        data.mdb), as of one read snapshot; that snapshot's (sessions, versions).

        For backups (tools/backup.py, which also makes the copy durable). The snapshot holds every write
        committed before it began and nothing of a later one. While the copy runs, the writer cannot reuse
        pages freed after the snapshot, so a store written meanwhile grows by what it writes; in this process
        a map resize waits for the copy to end. ``blobs``: gets the SHA-256 of every blob the snapshot
        records (their files are not copied here). ``rebuilt``: every table written again in key order, its
        pages full (tools/compact.py)."""
        with self._read() as txn:
            sessions, versions = count_sessions(txn, self._tables), txn.count(self._tables.frames)
            self._storage.copy_to(lmdb_dir, txn, rebuilt=rebuilt)
            if blobs is not None:  # the blobs the copy records, for the caller to copy their files
                blobs.extend(info.sha256 for info in self._blobs.all_blobs(txn))
        return sessions, versions

    def forget_dead_readers(self) -> None:
        """Free what readers in processes that died left held (LMDB: their reader slots).

        Other processes read this directory: the sidecar's gRPC process (its reply cache reads heads),
        ``ckpt verify`` children and the like. One killed inside a read transaction leaves its slot in
        lock.mdb, pinning that snapshot (pages freed since cannot be reused, so the file grows) and, one per
        dead process, would fill the reader table, while this store stays open (opening one clears such slots).
        """
        self._storage.forget_dead_readers()

    # -- reading storage -------------------------------------------------------

    def _check_open_for_reads(self) -> None:
        # Reads go on while close() commits the queued writes; after it, none (the cache's neither).
        if self._closed and not self._writer.alive():
            raise Unavailable(self._closed_reason)

    def _read(self) -> AbstractContextManager[ReadTxn]:
        self._check_open_for_reads()
        return self._storage.read()
