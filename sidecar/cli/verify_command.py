"""`ckpt verify`: every frame, chain and session record, then the index tables against them; exit 1 on any failure."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from functools import partial

from ...codec import DecodeError, iter_versions, parse, prefix_state
from ..errors import DataLoss, NotFound, StoreError
from ..store import SessionInfo, Store, StoredFrame, stored_frames
from ..store.prefixes import is_prefix
from ..tools import Problem, isolated
from ..tools.blobcheck import blob_lookup, blob_problems, blob_records, session_blob_problems
from .offline_commands import open_readonly, starts_chain

# A session whose record or B-tree page is damaged: reported, and the others checked.


def verify(args: argparse.Namespace) -> int:
    def fail(subject: str, problem: str) -> None:
        print(f"FAIL {subject}: {problem}", file=sys.stderr)

    # The tables are cross-checked in another child, beside the per-session checks (tools/crosscheck.py).
    cross = isolated.CrossChecks(args.data_dir, args.sessions, open_readonly)
    try:
        # Every session is read in a child process (tools/isolated.py): a damaged page can make
        # LMDB abort() or crash; that session is then reported and a new child checks the rest.
        counts = isolated.verify(
            args.data_dir,
            args.sessions,
            open_readonly,
            # A session listed here may be deleted by a running sidecar before it is read:
            # gone is not damaged. A session named on the command line must exist, and its blobs are
            # checked with it (unnamed, every blob is checked below).
            lambda store, session, vanished_ok: verify_session(
                store, session, vanished_ok=vanished_ok, blobs=not vanished_ok
            ),
            fail,
        )
        checked, failures = counts.checked, counts.failed
        others = 0
        if counts.listing_failures:  # the cross-checks need every record: a sessions table that cannot be listed
            print("ckpt verify: the tables are not cross-checked (listing the sessions failed)", file=sys.stderr)
        else:
            checked, failures, others = _cross_check(cross, counts.failed_sessions, checked, failures, fail)
    finally:
        cross.cancel()
    blobs = 0
    if not args.sessions:  # every blob's file against its record
        found = isolated.call(args.data_dir, open_readonly, blob_records, "reading the blobs' records")
        blobs = len(found.records)
        checked += found.blobs_only  # sessions holding blob references alone: not listed, nor counted above
        for subject, text in blob_problems(args.data_dir, found, partial(_blobs_now, args)):
            fail(subject, text)
            others += 1
    listing = "; listing the sessions failed (see above)" if counts.listing_failures else ""
    more = f"; {others} more problem{'s' if others > 1 else ''} cross-checking the tables (see above)" if others else ""
    sessions = "session" if checked == 1 else "sessions"
    held = f"; {blobs} blob{'s' if blobs != 1 else ''} checked" if blobs else ""
    print(f"verified {checked} {sessions}: {checked - failures} ok, {failures} failed{listing}{more}{held}")
    return 1 if failures or counts.listing_failures or others else 0


def _blobs_now(args: argparse.Namespace, shas: list[str]) -> dict[str, tuple[int, int]]:
    """The records of ``shas`` as the store has them now (in a child): a running sidecar may have deleted a
    blob, or stored it anew, since verify read them (tools/blobcheck.py)."""
    return isolated.call(args.data_dir, open_readonly, partial(blob_lookup, shas=shas), "reading the blobs' records")


def _cross_check(
    cross: isolated.CrossChecks, failed: set[str], checked: int, failures: int, fail: Callable[[str, str], None]
) -> tuple[int, int, int]:
    """Cross-check the tables (tools/crosscheck.py); the counts of sessions checked and failed, and of other problems.

    A session whose entries are wrong fails (one with frames but no record
    counts as checked too, as when the sessions are listed from the frames
    table); a session holding events alone, which the per-session checks do
    not list, counts as checked by the events pass, and fails if its log
    does; an entry naming a session that does not exist, or an index table
    that cannot be read, is one of the other problems. The frames and
    sessions tables failing here are not: the per-session checks read them.
    """
    others = 0

    def problem(p: Problem) -> None:
        nonlocal checked, failures, others
        if p.session is None:
            fail(f"{p.table} table", p.text)
            others += 1
            return
        session = isolated.session_id(p.session)
        fail(f"session {session!r}", f"{p.table} table: {p.text}")
        if not p.exists:
            others += 1
        elif session not in failed:
            failed.add(session)
            failures += 1
            checked += p.table == "sessions"  # found by its frames: not listed before

    broken = cross.finish(problem, fail)
    checked += cross.events_only
    others += sum(table not in ("sessions", "frames") for table in broken)
    return checked, failures, others


def _holds_events(store: Store, session: str) -> bool:
    """Whether ``session`` has an event log (a session may hold events and no version)."""
    logs = store.tables.event_logs
    if logs is None:  # a read-only store of a layout before the event log
        return False
    with store.read() as txn:
        return txn.get(session.encode("utf-8", "surrogateescape"), db=logs) is not None


def verify_session(store: Store, session: str, *, vanished_ok: bool = False, blobs: bool = False) -> list[str] | None:
    """Every frame's checksum and link, every version's metadata, every version decoded (a PREFIX frame's
    from its source); the problems found.

    None if the session does not exist and ``vanished_ok`` (it was deleted since it was listed). A session
    may hold events or blob references and no version. ``blobs``: each blob it references is checked too.
    """
    try:
        held = session_blob_problems(store, session) if blobs else []
    except StoreError as exc:  # a damaged record or B-tree page
        held = [str(exc)]
    try:
        # One chain at a time (a FULL frame and the frames after it), not every frame at once.
        with stored_frames(store.read, store.tables, session) as (info, frames):
            problems = _frame_problems(session, info, frames)
    except NotFound as exc:
        # No versions: its log is the events cross-check's (tools/eventcheck.py), its blobs are checked above.
        if _holds_events(store, session) or store.blob_refs(session):
            return held
        return None if vanished_ok else [str(exc)]
    except (
        StoreError
    ) as exc:  # a damaged record or B-tree page (DataLoss from the storage seam): report it, check the others
        return [str(exc)]
    return problems + held


def _frame_problems(session: str, info: SessionInfo, frames: Iterator[StoredFrame]) -> list[str]:
    """The problems of a session's frames, read in order, holding one chain of them at a time."""
    # Said under the session's name already: its own "session 'x': " prefix goes.
    corrupt_texts: list[str] = []
    problems: list[str] = []
    corrupt: set[int] = set()
    # What the record is checked against: the times of version 1 and the head, and the last chain start.
    stamped: dict[int, int] = {}
    # Version times never go back (a write is stamped after every earlier one: layout.write_time), and none
    # is after the head's (the record's update time): a time outside that is a damaged version record.
    earlier: tuple[int, int] | None = None
    last_start: int | None = None
    chain: list[bytes] = []
    chain_versions: list[int] = []
    prefixes = _Prefixes(problems)
    expected = info.first_version
    for version, vinfo, frame in frames:
        if isinstance(vinfo, DataLoss):
            corrupt_texts.append(str(vinfo).removeprefix(f"session {session!r}: "))
            corrupt.add(version)
        else:
            if version in (1, info.head_version):
                stamped[version] = vinfo.created_unix_nanos
            problems += _order_problems(version, vinfo.created_unix_nanos, earlier, info.updated_unix_nanos)
            earlier = (version, vinfo.created_unix_nanos)
        if version != expected:
            problems.append(f"version {expected} is missing (next stored is {version})")
            expected = version
        prefixes.stored.add(version)
        # The kind byte is read raw: a frame whose header is corrupt still splits chains.
        prefix = is_prefix(frame)
        if prefix or starts_chain(frame):
            if chain:
                problems += _chain_problem(chain, chain_versions, corrupt, prefixes)
            chain, chain_versions = [], []
            if version <= info.head_version and not prefix:
                last_start = version
        if prefix:  # checked once its source (a newer version) is read
            if version not in corrupt:
                prefixes.wait(version, frame)
        else:
            chain.append(frame)
            chain_versions.append(version)
        expected += 1
    if chain:
        problems += _chain_problem(chain, chain_versions, corrupt, prefixes)
    prefixes.finish()
    problems = corrupt_texts + problems
    if expected - 1 != info.head_version:
        problems.append(f"the head is version {info.head_version} but the last stored frame is {expected - 1}")
    problems += _time_problems(info, stamped)
    # Where a cold read of the head starts decoding, as the record says: a wrong one fails every read and write.
    if last_start is not None and info.chain_start_version != last_start:
        problems.append(
            f"the session record says the head's chain starts at version {info.chain_start_version},"
            f" but its last FULL frame is version {last_start}"
        )
    return problems


