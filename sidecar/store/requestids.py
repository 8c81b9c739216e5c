"""Request ids: a write's record under its request id, so that a retry lands once, and their expiry.

Each write with a request id stores what it made (a RequestRecord) under
keys.request_key, with an entry in the req_expiry index at its expiry time.
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
from .layout import Tables, has_layout1_requests
from .ops import Batch
from .records import expiry_of, log_record, request_of_current
from .types import PutRequest, PutResult, WriteMode

# Request ids expired per write op: a backlog (after downtime) must not hold
# the writer for seconds while puts queue behind it.
EXPIRE_CHUNK = 5000


class RequestIds:
    """The requests table and its expiry index."""

    def __init__(self, tables: Tables, *, layout1: bool) -> None:
        self._tables = tables
        #: Whether records keyed as store layout 1 did may remain (see layout.has_layout1_requests).
        self.layout1 = layout1

    def remembered(
        self,
        txn: ReadTxn,
        rid_key: bytes,
        rec: records_pb2.SessionRecord | None,
        req: PutRequest,
    ) -> tuple[records_pb2.RequestRecord | None, bool]:
        """The record stored under ``rid_key`` (None if none) and whether it answers this write's retry.

        It answers while it has not expired and names the session as it is now (an AppendEvents'
        record, its event log: a session may hold only events): one naming a deleted, earlier
        holder of the same id (the records outlive it) does not, so the write is made anew and its
        record replaces that one. A record of store layout 1 is looked up under its own key, and
        returned only if it answers (the sweeper expires it where it is).
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
    ) -> tuple[records_pb2.RequestRecord | None, bool]:
        """:meth:`remembered` for any write: ``made()``, whether anything a write of this id may have made
        stands (a session, or an event log); ``ours``, whether a live record was written to it as it is
        now (an AppendEvents' record names its log, eventlog.py)."""
        requests = self._tables.requests
        raw = txn.get(rid_key, db=requests)
        layout1 = raw is None and self.layout1
        if layout1:
            raw = txn.get(keys.layout1_request_key(rid_key), db=requests)
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
    ) -> None:
        """Store the record of a write just made (replacing ``expired``, an expired one of the same id)."""
        rec = records_pb2.RequestRecord(
            version=result.version,
            stored_bytes=result.stored_bytes,
            frame_kind=result.frame_kind,
            state_size=result.state_size,
            state_xxh3=result.state_xxh3,
            chain_depth=result.chain_depth,
            expires_unix_nanos=expires,
            write_xxh3=asked,
            session_created_unix_nanos=session_created,
        )
        self.store(txn, rid_key, rec, expired)

    def store(
        self,
        txn: WriteTxn,
        rid_key: bytes,
        rec: records_pb2.RequestRecord,
        expired: records_pb2.RequestRecord | None,
    ) -> None:
        """Store a request record and its expiry entry (replacing ``expired``, a record of the same id that
        answers no more): a Put's (:meth:`remember`) or an AppendEvents' (eventlog.py)."""
        if expired is not None:
            txn.delete(keys.time_key(expired.expires_unix_nanos, rid_key), db=self._tables.req_expiry)
        txn.put(rid_key, rec.SerializeToString(), db=self._tables.requests)
        txn.put(keys.time_key(rec.expires_unix_nanos, rid_key), b"", db=self._tables.req_expiry)

    def delete_layout1(self, txn: WriteTxn, sid: bytes) -> None:
        """Remove a session's request records keyed as store layout 1 did: that layout's retries found
        a record only while its session lived. Current records stay until they expire; they name the
        session they were written to (see remembered)."""
        prefix = sid + keys.SEP
        found: list[tuple[bytes, int | None]] = []
        for key, value in txn.scan(self._tables.requests, prefix):
            if not key.startswith(prefix):
                break
            found.append((key, expiry_of(value)))
        for key, expires in found:
            if expires is not None:  # damaged: its expiry entry stays (expiring it later removes nothing newer)
                txn.delete(keys.time_key(expires, key), db=self._tables.req_expiry)
            txn.delete(key, db=self._tables.requests)

    def expire_op(self, now: int) -> Callable[[Batch, WriteTxn], tuple[int, bool]]:
        """An op expiring up to EXPIRE_CHUNK request ids whose time is before ``now``: how many it expired,
        and whether more may be left (it stopped at EXPIRE_CHUNK)."""
        tables = self._tables

        def apply(batch: Batch, txn: WriteTxn) -> tuple[int, bool]:
            chunk = EXPIRE_CHUNK
            entries: list[bytes] = []
            for entry in txn.scan_keys(tables.req_expiry):
                if len(entries) == chunk or keys.time_of(entry) >= now:
                    break
                entries.append(entry)
            for entry in entries:
                rid_key = entry[8:]
                raw = txn.get(rid_key, db=tables.requests)
                # Only the record this entry was written for: an entry left behind
                # (by deleting a session whose record was damaged) must not expire
                # a later record of the same request id early, or its retry would
                # write twice. A record that does not parse goes: it answers nothing.
                if raw is not None and expiry_of(raw) in (keys.time_of(entry), None):
                    txn.delete(rid_key, db=tables.requests)
                txn.delete(entry, db=tables.req_expiry)
            return len(entries), len(entries) == chunk

        return apply

    def recheck_layout1(self, txn: ReadTxn) -> None:
        """After expiring some: whether layout 1's records remain (while one is left, writes look under its key)."""
        self.layout1 = has_layout1_requests(txn, self._tables)


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
