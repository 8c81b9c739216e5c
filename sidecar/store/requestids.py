"""Request ids: a write's record under its request id, so that a retry lands once, and their expiry.

Each write with a request id stores what it made (a RequestRecord) under
keys.request_key, with an entry in the req_expiry index at its expiry time
(keys.expiry_key: a compact key's entry names its request id, whose records
the sweeper finds by a seek); or, for a UUIDv7 dated about when it was
written, none: the sweeper walks those records in the order of their ids'
times (store layout 8, RequestRecord.swept_by_id_time).
A retry within request_id_ttl_seconds gets the same answer, replayed; one
that asks something else under the same id is refused.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable

import xxhash
from google.protobuf.message import DecodeError as DecodeProtoError

from ckpt.store.v1 import records_pb2

from ..errors import DataLoss
from ..storage import ReadTxn, WriteTxn
from . import keys
from .layout import (
    ID_TIME_RECORDS_LAYOUT,
    Layout,
    Tables,
    has_hex_keyed_requests,
    has_layout1_requests,
    stamp_layout,
)
from .ops import Batch
from .records import expiry_of, log_record, record_put, request_of_current
from .types import PutRequest, PutResult, WriteMode

# Request ids expired per write op: a backlog (after downtime) must not hold
# the writer for seconds while puts queue behind it.
EXPIRE_CHUNK = 5000


class RequestIds:
    """The requests table and its expiry index."""

    def __init__(self, tables: Tables, *, layout1: bool, hex_keyed: bool = True, ttl_nanos: int) -> None:
        self._tables = tables
        #: request_id_ttl_seconds, in ns: a record is written to expire that long after its write.
        self._ttl_nanos = ttl_nanos
        #: Whether the store was seen stamped with layout 8 (then a record swept by its id's time stamps nothing).
        self._id_time_stamped = False
        #: Where the walk of records swept by their ids' time goes on (None: from the first), when an op
        #: stopped at EXPIRE_CHUNK keys before the sweep's bound.
        self._walk_from: bytes | None = None
        #: Whether records keyed as store layout 1 did may remain (see layout.has_layout1_requests).
        self.layout1 = layout1
        #: Whether records of hex request ids keyed in full (before layout 6) may remain
        #: (see layout.has_hex_keyed_requests).
        self.hex_keyed = hex_keyed

    @classmethod
    def of(cls, layout: Layout, *, ttl_seconds: float) -> RequestIds:
        """A store's request ids, as its layout was opened (``ttl_seconds``: request_id_ttl_seconds)."""
        return cls(
            layout.tables,
            layout1=layout.layout1_requests,
            hex_keyed=layout.hex_keyed_requests,
            ttl_nanos=int(ttl_seconds * 1e9),
        )

    def remembered(
        self,
        txn: ReadTxn,
        rid_key: bytes,
        rec: records_pb2.SessionRecord | None,
        req: PutRequest,
        batch: Batch | None = None,
    ) -> tuple[records_pb2.RequestRecord | None, bool]:
        """The record stored under ``rid_key`` (None if none) and whether it answers this write's retry.

        It answers while it has not expired and names the session as it is now (an AppendEvents'
        record, its event log: a session may hold only events): one naming a deleted, earlier
        holder of the same id (the records outlive it) does not, so the write is made anew and its
        record replaces that one. A record of store layout 1 is looked up under its own key, and
        returned only if it answers (the sweeper expires it where it is). One a build before layout 6
        keyed by a hex request id in full (keys.hex_request_key) is looked up there when the compact key
        holds none, and answers as one under the compact key does (replaced, it goes: :meth:`store`).
        """
        tables = self._tables
        sid = keys.session_key(req.session_id)
        return self.lookup(
            txn,
            rid_key,
            req.session_id,
            req.request_id,
            made=lambda: rec is not None or log_record(txn, tables, sid) is not None,
            ours=lambda done: request_of_current(done, rec, log_record(txn, tables, sid)),
            batch=batch,
        )

    def lookup(
        self,
        txn: ReadTxn,
        rid_key: bytes,
        session_id: str,
        request_id: str,
        *,
        made: Callable[[], bool],
        ours: Callable[[records_pb2.RequestRecord], bool],
        batch: Batch | None = None,
    ) -> tuple[records_pb2.RequestRecord | None, bool]:
        """:meth:`remembered` for any write: ``made()``, whether anything a write of this id may have made
        stands (a session, or an event log); ``ours``, whether a live record was written to it as it is
        now (an AppendEvents' record names its log, eventlog.py). ``batch``: the records its ops keep for
        the commit (:meth:`store`) are looked at first."""
        requests = self._tables.requests
        raw = self._get(txn, rid_key, batch)
        full_key = keys.hex_request_key(rid_key) if keys.is_compact(rid_key) else rid_key
        if raw is None and full_key is not rid_key and self.hex_keyed:
            raw = txn.get(full_key, db=requests)
        layout1 = raw is None and self.layout1
        if layout1:
            raw = txn.get(keys.layout1_request_key(full_key), db=requests)
        if raw is None:
            return None, False
        try:
            done = records_pb2.RequestRecord.FromString(raw)
        except DecodeProtoError as exc:
            if not layout1 and not made():
                # No session: the write that made the record made none that still stands (a retry
                # of it would find its session), so this write is a new one and replaces the record.
                # Its expiry entry, whose time only the record held, is left: an entry expires only
                # the record it was written for (expire_op).
                return None, False
            raise DataLoss(
                f"session {session_id!r}: the record of request_id {request_id!r} does not"
                f" parse ({exc}), so whether that write was made is unknown"
            ) from None
        live = done.expires_unix_nanos > time.time_ns()
        if layout1:
            # A delete removed layout 1's records with their session: one found belongs to the session as it is now.
            return (done, True) if live else (None, False)
        return done, live and ours(done)

    def remember(
        self,
        txn: WriteTxn,
        rid_key: bytes,
        result: PutResult,
        expires: int,
        expired: records_pb2.RequestRecord | None,
        asked: int,
        session_created: int,
        batch: Batch | None = None,
    ) -> None:
        """Store the record of a write just made (replacing ``expired``, an expired one of the same id)."""
        rec = records_pb2.RequestRecord(
            expires_unix_nanos=expires, write_xxh3=asked, session_created_unix_nanos=session_created
        )
        record_put(rec, result)
        self.store(txn, rid_key, rec, expired, batch)

    def store(
        self,
        txn: WriteTxn,
        rid_key: bytes,
        rec: records_pb2.RequestRecord,
        expired: records_pb2.RequestRecord | None,
        batch: Batch | None = None,
    ) -> None:
        """Store a request record and its expiry entry (replacing ``expired``, a record of the same id that
        answers no more): a Put's (:meth:`remember`) or an AppendEvents' (eventlog.py). An op sharing
        ``batch``'s transaction leaves the record to be put just before the commit, with the batch's
        others in key order (Batch.pending_requests; its expiry entry, in time order already, goes now)."""
        requests, expiry = self._tables.requests, self._tables.req_expiry
        if expired is not None:
            when = expired.expires_unix_nanos
            if keys.is_compact(rid_key) and self._get(txn, rid_key, batch) is None:
                # Found under the hex key a build before layout 6 wrote (lookup): it goes, with its entry.
                full_key = keys.hex_request_key(rid_key)
                txn.delete(full_key, db=requests)
                txn.delete(keys.time_key(when, full_key), db=expiry)
            elif expired.swept_by_id_time:
                pass  # it has no entry
            elif not keys.is_compact(rid_key) or not self._shared(txn, rid_key, when):
                txn.delete(keys.expiry_key(when, rid_key), db=expiry)
        by_id_time = self._swept_by_id_time(rid_key, rec.expires_unix_nanos)
        if by_id_time:
            rec.swept_by_id_time = True
            # Known stamped only once a commit saw the stamp: one this transaction wrote may yet be undone.
            stamped = self._id_time_stamped or stamp_layout(txn, self._tables, ID_TIME_RECORDS_LAYOUT)
            if stamped and not self._id_time_stamped and batch is not None:
                batch.after_commit.append(self._saw_id_time_stamp)
        if batch is not None and batch.defer_requests:
            if not batch.pending_requests:
                batch.before_commit.append(lambda wtxn: self._put_pending(wtxn, batch.pending_requests))
            batch.pending_requests[rid_key] = rec.SerializeToString()
        else:
            # Ops that write request records all share the transaction, or (redone one by one) none does: a
            # record kept for the commit would be put over this one.
            assert batch is None or rid_key not in batch.pending_requests, "a request record kept for the commit"
            txn.put(rid_key, rec.SerializeToString(), db=requests)
        if not by_id_time:
            txn.put(keys.expiry_key(rec.expires_unix_nanos, rid_key), b"", db=expiry)

    def _saw_id_time_stamp(self) -> None:
        self._id_time_stamped = True

    def _swept_by_id_time(self, rid_key: bytes, expires: int) -> bool:
        """Whether a record under ``rid_key`` expiring at ``expires`` goes without an expiry entry: its id is
        a UUIDv7 dated within ID_TIME_SLACK_NANOS of the write (``expires`` less the TTL), so it has expired
        once its id's time is a TTL and that slack in the past (:meth:`_walk_expired`)."""
        made = keys.uuid7_nanos(rid_key)
        return made is not None and abs(expires - self._ttl_nanos - made) <= keys.ID_TIME_SLACK_NANOS

    def _get(self, txn: ReadTxn, rid_key: bytes, batch: Batch | None) -> bytes | None:
        """The record under ``rid_key``: one ``batch`` keeps for its commit, else the stored one."""
        if batch is not None:
            pending = batch.pending_requests.get(rid_key)
            if pending is not None:
                return pending
        found = txn.get(rid_key, db=self._tables.requests)
        return None if found is None else bytes(found)

    def _put_pending(self, txn: WriteTxn, pending: dict[bytes, bytes]) -> None:
        requests = self._tables.requests
        for key in sorted(pending):
            txn.put(key, pending[key], db=requests)

    def _shared(self, txn: ReadTxn, rid_key: bytes, when: int) -> bool:
        """Whether another session's record of a compact key's request id expires at ``when`` too (its
        expiry entry, the same key, is then that record's as well: it stays)."""
        found = self._expiries_under(txn, rid_key[: keys.COMPACT_PREFIX_BYTES])
        return any(key != rid_key and expires == when for key, expires in found)

    def delete_layout1(self, txn: WriteTxn, sid: bytes) -> None:
        """Remove a session's request records keyed as store layout 1 did: that layout's retries found
        a record only while its session lived. Current records stay until they expire; they name the
        session they were written to (see remembered)."""
        for key, expires in self._expiries_under(txn, sid + keys.SEP):
            if expires is not None:  # damaged: its expiry entry stays (expiring it later removes nothing newer)
                txn.delete(keys.time_key(expires, key), db=self._tables.req_expiry)
            txn.delete(key, db=self._tables.requests)

    def expire_op(self, now: int) -> Callable[[Batch, WriteTxn], tuple[int, bool]]:
        """An op expiring up to EXPIRE_CHUNK request ids whose time is before ``now``, by their expiry entries,
        then those swept by their ids' time (:meth:`_walk_expired`): how many it expired, and whether more may
        be left (it stopped at EXPIRE_CHUNK)."""
        tables = self._tables

        def apply(batch: Batch, txn: WriteTxn) -> tuple[int, bool]:
            chunk = EXPIRE_CHUNK
            entries: list[bytes] = []
            for entry in txn.scan_keys(tables.req_expiry):
                if len(entries) == chunk or keys.time_of(entry) >= now:
                    break
                entries.append(entry)
            for entry in entries:
                # Only the records this entry was written for: an entry left behind
                # (by deleting a session whose record was damaged) must not expire
                # a later record of the same request id early, or its retry would
                # write twice. A record that does not parse goes: it answers nothing.
                when = keys.time_of(entry)
                for rid_key, expires in self._named(txn, entry[8:]):
                    if expires in (when, None):
                        txn.delete(rid_key, db=tables.requests)
                txn.delete(entry, db=tables.req_expiry)
            if len(entries) == chunk:
                return len(entries), True
            walked, more = self._walk_expired(txn, now, chunk - len(entries))
            return len(entries) + walked, more

        return apply

    def _walk_expired(self, txn: WriteTxn, now: int, budget: int) -> tuple[int, bool]:
        """Remove the records swept by their id's time (no expiry entry) that expired by ``now``, walking the
        compact keys in the order of their ids' times up to the bound past which none can have: a TTL and
        ID_TIME_SLACK_NANOS before ``now``. At most ``budget`` keys looked at (the next op goes on from
        there): how many records removed, and whether the walk stopped short of the bound.

        Keys before the bound that stay: records with an expiry entry (any other id; a UUIDv7 dated far
        from its write), and any not yet expired (written under a longer TTL than the store's now)."""
        requests = self._tables.requests
        bound = keys.uuid7_key_before(now - self._ttl_nanos - keys.ID_TIME_SLACK_NANOS)
        start = self._walk_from if self._walk_from is not None else keys.COMPACT_REQUEST_KEY_MARK
        doomed: list[bytes] = []
        looked = 0
        self._walk_from = None
        for key, value in txn.scan(requests, start):
            if key >= bound:
                break
            if looked == budget:
                self._walk_from = bytes(key)
                break
            looked += 1
            if keys.uuid7_nanos(key) is None:
                continue
            try:
                done = records_pb2.RequestRecord.FromString(bytes(value))
            except DecodeProtoError:
                continue  # `ckpt verify` names it; a write of its id replaces it
            if done.swept_by_id_time and done.expires_unix_nanos <= now:
                doomed.append(bytes(key))
        for key in doomed:
            txn.delete(key, db=requests)
        return len(doomed), self._walk_from is not None

    def _named(self, txn: ReadTxn, named: bytes) -> list[tuple[bytes, int | None]]:
        """The records an expiry entry names, as :meth:`_expiries_under` gives them: its key's (after the
        time), or, a compact key's entry, every session's record of that request id."""
        if keys.is_compact(named):
            return self._expiries_under(txn, named)
        raw = txn.get(named, db=self._tables.requests)
        return [] if raw is None else [(named, expiry_of(raw))]

    def _expiries_under(self, txn: ReadTxn, prefix: bytes) -> list[tuple[bytes, int | None]]:
        """The requests keys starting with ``prefix`` and their records' expiry times (None: a record that
        does not parse), read before any of them is changed."""
        found: list[tuple[bytes, int | None]] = []
        for key, value in txn.scan(self._tables.requests, prefix):
            if not key.startswith(prefix):
                break
            found.append((bytes(key), expiry_of(value)))
        return found

    def recheck(self, txn: ReadTxn) -> None:
        """After expiring some: whether records of layout 1, or of hex ids keyed in full, remain (while one
        is left, writes look under its key too)."""
        self.layout1 = has_layout1_requests(txn, self._tables)
        self.hex_keyed = has_hex_keyed_requests(txn, self._tables)


def write_fingerprint(req: PutRequest, mode: WriteMode) -> int:
    """What a write asks, hashed: a retry under the same request id must match it (never 0: 0 is "not kept")."""
    h = xxhash.xxh3_64()
    expected = -1 if req.expected_version is None else req.expected_version
    if expected < 1 << 63:
        h.update(struct.pack("<Bq", mode, expected))
    else:
        # expected_version is a uint64 on the wire. Values past int64 get a
        # layout of their own (a flagged mode byte), so that the fingerprints
        # of records already stored stay what they were.
        h.update(struct.pack("<BQ", mode | 0x80, expected))
    for key, value in sorted(req.labels.items()):
        h.update(key.encode() + b"\0" + value.encode() + b"\0")
    if req.message_type:  # hashed only when given, so that untyped writes' fingerprints stay what they were
        h.update(b"\1" + req.message_type.encode() + b"\0")
    if req.expected_state_xxh3 is not None:  # likewise: fingerprints of writes without it stay what they were
        h.update(struct.pack("<BQ", 2, req.expected_state_xxh3))
    h.update(req.state)
    return h.intdigest() or 1
