"""The checkpoint store: LMDB + the codec, with one group-committing writer.

Every write (put, fork, delete, retention) is an operation handed to a single
writer thread. The writer drains whatever operations are queued, applies each
in its own nested transaction (a bad request fails alone), commits them all in
one LMDB transaction, and only then updates the caches and acknowledges them.
Checks against the head (compare-and-set, request-id replays) happen inside
that transaction, so two writers can never both succeed against one head.

Reads run in their own read transactions, concurrently with the writer.
No gRPC here: the server maps StoreError subclasses to status codes.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import enum
import errno
import fcntl
import functools
import logging
import math
import os
import queue
import resource
import struct
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TypeVar, cast

import lmdb
import xxhash
from google.protobuf.message import DecodeError as DecodeProtoError

from ckpt.store.v1 import records_pb2

from ...codec import (
    ChainEncoder,
    CodecError,
    DecodeError,
    EncodedFrame,
    EncodeError,
    FrameKind,
    StateSnapshot,
    WireFormatError,
    check_patch,
    decode,
    keyframe,
    parse,
)
from ..config import Durability, StoreConfig
from ..errors import (
    AlreadyExists,
    DataLoss,
    IncompatibleStore,
    InvalidArgument,
    NotFound,
    Overloaded,
    StateTooLarge,
    StoreError,
    StoreFull,
    Unavailable,
    VersionConflict,
)
from . import keys
from .cache import LRU, StateCache
from .rwlock import RWLock

_META_LEN = struct.Struct("<H")
# The byte after keys.SEP: a session's frame keys all sort before sid + _AFTER_SEP.
_AFTER_SEP = bytes([keys.SEP[0] + 1])
_FRAME_KIND_OFFSET = 5  # byte offset of `kind` in a frame header (FORMAT.md)
_MAX_PAGE_SIZE = 1000
_DEFAULT_PAGE_SIZE = 100
_MAX_SCAN_PER_PAGE = 10_000
_SWEEP_CHUNK = 1000
# Request ids expired per write op: a backlog (after downtime) must not hold
# the writer for seconds while puts queue behind it.
_EXPIRE_CHUNK = 5000
# States one quiet-keyframe op decodes and recompresses before it yields the
# writer to the writes queued behind it.
_KEYFRAME_OP_BYTES = 8 * 1024 * 1024
# A full store is logged when it first refuses a write, then at most this often
# (with the count refused meanwhile): an operator must hear of it, not once per write.
_STORE_FULL_LOG_SECONDS = 60.0
#: While data.mdb grows, dead readers' slots are looked for at most this often (besides before each sweep).
READER_CHECK_INTERVAL_SECONDS = 1.0

log = logging.getLogger("ckpt.store")


class WriteMode(enum.IntEnum):
    REPLACE = 1
    MERGE = 2
    FORK = 3  # version 1 of a forked session


@dataclass(frozen=True, slots=True)
class PutResult:
    version: int
    stored_bytes: int
    frame_kind: FrameKind
    state_size: int
    replayed: bool = False
    #: Frames after the chain's FULL frame, this one included (0 for a FULL frame).
    chain_depth: int = 0


@dataclass(frozen=True, slots=True)
class VersionInfo:
    version: int
    parent_version: int
    created_unix_nanos: int
    frame_kind: FrameKind
    stored_bytes: int
    state_size: int
    labels: dict[str, str]
    mode: WriteMode


@dataclass(frozen=True, slots=True)
class GetResult:
    version: int
    state: bytes
    info: VersionInfo


@dataclass(frozen=True, slots=True)
class SessionInfo:
    session_id: str
    head_version: int
    first_version: int
    created_unix_nanos: int
    updated_unix_nanos: int
    labels: dict[str, str]
    stored_bytes: int
    version_count: int
    forked_from_session_id: str
    forked_from_version: int
    #: The version whose FULL frame starts the head's chain: where a cold read of the head decodes from.
    chain_start_version: int = 0


@dataclass(frozen=True, slots=True)
class PutRequest:
    """One write, as Store.put_many takes them."""

    session_id: str
    state: bytes
    mode: WriteMode = WriteMode.REPLACE
    expected_version: int | None = None
    request_id: str = ""
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SweepResult:
    sessions_pruned: int
    versions_removed: int
    request_ids_expired: int
    #: Quiet sessions whose head frame became a FULL frame (keyframe_after_quiet_seconds).
    keyframes_written: int = 0

    @property
    def changed(self) -> bool:
        """Whether the sweep removed or rewrote anything (an idle store's sweeps do not)."""
        return bool(self.versions_removed or self.request_ids_expired or self.keyframes_written)

    def __add__(self, other: SweepResult) -> SweepResult:
        return SweepResult(
            self.sessions_pruned + other.sessions_pruned,
            self.versions_removed + other.versions_removed,
            self.request_ids_expired + other.request_ids_expired,
            self.keyframes_written + other.keyframes_written,
        )


#: A MERGE patch this big or bigger is checked on a thread, not the event loop (Store.aenqueue).
#: Below it the check takes at most ~10 ms here; a thread costs ~0.1 ms either way.
OFF_LOOP_PATCH_BYTES = 16 * 1024


def _held_lock() -> threading.Lock:
    lock = threading.Lock()
    lock.acquire()
    return lock


@dataclass(slots=True)
class _Op:
    """A write waiting for the writer thread.

    The caller blocks in :meth:`wait` on a lock released once the op's
    outcome is known: one futex wake-up, where a Future's condition variable
    costs several lock round trips on the writer's critical path. The blocked
    callers of one commit are woken in turn (:func:`_wake_in_turn`), not all
    at once. ``submit()`` callers get a Future instead (``future`` set), and
    asyncio callers an asyncio future on their loop (``loop`` and ``afuture``
    set).
    """

    apply: Callable[[_Batch, lmdb.Transaction], Any]
    #: The op raises StoreError/CodecError only before its first LMDB write,
    #: so it can share the batch transaction without a nested one of its own.
    fails_clean: bool = False
    #: About how many bytes the op stores (its state): what a full disk is checked against.
    size_bytes: int = 0
    #: Its size_bytes while it counts against max_queued_write_bytes (0 once answered).
    queued_bytes: int = 0
    future: Future[Any] | None = None
    loop: asyncio.AbstractEventLoop | None = None
    afuture: asyncio.Future[Any] | None = None
    _done: threading.Lock = field(default_factory=_held_lock)
    _result: Any = None
    _error: BaseException | None = None
    resolved: bool = False
    #: Its outcome lets its caller go on (and perhaps write again): false for
    #: all but the last write of a put_many, whose caller waits for them all.
    releases_caller: bool = True
    #: Its caller waits for it alone, at once, in :meth:`wait` (Store.write
    #: off the main thread), so it may be woken in turn: an op in the line
    #: that nobody waits for would leave every op after it waiting. Not
    #: put_many's writes: one caller waits for many, and an interrupted wait
    #: would leave the rest unwaited. (An exception forced into a waiting
    #: thread with PyThreadState_SetAsyncExc could still break the line.)
    wakes_in_turn: bool = False
    #: The op whose caller this op's caller wakes, in a one-item list: taking
    #: it (list.pop, atomic under the GIL) decides who wakes it, should this
    #: op's caller abandon its wait.
    _then: list[_Op] | None = None
    _woken: bool = False
    _abandoned: bool = False

    def resolve(self, result: Any, error: BaseException | None) -> None:
        self.resolved = True
        if self.loop is not None:
            _settle_on(self.loop, [(self, result, error)])
        elif self.future is not None:
            if error is None:
                self.future.set_result(result)
            else:
                self.future.set_exception(error)
        else:
            self._result, self._error = result, error
            _wake_in_order(self)

    def wait(self) -> Any:
        try:
            self._done.acquire()
        except BaseException:
            # A signal handler raised in this (main) thread: the callers to be
            # woken after this one must still be. Whoever sees both flags set
            # wakes them: this caller, or the thread waking it meanwhile.
            self._abandoned = True
            if self._woken:
                _wake_in_order(_taken(self))
            raise
        _wake_in_order(_taken(self))
        if self._error is not None:
            raise self._error
        return self._result


def _nothing() -> None:
    pass


#: Longest a loop reads no requests while its batch of writes commits (Store.write_on_loop).
_HOLD_INPUT_MAX_SECONDS = 0.02
#: A loop's batch of concurrent writes closes this many of the last commit's durations after the last
#: batch was handed over (Store.write_on_loop; at most max_commit_delay_seconds).
_LOOP_GATHER_COMMITS = 3


def _wake_in_turn(outcomes: list[tuple[_Op, Any, BaseException | None]]) -> None:
    """Resolve ops whose callers block in :meth:`_Op.wait`, waking only the first.

    Each caller wakes the next as it returns from its wait, so about one
    caller at a time contends for the GIL with the writer. Woken all at once,
    64 threads cost 47-73 us of kernel time per write (33-52 in turn), and
    group commit made 8% fewer writes/s on disk and 14% fewer on tmpfs (64
    threads, the group-commit benchmark's states, 6 alternating rounds).
    """
    then: _Op | None = None
    for op, result, error in reversed(outcomes):
        op._result, op._error = result, error
        op._then = None if then is None else [then]
        op.resolved = True
        then = op
    _wake_in_order(then)


def _taken(op: _Op) -> _Op | None:
    """The op ``op``'s caller is to wake next, if nobody took it yet."""
    then = op._then
    if not then:
        return None
    try:
        return then.pop()
    except IndexError:  # taken by a racing thread: it wakes it
        return None


def _wake_in_order(op: _Op | None) -> None:
    # A loop, not recursion: a run of abandoned waits is woken here in one go.
    while op is not None:
        op._woken = True
        op._done.release()
        if not op._abandoned:
            return
        op = _taken(op)


def _settle_on(loop: asyncio.AbstractEventLoop, outcomes: list[tuple[_Op, Any, BaseException | None]]) -> None:
    """Resolve asyncio ops of one loop with a single wake-up of that loop."""
    # A closed loop raises RuntimeError: nobody is left waiting (the writes still committed).
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(_settle, outcomes)


def _settle(outcomes: list[tuple[_Op, Any, BaseException | None]]) -> None:
    for op, result, error in outcomes:
        fut = op.afuture
        if fut is None or fut.done():  # the awaiting task was cancelled; the write stands
            continue
        if error is None:
            fut.set_result(result)
        else:
            fut.set_exception(error)


class _Unclean(Exception):
    """An op raised something unexpected mid-batch: redo the batch with each op isolated."""


@dataclass(slots=True)
class _Batch:
    """What one group commit changes besides LMDB: applied only after commit."""

    touched_encoders: set[bytes] = field(default_factory=set)
    after_commit: list[Callable[[], None]] = field(default_factory=list)
    #: Encoders kept until the commit (to go back into the encoder cache),
    #: by session, with their memory_bytes; and the sum of those.
    held_encoders: dict[bytes, int] = field(default_factory=dict)
    held_encoder_bytes: int = 0


class Store:
    """A durable, versioned checkpoint store on one LMDB environment.

    Thread-safe: call it from any number of threads. Use as a context manager
    or call close(); close() finishes and commits every queued write first.

    ``readonly=True`` opens the data directory for reading only, without the
    directory lock and without a writer: for inspection tools running beside
    a live server (LMDB serves readers in other processes consistently).

    ``shared=True``: other processes write this data directory too (the
    workers of one ``ckpt serve --workers N``, whose parent holds the
    directory's lock: this store takes none). LMDB's write lock orders their
    commits and every write checks the head inside its transaction as always;
    what this store caches is checked against LMDB before use, since another
    process may have moved a session on: a cached encoder inside the write
    transaction (head version, chain start and the session's creation time),
    a cached state by a read of the session's record (head version, the
    time of its last write, and no keyframe rewrite of it since). ``sweeper=False`` runs no retention sweeper
    (one worker sweeps for all).
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
        #: Why the store stopped taking writes (a commit failed with an I/O error), or None.
        self.writes_stopped: str | None = None
        # Called once, on the writer thread, when writes stop: a server exits
        # so that its supervisor reopens the store.
        self._on_writes_stopped = on_writes_stopped
        lmdb_dir = config.data_dir / "lmdb"
        if readonly:
            if not (lmdb_dir / "data.mdb").is_file():
                raise NotFound(f"no ckpt store in {config.data_dir} (missing {lmdb_dir / 'data.mdb'})")
            self._lock_file = None
        else:
            if config.data_dir.exists() and not config.data_dir.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, "the data directory is not a directory", str(config.data_dir))
            config.data_dir.mkdir(parents=True, exist_ok=True)
            self._lock_file = None if shared else lock_data_dir(config.data_dir, holder=lock_holder)
        # Before LMDB opens: stamping a full map grows it (_check_layout, _grow_map).
        self._rw = RWLock()
        self.map_resizes = 0
        try:
            # Shared: the parent checked (and extended) the file before any
            # worker started; extending here could cut pages another worker
            # appended since this one read the file's size.
            check_not_truncated(lmdb_dir / "data.mdb", extend=not readonly and not shared)
            self._open_lmdb(lmdb_dir)
        except BaseException:
            # The caller never gets a store to close(): release the directory now.
            if self._lock_file is not None:
                self._lock_file.close()
            raise
        self._states = StateCache(config.cache_size_bytes)
        self._encoders: LRU[ChainEncoder] = LRU(
            config.encoder_cache_entries, max_weight=config.encoder_cache_bytes, weigh=_encoder_memory
        )
        # Shared: the creation time of the session each cached encoder belongs
        # to (a session deleted and written again by another process may reach
        # the same version and chain start).
        self._encoder_created: weakref.WeakKeyDictionary[ChainEncoder, int] = weakref.WeakKeyDictionary()
        self._merge_type = config.merge_message_class()
        # A write, a batch of them gathered on a loop (write_on_loop), or None: close() was called.
        self._queue: queue.SimpleQueue[_Op | list[_Op] | None] = queue.SimpleQueue()
        self._closing = threading.Event()
        # Held while enqueueing, so that no write can land behind the stop marker.
        self._submit_lock = threading.Lock()
        # Bytes of states queued and not yet answered (max_queued_write_bytes);
        # blocking submitters wait on `_room`, which the writer signals per batch.
        self._queued_bytes = 0
        self._room = threading.Condition(self._submit_lock)
        self._closed = False
        self._env_closed = False  # set under the exclusive lock, as LMDB closes
        self._close_lock = threading.Lock()
        # One sweep at a time (the sweeper thread's, or a caller's sweep()).
        self._sweep_lock = threading.Lock()
        #: Sweeps completed since the store opened, what they did in all, and when the last one ended
        #: (time.time(); None: none yet): an operator's evidence that retention runs.
        self.sweeps = 0
        self.swept = SweepResult(0, 0, 0, 0)
        self.last_sweep_unix_seconds: float | None = None
        # Sessions indexed as updated before this time (a granule of the
        # updated-time index) were already considered for a quiet keyframe;
        # kept in the meta table, so a restart does not read the whole index.
        self._keyframed_before_nanos = self._meta_int(_KEYFRAMED_BEFORE_KEY)
        # Set by the writer when a write indexes below that bound (the clock stepped back).
        self._keyframe_rescan = False
        self.batch_sizes: Counter[int] = Counter()
        self.commits = 0
        #: Times the writer waited for writers it expected before a commit, and the seconds it waited.
        self.commit_delays = 0
        self.commit_delay_seconds = 0.0
        #: Writes refused because the store was full (the map at its cap, or the disk), and when
        #: that was last logged (monotonic; -inf: never) with the count then.
        self.store_full_refusals = 0
        self._store_full_logged = (-math.inf, 0)
        # What the writer's commit delay goes by (_take_batch): the last commit's
        # duration, and the writers seen around it.
        self._last_commit_seconds = 0.0
        self._expected_writers = 1
        # Set by _submit once _gather_target writes are queued (0: the writer is not waiting).
        self._gather_target = 0
        # Submitters waiting for room under max_queued_write_bytes: while any
        # do, the writers a commit would wait for cannot queue.
        self._room_waiters = 0
        self._gathered = threading.Event()
        # write_on_loop: the loop whose asyncio writes it gathers, what they wait in, the call that
        # hands them to the writer next, and the size of the last batch it handed over.
        self._writes_loop: asyncio.AbstractEventLoop | None = None
        self._loop_ops: list[_Op] = []
        self._loop_run: asyncio.Handle | asyncio.TimerHandle | None = None
        self._loop_gather_began: float | None = None  # monotonic, while the loop's batch waits for more
        self._last_loop_batch = 0
        self._last_hand_over = 0.0  # monotonic
        self._hold_input: Callable[[], object] = _nothing
        self._release_input: Callable[[], object] = _nothing
        # While the input is held: the call that releases it at the latest.
        self._input_held: asyncio.TimerHandle | None = None
        # A piece of the loop's batch that would not fit the writer's batch: its next batch begins with it.
        self._carried: list[_Op] | None = None
        # The highest page the writer has seen committed, and when it may next look for dead readers
        # (_check_readers_on_growth).
        self._last_pgno_seen = 0 if readonly else self._env.info()["last_pgno"]
        self._next_reader_check = 0.0
        self._writer = threading.Thread(target=self._writer_loop, name="ckpt-writer", daemon=True)
        self._sweeper = threading.Thread(target=self._sweeper_loop, name="ckpt-sweeper", daemon=True)
        self._sweeps = sweeper and not readonly
        if readonly:
            self._closing.set()  # every write is refused with Unavailable
        else:
            self._writer.start()
            if self._sweeps:
                self._sweeper.start()

    def _open_lmdb(self, lmdb_dir: Path) -> None:
        self._data_file = lmdb_dir / "data.mdb"
        if self.readonly:
            _retry_map_resized(lambda: self._open_lmdb_once(lmdb_dir))
        else:
            self._open_lmdb_once(lmdb_dir)
        self._page_bytes = int(self._env.stat()["psize"])
        if not self.readonly and self._map_size > self.config.max_map_size_bytes:
            log.warning(
                "%s: the map cannot grow, so writes are refused once its free pages are used: raise"
                " max_map_size_bytes to at least the file's size",
                self._map_cap_reached(),
            )

    def _open_lmdb_once(self, lmdb_dir: Path) -> None:
        config, readonly = self.config, self.readonly
        self._env = lmdb.open(
            str(lmdb_dir),
            map_size=config.map_size_bytes,
            max_dbs=8,
            max_readers=config.max_readers,
            sync=True,
            metasync=config.durability is Durability.SYNC,
            readahead=False,  # random reads of small values; readahead only pollutes the page cache
            subdir=True,
            readonly=readonly,
        )
        try:
            # Open at the size the file already has (it may have grown before).
            self._map_size = max(config.map_size_bytes, self._env.info()["map_size"])
            create = not readonly
            # First: the other tables of a newer layout are not for this code to open, let alone create.
            self._check_layout(writable=create)
            self._frames = self._env.open_db(b"frames", create=create)
            self._sessions = self._env.open_db(b"sessions", create=create)
            self._requests = self._env.open_db(b"requests", create=create)
            self._req_expiry = self._env.open_db(b"req_expiry", create=create)
            self._labels = self._env.open_db(b"labels", create=create)
            self._updated = self._env.open_db(b"updated", create=create)
            with self._env.begin() as txn:
                self._layout1_requests = self._has_layout1_requests(txn)
        except BaseException:
            self._env.close()
            raise

    def _check_layout(self, *, writable: bool) -> None:
        """Refuse a data directory a newer ckpt wrote; stamp an older (or unstamped) one, opened writable, with
        this code's layout.

        The tables' keys and records are this code's own layout: a ckpt rolled
        back to an older release must not read (or write on) a layout it does
        not know. Stores written before the stamp existed are layout 1.
        """
        self._meta: Any = None
        #: Whether the store carries a layout stamp. One without is layout 1 as the
        #: first builds wrote it, whose updated-time index may hold exact update
        #: times (see _index_updated_by_granule): `ckpt verify` accepts those.
        self._layout_stamped = False
        while True:
            try:
                self._meta = meta = self._env.open_db(b"meta", create=writable)
                with self._env.begin(write=writable, db=meta) as txn:
                    raw = txn.get(_LAYOUT_KEY)
                    moved = 0
                    if raw is None and writable:
                        # In the stamp's transaction: a store is stamped only with its index rewritten.
                        moved = _index_updated_by_granule(self._env, txn)
                        txn.put(_LAYOUT_KEY, b"%d" % LAYOUT_VERSION)
                    elif writable and raw is not None and bytes(raw).isdigit() and int(bytes(raw)) < LAYOUT_VERSION:
                        # Layout 1 to 2 rewrites nothing (its request records are read where they are),
                        # but an older ckpt must no longer open the store: it would not find the records
                        # this one writes, and a retry across the downgrade would write twice.
                        txn.put(_LAYOUT_KEY, b"%d" % LAYOUT_VERSION)
                    if writable and txn.get(_LAST_SWEEP_KEY) is None:
                        # The sweep schedule's start (see _first_sweep_delay): once, when first opened.
                        txn.put(_LAST_SWEEP_KEY, b"%d" % time.time_ns())
                break
            except lmdb.NotFoundError:  # read-only, and never stamped: layout 1
                return
            except lmdb.MapFullError:
                # A compacted copy (ckpt backup) has no free pages: its map is
                # full until grown, which the writer does only later.
                if not self._grow_map():
                    raise StoreFull(
                        f"the store is full: {self._data_file} fills max_map_size_bytes"
                        f" ({self.config.max_map_size_bytes}; ckpt serve --max-map-size-bytes), and opening it"
                        " needs a page more: raise it"
                    ) from None
        if moved:
            log.info(
                "%s: the updated-time index held %d entries at exact update times (an older ckpt's); rewritten"
                " under the ~1 s granules this ckpt reads",
                self._data_file,
                moved,
            )
        if raw is None:
            self._layout_stamped = writable
            return
        self._layout_stamped = True
        try:
            found = int(bytes(raw))
        except ValueError:
            raise DataLoss(f"{self._data_file}: the store's layout version {bytes(raw)!r} is not a number") from None
        if found > LAYOUT_VERSION:
            raise IncompatibleStore(
                f"{self._data_file} was written by a newer ckpt (store layout {found}; this ckpt reads layout"
                f" {LAYOUT_VERSION}): run that ckpt or a later one, or restore a backup this version wrote"
            )

    def _has_layout1_requests(self, txn: lmdb.Transaction) -> bool:
        """Whether the requests table holds records keyed as store layout 1 did (session first).

        Such keys sort after every current one (see keys.py). Writes look them up only while
        some remain: no ckpt writes them any more (an older one cannot open this layout),
        and the sweeper expires them within request_id_ttl_seconds of the last one written.
        """
        return bool(txn.cursor(db=self._requests).set_range(keys.LAYOUT1_REQUEST_KEYS_START))

    def _meta_int(self, key: bytes) -> int:
        """A number the meta table holds under ``key``; 0 if it holds none (or an unreadable one)."""
        if self._meta is None:
            return 0
        with self._read() as txn:
            found = txn.get(key, db=self._meta)
        if found is None:
            return 0
        raw = bytes(found)
        try:
            return int(raw)
        except ValueError:
            log.warning("the meta table's %r is not a number (%r): taken as 0", key, raw)
            return 0

    def _keep_keyframe_bound_op(self, bound: int) -> _Op:
        def apply(batch: _Batch, txn: lmdb.Transaction) -> None:
            # Not if a write since indexed below the bound (see _append): the next sweep, or a restarted
            # store, must read the whole index.
            if not self._keyframe_rescan:
                txn.put(_KEYFRAMED_BEFORE_KEY, b"%d" % bound, db=self._meta)

        return _Op(apply)

    # -- lifecycle ---------------------------------------------------------

    def close(self) -> None:
        """Stop accepting writes, commit every queued one, close LMDB."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        with self._submit_lock:
            self._closing.set()
            if self._loop_ops:  # a batch gathering on the loop (write_on_loop) commits too
                ops, self._loop_ops = self._loop_ops, []
                self._queue.put(ops)
            self._queue.put(None)
            self._gathered.set()  # a writer waiting for more writes commits what it has
            self._room.notify_all()  # writes waiting for room are refused now
        if not self.readonly:
            self._writer.join()
        if self._sweeps:
            self._sweeper.join()
        with self._rw.exclusive():
            self._env.close()
            self._env_closed = True
        if self._lock_file is not None:
            self._lock_file.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writes --------------------------------------------------------------

    def put(
        self,
        session_id: str,
        state: bytes,
        *,
        mode: WriteMode = WriteMode.REPLACE,
        expected_version: int | None = None,
        request_id: str = "",
        labels: dict[str, str] | None = None,
    ) -> PutResult:
        """Write the next version of a session; returns once it is committed."""
        return self.write(PutRequest(session_id, state, mode, expected_version, request_id, dict(labels or {})))

    def write(self, request: PutRequest) -> PutResult:
        """:meth:`put` taking a PutRequest: returns once it is committed."""
        op = self._put_op(request)
        # Not the main thread's: a signal handler raising there (Ctrl-C, an
        # alarm) can leave it between queueing and waiting, or between its
        # wake and the next's, where no handler of ours runs; the callers in
        # line after it would never be woken. Other threads get no signals.
        op.wakes_in_turn = threading.current_thread() is not threading.main_thread()
        result: PutResult = self._submit(op).wait()
        return result

    async def awrite(self, request: PutRequest) -> PutResult:
        """:meth:`write` for asyncio: awaits the commit without blocking the event loop."""
        result: PutResult = await (await self.aenqueue(request))
        return result

    async def aenqueue(self, request: PutRequest, *, wait_for_room: bool = False) -> asyncio.Future[PutResult]:
        """:meth:`asubmit`, with a large MERGE patch checked off the event loop; ``wait_for_room``
        waits out Overloaded (polling, backing off to 50 ms) instead of raising it.

        The patch check reads every field in Python (~1 us each): on the loop, one
        16 MiB patch of small fields held every other call of a sidecar for ~10 s.
        """
        loop = asyncio.get_running_loop()
        state = request.state
        if (
            request.mode == WriteMode.MERGE
            and isinstance(state, (bytes, bytearray, memoryview))
            and len(state) >= OFF_LOOP_PATCH_BYTES
        ):
            op = await loop.run_in_executor(None, self._put_op, request)
        else:
            op = self._put_op(request)
        delay_seconds = 0.001
        while True:
            try:
                return self._asubmit_op(op, loop)
            except Overloaded:
                if not wait_for_room:
                    raise
                await asyncio.sleep(delay_seconds)
                delay_seconds = min(2 * delay_seconds, 0.05)

    def asubmit(self, request: PutRequest) -> asyncio.Future[PutResult]:
        """:meth:`submit` for asyncio: queue a write; the future (on the running loop) resolves once committed.

        Every write the writer commits together for one loop is resolved with
        one wake-up of that loop. Validation errors raise here, and so does
        Overloaded when ``max_queued_write_bytes`` of writes are already
        queued (the event loop must not wait for room). Cancelling the
        future does not withdraw the write: once queued it commits (retry with
        the same ``request_id`` to learn its outcome).
        """
        return self._asubmit_op(self._put_op(request), asyncio.get_running_loop())

    def _asubmit_op(self, op: _Op, loop: asyncio.AbstractEventLoop) -> asyncio.Future[PutResult]:
        op.loop = loop
        future: asyncio.Future[PutResult] = loop.create_future()
        op.afuture = future
        # Overloaded leaves it unqueued: it may be submitted again.
        if loop is self._writes_loop:
            self._submit_on_loop(op, loop)
        else:
            self._submit(op, wait=False)
        return future

    def write_on_loop(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        hold_input: Callable[[], object] = _nothing,
        release_input: Callable[[], object] = _nothing,
    ) -> None:
        """Gather the asyncio writes submitted on ``loop`` there, and hand them to the writer a batch at a time.

        For a process whose event loop does little but take writes (the
        sidecar's store process). Each write used to be queued for the writer
        thread as it came, the loop and the writer taking turns on the GIL
        while the loop read the next requests and the writer applied the last.
        Now the loop keeps a batch's writes until it is complete, hands them
        over in one piece, and reads no new requests (``hold_input()``) until
        the writer's commit answers them or ``_HOLD_INPUT_MAX_SECONDS`` pass
        (``release_input()``), so that a commit's work has the GIL to itself
        and the loop, which would wake for each request, sleeps instead.

        When concurrent writes come (the last batch had more than one), a
        batch closes three of the last commit's durations (at most
        ``max_commit_delay_seconds``) after the last batch was handed over, or
        at once if that time has passed, with the input held until then: the
        writers a commit answers come back in a burst, and the writes read
        only after a commit (the input held) have waited through it already.
        The loop then reads what came meanwhile, and hands the batch over.
        A lone writer's write goes to the writer at the end of the loop's
        turn, the input not held for it. A session's writes through the loop
        commit in the order they were submitted. Call from the loop's thread,
        before its first write.
        """
        if self.readonly:
            raise ValueError("a read-only store takes no writes")
        self._writes_loop = loop
        self._hold_input = hold_input
        self._release_input = release_input

    def _submit_on_loop(self, op: _Op, loop: asyncio.AbstractEventLoop) -> None:
        """Keep an asyncio write for its loop's next batch (write_on_loop); Overloaded past max_queued_write_bytes."""
        with self._room:
            self._admit(op, wait=False)
            self._loop_ops.append(op)  # under the lock: close() hands over what it finds
            count = len(self._loop_ops)
        if self._loop_run is not None:
            if count >= self.config.max_batch_writes and self._loop_gather_began is not None:
                self._loop_run.cancel()  # a full batch goes now
                self._loop_run = loop.call_soon(self._hand_over_loop_ops)
            return
        if self._last_loop_batch < 2:
            # A lone writer's: after this turn of the loop (the writes it reads meanwhile join it).
            self._loop_run = loop.call_soon(self._hand_over_loop_ops)
            return
        # Concurrent writers: the batch closes a while after the last was handed over. Counted from
        # then, not from now: writes read only after the last commit (the input held) waited for it.
        gather = min(self.config.max_commit_delay_seconds, _LOOP_GATHER_COMMITS * self._last_commit_seconds)
        now = time.monotonic()
        delay = gather - (now - self._last_hand_over)
        if delay > 0:
            self._loop_gather_began = now
            self._loop_run = loop.call_later(delay, self._close_loop_batch)
            self._hold(loop)
        else:
            self._close_loop_batch()

    def _close_loop_batch(self) -> None:
        """Read what came while the batch gathered (the input held), then hand the batch over."""
        self._release()
        assert self._writes_loop is not None
        # The loop polls for I/O between this turn's callbacks and the next turn's: one turn more.
        self._loop_run = self._writes_loop.call_soon(self._hand_over_after_reading)

    def _hand_over_after_reading(self) -> None:
        assert self._writes_loop is not None
        self._loop_run = self._writes_loop.call_soon(self._hand_over_loop_ops)

    def _hand_over_loop_ops(self) -> None:
        """The loop's batch to the writer, in pieces of at most max_batch_writes (write_on_loop)."""
        self._loop_run = None
        self._last_hand_over = now = time.monotonic()
        if self._loop_gather_began is not None:
            self.commit_delays += 1
            self.commit_delay_seconds += now - self._loop_gather_began
            self._loop_gather_began = None
        with self._room:
            ops, self._loop_ops = self._loop_ops, []
            limit = self.config.max_batch_writes
            for start in range(0, len(ops), limit):
                self._queue.put(ops[start : start + limit])
        self._last_loop_batch = len(ops)
        if len(ops) < 2:  # a lone writer's: nobody else's requests to keep off the GIL
            self._release()
            return
        assert self._writes_loop is not None
        self._hold(self._writes_loop)
        # The writer answers in order: once the last is answered, so are the others.
        last = ops[-1].afuture
        assert last is not None
        last.add_done_callback(lambda _: self._release())

    def _hold(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._input_held is None:
            self._hold_input()
        else:
            self._input_held.cancel()
        # Not for ever: a commit stalled on the disk, or on another process's write lock, must
        # not stop the loop from refusing writes past the backlog bound or serving reads.
        self._input_held = loop.call_later(_HOLD_INPUT_MAX_SECONDS, self._release)

    def _release(self) -> None:
        if self._input_held is not None:
            self._input_held.cancel()
            self._input_held = None
            self._release_input()

    def submit(self, request: PutRequest) -> Future[PutResult]:
        """Queue a write without waiting; the future resolves once it is committed.

        Validation errors (ids, sizes, labels, a MERGE patch that is not
        well-formed) raise here; errors found in the transaction (version
        conflicts, a full store) come from the future. The future cannot be
        cancelled: once queued, the write commits. Waits for room first when
        ``max_queued_write_bytes`` of writes are queued.
        """
        op = self._put_op(request)
        op.future = Future()
        # Running from the start: a queued write cannot be withdrawn (it
        # commits), so cancel() must say so rather than succeed and leave
        # the writer a cancelled future to resolve.
        op.future.set_running_or_notify_cancel()
        self._submit(op)
        return op.future

    def put_many(self, requests: list[PutRequest]) -> list[PutResult | StoreError]:
        """Write many versions (in order per session); one result or error each.

        All are queued at once, so they share group commits.
        """
        # Every request is checked before any is queued: one that raises something other than a
        # StoreError (a label that is not a str, say) then leaves nothing written, where it used to
        # escape after the writes before it had been queued, and committed.
        ops: list[_Op | StoreError] = []
        for req in requests:
            try:
                ops.append(self._put_op(req))
            except StoreError as exc:
                ops.append(exc)
        queued = [item for item in ops if isinstance(item, _Op)]
        for put_op in queued:
            put_op.releases_caller = put_op is queued[-1]
        for i, item in enumerate(ops):
            if isinstance(item, _Op):
                try:
                    self._submit(item)
                except StoreError as exc:
                    ops[i] = exc
        out: list[PutResult | StoreError] = []
        for op in ops:
            if isinstance(op, StoreError):
                out.append(op)
                continue
            try:
                out.append(op.wait())
            except StoreError as exc:
                out.append(exc)
        return out

    def fork(
        self, session_id: str, version: int, new_session_id: str, *, labels: dict[str, str] | None = None
    ) -> SessionInfo:
        """A new session whose version 1 is ``version`` (0 = latest) of another."""
        sid = keys.session_key(session_id)
        new_sid = keys.session_key(new_session_id, field="new_session_id")
        labels = dict(labels or {})
        keys.check_labels(labels)
        _check_version_arg(version)

        def apply(batch: _Batch, txn: lmdb.Transaction) -> SessionInfo:
            if txn.get(new_sid, db=self._sessions) is not None:
                raise AlreadyExists(f"new_session_id {new_session_id!r} already exists")
            state, _ = self._read_state(txn, sid, session_id, version)
            src = _record(txn.get(sid, db=self._sessions))
            resolved = version or src.head_version
            encoder = self._new_encoder()
            frame = encoder.replace(state)
            now = time.time_ns()
            rec = records_pb2.SessionRecord(
                created_unix_nanos=now, forked_from_session_id=session_id, forked_from_version=resolved
            )
            info = self._append(txn, new_sid, rec, frame, WriteMode.FORK, labels, now, old_updated=None)
            encoder.commit()
            if self.shared:
                self._encoder_created[encoder] = now
            self._encoders.put(new_sid, encoder)  # a write later in this batch continues this chain
            batch.touched_encoders.add(new_sid)
            snapshot = encoder.snapshot()
            kept = self._hold_encoder(batch, new_sid, encoder)  # the closure must not keep `encoder` itself
            batch.after_commit.append(lambda: self._after_write(new_sid, kept, snapshot, info))
            return _session_info(new_session_id, rec)

        return self._submit(_Op(apply, fails_clean=True)).wait()  # type: ignore[no-any-return]

    def delete_session(self, session_id: str) -> int:
        """Remove a session, every version and every index entry; returns versions removed."""
        sid = keys.session_key(session_id)

        def apply(batch: _Batch, txn: lmdb.Transaction) -> int:
            raw = txn.get(sid, db=self._sessions)
            if raw is None:
                raise NotFound(f"session {session_id!r} does not exist")
            try:
                rec: records_pb2.SessionRecord | None = _record(raw)
            except DataLoss:
                rec = None  # damaged: deleting it is how an operator starts the session over
            removed, _ = self._delete_frames(txn, sid, below=None)
            if self._layout1_requests:
                self._delete_layout1_requests(txn, sid)
            if rec is not None:
                for key, value in rec.labels.items():
                    txn.delete(keys.label_key(key, value, sid), db=self._labels)
                txn.delete(keys.updated_key(rec.updated_unix_nanos, sid), db=self._updated)
            else:  # which index entries are its own is unknown: look through both indexes
                self._delete_index_entries(txn, sid)
            txn.delete(sid, db=self._sessions)
            # Dropped now, not only after the commit: a fork onto this id later
            # in the batch starts at version 1 again, and a write after it
            # would take a cached encoder of the deleted session at version 1
            # for the fork's.
            self._encoders.discard(sid)
            batch.touched_encoders.add(sid)
            batch.after_commit.append(lambda: self._forget(sid))
            return removed

        return self._submit(_Op(apply, fails_clean=True)).wait()  # type: ignore[no-any-return]

    # -- reads -----------------------------------------------------------------

    def get(self, session_id: str, version: int = 0, *, use_cache: bool = True) -> GetResult:
        """The state of ``version`` (0 = latest), verified.

        ``use_cache=False`` reads LMDB even if the state cache holds the
        answer: for a caller that just missed in :meth:`get_cached`.
        """
        sid = keys.session_key(session_id)
        _check_version_arg(version)
        if use_cache and (hit := self._cached(sid, version)) is not None:
            return hit
        with self._read() as txn:
            state, info = self._read_state(txn, sid, session_id, version)
        return GetResult(info.version, state, info)

    def get_cached(self, session_id: str, version: int = 0) -> GetResult | None:
        """:meth:`get` if the state cache holds the answer, else None: never touches LMDB.

        For callers that must not block (an event loop): on None, call
        ``get(..., use_cache=False)`` off the loop.
        """
        sid = keys.session_key(session_id)
        _check_version_arg(version)
        return self._cached(sid, version)

    def _cached(self, sid: bytes, version: int) -> GetResult | None:
        self._check_open_for_reads()
        cached = self._states.get(sid)
        if cached is None or not (version == 0 or version == cached.info.version):
            return None
        if self.shared and not self._still_head(sid, cached.info):
            return None  # another process wrote (or deleted) the session since
        return GetResult(cached.info.version, cached.state.tobytes(), cached.info)

    def _still_head(self, sid: bytes, info: VersionInfo) -> bool:
        """Whether ``info`` is the session's head in LMDB now (see :meth:`is_head`)."""
        return self._is_head(sid, info.version, info.created_unix_nanos, full_frame=info.frame_kind is FrameKind.FULL)

    def is_head(self, session_id: str, version: int, created_unix_nanos: int, *, full_frame: bool) -> bool:
        """Whether the version written at ``created_unix_nanos`` (and stored as a FULL frame, or not)
        is the session's committed head now: one read transaction, nothing decoded.

        For a cache outside this store (the gRPC process's replies to Gets),
        which must never answer with a state that is not the committed head.
        """
        return self._is_head(keys.session_key(session_id), version, created_unix_nanos, full_frame=full_frame)

    def _is_head(self, sid: bytes, version: int, created_unix_nanos: int, *, full_frame: bool) -> bool:
        with self._read() as txn:
            raw = txn.get(sid, db=self._sessions)
            if raw is None:
                return False
            rec = _record(raw)
        # Every write sets the record's updated time to its version's creation
        # time, so a session deleted and written again to the same version differs.
        if rec.head_version != version or rec.updated_unix_nanos != created_unix_nanos:
            return False
        # A quiet keyframe (another process's sweeper) rewrites the head's frame,
        # not its state: the cached metadata would still say DELTA and its size.
        return rec.chain_start_version != version or full_frame

    def session(self, session_id: str) -> SessionInfo:
        sid = keys.session_key(session_id)
        with self._read() as txn:
            raw = txn.get(sid, db=self._sessions)
            if raw is None:
                raise NotFound(f"session {session_id!r} does not exist")
            return _session_info(session_id, _record(raw))

    def list_versions(
        self, session_id: str, *, page_size: int = 0, page_token: str = "", max_page_bytes: int = 0
    ) -> tuple[list[VersionInfo], str]:
        """A page of a session's versions, newest first, and the next page's token ("" at the end).

        ``max_page_bytes`` (0: no limit) ends a page early rather than pass
        that many bytes encoded (an upper bound: :func:`version_info_bytes`),
        so that a page fits a size-limited reply; a page holds one version at least.
        """
        sid = keys.session_key(session_id)
        size = _page_size(page_size)
        with self._read() as txn:
            raw = txn.get(sid, db=self._sessions)
            if raw is None:
                raise NotFound(f"session {session_id!r} does not exist")
            rec = _record(raw)
            # The session as created then: a token of one deleted since must not
            # resume the versions of a new session under the same id.
            scope = sid + keys.SEP + str(rec.created_unix_nanos).encode()
            start = _decode_token(page_token, b"v", scope)
            top = rec.head_version
            if start:
                if not start.isdigit() or len(start) > 20:  # a u64 has at most 20 digits
                    raise InvalidArgument(
                        f"page_token {keys.quoted(page_token)} is not a token this server issued for this listing"
                    )
                top = min(top, int(start))
            out: list[VersionInfo] = []
            if top < rec.first_version:
                return out, ""
            cur = txn.cursor(db=self._frames)
            # Versions first_version..head are consecutive keys: one that is not
            # there is damage, named as Get names it, not quietly left out.
            expected = top
            page_bytes = 0
            if cur.set_key(keys.frame_key(sid, top)):
                for key, value in _backward(cur):
                    if not key.startswith(sid + keys.SEP) or expected < rec.first_version:
                        break
                    version = keys.frame_version(key, sid)
                    if version != expected:
                        break
                    if len(out) == size:
                        return out, _encode_token(b"v", scope, str(version).encode())
                    info = _version_info(session_id, version, value)
                    if max_page_bytes:
                        page_bytes += version_info_bytes(info)
                        if out and page_bytes > max_page_bytes:
                            return out, _encode_token(b"v", scope, str(version).encode())
                    out.append(info)
                    expected -= 1
            if expected >= rec.first_version:
                raise DataLoss(f"session {session_id!r}: the frame of version {expected} is missing")
            return out, ""

    def list_sessions(
        self,
        *,
        page_size: int = 0,
        page_token: str = "",
        label_filter: dict[str, str] | None = None,
        updated_after_nanos: int | None = None,
        updated_before_nanos: int | None = None,
        max_page_bytes: int = 0,
    ) -> tuple[list[SessionInfo], str]:
        """A page of sessions matching every filter, and the next page's token.

        Uses the label index (first label of the filter) or the updated-time
        index, so filtered listings do not scan every session. A page may hold
        fewer than ``page_size`` sessions when many candidates did not match;
        keep following ``next_page_token`` until it is empty. ``max_page_bytes``
        as for :meth:`list_versions` (:func:`session_info_bytes`).
        """
        size = _page_size(page_size)
        labels = dict(label_filter or {})
        keys.check_labels(labels, field="label_filter")
        for name, nanos in (
            ("updated_after_nanos", updated_after_nanos),
            ("updated_before_nanos", updated_before_nanos),
        ):
            if nanos is not None and nanos > keys.MAX_TIME_NANOS:
                raise InvalidArgument(f"{name} is {nanos}; the latest time the store indexes is {keys.MAX_TIME_NANOS}")
        after = updated_after_nanos if updated_after_nanos is not None else 0
        before = updated_before_nanos if updated_before_nanos is not None else 2**63
        # Swapped bounds are a mistake, not a listing: say so rather than list none.
        if updated_after_nanos is not None and updated_before_nanos is not None and after > before:
            raise InvalidArgument(
                f"updated_after ({updated_after_nanos} ns) is later than updated_before ({updated_before_nanos} ns):"
                " no session could match; the listing is of sessions last written at or after updated_after"
                " and before updated_before"
            )
        kind = b"s" + (
            b"l" if labels else b"t" if updated_after_nanos is not None or updated_before_nanos is not None else b""
        )
        # A token resumes the listing it came from only: same index, same filters.
        scope = repr((sorted(labels.items()), updated_after_nanos, updated_before_nanos)).encode()
        resume = _decode_token(page_token, kind, scope)
        if labels:
            first_key = min(labels)
            prefix = keys.label_prefix(first_key, labels[first_key])
            db, lo, hi = self._labels, prefix, prefix + b"\xff"

            def sid_of(key: bytes) -> bytes:
                return key[len(prefix) :]
        elif updated_after_nanos is not None or updated_before_nanos is not None:
            # Index entries hold times rounded down (keys.updated_key): start at
            # the granule holding ``after``; the exact check below does the rest.
            db, lo, hi = self._updated, keys.updated_key(after, b""), keys.time_key(before, b"")

            def sid_of(key: bytes) -> bytes:
                return key[8:]
        else:
            db, lo, hi = self._sessions, b"", b"\xff" * (keys.MAX_SESSION_ID_BYTES + 1)

            def sid_of(key: bytes) -> bytes:
                return key

        out: list[SessionInfo] = []
        with self._read() as txn:
            cur = txn.cursor(db=db)
            if not cur.set_range(max(lo, resume)):
                return out, ""
            scanned = page_bytes = 0
            for key in _forward_keys(cur):
                if key >= hi:
                    return out, ""
                if len(out) == size or scanned == _MAX_SCAN_PER_PAGE:
                    # The next page resumes *at* this key (set_range): it was not returned yet.
                    return out, _encode_token(kind, scope, key)
                scanned += 1
                sid = sid_of(key)
                raw = txn.get(sid, db=self._sessions)
                if raw is None:
                    continue
                try:
                    session_id = sid.decode()
                    rec = _record(raw)
                except (DataLoss, UnicodeDecodeError) as exc:
                    # One damaged session must not hide the others; `ckpt verify` names it.
                    log.warning("listing skipped session %r: %s", _printable(sid), exc)
                    continue
                if not after <= rec.updated_unix_nanos < before:
                    continue
                if any(rec.labels.get(k) != v for k, v in labels.items()):
                    continue
                info = _session_info(session_id, rec)
                if max_page_bytes:
                    page_bytes += session_info_bytes(info)
                    if out and page_bytes > max_page_bytes:
                        return out, _encode_token(kind, scope, key)
                out.append(info)
        return out, ""

    # -- retention -----------------------------------------------------------

    def sweep(self, *, now_nanos: int | None = None) -> SweepResult:
        """Apply retention to every session and expire old request ids, now.

        The background sweeper calls this every sweep_interval_seconds. Each
        chunk of sessions is one write operation, so writes keep flowing.
        """
        now = time.time_ns() if now_nanos is None else now_nanos
        with self._sweep_lock:
            result = self._sweep(now)
            self.swept += result
            self.sweeps += 1
            self.last_sweep_unix_seconds = time.time()
        return result

    def _sweep(self, now: int) -> SweepResult:
        pruned = removed = expired = 0
        began = time.time_ns()  # not ``now``, which a caller may set ahead
        while True:  # request ids first: they expire even if a session cannot be pruned
            n = self._submit(_Op(self._expire_requests_op(now))).wait()
            expired += n
            if n < _EXPIRE_CHUNK:
                break
        if expired and self._layout1_requests:
            # Read once committed: while one is left, writes must look under its key too.
            with self._read() as txn:
                self._layout1_requests = self._has_layout1_requests(txn)
        if self.config.retention.enabled:
            after = b""
            while True:
                with self._read() as txn:
                    chunk = _keys_after(txn.cursor(db=self._sessions), after, _SWEEP_CHUNK)
                if not chunk:
                    break
                after = chunk[-1]
                counts = self._submit(_Op(self._prune_op(chunk, now))).wait()
                pruned += counts[0]
                removed += counts[1]
        keyframes = 0
        if self.config.keyframe_after_quiet_seconds is not None:
            keyframes = self._keyframe_quiet_sessions(now - int(self.config.keyframe_after_quiet_seconds * 1e9))
        result = SweepResult(pruned, removed, expired, keyframes)
        if result.changed and self._meta is not None:
            # The schedule a restarted store goes on with (_first_sweep_delay). Kept only by a sweep that
            # wrote anyway: an idle store's sweeps commit nothing, and after a restart its next sweep,
            # due at once, finds nothing again.
            self._submit(_Op(self._keep_sweep_time_op(began))).wait()
        return result

    def _keep_sweep_time_op(self, began_nanos: int) -> Callable[[_Batch, lmdb.Transaction], None]:
        def apply(batch: _Batch, txn: lmdb.Transaction) -> None:
            txn.put(_LAST_SWEEP_KEY, b"%d" % began_nanos, db=self._meta)

        return apply

    def _keyframe_quiet_sessions(self, quiet_since: int) -> int:
        """Give every session quiet since ``quiet_since`` a FULL head frame; how many were rewritten.

        Only the updated-time index entries between the last sweep's bound and
        this one's are read: a session written since moved its entry past the
        bound, and comes up again once it is quiet again. The bound is kept in
        the meta table, so a restarted store goes on from it (sessions that
        went quiet while it was down are past it); the first sweep of a store
        that never swept reads the whole index. Sessions already ending in a
        FULL frame cost a record read each.
        """
        bound = keys.updated_granule(quiet_since)  # entries below it were all updated before quiet_since
        # The wall clock stepped back: sessions written since index below the
        # last bound and would be skipped. Read the whole index again, as the
        # first sweep of a new store does. A step no sweep sees (shorter than
        # the sweep interval) is caught by the writes it makes (_append).
        rescan = self._keyframe_rescan or bound < self._keyframed_before_nanos
        self._keyframe_rescan = False
        end = keys.time_key(bound, b"")
        # A bare time prefix is no index key (each ends in a session id): the scan starts at that time.
        after = keys.time_key(0 if rescan else self._keyframed_before_nanos, b"")
        written = 0
        looked = False
        while after < end:
            with self._read() as txn:
                chunk = [k for k in _keys_after(txn.cursor(db=self._updated), after, _SWEEP_CHUNK) if k < end]
            if not chunk:
                break
            looked = True
            sids = [key[8:] for key in chunk]
            while sids:
                done, n = self._submit(_Op(self._keyframe_op(sids, quiet_since))).wait()
                written += done
                sids = sids[n:]
            after = chunk[-1]
        # Never past the present (sweep(now_nanos=) may be ahead of it): a
        # session written later must index at or after the bound.
        bound = min(bound, keys.updated_granule(time.time_ns()))
        if not rescan and bound <= self._keyframed_before_nanos:
            return written
        # Kept for a restart only when entries were read: an idle store does
        # not commit every sweep, and a restart rereads no more than the
        # entries since the last sweep that found any (none, unless the clock
        # stepped back: then they should be read).
        if looked or rescan:
            self._submit(self._keep_keyframe_bound_op(bound)).wait()
        self._keyframed_before_nanos = bound
        return written

    def _keyframe_op(
        self, sids: list[bytes], quiet_since: int
    ) -> Callable[[_Batch, lmdb.Transaction], tuple[int, int]]:
        """Rewrite quiet sessions' DELTA/PATCH head frames as FULL frames: (rewritten, sessions looked at).

        Stops after _KEYFRAME_OP_BYTES of states, so that writes queued behind
        it wait for a bounded amount of work; the sweeper submits the rest.
        """

        def apply(batch: _Batch, txn: lmdb.Transaction) -> tuple[int, int]:
            written = state_bytes = looked = 0
            for sid in sids:
                if state_bytes >= _KEYFRAME_OP_BYTES:
                    break
                looked += 1
                raw = txn.get(sid, db=self._sessions)
                if raw is None:
                    continue
                session_id = _printable(sid)
                try:
                    rec = _record(raw)
                    head = rec.head_version
                    if rec.updated_unix_nanos >= quiet_since or not head or rec.chain_start_version == head:
                        continue  # written since, or its head is a chain start already
                    chain = self._chain_frames(txn, sid, session_id, rec, head)
                    state = decode(chain)
                    key = keys.frame_key(sid, head)
                    stored = txn.get(key, db=self._frames)
                    if stored is None:
                        raise DataLoss(f"session {session_id!r}: frame of version {head} is missing")
                    value = bytes(stored)
                    meta_end = _META_LEN.size + _META_LEN.unpack_from(value)[0]
                except Exception as exc:  # only reads so far: keep the session as it is (verify names damage)
                    log.warning("keyframe skipped session %r: %s", session_id, exc)
                    continue
                frame = keyframe(state, version=head, policy=self.config.chain_policy)
                new_value = value[:meta_end] + frame.data
                txn.put(key, new_value, db=self._frames)
                rec.stored_bytes += frame.stored_bytes - (len(value) - meta_end)
                rec.chain_start_version = head
                txn.put(sid, rec.SerializeToString(), db=self._sessions)
                # The cached encoder continues the old chain's zstd stream; the
                # session's next write must start a new one after this frame.
                # Dropped now for later writes in this batch, and again after
                # the commit: an earlier write of this batch puts its encoder
                # (the old stream's) back in the cache then.
                self._encoders.discard(sid)
                batch.after_commit.append(functools.partial(self._encoders.discard, sid))
                batch.touched_encoders.add(sid)
                info = _version_info(session_id, head, new_value)
                batch.after_commit.append(functools.partial(self._states.restate, sid, info))
                written += 1
                state_bytes += len(state)
            return written, looked

        return apply

    # -- introspection -------------------------------------------------------

    @property
    def cache_hits(self) -> int:
        return self._states.hits

    @property
    def memory_bytes(self) -> dict[str, int]:
        """What the state cache and the cached encoders hold (the encoders' by estimate)."""
        return {"state_cache": self._states.size_bytes, "encoder_cache": self._encoders.weight}

    @property
    def queued_write_bytes(self) -> int:
        """Bytes of states queued for the writer and not yet answered."""
        return self._queued_bytes

    @property
    def cache_misses(self) -> int:
        return self._states.misses

    def stats(self) -> dict[str, Any]:
        with self._read() as txn:  # under the lock a map resize takes: info() reads the map
            info = self._env.info()
            sessions, versions = self._entry_counts(txn)
        return {
            "sessions": sessions,
            "versions": versions,
            "map_size_bytes": info["map_size"],
            "used_bytes": (info["last_pgno"] + 1) * self._page_bytes,
            "commits": self.commits,
            "map_resizes": self.map_resizes,
            "batch_sizes": dict(self.batch_sizes),
            "commit_delays": self.commit_delays,
            "commit_delay_seconds": self.commit_delay_seconds,
            "state_cache_hits": self._states.hits,
            "state_cache_misses": self._states.misses,
            "state_cache_bytes": self._states.size_bytes,
            # Read off the writer's LRU without its thread: two ints, each read atomically.
            "encoders_cached": len(self._encoders),
            "encoder_cache_bytes": self._encoders.weight,
            "queued_write_bytes": self._queued_bytes,
        }

    def _entry_counts(self, txn: lmdb.Transaction) -> tuple[int, int]:
        """Sessions and stored versions in ``txn``'s snapshot."""
        return txn.stat(self._sessions)["entries"], txn.stat(self._frames)["entries"]

    def copy_to(self, lmdb_dir: Path) -> tuple[int, int]:
        """Write a compacted copy of the LMDB environment into ``lmdb_dir`` (an existing directory without a
        data.mdb), as of one read snapshot; that snapshot's (sessions, versions).

        For backups (sidecar/backup.py, which also makes the copy durable).
        The snapshot holds every write committed before it began and nothing
        of a later one. While the copy runs, the writer cannot reuse pages
        freed after the snapshot, so a store written meanwhile grows by what
        it writes; in this process a map resize waits for the copy to end.
        """
        with self._read() as txn:
            sessions, versions = self._entry_counts(txn)
            try:
                # compact: free pages are left out, so the copy is the size of the live data.
                self._env.copy(str(lmdb_dir), compact=True, txn=txn)
            except _LMDB_DAMAGE:
                raise  # the source is damaged: DataLoss, from _read
            except lmdb.Error as exc:
                # LMDB reports a write that failed (no space, a file size limit) and some page damage
                # alike, e.g. as EINVAL or MDB_INCOMPATIBLE.
                raise OSError(
                    f"copying the store failed: {exc} (the copy could not be written, or the"
                    " store is damaged: `ckpt verify` tells which)"
                ) from None
        return sessions, versions

    def frames_of(self, session_id: str) -> tuple[SessionInfo, list[tuple[int, VersionInfo | DataLoss, bytes]]]:
        """A session's record and every stored frame, oldest first, read in one transaction (for tools).

        One snapshot, so the frames match the record even beside a writer. A
        version whose metadata or frame header is corrupt comes with the
        DataLoss saying so instead of its VersionInfo: the tools report it
        rather than stop.
        """
        sid = keys.session_key(session_id)
        frames: list[tuple[int, VersionInfo | DataLoss, bytes]] = []
        with self._read() as txn:
            raw = txn.get(sid, db=self._sessions)
            if raw is None:
                raise NotFound(f"session {session_id!r} does not exist")
            info = _session_info(session_id, _record(raw))
            cur = txn.cursor(db=self._frames)
            if cur.set_range(sid + keys.SEP):
                for key, value in _forward(cur):
                    if not key.startswith(sid + keys.SEP):
                        break
                    version = keys.frame_version(key, sid)
                    try:
                        vinfo: VersionInfo | DataLoss = _version_info(session_id, version, value)
                    except DataLoss as exc:
                        vinfo = exc
                    frames.append((version, vinfo, bytes(_frame_of(value))))
        return info, frames

    def session_ids(self) -> Iterator[str]:
        """Every session id, in key order; read a chunk at a time, holding no transaction between chunks."""
        after = b""
        while True:
            with self._read() as txn:
                cur = txn.cursor(db=self._sessions)
                chunk = _keys_after(cur, after, _SWEEP_CHUNK)
            # A key that is not UTF-8 is damage: yielded undecoded-as-surrogates, so
            # that verify names it (every lookup of it is refused as not UTF-8).
            yield from (k.decode("utf-8", "surrogateescape") for k in chunk)
            if len(chunk) < _SWEEP_CHUNK:
                return
            after = chunk[-1]

    # -- write operations (run on the writer thread, inside a transaction) --

    def _put_op(self, req: PutRequest) -> _Op:
        sid = keys.session_key(req.session_id)
        try:
            mode = WriteMode(req.mode)
        except ValueError:
            raise InvalidArgument(f"mode must be REPLACE (1) or MERGE (2), got {req.mode!r}") from None
        if mode is WriteMode.FORK:
            raise InvalidArgument("mode must be REPLACE (1) or MERGE (2), got FORK (3)")
        if not isinstance(req.state, (bytes, bytearray, memoryview)):
            raise InvalidArgument(f"state must be bytes, not {type(req.state).__name__}")
        if len(req.state) > self.config.max_state_bytes:
            raise StateTooLarge(
                f"state is {len(req.state)} bytes; the limit (max_state_bytes) is {self.config.max_state_bytes}"
            )
        if not isinstance(req.labels, dict):
            raise InvalidArgument(f"labels must be a dict of str to str, not {type(req.labels).__name__}")
        keys.check_labels(req.labels)
        if req.expected_version is not None and (
            isinstance(req.expected_version, bool) or not isinstance(req.expected_version, int)
        ):
            raise InvalidArgument(f"expected_version must be an int or None, not {type(req.expected_version).__name__}")
        if not isinstance(req.request_id, str):
            raise InvalidArgument(f"request_id must be a str, not {type(req.request_id).__name__}")
        if req.expected_version is not None and not 0 <= req.expected_version < 1 << 64:
            raise InvalidArgument(f"expected_version must be in 0..2**64-1 (a uint64), got {req.expected_version}")
        rid_key = keys.request_key(sid, req.request_id) if req.request_id else None
        asked = _write_fingerprint(req, mode) if rid_key is not None else 0
        state = bytes(req.state)
        if mode is WriteMode.MERGE:
            # Checked here, on the caller's thread: it needs no state, and the
            # writer thread is the store's one serial path.
            try:
                check_patch(state, message_type=self._merge_type)
            except WireFormatError as exc:
                raise InvalidArgument(f"state is not a valid MERGE patch: {exc}") from None

        def apply(batch: _Batch, txn: lmdb.Transaction) -> PutResult:
            raw = txn.get(sid, db=self._sessions)
            rec = _record(raw) if raw is not None else None
            expired_rid: records_pb2.RequestRecord | None = None
            if rid_key is not None:
                done, live = self._remembered(txn, rid_key, rec, req)
                if live:
                    assert done is not None
                    if done.write_xxh3 and done.write_xxh3 != asked:
                        raise InvalidArgument(
                            f"request_id {req.request_id!r} was used for a different write to session"
                            f" {req.session_id!r} (it made version {done.version}); a retry must resend the same"
                            " write, and a new write needs a new request_id"
                        )
                    return PutResult(
                        done.version, done.stored_bytes, FrameKind(done.frame_kind), done.state_size, replayed=True
                    )
                expired_rid = done
            head = rec.head_version if rec else 0
            if req.expected_version is not None and req.expected_version != head:
                raise VersionConflict(req.session_id, req.expected_version, head)
            if rec is not None and req.labels:
                _check_session_labels(req.session_id, rec, req.labels)
            encoder = self._encoder_for(txn, sid, req.session_id, rec)
            if mode is WriteMode.MERGE and encoder.state_size + len(state) > self.config.max_state_bytes:
                raise StateTooLarge(
                    f"session {req.session_id!r}: merging {len(state)} bytes onto version {head} would exceed"
                    f" max_state_bytes ({self.config.max_state_bytes})"
                )
            batch.touched_encoders.add(sid)
            try:
                # The patch was checked in _put_op, before queueing.
                frame = encoder.replace(state) if mode is WriteMode.REPLACE else encoder.merge(state, checked=True)
            except EncodeError as exc:
                raise InvalidArgument(f"state cannot be encoded: {exc}") from None
            try:
                now = time.time_ns()
                if rec is None:
                    rec = records_pb2.SessionRecord(created_unix_nanos=now)
                    old_updated = None
                    if self.shared:
                        self._encoder_created[encoder] = now
                else:
                    old_updated = rec.updated_unix_nanos
                info = self._append(txn, sid, rec, frame, mode, req.labels, now, old_updated)
                result = PutResult(
                    frame.version, frame.stored_bytes, frame.kind, encoder.state_size, chain_depth=encoder.chain.depth
                )
                if rid_key is not None:
                    expires = now + int(self.config.request_id_ttl_seconds * 1e9)
                    self._remember_request(txn, rid_key, result, expires, expired_rid, asked, rec.created_unix_nanos)
            except BaseException:
                encoder.rollback()
                raise
            # Stored in the transaction: from here a failure drops the encoder (the
            # batch's, or the commit's), never rolls it back, so the previous state can go.
            encoder.commit()
            snapshot = encoder.snapshot()  # not a copy: a merge stays O(patch)
            kept = self._hold_encoder(batch, sid, encoder)  # the closure must not keep `encoder` itself
            batch.after_commit.append(lambda: self._after_write(sid, kept, snapshot, info))
            return result

        return _Op(apply, fails_clean=True, size_bytes=len(state))

    def _append(
        self,
        txn: lmdb.Transaction,
        sid: bytes,
        rec: records_pb2.SessionRecord,
        frame: EncodedFrame,
        mode: WriteMode,
        labels: dict[str, str],
        now: int,
        old_updated: int | None,
    ) -> VersionInfo:
        """Store the next frame of a session, update its record and indexes; return what was stored."""
        version = rec.head_version + 1
        meta_pb = records_pb2.VersionRecord(created_unix_nanos=now, mode=mode)
        if labels:  # most writes carry none; an empty map still costs a Python-level update()
            meta_pb.labels.update(labels)
        meta = meta_pb.SerializeToString()
        value = _META_LEN.pack(len(meta)) + meta + frame.data
        if not txn.put(keys.frame_key(sid, version), value, db=self._frames, overwrite=False):
            raise DataLoss(f"frame of version {version} already exists; the session record is behind its frames")
        rec.head_version = version
        if frame.kind is FrameKind.FULL:
            rec.chain_start_version = version
        if not rec.first_version:
            rec.first_version = version
        rec.stored_bytes += frame.stored_bytes
        rec.version_count += 1
        for key, value_ in labels.items():
            old = rec.labels.get(key)
            if old != value_:
                if old is not None:
                    txn.delete(keys.label_key(key, old, sid), db=self._labels)
                txn.put(keys.label_key(key, value_, sid), b"", db=self._labels)
                rec.labels[key] = value_
        rec.updated_unix_nanos = now
        if now < self._keyframed_before_nanos:
            # The clock stepped back behind the quiet-keyframe sweep's bound: this
            # session indexes below it, where no sweep would look. The next
            # sweep reads the whole index; a restart before it must too.
            self._keyframe_rescan = True
            txn.delete(_KEYFRAMED_BEFORE_KEY, db=self._meta)
        if old_updated is None or not keys.same_updated_granule(old_updated, now):
            if old_updated is not None:
                txn.delete(keys.updated_key(old_updated, sid), db=self._updated)
            txn.put(keys.updated_key(now, sid), b"", db=self._updated)
        txn.put(sid, rec.SerializeToString(), db=self._sessions)
        return VersionInfo(
            version=version,
            parent_version=0 if mode is WriteMode.FORK else version - 1,
            created_unix_nanos=now,
            frame_kind=frame.kind,
            stored_bytes=frame.stored_bytes,
            state_size=frame.header.state_size,
            labels=dict(labels),
            mode=mode,
        )

    def _remembered(
        self,
        txn: lmdb.Transaction,
        rid_key: bytes,
        rec: records_pb2.SessionRecord | None,
        req: PutRequest,
    ) -> tuple[records_pb2.RequestRecord | None, bool]:
        """The record stored under ``rid_key`` (None if none) and whether it answers this write's retry.

        It answers while it has not expired and names the session as it is now: one naming an
        earlier session of the same id (deleted since; the records outlive it) does not, so the
        write is made anew and its record replaces that one. A record of store layout 1 is looked
        up under its own key, and returned only if it answers (the sweeper expires it where it is).
        """
        raw = txn.get(rid_key, db=self._requests)
        layout1 = raw is None and self._layout1_requests
        if layout1:
            raw = txn.get(keys.layout1_request_key(rid_key), db=self._requests)
        if raw is None:
            return None, False
        try:
            done = records_pb2.RequestRecord.FromString(bytes(raw))
        except DecodeProtoError as exc:
            if rec is None and not layout1:
                # No session: the write that made the record made none that still stands (a retry
                # of it would find its session), so this write is a new one and replaces the record.
                # Its expiry entry, whose time only the record held, is left: an entry expires only
                # the record it was written for (_expire_requests_op).
                return None, False
            raise DataLoss(
                f"session {req.session_id!r}: the record of request_id {req.request_id!r} does not"
                f" parse ({exc}), so whether that write was made is unknown"
            ) from None
        live = done.expires_unix_nanos > time.time_ns()
        if layout1:
            # A delete removed layout 1's records with their session: one found is this session's.
            return (done, True) if live else (None, False)
        return done, live and request_of_session(done, rec)

    def _remember_request(
        self,
        txn: lmdb.Transaction,
        rid_key: bytes,
        result: PutResult,
        expires: int,
        expired: records_pb2.RequestRecord | None,
        asked: int,
        session_created: int,
    ) -> None:
        if expired is not None:  # an expired record of the same id being replaced
            txn.delete(keys.time_key(expired.expires_unix_nanos, rid_key), db=self._req_expiry)
        record = records_pb2.RequestRecord(
            version=result.version,
            stored_bytes=result.stored_bytes,
            frame_kind=result.frame_kind,
            state_size=result.state_size,
            expires_unix_nanos=expires,
            write_xxh3=asked,
            session_created_unix_nanos=session_created,
        )
        txn.put(rid_key, record.SerializeToString(), db=self._requests)
        txn.put(keys.time_key(expires, rid_key), b"", db=self._req_expiry)

    def _encoder_for(
        self, txn: lmdb.Transaction, sid: bytes, session_id: str, rec: records_pb2.SessionRecord | None
    ) -> ChainEncoder:
        if rec is None:
            encoder = self._new_encoder()
            self._encoders.put(sid, encoder)
            return encoder
        cached = self._encoders.get(sid)
        if (
            cached is not None
            and cached.version == rec.head_version
            and (not self.shared or self._same_chain(cached, rec))
        ):
            return cached
        chain = self._chain_frames(txn, sid, session_id, rec, rec.head_version)
        try:
            state = decode(chain)
            headers = [parse(f)[0] for f in chain]
        except DecodeError as exc:
            raise DataLoss(f"session {session_id!r} version {rec.head_version}: {exc}") from None
        encoder = ChainEncoder.resume(
            state, headers, policy=self.config.chain_policy, compact_message_type=self._merge_type
        )
        if self.shared:
            self._encoder_created[encoder] = rec.created_unix_nanos
        # The encoder cache belongs to this (writer) thread; a batch that
        # aborts drops every encoder it touched.
        self._encoders.put(sid, encoder)
        return encoder

    def _same_chain(self, encoder: ChainEncoder, rec: records_pb2.SessionRecord) -> bool:
        """Shared: whether a cached encoder at the head's version still continues the stored chain.

        Another process may have rewritten the head as a chain start (a quiet
        keyframe), or deleted the session and written it again up to the same
        version: a frame continuing the encoder's zstd stream would then not
        decode.
        """
        return (
            encoder.chain.start_version == rec.chain_start_version
            and self._encoder_created.get(encoder) == rec.created_unix_nanos
        )

    def _new_encoder(self) -> ChainEncoder:
        return ChainEncoder(policy=self.config.chain_policy, compact_message_type=self._merge_type)

    def _hold_encoder(self, batch: _Batch, sid: bytes, encoder: ChainEncoder) -> ChainEncoder | None:
        """``encoder`` if the batch may keep it until its commit, for the encoder cache; else None.

        Each encoder a batch keeps holds its head state and zstd stream until
        the commit: 512 writes of 300 KB states held ~1.5 GiB against a 16 MiB
        encoder_cache_bytes, though the cache evicts all but its budget at the
        commit. So a batch keeps at most the cache's budget (entries and bytes)
        of encoders; any other is dropped now, as if evicted (the session's
        next write resumes its chain from LMDB).
        """
        config = self.config
        weight = encoder.memory_bytes
        old = batch.held_encoders.get(sid)
        if old is None and (
            len(batch.held_encoders) >= config.encoder_cache_entries
            or batch.held_encoder_bytes + weight > config.encoder_cache_bytes
        ):
            self._encoders.discard(sid)
            return None
        # A session already kept by this batch stays kept: an earlier write's
        # closure holds its encoder anyway.
        batch.held_encoders[sid] = weight
        batch.held_encoder_bytes += weight - (old or 0)
        return encoder

    def _after_write(self, sid: bytes, encoder: ChainEncoder | None, head: StateSnapshot, info: VersionInfo) -> None:
        if encoder is None:
            self._encoders.discard(sid)  # dropped by _hold_encoder
        else:
            self._encoders.put(sid, encoder)  # refreshes its LRU position
        self._states.put(sid, head, info)

    def _forget(self, sid: bytes) -> None:
        self._encoders.discard(sid)
        self._states.discard(sid)

    def _delete_frames(self, txn: lmdb.Transaction, sid: bytes, *, below: int | None) -> tuple[int, int]:
        """Delete a session's frames (all, or those below a version); return how many and their frame bytes."""
        cur = txn.cursor(db=self._frames)
        removed = freed = 0
        if not cur.set_range(sid + keys.SEP):
            return 0, 0
        stop = keys.frame_key(sid, below) if below is not None else None
        while True:
            key = _key(cur)
            if not key.startswith(sid + keys.SEP) or (stop is not None and key >= stop):
                break
            freed += len(_frame_of(_value(cur)))
            cur.delete()  # moves to the next item
            removed += 1
            if not _key(cur):
                break
        return removed, freed

    def _delete_layout1_requests(self, txn: lmdb.Transaction, sid: bytes) -> None:
        """Remove a session's request records keyed as store layout 1 did: that layout's retries found
        a record only while its session lived. Current records stay until they expire; they name the
        session they were written to (see _remembered)."""
        cur = txn.cursor(db=self._requests)
        if not cur.set_range(sid + keys.SEP):
            return
        while _key(cur).startswith(sid + keys.SEP):
            expires = _expiry_of(_value(cur))
            if expires is not None:  # damaged: its expiry entry stays (expiring it later removes nothing newer)
                txn.delete(keys.time_key(expires, _key(cur)), db=self._req_expiry)
            cur.delete()
            if not _key(cur):
                break

    def _delete_index_entries(self, txn: lmdb.Transaction, sid: bytes) -> None:
        """Remove a session's label and updated-time index entries without its record: a scan of both."""
        labels = txn.cursor(db=self._labels)
        updated = txn.cursor(db=self._updated)
        # Label keys are key SEP value SEP sid (ids hold no SEP); updated keys are a u64 time + sid.
        doomed = (
            [(self._labels, k) for k in _forward_keys(labels) if k.endswith(keys.SEP + sid)] if labels.first() else []
        )
        if updated.first():
            doomed += [(self._updated, k) for k in _forward_keys(updated) if k[8:] == sid]
        for db, key in doomed:
            txn.delete(key, db=db)

    def _prune_op(self, sids: list[bytes], now: int) -> Callable[[_Batch, lmdb.Transaction], tuple[int, int]]:
        def apply(batch: _Batch, txn: lmdb.Transaction) -> tuple[int, int]:
            pruned = removed = 0
            for sid in sids:
                raw = txn.get(sid, db=self._sessions)
                if raw is None:
                    continue
                try:
                    rec = _record(raw)
                    start = self._retention_start(txn, sid, rec, now)
                except Exception as exc:  # only reads so far: nothing of this session to undo
                    # Keep the damaged session as it is (verify names it) and prune the others.
                    log.warning("retention skipped session %r: %s", _printable(sid), exc)
                    continue
                if start <= rec.first_version:
                    continue
                n, freed = self._delete_frames(txn, sid, below=start)
                rec.first_version = start
                rec.version_count -= n
                rec.stored_bytes -= freed
                txn.put(sid, rec.SerializeToString(), db=self._sessions)
                pruned += 1
                removed += n
            return pruned, removed

        return apply

    def _retention_start(self, txn: lmdb.Transaction, sid: bytes, rec: records_pb2.SessionRecord, now: int) -> int:
        """The first version retention keeps: a chain start, so no delta loses its base."""
        retention = self.config.retention
        cut = rec.first_version
        if retention.keep_last_versions is not None:
            cut = max(cut, rec.head_version - retention.keep_last_versions + 1)
        if retention.max_version_age_seconds is not None:
            oldest = now - int(retention.max_version_age_seconds * 1e9)
            cut = max(cut, self._first_version_since(txn, sid, rec, oldest))
        cut = min(cut, rec.head_version)  # the head always stays
        if cut <= rec.first_version:
            return rec.first_version
        return self._chain_start(txn, sid, _printable(sid), cut)

    def _first_version_since(
        self, txn: lmdb.Transaction, sid: bytes, rec: records_pb2.SessionRecord, oldest: int
    ) -> int:
        cur = txn.cursor(db=self._frames)
        if not cur.set_key(keys.frame_key(sid, rec.first_version)):
            return rec.first_version
        for key, value in _forward(cur):
            if not key.startswith(sid + keys.SEP):
                break
            if _meta_of(value).created_unix_nanos >= oldest:
                return keys.frame_version(key, sid)
        return rec.head_version

    def _expire_requests_op(self, now: int) -> Callable[[_Batch, lmdb.Transaction], int]:
        def apply(batch: _Batch, txn: lmdb.Transaction) -> int:
            cur = txn.cursor(db=self._req_expiry)
            expired = 0
            if not cur.first():
                return 0
            while expired < _EXPIRE_CHUNK and keys.time_of(_key(cur)) < now:
                entry = _key(cur)
                rid_key = entry[8:]
                raw = txn.get(rid_key, db=self._requests)
                # Only the record this entry was written for: an entry left behind
                # (by deleting a session whose record was damaged) must not expire
                # a later record of the same request id early, or its retry would
                # write twice. A record that does not parse goes: it answers nothing.
                if raw is not None and _expiry_of(raw) in (keys.time_of(entry), None):
                    txn.delete(rid_key, db=self._requests)
                cur.delete()
                expired += 1
                if not _key(cur):
                    break
            return expired

        return apply

    # -- reading chains ------------------------------------------------------

    def _read_state(
        self, txn: lmdb.Transaction, sid: bytes, session_id: str, version: int
    ) -> tuple[bytes, VersionInfo]:
        found = self._chain_back(txn, sid, session_id, version)
        if found is None:  # no frame stored for it: the session record says why
            self._refuse_unstored(txn, sid, session_id, version)
        target, value, chain = found
        try:
            state = decode(chain)
        except DecodeError as exc:
            raise DataLoss(f"session {session_id!r} version {target}: {exc}") from None
        return state, _version_info(session_id, target, value)

    def _chain_back(
        self, txn: lmdb.Transaction, sid: bytes, session_id: str, version: int
    ) -> tuple[int, bytes, list[memoryview]] | None:
        """``version`` (0: the session's last frame, its head), its stored value and its chain's frames, read
        backwards from its frame to the FULL frame that starts it; None if no frame is stored for it.

        The frames table alone answers: retention and delete remove frames and
        update the session record in one transaction, so the frames stored are
        exactly versions first_version..head. A cold read then makes one B-tree
        descent (of the frames table) instead of two: its pages are what a read
        from disk waits for, and the sessions table's descent grows with the
        number of sessions.
        """
        cur = txn.cursor(db=self._frames)
        prefix = sid + keys.SEP
        if version:
            if not cur.set_key(keys.frame_key(sid, version)):
                return None
        elif not (cur.prev() if cur.set_range(sid + _AFTER_SEP) else cur.last()):
            return None  # no key at all before the session's range
        key = _key(cur)
        if not key.startswith(prefix):
            return None
        target = keys.frame_version(key, sid)
        value = _value(cur)
        frames: list[memoryview] = []
        expected = target
        for key, stored in _backward(cur):
            if not key.startswith(prefix):
                break
            if keys.frame_version(key, sid) != expected:
                raise DataLoss(f"session {session_id!r}: the frame of version {expected} is missing")
            frame = _frame_of(stored)
            if len(frame) <= _FRAME_KIND_OFFSET:
                raise DataLoss(
                    f"session {session_id!r} version {expected}: the stored value"
                    f" ({len(stored)} bytes) is too short to hold a frame header"
                )
            frames.append(frame)
            if frame[_FRAME_KIND_OFFSET] == FrameKind.FULL:
                frames.reverse()
                return target, value, frames
            expected -= 1
        raise DataLoss(f"session {session_id!r}: no FULL frame starts the chain of version {target}")

    def _refuse_unstored(self, txn: lmdb.Transaction, sid: bytes, session_id: str, version: int) -> NoReturn:
        """Raise what a read of a version with no frame stored gets: NotFound naming why, or DataLoss."""
        raw = txn.get(sid, db=self._sessions)
        if raw is None:
            raise NotFound(f"session {session_id!r} does not exist")
        rec = _record(raw)
        target = version or rec.head_version
        if target > rec.head_version:
            raise NotFound(f"session {session_id!r} has no version {target}; the head is version {rec.head_version}")
        if target < rec.first_version:
            raise NotFound(
                f"session {session_id!r} version {target} was removed by retention;"
                f" the oldest kept is version {rec.first_version}"
            )
        raise DataLoss(f"session {session_id!r}: the frame of version {target} is missing")

    def _chain_start(self, txn: lmdb.Transaction, sid: bytes, session_id: str, target: int) -> int:
        """Version of the FULL frame whose chain holds ``target`` (DataLoss if that chain is broken)."""
        found = self._chain_back(txn, sid, session_id, target)
        if found is None:
            raise DataLoss(f"session {session_id!r}: the frame of version {target} is missing")
        return target - len(found[2]) + 1

    def _chain_frames(
        self, txn: lmdb.Transaction, sid: bytes, session_id: str, rec: records_pb2.SessionRecord, target: int
    ) -> list[memoryview]:
        """The frames from target's chain start to target, read in one transaction."""
        start = rec.chain_start_version if target >= rec.chain_start_version else None
        if start is None:
            start = self._chain_start(txn, sid, session_id, target)
        cur = txn.cursor(db=self._frames)
        frames: list[memoryview] = []
        want = target - start + 1
        # Versions are consecutive keys, so the chain is the next `want` values;
        # checking the last key once proves none is missing (keys are unique and
        # sorted), without parsing every key on the cold path.
        if cur.set_key(keys.frame_key(sid, start)):
            for value in cur.iternext(keys=False, values=True):
                frames.append(_frame_of(value))
                if len(frames) == want:
                    break
        if len(frames) != want or bytes(cur.key()) != keys.frame_key(sid, target):
            raise DataLoss(
                f"session {session_id!r} version {target}: a frame of its chain {start}..{target} is missing"
            )
        return frames

    # -- the writer thread ---------------------------------------------------

    def _submit(self, op: _Op, *, wait: bool = True) -> _Op:
        """Queue ``op`` for the writer; past max_queued_write_bytes, wait for room (or raise Overloaded)."""
        with self._room:
            self._admit(op, wait=wait)
            self._queue.put(op)
            target = self._gather_target
            if target and self._queue.qsize() >= target:
                self._gathered.set()
        return op

    def _admit(self, op: _Op, *, wait: bool) -> None:
        """Count ``op`` against max_queued_write_bytes, waiting for room (or raising Overloaded); under _room."""
        size = op.size_bytes
        while True:
            if self.writes_stopped is not None:
                raise Unavailable(self.writes_stopped)
            if self._closing.is_set():
                if self.readonly:
                    raise Unavailable("the store is open read-only; writes are refused")
                raise Unavailable("the store is closing; no new writes are accepted")
            queued = self._queued_bytes
            if not queued or queued + size <= self.config.max_queued_write_bytes:
                break
            if not wait:
                raise Overloaded(
                    f"the store is overloaded: {queued} bytes of writes are queued for its writer and this"
                    f" {size}-byte write would pass max_queued_write_bytes ({self.config.max_queued_write_bytes});"
                    " retry shortly with the same request_id"
                )
            self._room_waiters += 1
            try:
                self._room.wait()
            finally:
                self._room_waiters -= 1
        self._queued_bytes = queued + size
        op.queued_bytes = size

    def _answered(self, ops: list[_Op]) -> None:
        """``ops`` are about to be answered: their bytes stop counting against max_queued_write_bytes.

        Before their callers learn the outcome, so that a caller writing again
        at once finds the room its last write left. Idempotent per op.
        """
        with self._room:
            size = 0
            for op in ops:
                size += op.queued_bytes
                op.queued_bytes = 0
            if size:
                self._queued_bytes -= size
                self._room.notify_all()

    def _check_open_for_reads(self) -> None:
        # Reads go on while close() commits the queued writes; after it, none (the cache's neither).
        if self._closed and not self._writer.is_alive():
            raise Unavailable("the store is closed")

    @contextlib.contextmanager
    def _read(self) -> Iterator[lmdb.Transaction]:
        self._check_open_for_reads()
        while True:
            with self._rw.shared():
                if self._env_closed:  # closed while this reader waited for the lock
                    raise Unavailable("the store is closed")
                try:
                    txn = self._env.begin()
                except lmdb.MapResizedError:
                    # Another process grew the map past ours (only a read-only
                    # store meets this: our own writer grows it under the lock).
                    txn = None
                if txn is not None:
                    with txn:
                        try:
                            yield txn
                        except _LMDB_DAMAGE as exc:
                            raise _damaged(exc) from None
                    return
            with self._rw.exclusive():
                self._env.set_mapsize(0)  # adopt the size the file now has

    def forget_dead_readers(self) -> None:
        """Free the LMDB reader slots of processes that died inside a read transaction.

        Other processes read this directory: the sidecar's gRPC process (its
        reply cache reads heads), ``ckpt verify`` children and the like. One killed
        inside a read transaction leaves its slot in lock.mdb, pinning that
        snapshot (pages freed since cannot be reused, so the file grows)
        and, one per dead process, would fill the reader table, while this
        store stays open (opening one clears such slots). mdb_reader_check
        clears only slots whose process is gone; data.mdb is not touched.
        """
        with self._rw.shared():
            if not self._env_closed:
                try:
                    self._env.reader_check()
                except lmdb.Error as exc:
                    log.warning("could not check LMDB's reader table: %s", exc)

    def _writer_loop(self) -> None:
        stop = False
        while not stop:
            batch, stop = self._take_batch()
            if batch:
                try:
                    self._run_batch(batch)
                except BaseException as exc:  # a bug: the writer must outlive it, or every caller hangs
                    self._fail_unresolved(batch, exc)
                finally:
                    self._answered(batch)
            # Not kept while the writer waits for the next write: the ops hold
            # their requests' states and their callers' futures.
            del batch

    def _fail_unresolved(self, ops: list[_Op], exc: BaseException) -> None:
        """After an unexpected error in a batch: fail whoever still waits, forget what may be stale."""
        log.error("the writer failed a batch of %d writes", len(ops), exc_info=exc)
        # The batch may or may not have committed: the caches are rebuilt from LMDB.
        self._encoders.clear()
        self._states.clear()
        for op in ops:
            if not op.resolved:
                with contextlib.suppress(Exception):
                    op.resolve(
                        None,
                        Unavailable(
                            f"the write may not have been committed (internal error: {exc!r});"
                            " retry with the same request_id to learn its outcome"
                        ),
                    )

    def _take_batch(self) -> tuple[list[_Op], bool]:
        """The queued writes (waiting for one), up to max_batch_writes; and whether close() was called."""
        first = self._carried or self._queue.get()
        self._carried = None
        if first is None:
            return [], True
        batch = first if isinstance(first, list) else [first]
        stop = self._drain(batch)
        expected = min(self._expected_writers, self.config.max_batch_writes)
        delay = min(self.config.max_commit_delay_seconds, self._last_commit_seconds)
        # With write_on_loop, the loop's writers queue there: none would come here.
        gathers = self._writes_loop is None
        if gathers and len(batch) < expected and not stop and delay > 0 and not self._room_waiters:
            # Writers the last commit answered are likely preparing their next
            # write: a commit's flush costs about the same for 30 writes as
            # for 60, so waiting briefly for them saves flushes. (Without it,
            # 64 threads settle into two half-size batches taking turns.) Up
            # to a whole commit's duration: half of one cut off 64 threads'
            # gathering at ~56. (The sidecar's unary merges, measured side by
            # side, did not change either way.) One wake-up when they are all
            # queued (_submit), not one per write.
            self._gathered.clear()
            self._gather_target = expected - len(batch)
            if self._queue.qsize() < self._gather_target:
                began = time.monotonic()
                self._gathered.wait(delay)
                self.commit_delays += 1
                self.commit_delay_seconds += time.monotonic() - began
            self._gather_target = 0
            stop = self._drain(batch)
        return batch, stop

    def _drain(self, batch: list[_Op]) -> bool:
        """Move what is queued into ``batch``, up to max_batch_writes; whether the stop marker was among it."""
        stop = False
        limit = self.config.max_batch_writes
        while len(batch) < limit and self._carried is None:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                stop = True
            elif not isinstance(item, list):
                batch.append(item)
            elif len(batch) + len(item) <= limit:
                batch.extend(item)
            else:
                self._carried = item  # kept whole: the loop's writes commit together
        return stop

    def _run_batch(self, ops: list[_Op], *, isolate: bool = False) -> None:
        """Apply ops in one write transaction, commit, then resolve their futures.

        Once a commit has failed (writes_stopped), ops are refused unapplied.

        Ops that fail clean (puts, forks, deletes: errors only before their first
        write) share the transaction directly; any other op gets a nested
        transaction, so a failure undoes only its own writes. A nested
        transaction costs about as much as a small put's own work, hence the
        fast path. Should a clean op raise something unexpected, the batch is
        redone with every op nested (``isolate``).
        """
        if self.writes_stopped is not None:
            self._refuse(ops)
            return
        while True:
            began = time.monotonic()
            batch = _Batch()
            outcomes: list[tuple[_Op, Any, BaseException | None]] = []
            try:
                with self._env.begin(write=True, db=self._frames) as txn:
                    for op in ops:
                        if op.fails_clean and not isolate:
                            try:
                                outcomes.append((op, op.apply(batch, txn), None))
                            except (StoreError, CodecError) as exc:
                                outcomes.append((op, None, _as_store_error(exc)))
                            except lmdb.MapFullError:
                                raise
                            except Exception as exc:
                                raise _Unclean from exc
                            continue
                        try:
                            with self._env.begin(write=True, parent=txn) as sub:
                                outcomes.append((op, op.apply(batch, sub), None))
                        except lmdb.MapFullError:
                            raise
                        except _FAILS_ALONE as exc:
                            outcomes.append((op, None, _as_store_error(exc)))
                        except Exception as exc:  # a bug: fail this op, keep serving
                            outcomes.append((op, None, exc))
            except _Unclean:
                for sid in batch.touched_encoders:
                    self._encoders.discard(sid)
                isolate = True
                continue
            except lmdb.MapResizedError:
                # Another process (a --workers sibling) grew the map: adopt its
                # size and begin again. Raised by begin, before any op ran.
                for sid in batch.touched_encoders:
                    self._encoders.discard(sid)
                self._adopt_map_size()
                continue
            except lmdb.MapFullError:
                # Nothing was committed. Encoders already advanced for this
                # batch are dropped (they are rebuilt from LMDB on next use).
                for sid in batch.touched_encoders:
                    self._encoders.discard(sid)
                if self._grow_map():
                    continue
                self._split_or_refuse(
                    ops,
                    isolate=isolate,
                    error=StoreFull(
                        f"the store is full: {self._map_cap_reached()}; nothing was written: raise it, or delete"
                        " sessions to free room inside the map"
                    ),
                )
                return
            except BaseException as exc:  # commit failed (I/O error): nothing is acknowledged
                # Whether LMDB kept it or not, the cached states may be stale either way.
                for sid in batch.touched_encoders:
                    self._forget(sid)
                full = _disk_full(exc, self._data_file, sum(op.size_bytes for op in ops))
                if full is None:
                    self._stop_writes(exc)
                    self._refuse(ops)
                    return
                # Pages freed inside the file may still hold a smaller commit.
                self._split_or_refuse(
                    ops,
                    isolate=isolate,
                    error=StoreFull(
                        f"no space to write under {self.config.data_dir} ({full}); nothing was written:"
                        " free disk space or delete sessions, then retry with the same request_id"
                    ),
                )
                return
            self.commits += 1
            self.batch_sizes[len(ops)] += 1
            self._last_commit_seconds = time.monotonic() - began
            self._fill_unwritten_tail()
            # Writers seen around this commit: those it lets go on, and those who queued meanwhile.
            released = sum(1 for op in ops if op.releases_caller)
            self._expected_writers = released + self._queue.qsize()
            for action in batch.after_commit:
                action()
            self._answered(ops)
            by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Op, Any, BaseException | None]]] = {}
            in_turn: list[tuple[_Op, Any, BaseException | None]] = []
            for outcome in outcomes:
                op = outcome[0]
                if op.loop is not None:
                    by_loop.setdefault(op.loop, []).append(outcome)
                elif op.future is None and op.wakes_in_turn:
                    in_turn.append(outcome)
                else:
                    op.resolve(outcome[1], outcome[2])
            for loop, settled in by_loop.items():
                _settle_on(loop, settled)
            _wake_in_turn(in_turn)
            return

    def _fill_unwritten_tail(self) -> None:
        """After a commit: grow data.mdb to the committed last page if LMDB left it shorter.

        LMDB never writes pages a transaction allocated and freed again (a large
        state put and its session deleted in one group commit: a thousand pages
        for 4 MB), so the file can end far before its last page number, and a
        reopen would take the gap for a truncated copy (check_not_truncated) and
        refuse the store. Grown with zeros (free pages: nothing reads them) and
        synced, under LMDB's writer lock, so no other worker's pages past the
        end can be cut. One stat per commit when nothing is missing.
        """
        try:
            page_bytes = self._page_bytes
            last_pgno = self._env.info()["last_pgno"]
            if last_pgno > self._last_pgno_seen:
                self._last_pgno_seen = last_pgno
                self._check_readers_on_growth()
            if os.stat(self._data_file).st_size >= (last_pgno + 1) * page_bytes:
                return
            txn = self._env.begin(write=True)  # LMDB's writer lock: no --workers sibling writes meanwhile
            try:
                _grow_file(self._data_file, (self._env.info()["last_pgno"] + 1) * page_bytes)
            finally:
                txn.abort()
        except (OSError, lmdb.Error) as exc:  # the commit stands; a reopen may then refuse a large gap
            log.warning("could not grow %s to its last page after a commit: %s", self._data_file, exc)

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

    def _stop_writes(self, exc: BaseException) -> None:
        """After a commit failed with an I/O error: take no more writes until reopened.

        The writes queued behind the failed batch would otherwise commit
        without it, out of the order they were sent (a stream's next batch
        after a refused one); and after a failed fsync what the page cache
        holds is no longer known to be what the disk will keep. As databases
        do on a failed fsync, stop writing: reopening starts from the last
        committed transaction, which LMDB never lost.
        """
        with self._room:
            self.writes_stopped = (
                f"the store stopped taking writes: a commit failed ({exc!r}); nothing after it was written."
                " Reopen the store (restart the sidecar), then retry with the same request_id"
            )
            self._room.notify_all()  # writes waiting for room are refused now
        log.error("%s", self.writes_stopped)
        if self._on_writes_stopped is not None:
            try:
                self._on_writes_stopped(self.writes_stopped)
            except Exception:
                log.exception("on_writes_stopped failed")

    def _refuse(self, ops: list[_Op]) -> None:
        """Answer ``ops`` Unavailable(writes_stopped): none of them was written."""
        assert self.writes_stopped is not None
        self._answered(ops)
        for op in ops:
            op.resolve(None, Unavailable(self.writes_stopped))

    def _split_or_refuse(self, ops: list[_Op], *, isolate: bool, error: StoreFull) -> None:
        """At a size limit: each write of a batch gets its own chance; a lone write is refused with ``error``."""
        if len(ops) > 1:
            for op in ops:
                self._run_batch([op], isolate=isolate)
        else:
            self._answered(ops)
            self._count_store_full(error)
            ops[0].resolve(None, error)

    def _count_store_full(self, error: StoreFull) -> None:
        """Count a write refused for want of room; log it the first time and then once a minute at most."""
        self.store_full_refusals += 1
        logged_at, logged_count = self._store_full_logged
        now = time.monotonic()
        if now - logged_at >= _STORE_FULL_LOG_SECONDS:
            since = self.store_full_refusals - logged_count
            log.warning("refused %d write%s: %s", since, "" if since == 1 else "s", error)
            self._store_full_logged = (now, self.store_full_refusals)

    def _map_cap_reached(self) -> str:
        """Why the map cannot grow: at max_map_size_bytes, or opened over it (a data file grown under a larger cap)."""
        cap = f"max_map_size_bytes ({self.config.max_map_size_bytes}; ckpt serve --max-map-size-bytes)"
        if self._map_size > self.config.max_map_size_bytes:
            return f"the LMDB map is {self._map_size} bytes, the size of {self._data_file}, already over {cap}"
        return f"the LMDB map reached {cap}"

    def _adopt_map_size(self) -> None:
        with self._rw.exclusive():
            self._env.set_mapsize(0)  # the size the file's meta page now gives
        self._map_size = max(self._map_size, self._env.info()["map_size"])

    def _grow_map(self) -> bool:
        if self._map_size >= self.config.max_map_size_bytes:
            return False
        new_size = min(self._map_size * 2, self.config.max_map_size_bytes)
        with self._rw.exclusive():
            self._env.set_mapsize(new_size)
        self._map_size = new_size
        self.map_resizes += 1
        return True

    def _first_sweep_delay(self) -> float:
        """Seconds until the first sweep: what is left of the interval since the last sweep that changed
        anything began (in this process or before a restart; else since the store was first opened), 0
        if that is past. Counting from each start instead, a store restarted more often than its
        interval never swept: retention, request-id expiry and quiet keyframes stopped, unseen, while
        the data grew."""
        interval = self.config.sweep_interval_seconds
        last = self._meta_int(_LAST_SWEEP_KEY)
        if not last:
            return interval
        since = (time.time_ns() - last) / 1e9
        return min(interval, max(0.0, interval - since))  # a clock stepped back: one interval at most

    def _sweeper_loop(self) -> None:
        delay = self._first_sweep_delay()
        while not self._closing.wait(delay):
            delay = self.config.sweep_interval_seconds
            self.forget_dead_readers()
            try:
                t0 = time.monotonic()
                done = self.sweep()
                if done.changed:
                    log.info(
                        "retention sweep: %d versions removed from %d sessions, %d request ids expired,"
                        " %d quiet keyframes written (%.2f s)",
                        done.versions_removed,
                        done.sessions_pruned,
                        done.request_ids_expired,
                        done.keyframes_written,
                        time.monotonic() - t0,
                    )
            except Unavailable:
                pass  # closing
            except StoreFull as exc:  # no traceback: the cause is outside, and said in full
                log.warning("the retention sweep could not write: %s", exc)
            except Exception:  # logged and tried again next round: retention must not stop for good
                log.exception("the retention sweep failed")


