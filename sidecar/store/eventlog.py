"""The event log's writes: appends (with a checkpoint in the same transaction), deletes, fork copies, retention.

Tables (docs/storage.md):

    events      session \\0 first_seq(u64 BE)   -> an event block (events.py)
    event_logs  session                        -> EventLogRecord

A session's blocks are one contiguous key range, in seq order. Appends go
into the session's last block while it is open: the new events are
compressed onto the block's open zstd frame by the stream the writer keeps
for it (eventstream.py; read back from the block when the stream is not
cached or the block changed behind it), and the block is written again,
until it holds SEAL_EVENTS events or SEAL_RAW_BYTES bytes; then it is
sealed (compressed whole once more, at SEAL_LEVEL) and the next append
begins a block of its own. Events compress against each other that way,
and the newest events are in the last one or two blocks. The log record
keeps the next seq, the first kept and the counts, so an append reads two
records and no scan.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import xxhash
from google.protobuf.message import DecodeError as DecodeProtoError

from ckpt.store.v1 import records_pb2

from ...codec.zstdlib import zstd
from ..config import StoreConfig
from ..errors import AlreadyExists, DataLoss, EventSeqConflict, InvalidArgument, StateTooLarge
from ..ids import check_event_type
from ..limits import EVENT_TIME_RANGE
from ..storage import ReadTxn, Table, WriteTxn
from . import keys
from .args import byte_size
from .eventblocks import StoredBlock, block_key, block_range, blocks_in, stored_blocks, where
from .eventdicts import ReadTxns, StoreDictionary
from .events import (
    SEAL_EVENTS,
    SEAL_RAW_BYTES,
    BlockHeader,
    block_header,
    block_raw,
    encode_block,
    event_nanos,
    joined,
)
from .eventstream import OpenStream, OpenStreams
from .layout import Tables, write_time
from .ops import Batch, Op
from .records import log_record, record, record_put, replayed_put, request_of_current
from .requestids import RequestIds, write_fingerprint
from .types import AppendResult, NewEvent, PutRequest, PutResult, WriteMode

#: The most events one append may carry (service.proto: AppendEventsRequest.events).
MAX_EVENTS_PER_APPEND = 1000


#: Types a log's record keeps the last seq of (EventLogRecord.last_seq_by_type); a log with more keeps none.
MAX_TRACKED_TYPES = 32


def types_tracked(log: records_pb2.EventLogRecord) -> bool:
    """Whether ``log.last_seq_by_type`` bounds every stored event's seq by its type: kept by every append
    since the log began."""
    return log.types_next_seq == log.next_seq


def _track_types(log: records_pb2.EventLogRecord, appended: Sequence[records_pb2.StoredEvent]) -> None:
    """Keep ``log``'s per-type bounds after ``appended`` (in seq order), or give them up for good."""
    bounds = log.last_seq_by_type
    for event in appended:
        bounds[event.type] = event.seq
    if len(bounds) > MAX_TRACKED_TYPES:
        bounds.clear()
        log.types_next_seq = 0  # never equal to next_seq again: the log is read as if it had none
    else:
        log.types_next_seq = log.next_seq


