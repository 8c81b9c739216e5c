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
    KIND_NUMBERS,
    KINDS_BY_NUMBER,
    MAX_EXPANSION,
    MAX_STATE_SIZE,
    MIN_PREFIX_SIZE,
    READABLE_FORMATS,
    V1_HEADER_SIZE,
    V1_KINDS_BY_NUMBER,
    FrameHeader,
    FrameKind,
    as_bytes_view,
    check_fields,
    check_format_version,
    state_checksum,
)

__all__ = [
    "FORMAT_VERSION",
    "KINDS_BY_NUMBER",
    "KIND_NUMBERS",
    "MAX_EXPANSION",
    "MAX_STATE_SIZE",
    "MIN_PREFIX_SIZE",
    "READABLE_FORMATS",
    "V1_HEADER_SIZE",
    "V1_KINDS_BY_NUMBER",
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
# The kind of a format 2 kind_flags byte: 0-7 but a continuing PREFIX (4), a kind and at most the
# CONTINUES_STREAM flag; and a sealed FULL frame (9).
_V2_KINDS = {
    **{flags: KINDS_BY_NUMBER[flags & frame_v2.KIND_MASK] for flags in (0, 1, 2, 3, 5, 6, 7)},
    frame_v2.FLAG_SEALED | KIND_NUMBERS[FrameKind.FULL]: FrameKind.FULL,
}


def pack(header: FrameHeader, payload: bytes, *, format_version: int | None = None) -> bytes:
    """Serialize a header and its payload into frame bytes, in ``format_version`` (default: the header's).

    Writes only a frame a reader takes: a field out of its format's range, or
    one breaking the rules between fields (FORMAT.md §2), is a ValueError
    naming the field and the limit. Format 1 records a DELTA or PATCH frame's
    base_xxh3, which a format 2 header does not hold: writing such a header in
    format 1 needs its base_xxh3 set (``header._replace(base_xxh3=...)``).
    """
    if header.payload_size != len(payload):
        raise ValueError(f"payload_size {header.payload_size} != len(payload) {len(payload)}")
    fmt = check_format_version(header.format if format_version is None else format_version)
    _check_packable(header, fmt)
    if fmt == 2:
        return frame_v2.pack(header, payload)
    return frame_v1.pack(header, payload)


def write(header: FrameHeader, payload: bytes) -> bytes:
    """:func:`pack` in the header's format, without its checks: for the encoder, whose headers are valid by
    construction (the checks would add a third to the cost of a frame it writes)."""
    return frame_v2.pack(header, payload) if header.format == 2 else frame_v1.pack(header, payload)


_U32_MAX, _U64_MAX = 0xFFFF_FFFF, 0xFFFF_FFFF_FFFF_FFFF
_INT_FIELDS = ("version", "base_version", "state_size", "base_size", "payload_size", "prefix_size", "state_xxh3")
# Each integer field's largest value per format: format 1 writes them at fixed widths (its sizes in 32
# bits), format 2 as varints of at most 64 bits. window_log's range (10..31) is a field rule.
_FIELD_LIMITS = {
    fmt: {name: _U32_MAX if fmt == 1 and name.endswith("_size") else _U64_MAX for name in (*_INT_FIELDS, "base_xxh3")}
    for fmt in READABLE_FORMATS
}


def _check_packable(h: FrameHeader, fmt: int) -> None:
    if not isinstance(h.kind, FrameKind):
        raise TypeError(f"kind must be a FrameKind, got {type(h.kind).__name__} {h.kind!r}")
    if fmt == 1 and h.kind is FrameKind.PREFIX:
        raise ValueError(f"format 1 has no PREFIX kind: write version {h.version}'s PREFIX frame in format 2")
    for name, top in _FIELD_LIMITS[fmt].items():
        value = getattr(h, name)
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
        if not 0 <= value <= top:
            raise ValueError(f"{name} must be in 0..{top} in format {fmt}, got {value}")
    if not isinstance(h.window_log, int) or isinstance(h.window_log, bool):
        raise TypeError(f"window_log must be an int, got {type(h.window_log).__name__} {h.window_log!r}")
    if fmt == 1 and h.format != 1 and h.kind is not FrameKind.FULL and not h.base_xxh3:
        raise ValueError(
            f"base_xxh3 is not set: a format 1 {h.kind.name} frame records the xxh3 of its base (version"
            f" {h.base_version}'s state), which a format {h.format} header does not hold; set it to write version"
            f" {h.version} in format 1"
        )
    try:
        check_fields(h._replace(format=fmt))
    except UnsupportedFormatError as exc:
        raise ValueError(f"cannot pack {exc}") from None


def parse(frame: bytes | bytearray | memoryview) -> tuple[FrameHeader, memoryview]:
    """Check one whole frame of either format and return its header and payload.

    Verifies the magic, format, field consistency, the exact length and the
    frame checksum (header and payload). Does not decompress.
    """
    return parse_named(frame, "frame")


def parse_named(frame: bytes | bytearray | memoryview, of: str) -> tuple[FrameHeader, memoryview]:
    """:func:`parse`, naming the frame ``of`` in the errors found before its own version field is read (a
    chain's reader knows which version a frame should be: the one after the frame before it)."""
    view = as_bytes_view(frame)
    if len(view) < 3:
        raise TruncatedFrameError(f"{of} is {len(view)} bytes; its first 3 bytes say its format")
    if view[:2] != _MAGIC:
        raise UnsupportedFormatError(
            f"{of} has bad magic {bytes(view[:4])!r} at offset 0 (expected b'CK\\x02' or {frame_v1.MAGIC!r})"
        )
    fmt = view[2]
    if fmt == _V2_FORMAT_BYTE:
        return frame_v2.parse(view, of)
    if fmt == _V1_FORMAT_BYTE:
        return frame_v1.parse(view, of)
    raise UnsupportedFormatError(
        f"{of} has format byte {fmt:#04x} at offset 2, neither 0x02 (format 2) nor 0x50 (format 1, b'CKPF')"
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
            kind = _V2_KINDS.get(frame[3])
            if kind is not None:
                return kind
    except (IndexError, NotImplementedError):
        pass  # too short, or a buffer of another shape: read its bytes below
    return _kind_or_error(bytes(as_bytes_view(frame)[:6]))


def _kind_or_error(head: bytes) -> FrameKind:
    if len(head) >= 3 and head[:2] == _MAGIC:
        if head[2] == _V2_FORMAT_BYTE:
            if len(head) < 4:
                raise TruncatedFrameError(f"frame is {len(head)} bytes; format 2 keeps its kind at offset 3")
            kind_flags = head[3]
            if kind_flags in _V2_KINDS:
                return _V2_KINDS[kind_flags]
            raise UnsupportedFormatError(f"frame has unknown kind_flags {kind_flags:#04x} at offset 3")
        if head[2] == _V1_FORMAT_BYTE:
            if len(head) < 6:
                raise TruncatedFrameError(f"frame is {len(head)} bytes; format 1 keeps its kind at offset 5")
            if head[:4] == frame_v1.MAGIC and head[4] == 1 and head[5] in V1_KINDS_BY_NUMBER:
                return V1_KINDS_BY_NUMBER[head[5]]
            raise UnsupportedFormatError(f"format 1 frame has no known kind: its first bytes are {head.hex()}")
    if len(head) < 3:
        raise TruncatedFrameError(f"frame is {len(head)} bytes; its first 3 bytes say its format")
    raise UnsupportedFormatError(f"frame has neither format's magic: its first bytes are {head.hex()}")
