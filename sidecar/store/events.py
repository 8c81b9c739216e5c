"""The event log's block codec: a run of consecutive events, zstd-compressed together and checksummed.

An ``events`` value (docs/storage.md) is a header, the zstd-compressed body
and an XXH3-64 of everything before it, all little-endian:

    0   2  magic b"EV"
    2   1  block format (2; 3: its zstd frame starts from the store's event
           dictionary, eventdicts.py, whose id the frame's header names)
    3   1  flags: FRAME_OPEN (0x01), TAIL (0x02, always with FRAME_OPEN)
    4   8  u64 first seq
    12  4  u32 events in the value
    16  4  u32 their body's size before compression
    20  8  u64 earliest event time (ns since the Unix epoch)
    28  8  u64 latest event time
    36  8  a tail only: u64 XXH3-64 of the block it continues (its last 8 bytes)
    ..  .  zstd frame of the body (a ckpt.store.v1.EventBlock), or a tail's part of one
    -8  8  u64 XXH3-64 of bytes 0 .. -8

A block's events are one zstd frame, so an agent's events, which repeat each
other (the same types, attribute keys, JSON shapes), compress against each
other, as a chain's frames do against the state before them. The open block
(the one appends go to) keeps its frame open (FRAME_OPEN): every zstd block
of it is flushed, so it decodes whole, it just has no end yet. An append
compresses only its own events onto it, with the stream the writer keeps
(eventstream.py), and writes them as the block's *tail*: the zstd blocks
after the block's value, in a value of their own keyed by their first seq,
naming the block's checksum. Sealing compresses the block whole again, at a
higher level, as one ended frame. The body's field numbers are
ckpt.v1.Event's: a read hands the events on without rebuilding them. The
times in the header let a time-filtered read skip a block without
decompressing it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import xxhash
from google.protobuf.message import DecodeError as DecodeProtoError

from ckpt.store.v1 import records_pb2

from ...codec.zstdlib import zstd
from ..errors import DataLoss
from .eventdicts import REGISTRY

MAGIC = b"EV"
BLOCK_FORMAT = 2
#: The format of a block (or tail) whose frame starts from a dictionary: format 2's layout; a build that
#: reads only format 2 refuses it by its format rather than failing to decompress it.
DICTIONARY_FORMAT = 3
#: Flag bit 0: the block's zstd frame is not ended (an open block's, more zstd blocks may follow).
FRAME_OPEN = 0x01
#: Flag bit 1: the value is a tail: the part of an open block's frame after the value keyed before it.
TAIL = 0x02
#: Format 1 is format 2 without flags (byte 3 was reserved, 0): every block one ended zstd frame. Its
#: blocks are read as format 2's sealed ones (the open one is decompressed by the next append and
#: written again as format 2).
_FORMATS_READ = (1, BLOCK_FORMAT, DICTIONARY_FORMAT)
_HEADER = struct.Struct("<2sBBQIIQQ")
HEADER_BYTES = _HEADER.size
_CHECKSUM = struct.Struct("<Q")
#: A block is sealed (a new one begins) once it holds this many events or this many bytes before
#: compression: large enough that events compress against each other (zstd's gains flatten out past a
#: few tens of KiB), small enough that rewriting the open block on each append stays cheap and that
#: the last 50 events of a session are in one or two blocks.
SEAL_EVENTS = 256
SEAL_RAW_BYTES = 48 * 1024
#: A sealed block is compressed whole once, at this level (~0.6 ms for 48 KiB, once per block), as one
#: ended frame.
SEAL_LEVEL = 6
#: The open block's stream: each append compresses only its events against the block so far, within a
#: window covering a full block, with tables sized to one block. Level 6 rather than 3, measured on the
#: trajectory corpus with the event dictionary: 7% fewer bytes of blocks (5% of data.mdb at 64 writers),
#: for ~24 us rather than ~14 an append's events and twice the time to compress the block again in one
#: piece as its events double (~0.5 ms rather than ~0.25 for 15 KB): embedded appends/s 5-8% lower.
STREAM_LEVEL = 6
STREAM_WINDOW_LOG = 16
STREAM_TABLE_LOG = 14


@dataclass(slots=True)
class BlockHeader:
    """A stored value's header (not frozen: made for every value read, and a frozen one costs 2x to make)."""

    first_seq: int
    count: int
    raw_bytes: int
    min_time_nanos: int
    max_time_nanos: int
    frame_open: bool = False
    #: A tail: the value continues the frame of the open block before it (its XXH3-64: ``base_xxh3``).
    tail: bool = False
    base_xxh3: int = 0
    #: Its frame starts from a dictionary (format 3), which the frame's header names.
    dictionary: bool = False

    @property
    def last_seq(self) -> int:
        return self.first_seq + self.count - 1


