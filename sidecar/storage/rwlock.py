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
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False

    def acquire_shared(self) -> None:
        """Hold the lock shared until :meth:`release_shared` (what :meth:`shared` does as a block): for a
        caller whose scope is not one block, such as a read transaction's context manager."""
        with self._cond:
            while self._exclusive:
                self._cond.wait()
            self._shared += 1

    @property
    def idle(self) -> bool:
        """Whether nobody holds the lock; read without taking it (in a forked child: the holders' threads are gone)."""
        return not self._shared and not self._exclusive

    def release_shared(self) -> None:
        with self._cond:
            self._shared -= 1
            if not self._shared:
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
        with self._cond:
            while self._exclusive:  # another resize first
                self._cond.wait()
            self._exclusive = True
            while self._shared:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()
