"""The offline tools' LMDB reads, in a child process that damage may kill.

The LMDB C library (bundled with py-lmdb) checks some invariants of its
B-tree pages with assertions, not errors: a leaf page whose flags no longer
say leaf, a branch page left with fewer than two keys, a node offset pointing
past the end of data.mdb make it abort() the process (SIGABRT, "mdb.c:NNNN:
Assertion ... failed") or read past the mapped file (SIGBUS), where other
damage gets MDB_CORRUPTED. `ckpt verify` is run exactly when damage is
suspected, so such pages must be reported like any other damage.

So the tools read in a forked child. The parent never opens LMDB; it watches
the child through a shared progress record (the session the child is
reading, or the last it finished, and its counts), written without a system
call, so an undamaged directory costs little more than before (10,000
sessions: 0.63 -> 0.65 s). When the child dies of a signal, the parent
reports what it was reading, with LMDB's assertion text from the child's
stderr, and (verify) starts a new child past that session.

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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, TypeVar

import lmdb

from ..errors import DataLoss, StoreError
from ..store import Store
from .crosscheck import TABLES, CrossCheck, Problem

T = TypeVar("T")

#: Opens the data directory read-only (the CLI's, so its errors read the same).
Opener = Callable[[Path], Store]
#: verify's check of one session: its problems, or None if it vanished (and may).
Check = Callable[[Store, str, bool], "list[str] | None"]

_OPENING, _READING, _DONE = 0, 1, 2
# Between sessions, listing the next: the session before finished so (it is not in the counts yet).
_AFTER_OK, _AFTER_FAILED, _AFTER_VANISHED, _LISTING = 3, 4, 5, 6
# Cross-checking the tables (sidecar/crosscheck.py); the key names the table being read.
_CROSS = 7
_LISTING_CHUNK = 1000
# Room for a key in the progress record: LMDB keys are at most 511 bytes,
# but a damaged page can claim a longer one.
_KEY_ROOM = 1 << 16


class _Progress:
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
        """The session being read finished: _AFTER_OK, _AFTER_FAILED or _AFTER_VANISHED."""
        self._map[0] = outcome

    def read(self) -> tuple[int, int, int, int, bytes]:
        """Phase, finished, checked, failed (the last finished session counted), key."""
        phase, finished, checked, failed, key_len = self._HEAD.unpack_from(self._map)
        key = self._map[self._HEAD.size : self._HEAD.size + min(key_len, _KEY_ROOM)]
        if phase in (_AFTER_OK, _AFTER_FAILED, _AFTER_VANISHED):
            finished += 1
            checked += phase != _AFTER_VANISHED
            failed += phase == _AFTER_FAILED
            phase = _LISTING
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


class _Child:
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


def _send(events: IO[bytes], *event: Any) -> None:
    pickle.dump(event, events, protocol=pickle.HIGHEST_PROTOCOL)
    events.flush()


def _send_error(events: IO[bytes], exc: BaseException) -> None:
    """An exception for the parent to raise as its own (StoreError, lmdb.Error, OSError: the CLI reports those)."""
    try:
        payload = pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(payload)
    except Exception:
        payload = pickle.dumps(StoreError(f"{type(exc).__name__}: {exc}"))
    events.write(pickle.dumps(("error", payload), protocol=pickle.HIGHEST_PROTOCOL))
    events.flush()


# -- one call -----------------------------------------------------------------


def call(data_dir: Path, opener: Opener, fn: Callable[[Store], T], what: str) -> T:
    """``fn(store)`` on the data directory, opened by ``opener`` in a child; its result.

    An exception in the child is raised here. A child killed by a signal is
    DataLoss naming the signal, LMDB's assertion and ``what`` it was doing
    (e.g. "reading session 'x'").
    """
    progress = _Progress()

    def body(events: IO[bytes]) -> None:
        progress.set(_OPENING)
        try:
            with opener(data_dir) as store:
                progress.set(_READING)
                result = fn(store)
                progress.set(_DONE)
        except Exception as exc:
            _send_error(events, exc)
            return
        _send(events, "result", result)

    received, death, status = _run(body)
    for event in received:
        if event[0] == "error":
            raise pickle.loads(event[1])
        if event[0] == "result":
            result: T = event[1]
            return result
    data_mdb = data_dir / "lmdb" / "data.mdb"
    if death is None:
        raise _exited(data_mdb, status)
    _clear_dead_readers(data_dir, opener)
    doing = "while opening it" if progress.read()[0] == _OPENING else f"while {what}"
    raise DataLoss(f"{death.describe(data_mdb)} {doing}")


def _run(body: Callable[[IO[bytes]], None]) -> tuple[list[tuple[Any, ...]], Death | None, int | None]:
    """Run ``body`` in a child: the events it sent, how it died (if a signal killed it), its wait status."""
    child = _Child(body)
    try:
        received = list(child.recv())
        death = child.wait()
    finally:
        child.kill()
    return received, death, child.status


def _exited(data_mdb: Path, status: int | None) -> StoreError:
    """A child that exited without its result: its traceback was forwarded to stderr."""
    code = os.waitstatus_to_exitcode(status) if status is not None and status >= 0 else status
    return StoreError(f"the process reading {data_mdb} failed (exit status {code}, see above)")


def _clear_dead_readers(data_dir: Path, opener: Opener) -> None:
    """After a child died: one more, to free the reader slot it left (it may fail too: the damage is reported)."""

    def body(events: IO[bytes]) -> None:
        with opener(data_dir) as store:
            store.forget_dead_readers()

    with contextlib.suppress(Exception):
        _run(body)


# -- verify -------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    """Where a verify child starts."""

    #: Sessions named on the command line, and how many of them are done; None: every session.
    named: tuple[str, ...] | None = None
    start: int = 0
    #: Listing every session: from the sessions table, or (once listing it failed) from the frames table;
    #: the sessions after this key.
    from_frames: bool = False
    after: bytes = b""
    #: An earlier child died: free the reader slots such children leave.
    after_death: bool = False


@dataclass
class VerifyCounts:
    checked: int = 0
    failed: int = 0
    #: Listings that failed (each printed as a FAIL line): the sessions they did not reach went unchecked
    #: or were listed another way.
    listing_failures: int = 0
    #: The sessions counted as failed.
    failed_sessions: set[str] = field(default_factory=set)


def verify(
    data_dir: Path, sessions: Sequence[str], opener: Opener, check: Check, fail: Callable[[str, str], None]
) -> VerifyCounts:
    """Check ``sessions`` (none named: every session) with ``check`` in a child, a new child past each that dies.

    ``fail(subject, problem)`` prints a failure as it is found (subject:
    "session 'x'", or the listing). A child killed while reading a session
    fails that session, naming the signal and LMDB's assertion. A listing of
    the sessions table that kills the child or fails cleanly is reported
    once, and the sessions after it are listed from the frames table instead
    (a session none of whose frames are left is not found there). Errors
    opening the store raise, as before.
    """
    counts = VerifyCounts()
    plan = _Plan(named=tuple(sessions) if sessions else None)
    data_mdb = data_dir / "lmdb" / "data.mdb"
    progress = _Progress()
    while True:
        progress.set(_OPENING)
        listing_error: str | None = None

        def body(events: IO[bytes], plan: _Plan = plan) -> None:
            _verify_child(events, progress, data_dir, opener, check, plan)

        child = _Child(body)
        try:
            for event in child.recv():
                if event[0] == "fail":
                    fail(event[1], event[2])
                    counts.failed_sessions.add(event[3])
                elif event[0] == "listing":
                    listing_error = event[1]
                elif event[0] == "error":
                    raise pickle.loads(event[1])
            death = child.wait()
        finally:
            child.kill()
        phase, finished, checked, failed, key = progress.read()
        counts.checked += checked
        counts.failed += failed
        if death is None and child.status != 0:
            raise _exited(data_mdb, child.status)
        if death is not None and phase == _OPENING:
            _clear_dead_readers(data_dir, opener)
            raise DataLoss(f"{death.describe(data_mdb)} while opening it")
        if death is not None and phase == _READING:
            session = plan.named[plan.start + finished] if plan.named is not None else session_id(key)
            fail(f"session {session!r}", f"{death.describe(data_mdb)} while reading session {session!r}")
            counts.checked += 1
            counts.failed += 1
            counts.failed_sessions.add(session)
            # The next child frees this one's reader slot (and reports nothing if no session is left).
            plan = replace(plan, start=plan.start + finished + 1, after=key, after_death=True)
            continue
        if listing_error is None and (death is None or phase == _DONE):
            return counts
        # Listing the sessions after `key` failed.
        why = death.describe(data_mdb) if death is not None else listing_error
        where = f"after {session_id(key)!r}" if key else "from the start"
        counts.listing_failures += 1
        if plan.from_frames:  # a second listing would fail at the same page: nothing else lists the rest
            fail(f"listing sessions in the frames table {where}", f"{why}; the sessions after that are not checked")
            if death is not None:
                _clear_dead_readers(data_dir, opener)
            return counts
        fail(f"listing sessions {where}", f"{why}; listing them from the frames table instead")
        plan = replace(plan, from_frames=True, after=key, after_death=plan.after_death or death is not None)


def session_id(key: bytes) -> str:
    """A session key as verify names it, even if it is not UTF-8 (damage)."""
    return key.decode("utf-8", "surrogateescape")  # as Store.session_ids names a damaged key


def _open_in_child(
    events: IO[bytes], progress: _Progress, data_dir: Path, opener: Opener, *, after_death: bool
) -> Store | None:
    """The store a child's pass reads; None once the error opening it went to the parent."""
    progress.set(_OPENING)
    try:
        store = opener(data_dir)
    except Exception as exc:
        _send_error(events, exc)
        return None
    if after_death:
        store.forget_dead_readers()
    return store