def stored_events(events: Sequence[NewEvent], max_bytes: int) -> tuple[list[records_pb2.StoredEvent], list[bool]]:
    """The events to append, checked (InvalidArgument or StateTooLarge naming the event and the limit),
    as StoredEvents without their seq, and for each whether its time is the commit's."""
    if len(events) > MAX_EVENTS_PER_APPEND:
        raise InvalidArgument(
            f"events has {len(events)} entries; the limit is {MAX_EVENTS_PER_APPEND} events per append"
        )
    out: list[records_pb2.StoredEvent] = []
    timeless: list[bool] = []
    total = 0
    for i, event in enumerate(events):
        if not isinstance(event, NewEvent):
            raise InvalidArgument(f"events[{i}] must be a NewEvent, not {type(event).__name__}")
        check_event_type(event.type, f"events[{i}].type")
        if not isinstance(event.payload, (bytes, bytearray, memoryview)):
            raise InvalidArgument(f"events[{i}].payload must be bytes, not {type(event.payload).__name__}")
        if not isinstance(event.attributes, dict):
            raise InvalidArgument(f"events[{i}].attributes must be a dict of str to str")
        keys.check_labels(event.attributes, field=f"events[{i}].attributes")
        when = event.time_unix_nanos
        if when is not None and (isinstance(when, bool) or not isinstance(when, int) or not 0 <= when <= 2**63 - 1):
            raise InvalidArgument(
                f"events[{i}].time must be a time from {EVENT_TIME_RANGE} (nanoseconds 0..2**63-1), got {when!r}"
            )
        total += byte_size(event.payload)
        if total > max_bytes:
            raise StateTooLarge(
                f"events' payloads are more than {max_bytes} bytes by events[{i}]; the limit (max_state_bytes) is"
                f" {max_bytes} bytes per append"
            )
        stored = records_pb2.StoredEvent(type=event.type, payload=bytes(event.payload))
        if event.attributes:
            stored.attributes.update(event.attributes)
        if when is not None:
            stored.time.FromNanoseconds(when)
        out.append(stored)
        timeless.append(when is None)
    return out, timeless


def events_fingerprint(
    events: Sequence[records_pb2.StoredEvent], put: PutRequest | None, expected_last_seq: int | None = None
) -> int:
    """What an append asks, hashed: a retry under the same request id must ask the same (never 0)."""
    h = xxhash.xxh3_64(b"events\0")
    if expected_last_seq is not None:  # an unconditional append keeps the fingerprint it always had
        h.update(struct.pack("<Q", expected_last_seq))
    for event in events:
        h.update(struct.pack("<I", event.ByteSize()))
        h.update(event.SerializeToString(deterministic=True))
    if put is not None:
        h.update(struct.pack("<Q", write_fingerprint(put, WriteMode(put.mode))))
    return h.intdigest() or 1


