"""The store's write entry points: one blocking write, many blocking writes, and one asyncio write.

Each builds its write's Op (WriteOps.put_op: the request checked on the
caller's thread) and hands it to the writer (Writer), or to the batch an
event loop gathers (LoopBatches, after write_on_loop).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable, Mapping, Set
from concurrent.futures import Executor
from typing import Any

from ..errors import InvalidArgument, StoreError, Unavailable
from . import keys
from .args import byte_size
from .checkline import CheckLine
from .loopwrites import LoopBatches
from .ops import Op
from .types import OFF_LOOP_PATCH_BYTES, PutRequest, PutResult, WriteMode
from .writeops import WriteOps
from .writer import Writer


def _nothing() -> None:
    pass


def checked_off_loop(request: PutRequest) -> bool:
    """Whether an asyncio write's state is checked on a thread, not the loop (a large MERGE patch or typed state)."""
    state = request.state
    return (
        (request.mode == WriteMode.MERGE or bool(request.message_type))
        and isinstance(state, (bytes, bytearray, memoryview))
        and byte_size(state) >= OFF_LOOP_PATCH_BYTES
    )


def _put_requests(requests: object) -> list[PutRequest]:
    """put_many's ``requests`` as a list, or InvalidArgument naming what is wrong with them. Any iterable
    the writes' order can be taken from: not a mapping (its keys), a set (no order: in order per session
    matters), nor a str or bytes (their characters); each item a PutRequest, not a bare AttributeError."""
    if isinstance(requests, (str, bytes, bytearray, memoryview, Mapping, Set)) or not isinstance(requests, Iterable):
        raise InvalidArgument(
            f"requests must be an iterable of PutRequest (a list, a tuple, a generator), not {type(requests).__name__}"
        )
    listed = list(requests)
    for i, request in enumerate(listed):
        if not isinstance(request, PutRequest):
            raise InvalidArgument(f"requests[{i}] must be a PutRequest, not {type(request).__name__}")
    return listed


class PreparedPut:
    """A put checked, and perhaps encoded, on a thread (Store.encode_put), for Store.asubmit."""

    __slots__ = ("op",)

    def __init__(self, op: Op) -> None:
        self.op = op