# -- helpers ------------------------------------------------------------------
#
# Every transaction here is opened with buffers=False, so LMDB hands back
# bytes (the stubs also allow memoryview, for buffers=True).


def _encoder_memory(encoder: ChainEncoder) -> int:
    return encoder.memory_bytes


def _forward(cur: lmdb.Cursor) -> Iterator[tuple[bytes, bytes]]:
    return cast(Iterator[tuple[bytes, bytes]], cur.iternext(keys=True, values=True))


def _backward(cur: lmdb.Cursor) -> Iterator[tuple[bytes, bytes]]:
    return cast(Iterator[tuple[bytes, bytes]], cur.iterprev(keys=True, values=True))


def _forward_keys(cur: lmdb.Cursor) -> Iterator[bytes]:
    return cast(Iterator[bytes], cur.iternext(keys=True, values=False))


def _keys_after(cur: lmdb.Cursor, after: bytes, limit: int) -> list[bytes]:
    """Up to ``limit`` keys following ``after`` (b"": from the first)."""
    out: list[bytes] = []
    if cur.set_range(after):
        for key in _forward_keys(cur):
            if key == after:
                continue
            out.append(bytes(key))
            if len(out) == limit:
                break
    return out


def _key(cur: lmdb.Cursor) -> bytes:
    return cast(bytes, cur.key())


