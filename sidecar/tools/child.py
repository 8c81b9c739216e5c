"""A forked child that reads a data directory for a tool, watched by its parent through shared memory.

The LMDB C library (bundled with py-lmdb) checks some invariants of its
B-tree pages with assertions, not errors: a leaf page whose flags no longer
say leaf, a branch page left with fewer than two keys, a node offset pointing
past the end of data.mdb make it abort() the process (SIGABRT, "mdb.c:NNNN:
Assertion ... failed") or read past the mapped file (SIGBUS), where other
damage gets MDB_CORRUPTED. So the tools read in a forked child (isolated.py):
the child writes its progress to a shared record (Progress) between reads,
without a system call, and its events (results, failures) down a pipe; the
parent reports how it died (Death), with LMDB's assertion text from its stderr.

fork, not spawn: the parent has everything imported and runs a single thread,
so a child costs ~4 ms where a fresh interpreter costs ~150 ms. That matters
when every session behind one damaged page aborts: one child each (10,000
sessions behind a damaged frames root: 42 s).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import pickle
import re
import resource
import signal
import struct
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..errors import StoreError

OPENING, READING, DONE = 0, 1, 2
# Between sessions, listing the next: the session before finished so (it is not in the counts yet).
AFTER_OK, AFTER_FAILED, AFTER_VANISHED, LISTING = 3, 4, 5, 6
# Cross-checking the tables (crosscheck.py); the key names the table being read.
CROSS = 7
LISTING_CHUNK = 1000
# Room for a key in the progress record: LMDB keys are at most 511 bytes,
# but a damaged page can claim a longer one.
_KEY_ROOM = 1 << 16


class Progress:
    """What the child is doing, in memory shared with the parent (MAP_SHARED, inherited by fork).

    The phase, the counts (sessions finished, checked, failed) and a key: the
    session being read, or (listing) the last one finished. The child writes
    it between LMDB calls only, so it is whole whenever LMDB kills the child;
    per session one header and key before the read and one byte after it.
    """

    _HEAD = struct.Struct("<B7xQQQI")

    def __init__(self) -> None:
        self._map = mmap.mmap(-1, self._HEAD.size + _KEY_ROOM)

    def set(self, phase: int, key: bytes = b"", finished: int = 0, checked: int = 0, failed: int = 0) -> None:
        key = key[:_KEY_ROOM]
        self._map[self._HEAD.size : self._HEAD.size + len(key)] = key
        self._HEAD.pack_into(self._map, 0, phase, finished, checked, failed, len(key))

    def done_with(self, outcome: int) -> None:
        """The session being read finished: AFTER_OK, AFTER_FAILED or AFTER_VANISHED."""
        self._map[0] = outcome

    def read(self) -> tuple[int, int, int, int, bytes]:
        """Phase, finished, checked, failed (the last finished session counted), key."""
        phase, finished, checked, failed, key_len = self._HEAD.unpack_from(self._map)
        key = self._map[self._HEAD.size : self._HEAD.size + min(key_len, _KEY_ROOM)]
        if phase in (AFTER_OK, AFTER_FAILED, AFTER_VANISHED):
            finished += 1
            checked += phase != AFTER_VANISHED
            failed += phase == AFTER_FAILED
            phase = LISTING
        return phase, finished, checked, failed, key


@dataclass(frozen=True)
class Death:
    """How a child died: the signal, and LMDB's assertion if it printed one."""

    signal: int
    assertion: str

    def describe(self, data_mdb: Path) -> str:
        name = _signal_name(self.signal)
        if self.signal == signal.SIGABRT and self.assertion:
            return f"{data_mdb}: LMDB aborted ({name}: {self.assertion})"
        if self.signal == signal.SIGBUS:
            return f"{data_mdb}: LMDB crashed ({name}: a damaged page points past the end of the file)"
        if self.signal in (signal.SIGSEGV, signal.SIGABRT):
            return f"{data_mdb}: LMDB crashed ({name})"
        return f"{data_mdb}: the process reading it was killed ({name})"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


# What LMDB prints before abort(): "<path>/mdb.c:6273: Assertion 'IS_LEAF(mp)' failed in mdb_cursor_next()".
_ASSERTION = re.compile(r"^(?:.*/)?(mdb\.c:\d+: Assertion .*)$", re.MULTILINE)


_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


