"""zstd for the delta frames, through two bindings of the same libzstd.

Encoding, and every stream a reader keeps live (ChainReader, ChainEncoder's
read-back, iter_versions), go through the standard library API
(``compression.zstd`` on 3.14+, ``backports.zstd`` before): it references a
raw prefix and keeps a stream open between calls. It cannot reuse a
decompression context, though, and making one (ZSTD_createDCtx) cost ~7.7 us
here, mostly its CPU feature probe, which traps to the hypervisor on a VM: a
fifth of a ~40 us cold read. So a one-shot decode (decode, decode_latest) of
a stream without a prefix and with a window up to REUSED_WINDOW_LOG_MAX goes
through python-zstandard's ZstdDecompressor instead, one per thread, reused
(:func:`decompress_once`): 3.4 us for a 10-frame stream of a 10 KB state
where a new stdlib decompressor took 10.6 us. A sealed FULL frame's payload,
one whole zstd frame, goes through that context on every read path, iter_versions
included (:func:`decompress_sealed`).
"""

from __future__ import annotations

import threading
from typing import Final

import zstandard

from .zstdlib import zstd

__all__ = [
    "FLUSH_BLOCK",
    "CompressionParameter",
    "DecompressionParameter",
    "ZstdCompressor",
    "ZstdDecompressor",
    "ZstdDict",
    "ZstdError",
    "decompress_once",
    "decompress_sealed",
    "decompress_sealed_prefix",
    "frame_header",
    "new_reader",
    "new_stream",
    "stream_memory_bytes",
    "table_log_for",
    "window_log_for",
    "zstd",
]

CompressionParameter = zstd.CompressionParameter
DecompressionParameter = zstd.DecompressionParameter
ZstdCompressor = zstd.ZstdCompressor
ZstdDecompressor = zstd.ZstdDecompressor
ZstdDict = zstd.ZstdDict
ZstdError = zstd.ZstdError

WINDOW_LOG_MIN = 10
# zstd's own maximum on 64-bit builds. Decoders are told the exact window the
# frame header records, so a frame cannot make them allocate more than that.
WINDOW_LOG_MAX = 31
FLUSH_BLOCK: Final = ZstdCompressor.FLUSH_BLOCK
TABLE_LOG_MIN = 12
TABLE_LOG_MAX = 18
LDM_WINDOW_LOG = 20
LDM_HASH_RLOG = 7  # zstd's long-distance matching table: 2**(window_log - 7) entries by default
#: The first bytes of a zstd frame (RFC 8878), little-endian 0xFD2FB528.
ZSTD_MAGIC: Final = b"\x28\xb5\x2f\xfd"


def window_log_for(nbytes: int) -> int:
    """Smallest window log whose window covers ``nbytes`` (clamped to zstd's range)."""
    return min(WINDOW_LOG_MAX, max(WINDOW_LOG_MIN, (max(nbytes, 1) - 1).bit_length()))


def table_log_for(nbytes: int) -> int:
    """Hash and chain table size (log2 entries) to index ``nbytes`` of stream content.

    The largest power of two not above ``nbytes`` (clamped): at most one entry
    per byte. Rounding up instead (a 6.4 KB state got 8,192 entries) doubled
    the tables every frame misses the cache on, for 0.1-0.2% fewer stored bytes.
    """
    return min(TABLE_LOG_MAX, max(TABLE_LOG_MIN, max(nbytes, 1).bit_length() - 1))


def stream_memory_bytes(*, window_log: int, table_log: int, prefix_size: int) -> int:
    """Estimate of what a live stream from :func:`new_stream` keeps resident, at its fullest.

    zstd holds the window (it fills as the stream runs), the hash and chain
    tables (4 bytes an entry each), buffers of about one block (<= 128 KiB),
    long-distance matching's table past a 1 MiB window, and a copy of the
    prefix. Checked against RSS over 40-version chains (encoders committed,
    heap trimmed): this estimate plus the state is 0.99-1.07x the RSS for
    REPLACE chains of 64 KB-1 MB states, whose streams fill their window, and
    1.46-1.75x for MERGE chains (which fill it slowly) and for 6 KB states.
    """
    window = 1 << window_log
    ldm_table = 1 << (window_log - 4) if window_log > LDM_WINDOW_LOG else 0
    return window + 8 * (1 << table_log) + min(window, 128 * 1024) + ldm_table + prefix_size + 16 * 1024


