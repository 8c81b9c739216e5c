"""The frame: a header and a zstd payload, in format 1 or 2 (see FORMAT.md).

Pure functions over bytes; nothing here keeps state between calls. Byte 2
tells the formats apart: b"CKPF" 01 (format 1) has 0x50 there, b"CK" 02
(format 2) has 0x02.
"""

from __future__ import annotations

from . import frame_v1, frame_v2
from .errors import TruncatedFrameError, UnsupportedFormatError
from .header import (
    FORMAT_VERSION,
    KINDS_BY_NUMBER,
    MAX_EXPANSION,
    MAX_STATE_SIZE,
    MIN_PREFIX_SIZE,
    READABLE_FORMATS,
    V1_HEADER_SIZE,
    FrameHeader,
    FrameKind,
    as_bytes_view,
    state_checksum,
)

__all__ = [
    "FORMAT_VERSION",
    "KINDS_BY_NUMBER",
    "MAX_EXPANSION",
    "MAX_STATE_SIZE",
    "MIN_PREFIX_SIZE",
    "READABLE_FORMATS",
    "V1_HEADER_SIZE",
    "FrameHeader",
    "FrameKind",
    "as_bytes_view",
    "frame_kind",
    "pack",
    "parse",
    "state_checksum",
]

_V1_FORMAT_BYTE = frame_v1.MAGIC[2]  # 0x50, "P"
_V2_FORMAT_BYTE = 2
_MAGIC = b"CK"


def pack(header: FrameHeader, payload: bytes, *, format_version: int | None = None) -> bytes:
    """Serialize a header and its payload into frame bytes, in ``format_version`` (default: the header's)."""
    if header.payload_size != len(payload):
        raise ValueError(f"payload_size {header.payload_size} != len(payload) {len(payload)}")
    fmt = header.format if format_version is None else format_version
    if fmt == 2:
        return frame_v2.pack(header, payload)
    if fmt == 1:
        return frame_v1.pack(header, payload)
    raise ValueError(f"format_version must be one of {READABLE_FORMATS}, got {fmt!r}")


def parse(frame: bytes | bytearray | memoryview) -> tuple[FrameHeader, memoryview]:
    """Check one whole frame of either format and return its header and payload.

    Verifies the magic, format, field consistency, the exact length and the
    frame checksum (header and payload). Does not decompress.
    """
    view = as_bytes_view(frame)
    if len(view) < 3:
        raise TruncatedFrameError(f"frame is {len(view)} bytes; its first 3 bytes say its format")
    if view[:2] != _MAGIC:
        raise UnsupportedFormatError(
            f"bad magic {bytes(view[:4])!r} at offset 0 (expected b'CK\\x02' or {frame_v1.MAGIC!r})"
        )
    fmt = view[2]
    if fmt == _V2_FORMAT_BYTE:
        return frame_v2.parse(view)
    if fmt == _V1_FORMAT_BYTE:
        return frame_v1.parse(view)
    raise UnsupportedFormatError(
        f"format byte {fmt:#04x} at offset 2 is neither 0x02 (format 2) nor 0x50 (format 1, b'CKPF')"
    )


def frame_kind(frame: bytes | bytearray | memoryview) -> FrameKind:
    """The kind of a format 1 or 2 frame, from its first bytes alone.

    Nothing else is read or checked: a frame whose kind this reports may
    still fail parse(). For a store scanning a chain back to its FULL frame
    (once per frame of a cold read, so a format 2 frame takes a short path).
    Raises TruncatedFrameError if the frame is too short to say its kind and
    UnsupportedFormatError if it has no kind this codec knows.
    """
    try:  # bytes or a byte memoryview: no copy, no new view
        if frame[2] == _V2_FORMAT_BYTE and frame[0] == 0x43 and frame[1] == 0x4B:
            kind_flags = frame[3]
            if kind_flags & frame_v2.KIND_MASK and not kind_flags & ~frame_v2.KNOWN_BITS:
                return KINDS_BY_NUMBER[kind_flags & frame_v2.KIND_MASK]
    except (IndexError, NotImplementedError):
        pass  # too short, or a buffer of another shape: read its bytes below
    return _kind_or_error(bytes(as_bytes_view(frame)[:6]))


def _kind_or_error(head: bytes) -> FrameKind:
    if len(head) >= 3 and head[:2] == _MAGIC:
        if head[2] == _V2_FORMAT_BYTE:
            if len(head) < 4:
                raise TruncatedFrameError(f"frame is {len(head)} bytes; format 2 keeps its kind at offset 3")
            kind_flags = head[3]
            if kind_flags & frame_v2.KIND_MASK and not kind_flags & ~frame_v2.KNOWN_BITS:
                return KINDS_BY_NUMBER[kind_flags & frame_v2.KIND_MASK]
            raise UnsupportedFormatError(f"frame has unknown kind_flags {kind_flags:#04x} at offset 3")
        if head[2] == _V1_FORMAT_BYTE:
            if len(head) < 6:
                raise TruncatedFrameError(f"frame is {len(head)} bytes; format 1 keeps its kind at offset 5")
            if head[:4] == frame_v1.MAGIC and head[4] == 1 and head[5] in KINDS_BY_NUMBER:
                return KINDS_BY_NUMBER[head[5]]
            raise UnsupportedFormatError(f"format 1 frame has no known kind: its first bytes are {head.hex()}")
    if len(head) < 3:
        raise TruncatedFrameError(f"frame is {len(head)} bytes; its first 3 bytes say its format")
    raise UnsupportedFormatError(f"frame has neither format's magic: its first bytes are {head.hex()}")