def _value(cur: lmdb.Cursor) -> bytes:
    return cast(bytes, cur.value())


def _in_use_in_this_process(data_dir: os.PathLike[str]) -> Unavailable:
    return Unavailable(f"data directory {data_dir} is in use by another Store in this process (close it first)")


def lock_data_dir(data_dir: os.PathLike[str], *, holder: str | None = None) -> Any:
    """Hold an exclusive lock on the data directory for the store's lifetime.

    ``holder`` is who another process trying to lock it is told holds it
    (default ``pid N``, this process): `ckpt serve`'s store process names the
    process to stop, its parent, rather than itself.
    """
    path = os.path.join(data_dir, "ckpt.lock")
    fh = open(path, "a+")  # noqa: SIM115 - held open until close()
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        held_by = fh.read().strip() or "another process"
        fh.close()
        if held_by == f"pid {os.getpid()}":
            raise _in_use_in_this_process(data_dir) from None
        raise Unavailable(f"data directory {data_dir} is in use by {held_by}") from None
    fh.seek(0)
    fh.truncate()
    fh.write(f"{holder or f'pid {os.getpid()}'}\n")
    fh.flush()
    return fh


def request_of_session(done: records_pb2.RequestRecord, rec: records_pb2.SessionRecord | None) -> bool:
    """Whether a current request record was written to the session ``rec`` is now (None: there is none).

    Records outlive a deleted session (keys.request_key) and name the session they were written to by
    its creation time: one of an earlier session of the same id answers nothing (Store._remembered), and
    is no damage (`ckpt verify`).
    """
    return rec is not None and done.session_created_unix_nanos == rec.created_unix_nanos