class EventLog:
    """The event log's write ops and the parts of other writes that touch it (delete, fork, retention)."""

    def __init__(
        self,
        config: StoreConfig,
        tables: Tables,
        requests: RequestIds,
        read: ReadTxns,
    ) -> None:
        self._config = config
        self._tables = tables
        self._requests = requests
        #: The open blocks' streams (the writer thread's alone, as every method here but the reads).
        self.streams = OpenStreams(config.encoder_cache_entries, config.encoder_cache_bytes)
        #: The store's event dictionary (eventdicts.py): read, and trained by appends until there is one.
        self.dictionary = StoreDictionary(tables.meta if tables.events is not None else None, read)

    @property
    def _events(self) -> Table:
        assert self._tables.events is not None  # a writable store has them (layout.open_layout)
        return self._tables.events

    @property
    def _logs(self) -> Table:
        assert self._tables.event_logs is not None
        return self._tables.event_logs

    def append_op(
        self,
        session_id: str,
        events: Sequence[NewEvent],
        put: PutRequest | None,
        put_op: Op | None,
        request_id: str,
        expected_last_seq: int | None = None,
    ) -> Op:
        """The op appending ``events`` to a session's log, and writing ``put_op`` (``put``'s op, built
        without a request id) in the same transaction; checked here, on the caller's thread."""
        sid = keys.session_key(session_id)
        if not isinstance(request_id, str):
            raise InvalidArgument(f"request_id must be a str, not {type(request_id).__name__}")
        stored, timeless = stored_events(events, self._config.max_state_bytes)
        if not stored and put_op is None:
            raise InvalidArgument("events is empty and there is no put: an append needs events, or a put, or both")
        if expected_last_seq is not None and (
            isinstance(expected_last_seq, bool) or not isinstance(expected_last_seq, int) or expected_last_seq < 0
        ):
            raise InvalidArgument(f"expected_last_seq must be an int >= 0, not {expected_last_seq!r}")
        rid_key = keys.request_key(sid, request_id) if request_id else None
        asked = events_fingerprint(stored, put, expected_last_seq) if rid_key is not None else 0
        tables, requests, config = self._tables, self._requests, self._config
        logs = self._logs

        def apply(batch: Batch, txn: WriteTxn) -> AppendResult:
            log = log_record(txn, tables, sid)
            expired: records_pb2.RequestRecord | None = None
            if rid_key is not None:
                done, live = self._remembered(txn, sid, rid_key, log, session_id, request_id, batch)
                if live:
                    assert done is not None
                    if done.write_xxh3 != asked:
                        raise InvalidArgument(
                            f"request_id {request_id!r} was used for a different write to session {session_id!r};"
                            " a retry must resend the same request, and a new one needs a new request_id"
                        )
                    return _replayed(done, log)
                expired = done
            if expected_last_seq is not None:
                last_seq = _log_last_seq(log)
                if last_seq != expected_last_seq:
                    raise EventSeqConflict(session_id, expected_last_seq, last_seq)
            # Every read that may fail comes before the put's first write: the op fails clean.
            open_block = self._open_block(txn, sid, log) if stored and log is not None else None
            put_result: PutResult | None = None
            if put_op is not None:
                put_result = put_op.apply(batch, txn)
            session_raw = txn.get(sid, db=tables.sessions)
            session = record(session_raw) if session_raw is not None else None
            # Never behind an earlier write's (layout.write_time): a log made after a delete is created later than
            # the deleted one, so a request record naming that one is told from one naming this (`ckpt verify`).
            now = (
                session.updated_unix_nanos
                if put_result is not None and session is not None
                else write_time(txn, tables)
            )
            first_log = log is None
            if log is None:
                log = records_pb2.EventLogRecord(next_seq=1, first_seq=1, created_unix_nanos=now, types_next_seq=1)
            first = log.next_seq if stored else 0
            if stored:
                for seq, (event, default_time) in enumerate(zip(stored, timeless, strict=True), start=log.next_seq):
                    event.seq = seq
                    if default_time:
                        event.time.FromNanoseconds(now)
                tracked = types_tracked(log)
                self._write_blocks(txn, sid, log, stored, open_block)
                if tracked:
                    _track_types(log, stored)
            if stored or first_log:
                # A put with no event leaves an existing log as it was: one record (and its pages) less to write.
                log.updated_unix_nanos = now
                txn.put(sid, log.SerializeToString(), db=logs)
            last = log.next_seq - 1 if stored else 0
            if rid_key is not None:
                rec = records_pb2.RequestRecord(
                    expires_unix_nanos=now + int(config.request_id_ttl_seconds * 1e9),
                    write_xxh3=asked,
                    # An append of events alone answers by its log (request_of_current): no session to name.
                    session_created_unix_nanos=session.created_unix_nanos if put_result is not None and session else 0,
                    events_first_seq=first,
                    events_last_seq=last,
                    events_log_created_unix_nanos=log.created_unix_nanos,
                    events_had_put=put_result is not None,
                )
                if put_result is not None:
                    record_put(rec, put_result)
                requests.store(txn, rid_key, rec, expired, batch)
            return AppendResult(first, last, put_result, log_last_seq=_log_last_seq(log))

        size = sum(e.ByteSize() for e in stored) + (put_op.size_bytes if put_op is not None else 0)
        return Op(apply, fails_clean=True, size_bytes=size, check=put_op.check if put_op is not None else None)

    def _remembered(
        self,
        txn: ReadTxn,
        sid: bytes,
        rid_key: bytes,
        log: records_pb2.EventLogRecord | None,
        session_id: str,
        request_id: str,
        batch: Batch,
    ) -> tuple[records_pb2.RequestRecord | None, bool]:
        """The record under ``rid_key`` (None: none) and whether it answers this append's retry: unexpired,
        and written to this log as it is now (or, a Put's, to the session as it is now)."""
        sessions = self._tables.sessions

        def made() -> bool:
            return log is not None or txn.get(sid, db=sessions) is not None

        def ours(done: records_pb2.RequestRecord) -> bool:
            # A Put's: refused below as a different request if it was made to the same session.
            session_raw = txn.get(sid, db=sessions) if not done.events_log_created_unix_nanos else None
            return request_of_current(done, record(session_raw) if session_raw is not None else None, log)

        return self._requests.lookup(txn, rid_key, session_id, request_id, made=made, ours=ours, batch=batch)

    def _open_block(self, txn: ReadTxn, sid: bytes, log: records_pb2.EventLogRecord) -> _OpenBlock | None:
        """The log's open block and its tail, checked (None: no block is open): with the stream that wrote
        them when that is cached and they are still what it wrote, else with their body decompressed."""
        if not log.open_block_seq:
            return None
        at = where(sid, log.open_block_seq)
        found = txn.get(block_key(sid, log.open_block_seq), db=self._events)
        if found is None:
            raise DataLoss(f"{at}: the open event block is missing")
        value = bytes(found)
        # Values a cached stream wrote are its own bytes, their headers known: checksums are checked (and
        # headers parsed) only for values it did not write (~20 us an append for a block of 20 KB).
        written = self.streams.written(sid, value)
        header = written.header if written is not None else block_header(value, at)
        tail, tail_seq = None, 0
        if header.frame_open and not header.tail:
            found = txn.get(block_key(sid, header.last_seq + 1), db=self._events)
            if found is not None:
                tail, tail_seq = bytes(found), header.last_seq + 1
        stream = self.streams.take(sid, value, tail or b"")
        if tail is not None:
            tail_header = stream.tail if stream is not None and stream.tail is not None else None
            header = joined(header, value, tail_header or block_header(tail, where(sid, tail_seq)), at)
        if header.first_seq != log.open_block_seq or header.last_seq != log.next_seq - 1 or header.tail:
            raise DataLoss(
                f"{at}: the open event block holds seqs {header.first_seq}-{header.last_seq}; the log's next seq is"
                f" {log.next_seq}"
            )
        if stream is None and header.dictionary:
            self.dictionary.in_txn(txn)  # known to this process before the block's frame names it
        raw = stream.raw if stream is not None else block_raw(value, header, at, tail)
        return _OpenBlock(header, raw, len(value) + len(tail or b""), stream, tail_seq)

    def _write_blocks(
        self,
        txn: WriteTxn,
        sid: bytes,
        log: records_pb2.EventLogRecord,
        new: list[records_pb2.StoredEvent],
        open_block: _OpenBlock | None,
    ) -> None:
        """Append ``new`` (seqs set) to the log's blocks: the open one first, then new ones, each sealed
        once full; and update the log record's counts."""
        zdict = self.dictionary.for_append(txn, new)
        run = _Run(new[0].seq) if open_block is None else _Run.of(open_block)
        runs = [run]
        for event in new:
            if run.count and run.full:
                run = _Run(event.seq)
                runs.append(run)
            run.add(event)
        added = 0
        for run in runs:
            if run.full:
                value = run.sealed(zdict)
                txn.put(block_key(sid, run.first_seq), value, db=self._events)
                if run.base is not None and run.base.tail_seq:
                    txn.delete(block_key(sid, run.base.tail_seq), db=self._events)
                added += len(value)
                continue
            # The last run: the block left open, its stream kept for the next append.
            stream = run.stream()
            times = [event_nanos(event) for event in run.events]
            for seq, written in stream.add(run.encoded(), len(run.events), min(times), max(times), zdict):
                if written is None:
                    txn.delete(block_key(sid, seq), db=self._events)
                else:
                    txn.put(block_key(sid, seq), written, db=self._events)
            added += stream.stored_bytes
            self.streams.keep(sid, stream)
        log.stored_bytes += added - (open_block.stored_bytes if open_block is not None else 0)
        log.next_seq = new[-1].seq + 1
        log.event_count = log.next_seq - log.first_seq
        log.open_block_seq = 0 if run.full else run.first_seq

    # -- the parts of other ops that touch the log -------------------------------------------------

    def delete(self, txn: WriteTxn, sid: bytes) -> tuple[bool, int]:
        """Remove a session's log (DeleteSession): whether it had one, and how many events it held."""
        raw = txn.get(sid, db=self._logs)
        if raw is None:
            return False, 0
        try:
            count = records_pb2.EventLogRecord.FromString(bytes(raw)).event_count
        except DecodeProtoError:
            count = 0  # damaged: deleting it is how an operator starts the session over
        start, stop = block_range(sid)
        txn.delete_range(self._events, start, stop)
        txn.delete(sid, db=self._logs)
        self.streams.discard(sid)  # its memory: a stream is never used unchecked (eventstream.py)
        return True, count

    def check_no_log(self, txn: ReadTxn, sid: bytes, session_id: str) -> None:
        """AlreadyExists if a fork's new session has an event log (the session exists, without versions)."""
        if txn.get(sid, db=self._logs) is not None:
            raise AlreadyExists(f"new_session_id {session_id!r} already exists (it has an event log)")

    def copy(self, txn: WriteTxn, sid: bytes, new_sid: bytes, now: int) -> None:
        """Copy a session's log to a fork (every block as it is: a block does not name its session)."""
        log = log_record(txn, self._tables, sid)
        if log is None:
            return
        start, stop = block_range(sid)
        copied = [(key[len(sid) :], value) for key, value in blocks_in(txn, self._events, start, stop)]
        for suffix, value in copied:
            txn.put(new_sid + suffix, value, db=self._events)
        log.created_unix_nanos = now
        log.updated_unix_nanos = now
        txn.put(new_sid, log.SerializeToString(), db=self._logs)

    def prune_op(self, sids: list[bytes], now: int) -> Op:
        """The op applying event retention to these sessions' logs: (logs pruned, events removed)."""
        retention = self._config.retention
        keep = retention.keep_last_events
        oldest = now - int(retention.max_event_age_seconds * 1e9) if retention.max_event_age_seconds else None

        def apply(batch: Batch, txn: WriteTxn) -> tuple[int, int]:
            pruned = removed = 0
            for sid in sids:
                try:
                    n = self._prune(txn, sid, keep, oldest)
                except DataLoss:
                    continue  # kept as it is (only read so far): verify names it
                if n:
                    pruned += 1
                    removed += n
            return pruned, removed

        return Op(apply)

    def _prune(self, txn: WriteTxn, sid: bytes, keep: int, oldest: int | None) -> int:
        """Remove the events retention drops from the front of one log; how many."""
        log = log_record(txn, self._tables, sid)
        if log is None or log.first_seq >= log.next_seq:
            return 0
        cut = log.first_seq
        if keep:
            cut = max(cut, log.next_seq - keep)
        values = blocks_in(txn, self._events, block_key(sid, log.first_seq), block_range(sid)[1])
        trimmed: list[records_pb2.StoredEvent] = []
        doomed: list[StoredBlock] = []
        age_done = oldest is None
        for block in stored_blocks(sid, values):
            header = block.header
            if header.last_seq < cut:
                doomed.append(block)
                continue
            if not age_done:
                assert oldest is not None
                if header.max_time_nanos < oldest:  # all older: the whole block goes
                    cut = header.last_seq + 1
                    doomed.append(block)
                    continue
                # Only the front of the log goes, so that seqs stay dense: up to the first event kept.
                for event in block.events(where(sid, header.first_seq)):
                    if event.seq >= cut and event_nanos(event) >= oldest:
                        break
                    cut = max(cut, event.seq + 1)
                if cut > header.last_seq:  # every event past the count cut was old
                    doomed.append(block)
                    continue
                age_done = True
            if header.first_seq < cut:  # the block the cut falls in keeps its newer events, rewritten
                trimmed = block.events(where(sid, header.first_seq))[cut - header.first_seq :]
                doomed.append(block)
            break
        removed = cut - log.first_seq
        if not removed:
            return 0
        for block in doomed:
            for seq in block.seqs:
                txn.delete(block_key(sid, seq), db=self._events)
            log.stored_bytes -= block.stored_bytes
        if trimmed:
            value = _block_value(trimmed, self.dictionary.in_txn(txn))
            txn.put(block_key(sid, cut), value, db=self._events)
            log.stored_bytes += len(value)
            if log.open_block_seq and log.open_block_seq < cut:
                log.open_block_seq = cut
        elif log.open_block_seq and log.open_block_seq < cut:
            log.open_block_seq = 0
        log.first_seq = cut
        log.event_count = log.next_seq - cut
        txn.put(sid, log.SerializeToString(), db=self._logs)
        return removed


