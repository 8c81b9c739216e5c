"""Retention and the sweeper: old versions pruned, request ids expired, quiet sessions folded and keyframed.

A sweep is a series of write ops, each a bounded chunk of work, so that
writes keep flowing between them. The sweeper thread runs one every
sweep_interval_seconds, on a schedule kept in the meta table across restarts.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from itertools import chain

from ckpt.store.v1 import records_pb2

from ..config import StoreConfig
from ..errors import StoreFull, Unavailable
from ..storage import ReadTxn, WriteTxn
from . import keys
from .args import check_int_arg
from .blobs import Blobs
from .eventlog import EventLog
from .keyframes import QuietSweeps
from .layout import LAST_SWEEP_KEY, Tables, meta_int
from .ops import Batch, Op
from .reads import chain_start, delete_frames
from .records import meta_of, printable, record
from .requestids import RequestIds
from .types import SweepResult
from .writer import STORE_FULL_LOG_SECONDS

log = logging.getLogger("ckpt.store")

# Sessions per retention op.
_SWEEP_CHUNK = 1000


class Retention:
    """Sweeps: request-id expiry, version retention, quiet folds and keyframes; and what they did so far."""

    def __init__(
        self,
        config: StoreConfig,
        tables: Tables,
        read: Callable[[], AbstractContextManager[ReadTxn]],
        submit: Callable[[Op], Op],
        requests: RequestIds,
        quiet: QuietSweeps,
        events: EventLog,
    ) -> None:
        self._config = config
        self._events = events
        self._tables = tables
        self._read = read
        self._submit = submit
        self._requests = requests
        self._quiet = quiet
        # One sweep at a time (the sweeper thread's, or a caller's sweep()).
        self._lock = threading.Lock()
        #: Sweeps completed since the store opened, what they did in all, and when the last one ended
        #: (time.time(); None: none yet): an operator's evidence that retention runs.
        self.sweeps = 0
        self.swept = SweepResult(0, 0, 0)
        self.last_sweep_unix_seconds: float | None = None
        #: Blobs (blobs.py): references retention made unnamed are dropped, files without a record removed.
        self.blobs: Blobs | None = None

    def sweep(self, now: int) -> SweepResult:
        check_int_arg("now_nanos", now)
        with self._lock:
            result = self._sweep(now)
            self.swept += result
            self.sweeps += 1
            self.last_sweep_unix_seconds = time.time()
        return result

    def _sweep(self, now: int) -> SweepResult:
        pruned = removed = expired = 0
        began = time.time_ns()  # not ``now``, which a caller may set ahead
        more = True
        while more:  # request ids first: they expire even if a session cannot be pruned
            n, more = self._submit(Op(self._requests.expire_op(now))).wait()
            expired += n
        if expired and (self._requests.layout1 or self._requests.hex_keyed):
            # Read once committed: while one is left, writes must look under its key too.
            with self._read() as txn:
                self._requests.recheck(txn)
        # Sessions marked for a look at their blob references (SessionRecord.blob_refs_unchecked): pruned
        # now, or earlier by a sweep whose release was skipped or cut off (a crash, a full store).
        marked: list[bytes] = []
        if self._config.retention.enabled:
            after = b""
            while True:
                with self._read() as txn:
                    chunk = txn.keys_after(self._tables.sessions, after, _SWEEP_CHUNK)
                if not chunk:
                    break
                after = chunk[-1]
                counts = self._submit(Op(self._prune_op(chunk, now, marked))).wait()
                pruned += counts[0]
                removed += counts[1]
        released = 0
        if self.blobs is not None:
            released = self.blobs.release_unnamed(marked)
            if (age := self._config.retention.max_version_age_seconds) is not None:
                released += self.blobs.release_sessionless(now - int(age * 1e9))
            self.blobs.sweep_files()
        events_removed = self._sweep_events(now) if self._config.retention.events_enabled else 0
        folded, keyframes = self._quiet.sweep(now)
        result = SweepResult(pruned, removed, expired, keyframes, events_removed, folded, released)
        if result.changed and self._tables.meta is not None:
            # The schedule a restarted store goes on with (Sweeper.first_delay). Kept only by a sweep that
            # wrote anyway: an idle store's sweeps commit nothing, and after a restart its next sweep,
            # due at once, finds nothing again.
            self._submit(Op(self._keep_sweep_time_op(began))).wait()
        return result

    def _sweep_events(self, now: int) -> int:
        """Event retention (keep_last_events, max_event_age_seconds), a chunk of logs per op; events removed."""
        logs = self._tables.event_logs
        if logs is None:
            return 0
        removed = 0
        after = b""
        while True:
            with self._read() as txn:
                chunk = txn.keys_after(logs, after, _SWEEP_CHUNK)
            if not chunk:
                return removed
            after = chunk[-1]
            removed += self._submit(self._events.prune_op(chunk, now)).wait()[1]

    def _keep_sweep_time_op(self, began_nanos: int) -> Callable[[Batch, WriteTxn], None]:
        def apply(batch: Batch, txn: WriteTxn) -> None:
            txn.put(LAST_SWEEP_KEY, b"%d" % began_nanos, db=self._tables.meta)

        return apply

    def _prune_op(
        self, sids: list[bytes], now: int, marked: list[bytes]
    ) -> Callable[[Batch, WriteTxn], tuple[int, int]]:
        """The op pruning sessions ``sids``; those whose blob references retention must look at (marked in
        their record: the mark commits with the versions' removal) are added to ``marked`` once committed."""
        tables = self._tables
        blobs = self.blobs

        def apply(batch: Batch, txn: WriteTxn) -> tuple[int, int]:
            pruned = removed = 0
            done: list[bytes] = []
            batch.after_commit.append(lambda: marked.extend(done))
            for sid in sids:
                raw = txn.get(sid, db=tables.sessions)
                if raw is None:
                    continue
                try:
                    rec = record(raw)
                    start = self._retention_start(txn, sid, rec, now)
                except Exception as exc:  # only reads so far: nothing of the session's to undo
                    # Keep the damaged session as it is (verify names it) and prune the others.
                    log.warning("retention skipped session %r: %s", printable(sid), exc)
                    continue
                if start <= rec.first_version:
                    if rec.blob_refs_unchecked:
                        done.append(sid)
                    continue
                n, freed = delete_frames(txn, tables.frames, sid, below=start)
                rec.first_version = start
                rec.version_count -= n
                rec.stored_bytes -= freed
                if blobs is not None and (rec.blob_refs_unchecked or blobs.has_refs(txn, sid)):
                    rec.blob_refs_unchecked = True
                    done.append(sid)
                txn.put(sid, rec.SerializeToString(), db=tables.sessions)
                pruned += 1
                removed += n
            return pruned, removed

        return apply

    def _retention_start(self, txn: ReadTxn, sid: bytes, rec: records_pb2.SessionRecord, now: int) -> int:
        """The first version retention keeps: a chain start, so no delta loses its base."""
        retention = self._config.retention
        cut = rec.first_version
        if retention.keep_last_versions is not None:
            cut = max(cut, rec.head_version - retention.keep_last_versions + 1)
        if retention.max_version_age_seconds is not None:
            oldest = now - int(retention.max_version_age_seconds * 1e9)
            cut = max(cut, self._first_version_since(txn, sid, rec, oldest))
        cut = min(cut, rec.head_version)  # the head always stays
        if cut <= rec.first_version:
            return rec.first_version
        return chain_start(txn, self._tables.frames, sid, printable(sid), cut)

    def _first_version_since(self, txn: ReadTxn, sid: bytes, rec: records_pb2.SessionRecord, oldest: int) -> int:
        first_key = keys.frame_key(sid, rec.first_version)
        items = txn.scan(self._tables.frames, first_key)
        found = next(items, None)
        if found is None or found[0] != first_key:
            return rec.first_version
        prefix = sid + keys.SEP
        for key, value in chain((found,), items):
            if not key.startswith(prefix):
                break
            if meta_of(value).created_unix_nanos >= oldest:
                return keys.frame_version(key, sid)
        return rec.head_version


class Sweeper:
    """The thread that sweeps every sweep_interval_seconds until the store closes."""

    def __init__(
        self,
        config: StoreConfig,
        tables: Tables,
        read: Callable[[], AbstractContextManager[ReadTxn]],
        sweep: Callable[[], SweepResult],
        forget_dead_readers: Callable[[], None],
        closing: threading.Event,
    ) -> None:
        self._config = config
        self._tables = tables
        self._read = read
        self._sweep = sweep
        self._forget_dead_readers = forget_dead_readers
        self._closing = closing
        self._thread = threading.Thread(target=self._run, name="ckpt-sweeper", daemon=True)
        self._full_logged_at = -math.inf

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        self._thread.join()

    def first_delay(self) -> float:
        """Seconds until the first sweep: what is left of the interval since the last sweep that changed
        anything began (in this process or before a restart; else since the store was first opened), 0
        if that is past. Counting from each start instead, a store restarted more often than its
        interval never swept: retention, request-id expiry and quiet keyframes stopped, unseen, while
        the data grew."""
        interval = self._config.sweep_interval_seconds
        last = meta_int(self._read, self._tables, LAST_SWEEP_KEY)
        if not last:
            return interval
        since = (time.time_ns() - last) / 1e9
        return min(interval, max(0.0, interval - since))  # a clock stepped back: one interval at most

    def _run(self) -> None:
        delay = self.first_delay()
        while not self._closing.wait(delay):
            delay = self._config.sweep_interval_seconds
            self._forget_dead_readers()
            try:
                t0 = time.monotonic()
                done = self._sweep()
                if done.changed:
                    log.info(
                        "retention sweep: %d versions removed from %d sessions, %d request ids expired,"
                        " %d quiet heads folded, %d quiet keyframes written, %d events removed,"
                        " %d blob references released (%.2f s)",
                        done.versions_removed,
                        done.sessions_pruned,
                        done.request_ids_expired,
                        done.heads_folded,
                        done.keyframes_written,
                        done.events_removed,
                        done.blob_refs_released,
                        time.monotonic() - t0,
                    )
            except Unavailable:
                pass  # closing
            except StoreFull as exc:  # no traceback: the cause is outside, and said in full
                # Each sweep meets it again until there is room: said once, then once a minute at most.
                if time.monotonic() - self._full_logged_at >= STORE_FULL_LOG_SECONDS:
                    self._full_logged_at = time.monotonic()
                    log.warning("the retention sweep could not write (it tries again each sweep): %s", exc)
            except Exception:  # logged and tried again next round: retention must not stop for good
                log.exception("the retention sweep failed")