def _expiry_of(raw: Any) -> int | None:
    """A request record's expiry time; None if the record does not parse."""
    try:
        return records_pb2.RequestRecord.FromString(bytes(raw)).expires_unix_nanos
    except DecodeProtoError:
        return None


def _record(raw: Any) -> records_pb2.SessionRecord:
    try:
        return records_pb2.SessionRecord.FromString(bytes(raw))
    except DecodeProtoError as exc:
        raise DataLoss(f"a session record ({len(raw)} bytes) does not parse: {exc}") from None


def _meta_of(value: Any) -> records_pb2.VersionRecord:
    (n,) = _META_LEN.unpack_from(value)
    return records_pb2.VersionRecord.FromString(bytes(value[_META_LEN.size : _META_LEN.size + n]))


def _frame_of(value: Any) -> memoryview:
    # A value too short for its length prefix yields no frame (decoding it then fails, naming the version).
    (n,) = _META_LEN.unpack_from(value) if len(value) >= _META_LEN.size else (len(value),)
    return memoryview(value)[_META_LEN.size + n :]


def _version_info(session_id: str, version: int, value: Any) -> VersionInfo:
    """What a stored version's metadata and frame header say; DataLoss naming it if they do not parse."""
    try:
        meta = _meta_of(value)
        mode = WriteMode(meta.mode)
    except (struct.error, DecodeProtoError, ValueError) as exc:
        raise DataLoss(f"session {session_id!r} version {version}: its stored metadata is corrupt: {exc}") from None
    try:
        header, _ = parse(_frame_of(value))
    except DecodeError as exc:  # the frame, not the metadata: its checksum or header
        text = str(exc)
        where = (
            f"session {session_id!r}" if f"version {version}" in text else f"session {session_id!r} version {version}"
        )
        raise DataLoss(f"{where}: {text}") from None
    if header.version != version:  # a sound frame under another version's key: never served as this one
        raise DataLoss(
            f"session {session_id!r} version {version}: the frame stored there is version {header.version}'s"
        )
    return VersionInfo(
        version=version,
        parent_version=version - 1 if mode != WriteMode.FORK else 0,
        created_unix_nanos=meta.created_unix_nanos,
        frame_kind=header.kind,
        stored_bytes=header.frame_size,
        state_size=header.state_size,
        labels=dict(meta.labels),
        mode=mode,
    )