def event_nanos(event: records_pb2.StoredEvent) -> int:
    return event.time.seconds * 1_000_000_000 + event.time.nanos


def encode_block(
    raw: bytes, first_seq: int, count: int, min_time: int, max_time: int, zdict: zstd.ZstdDict | None = None
) -> bytes:
    """A sealed block's stored value, of ``raw`` (a serialized EventBlock of ``count`` events from
    ``first_seq``), compressed whole as one ended frame (from ``zdict``, the store's event dictionary, if given)."""
    header = BlockHeader(first_seq, count, len(raw), min_time, max_time, dictionary=zdict is not None)
    # A block of one huge event (a logged file) is sealed at the stream's level: level 6 is ~3x slower.
    level = SEAL_LEVEL if len(raw) <= 4 * SEAL_RAW_BYTES else STREAM_LEVEL
    return block_value(header, zstd.compress(raw, level, zstd_dict=zdict.as_digested_dict if zdict else None))


def block_value(header: BlockHeader, frame: bytes) -> bytes:
    """The stored value of a block or tail: ``header``'s fields, ``frame`` (its zstd frame, or a tail's
    part of one, ended or not as ``header.frame_open`` says) and the checksum."""
    flags = (FRAME_OPEN if header.frame_open else 0) | (TAIL if header.tail else 0)
    head = _HEADER.pack(
        MAGIC,
        DICTIONARY_FORMAT if header.dictionary else BLOCK_FORMAT,
        flags,
        header.first_seq,
        header.count,
        header.raw_bytes,
        max(header.min_time_nanos, 0),
        max(header.max_time_nanos, 0),
    )
    if header.tail:
        head += _CHECKSUM.pack(header.base_xxh3)
    body = head + frame
    return body + _CHECKSUM.pack(xxhash.xxh3_64_intdigest(body))


def value_xxh3(value: bytes | memoryview) -> int:
    """The checksum a stored value ends with (a tail names its block's by it)."""
    return int(_CHECKSUM.unpack_from(value, len(value) - _CHECKSUM.size)[0])


def block_header(value: bytes | memoryview, where: object) -> BlockHeader:
    """The header of a stored block or tail, its checksum checked; DataLoss saying ``where`` (the session and seq)."""
    if len(value) < HEADER_BYTES + _CHECKSUM.size:
        raise DataLoss(f"{where}: the event block is {len(value)} bytes, shorter than its header and checksum")
    body = memoryview(value)[: len(value) - _CHECKSUM.size]
    if xxhash.xxh3_64_intdigest(body) != value_xxh3(value):
        raise DataLoss(f"{where}: the event block fails its checksum (damaged on disk)")
    magic, fmt, flags, first, count, raw_bytes, low, high = _HEADER.unpack_from(value)
    if magic != MAGIC or fmt not in _FORMATS_READ:
        raise DataLoss(f"{where}: not an event block of a format this ckpt reads ({bytes(magic)!r}, format {fmt})")
    if flags & ~(FRAME_OPEN | TAIL) or flags == TAIL or (flags and fmt == 1):
        raise DataLoss(f"{where}: the event block has flags {flags:#04x}, not a combination this ckpt writes")
    if count == 0:
        raise DataLoss(f"{where}: the event block holds no events")
    if not flags & TAIL:
        return BlockHeader(first, count, raw_bytes, low, high, bool(flags & FRAME_OPEN), dictionary=fmt == 3)
    if len(value) < HEADER_BYTES + 2 * _CHECKSUM.size:
        raise DataLoss(f"{where}: the event block's tail is {len(value)} bytes, shorter than its header and checksums")
    (base,) = _CHECKSUM.unpack_from(value, HEADER_BYTES)
    return BlockHeader(first, count, raw_bytes, low, high, True, True, base, fmt == 3)


def is_tail(value: bytes | memoryview) -> bool:
    """Whether a stored value says it is a tail (unchecked: where a scan begins, not what it returns)."""
    return len(value) > 3 and bool(value[3] & TAIL)


def _frame(value: bytes | memoryview, *, tail: bool) -> memoryview:
    start = HEADER_BYTES + (_CHECKSUM.size if tail else 0)
    return memoryview(value)[start : len(value) - _CHECKSUM.size]


