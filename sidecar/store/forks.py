"""A store belongs to the process that opened it: a forked child cannot use it, nor can one be pickled.

LMDB forbids using an environment across fork(), and the child has none of
the store's threads (its writer: a write would wait forever). So in a forked
child (os.fork, multiprocessing's default start method on Linux) every open
store is marked unusable: each of its methods raises Unavailable saying why,
and the child's copy of the data directory's lock is closed, so that the lock
goes when the parent closes the store, not when its last child exits. The
child's copy of the LMDB environment is closed if no transaction was under
way at the fork, so that the child can open a Store of its own on the
directory (py-lmdb opens an environment once per process); else it is left
as it is, closing it then being unsafe (LmdbStorage.let_go_in_child).
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from typing import IO, Any, NoReturn

from ..storage import LmdbStorage

# The stores open in this process, held weakly: the at-fork hook keeps none alive.
_open: weakref.WeakSet[OneProcess] = weakref.WeakSet()


class OneProcess:
    """The Store's side of this: what its use-after-close checks say, and pickling refused."""

    #: Why the store can no longer be used, raised as Unavailable by its reads (and, forked, its writes).
    _closed_reason = "the store is closed"
    _closed: bool
    _close_finished: bool
    _close_lock: Any
    _lock_file: IO[str] | None
    _storage: LmdbStorage
    _writer: Any

    def _track_process(self) -> None:
        """Called once the store is open: mark it unusable in any child forked from now on."""
        self._opened_by = os.getpid()
        _open.add(self)

    def _forked(self) -> None:
        why = (
            f"this Store was opened in process {self._opened_by}; a forked child cannot use it (LMDB forbids"
            " it): open a new Store in the child, or start processes with the 'spawn' or 'forkserver' method"
        )
        self._closed_reason = why
        self._closed = True  # the reads' check raises `why` (no writer thread here)
        # close() does nothing now (closing the environment in a child is unsafe), and never waits on a
        # lock a parent thread held at the fork.
        self._close_finished = True
        self._close_lock = threading.Lock()
        writer = self._writer
        writer.writes_stopped = why  # every write is refused with it, before it is queued
        # A lock another thread of the parent held at the fork would be held forever here.
        writer.room = threading.Condition(threading.Lock())
        lock, self._lock_file = self._lock_file, None
        if lock is not None:
            # The child's descriptor only: the parent's, on the same open file, keeps the lock.
            with contextlib.suppress(OSError, ValueError):
                lock.close()
        self._storage.let_go_in_child()

    def __reduce__(self) -> NoReturn:
        raise TypeError(
            "a Store cannot be sent to another process: open a Store there (one process at a time owns a data"
            " directory), or use the sidecar"
        )


def _after_fork_in_child() -> None:
    for store in list(_open):
        store._forked()
    _open.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