def _session_info(session_id: str, rec: records_pb2.SessionRecord) -> SessionInfo:
    return SessionInfo(
        session_id=session_id,
        head_version=rec.head_version,
        first_version=rec.first_version,
        created_unix_nanos=rec.created_unix_nanos,
        updated_unix_nanos=rec.updated_unix_nanos,
        labels=dict(rec.labels),
        stored_bytes=rec.stored_bytes,
        version_count=rec.version_count,
        forked_from_session_id=rec.forked_from_session_id,
        forked_from_version=rec.forked_from_version,
        chain_start_version=rec.chain_start_version,
    )


# What a commit's page writes fail with when the file cannot grow: no space,
# a quota, or a file size limit (RLIMIT_FSIZE; Python ignores SIGXFSZ).
_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
# Below this much free space, a commit failing with EIO is taken for a full disk.
_LOW_FREE_BYTES = 16 * 1024 * 1024


def _disk_full(exc: BaseException, data_file: Path, needed_bytes: int) -> str | None:
    """Why a failed commit could not write, if the disk (or a limit) is full; None for any other failure.

    py-lmdb raises a plain lmdb.Error for system errors, its message ending in
    the C library's strerror text. LMDB reports a short page write as EIO,
    which is how a disk that fills mid-write usually shows; so for EIO the
    file size limit and the free space decide.
    """
    if type(exc) is not lmdb.Error:
        return None
    text = str(exc)
    for code in _DISK_FULL_ERRNOS:
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