def joined(base: BlockHeader, base_value: bytes | memoryview, tail: BlockHeader, where: object) -> BlockHeader:
    """The header of an open block and its tail as one block; DataLoss unless the tail continues it."""
    if not base.frame_open or base.tail or not tail.tail or base.dictionary != tail.dictionary:
        raise DataLoss(f"{where}: an event block's tail does not follow its open block")
    if tail.first_seq != base.last_seq + 1 or tail.base_xxh3 != value_xxh3(base_value):
        raise DataLoss(
            f"{where}: the tail of seqs {tail.first_seq}-{tail.last_seq} does not continue this open block (of seqs"
            f" {base.first_seq}-{base.last_seq})"
        )
    return BlockHeader(
        base.first_seq,
        base.count + tail.count,
        base.raw_bytes + tail.raw_bytes,
        min(base.min_time_nanos, tail.min_time_nanos),
        max(base.max_time_nanos, tail.max_time_nanos),
        frame_open=True,
        dictionary=base.dictionary,
    )


def block_raw(
    value: bytes | memoryview, header: BlockHeader, where: object, tail_value: bytes | memoryview | None = None
) -> bytes:
    """The serialized EventBlock a stored block holds, with its tail's events if ``tail_value`` is given
    (``header``: the block's, or :func:`joined`'s; each value's checksum already checked)."""
    frame: bytes | memoryview = _frame(value, tail=False)
    if tail_value is not None:
        frame = bytes(frame) + _frame(tail_value, tail=True)
    try:
        decompressor = zstd.ZstdDecompressor(zstd_dict=_dictionary(frame, header, where))
        raw = decompressor.decompress(frame, max_length=header.raw_bytes + 1)
    except zstd.ZstdError as exc:
        raise DataLoss(f"{where}: the event block does not decompress: {exc}") from None
    if len(raw) != header.raw_bytes:
        raise DataLoss(f"{where}: the event block holds {len(raw)} bytes; its header says {header.raw_bytes}")
    if decompressor.eof == header.frame_open or decompressor.unused_data:
        state = "ends" if decompressor.eof else "does not end"
        raise DataLoss(f"{where}: the event block's zstd frame {state} where its header's flags say otherwise")
    return raw


def _dictionary(frame: bytes | memoryview, header: BlockHeader, where: object) -> zstd.ZstdDict | None:
    """The dictionary a block's frame starts from (None: none), as its header and its frame's say."""
    try:
        dict_id = zstd.get_frame_info(frame).dictionary_id
    except zstd.ZstdError as exc:
        raise DataLoss(f"{where}: the event block does not decompress: {exc}") from None
    if bool(dict_id) != header.dictionary:
        said = "a dictionary" if header.dictionary else "none"
        raise DataLoss(f"{where}: the event block's frame names dictionary {dict_id}; its format says {said}")
    return REGISTRY.get(dict_id, where) if dict_id else None


def block_events(
    value: bytes | memoryview,
    where: object,
    *,
    tail_value: bytes | memoryview | None = None,
    every_seq: bool = True,
) -> tuple[BlockHeader, list[records_pb2.StoredEvent]]:
    """A stored block's header and events (with its tail's, if ``tail_value`` is given), each checked: the
    checksums, the size, and seqs that run without a gap from the header's first seq (DataLoss naming
    ``where`` and the seq otherwise)."""
    header = block_header(value, where)
    if header.tail:
        raise DataLoss(f"{where}: an event block's tail is stored without the open block it continues")
    if tail_value is not None:
        header = joined(header, value, block_header(tail_value, where), where)
    return header, decode_events(value, header, where, tail_value, every_seq=every_seq)


def decode_events(
    value: bytes | memoryview,
    header: BlockHeader,
    where: object,
    tail_value: bytes | memoryview | None = None,
    *,
    every_seq: bool = True,
) -> list[records_pb2.StoredEvent]:
    """The events of a block whose header (:func:`joined`'s, with ``tail_value``) is already checked.
    Without ``every_seq`` (a read's page), only the first and last event's seqs are checked: the
    checksums already stand for the rest, and ``ckpt verify`` checks each."""
    raw = block_raw(value, header, where, tail_value)
    try:
        events = list(records_pb2.EventBlock.FromString(raw).events)
    except DecodeProtoError as exc:
        raise DataLoss(f"{where}: the event block's events do not parse: {exc}") from None
    if len(events) != header.count:
        raise DataLoss(f"{where}: the event block holds {len(events)} events; its header says {header.count}")
    for i, event in enumerate(events) if every_seq else ((0, events[0]), (len(events) - 1, events[-1])):
        if event.seq != header.first_seq + i:
            raise DataLoss(
                f"{where}: event seq {header.first_seq + i} is missing from its block (found seq {event.seq} there)"
            )
    return events