def new_stream(
    *, level: int, window_log: int, table_log: int, prefix: bytes | None, sealed: bool = False
) -> ZstdCompressor:
    """A compressor for one chain stream, optionally referencing ``prefix``.

    At fast levels zstd sizes its hash table for the input it expects, not for
    the window; a prefix it cannot index silently turns a delta into a nearly
    full frame (measured: 5.5 KB instead of 69 B for a 400 KB state at level
    1). So the caller sizes the hash and chain tables to index about one state
    (``table_log_for``: the prefix, or the state a stream starts on), up to 2**18
    entries (1 MiB each, bounding a live stream's memory); past a 1 MiB window
    long-distance matching finds the prefix's long repeats instead (a 16 MiB
    state: 2.8 KB with it, 3.6 MB with an 18-bit table alone).

    The tables are not sized to the window: the window of a small state's
    stream is kept wide (``min_window_log``) so the stream lasts many versions,
    but a delta mostly references the state just before it. Tables of 2**16
    entries for a 6 KB state made a live encoder ~576 KiB, and with many
    sessions' encoders interleaved every frame missed the CPU cache (a new
    chain's FULL frame also clears them). Sized to one state, encoding the
    trajectory workload in the store's order took 30% less time for 0.06%
    more stored bytes.

    ``sealed``: for a sealed FULL frame, one call with FLUSH_FRAME (FORMAT.md §13). zstd then records the
    content size, and would choose its parameters by it: another strategy and match length for small
    states (a 6 KB one: 53 bytes more), a window shrunk to the content and the long-distance matching
    table with it (a 23 MB state: 128 bytes more). So the parameters are pinned to those a stream of
    unknown size gets at this level and window: the payload is within a byte or two of the stream's.
    """
    options: dict[int, int] = {
        CompressionParameter.compression_level: level,
        CompressionParameter.window_log: window_log,
        CompressionParameter.hash_log: table_log,
        CompressionParameter.chain_log: table_log,
        CompressionParameter.checksum_flag: 0,  # the frame header carries xxh3 checksums
    }
    if window_log > LDM_WINDOW_LOG:
        options[CompressionParameter.enable_long_distance_matching] = 1
        if sealed:
            options[CompressionParameter.ldm_hash_log] = window_log - LDM_HASH_RLOG
    if sealed:
        unknown_size = zstandard.ZstdCompressionParameters.from_level(level)  # zstd's table for no size known
        options[CompressionParameter.strategy] = unknown_size.strategy
        options[CompressionParameter.min_match] = unknown_size.min_match
        options[CompressionParameter.search_log] = unknown_size.search_log
        options[CompressionParameter.target_length] = unknown_size.target_length
    zstd_dict = ZstdDict(prefix, is_raw=True).as_prefix if prefix else None
    return ZstdCompressor(options=options, zstd_dict=zstd_dict)


def new_reader(*, window_log: int, prefix: bytes | None) -> ZstdDecompressor:
    """A decompressor for one chain stream whose window is bounded by the header's ``window_log``:
    a zstd frame header asking for a larger window is a ZstdError, so a stream cannot hold more
    memory than its ckpt headers declare (FORMAT.md §4)."""
    zstd_dict = ZstdDict(prefix, is_raw=True).as_prefix if prefix else None
    return ZstdDecompressor(options=_READER_OPTIONS[window_log], zstd_dict=zstd_dict)


# One options mapping per window log, made once: setting the option costs a decompressor ~0.25 us of its
# ~8 us (~0.4 us with a new dict per call), and a cold read makes one per stream.
_READER_OPTIONS: Final[dict[int, dict[int, int]]] = {
    log: {DecompressionParameter.window_log_max: log} for log in range(WINDOW_LOG_MIN, WINDOW_LOG_MAX + 1)
}


# The largest window (log2 bytes) a one-shot decode reads through its thread's reused context. The context
# keeps the buffers of the largest window it has decoded, until 128 decodes in a row need a third as much
# (its ZSTD_sizeof_DCtx: 1.54 MB after a 2**20 stream, 0.36 MB after a 2**16 one): measured RSS a thread
# keeps after decoding a stream that fills the window, 0.3-0.45 MiB at 2**16 (the smallest window the
# encoder makes) and ~1.6 MiB at 2**20, so 16 reading threads keep at most ~25 MiB. Making a context costs
# ~8 us, which past 2**20 is under 3% of decoding the stream it would serve (~0.3 ms for a 512 KiB state);
# past the cap a stream takes a new stdlib decompressor, freed with it, as before.
REUSED_WINDOW_LOG_MAX: Final = 20
_REUSED_WINDOW_MAX = 1 << REUSED_WINDOW_LOG_MAX
_per_thread = threading.local()


def _thread_dctx() -> zstandard.ZstdDecompressor:
    """This thread's reused python-zstandard context, made on its first use."""
    dctx: zstandard.ZstdDecompressor
    try:
        dctx = _per_thread.dctx
    except AttributeError:
        dctx = _per_thread.dctx = zstandard.ZstdDecompressor(max_window_size=_REUSED_WINDOW_MAX)
    return dctx


