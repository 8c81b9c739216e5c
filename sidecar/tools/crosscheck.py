"""`ckpt verify`'s cross-checks: the session records against the frames table and the index tables.

What the store keeps true (sidecar/store), and so what is checked, in one
read transaction (one snapshot: nothing a running sidecar does in between can
look like damage):

- frames: every session with frames has a record (a delete removes both in one
  transaction). Not the reverse: a record without its frames is a missing
  version, which the per-session check names.
- updated: a record's update time is indexed under exactly one key,
  ``keys.updated_key(updated_unix_nanos, sid)`` (a write inside the same
  granule keeps the entry; one past it moves the entry); every entry names a
  session with a record, at the granule of its update time (in a store without
  a layout stamp, the exact update time is accepted too: the first builds
  keyed it so, and the store's first writable open rewrites such entries).
- labels: each label of a record has its entry ``keys.label_key(k, v, sid)``
  (a write changing a label's value moves it), and every entry is a label of
  its session's record.
- requests: a request record names a version at or below its session's head.
  One keyed as store layout 1 did (session first) belongs to a session with a
  record: a delete removes those with their session. A current one (request id
  first) stays after a delete until it expires, answering nothing: one naming
  a session with no record, or a deleted, earlier holder of the same id (its
  session_created_unix_nanos), is not checked against a head. But one whose
  session_created_unix_nanos is 0 names no session (every write stores its
  session's creation time): while its session has a record, a retry of its
  write would be written again, and it is reported. So is one naming a time
  later than its session's creation: write times never go back
  (layout.write_time), so an earlier holder was created before the session
  now; alike, an AppendEvents' record naming an event log created after the
  session's log (appends are stamped by write_time too). A record may
  name a version retention has since removed, may have expired and not been
  swept yet, and a fork has none: none of that is reported.
- req_expiry: each request record has its entry ``keys.expiry_key(expires,
  request key)`` and every entry names a request record expiring then (a
  compact key's entry names a request id: some session's record of it);
  a record swept by its id's time has none, and its id is a UUIDv7.
- events: every event block of every log passes its checksum, holds the seqs its key and header
  say without a gap, and the blocks run from the log record's first seq to its next one, their sizes
  summing to its stored bytes, the record's event count and open block matching them; no block is stored
  without its log record (tools/eventcheck.py).
- meta: each value the store reads is what it writes (tools/metacheck.py).
- types: every registered file parses as a FileDescriptorProto and they all
  build, with the built-in files, into one pool (what the store loads), and
  each typed session's message type is defined there.

A record that does not parse is the per-session check's to report: entries
naming its session are not checked. Memory stays flat however large the
store: no pass collects keys. Each index is checked both ways by lookups in
one snapshot: a pass over the records (or the request records) looks up the
entry each one implies, then a pass over the index looks up the record each
entry names (``get`` on a warm page cache: ~1-2 us). An index's pass reads only
that index and the table it indexes, so a table whose pages make LMDB abort is
the one named. The sessions table is read whole first, so that a damaged one
is reported as itself rather than by the first pass to re-read it. Named
sessions restrict every check to entries of those sessions (each index is
still read whole: its keys do not start with the session), and skip the
frames table (a named session without a record is already reported as not
existing).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from google.protobuf import descriptor_pb2
from google.protobuf.message import DecodeError as DecodeProtoError

from ckpt.store.v1 import records_pb2

from ..descriptors import build_pool
from ..errors import DataLoss, InvalidArgument
from ..storage import ReadTxn
from ..store import Store, keys, request_of_session
from ..store.records import log_record
from .eventcheck import event_problems, events_only_sessions
from .metacheck import meta_problems

#: The passes after the sessions table's, in the order they run.
TABLES = ("frames", "updated", "labels", "requests", "req_expiry", "types", "events", "meta")


@dataclass(frozen=True)
class Problem:
    """One thing wrong, found in ``table``."""

    table: str
    #: The session it concerns (its key), None when the entry's key cannot be split.
    session: bytes | None
    #: The session exists (has a record; for the frames table, has frames): it fails as a session.
    #: False: an entry names a session that does not exist.
    exists: bool
    text: str


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "backslashreplace")


def _when(nanos: int) -> str:
    """A time in nanoseconds since the Unix epoch, readable and exact."""
    try:
        text = datetime.fromtimestamp(nanos // 10**9, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):
        return f"{nanos} ns"
    return f"{text} ({nanos} ns)"


_MISSING: Any = object()  # a session with no record, in the lookup cache


class CrossCheck:
    """The cross-checks over one read transaction of ``store`` (Store.read); ``wanted``: the sessions to check
    (None: all)."""

    def __init__(self, store: Store, txn: ReadTxn, wanted: frozenset[bytes] | None) -> None:
        self._store = store
        self._tables = store.tables
        self._txn = txn
        # An id no session can have (empty, too long) is the per-session check's to report;
        # looking it up would fail on the storage's key size instead.
        self._wanted = (
            None if wanted is None else frozenset(w for w in wanted if 0 < len(w) <= keys.MAX_SESSION_ID_BYTES)
        )
        self._cached_sid: bytes | None = None
        self._cached_record: records_pb2.SessionRecord | None = None

    # -- the sessions table ----------------------------------------------------------

    def read_sessions(self) -> None:
        """Read every record once: a sessions table LMDB cannot read fails here, named as itself."""
        for _ in self._records():
            pass

    def _records(self) -> Iterator[tuple[bytes, records_pb2.SessionRecord]]:
        """Each session's record that parses, in key order (of the named sessions only, if any)."""
        txn, db = self._txn, self._tables.sessions
        wanted = self._wanted
        items: Iterable[tuple[bytes, Any]] = (
            txn.scan(db) if wanted is None else ((sid, txn.get(sid, db=db)) for sid in sorted(wanted))
        )
        parse = records_pb2.SessionRecord.FromString
        for sid, raw in items:
            if raw is None:
                continue
            try:
                yield sid, parse(raw)
            except DecodeProtoError:
                continue  # the per-session check names it

    def run(self, table: str) -> Iterator[Problem]:
        passes: dict[str, Callable[[], Iterator[Problem]]] = {
            "frames": self._frames,
            "updated": self._updated_index,
            "labels": self._label_index,
            "requests": self._requests,
            "req_expiry": self._expiry_index,
            "types": self._types,
            "events": self._events,
            "meta": self._meta,
        }
        return passes[table]()

    def _events(self) -> Iterator[Problem]:
        for sid, exists, text in event_problems(self._txn, self._tables, self._wanted):
            yield Problem("events", sid, exists, text)

    def _meta(self) -> Iterator[Problem]:
        for text in meta_problems(self._txn, self._tables):
            yield Problem("meta", None, False, text)

    def events_only(self) -> int:
        """How many sessions hold events alone (eventcheck.events_only_sessions), all of them checked by the
        events pass; 0 with named sessions, which the per-session checks count."""
        return events_only_sessions(self._txn, self._tables) if self._wanted is None else 0

    def _record(self, sid: bytes) -> records_pb2.SessionRecord | None:
        """A session's record (_MISSING: none; None: it does not parse), for checking an entry."""
        if sid != self._cached_sid:
            raw = self._txn.get(sid, db=self._tables.sessions)
            try:
                self._cached_record = _MISSING if raw is None else records_pb2.SessionRecord.FromString(bytes(raw))
            except DecodeProtoError:
                self._cached_record = None
            self._cached_sid = sid
        return self._cached_record

    def _skipped(self, sid: bytes) -> bool:
        return self._wanted is not None and sid not in self._wanted

    # -- frames ----------------------------------------------------------------------

    def _frames(self) -> Iterator[Problem]:
        """Sessions with frames but no record: one seek per session (frame keys are session NUL version)."""
        if self._wanted is not None:
            return
        frames, sessions = self._tables.frames, self._tables.sessions
        after = b""
        while (key := next(self._txn.scan_keys(frames, after + b"\x01" if after else b""), None)) is not None:
            sid = key.partition(keys.SEP)[0]
            if sid <= after:
                raise DataLoss(f"the frames table has keys out of order after {_text(after)!r}")
            if self._txn.get(sid, db=sessions) is None:
                yield Problem("sessions", sid, True, "no record, but the frames table holds its versions")
            after = sid

    # -- updated -----------------------------------------------------------------------

    def _updated_index(self) -> Iterator[Problem]:
        txn, updated = self._txn, self._tables.updated
        updated_key = keys.updated_key
        # A store without a layout stamp may hold the first builds' entries, at the exact update time; its
        # first writable open rewrites them (store/layout.py).
        exact_too = not self._store.layout_stamped
        for key in txn.scan_keys(updated):
            if len(key) <= 8:
                yield Problem("updated", None, False, f"key {key!r} is not a time and a session id")
                continue
            sid = key[8:]
            if self._skipped(sid):
                continue
            rec = self._record(sid)
            when = keys.time_of(key)
            if rec is _MISSING:
                yield Problem("updated", sid, False, f"an entry at {_when(when)} names a session with no record")
            elif (
                rec is not None
                and updated_key(rec.updated_unix_nanos, sid) != key
                and not (exact_too and keys.time_key(rec.updated_unix_nanos, sid) == key)
            ):
                yield Problem(
                    "updated",
                    sid,
                    True,
                    f"a stale entry at {_when(when)}: the record's update time {_when(rec.updated_unix_nanos)} is"
                    f" indexed at {_when(keys.updated_granule(rec.updated_unix_nanos))}",
                )
        for sid, rec in self._records():
            key = updated_key(rec.updated_unix_nanos, sid)
            if txn.get(key, db=updated) is None and not (
                exact_too and txn.get(keys.time_key(rec.updated_unix_nanos, sid), db=updated) is not None
            ):
                yield Problem(
                    "updated",
                    sid,
                    True,
                    f"no entry for the record's update time (expected at {_when(keys.time_of(key))}): listings by"
                    " update time miss the session",
                )

    # -- labels ------------------------------------------------------------------------

    def _label_index(self) -> Iterator[Problem]:
        txn, labels = self._txn, self._tables.labels
        label_key = keys.label_key
        for key in txn.scan_keys(labels):
            parts = key.split(keys.SEP)
            if len(parts) != 3 or not parts[0] or not parts[2]:
                yield Problem("labels", None, False, f"key {key!r} is not label NUL value NUL session id")
                continue
            label, value, sid = parts
            if self._skipped(sid):
                continue
            rec = self._record(sid)
            what = f"label {_text(label)!r}={_text(value)!r}"
            if rec is _MISSING:
                yield Problem("labels", sid, False, f"an entry for {what} names a session with no record")
            elif rec is not None:
                have = rec.labels.get(_text(label))
                if have is not None and label_key(_text(label), have, sid) == key:
                    continue
                yield Problem(
                    "labels",
                    sid,
                    True,
                    f"a stray entry for {what}: the record has no label {_text(label)!r}"
                    if have is None
                    else f"a stale entry for {what}: the record says {_text(label)!r}={have!r}",
                )
        for sid, rec in self._records():
            labelled = rec.labels
            if not labelled:
                continue
            for k, v in sorted(labelled.items()):
                if txn.get(label_key(k, v, sid), db=labels) is None:
                    yield Problem(
                        "labels",
                        sid,
                        True,
                        f"no entry for its label {k!r}={v!r}: listings by that label miss the session",
                    )

    # -- requests ----------------------------------------------------------------------

    def _request_items(self) -> Iterator[tuple[bytes, bytes]]:
        """The requests table's (key, record) pairs: all, or those of the sessions checked. A current key
        names its session last (keys.request_key), so for named sessions every current key is read;
        store layout 1's keys are found by a seek per session."""
        txn, requests = self._txn, self._tables.requests
        if self._wanted is None:
            yield from txn.scan(requests)
            return
        for key, value in txn.scan(requests):
            if not key.startswith((keys.COMPACT_REQUEST_KEY_MARK, keys.REQUEST_KEY_MARK)):
                break
            parts = keys.request_key_parts(key)
            if parts is None or parts[0] in self._wanted:
                yield key, value
        for sid in sorted(self._wanted):
            prefix = sid + keys.SEP
            for key, value in txn.scan(requests, prefix):
                if not key.startswith(prefix):
                    break
                yield key, value

    def _requests(self) -> Iterator[Problem]:
        parse = records_pb2.RequestRecord.FromString
        for key, value in self._request_items():
            parts = keys.request_key_parts(key)
            if parts is None:
                text = (
                    f"key {key!r} is neither \\0 request id bytes session id, \\1 request id NUL session id nor"
                    " session id NUL request id"
                )
                yield Problem("requests", None, False, text)
                continue
            sid, rid = parts
            rec = self._record(sid)
            what = f"request_id {_text(rid)!r}"
            try:
                done = parse(value)
            except DecodeProtoError as exc:
                yield Problem("requests", sid, rec is not _MISSING, f"the record of {what} does not parse ({exc})")
                continue
            current = key.startswith((keys.COMPACT_REQUEST_KEY_MARK, keys.REQUEST_KEY_MARK))
            if current and done.events_log_created_unix_nanos:
                later = self._later_log(sid, done.events_log_created_unix_nanos)
                if later is not None:
                    yield Problem("requests", sid, True, f"the record of {what} {later}")
            if done.events_log_created_unix_nanos and not done.events_had_put:
                continue  # an append of events alone: it names no version (the events pass checks the logs)
            version = done.version
            session = None if rec is _MISSING else rec  # the session as it is now, if its record parses
            if current and not request_of_session(done, session):
                if session is not None and done.session_created_unix_nanos > session.created_unix_nanos:
                    # Write times never go back (layout.write_time): an earlier holder of the id, deleted
                    # before the session standing now was made, was created before it.
                    yield Problem(
                        "requests",
                        sid,
                        True,
                        f"the record of {what} (version {version}) names a session created at"
                        f" {_when(done.session_created_unix_nanos)}, after the session's record says it was"
                        f" ({_when(session.created_unix_nanos)}): no session of that id was created later, and a"
                        " retry of that write would be written again",
                    )
                    continue
                if done.session_created_unix_nanos == 0 and session is not None:
                    # Every write stores its session's creation time (never 0): this record names no
                    # session, so a retry of its write to the session, which lives, is written again.
                    yield Problem(
                        "requests",
                        sid,
                        True,
                        f"the record of {what} (version {version}) names no session (session_created_unix_nanos"
                        " is 0): a retry of that write would be written again",
                    )
                continue  # written to a deleted, earlier holder of that id: it answers nothing, and expires
            head = -1 if session is None else session.head_version
            if head >= version >= 1:
                continue
            if rec is _MISSING:
                yield Problem(
                    "requests", sid, False, f"the record of {what} (version {version}) names a session with no record"
                )
            elif rec is not None:
                yield Problem(
                    "requests",
                    sid,
                    True,
                    f"the record of {what} says the write made version {version}, but the head is version {head}",
                )

    def _later_log(self, sid: bytes, named: int) -> str | None:
        """What is wrong with an AppendEvents' record naming an event log created at ``named``: None unless the
        session's log was created before that (its record parses): an earlier log of that id, deleted before
        this one was made, was created before it (write times never go back)."""
        try:
            log = log_record(self._txn, self._tables, sid)
        except DataLoss:
            return None  # the events pass names it
        if log is None or named <= log.created_unix_nanos:
            return None
        return (
            f"names an event log created at {_when(named)}, after the session's log record says it was"
            f" ({_when(log.created_unix_nanos)}): no log of that id was created later, and a retry of that"
            " append would be written again"
        )

    def _expiry_index(self) -> Iterator[Problem]:
        txn, requests, expiry = self._txn, self._tables.requests, self._tables.req_expiry
        parse = records_pb2.RequestRecord.FromString
        time_key = keys.time_key
        for key in txn.scan_keys(expiry):
            request = key[8:]
            if keys.is_compact(request):
                yield from self._compact_entry(key, request)
                continue
            parts = keys.request_key_parts(request) if len(key) > 8 else None
            if parts is None:
                yield Problem("req_expiry", None, False, f"key {key!r} is not a time and a requests key")
                continue
            sid, rid = parts
            if self._skipped(sid):
                continue
            raw = txn.get(request, db=requests)
            when = keys.time_of(key)
            if raw is None:
                yield Problem(
                    "req_expiry",
                    sid,
                    self._record(sid) is not _MISSING,
                    f"an entry at {_when(when)} names request_id {_text(rid)!r}, which has no record",
                )
                continue
            try:
                done = parse(bytes(raw))
            except DecodeProtoError:
                continue  # the requests pass names it
            if time_key(done.expires_unix_nanos, request) == key:
                continue
            yield Problem(
                "req_expiry",
                sid,
                self._record(sid) is not _MISSING,
                f"a stale entry at {_when(when)} for request_id {_text(rid)!r}: its record expires at"
                f" {_when(done.expires_unix_nanos)}",
            )
        for key, value in self._request_items():
            try:
                done = parse(value)
            except DecodeProtoError:
                continue  # the requests pass names it
            expires = done.expires_unix_nanos
            if done.swept_by_id_time and keys.uuid7_nanos(key) is not None:
                continue  # no entry: the sweep finds it by its id's time
            if txn.get(keys.expiry_key(expires, key), db=expiry) is None:
                parts = keys.request_key_parts(key)
                if parts is None:
                    continue  # the requests pass names it
                sid, rid = parts
                if done.swept_by_id_time:
                    yield Problem(
                        "req_expiry",
                        sid,
                        self._record(sid) is not _MISSING,
                        f"request_id {_text(rid)!r} is not a UUIDv7, yet its record (expiring at {_when(expires)}) is"
                        " kept for the sweep of records by their ids' time, without an entry: the sweep never"
                        " removes it",
                    )
                    continue
                yield Problem(
                    "req_expiry",
                    sid,
                    self._record(sid) is not _MISSING,
                    f"no entry for request_id {_text(rid)!r} (its record expires at {_when(expires)}): the sweep"
                    " never removes it",
                )

    def _compact_entry(self, key: bytes, request: bytes) -> Iterator[Problem]:
        """An expiry entry naming a compact key's request id: some session's record of it expires then."""
        when = keys.time_of(key)
        if len(request) != keys.COMPACT_PREFIX_BYTES:
            yield Problem("req_expiry", None, False, f"key {key!r} is not a time and a request id")
            return
        rid = request[1:].hex()
        found: list[tuple[bytes, bytes]] = []
        for name, value in self._txn.scan(self._tables.requests, request):
            if not name.startswith(request):
                break
            found.append((bytes(name), bytes(value)))
        for _, value in found:
            try:
                if records_pb2.RequestRecord.FromString(value).expires_unix_nanos == when:
                    return
            except DecodeProtoError:
                return  # the requests pass names it
        if not found:
            if self._wanted is None:
                text = f"an entry at {_when(when)} names request_id {rid!r}, which has no record"
                yield Problem("req_expiry", None, False, text)
            return
        sid = found[0][0][keys.COMPACT_PREFIX_BYTES :]
        if not self._skipped(sid):
            yield Problem(
                "req_expiry",
                sid,
                self._record(sid) is not _MISSING,
                f"a stale entry at {_when(when)} for request_id {rid!r}: no record of it expires then",
            )

    # -- types -------------------------------------------------------------------------

    def _types(self) -> Iterator[Problem]:
        files: dict[str, descriptor_pb2.FileDescriptorProto] = {}
        if self._tables.types is not None:
            for key, value in self._txn.scan(self._tables.types):
                try:
                    files[_text(key)] = descriptor_pb2.FileDescriptorProto.FromString(bytes(value))
                except DecodeProtoError as exc:
                    yield Problem("types", None, False, f"file {_text(key)!r} does not parse ({exc})")
        try:
            pool = build_pool(files)
        except InvalidArgument as exc:
            yield Problem("types", None, False, f"the registered files do not build: {exc}; typed writes fail")
            return  # which types they would define is unknown
        except Exception as exc:  # whatever else building them raises is damage to report, not a crash
            detail = f"{type(exc).__name__}: {str(exc)[:500]}"
            yield Problem("types", None, False, f"the registered files do not build: {detail}; typed writes fail")
            return
        for sid, rec in self._records():
            name = rec.message_type
            if not name:
                continue
            try:
                pool.FindMessageTypeByName(name)
                continue
            except KeyError:
                pass
            yield Problem(
                "types",
                sid,
                True,
                f"the session's message type {name} is neither registered nor built in: its writes are refused",
            )