#: The layout of the tables (keys and records) this code reads and writes, stamped in the `meta` table.
#: 2: request records keyed by request id first (keys.request_key); layout 1's are still read.
LAYOUT_VERSION = 2
_LAYOUT_KEY = b"layout_version"
#: When the last sweep began (time.time_ns(), as digits); set when a store is first opened writable.
_LAST_SWEEP_KEY = b"last_sweep_unix_nanos"
#: The quiet-keyframe sweep's bound (Store._keyframed_before_nanos).
_KEYFRAMED_BEFORE_KEY = b"keyframed_before_unix_nanos"

# LMDB's errors for a damaged B-tree: stored data failing its checks, like a bad checksum.
# MDB_BAD_TXN too: when a table's root page fails to read as a cursor opens,
# LMDB marks the transaction failed without saying why, and the first cursor
# operation raises BadTxnError. The store never reuses a failed transaction,
# so here it means damage, not misuse.
_LMDB_DAMAGE: tuple[type[lmdb.Error], ...] = (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.BadTxnError)
# What fails one op of a batch alone (an answer for its caller), not the batch.
_FAILS_ALONE: tuple[type[Exception], ...] = (StoreError, CodecError, *_LMDB_DAMAGE)


def _damaged(exc: lmdb.Error) -> DataLoss:
    return DataLoss(f"the LMDB data file is damaged ({exc}); `ckpt verify` names what it affects")


