"""Writes gathered on an event loop and handed to the writer a batch at a time (Store.write_on_loop)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from ..config import StoreConfig
from .gather import close_in
from .ops import Op
from .writer import Writer

#: Longest a loop reads no requests while its batch of writes commits.
HOLD_INPUT_MAX_SECONDS = 0.02


def _nothing() -> None:
    pass


class LoopBatches:
    """The asyncio writes of one event loop, kept until their batch is complete (see Store.write_on_loop)."""

    def __init__(self, config: StoreConfig, writer: Writer) -> None:
        self._config = config
        self._writer = writer
        #: The loop whose asyncio writes are gathered here (None: none is).
        self.loop: asyncio.AbstractEventLoop | None = None
        # What its writes wait in (guarded by the writer's room lock), the call that hands them to the
        # writer next, and the size of the last batch it handed over.
        self._ops: list[Op] = []
        self._run: asyncio.Handle | asyncio.TimerHandle | None = None
        self._gather_began: float | None = None  # monotonic, while the batch waits for more
        self._gathering = False  # _run is the timer closing a gathering batch
        self._last_batch = 0
        self._last_hand_over = 0.0  # monotonic
        self._hold_input: Callable[[], object] = _nothing
        self._release_input: Callable[[], object] = _nothing
        # While the input is held: the call that releases it at the latest.
        self._input_held: asyncio.TimerHandle | None = None

    def attach(
        self, loop: asyncio.AbstractEventLoop, hold_input: Callable[[], object], release_input: Callable[[], object]
    ) -> None:
        writer = self._writer
        with writer.room:
            self._hand_over_closed_locked()  # an earlier loop's, closed: its state must not stop this one's
            self.loop = loop
            self._last_batch = 0  # its writers are yet to come
            self._hold_input = hold_input
            self._release_input = release_input
            writer.gathers = False  # the loop's writers queue here: none would come to the writer
            writer.periodic = self.hand_over_if_closed
            writer.queue.put([])  # a writer waiting with no periodic check takes it up

    def hand_over_if_closed(self) -> None:
        """The batch of a loop closed before it handed it over, to the writer (the writer thread, now and then).

        A closed loop runs none of its callbacks (``call_soon``, ``call_later``):
        the writes it gathered would neither commit nor fail, and their bytes
        would count against max_queued_write_bytes until the store closed.
        """
        loop = self.loop
        if loop is not None and self._ops and loop.is_closed():  # read unlocked: a stale answer waits a turn
            with self._writer.room:
                self._hand_over_closed_locked()

    def _hand_over_closed_locked(self) -> None:
        """If the loop is closed: its batch to the writer, and nothing of it left waiting; under room."""
        loop = self.loop
        if loop is None or not loop.is_closed():
            return
        self._queue_locked(self.take_pending())
        self._run = self._input_held = None  # would never run
        self._gathering = False
        self._gather_began = None

    def take_pending(self) -> list[Op]:
        """The batch gathering now (handed to the writer by a closing store); under the writer's room lock."""
        ops, self._ops = self._ops, []
        return ops

    def add_locked(self, op: Op) -> int:
        """Keep an admitted asyncio write for the loop's next batch (under the writer's room lock,
        so that a closing store hands over what it finds); how many the batch holds now."""
        self._ops.append(op)
        return len(self._ops)

    def gather(self, loop: asyncio.AbstractEventLoop, gathered: int) -> None:
        """After a write joined the batch (``gathered`` long now): hand it over now, or keep gathering."""
        if self._run is not None and not self._gathering:
            return  # handed over within a turn or two already
        now = time.monotonic()
        wait = close_in(
            gathered=gathered,
            expected=min(self._last_batch, self._config.max_batch_writes),
            last_commit_seconds=self._writer.last_commit_seconds,
            since_hand_over_seconds=now - self._last_hand_over,
            max_commit_delay_seconds=self._config.max_commit_delay_seconds,
        )
        if self._run is not None:  # gathering
            if wait <= 0:  # the writes expected are here
                self._run.cancel()
                self._close_batch()
            return
        if self._last_batch < 2:
            # A lone writer's: after this turn of the loop (the writes it reads meanwhile join it).
            self._run = loop.call_soon(self._hand_over)
        elif wait > 0:
            # Concurrent writers: the input held, the batch gathers; writes read only after the
            # last commit (the input held) waited for it already.
            self._gather_began = now
            self._gathering = True
            self._run = loop.call_later(wait, self._close_batch)
            self._hold(loop)
        else:
            self._close_batch()

    def _close_batch(self) -> None:
        """Read what came while the batch gathered (the input held), then hand the batch over."""
        self._gathering = False
        self._release()
        assert self.loop is not None
        # The loop polls for I/O between this turn's callbacks and the next turn's: one turn more.
        self._run = self.loop.call_soon(self._hand_over_after_reading)

    def _hand_over_after_reading(self) -> None:
        assert self.loop is not None
        self._run = self.loop.call_soon(self._hand_over)

    def _hand_over(self) -> None:
        """The loop's batch to the writer, in pieces of at most max_batch_writes."""
        self._run = None
        writer = self._writer
        self._last_hand_over = now = time.monotonic()
        if self._gather_began is not None:
            writer.commit_delays += 1
            writer.commit_delay_seconds += now - self._gather_began
            self._gather_began = None
        with writer.room:
            ops, self._ops = self._ops, []
            self._queue_locked(ops)
        self._last_batch = len(ops)
        if len(ops) < 2:  # a lone writer's: nobody else's requests to keep off the GIL
            self._release()
            return
        assert self.loop is not None
        self._hold(self.loop)
        # The writer answers in order: once the last is answered, so are the others.
        last = ops[-1].afuture
        assert last is not None
        last.add_done_callback(lambda _: self._release())

    def _queue_locked(self, ops: list[Op]) -> None:
        """A batch to the writer, in pieces of at most max_batch_writes; under room."""
        limit = self._config.max_batch_writes
        for start in range(0, len(ops), limit):
            self._writer.queue.put(ops[start : start + limit])

    def _hold(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._input_held is None:
            self._hold_input()
        else:
            self._input_held.cancel()
        # Not for ever: a commit stalled on the disk, or on another process's write lock, must
        # not stop the loop from refusing writes past the backlog bound or serving reads.
        self._input_held = loop.call_later(HOLD_INPUT_MAX_SECONDS, self._release)

    def _release(self) -> None:
        if self._input_held is not None:
            self._input_held.cancel()
            self._input_held = None
            self._release_input()