class WriteEntryPoints:
    """The write half of :class:`~.engine.Store` (a mixin: Store sets these attributes)."""

    readonly: bool
    _writer: Writer
    _loop: LoopBatches
    _line: CheckLine
    _ops: WriteOps

    def put(
        self,
        session_id: str,
        state: bytes,
        *,
        mode: WriteMode = WriteMode.REPLACE,
        expected_version: int | None = None,
        request_id: str = "",
        labels: dict[str, str] | None = None,
        message_type: str = "",
        expected_state_xxh3: int | None = None,
    ) -> PutResult:
        """Write the next version of a session; returns once it is committed.

        ``expected_version``, ``expected_state_xxh3``: compare-and-set on the head's version and on its
        state's XXH3-64 (a VersionInfo's or PutResult's ``state_xxh3``), VersionConflict unless each given
        holds (a session without versions matches no ``expected_state_xxh3``).

        ``message_type``: the registered (or built-in) type ``state`` holds; the session takes it if it has
        none (see PutRequest.message_type in service.proto). Waits for room first when
        ``max_queued_write_bytes`` of writes are queued.
        """
        op = self._ops.put_op(
            PutRequest(
                session_id,
                state,
                mode,
                expected_version,
                request_id,
                dict(labels or {}),
                message_type,
                expected_state_xxh3,
            ),
            encode_ahead=True,
        )
        # Not the main thread's: a signal handler raising there (Ctrl-C, an
        # alarm) can leave it between queueing and waiting, or between its
        # wake and the next's, where no handler of ours runs; the callers in
        # line after it would never be woken. Other threads get no signals.
        op.wakes_in_turn = threading.current_thread() is not threading.main_thread()
        result: PutResult = self._writer.run_or_submit(op).wait()
        return result

    def put_many(self, requests: Iterable[PutRequest]) -> list[PutResult | StoreError]:
        """Write many versions (in order per session); one result or error each, in the requests' order.

        ``requests``: PutRequests in a list, a tuple or any other ordered iterable (a generator); a
        mapping, a set, a str or bytes, or an item that is no PutRequest raises InvalidArgument, and
        nothing is written. All are queued at once, so they share group commits. Validation errors
        (ids, sizes, labels, a MERGE patch that is not well-formed) and errors
        found in the transaction (version conflicts, a full store) alike come
        back in the list, in the request's place.
        """
        # Every request is checked before any is queued: one that raises something other than a
        # StoreError (a label that is not a str, say) then leaves nothing written, where it used to
        # escape after the writes before it had been queued, and committed.
        ops: list[Op | StoreError] = []
        sessions: set[str] = set()
        for req in _put_requests(requests):
            # A large put is encoded ahead against its session's head: only the first of a session's puts
            # here finds the head it will be written on (the others are encoded by the writer).
            first = req.session_id not in sessions
            sessions.add(req.session_id)
            try:
                ops.append(self._ops.put_op(req, encode_ahead=first))
            except StoreError as exc:
                ops.append(exc)
        queued = [item for item in ops if isinstance(item, Op)]
        for put_op in queued:
            put_op.releases_caller = put_op is queued[-1]
        for i, item in enumerate(ops):
            if isinstance(item, Op):
                try:
                    self._writer.submit(item)
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

    def encodes_ahead(self, request: PutRequest) -> bool:
        """Whether ``request`` is a large put, worth :meth:`encode_put` on a thread before :meth:`asubmit`.

        Judged without reading storage: a REPLACE of ``ENCODE_AHEAD_BYTES``
        or more, or a MERGE making a state as large (by the head the state
        cache holds). False for a request that is not well-formed: asubmit says why.
        """
        state = request.state
        if not isinstance(state, (bytes, bytearray, memoryview)):
            return False
        try:
            mode = WriteMode(request.mode)
            sid = keys.session_key(request.session_id)
        except (ValueError, StoreError):
            return False
        return mode is not WriteMode.FORK and self._ops.ahead.worth(sid, byte_size(state), mode)

    def encode_put(self, request: PutRequest) -> PreparedPut:
        """The first half of :meth:`asubmit`, on a thread (it blocks): ``request`` checked, and if it is a
        large put, its frame encoded against its session's head, so that the writer, which every session's
        writes wait for, only stores it if that head has not moved meanwhile. Raises what asubmit would
        (but Overloaded); hand the result to asubmit on the loop."""
        return PreparedPut(self._ops.put_op(request, encode_ahead=True))

    async def aencode_put(self, request: PutRequest, executor: Executor) -> PutRequest | PreparedPut:
        """``request`` for :meth:`asubmit`, from a coroutine: a large put (:meth:`encodes_ahead`) checked and
        encoded on ``executor`` first (:meth:`encode_put`, whose errors it raises); any other as it is."""
        if not self.encodes_ahead(request):
            return request
        return await asyncio.get_running_loop().run_in_executor(executor, self.encode_put, request)

    def asubmit(
        self, request: PutRequest | PreparedPut, *, encode_on: Executor | None = None
    ) -> asyncio.Future[PutResult]:
        """Queue a write from asyncio; the future (on the running loop) resolves once it is committed.

        Every write the writer commits together for one loop is resolved with
        one wake-up of that loop. Overloaded raises here when
        ``max_queued_write_bytes`` of writes are already queued (the event loop
        must not wait for room: the write is not queued, submit it again
        later), and so do validation errors, but for a MERGE patch (or a
        typed state) of ``OFF_LOOP_PATCH_BYTES`` or more: that is checked on
        the loop's executor (checkline.py) and its errors come from the future. The
        writes submitted on one loop commit in the order they were submitted.
        Cancelling the future does not withdraw the write, nor does closing
        the loop: once queued it commits (retry with the same ``request_id``
        to learn its outcome). A :class:`PreparedPut` (:meth:`encode_put`) is queued as it is: its
        checks passed, and its frame may be encoded already.

        ``encode_on``: a large put (:meth:`encodes_ahead`) is checked and encoded
        on this executor first (:meth:`encode_put`), then queued; its errors,
        Overloaded too, then come from the future, and writes submitted on the
        loop meanwhile may commit before it.
        """
        loop = asyncio.get_running_loop()
        if isinstance(request, PreparedPut):
            return self._asubmit_op(request.op, loop)
        if not isinstance(request, PutRequest):
            raise InvalidArgument(f"request must be a PutRequest, not {type(request).__name__}")
        if encode_on is not None and self.encodes_ahead(request):
            return self._asubmit_encoded(request, encode_on, loop)
        return self._asubmit_op(self._ops.put_op(request, defer_patch_check=checked_off_loop(request)), loop)

    def _asubmit_encoded(
        self, request: PutRequest, executor: Executor, loop: asyncio.AbstractEventLoop
    ) -> asyncio.Future[PutResult]:
        """:meth:`asubmit` with ``encode_on``, for a large put: its future resolves as the queued write's."""
        future: asyncio.Future[PutResult] = loop.create_future()

        def settle(outcome: asyncio.Future[PutResult]) -> None:
            if future.done():  # cancelled: the write stands
                outcome.exception()  # retrieved: asyncio would log it as never retrieved
            elif (error := outcome.exception()) is not None:
                future.set_exception(error)
            else:
                future.set_result(outcome.result())

        def submit(prepared: asyncio.Future[PreparedPut]) -> None:
            try:
                self._asubmit_op(prepared.result().op, loop).add_done_callback(settle)
            except asyncio.CancelledError:  # the executor shut down first: nothing was queued
                if not future.done():
                    future.set_exception(Unavailable("the store is closing; no new writes are accepted"))
            except Exception as exc:
                if not future.done():
                    future.set_exception(exc)

        loop.run_in_executor(executor, self.encode_put, request).add_done_callback(submit)
        return future

    def _asubmit_op(self, op: Op, loop: asyncio.AbstractEventLoop) -> asyncio.Future[Any]:
        """Queue an asyncio write's op as :meth:`asubmit` does (its future resolves once it is committed)."""
        future: asyncio.Future[Any] = loop.create_future()
        op.loop = loop
        op.afuture = future
        line = self._line
        with self._writer.room:
            self._writer.admit(op, wait=False)  # Overloaded leaves it unqueued
            in_line = op.check is not None or line.busy_locked(loop)
            if in_line:
                line.join_locked(op, loop)
                gathered = 0
            else:
                gathered = self._queue_locked(op)
        if in_line:
            line.start(op, loop)
        elif gathered:
            self._loop.gather(loop, gathered)
        return future

    def _queue_locked(self, op: Op) -> int:
        """Queue an admitted asyncio op (under room): into its loop's batch if that loop gathers its
        writes (how many the batch holds then), else for the writer (0)."""
        if op.loop is self._loop.loop:
            return self._loop.add_locked(op)
        self._writer.put_locked(op)
        return 0

    def _gather_on_loop(self, gathered: int) -> None:
        """After checked writes joined the gathering loop's batch (``gathered`` long); on any thread."""
        loop = self._loop.loop
        assert loop is not None
        try:
            loop.call_soon_threadsafe(self._loop.gather, loop, gathered)
        except RuntimeError:  # the loop is closed: nothing would hand its batch over
            with self._writer.room:
                for op in self._loop.take_pending():
                    self._writer.put_locked(op)

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
        the writer's commit answers them or ``HOLD_INPUT_MAX_SECONDS`` pass
        (``release_input()``), so that a commit's work has the GIL to itself
        and the loop, which would wake for each request, sleeps instead.

        When concurrent writes come (the last batch had more than one), a
        batch gathers by the writer thread's rule (gather.close_in): it closes
        once it holds as many writes as the last batch, or three of the last
        commit's durations (at most ``max_commit_delay_seconds``) after the
        last batch was handed over, with the input held until then: the
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
        self._loop.attach(loop, hold_input, release_input)