class _Prefixes:
    """A session's PREFIX frames (a folded run), each checked once its source, a newer version, is read:
    its size, its source's size and its state's XXH3-64 (codec.prefix_state); ``problems`` gets what fails,
    and each frame whose source is not stored."""

    def __init__(self, problems: list[str]) -> None:
        self._problems = problems
        #: The versions stored (so far); each PREFIX frame waiting for its source's state, by source.
        self.stored: set[int] = set()
        self._waiting: dict[int, list[tuple[int, bytes]]] = {}

    def wait(self, version: int, frame: bytes) -> None:
        self._waiting.setdefault(parse(frame)[0].base_version, []).append((version, frame))

    def read(self, version: int, state: bytes) -> None:
        """``version``'s state is read: check the PREFIX frames of it, and of them in turn."""
        found = [(version, state)]
        while found and self._waiting:
            source, source_state = found.pop()
            for at, frame in self._waiting.pop(source, ()):
                try:
                    found.append((at, prefix_state(frame, source_state, source_version=source).state))
                except DecodeError as exc:
                    text = str(exc)
                    self._problems.append(text if f"version {at}" in text else f"version {at}: {text}")

    def finish(self) -> None:
        """Name the PREFIX frames whose source is not stored (one that failed to decode is reported as such)."""
        for source, waiting in sorted(self._waiting.items()):
            if source not in self.stored:
                for at, _ in waiting:
                    self._problems.append(
                        f"version {at}: its state is a prefix of version {source}'s, whose frame is missing"
                    )


