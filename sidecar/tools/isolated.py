"""The offline tools' reads of a data directory, each in a child process that damage may kill (child.py).

`ckpt verify` is run exactly when damage is suspected, so pages that make
LMDB abort() or crash must be reported like any other damage. The parent
never opens the storage; it watches each child through a shared progress
record (the session the child is reading, or the last it finished, and its
counts), so an undamaged directory costs little more than reading it in
process (10,000 sessions: 0.63 -> 0.65 s). When the child dies of a signal,
the parent reports what it was reading, with LMDB's assertion text from the
child's stderr, and (verify) starts a new child past that session.
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, TypeVar

from ..errors import DataLoss, StoreError
from ..store import Store
from .child import (
    AFTER_FAILED,
    AFTER_OK,
    AFTER_VANISHED,
    CROSS,
    DONE,
    LISTING,
    LISTING_CHUNK,
    OPENING,
    READING,
    Child,
    Progress,
    exited,
    run,
    send,
    send_error,
)
from .crosscheck import TABLES, CrossCheck, Problem

T = TypeVar("T")

#: Opens the data directory read-only (the CLI's, so its errors read the same).
Opener = Callable[[Path], Store]
#: verify's check of one session: its problems, or None if it vanished (and may).
Check = Callable[[Store, str, bool], "list[str] | None"]


# -- one call -----------------------------------------------------------------


def call(data_dir: Path, opener: Opener, fn: Callable[[Store], T], what: str) -> T:
    """``fn(store)`` on the data directory, opened by ``opener`` in a child; its result.

    An exception in the child is raised here. A child killed by a signal is
    DataLoss naming the signal, LMDB's assertion and ``what`` it was doing
    (e.g. "reading session 'x'").
    """
    progress = Progress()

    def body(events: IO[bytes]) -> None:
        progress.set(OPENING)
        try:
            with opener(data_dir) as store:
                progress.set(READING)
                result = fn(store)
                progress.set(DONE)
        except Exception as exc:
            send_error(events, exc)
            return
        send(events, "result", result)

    received, death, status = run(body)
    for event in received:
        if event[0] == "error":
            raise pickle.loads(event[1])
        if event[0] == "result":
            result: T = event[1]
            return result
    data_mdb = data_dir / "lmdb" / "data.mdb"
    if death is None:
        raise exited(data_mdb, status)
    _clear_dead_readers(data_dir, opener)
    doing = "while opening it" if progress.read()[0] == OPENING else f"while {what}"
    raise DataLoss(f"{death.describe(data_mdb)} {doing}")


def _clear_dead_readers(data_dir: Path, opener: Opener) -> None:
    """After a child died: one more, to free the reader slot it left (it may fail too: the damage is reported)."""

    def body(events: IO[bytes]) -> None:
        with opener(data_dir) as store:
            store.forget_dead_readers()

    with contextlib.suppress(Exception):
        run(body)


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
    progress = Progress()
    while True:
        progress.set(OPENING)
        listing_error: str | None = None

        def body(events: IO[bytes], plan: _Plan = plan) -> None:
            _verify_child(events, progress, data_dir, opener, check, plan)

        child = Child(body)
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
            raise exited(data_mdb, child.status)
        if death is not None and phase == OPENING:
            _clear_dead_readers(data_dir, opener)
            raise DataLoss(f"{death.describe(data_mdb)} while opening it")
        if death is not None and phase == READING:
            session = plan.named[plan.start + finished] if plan.named is not None else session_id(key)
            fail(f"session {session!r}", f"{death.describe(data_mdb)} while reading session {session!r}")
            counts.checked += 1
            counts.failed += 1
            counts.failed_sessions.add(session)
            # The next child frees this one's reader slot (and reports nothing if no session is left).
            plan = replace(plan, start=plan.start + finished + 1, after=key, after_death=True)
            continue
        if listing_error is None and (death is None or phase == DONE):
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
    events: IO[bytes], progress: Progress, data_dir: Path, opener: Opener, *, after_death: bool
) -> Store | None:
    """The store a child's pass reads; None once the error opening it went to the parent."""
    progress.set(OPENING)
    try:
        store = opener(data_dir)
    except Exception as exc:
        send_error(events, exc)
        return None
    if after_death:
        store.forget_dead_readers()
    return store


