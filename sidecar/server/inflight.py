"""Calls under way, counted: what a stopping sidecar waits for, and what its heap trimmer watches."""

from __future__ import annotations

import asyncio


class InFlight:
    """Calls begun and not yet ended, on one event loop."""

    def __init__(self) -> None:
        #: Calls begun so far (each stream once): a sign of activity for the heap trimmer.
        self.started = 0
        self._count = 0
        #: Set whenever no call is under way: what shutdown waits for.
        self.idle = asyncio.Event()
        self.idle.set()

    def began(self) -> None:
        self.started += 1
        self._count += 1
        self.idle.clear()

    def ended(self) -> None:
        self._count -= 1
        if not self._count:
            self.idle.set()