def _chain_problem(chain: list[bytes], versions: list[int], corrupt: set[int], prefixes: _Prefixes) -> list[str]:
    """Why one chain (``versions``' frames) does not decode, if it does not and its frame was not reported
    as ``corrupt`` already; each state decoded goes to ``prefixes``."""
    decoded = 0
    try:
        for got in iter_versions(chain):
            prefixes.read(versions[decoded], got.state)
            decoded += 1
    except DecodeError as exc:
        # The frame after the last one decoded failed; name it if the codec could not.
        failed = versions[decoded]
        if failed not in corrupt:  # reported once, above
            text = str(exc)
            return [text if f"version {failed}" in text else f"version {failed}: {text}"]
    return []


def _order_problems(version: int, written: int, earlier: tuple[int, int] | None, head_written: int) -> list[str]:
    if earlier is not None and written < earlier[1]:
        return [
            f"version {version} was written at {written} ns, before version {earlier[0]} ({earlier[1]} ns):"
            " version times never go back"
        ]
    if written > head_written:
        return [f"version {version} was written at {written} ns, after the head was ({head_written} ns)"]
    return []


def _time_problems(info: SessionInfo, stamped: dict[int, int]) -> list[str]:
    """The record's times against its frames': a frame swapped in from another session (frames do not name
    theirs), or a record whose times were changed, which decides whether a retry of a write is answered.

    Version 1 is stamped with the record's creation time (a put, or a fork) and the head with its update time
    (every write that makes a version stamps both; a quiet keyframe rewrites the frame, not its metadata,
    and an append of events alone touches neither). Retention never removes the head, but may remove
    version 1 (first_version > 1): its time is then not checked. ``stamped``: the times the metadata of
    version 1 and of the head record, those that parse."""
    problems: list[str] = []
    if info.first_version == 1 and 1 in stamped and stamped[1] != info.created_unix_nanos:
        problems.append(
            f"the session record says it was created at {info.created_unix_nanos} ns, but version 1 was written"
            f" at {stamped[1]} ns"
        )
    head = info.head_version
    if head in stamped and stamped[head] != info.updated_unix_nanos:
        problems.append(
            f"the session record says it was updated at {info.updated_unix_nanos} ns, but its head (version"
            f" {head}) was written at {stamped[head]} ns"
        )
    return problems