def decompress_once(data: bytes | bytearray | memoryview, *, window_log: int, size: int) -> bytes | None:
    """The output of a whole chain stream (no prefix) whose window is bounded by ``window_log``, if it is
    exactly ``size`` bytes and its zstd frame has not ended, read through this thread's reused context;
    None on any doubt, and the caller reads the stream with :func:`new_reader`, which names the error.

    Returns bytes only where new_reader's decompressor, fed ``data`` with max_length size + 1, would
    answer the same bytes, not eof and needing input: the zstd frame header's window within
    2**window_log (what window_log_max refuses past), exactly ``size`` bytes out (reading size + 1
    bounds the output), and no end of the zstd frame in ``data`` (get_frame_size finds a whole frame).
    """
    if window_log > REUSED_WINDOW_LOG_MAX:
        return None
    try:
        if zstandard.get_frame_parameters(data).window_size > 1 << window_log:
            return None
        dctx = _thread_dctx()
        # The reader stops at the end of a zstd frame (a frame that ended is refused below).
        out: bytes = dctx.stream_reader(data, read_size=len(data)).read(size + 1)
    except Exception:  # zstandard.ZstdError, or anything else: new_reader's decompressor decides
        return None
    if len(out) != size:
        return None
    try:
        zstd.get_frame_size(data)  # the size of the whole zstd frame data starts with
    except ZstdError:  # no whole frame: the stream has not ended, as a chain stream never does (FORMAT.md §4)
        return out
    except Exception:
        return None
    return None


def frame_header(data: bytes | bytearray | memoryview) -> tuple[int | None, int]:
    """The content size a zstd frame's header declares (None if none) and the window it asks for (its
    content size, for a single-segment frame); ZstdError, with the stdlib's message, if ``data`` does not
    start with a zstd frame header. One python-zstandard call: zstd.get_frame_info reads the same header
    (ZSTD_getFrameHeader, refusing the same bytes) at ~8x the cost, a tenth of a small state's decode."""
    try:
        params = zstandard.get_frame_parameters(data)
    except zstandard.ZstdError as exc:
        zstd.get_frame_info(data)  # raises the stdlib's ZstdError for the same header
        raise ZstdError(str(exc)) from None
    size: int = params.content_size
    return (None if size == _CONTENT_SIZE_UNKNOWN else size), params.window_size


_CONTENT_SIZE_UNKNOWN: Final = 2**64 - 1  # ZSTD_CONTENTSIZE_UNKNOWN: zstd.get_frame_info's None


def sealed_payload_fits(data: bytes | bytearray | memoryview, size: int, window: int) -> bool:
    """Whether ``data`` is one zstd frame (not a skippable one) that ends at its end, declares a content size
    of ``size`` and asks for a window of at most ``window`` bytes: sealed.check_sealed_payload's checks as a
    yes or no, in two of zstd's own calls, for a reader that leaves naming a failure to that function."""
    try:
        params = zstandard.get_frame_parameters(data)
        return (
            data[:4] == ZSTD_MAGIC
            and params.content_size == size
            and params.window_size <= window
            and zstd.get_frame_size(data) == len(data)
        )
    except Exception:  # zstandard.ZstdError, or the stdlib's: no
        return False


def decompress_sealed(data: bytes | bytearray | memoryview) -> bytes | None:
    """A zstd frame's content, decoded in one shot through this thread's reused context (which allocates no
    window: the output is the window); None if that fails. Only for a payload sealed.decompress_sealed
    has checked (FORMAT.md §13): one zstd frame that ends at the end of ``data`` (so allow_extra_data=False,
    ~0.2 us of a 7.7 KB state's ~4.4 us, would check nothing), declaring its content size and a window
    within the header's window_log."""
    try:
        out: bytes = _thread_dctx().decompress(data)
    except Exception:  # zstandard.ZstdError, or anything else: the stdlib decompressor names the error
        return None
    return out


def decompress_sealed_prefix(data: bytes | bytearray | memoryview, size: int, *, window: int) -> bytes | None:
    """The first ``size`` bytes of a zstd frame's content: its blocks decoded in order until they are out,
    not the rest (a bounded read); None if that fails or gives fewer. Only for a payload
    sealed.check_sealed_payload has passed, whose zstd frame asks for a ``window``-byte window (a
    single-segment frame's: its content size). Through this thread's reused context if the window is within
    its cap (REUSED_WINDOW_LOG_MAX), else a context made for it and freed with it."""
    try:
        dctx = _thread_dctx() if window <= _REUSED_WINDOW_MAX else zstandard.ZstdDecompressor(max_window_size=window)
        out: bytes = dctx.stream_reader(data, read_size=len(data)).read(size)
    except Exception:  # zstandard.ZstdError, or anything else: the caller decodes the whole frame instead
        return None
    return out if len(out) == size else None
