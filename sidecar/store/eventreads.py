"""Reading a session's event log a page at a time, oldest or newest first, filtered by seq, type and time.

A read finds the block holding its first seq with one backward step of a
cursor (blocks are keyed by their first seq), then reads blocks in order.
A block whose time range misses the filter is skipped undecompressed. A
page ends with a token: the listing's kind, a hash of the log and the
filters, and the seq to resume at (listings.py's tokens, checked alike).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

from ckpt.store.v1 import records_pb2

from ..errors import DataLoss, InvalidArgument, NotFound, ResourceExhausted
from ..ids import check_event_type
from ..storage import ReadTxn, Table
from . import keys
from .args import MAX_INT, check_int_arg, check_str_arg, check_time_filter_arg
from .eventblocks import StoredBlock, block_key, block_range, stored_blocks, where
from .eventlog import types_tracked
from .events import BlockHeader, block_events, block_header, event_nanos, is_tail, joined
from .layout import Tables
from .listings import decode_token, encode_token
from .records import log_record
from .types import EventPage, EventQuery, ReadBound

Read = Callable[[], AbstractContextManager[ReadTxn]]

DEFAULT_PAGE_EVENTS = 100
MAX_PAGE_EVENTS = 1000
#: The most event types a read's filter names: each is checked and hashed into the page token, so a request
#: of millions (a 64 MiB message holds that many) would cost the sidecar that much work.
MAX_FILTER_TYPES = 1000
#: Blocks one page reads at most: a filter that matches nothing in a long log answers a page (maybe
#: empty) with a token rather than decompress the whole log in one call.
MAX_BLOCKS_PER_PAGE = 64
_TOKEN_KIND = b"e"
#: What a page counts for an event besides its encoding: its tag and length in the reply, with room to spare.
_EVENT_OVERHEAD_BYTES = 8
_ENCODED_SIZE = records_pb2.StoredEvent.ByteSize


def check_query(query: EventQuery) -> int:
    """The page size a query asks (InvalidArgument naming a field that is out of range)."""
    if not isinstance(query, EventQuery):
        raise InvalidArgument(f"query must be an EventQuery, not {type(query).__name__}")
    check_int_arg("after_seq", query.after_seq)
    size = query.page_size
    check_int_arg("page_size", size, most=MAX_PAGE_EVENTS, means=f"0 = {DEFAULT_PAGE_EVENTS}")
    check_str_arg("page_token", query.page_token)
    # A str is a sequence of one-character names: "tool_call" would match no event, silently.
    if isinstance(query.types, (str, bytes)) or not isinstance(query.types, (tuple, list, set, frozenset)):
        raise InvalidArgument(f"types must be a tuple of event types, not {type(query.types).__name__}")
    if len(query.types) > MAX_FILTER_TYPES:
        raise InvalidArgument(
            f"types names {len(query.types)} event types; a read filters by at most {MAX_FILTER_TYPES}"
        )
    for i, name in enumerate(query.types):
        check_event_type(name, f"types[{i}]")
    check_time_filter_arg("after_unix_nanos", query.after_unix_nanos)
    check_time_filter_arg("before_unix_nanos", query.before_unix_nanos)
    low, high = query.after_unix_nanos, query.before_unix_nanos
    if low is not None and high is not None and low > high:
        raise InvalidArgument(
            f"after ({low} ns) is later than before ({high} ns): no event could match; the read is of events"
            " whose time is after `after` and before `before`"
        )
    return size or DEFAULT_PAGE_EVENTS


def read_events(
    read: Read,
    tables: Tables,
    session_id: str,
    query: EventQuery,
    *,
    max_page_bytes: int,
    bound: ReadBound | None = None,
    beside_bytes: int | None = None,
) -> EventPage:
    """A page of a session's events (Store.read_events); NotFound if it has neither events nor versions;
    ResourceExhausted if it would read past ``bound``.

    ``beside_bytes``: the page shares its reply with that many bytes (a Get's state), so it holds
    ``max_page_bytes`` less them, and may be empty: its token then resumes at the first event, which a
    read without them carries (a page holds one event at least)."""
    sid = keys.session_key(session_id)
    check_int_arg("max_page_bytes", max_page_bytes, most=MAX_INT, means="0 = no limit")
    size = check_query(query)
    with read() as txn:
        log = log_record(txn, tables, sid)
        if log is None:
            if txn.get(sid, db=tables.sessions) is None:
                raise NotFound(f"session {session_id!r} does not exist (it has neither events nor versions)")
            if query.page_token:
                _refuse_token(query.page_token)
            return EventPage([], "")
        assert tables.events is not None
        resume = decode_token(query.page_token, _TOKEN_KIND, _scope(sid, log, query)) if query.page_token else b""
        if resume and (not resume.isdigit() or len(resume) > 20):
            raise InvalidArgument(
                f"page_token {keys.quoted(query.page_token)} is not a token this server issued for this listing"
            )
        low = max(query.after_seq + 1, log.first_seq)
        high = log.next_seq - 1
        if query.types and types_tracked(log):
            # No event of these types lies past the last one appended: a read after it (a LangGraph
            # saver's pending writes, read at every get_tuple) decompresses nothing.
            bounds = log.last_seq_by_type
            high = min(high, max(bounds.get(t, 0) for t in query.types))
        if resume:
            if query.newest_first:
                high = min(high, int(resume))
            else:
                low = max(low, int(resume))
        page = _Page(size, max_page_bytes, query, bound, beside_bytes)
        if low <= high:
            blocks = (
                _blocks_back(txn, tables.events, sid, high)
                if query.newest_first
                else _blocks(txn, tables.events, sid, low)
            )
            resume_at = page.fill(sid, blocks, low, high)
            if resume_at is not None:
                token = encode_token(_TOKEN_KIND, _scope(sid, log, query), str(resume_at).encode())
                return EventPage(page.events, token, log.created_unix_nanos)
        return EventPage(page.events, "", log.created_unix_nanos)


def _refuse_token(token: str) -> None:
    """InvalidArgument for ``token`` on a session without an event log: no token was issued for it (one of
    a log deleted since is refused as a new log of the same id refuses it)."""
    decode_token(token, _TOKEN_KIND, b"")  # a malformed token is named as such
    raise InvalidArgument(
        f"page_token {keys.quoted(token)} was issued for another listing (another session, one deleted since under"
        " the same id, or other filters); a listing resumes only with the tokens it returned"
    )


def _scope(sid: bytes, log: records_pb2.EventLogRecord, query: EventQuery) -> bytes:
    """What a page token is valid for: this log (not one deleted before under the same id) and filters."""
    filters = (query.after_seq, sorted(set(query.types)), query.after_unix_nanos, query.before_unix_nanos)
    return repr((sid, log.created_unix_nanos, *filters, query.newest_first)).encode()


class _Page:
    """The events one page collects, and where the next page resumes."""

    def __init__(
        self, size: int, max_bytes: int, query: EventQuery, bound: ReadBound | None = None, beside: int | None = None
    ) -> None:
        self.events: list[records_pb2.StoredEvent] = []
        self._bound = bound
        self._raw_bytes = 0
        self._size = size
        #: The page's bytes at most (0: no limit). With ``beside`` (bytes its reply also carries, a Get's
        #: state) the count starts at them, and the page may be empty: its first event did not fit.
        self._max_bytes = max_bytes
        self._may_be_empty = bool(max_bytes) and beside is not None
        self._bytes = beside if max_bytes and beside is not None else 0
        self._types = frozenset(query.types)
        self._after = query.after_unix_nanos
        self._before = query.before_unix_nanos
        self._newest_first = query.newest_first
        #: Every event of seqs low..high is on the page, in order: a block's run of them is taken whole.
        self._unfiltered = not self._types and self._after is None and self._before is None

    def _take(self, events: list[records_pb2.StoredEvent], low: int, high: int) -> int | None:
        """Add a run of a block's events (all of seqs low..high) to an unfiltered page: 0 if there is room
        for more, else the seq the next page resumes at (None: no seq is left in low..high)."""
        if self._newest_first:
            events.reverse()
        room = self._size - len(self.events)
        taken = events[:room]  # room > 0 before this block: a page ends as soon as it is full
        self._check_events(len(self.events) + len(taken))
        if self._max_bytes:
            fits = self._fitting(taken)
            if fits < len(taken):
                self.events += taken[:fits]
                return taken[fits].seq
        self.events += taken
        if len(events) < room:
            return 0
        after = self.events[-1].seq + (-1 if self._newest_first else 1)
        return after if low <= after <= high else None

    def _fitting(self, events: list[records_pb2.StoredEvent]) -> int:
        """How many of ``events`` the page takes before passing max_bytes (one at least on an empty page),
        counted as the event-by-event path counts them, but summed at once while the whole run fits: a
        loop in Python over every event tripled the cost of a page (~430 against ~150 us for 256 events)."""
        whole = self._bytes + sum(map(_ENCODED_SIZE, events)) + _EVENT_OVERHEAD_BYTES * len(events)
        if whole <= self._max_bytes:
            self._bytes = whole
            return len(events)
        for i, event in enumerate(events):
            self._bytes += event.ByteSize() + _EVENT_OVERHEAD_BYTES
            if (self.events or i or self._may_be_empty) and self._bytes > self._max_bytes:
                return i
        return len(events)

    def _check_block(self, visited: int, header: BlockHeader) -> None:
        """ResourceExhausted if visiting a ``visited``th block, ``header``'s, passes the bound."""
        bound = self._bound
        assert bound is not None
        if visited > bound.max_blocks:
            raise ResourceExhausted(
                f"the read visits more than {bound.max_blocks} event blocks (its bound's max_blocks)"
            )
        if not self._misses(header):
            self._raw_bytes += header.raw_bytes
            if self._raw_bytes > bound.max_raw_bytes:
                raise ResourceExhausted(
                    f"the read decompresses more than {bound.max_raw_bytes} bytes of events (its bound's max_raw_bytes)"
                )

    def _check_events(self, count: int) -> None:
        """ResourceExhausted if a page of ``count`` events passes the bound."""
        if self._bound is not None and count > self._bound.max_events:
            raise ResourceExhausted(
                f"the page holds more than {self._bound.max_events} events (its bound's max_events)"
            )

    def _misses(self, header: BlockHeader) -> bool:
        """Whether no event of the block can be in the time range (its header's times say)."""
        return (self._after is not None and header.max_time_nanos <= self._after) or (
            self._before is not None and header.min_time_nanos >= self._before
        )

    def _matches(self, event: records_pb2.StoredEvent) -> bool:
        if self._types and event.type not in self._types:
            return False
        if self._after is None and self._before is None:
            return True
        nanos = event_nanos(event)
        return (self._after is None or nanos > self._after) and (self._before is None or nanos < self._before)

    def fill(self, sid: bytes, blocks: Iterator[StoredBlock], low: int, high: int) -> int | None:
        """Collect the matching events of seqs low..high from ``blocks``; the seq to resume at, or None."""
        read = 0
        expect = high if self._newest_first else low  # the seq the next block must hold
        for block in blocks:
            header = block.header
            if not header.first_seq <= expect <= header.last_seq and low <= expect <= high:
                _missing(sid, expect, header.last_seq + 1 if self._newest_first else header.first_seq - 1)
            if (header.first_seq > high) if not self._newest_first else (header.last_seq < low):
                return None
            expect = header.first_seq - 1 if self._newest_first else header.last_seq + 1
            if read == MAX_BLOCKS_PER_PAGE:
                return header.last_seq if self._newest_first else header.first_seq
            read += 1
            if self._bound is not None:
                self._check_block(read, header)
            if self._misses(header):
                continue
            first = header.first_seq
            events = block.events(where(sid, first), every_seq=False)
            if self._unfiltered:
                resume = self._take(events[max(low - first, 0) : high - first + 1], low, high)
                if resume != 0:
                    return resume
                continue
            for event in reversed(events) if self._newest_first else events:
                seq = event.seq
                if not low <= seq <= high or not self._matches(event):
                    continue
                if len(self.events) == self._size:
                    return seq
                self._check_events(len(self.events) + 1)
                if self._max_bytes:
                    self._bytes += event.ByteSize() + _EVENT_OVERHEAD_BYTES
                    if (self.events or self._may_be_empty) and self._bytes > self._max_bytes:
                        return seq
                self.events.append(event)
        if low <= expect <= high:  # the blocks end before the page's range does
            _missing(sid, expect, low if self._newest_first else high)
        return None


def _missing(sid: bytes, expect: int, until: int) -> None:
    """DataLoss: the blocks skip the seqs from ``expect`` to ``until`` (down or up)."""
    low, high = min(expect, until), max(expect, until)
    raise DataLoss(f"{where(sid, low)}: events {low}-{high} are missing from the log")


def _blocks(txn: ReadTxn, table: Table, sid: bytes, low: int) -> Iterator[StoredBlock]:
    """The session's blocks from the one holding ``low`` on, oldest first."""
    start, stop = block_range(sid)
    begin = block_key(sid, low)
    for key, value in txn.scan_back(table, block_key(sid, low) + b"\x00"):
        if bytes(key) < start:
            break
        begin = bytes(key)
        if not is_tail(value):  # a tail's block is the one before it
            break
    return stored_blocks(sid, _until(txn.scan(table, begin), stop))


def _until(values: Iterator[tuple[bytes, bytes]], stop: bytes) -> Iterator[tuple[bytes, bytes]]:
    for key, value in values:
        if key >= stop:
            return
        yield bytes(key), value


def _blocks_back(txn: ReadTxn, table: Table, sid: bytes, high: int) -> Iterator[StoredBlock]:
    """The session's blocks from the one holding ``high`` back, newest first."""
    start, _ = block_range(sid)
    return stored_blocks(sid, _back_to(txn.scan_back(table, block_key(sid, high) + b"\x00"), start), newest_first=True)


def _back_to(values: Iterator[tuple[bytes, bytes]], start: bytes) -> Iterator[tuple[bytes, bytes]]:
    for key, value in values:
        if key < start:
            return
        yield bytes(key), value


def log_blocks(txn: ReadTxn, tables: Tables, sid: bytes) -> Iterator[tuple[int, bytes]]:
    """Every block of a session's log, oldest first, with the seq its key names (for verify)."""
    if tables.events is None:
        return
    start, stop = block_range(sid)
    for key, value in txn.scan(tables.events, start):
        if key >= stop:
            return
        yield keys.frame_version(bytes(key), sid), bytes(value)


def check_log(txn: ReadTxn, tables: Tables, sid: bytes) -> list[str]:
    """What is wrong with a session's event log (``ckpt verify``): every block's checksum and seqs, and
    that they run from the log's first seq to its last without a gap; each problem names the seq."""
    problems: list[str] = []
    try:
        log = log_record(txn, tables, sid)
    except DataLoss as exc:
        return [str(exc)]
    blocks = list(log_blocks(txn, tables, sid))
    if log is None:
        if blocks:
            problems.append(f"{where(sid, blocks[0][0])}: event blocks are stored without an event log record")
        return problems
    expected: int | None = log.first_seq
    stored = 0
    last_by_type: dict[str, int] = {}

    def saw(events: list[records_pb2.StoredEvent]) -> None:
        for event in events:
            if event.seq > last_by_type.get(event.type, 0):
                last_by_type[event.type] = event.seq

    base: tuple[bytes, BlockHeader] | None = None  # the open block just checked, which a tail may follow
    last: tuple[int, bool] | None = None  # the last block (not a tail): its key's seq, and whether it is open
    for first, value in blocks:
        stored += len(value)
        at = where(sid, first)
        try:
            header = block_header(value, at)
            if header.tail:  # the part of the open block before it that its latest appends added
                if base is None:
                    raise DataLoss(f"{at}: an event block's tail is stored without its open block")
                joined(base[1], base[0], header, at)
                saw(block_events(base[0], where(sid, base[1].first_seq), tail_value=value)[1])
                base = None
            else:
                if base is not None:
                    problems.append(f"{where(sid, base[1].first_seq)}: an open event block is next to another block")
                header, events = block_events(value, at)
                saw(events)
                base = (value, header) if header.frame_open else None
                last = (first, header.frame_open)
        except DataLoss as exc:
            problems.append(str(exc))
            expected = base = last = None  # the next block cannot be checked against this one
            continue
        if header.first_seq != first:
            problems.append(f"{where(sid, first)}: the block stored there begins at seq {header.first_seq}")
        if expected is not None and first != expected:
            problems.append(f"{where(sid, expected)}: events {expected}-{first - 1} are missing from the log")
        expected = header.last_seq + 1
    if expected is not None and expected != log.next_seq:
        problems.append(
            f"{where(sid, expected if expected < log.next_seq else log.next_seq)}: the log's blocks end before seq"
            f" {expected}, its record says the next seq is {log.next_seq}"
        )
    if log.event_count != log.next_seq - log.first_seq:
        problems.append(
            f"{where(sid, log.first_seq)}: the event log record counts {log.event_count} events, but its seqs"
            f" {log.first_seq} to {log.next_seq - 1} are {log.next_seq - log.first_seq}"
        )
    if blocks and expected is not None:  # every block decoded: the one appends go to is known
        problems += _open_block_problems(sid, log, last)
    if types_tracked(log):
        # A bound below an event would hide it from every read filtered by its type.
        for name, seq in sorted(last_by_type.items()):
            if log.last_seq_by_type.get(name, 0) < seq:
                problems.append(
                    f"{where(sid, seq)}: an event of type {name!r} lies past the last seq the log's record"
                    f" keeps for that type ({log.last_seq_by_type.get(name, 0)})"
                )
    if not problems and stored != log.stored_bytes:
        problems.append(
            f"session {sid.decode(errors='backslashreplace')!r}: the event log record counts {log.stored_bytes}"
            f" stored bytes; its blocks hold {stored}"
        )
    return problems


def _open_block_problems(sid: bytes, log: records_pb2.EventLogRecord, last: tuple[int, bool] | None) -> list[str]:
    """The log record's open block against the blocks: appends rewrite the block it names, which must be the
    last one (a tail may follow it), or, when it names none, start a block after the last, which must then be
    sealed (an open one beside it is damage, the reads say)."""
    opened = log.open_block_seq
    if opened and (last is None or last[0] != opened):
        found = "no block" if last is None else f"the last block begins at seq {last[0]}"
        return [
            f"{where(sid, opened)}: the event log record says the open block begins at seq {opened}, but {found}:"
            " every append to the log fails"
        ]
    if not opened and last is not None and last[1]:
        return [
            f"{where(sid, last[0])}: the last event block is open, but the event log record names no open block:"
            " the next append would start a block beside it"
        ]
    return []
