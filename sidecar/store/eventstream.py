"""The open event block's zstd stream, kept between appends, so that an append compresses only its own events.

Decompressing the open block, adding the events and compressing it whole
again with a new zstd context at each append cost ~0.6 ms of CPU for a block
of a few dozen events, and freed and wrote the block's pages. The writer
keeps, per session, the open block's body and the live compressor of its
frame instead. An append compresses its events onto the frame (zstd blocks
flushed, the frame left open: events.py) and writes only the part of the
frame after the block's stored value, as a small *tail* value keyed by its
first seq. Once the tail holds TAIL_FOLD_BYTES, the next append folds it
into the block's value and the tail goes; as the block's events double, the
fold compresses the block again in one piece (as small, and as fast to read,
as a block compressed whole), else it appends the tail's zstd blocks.

What is cached is checked against storage before each use, as the encoder
cache is (coherence.py): an entry continues the stored block only if the
values stored now (block and tail) are, byte for byte, the values the entry
last wrote. Another process (``ckpt serve --workers``) may have appended to
the block, retention may have rewritten it, a transaction that wrote it may
have been undone, the session may have been deleted and written again: the
values differ in each case, and the block is read back and compressed again
instead. Equal bytes are the same block: the entry's stream continues them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...codec.zstdlib import zstd
from .cache import LRU
from .events import (
    STREAM_LEVEL,
    STREAM_TABLE_LOG,
    STREAM_WINDOW_LOG,
    BlockHeader,
    block_value,
    value_xxh3,
)

#: A tail grows to this many bytes of frame before the next append folds it into the block. A tail is a
#: small value, on a leaf page with others, written at each append instead of the block (whose pages
#: LMDB frees, to reuse only once no transaction can see them): measured on the trajectory corpus at 64
#: writers, 460-476 bytes of data.mdb an event with 256, 476-483 with 512, 494-503 with 1024, 548
#: without tails. A fold appends the tail's zstd blocks to the block's frame as they are.
TAIL_FOLD_BYTES = 256
#: ... unless folding it would take the block's value onto one more page of LMDB's: the tail then grows on
#: its leaf page, up to this many bytes of frame (a leaf holds a value of up to ~2,000 bytes with its
#: key). A block's value past ~2 KB fills pages of its own, the last one part way, and most sessions' logs
#: end in one open block: folding only while the value stays on its pages fills them before taking the
#: next (measured at 64 writers on the trajectory corpus: data.mdb's bytes an event, see bench/HISTORY.md).
TAIL_MAX_BYTES = 1024
#: LMDB's page, and what its overflow pages hold of a value: a value whose node (with a key of ~30 bytes
#: and 8 of node header) passes half a page is stored on whole pages of its own after a 16-byte header.
_PAGE_BYTES = 4096
_LEAF_VALUE_MAX = 2040 - 40
#: At most this much memory for the cached streams, whatever the encoder cache's budget (which bounds
#: them too: they are encoders of a kind). A stream weighs ~0.3 MiB with its block, so 64 MiB keeps the
#: open blocks of ~200 sessions appended to in turn.
MAX_STREAMS_BYTES = 64 * 1024 * 1024
# zstd's resident memory for a live stream of these parameters: the window, the hash and chain tables
# (4 bytes an entry each), about one block of buffers, and its context.
_STREAM_MEMORY = (1 << STREAM_WINDOW_LOG) + 8 * (1 << STREAM_TABLE_LOG) + (1 << STREAM_WINDOW_LOG) + 16 * 1024

#: What an append writes: (the seq a value is keyed by, the value; None: delete it).
Writes = list[tuple[int, bytes | None]]


def new_compressor(zdict: zstd.ZstdDict | None = None) -> zstd.ZstdCompressor:
    options: dict[int, int] = {
        zstd.CompressionParameter.compression_level: STREAM_LEVEL,
        zstd.CompressionParameter.window_log: STREAM_WINDOW_LOG,
        zstd.CompressionParameter.hash_log: STREAM_TABLE_LOG,
        zstd.CompressionParameter.chain_log: STREAM_TABLE_LOG,
        zstd.CompressionParameter.checksum_flag: 0,  # the values' XXH3s cover the frame
    }
    # Digested: the dictionary's tables made once and shared, not loaded into each new context (~100 us).
    return zstd.ZstdCompressor(options=options, zstd_dict=zdict.as_digested_dict if zdict is not None else None)


@dataclass(slots=True)
class OpenStream:
    """An open block as the writer last wrote it: its value's header, its body (tail included), the
    value and tail stored, and the compressor whose frame they hold."""

    #: The block's value's header (every event, tail included, until that value is written).
    header: BlockHeader
    raw: bytes
    compressor: zstd.ZstdCompressor | None = None
    #: The block's value as stored (b"": not written by this stream yet: the next append writes it).
    value: bytes = b""
    #: Its zstd frame, and how many events it held when last compressed in one piece.
    frame: bytes = b""
    compressed_count: int = 0
    tail: BlockHeader | None = None
    tail_frame: bytes = b""
    tail_value: bytes = b""
    #: The first seq of a tail stored before this stream began, which its first write deletes.
    stale_tail_seq: int = 0

    @classmethod
    def start(cls, first_seq: int) -> OpenStream:
        """A stream for a new block beginning at ``first_seq`` (its events are added next)."""
        return cls(BlockHeader(first_seq, 0, 0, 2**63, 0, frame_open=True), b"")

    @classmethod
    def resume(cls, header: BlockHeader, raw: bytes, tail_seq: int) -> OpenStream:
        """A stream over a stored block (its header, with its tail's events, and its body ``raw``; the
        first seq of its tail, 0 if none): the next append compresses it again with its events."""
        return cls(header, raw, stale_tail_seq=tail_seq)

    def add(
        self, encoded: bytes, count: int, min_time: int, max_time: int, zdict: zstd.ZstdDict | None = None
    ) -> Writes:
        """Add ``count`` events (``encoded``: their EventBlock encoding, times min..max): what to write.
        A block compressed again in one piece starts from ``zdict`` (the store's event dictionary) if given;
        zstd blocks added to its frame continue it as it began."""
        if self.compressor is not None and self.value and self._tail_grows():
            return self._onto_tail(encoded, count, min_time, max_time)
        writes: Writes = []
        for stale in (self.tail.first_seq if self.tail is not None else 0, self.stale_tail_seq):
            if stale:
                writes.append((stale, None))
        h = self.header
        count += h.count + (self.tail.count if self.tail is not None else 0)
        low, high = min(h.min_time_nanos, min_time), max(h.max_time_nanos, max_time)
        if self.tail is not None:
            low, high = min(low, self.tail.min_time_nanos), max(high, self.tail.max_time_nanos)
        self.raw += encoded
        dictionary = h.dictionary
        if self.compressor is None or count >= 2 * self.compressed_count:
            # The block compressed again in one piece: as small as compressing it whole, and as fast to
            # read. Only as its events double: the work stays about twice the block's, whatever its length.
            self.compressor = new_compressor(zdict)
            self.frame = self.compressor.compress(self.raw, zstd.ZstdCompressor.FLUSH_BLOCK)
            self.compressed_count = count
            dictionary = zdict is not None
        else:  # the tail and the new events' zstd blocks go onto the block's frame as they are
            self.frame += self.tail_frame + self.compressor.compress(encoded, zstd.ZstdCompressor.FLUSH_BLOCK)
        self.header = BlockHeader(h.first_seq, count, len(self.raw), low, high, True, dictionary=dictionary)
        self.value = block_value(self.header, self.frame)
        self.tail, self.tail_frame, self.tail_value, self.stale_tail_seq = None, b"", b"", 0
        writes.append((h.first_seq, self.value))
        return writes

    def _tail_grows(self) -> bool:
        """Whether the next events go onto the tail rather than fold it into the block's value."""
        tail = len(self.tail_frame)
        if tail < TAIL_FOLD_BYTES:
            return True
        return tail < TAIL_MAX_BYTES and value_pages(len(self.value) + tail) > value_pages(len(self.value))

    def _onto_tail(self, encoded: bytes, count: int, min_time: int, max_time: int) -> Writes:
        assert self.compressor is not None
        self.tail_frame += self.compressor.compress(encoded, zstd.ZstdCompressor.FLUSH_BLOCK)
        self.raw += encoded
        t = self.tail
        if t is None:
            h = self.header
            t = BlockHeader(h.last_seq + 1, 0, 0, min_time, max_time, True, True, value_xxh3(self.value), h.dictionary)
        self.tail = BlockHeader(
            t.first_seq,
            t.count + count,
            t.raw_bytes + len(encoded),
            min(t.min_time_nanos, min_time),
            max(t.max_time_nanos, max_time),
            True,
            True,
            t.base_xxh3,
            t.dictionary,
        )
        self.tail_value = block_value(self.tail, self.tail_frame)
        return [(t.first_seq, self.tail_value)]

    @property
    def stored_bytes(self) -> int:
        return len(self.value) + len(self.tail_value)

    def memory_bytes(self) -> int:
        return _STREAM_MEMORY + len(self.raw) + len(self.frame) + len(self.tail_frame) + self.stored_bytes


def value_pages(value_bytes: int) -> int:
    """The pages of its own LMDB stores a value of ``value_bytes`` on (0: it shares a leaf page)."""
    return 0 if value_bytes <= _LEAF_VALUE_MAX else -(-(value_bytes + 16) // _PAGE_BYTES)


class OpenStreams:
    """The writer's open-block streams by session, bounded by count and memory; not thread-safe."""

    def __init__(self, entries: int, max_bytes: int) -> None:
        self._lru: LRU[OpenStream] = LRU(
            entries, max_weight=min(max_bytes, MAX_STREAMS_BYTES), weigh=OpenStream.memory_bytes
        )
        self.hits = 0
        self.misses = 0

    def take(self, sid: bytes, value: bytes, tail_value: bytes) -> OpenStream | None:
        """The session's stream, removed from the cache, if it last wrote ``value`` and ``tail_value``
        (b"": no tail), the open block as storage holds it now; None otherwise. Put it back with
        :meth:`keep` once it wrote again."""
        stream = self._lru.get(sid)
        if stream is None:
            self.misses += 1
            return None
        self._lru.discard(sid)
        if stream.value != value or stream.tail_value != tail_value:
            self.misses += 1
            return None
        self.hits += 1
        return stream

    def written(self, sid: bytes, value: bytes) -> OpenStream | None:
        """The session's stream, left in the cache, if it last wrote ``value`` (the open block's value as
        storage holds it now, without its tail); None otherwise."""
        stream = self._lru.get(sid)
        return stream if stream is not None and stream.value == value else None

    def keep(self, sid: bytes, stream: OpenStream) -> None:
        self._lru.put(sid, stream)

    def discard(self, sid: bytes) -> None:
        self._lru.discard(sid)

    def clear(self) -> None:
        self._lru.clear()

    def __len__(self) -> int:
        return len(self._lru)