def _verify_child(
    events: IO[bytes], progress: _Progress, data_dir: Path, opener: Opener, check: Check, plan: _Plan
) -> None:
    store = _open_in_child(events, progress, data_dir, opener, after_death=plan.after_death)
    if store is None:
        return
    with store:
        finished = checked = failed = 0
        progress.set(_LISTING, plan.after)
        if plan.named is not None:
            keys: Iterator[bytes] = (s.encode("utf-8", "surrogateescape") for s in plan.named[plan.start :])
        elif plan.from_frames:
            keys = _frame_sessions(store, plan.after)
        else:
            keys = _session_keys(store, plan.after)
        while True:
            try:
                key = next(keys, None)
            except (StoreError, lmdb.Error) as exc:  # MDB_CORRUPTED, page not found: the listing cannot go on
                _send(events, "listing", str(exc))  # the progress record keeps the session it listed after
                return
            if key is None:
                break
            session = plan.named[plan.start + finished] if plan.named is not None else session_id(key)
            progress.set(_READING, key, finished, checked, failed)
            problems = check(store, session, plan.named is None)
            if problems is None and plan.from_frames:
                problems = _orphan_problems(store, key)
            finished += 1
            if problems is None:
                progress.done_with(_AFTER_VANISHED)
                continue
            checked += 1
            if problems:
                failed += 1
                for problem in problems:
                    _send(events, "fail", f"session {session!r}", problem, session)
            progress.done_with(_AFTER_FAILED if problems else _AFTER_OK)
        progress.set(_DONE, b"", finished, checked, failed)