def _printable(sid: bytes) -> str:
    """A session key for messages, even if it is not UTF-8 (damage)."""
    return sid.decode("utf-8", "backslashreplace")


# Opens retried when MDB_MAP_RESIZED (see _retry_map_resized); each retry maps
# the size the file has by then, so more than a couple are never expected.
_MAP_RESIZED_OPEN_ATTEMPTS = 50

_T = TypeVar("_T")


def _retry_map_resized(open_env: Callable[[], _T]) -> _T:
    """``open_env()``, again while it fails with MDB_MAP_RESIZED.

    A read-only open beside a running sidecar maps the file at the size its
    meta page gives; py-lmdb then begins a transaction (in lmdb.open and in
    open_db). Should the sidecar grow the map and write past the old end in
    between, LMDB refuses that transaction (MDB_MAP_RESIZED) although nothing
    is wrong: opening again maps the new size. ``open_env`` must close what
    it opened before raising.
    """
    for attempt in range(1, _MAP_RESIZED_OPEN_ATTEMPTS + 1):
        try:
            return open_env()
        except lmdb.MapResizedError:
            if attempt == _MAP_RESIZED_OPEN_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


# How many pages data.mdb may fall short of its last page without being called
# truncated: LMDB counts pages a transaction allocated and freed again but never
# writes them, so the file can end a page or so before its last page number
# (seen after a SIGKILL under forks, deletes and retention).
_UNWRITTEN_TAIL_PAGES = 64


