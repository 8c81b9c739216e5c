"""The event log's block codec: a run of consecutive events, zstd-compressed together and checksummed.

An ``events`` value (docs/storage.md) is a header, the zstd-compressed body
and an XXH3-64 of everything before it, all little-endian:

    0   2  magic b"EV"
    2   1  block format (1)
    3   1  reserved (0)
    4   8  u64 first seq
    12  4  u32 events in the block
    16  4  u32 body size before compression
    20  8  u64 earliest event time (ns since the Unix epoch)
    28  8  u64 latest event time
    36  .  zstd frame of the body: a ckpt.store.v1.EventBlock
    -8  8  u64 XXH3-64 of bytes 0 .. -8

A block is compressed whole, so an agent's events, which repeat each other
(the same types, attribute keys, JSON shapes), compress against each other,
as a chain's frames do against the state before them. The body's field
numbers are ckpt.v1.Event's: a read hands the events on without rebuilding
them. The times in the header let a time-filtered read skip a block
without decompressing it.
"""

from __future__ import annotations

import struct
import sys
from dataclasses import dataclass

import xxhash
from google.protobuf.message import DecodeError as DecodeProtoError

from ckpt.store.v1 import records_pb2

from ..errors import DataLoss

if sys.version_info >= (3, 14):
    from compression import zstd
else:  # pragma: no cover - exercised on the interpreter CI runs
    from backports import zstd

MAGIC = b"EV"
BLOCK_FORMAT = 1
_HEADER = struct.Struct("<2sBBQIIQQ")
HEADER_BYTES = _HEADER.size
_CHECKSUM = struct.Struct("<Q")
#: A block is sealed (a new one begins) once it holds this many events or this many bytes before
#: compression: large enough that events compress against each other (zstd's gains flatten out past a
#: few tens of KiB), small enough that rewriting the open block on each append stays cheap and that
#: the last 50 events of a session are in one or two blocks.
SEAL_EVENTS = 256
SEAL_RAW_BYTES = 48 * 1024
_LEVEL = 3


@dataclass(frozen=True, slots=True)
class BlockHeader:
    first_seq: int
    count: int
    raw_bytes: int
    min_time_nanos: int
    max_time_nanos: int

    @property
    def last_seq(self) -> int:
        return self.first_seq + self.count - 1

    @property
    def sealed(self) -> bool:
        return self.count >= SEAL_EVENTS or self.raw_bytes >= SEAL_RAW_BYTES


def event_nanos(event: records_pb2.StoredEvent) -> int:
    return event.time.seconds * 1_000_000_000 + event.time.nanos


def encode_block(raw: bytes, first_seq: int, count: int, min_time: int, max_time: int) -> bytes:
    """A block's stored value, of ``raw`` (a serialized EventBlock of ``count`` events from ``first_seq``)."""
    header = _HEADER.pack(MAGIC, BLOCK_FORMAT, 0, first_seq, count, len(raw), max(min_time, 0), max(max_time, 0))
    body = header + zstd.compress(raw, _LEVEL)
    return body + _CHECKSUM.pack(xxhash.xxh3_64_intdigest(body))


def block_header(value: bytes | memoryview, where: str) -> BlockHeader:
    """The header of a stored block, its checksum checked; DataLoss saying ``where`` (the session and seq)."""
    if len(value) < HEADER_BYTES + _CHECKSUM.size:
        raise DataLoss(f"{where}: the event block is {len(value)} bytes, shorter than its header and checksum")
    body = memoryview(value)[: len(value) - _CHECKSUM.size]
    (stored,) = _CHECKSUM.unpack_from(value, len(body))
    if xxhash.xxh3_64_intdigest(body) != stored:
        raise DataLoss(f"{where}: the event block fails its checksum (damaged on disk)")
    magic, fmt, _, first, count, raw_bytes, low, high = _HEADER.unpack_from(value)
    if magic != MAGIC or fmt != BLOCK_FORMAT:
        raise DataLoss(f"{where}: not an event block of a format this ckpt reads ({bytes(magic)!r}, format {fmt})")
    if count == 0:
        raise DataLoss(f"{where}: the event block holds no events")
    return BlockHeader(first, count, raw_bytes, low, high)


def block_raw(value: bytes | memoryview, header: BlockHeader, where: str) -> bytes:
    """The serialized EventBlock a stored block holds (its header already checked by :func:`block_header`)."""
    body = memoryview(value)[HEADER_BYTES : len(value) - _CHECKSUM.size]
    try:
        decompressor = zstd.ZstdDecompressor()
        raw = decompressor.decompress(body, max_length=header.raw_bytes + 1)
    except zstd.ZstdError as exc:
        raise DataLoss(f"{where}: the event block does not decompress: {exc}") from None
    if len(raw) != header.raw_bytes or not decompressor.eof:
        raise DataLoss(f"{where}: the event block holds {len(raw)} bytes; its header says {header.raw_bytes}")
    return raw


def block_events(value: bytes | memoryview, where: str) -> tuple[BlockHeader, list[records_pb2.StoredEvent]]:
    """A stored block's header and events, each checked: the checksum, the size, and seqs that run
    without a gap from the header's first seq (DataLoss naming ``where`` and the seq otherwise)."""
    header = block_header(value, where)
    raw = block_raw(value, header, where)
    try:
        events = list(records_pb2.EventBlock.FromString(raw).events)
    except DecodeProtoError as exc:
        raise DataLoss(f"{where}: the event block's events do not parse: {exc}") from None
    if len(events) != header.count:
        raise DataLoss(f"{where}: the event block holds {len(events)} events; its header says {header.count}")
    for i, event in enumerate(events):
        if event.seq != header.first_seq + i:
            raise DataLoss(
                f"{where}: event seq {header.first_seq + i} is missing from its block (found seq {event.seq} there)"
            )
    return header, events