def _session_keys(store: Store, after: bytes) -> Iterator[bytes]:
    """Session keys after ``after``, from the sessions table, a chunk per read transaction (as Store.session_ids).

    Only ever forward: a damaged page's key out of order is skipped, so a listing always ends.
    """
    while True:
        chunk: list[bytes] = []
        with store._read() as txn:
            cur = txn.cursor(db=store._sessions)
            found = cur.set_range(after) if after else cur.first()
            while found and len(chunk) < _LISTING_CHUNK:
                key = bytes(cur.key())
                if key > (chunk[-1] if chunk else after):
                    chunk.append(key)
                found = cur.next()
        yield from chunk
        if not found:
            return
        after = chunk[-1]  # the chunk is full


def _frame_sessions(store: Store, after: bytes) -> Iterator[bytes]:
    """Session keys after ``after`` that have frames: one seek each in the frames table (keys: session NUL version)."""
    while True:
        with store._read() as txn:
            cur = txn.cursor(db=store._frames)
            if not (cur.set_range(after + b"\x01") if after else cur.first()):
                return
            key = bytes(cur.key()).partition(b"\x00")[0]
        if key <= after:
            raise DataLoss(f"the frames table has keys out of order after {session_id(after)!r}")
        yield key
        after = key


def _orphan_problems(store: Store, key: bytes) -> list[str] | None:
    """A session found by its frames but with no record: damage, if both are so in one snapshot.

    (A delete removes a session's record and frames in one transaction.) None: it vanished whole.
    """
    try:
        with store._read() as txn:
            if txn.get(key, db=store._sessions) is not None:
                return None
            cur = txn.cursor(db=store._frames)
            if not (cur.set_range(key + b"\x00") and bytes(cur.key()).startswith(key + b"\x00")):
                return None
    except (StoreError, lmdb.Error) as exc:
        return [str(exc)]
    return ["its frames are stored but its session record is missing"]