class Child:
    """One forked child: its pid, its event pipe (read end) and its stderr (a temporary file)."""

    def __init__(self, body: Callable[[IO[bytes]], None]) -> None:
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed by wait() or kill())
        read_fd, write_fd = os.pipe()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()  # nothing buffered twice
        parent = os.getpid()
        # Held back over the fork: a handler that raises (^C, ckpt backup's SIGTERM) must not run in
        # os.fork's at-fork callbacks, where its exception would be printed and dropped.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        pid = os.fork()
        if pid == 0:  # the child: never returns
            status = 70  # EX_SOFTWARE: body raised past its own handler
            try:
                os.close(read_fd)
                _child_setup(self.stderr.fileno(), parent)
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                with os.fdopen(write_fd, "wb") as events:
                    body(events)
                status = 0
            except BrokenPipeError:
                status = 0  # the parent went away
            except BaseException:
                with contextlib.suppress(BaseException):
                    import traceback

                    traceback.print_exc()
                    sys.stderr.flush()
            finally:
                os._exit(status)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(write_fd)
        self.pid = pid
        self.events = os.fdopen(read_fd, "rb")
        self.status: int | None = None

    def recv(self) -> Iterator[tuple[Any, ...]]:
        """The child's events until it closes its pipe (a truncated last event is dropped: it died writing)."""
        while True:
            try:
                event = pickle.load(self.events)
            except (EOFError, pickle.UnpicklingError):
                return
            yield event

    def wait(self) -> Death | None:
        """Reap the child; forward what it wrote to stderr. How it died, if a signal killed it."""
        self.events.close()
        _, self.status = os.waitpid(self.pid, 0)
        self.stderr.seek(0)
        text = self.stderr.read().decode("utf-8", "replace")
        self.stderr.close()
        death = None
        if os.WIFSIGNALED(self.status):
            found = _ASSERTION.findall(text)
            death = Death(os.WTERMSIG(self.status), found[-1].strip() if found else "")
            text = _ASSERTION.sub("", text).strip("\n")
            text = text + "\n" if text else ""
        if text:
            sys.stderr.write(text)
            sys.stderr.flush()
        return death

    def kill(self) -> None:
        """Stop a child the parent no longer waits for (an error or ^C in the parent)."""
        if self.status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            self.status = -1
        self.events.close()
        self.stderr.close()


def _child_setup(stderr_fd: int, parent: int) -> None:
    """In a new child: stderr to the parent's file, no core dumps, ^C left to the parent, gone with the parent."""
    os.dup2(stderr_fd, 2)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops it
    for signum in (signal.SIGTERM, signal.SIGHUP):  # not the parent's handlers (ckpt backup's cleanup)
        if signal.getsignal(signum) is not signal.SIG_IGN:  # but one the parent ignores (nohup's SIGHUP), too
            signal.signal(signum, signal.SIG_DFL)
    # An abort() here is expected and reported: no core file (in the working
    # directory, or a crash handler taking seconds per child).
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    if sys.platform.startswith("linux"):
        import ctypes  # here: only children need it

        with contextlib.suppress(OSError, AttributeError):
            prctl = ctypes.CDLL(None, use_errno=True).prctl
            prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no core through a core_pattern pipe either (systemd-coredump)
            prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: a killed verify does not leave its child reading
    if os.getppid() != parent:  # the parent died before that
        os._exit(1)


def send(events: IO[bytes], *event: Any) -> None:
    pickle.dump(event, events, protocol=pickle.HIGHEST_PROTOCOL)
    events.flush()


def send_error(events: IO[bytes], exc: BaseException) -> None:
    """An exception for the parent to raise as its own (StoreError, OSError: the CLI reports those)."""
    try:
        payload = pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(payload)
    except Exception:
        payload = pickle.dumps(StoreError(f"{type(exc).__name__}: {exc}"))
    events.write(pickle.dumps(("error", payload), protocol=pickle.HIGHEST_PROTOCOL))
    events.flush()


def run(body: Callable[[IO[bytes]], None]) -> tuple[list[tuple[Any, ...]], Death | None, int | None]:
    """Run ``body`` in a child: the events it sent, how it died (if a signal killed it), its wait status."""
    child = Child(body)
    try:
        received = list(child.recv())
        death = child.wait()
    finally:
        child.kill()
    return received, death, child.status


def exited(data_mdb: Path, status: int | None) -> StoreError:
    """A child that exited without its result: its traceback was forwarded to stderr."""
    code = os.waitstatus_to_exitcode(status) if status is not None and status >= 0 else status
    return StoreError(f"the process reading {data_mdb} failed (exit status {code}, see above)")
