"""A write waiting for the writer thread (Op), what one group commit gathers besides storage (Batch),
and how the callers of a commit are woken."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..storage import WriteTxn


def _held_lock() -> threading.Lock:
    lock = threading.Lock()
    lock.acquire()
    return lock


@dataclass(slots=True)
class Op:
    """A write waiting for the writer thread.

    The caller blocks in :meth:`wait` on a lock released once the op's
    outcome is known: one futex wake-up, where a Future's condition variable
    costs several lock round trips on the writer's critical path. The blocked
    callers of one commit are woken in turn (:func:`wake_in_turn`), not all
    at once. Asyncio callers get an asyncio future on their loop instead
    (``loop`` and ``afuture`` set).
    """

    apply: Callable[[Batch, WriteTxn], Any]
    #: The op raises StoreError/CodecError only before its first storage write,
    #: so it can share the batch transaction without a nested one of its own.
    fails_clean: bool = False
    #: About how many bytes the op stores (its state): what a full disk is checked against.
    size_bytes: int = 0
    #: A delete: on a full store it may use the map's reserve (Storage.open_reserve), so that deleting
    #: sessions always makes room, even when the last writes took every page.
    frees_room: bool = False
    #: The store's own upkeep (a sweep's write), not a client's: refused for want of room, it is neither
    #: counted nor logged as a refused write (the sweep logs it), and its error advises no retry.
    upkeep: bool = False
    #: Its size_bytes while it counts against max_queued_write_bytes (0 once answered).
    queued_bytes: int = 0
    #: A check still to pass before the op may be queued (a large MERGE patch's, run on a
    #: thread: checkline.py); None once passed, or if there is none.
    check: Callable[[], None] | None = None
    loop: asyncio.AbstractEventLoop | None = None
    afuture: asyncio.Future[Any] | None = None
    _done: threading.Lock = field(default_factory=_held_lock)
    _result: Any = None
    _error: BaseException | None = None
    resolved: bool = False
    #: Its outcome lets its caller go on (and perhaps write again): false for
    #: all but the last write of a put_many, whose caller waits for them all.
    releases_caller: bool = True
    #: Its caller waits for it alone, at once, in :meth:`wait` (Store.put
    #: off the main thread), so it may be woken in turn: an op in the line
    #: that nobody waits for would leave every op after it waiting. Not
    #: put_many's writes: one caller waits for many, and an interrupted wait
    #: would leave the rest unwaited. (An exception forced into a waiting
    #: thread with PyThreadState_SetAsyncExc could still break the line.)
    wakes_in_turn: bool = False
    #: The op whose caller this op's caller wakes, in a one-item list: taking
    #: it (list.pop, atomic under the GIL) decides who wakes it, should this
    #: op's caller abandon its wait.
    _then: list[Op] | None = None
    _woken: bool = False
    _abandoned: bool = False

    def resolve(self, result: Any, error: BaseException | None) -> None:
        self.resolved = True
        if self.loop is not None:
            settle_on(self.loop, [(self, result, error)])
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
        error = self._error
        if error is not None:
            # Raised, the error's traceback holds the caller's frame, which holds this op: without it the
            # op no longer holds the error, and the request it carries is freed with the error, not by
            # the collector.
            self._error = None
            try:
                raise error
            finally:
                del error  # nor this frame (in the traceback too)
        return self._result


#: An op's outcome: the op, its result, and the error it failed with (None if it did not).
Outcome = tuple[Op, Any, BaseException | None]


@dataclass(slots=True)
class Batch:
    """What one group commit changes besides storage, applied only after commit, and the writes it keeps
    for the end of its transaction (before_commit)."""

    touched_encoders: set[bytes] = field(default_factory=set)
    after_commit: list[Callable[[], None]] = field(default_factory=list)
    #: Encoders kept until the commit (to go back into the encoder cache),
    #: by session, with their memory_bytes; and the sum of those.
    held_encoders: dict[bytes, int] = field(default_factory=dict)
    held_encoder_bytes: int = 0
    #: Request records to put just before the commit, by requests key (RequestIds.store): put in key
    #: order, after the keys of earlier commits, each lands at the table's right edge, where LMDB leaves
    #: the page it splits full (one put in the middle of a page splits it in halves).
    pending_requests: dict[bytes, bytes] = field(default_factory=dict)
    #: Whether the op being applied shares the batch's transaction (its records may wait for the commit);
    #: an op in a nested transaction puts its own, undone with it if it fails.
    defer_requests: bool = False
    #: Called with the transaction after the last op and before the commit.
    before_commit: list[Callable[[WriteTxn], None]] = field(default_factory=list)


def wake_in_turn(outcomes: list[Outcome]) -> None:
    """Resolve ops whose callers block in :meth:`Op.wait`, waking only the first.

    Each caller wakes the next as it returns from its wait, so about one
    caller at a time contends for the GIL with the writer. Woken all at once,
    64 threads cost 47-73 us of kernel time per write (33-52 in turn), and
    group commit made 8% fewer writes/s on disk and 14% fewer on tmpfs (64
    threads, the group-commit benchmark's states, 6 alternating rounds).
    """
    then: Op | None = None
    for op, result, error in reversed(outcomes):
        op._result, op._error = result, error
        op._then = None if then is None else [then]
        op.resolved = True
        then = op
    _wake_in_order(then)


def _taken(op: Op) -> Op | None:
    """The op ``op``'s caller is to wake next, if nobody took it yet."""
    then = op._then
    if not then:
        return None
    try:
        return then.pop()
    except IndexError:  # taken by a racing thread: it wakes it
        return None


def _wake_in_order(op: Op | None) -> None:
    # A loop, not recursion: a run of abandoned waits is woken here in one go.
    while op is not None:
        op._woken = True
        op._done.release()
        if not op._abandoned:
            return
        op = _taken(op)


def settle_on(loop: asyncio.AbstractEventLoop, outcomes: list[Outcome]) -> None:
    """Resolve asyncio ops of one loop with a single wake-up of that loop."""
    # A closed loop raises RuntimeError: nobody is left waiting (the writes still committed).
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(_settle, outcomes)


def _settle(outcomes: list[Outcome]) -> None:
    for op, result, error in outcomes:
        fut = op.afuture
        if fut is None or fut.done():  # the awaiting task was cancelled; the write stands
            continue
        if error is None:
            fut.set_result(result)
        else:
            fut.set_exception(error)


def upkeep_submit(submit: Callable[[Op], Op]) -> Callable[[Op], Op]:
    """``submit`` marking each op the store's own upkeep (:attr:`Op.upkeep`): what sweeps submit through."""

    def run(op: Op) -> Op:
        op.upkeep = True
        return submit(op)

    return run
