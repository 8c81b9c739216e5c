"""Calls under way, counted: what a stopping sidecar waits for, and what its heap trimmer watches."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

#: Set in a call's task when it began before the count closed: a PutBlob counted from its first message
#: still records its blob (StoreLink.call) during the stop that waits for it.
_began_open: contextvars.ContextVar[bool] = contextvars.ContextVar("ckpt_began_open", default=False)


class InFlight:
    """Calls begun and not yet ended, on one event loop."""

    def __init__(self) -> None:
        #: Calls begun so far (each stream once): a sign of activity for the heap trimmer.
        self.started = 0
        self._count = 0
        #: Set whenever no call is under way: what shutdown waits for.
        self.idle = asyncio.Event()
        self.idle.set()
        #: Closed at the start of a stop: no call may reach the store process from then on but those
        #: counted before, so that the calls the store commits are exactly those the stop waits for.
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def admits(self) -> bool:
        """Whether the current call may reach the store process: the count is open, or the call (its
        task: grpc.aio runs each in its own) was counted before it closed."""
        return not self.closed or _began_open.get()

    def began(self) -> None:
        self.started += 1
        self._count += 1
        self.idle.clear()
        if not self.closed:
            _began_open.set(True)

    def until_done(self, context: Any) -> None:
        """Count the call of ``context`` (a grpc.aio.ServicerContext) until it is over, its answer sent,
        not only until its handler returns: the stop cancels every call left once none is counted, and
        would cut an answer not sent yet."""
        self.began()
        context.add_done_callback(lambda _: self.ended())

    def ended(self) -> None:
        self._count -= 1
        if not self._count:
            self.idle.set()