def check_not_truncated(data_mdb: Path, *, extend: bool) -> None:
    """DataLoss if data.mdb is clearly shorter than the pages its meta page says are in use.

    LMDB maps the file: reading a page past its end kills the process with
    SIGBUS, so a truncated file (a partial copy or restore) must be caught
    before anything reads the B-trees. A short tail (pages LMDB never wrote)
    is normal; with ``extend`` (the writer, holding the directory) the file is
    grown to its last page with zeros, so should such a page be one a damaged
    copy lost, reading it is MDB_CORRUPTED (DataLoss), not SIGBUS. The meta
    pages are read before the size: a writer beside us extends the file
    before its meta page points into the new pages.
    """
    if not data_mdb.is_file():
        return  # a new store, or (read-only) reported as missing by the caller
    try:
        env = _retry_map_resized(lambda: lmdb.open(str(data_mdb.parent), readonly=True, lock=False, max_dbs=0))
    except lmdb.Error as exc:
        if "already open in this process" in str(exc):  # py-lmdb allows one environment per file and process
            raise _in_use_in_this_process(data_mdb.parent.parent) from None
        raise DataLoss(f"{data_mdb} cannot be opened as an LMDB database: {exc}") from None
    try:
        pages, page_bytes = env.info()["last_pgno"] + 1, env.stat()["psize"]
    finally:
        env.close()
    needed, size = pages * page_bytes, data_mdb.stat().st_size
    if size >= needed:
        return
    if needed - size > page_bytes * max(2, min(_UNWRITTEN_TAIL_PAGES, pages // 8)):
        raise DataLoss(
            f"{data_mdb} is truncated: {size} bytes, but its database uses {needed}"
            f" ({needed - size} bytes missing); nothing in it can be read safely (restore it from a copy)"
        )
    if extend:
        _grow_file(data_mdb, needed)


def _index_updated_by_granule(env: lmdb.Environment, txn: lmdb.Transaction) -> int:
    """Key the updated-time index by granule where it holds exact times; the number of entries moved.

    The first builds (before the layout stamp) keyed each session at its exact
    update time. This code keys it at the granule (keys.updated_key) and moves
    or deletes only that key, so such an entry would stay behind as a stale
    duplicate once the session is written, deleted or forked onto: listings by
    update time gave the session twice, and `ckpt verify` failed every session.
    A store is stamped once this has run (in the stamp's transaction), so it
    runs once per store.
    """
    try:
        db = env.open_db(b"updated", txn=txn, create=False)
    except lmdb.NotFoundError:
        return 0  # a new store
    moved = 0
    cur = txn.cursor(db=db)
    found = cur.first()
    while found:
        key = bytes(cur.key())
        when = keys.time_of(key) if len(key) > 8 else 0
        if keys.updated_granule(when) == when:
            found = cur.next()
            continue
        cur.delete()
        txn.put(keys.updated_key(when, key[8:]), b"", db=db)
        moved += 1
        found = cur.set_range(key)  # the entry after the deleted one (the new one sorts before it)
    return moved


def _grow_file(path: Path, size_bytes: int) -> None:
    """Grow ``path`` to ``size_bytes`` with zeros (never shrink it: checked on the open file), synced."""
    with path.open("r+b") as f:
        if os.fstat(f.fileno()).st_size < size_bytes:
            f.truncate(size_bytes)
            os.fsync(f.fileno())


def _as_store_error(exc: BaseException) -> StoreError:
    if isinstance(exc, StoreError):
        return exc
    if isinstance(exc, DecodeError):
        return DataLoss(str(exc))
    if isinstance(exc, _LMDB_DAMAGE):
        return _damaged(exc)
    return InvalidArgument(str(exc))


def _write_fingerprint(req: PutRequest, mode: WriteMode) -> int:
    """What a write asks, hashed: a retry under the same request id must match it (never 0: 0 is "not kept")."""
    h = xxhash.xxh3_64()
    expected = -1 if req.expected_version is None else req.expected_version
    if expected < 1 << 63:
        h.update(struct.pack("<Bq", mode, expected))
    else:
        # expected_version is a uint64 on the wire. Values past int64 get a
        # layout of their own (a flagged mode byte), so that the fingerprints
        # of records already stored stay what they were.
        h.update(struct.pack("<BQ", mode | 0x80, expected))
    for key, value in sorted(req.labels.items()):
        h.update(key.encode() + b"\0" + value.encode() + b"\0")
    h.update(req.state)
    return h.intdigest() or 1


def _check_session_labels(session_id: str, rec: records_pb2.SessionRecord, labels: dict[str, str]) -> None:
    """A session keeps every label its writes ever gave: bound the union, not just each write's."""
    total = len(rec.labels) + sum(1 for key in labels if key not in rec.labels)
    if total > keys.MAX_LABELS:
        raise InvalidArgument(
            f"session {session_id!r} has {len(rec.labels)} labels; these labels would make it {total},"
            f" over the limit of {keys.MAX_LABELS} per session"
        )


def _check_version_arg(version: int) -> None:
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise InvalidArgument(f"version must be an integer >= 0 (0 = latest), got {version!r}")


def _page_size(page_size: int) -> int:
    if page_size < 0:
        raise InvalidArgument(f"page_size must be >= 0, got {page_size}")
    return min(page_size or _DEFAULT_PAGE_SIZE, _MAX_PAGE_SIZE)


# What one listed entry can take in a reply, past its ids and labels: every
# integer field at its longest varint (10 bytes) with its tag, timestamps as
# sub-messages, the entry's own tag and length (ListVersionsResponse.versions,
# ListSessionsResponse.sessions).
_VERSION_INFO_FIXED_BYTES = 96
_SESSION_INFO_FIXED_BYTES = 144
# Per label (a map entry): its tag and length (2 bytes: an entry is < 16 KiB), the key's tag and
# length (1: <= 63 bytes), the value's (1 + 2: <= 128 bytes).
_LABEL_ENTRY_BYTES = 8


def _labels_bytes(labels: dict[str, str]) -> int:
    return sum(len(k.encode()) + len(v.encode()) + _LABEL_ENTRY_BYTES for k, v in labels.items())


def version_info_bytes(info: VersionInfo) -> int:
    """At least what ``info`` takes encoded in a listing reply (ckpt.v1.VersionInfo)."""
    return _VERSION_INFO_FIXED_BYTES + _labels_bytes(info.labels)


def session_info_bytes(info: SessionInfo) -> int:
    """At least what ``info`` takes encoded in a listing reply (ckpt.v1.SessionInfo)."""
    ids = len(info.session_id.encode("utf-8", "surrogateescape")) + len(info.forked_from_session_id.encode())
    return _SESSION_INFO_FIXED_BYTES + ids + _labels_bytes(info.labels)


def _encode_token(kind: bytes, scope: bytes, raw: bytes) -> str:
    """A page token: the listing's kind, a hash of its scope (the session, or the filters), the resume key."""
    return base64.urlsafe_b64encode(kind + b":" + xxhash.xxh3_64_digest(scope) + raw).decode().rstrip("=")


def _decode_token(token: str, kind: bytes, scope: bytes) -> bytes:
    """The resume key in a page token issued for this listing (kind and scope); InvalidArgument for any other.

    Tokens are not signed: the checks keep a token of one listing (another
    session's versions, other filters) from quietly resuming another one
    part-way and making it look complete.
    """
    if not token:
        return b""
    try:
        raw = base64.b64decode(token + "=" * (-len(token) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    head = kind + b":"
    if not raw.startswith(head) or len(raw) < len(head) + 8:
        raise InvalidArgument(f"page_token {keys.quoted(token)} is not a token this server issued for this listing")
    if raw[len(head) : len(head) + 8] != xxhash.xxh3_64_digest(scope):
        raise InvalidArgument(
            f"page_token {keys.quoted(token)} was issued for another listing (another session, one deleted since under"
            " the same id, or other filters); a listing resumes only with the tokens it returned"
        )
    return raw[len(head) + 8 :]
