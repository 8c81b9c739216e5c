"""The writer thread: one queue of writes, group commit, and what a failed or full commit does.

Every write (put, fork, delete, retention) is an Op handed to the single
writer thread. The writer drains whatever ops are queued, applies each in
the batch's write transaction (a bad request fails alone), commits them all
at once, and only then updates the caches and answers them. A lone put or
append from a thread other than the main one, finding the writer idle,
commits itself the same way on its own thread (Writer.run_or_submit): one
batch runs at a time, whoever runs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable

from ...codec import CodecError, DecodeError
from ..config import StoreConfig
from ..errors import DataLoss, InvalidArgument, Overloaded, StoreError, StoreFull, Unavailable
from ..storage import Storage
from .encoders import Encoders
from .gather import close_in
from .ops import Batch, Op, Outcome, settle_on, wake_in_turn

log = logging.getLogger("ckpt.store")

# A full store is logged when it first refuses a write, then at most this often
# (with the count refused meanwhile): an operator must hear of it, not once per write.
STORE_FULL_LOG_SECONDS = 60.0

#: How often, at most, the writer thread runs Writer.periodic, whether it is idle or not.
PERIODIC_SECONDS = 0.25


class _Unclean(Exception):
    """An op raised something unexpected mid-batch: redo the batch with each op isolated."""


class Writer:
    """The write queue, its bound (max_queued_write_bytes), and the thread that commits it in batches.

    The queue holds single ops, lists of ops gathered on an event loop
    (LoopBatches, committed together), and None: the stop marker.
    """

    def __init__(
        self,
        config: StoreConfig,
        storage: Storage,
        encoders: Encoders,
        *,
        readonly: bool,
        on_writes_stopped: Callable[[str], object] | None,
    ) -> None:
        self._config = config
        self._storage = storage
        self._encoders = encoders
        self._readonly = readonly
        self._full = storage.errors.full
        self._fails_alone: tuple[type[BaseException], ...] = (StoreError, CodecError, *storage.errors.damage)
        #: Why the store stopped taking writes (a commit failed with an I/O error), or None.
        self.writes_stopped: str | None = None
        # Called once, on the thread whose commit failed, when writes stop: a
        # server exits so that its supervisor reopens the store.
        self._on_writes_stopped = on_writes_stopped
        self.queue: queue.SimpleQueue[Op | list[Op] | None] = queue.SimpleQueue()
        #: Set once no more writes are taken (closing, or read-only).
        self.closing = threading.Event()
        self._stop_queued = False  # stop() queued its marker
        self._queue_closed = False  # close_queue() (or stop()) took the last writes
        # Bytes of states queued and not yet answered (max_queued_write_bytes);
        # blocking submitters wait on `room`, which the writer signals per batch.
        # Held while enqueueing, so that no write can land behind the stop marker.
        self.room = threading.Condition(threading.Lock())
        self.queued_bytes = 0
        self.batch_sizes: Counter[int] = Counter()
        self.commits = 0
        #: Times the writer waited for writers it expected before a commit, and the seconds it waited.
        self.commit_delays = 0
        self.commit_delay_seconds = 0.0
        #: Seconds spent in storage commits (LMDB's page writes and syncs): over ``commits``, a commit's cost.
        self.commit_seconds = 0.0
        #: Writes refused because the store was full (the map at its cap, or the disk), and when
        #: that was last logged (monotonic; -inf: never) with the count then.
        self.store_full_refusals = 0
        self._store_full_logged = (-math.inf, 0)
        #: What the commit delay goes by (gather.close_in): the last commit's duration, and the
        #: writers seen around it.
        self.last_commit_seconds = 0.0
        self._expected_writers = 1
        self._handed_over = 0.0  # monotonic: when the last batch stopped gathering
        # Set by submit once _gather_target writes are queued (0: the writer is not waiting).
        self._gather_target = 0
        # Submitters waiting for room under max_queued_write_bytes: while any
        # do, the writers a commit would wait for cannot queue.
        self.room_waiters = 0
        self._gathered = threading.Event()
        #: False while an event loop gathers its writes itself (LoopBatches): none would come here.
        self.gathers = True
        # A piece of the loop's batch that would not fit the writer's batch: its next batch begins with it.
        self._carried: list[Op] | None = None
        #: Run on the writer thread every PERIODIC_SECONDS or so while set, idle or not (LoopBatches:
        #: a batch its loop will not hand over, closed); set it, then queue [] to wake the writer.
        self.periodic: Callable[[], object] | None = None
        self._periodic_ran = 0.0  # monotonic
        # Held by whoever runs a batch: the writer thread, or a caller committing its own write (run_or_submit).
        self._batch_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="ckpt-writer", daemon=True)
        if readonly:
            self.closing.set()  # every write is refused with Unavailable

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """Take no more writes; commit those queued (:meth:`close_queue` queues a loop's batch), then end the
        thread.

        Called again (after an interrupted call), it only waits for the thread.
        """
        with self.room:
            if not self._stop_queued:
                self._close_queue_locked(list)
                self.queue.put(None)
                self._stop_queued = True
        if not self._readonly:
            self._thread.join()
        with self._batch_lock:  # a caller's own commit (run_or_submit) still running ends first
            pass

    def close_queue(self, pending: Callable[[], list[Op]]) -> None:
        """Take no more writes; queue ``pending()`` (a loop's batch) to commit. The thread goes on, taking only
        the store's own ops (:meth:`submit_own`), until :meth:`stop`."""
        with self.room:
            self._close_queue_locked(pending)

    def _close_queue_locked(self, pending: Callable[[], list[Op]]) -> None:
        if self._queue_closed:
            return
        self._queue_closed = True
        self.closing.set()
        ops = pending()
        if ops:
            self.queue.put(ops)
        self._gathered.set()  # a writer waiting for more writes commits what it has
        self.room.notify_all()  # writes waiting for room are refused now

    def submit_own(self, op: Op) -> Op:
        """Queue the store's own ``op`` (no state, not counted against max_queued_write_bytes) after
        :meth:`close_queue`, before :meth:`stop`; Unavailable once writes stopped or the writer ends."""
        with self.room:
            if self.writes_stopped is not None:
                raise Unavailable(self.writes_stopped)
            if self._stop_queued or self._readonly:
                raise Unavailable("the store is closing; no new writes are accepted")
            self.put_locked(op)
        return op

    # -- queueing ------------------------------------------------------------------

    def submit(self, op: Op) -> Op:
        """Queue ``op``; past max_queued_write_bytes, wait for room."""
        with self.room:
            self.admit(op, wait=True)
            try:
                self.put_locked(op)
            except BaseException:
                # A KeyboardInterrupt (a signal handler) after admit: the op never reaches the queue, so its
                # bytes must not count against max_queued_write_bytes for ever.
                self.release_locked([op])
                raise
        return op

    def run_or_submit(self, op: Op) -> Op:
        """Commit ``op`` on this thread if the writer is idle, else :meth:`submit` it: the op, to wait on.

        Idle: no batch running, nothing queued or counted against max_queued_write_bytes, and the last
        commit let one writer go on with none queued behind it. A lone write handed to the writer thread
        and answered back costs two thread wake-ups, 12% of an embedded LangGraph put (bench/HISTORY.md);
        with more writers about, the writer thread gathers them into one commit, which a caller committing
        alone would split. Not on the main thread, where a signal handler may raise between any two steps
        of a commit; nor for an op with a check still to pass.
        """
        lock = self._batch_lock
        if (
            op.check is None
            and self._expected_writers <= 1
            and threading.current_thread() is not threading.main_thread()
            and lock.acquire(blocking=False)
        ):
            try:
                if self._admit_if_idle(op):
                    self._commit([op])
                    return op
            finally:
                lock.release()
        return self.submit(op)

    def _admit_if_idle(self, op: Op) -> bool:
        """Admit ``op`` if nothing is queued or counted against max_queued_write_bytes; refused as by
        :meth:`submit` once the store is closing or its writes stopped. With the batch lock held."""
        with self.room:
            if self.queued_bytes or self._carried is not None or not self.queue.empty():
                return False
            self.admit(op, wait=False)
            return True

    def put_locked(self, op: Op) -> None:
        """Queue an admitted ``op``; under room."""
        self.queue.put(op)
        target = self._gather_target
        if target and self.queue.qsize() >= target:
            self._gathered.set()

    def admit(self, op: Op, *, wait: bool) -> None:
        """Count ``op`` against max_queued_write_bytes, waiting for room (or raising Overloaded); under room."""
        size = op.size_bytes
        while True:
            if self.writes_stopped is not None:
                raise Unavailable(self.writes_stopped)
            if self.closing.is_set():
                if self._readonly:
                    raise Unavailable("the store is open read-only; writes are refused")
                raise Unavailable("the store is closing; no new writes are accepted")
            queued = self.queued_bytes
            if not queued or queued + size <= self._config.max_queued_write_bytes:
                break
            if not wait:
                raise Overloaded(
                    f"the store is overloaded: {queued} bytes of writes are queued for its writer and this"
                    f" {size}-byte write would pass max_queued_write_bytes ({self._config.max_queued_write_bytes});"
                    " retry shortly with the same request_id"
                )
            self.room_waiters += 1
            try:
                self.room.wait()
            finally:
                self.room_waiters -= 1
        self.queued_bytes = queued + size
        op.queued_bytes = size

    def _answered(self, ops: list[Op]) -> None:
        """``ops`` are about to be answered: their bytes stop counting against max_queued_write_bytes.

        Before their callers learn the outcome, so that a caller writing again
        at once finds the room its last write left. Idempotent per op.
        """
        with self.room:
            self.release_locked(ops)

    def release_locked(self, ops: list[Op]) -> None:
        """:meth:`_answered`, under room (also for ops admitted and then refused before they were queued)."""
        size = 0
        for op in ops:
            size += op.queued_bytes
            op.queued_bytes = 0
        if size:
            self.queued_bytes -= size
            self.room.notify_all()

    # -- the thread ------------------------------------------------------------------

    def _run(self) -> None:
        stop = False
        while not stop:
            first = self._carried or self._next()
            # Taken before the batch is gathered: what queued behind a caller's own commit joins it.
            with self._batch_lock:
                batch, stop = self._take_batch(first)
                if batch:
                    self._commit(batch)
            # Not kept while the writer waits for the next write: the ops hold
            # their requests' states and their callers' futures.
            del batch, first

    def _commit(self, batch: list[Op]) -> None:
        """Run ``batch`` (with the batch lock held) and answer every op of it, whatever happens."""
        try:
            self._run_batch(batch)
        except BaseException as exc:  # a bug: the writer must outlive it, or every caller hangs
            self._fail_unresolved(batch, exc)
        finally:
            # A batch that ran its course released its bytes as it answered them: the lock is
            # taken again only for one that did not (~6 us a commit, in the writer's line).
            if any(op.queued_bytes for op in batch):
                self._answered(batch)

    def _fail_unresolved(self, ops: list[Op], exc: BaseException) -> None:
        """After an unexpected error in a batch: fail whoever still waits, forget what may be stale."""
        log.error("the writer failed a batch of %d writes", len(ops), exc_info=exc)
        # The batch may or may not have committed: the caches are rebuilt from storage.
        self._encoders.clear()
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

    def _take_batch(self, first: Op | list[Op] | None) -> tuple[list[Op], bool]:
        """``first`` (the item carried over or queued first) and the writes queued after it, up to
        max_batch_writes; and whether stop() was called."""
        self._carried = None
        if first is None:
            return [], True
        batch = first if isinstance(first, list) else [first]
        stop = self._drain(batch)
        if self.gathers and not stop:
            # Writers the last commit answered are likely preparing their next write
            # (gather.close_in). Without the wait, 64 threads settle into two half-size
            # batches taking turns. While writers wait for room, none can queue: no wait.
            expected = 0 if self.room_waiters else min(self._expected_writers, self._config.max_batch_writes)
            began = time.monotonic()
            wait = close_in(
                gathered=len(batch),
                expected=expected,
                last_commit_seconds=self.last_commit_seconds,
                since_hand_over_seconds=began - self._handed_over,
                max_commit_delay_seconds=self._config.max_commit_delay_seconds,
            )
            if wait > 0:
                # One wake-up when they are all queued (put_locked), not one per write.
                self._gathered.clear()
                self._gather_target = expected - len(batch)
                if self.queue.qsize() < self._gather_target:
                    self._gathered.wait(wait)
                    self.commit_delays += 1
                    self.commit_delay_seconds += time.monotonic() - began
                self._gather_target = 0
                stop = self._drain(batch)
        self._handed_over = now = time.monotonic()
        if self.periodic is not None and now - self._periodic_ran >= PERIODIC_SECONDS:
            self._run_periodic()
        return batch, stop

    def _next(self) -> Op | list[Op] | None:
        """The next item queued, waiting for one (and running ``periodic`` meanwhile, if set)."""
        while self.periodic is not None:
            try:
                return self.queue.get(timeout=PERIODIC_SECONDS)
            except queue.Empty:
                self._run_periodic()
        return self.queue.get()

    def _run_periodic(self) -> None:
        self._periodic_ran = time.monotonic()
        periodic = self.periodic
        if periodic is not None:
            try:
                periodic()
            except Exception:  # a bug: the writer must outlive it
                log.exception("the writer's periodic check failed")

    def _drain(self, batch: list[Op]) -> bool:
        """Move what is queued into ``batch``, up to max_batch_writes; whether the stop marker was among it."""
        stop = False
        limit = self._config.max_batch_writes
        while len(batch) < limit and self._carried is None:
            try:
                item = self.queue.get_nowait()
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

    def _run_batch(self, ops: list[Op], *, isolate: bool = False) -> None:
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
        full = self._full
        reserve_opened = False
        try:
            while True:
                began = time.monotonic()
                batch = Batch()
                outcomes: list[Outcome] = []
                try:
                    with self._storage.write() as txn:
                        for op in ops:
                            batch.defer_requests = op.fails_clean and not isolate
                            if batch.defer_requests:
                                try:
                                    outcomes.append((op, op.apply(batch, txn), None))
                                except (StoreError, CodecError) as exc:
                                    outcomes.append((op, None, self._as_store_error(exc)))
                                except full:
                                    raise
                                except Exception as exc:
                                    raise _Unclean from exc
                                continue
                            try:
                                with txn.nested() as sub:
                                    outcomes.append((op, op.apply(batch, sub), None))
                            except full:
                                raise
                            except self._fails_alone as exc:
                                outcomes.append((op, None, self._as_store_error(exc)))
                            except Exception as exc:  # a bug: fail this op, keep serving
                                outcomes.append((op, None, exc))
                        for finish in batch.before_commit:
                            finish(txn)
                        committing = time.monotonic()
                except _Unclean:
                    for sid in batch.touched_encoders:
                        self._encoders.discard(sid)
                    isolate = True
                    continue
                except full:
                    # Nothing was committed. Encoders already advanced for this
                    # batch are dropped (they are rebuilt from storage on next use).
                    for sid in batch.touched_encoders:
                        self._encoders.discard(sid)
                    # Pages the last commit freed (a session deleted) are not reusable until another commits.
                    if self._storage.grow() or self._storage.release_freed():
                        continue
                    # Deletes alone may take the room kept back from other writes: a full store can still shrink.
                    if all(op.frees_room for op in ops) and self._storage.open_reserve():
                        reserve_opened = True
                        continue
                    self._split_or_refuse(
                        ops,
                        isolate=isolate,
                        why=f"the store is full: {self._storage.cap_reached()}; nothing was written: raise it, or"
                        " delete sessions to free room inside the map",
                    )
                    return
                except BaseException as exc:  # commit failed (I/O error): nothing is acknowledged
                    # Whether storage kept it or not, the cached states may be stale either way.
                    for sid in batch.touched_encoders:
                        self._encoders.forget(sid)
                    why = self._storage.why_full(exc, sum(op.size_bytes for op in ops))
                    if why is None:
                        self._stop_writes(exc)
                        self._refuse(ops)
                        return
                    if self._storage.release_freed():
                        continue
                    # Pages freed inside the file may still hold a smaller commit.
                    self._split_or_refuse(
                        ops,
                        isolate=isolate,
                        why=f"no space to write under {self._config.data_dir} ({why}); nothing was written:"
                        " free disk space or delete sessions",
                        retry=", then retry with the same request_id",
                    )
                    return
                committed = time.monotonic()
                self.commits += 1
                self.commit_seconds += committed - committing
                self.batch_sizes[len(ops)] += 1
                self.last_commit_seconds = committed - began
                self._storage.committed()
                # Writers seen around this commit: those it lets go on, and those who queued meanwhile.
                released = sum(1 for op in ops if op.releases_caller)
                self._expected_writers = released + self.queue.qsize()
                for action in batch.after_commit:
                    action()
                self._answered(ops)
                _answer(outcomes)
                return
        finally:
            if reserve_opened:  # a delete's commit, or its refusal: other writes keep off the reserve again
                self._storage.close_reserve()

    def _as_store_error(self, exc: BaseException) -> StoreError:
        if isinstance(exc, StoreError):
            # A write's refusal is told by its message. Its traceback holds this batch's frames, and they
            # the outcomes holding it: a cycle that would keep every refused request (a state of up to
            # max_state_bytes) until the collector ran.
            exc.__context__ = None
            return exc.with_traceback(None)
        if isinstance(exc, DecodeError):
            return DataLoss(str(exc))
        if isinstance(exc, self._storage.errors.damage):
            return self._storage.damaged(exc)
        return InvalidArgument(str(exc))

    def _stop_writes(self, exc: BaseException) -> None:
        """After a commit failed with an I/O error: take no more writes until reopened.

        The writes queued behind the failed batch would otherwise commit
        without it, out of the order they were sent (a stream's next batch
        after a refused one); and after a failed fsync what the page cache
        holds is no longer known to be what the disk will keep. As databases
        do on a failed fsync, stop writing: reopening starts from the last
        committed transaction, which the storage never lost.
        """
        with self.room:
            self.writes_stopped = (
                f"the store stopped taking writes: a commit failed ({exc!r}); nothing after it was written."
                " Reopen the store (restart the sidecar), then retry with the same request_id"
            )
            self.room.notify_all()  # writes waiting for room are refused now
        log.error("%s", self.writes_stopped)
        if self._on_writes_stopped is not None:
            try:
                self._on_writes_stopped(self.writes_stopped)
            except Exception:
                log.exception("on_writes_stopped failed")

    def _refuse(self, ops: list[Op]) -> None:
        """Answer ``ops`` Unavailable(writes_stopped): none of them was written."""
        assert self.writes_stopped is not None
        self._answered(ops)
        for op in ops:
            op.resolve(None, Unavailable(self.writes_stopped))

    def _split_or_refuse(self, ops: list[Op], *, isolate: bool, why: str, retry: str = "") -> None:
        """At a size limit: each write of a batch gets its own chance; a lone write is refused with StoreFull
        saying ``why`` (and, to a client's write, ``retry``)."""
        if len(ops) > 1:
            for op in ops:
                self._run_batch([op], isolate=isolate)
            return
        self._answered(ops)
        if ops[0].upkeep:
            ops[0].resolve(None, StoreFull(why))
            return
        error = StoreFull(why + retry)
        self.count_store_full(error)
        ops[0].resolve(None, error)

    def count_store_full(self, error: StoreFull) -> None:
        """Count a write refused for want of room; log it the first time and then once a minute at most."""
        self.store_full_refusals += 1
        logged_at, logged_count = self._store_full_logged
        now = time.monotonic()
        if now - logged_at >= STORE_FULL_LOG_SECONDS:
            since = self.store_full_refusals - logged_count
            log.warning("refused %d write%s: %s", since, "" if since == 1 else "s", error)
            self._store_full_logged = (now, self.store_full_refusals)


def _answer(outcomes: list[Outcome]) -> None:
    """Resolve a commit's ops: asyncio ones with one wake-up per loop, blocked callers in turn."""
    by_loop: dict[asyncio.AbstractEventLoop, list[Outcome]] = {}
    in_turn: list[Outcome] = []
    for outcome in outcomes:
        op = outcome[0]
        if op.loop is not None:
            by_loop.setdefault(op.loop, []).append(outcome)
        elif op.wakes_in_turn:
            in_turn.append(outcome)
        else:
            op.resolve(outcome[1], outcome[2])
    for loop, settled in by_loop.items():
        settle_on(loop, settled)
    wake_in_turn(in_turn)
