"""Asyncio writes in line behind a large MERGE patch whose check runs on a thread (Store.asubmit).

The check reads every field in Python (~1 us each): on the event loop, one
16 MiB patch of small fields held every other call of a sidecar for ~10 s.
So a patch of OFF_LOOP_PATCH_BYTES or more is checked on the loop's default
executor, and the writes submitted on that loop after it wait in line until
it is checked, so that they still commit in the order they were submitted.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from ..errors import Unavailable
from .ops import Op
from .writer import Writer

_CLOSING = "the store is closing; no new writes are accepted"
_BEHIND_REFUSED = (
    f"{_CLOSING}: a write submitted before this one on the same event loop was refused, and a loop's"
    " writes commit in the order they were submitted"
)


class CheckLine:
    """Per event loop, the admitted writes waiting for a patch check ahead of them (or their own)."""

    def __init__(self, writer: Writer, queue_locked: Callable[[Op], int], gather: Callable[[int], None]) -> None:
        self._writer = writer
        # Queues an admitted op under the room lock (how many the loop's batch holds, 0 if none
        # gathers), and what to do after, outside the lock.
        self._queue_locked = queue_locked
        self._gather = gather
        self._lines: dict[asyncio.AbstractEventLoop, deque[Op]] = {}

    def busy_locked(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Whether writes on ``loop`` wait in line (a new one must join them); under room."""
        return loop in self._lines

    def join_locked(self, op: Op, loop: asyncio.AbstractEventLoop) -> None:
        """Put an admitted op at the end of ``loop``'s line; under room. Then :meth:`start`."""
        self._lines.setdefault(loop, deque()).append(op)

    def start(self, op: Op, loop: asyncio.AbstractEventLoop) -> None:
        """Run ``op``'s check (if it has one) on ``loop``'s executor; on the loop.

        The write leaves the line from the executor's thread, once checked: a
        loop closed meanwhile (``run_until_complete`` then ``close``) runs no
        more callbacks, and a write left waiting for one would never commit,
        its bytes counted against max_queued_write_bytes until close().
        """
        check = op.check
        if check is None:
            return

        def run() -> None:
            try:
                check()
            except BaseException as exc:  # the write's error, from its future
                self._checked(op, loop, exc)
            else:
                self._checked(op, loop, None)

        try:
            done = loop.run_in_executor(None, run)
        except RuntimeError as exc:  # the loop's executor is shut down
            self._checked(op, loop, Unavailable(f"the event loop's executor takes no work ({exc})"))
            return
        done.add_done_callback(lambda future: self._not_run(op, loop, future))

    def _not_run(self, op: Op, loop: asyncio.AbstractEventLoop, done: asyncio.Future[None]) -> None:
        if done.cancelled():  # the check never ran: nothing of the write was checked
            self._checked(op, loop, Unavailable(_CLOSING))

    def _checked(self, op: Op, loop: asyncio.AbstractEventLoop, error: BaseException | None) -> None:
        """``op`` checked (``error``: it failed); on any thread. Queues the checked writes at the line's head."""
        room = self._writer.room
        with room:
            line = self._lines.get(loop)
            if line is None or op not in line:
                return  # a closing store took it, or it was answered already
            op.check = None
            if error is not None:
                line.remove(op)
                self._writer.release_locked([op])
            gathered = 0
            while line and line[0].check is None:
                gathered = self._queue_locked(line.popleft()) or gathered
            if not line:
                del self._lines[loop]
        if error is not None:
            op.resolve(None, error)
        if gathered:
            self._gather(gathered)

    def take_locked(self) -> list[Op]:
        """For a closing store (under room): the writes in line that are checked, to commit.

        Those still being checked are refused, as a write submitted while the
        store closes is: nothing of them was written. So is every write in
        line behind one refused, checked or not: a loop's writes commit in the
        order they were submitted, so none commits after an earlier one that
        did not.
        """
        ready: list[Op] = []
        refused: list[tuple[Op, str]] = []
        for line in self._lines.values():
            why = ""
            for op in line:
                if not why and op.check is not None:
                    why = _CLOSING
                    refused.append((op, why))
                elif why:
                    refused.append((op, _BEHIND_REFUSED))
                else:
                    ready.append(op)
        self._lines.clear()
        self._writer.release_locked([op for op, _ in refused])
        for op, why in refused:
            op.resolve(None, Unavailable(why))
        return ready
