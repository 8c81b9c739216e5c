"""A shared/exclusive lock for LMDB map resizes.

LMDB requires that no transaction is open anywhere in the process while
``set_mapsize`` runs, so every transaction holds the lock shared and a resize
holds it exclusive.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class RWLock:
    """Many shared holders at once, or one exclusive holder (which waits for shared ones to leave)."""

    def __init__(self) -> None:
        # Every read takes and leaves the lock shared: the plain lock (not a Condition's RLock) and no
        # notify unless someone waits keep that to two C calls on its way in and out.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._shared = 0
        self._exclusive = False
        self._waiting = 0  # threads waiting on _cond

    def _wait(self) -> None:
        # Called with the lock held.
        self._waiting += 1
        try:
            self._cond.wait()
        finally:
            self._waiting -= 1

    def acquire_shared(self) -> None:
        """Hold the lock shared until :meth:`release_shared` (what :meth:`shared` does as a block): for a
        caller whose scope is not one block, such as a read transaction's context manager."""
        with self._lock:
            while self._exclusive:
                self._wait()
            self._shared += 1

    @property
    def idle(self) -> bool:
        """Whether nobody holds the lock; read without taking it (in a forked child: the holders' threads are gone)."""
        return not self._shared and not self._exclusive

    def release_shared(self) -> None:
        with self._lock:
            self._shared -= 1
            if not self._shared and self._waiting:
                self._cond.notify_all()

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        self.acquire_shared()
        try:
            yield
        finally:
            self.release_shared()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._lock:
            while self._exclusive:  # another resize first
                self._wait()
            self._exclusive = True
            while self._shared:
                self._wait()
        try:
            yield
        finally:
            with self._lock:
                self._exclusive = False
                if self._waiting:
                    self._cond.notify_all()