# -- verify's cross-checks of the tables ------------------------------------------------


class CrossChecks:
    """The cross-checks of sidecar/crosscheck.py (of ``sessions`` only, if any are named), in a child.

    The first child starts at once, so that it runs beside verify's
    per-session children (on another core); its problems are read, in order,
    by finish(). A table whose pass kills the child or fails cleanly
    (MDB_CORRUPTED) is reported and skipped; a new child (a new snapshot)
    does the passes after it. The sessions table's pass comes first in every
    child: if that one fails, no cross-check is done.
    """

    def __init__(self, data_dir: Path, sessions: Sequence[str], opener: Opener) -> None:
        self._data_dir = data_dir
        self._opener = opener
        self._wanted = frozenset(s.encode("utf-8", "surrogateescape") for s in sessions) if sessions else None
        self._progress = _Progress()
        self._child: _Child | None = self._start(list(TABLES), after_death=False)

    def _start(self, todo: list[str], *, after_death: bool) -> _Child:
        def body(events: IO[bytes]) -> None:
            _cross_check_child(events, self._progress, self._data_dir, self._opener, self._wanted, todo, after_death)

        self._progress.set(_OPENING)
        return _Child(body)

    def cancel(self) -> None:
        """Stop the child (verify ended early, or cannot use its findings)."""
        if self._child is not None:
            self._child.kill()
            self._child = None

    def finish(self, problem: Callable[[Problem], None], fail: Callable[[str, str], None]) -> list[str]:
        """``problem`` each problem found, ``fail`` each table that could not be checked; those tables."""
        data_mdb = self._data_dir / "lmdb" / "data.mdb"
        done: set[str] = set()
        broken: list[str] = []
        after_death = False
        while self._child is not None:
            failed: tuple[str, str] | None = None
            child = self._child
            try:
                for event in child.recv():
                    if event[0] == "problem":
                        problem(event[1])
                    elif event[0] == "done":
                        done.add(event[1])
                    elif event[0] == "table":
                        failed = (event[1], event[2])
                    elif event[0] == "error":
                        raise pickle.loads(event[1])
                death = child.wait()
            finally:
                self.cancel()
            if death is None and child.status != 0:
                raise _exited(data_mdb, child.status)
            phase, _, _, _, key = self._progress.read()
            if death is not None and phase == _OPENING:
                _clear_dead_readers(self._data_dir, self._opener)
                raise DataLoss(f"{death.describe(data_mdb)} while opening it")
            if death is not None and phase == _CROSS:
                table = key.decode("ascii", "replace")
                why = f"{death.describe(data_mdb)} while reading the {table} table"
                after_death = True
            elif failed is not None:
                table, why = failed
            else:
                break
            broken.append(table)
            if table == "sessions":
                fail("cross-checking the sessions table", f"{why}; the tables are not cross-checked")
                break
            fail(f"cross-checking the {table} table", f"{why}; its cross-checks are skipped")
            done.add(table)
            todo = [t for t in TABLES if t not in done]
            if todo:
                self._child = self._start(todo, after_death=after_death)
        if after_death:
            _clear_dead_readers(self._data_dir, self._opener)
        return broken


def _cross_check_child(
    events: IO[bytes],
    progress: _Progress,
    data_dir: Path,
    opener: Opener,
    wanted: frozenset[bytes] | None,
    todo: list[str],
    after_death: bool,
) -> None:
    store = _open_in_child(events, progress, data_dir, opener, after_death=after_death)
    if store is None:
        return
    with store:
        table = "sessions"
        try:
            with store._read() as txn:  # one snapshot for every pass
                progress.set(_CROSS, table.encode())
                check = CrossCheck(store, txn, wanted)
                check.read_sessions()
                for table in todo:
                    progress.set(_CROSS, table.encode())
                    for found in check.run(table):
                        _send(events, "problem", found)
                    _send(events, "done", table)
        except (StoreError, lmdb.Error) as exc:  # MDB_CORRUPTED, page not found: this table cannot be read
            _send(events, "table", table, str(exc))
        progress.set(_DONE)
