"""The store's write entry points: blocking, future-returning and asyncio, alone and in batches.

Each builds its write's Op (WriteOps.put_op: the request checked on the
caller's thread) and hands it to the writer (Writer.submit), or to the batch
an event loop gathers (LoopBatches, after write_on_loop).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future

from ..errors import Overloaded, StoreError
from .loopwrites import LoopBatches
from .ops import Op
from .types import OFF_LOOP_PATCH_BYTES, PutRequest, PutResult, WriteMode
from .writeops import WriteOps
from .writer import Writer


def _nothing() -> None:
    pass


class WriteEntryPoints:
    """The write half of :class:`~.engine.Store` (a mixin: Store sets these attributes)."""

    readonly: bool
    _writer: Writer
    _loop: LoopBatches
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

    def _asubmit_op(self, op: Op, loop: asyncio.AbstractEventLoop) -> asyncio.Future[PutResult]:
        op.loop = loop
        future: asyncio.Future[PutResult] = loop.create_future()
        op.afuture = future
        # Overloaded leaves it unqueued: it may be submitted again.
        if loop is self._loop.loop:
            self._loop.submit(op, loop)
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
        the writer's commit answers them or ``HOLD_INPUT_MAX_SECONDS`` pass
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
        self._loop.attach(loop, hold_input, release_input)

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
        ops: list[Op | StoreError] = []
        for req in requests:
            try:
                ops.append(self._put_op(req))
            except StoreError as exc:
                ops.append(exc)
        queued = [item for item in ops if isinstance(item, Op)]
        for put_op in queued:
            put_op.releases_caller = put_op is queued[-1]
        for i, item in enumerate(ops):
            if isinstance(item, Op):
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

    def _put_op(self, req: PutRequest) -> Op:
        return self._ops.put_op(req)

    def _submit(self, op: Op, *, wait: bool = True) -> Op:
        return self._writer.submit(op, wait=wait)
