"""The frame: a fixed 64-byte header and a zstd payload (see FORMAT.md).

Pure functions over bytes; nothing here keeps state between calls.
"""

from __future__ import annotations

import enum
import struct
from typing import NamedTuple

import xxhash

from .errors import ChecksumError, TruncatedFrameError, UnsupportedFormatError

MAGIC = b"CKPF"
FORMAT_VERSION = 1
HEADER_SIZE = 64
FLAG_CONTINUES_STREAM = 0x01
_KNOWN_FLAGS = FLAG_CONTINUES_STREAM
MAX_STATE_SIZE = 0xFFFF_FFFF  # sizes are u32; protobuf messages stop at 2 GiB anyway
# zstd APIs (the stdlib's ZstdDict among them) refuse dictionaries and prefixes
# under 8 bytes; a base that short is referenced by no prefix at all.
MIN_PREFIX_SIZE = 8
# The most a zstd payload can decompress to, per payload byte: a block yields
# at most 128 KiB (zstd's Block_Maximum_Size) and takes at least 4 bytes (a
# 3-byte block header and the byte of an RLE block). Each frame's payload
# yields its own content (the writer flushes a block per frame), so a header
# declaring more content than this times its payload size cannot be right.
MAX_EXPANSION = 128 * 1024 // 4

# magic, format version, kind, flags, window log, version, base version,
# state size, base size, payload size, prefix size, state xxh3, base xxh3
HEAD = struct.Struct("<4sBBBBQQIIIIQQ")
CHECKSUM = struct.Struct("<Q")
assert HEAD.size + CHECKSUM.size == HEADER_SIZE


class FrameKind(enum.IntEnum):
    """How a frame's payload turns into its version's state."""

    FULL = 1  # zstd(state); starts a chain
    DELTA = 2  # zstd(state) referencing the base state
    PATCH = 3  # zstd(patch); state = base state + patch


class FrameHeader(NamedTuple):
    """The decoded fixed header of one frame.

    A NamedTuple rather than a frozen dataclass: decoding a chain parses one
    header per frame, and tuple construction is several times cheaper.
    """

    kind: FrameKind
    version: int
    base_version: int
    state_size: int
    base_size: int
    payload_size: int
    prefix_size: int
    state_xxh3: int
    base_xxh3: int
    window_log: int
    continues_stream: bool

    @property
    def content_size(self) -> int:
        """Bytes the payload decompresses to: the state, or for PATCH the patch."""
        return self.state_size - self.base_size if self.kind is FrameKind.PATCH else self.state_size

    @property
    def frame_size(self) -> int:
        return HEADER_SIZE + self.payload_size


def state_checksum(state: bytes | bytearray | memoryview) -> int:
    """xxh3-64 (seed 0) of a state, as stored in ``state_xxh3``."""
    return xxhash.xxh3_64_intdigest(state)


def frame_checksum(frame: memoryview) -> int:
    """``frame_xxh3``: xxh3-64 of header bytes 0..55 followed by the payload."""
    hasher = xxhash.xxh3_64(frame[: HEAD.size])
    hasher.update(frame[HEADER_SIZE:])
    return hasher.intdigest()


def pack(header: FrameHeader, payload: bytes) -> bytes:
    """Serialize a header and its payload into frame bytes."""
    if header.payload_size != len(payload):
        raise ValueError(f"payload_size {header.payload_size} != len(payload) {len(payload)}")
    head = HEAD.pack(
        MAGIC,
        FORMAT_VERSION,
        header.kind,
        FLAG_CONTINUES_STREAM if header.continues_stream else 0,
        header.window_log,
        header.version,
        header.base_version,
        header.state_size,
        header.base_size,
        header.payload_size,
        header.prefix_size,
        header.state_xxh3,
        header.base_xxh3,
    )
    hasher = xxhash.xxh3_64(head)
    hasher.update(payload)
    return b"".join((head, CHECKSUM.pack(hasher.intdigest()), payload))


def as_bytes_view(frame: bytes | bytearray | memoryview) -> memoryview:
    """A flat view of a frame's bytes, whatever the shape of the buffer given.

    Raises TypeError for an object that is not a buffer, or one that is not
    C-contiguous.
    """
    view = memoryview(frame)
    if view.itemsize != 1 or view.ndim != 1 or not view.c_contiguous:
        if not view.c_contiguous:
            raise TypeError("a frame must be a C-contiguous buffer (bytes, bytearray or memoryview)")
        view = view.cast("B")
    return view


