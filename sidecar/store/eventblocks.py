"""A session's stored event blocks as the log's readers and writers see them: each with its tail joined.

The ``events`` table holds, in a session's key range, its blocks keyed by
their first seq, and after the open (last) block possibly a *tail*: the part
of the open block's zstd frame its latest appends added (eventstream.py),
keyed by its first seq too. :func:`stored_blocks` turns a scan of those
values, in either direction, into blocks, a tail joined to its open block
(checked: the tail names the block's XXH3-64 and continues its seqs).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from ckpt.store.v1 import records_pb2

from ..errors import DataLoss
from ..storage import ReadTxn, Table
from . import keys
from .events import BlockHeader, block_header, decode_events, joined
from .records import printable

# The byte after keys.SEP: a session's block keys all sort before sid + _AFTER_SEP.
_AFTER_SEP = bytes([keys.SEP[0] + 1])


def block_key(sid: bytes, first_seq: int) -> bytes:
    """The events table's key of the block (or tail) whose first event is ``first_seq`` (as frames are keyed)."""
    return keys.frame_key(sid, first_seq)


def block_range(sid: bytes) -> tuple[bytes, bytes]:
    """Every block key of a session is in [start, stop)."""
    return sid + keys.SEP, sid + _AFTER_SEP


class Where(NamedTuple):
    """How an error names the place of a block: its session and first seq (formatted only for a message)."""

    sid: bytes
    seq: int

    def __str__(self) -> str:
        return f"session {printable(self.sid)!r} event seq {self.seq}"


def where(sid: bytes, seq: int) -> Where:
    return Where(sid, seq)


@dataclass(frozen=True, slots=True)
class StoredBlock:
    """A block as stored: its header (its tail's events included), its value and its tail's (or None)."""

    header: BlockHeader
    value: bytes
    tail: bytes | None = None
    #: The first seq of its tail (0: it has none).
    tail_seq: int = 0

    @property
    def stored_bytes(self) -> int:
        return len(self.value) + (len(self.tail) if self.tail is not None else 0)

    @property
    def seqs(self) -> tuple[int, ...]:
        """The seqs its values are keyed by: the block's first, and its tail's."""
        return (self.header.first_seq, self.tail_seq) if self.tail_seq else (self.header.first_seq,)

    def events(self, where: object, *, every_seq: bool = True) -> list[records_pb2.StoredEvent]:
        return decode_events(self.value, self.header, where, self.tail, every_seq=every_seq)


def stored_blocks(
    sid: bytes, values: Iterator[tuple[bytes, bytes]], *, newest_first: bool = False
) -> Iterator[StoredBlock]:
    """The blocks of ``values`` (keys and values of a session's range, in key order or, ``newest_first``,
    the reverse), each checked against its key and joined to its tail; DataLoss naming the seq where a
    value is not a block, or a tail has no open block before it."""
    pending: tuple[int, bytes, BlockHeader] | None = None  # an open block (a tail, newest first) not yielded yet
    for key, value in values:
        seq = keys.frame_version(key, sid)
        header = block_header(value, where(sid, seq))
        if header.first_seq != seq:
            raise DataLoss(f"{where(sid, seq)}: the block stored there begins at seq {header.first_seq}")
        if pending is not None:
            held_seq, held, held_header = pending
            pending = None
            if newest_first and not header.tail:  # the tail held is this block's
                yield StoredBlock(joined(header, value, held_header, where(sid, seq)), value, held, held_seq)
                continue
            if not newest_first and header.tail:  # the open block held has this tail
                yield StoredBlock(joined(held_header, held, header, where(sid, held_seq)), held, value, seq)
                continue
            raise DataLoss(f"{where(sid, held_seq)}: an open event block is next to a block other than its tail")
        if header.tail if newest_first else header.frame_open:
            pending = (seq, value, header)
            continue
        if header.tail:
            raise DataLoss(f"{where(sid, seq)}: an event block's tail is stored without its open block")
        yield StoredBlock(header, value)
    if pending is not None:
        held_seq, held, held_header = pending
        if newest_first:  # a tail, and nothing before it
            raise DataLoss(f"{where(sid, held_seq)}: an event block's tail is stored without its open block")
        yield StoredBlock(held_header, held)  # an open block without a tail


def blocks_in(txn: ReadTxn, table: Table, start: bytes, stop: bytes) -> Iterator[tuple[bytes, bytes]]:
    """The values keyed in [start, stop), in key order, read as the caller goes."""
    for key, value in txn.scan(table, start):
        if key >= stop:
            return
        yield bytes(key), bytes(value)