def _verify_child(
    events: IO[bytes], progress: Progress, data_dir: Path, opener: Opener, check: Check, plan: _Plan
) -> None:
    store = _open_in_child(events, progress, data_dir, opener, after_death=plan.after_death)
    if store is None:
        return
    with store:
        finished = checked = failed = 0
        progress.set(LISTING, plan.after)
        if plan.named is not None:
            keys: Iterator[bytes] = (s.encode("utf-8", "surrogateescape") for s in plan.named[plan.start :])
        elif plan.from_frames:
            keys = _frame_sessions(store, plan.after)
        else:
            keys = _session_keys(store, plan.after)
        while True:
            try:
                key = next(keys, None)
            except StoreError as exc:  # DataLoss (MDB_CORRUPTED, page not found): the listing cannot go on
                send(events, "listing", str(exc))  # the progress record keeps the session it listed after
                return
            if key is None:
                break
            session = plan.named[plan.start + finished] if plan.named is not None else session_id(key)
            progress.set(READING, key, finished, checked, failed)
            problems = check(store, session, plan.named is None)
            if problems is None and plan.from_frames:
                problems = _orphan_problems(store, key)
            finished += 1
            if problems is None:
                progress.done_with(AFTER_VANISHED)
                continue
            checked += 1
            if problems:
                failed += 1
                for problem in problems:
                    send(events, "fail", f"session {session!r}", problem, session)
            progress.done_with(AFTER_FAILED if problems else AFTER_OK)
        progress.set(DONE, b"", finished, checked, failed)


def _session_keys(store: Store, after: bytes) -> Iterator[bytes]:
    """Session keys after ``after``, from the sessions table, a chunk per read transaction (as Store.session_ids).

    Only ever forward: a damaged page's key out of order is skipped, so a listing always ends.
    """
    sessions = store.tables.sessions
    while True:
        chunk: list[bytes] = []
        more = False
        with store.read() as txn:
            for key in txn.scan_keys(sessions, after):
                if len(chunk) == LISTING_CHUNK:
                    more = True
                    break
                if key > (chunk[-1] if chunk else after):
                    chunk.append(key)
        yield from chunk
        if not more:
            return
        after = chunk[-1]  # the chunk is full


def _frame_sessions(store: Store, after: bytes) -> Iterator[bytes]:
    """Session keys after ``after`` that have frames: one seek each in the frames table (keys: session NUL version)."""
    frames = store.tables.frames
    while True:
        with store.read() as txn:
            found = next(txn.scan_keys(frames, after + b"\x01" if after else b""), None)
        if found is None:
            return
        key = found.partition(b"\x00")[0]
        if key <= after:
            raise DataLoss(f"the frames table has keys out of order after {session_id(after)!r}")
        yield key
        after = key


def _orphan_problems(store: Store, key: bytes) -> list[str] | None:
    """A session found by its frames but with no record: damage, if both are so in one snapshot.

    (A delete removes a session's record and frames in one transaction.) None: it vanished whole.
    """
    tables = store.tables
    try:
        with store.read() as txn:
            if txn.get(key, db=tables.sessions) is not None:
                return None
            found = next(txn.scan_keys(tables.frames, key + b"\x00"), None)
            if found is None or not found.startswith(key + b"\x00"):
                return None
    except StoreError as exc:
        return [str(exc)]
    return ["its frames are stored but its session record is missing"]


# -- verify's cross-checks of the tables ------------------------------------------------


class CrossChecks:
    """The cross-checks of crosscheck.py (of ``sessions`` only, if any are named), in a child.

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
        self._progress = Progress()
        #: The sessions holding events alone that the events pass checked (CrossCheck.events_only).
        self.events_only = 0
        self._child: Child | None = self._start(list(TABLES), after_death=False)

    def _start(self, todo: list[str], *, after_death: bool) -> Child:
        def body(events: IO[bytes]) -> None:
            _cross_check_child(events, self._progress, self._data_dir, self._opener, self._wanted, todo, after_death)

        self._progress.set(OPENING)
        return Child(body)

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
                    elif event[0] == "events_only":
                        self.events_only = event[1]
                    elif event[0] == "table":
                        failed = (event[1], event[2])
                    elif event[0] == "error":
                        raise pickle.loads(event[1])
                death = child.wait()
            finally:
                self.cancel()
            if death is None and child.status != 0:
                raise exited(data_mdb, child.status)
            phase, _, _, _, key = self._progress.read()
            if death is not None and phase == OPENING:
                _clear_dead_readers(self._data_dir, self._opener)
                raise DataLoss(f"{death.describe(data_mdb)} while opening it")
            if death is not None and phase == CROSS:
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
    progress: Progress,
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
            with store.read() as txn:  # one snapshot for every pass
                progress.set(CROSS, table.encode())
                check = CrossCheck(store, txn, wanted)
                check.read_sessions()
                for table in todo:
                    progress.set(CROSS, table.encode())
                    for found in check.run(table):
                        send(events, "problem", found)
                    if table == "events":
                        send(events, "events_only", check.events_only())
                    send(events, "done", table)
        except StoreError as exc:  # DataLoss (MDB_CORRUPTED, page not found): this table cannot be read
            send(events, "table", table, str(exc))
        progress.set(DONE)