def parse(frame: bytes | bytearray | memoryview) -> tuple[FrameHeader, memoryview]:
    """Check one whole frame and return its header and payload.

    Verifies the magic, format version, field consistency, the exact length
    and the frame checksum (header and payload). Does not decompress.
    """
    view = as_bytes_view(frame)
    if len(view) < HEADER_SIZE:
        raise TruncatedFrameError(f"frame is {len(view)} bytes, shorter than the {HEADER_SIZE}-byte header")
    (
        magic,
        fmt,
        kind,
        flags,
        window_log,
        version,
        base_version,
        state_size,
        base_size,
        payload_size,
        prefix_size,
        state_xxh3,
        base_xxh3,
    ) = HEAD.unpack_from(view)
    if magic != MAGIC:
        raise UnsupportedFormatError(f"bad magic {bytes(magic)!r} at offset 0 (expected {MAGIC!r})")
    if fmt != FORMAT_VERSION:
        raise UnsupportedFormatError(
            f"frame of version {version} has format version {fmt}; this codec reads format {FORMAT_VERSION}"
        )
    expected_len = HEADER_SIZE + payload_size
    if len(view) < expected_len:
        raise TruncatedFrameError(
            f"frame of version {version} is {len(view)} bytes; its header says {expected_len}"
            f" ({HEADER_SIZE}-byte header + {payload_size}-byte payload)"
        )
    if len(view) > expected_len:
        raise ChecksumError(
            f"frame of version {version} is {len(view)} bytes; its header says {expected_len}"
            f" ({len(view) - expected_len} trailing bytes)"
        )
    (stored,) = CHECKSUM.unpack_from(view, HEAD.size)
    computed = frame_checksum(view)
    if computed != stored:
        raise ChecksumError(
            f"frame checksum mismatch for version {version} ({expected_len} bytes):"
            f" stored {stored:#018x}, computed {computed:#018x}"
        )
    payload = view[HEADER_SIZE:]
    # The checksum passed, so what follows catches encoder bugs and forged
    # frames rather than bit rot; still, never trust a field we did not check.
    if kind not in KINDS_BY_NUMBER:
        raise UnsupportedFormatError(f"frame of version {version} has unknown kind {kind} at offset 5")
    if flags & ~_KNOWN_FLAGS:
        raise UnsupportedFormatError(f"frame of version {version} has unknown flags {flags:#04x} at offset 6")
    header = FrameHeader(
        KINDS_BY_NUMBER[kind],
        version,
        base_version,
        state_size,
        base_size,
        payload_size,
        prefix_size,
        state_xxh3,
        base_xxh3,
        window_log,
        bool(flags),
    )
    if not _fields_look_valid(header):
        _check_fields(header)  # raises, naming the field
    return header, payload


def _fields_look_valid(h: FrameHeader) -> bool:
    """The common case of _check_fields as one expression (it runs once per frame)."""
    if not (10 <= h.window_log <= 31 and h.version >= 1):
        return False
    if h.content_size > MAX_EXPANSION * h.payload_size:
        return False
    if h.kind is FrameKind.FULL:
        return not (h.base_version or h.base_size or h.prefix_size or h.base_xxh3 or h.continues_stream)
    if h.base_version != h.version - 1:
        return False
    if h.continues_stream:
        return h.prefix_size == 0 and (h.kind is FrameKind.DELTA or h.state_size >= h.base_size)
    return False  # stream starts are rare: let the full check decide


def _check_fields(h: FrameHeader) -> None:
    """Raise UnsupportedFormatError naming the first inconsistent field."""

    def bad(what: str) -> UnsupportedFormatError:
        return UnsupportedFormatError(f"inconsistent {h.kind.name} frame header for version {h.version}: {what}")

    if not 10 <= h.window_log <= 31:
        raise bad(f"window_log {h.window_log} outside 10..31")
    if h.version < 1:
        raise bad("version 0 (versions start at 1)")
    if h.kind is FrameKind.FULL:
        if h.base_version or h.base_size or h.prefix_size or h.base_xxh3 or h.continues_stream:
            raise bad("a FULL frame has no base, prefix or stream to continue")
    else:
        if h.base_version != h.version - 1:
            raise bad(f"base_version {h.base_version} is not version - 1")
        if h.continues_stream and h.prefix_size:
            raise bad(f"prefix_size {h.prefix_size} on a frame that continues a stream")
        if 0 < h.prefix_size < MIN_PREFIX_SIZE:
            raise bad(f"prefix_size {h.prefix_size} is neither 0 nor >= {MIN_PREFIX_SIZE}")
        if h.kind is FrameKind.DELTA and h.prefix_size not in (0, h.base_size):
            raise bad(f"prefix_size {h.prefix_size} is neither 0 nor base_size {h.base_size}")
        if h.kind is FrameKind.PATCH:
            if h.state_size < h.base_size:
                raise bad(f"state_size {h.state_size} < base_size {h.base_size}")
            if h.prefix_size > h.base_size:
                raise bad(f"prefix_size {h.prefix_size} > base_size {h.base_size}")
    if h.content_size > MAX_EXPANSION * h.payload_size:
        raise bad(
            f"a {h.payload_size}-byte payload cannot decompress to {h.content_size} bytes"
            f" (zstd yields at most {MAX_EXPANSION} bytes per payload byte)"
        )


KINDS_BY_NUMBER = {k.value: k for k in FrameKind}