def _log_last_seq(log: records_pb2.EventLogRecord | None) -> int:
    """The seq of the log's last event (0: no log, or no event yet)."""
    return log.next_seq - 1 if log is not None else 0


def _replayed(done: records_pb2.RequestRecord, log: records_pb2.EventLogRecord | None) -> AppendResult:
    put = replayed_put(done) if done.events_had_put else None
    return AppendResult(
        done.events_first_seq, done.events_last_seq, put, replayed=True, log_last_seq=_log_last_seq(log)
    )


@dataclass(slots=True)
class _OpenBlock:
    header: BlockHeader
    raw: bytes
    stored_bytes: int
    #: The stream that wrote the block, when cached and the block is still what it wrote.
    stream: OpenStream | None
    #: The first seq of its tail (0: it has none).
    tail_seq: int


@dataclass(slots=True)
class _Run:
    """A block being written: the open block it continues (if any), the events added, and its totals."""

    first_seq: int
    base: _OpenBlock | None = None
    events: list[records_pb2.StoredEvent] = field(default_factory=list)
    count: int = 0
    raw_bytes: int = 0
    min_time: int = 2**63
    max_time: int = 0

    @classmethod
    def of(cls, block: _OpenBlock) -> _Run:
        h = block.header
        return cls(h.first_seq, block, [], h.count, h.raw_bytes, h.min_time_nanos, h.max_time_nanos)

    @property
    def full(self) -> bool:
        return self.count >= SEAL_EVENTS or self.raw_bytes >= SEAL_RAW_BYTES

    def add(self, event: records_pb2.StoredEvent) -> None:
        self.events.append(event)
        self.count += 1
        size = event.ByteSize()
        self.raw_bytes += 1 + _varint_bytes(size) + size  # its tag, length and encoding in the body
        nanos = event_nanos(event)
        self.min_time = min(self.min_time, nanos)
        self.max_time = max(self.max_time, nanos)

    def encoded(self) -> bytes:
        """The added events' encoding (repeated fields concatenate: it follows the open block's body)."""
        return records_pb2.EventBlock(events=self.events).SerializeToString()

    def sealed(self, zdict: zstd.ZstdDict | None) -> bytes:
        """The block's value, sealed: compressed whole (from ``zdict``, the store's event dictionary, if given)."""
        raw = (self.base.raw if self.base is not None else b"") + self.encoded()
        return encode_block(raw, self.first_seq, self.count, self.min_time, self.max_time, zdict)

    def stream(self) -> OpenStream:
        """The stream the block's new events go onto: the cached one, or one started (over the stored body)."""
        if self.base is None:
            return OpenStream.start(self.first_seq)
        if self.base.stream is not None:
            return self.base.stream
        return OpenStream.resume(self.base.header, self.base.raw, self.base.tail_seq)


def _varint_bytes(n: int) -> int:
    return max(1, (n.bit_length() + 6) // 7)


def _block_value(events: list[records_pb2.StoredEvent], zdict: zstd.ZstdDict | None) -> bytes:
    run = _Run(events[0].seq)
    for event in events:
        run.add(event)
    return run.sealed(zdict)
