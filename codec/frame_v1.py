"""Format 1: a fixed 64-byte header and a zstd payload (FORMAT.md, "format version 1").

Read forever; written only when asked for (``format_version=1``).
"""

from __future__ import annotations

import struct

import xxhash

from .errors import ChecksumError, TruncatedFrameError, UnsupportedFormatError
from .header import V1_HEADER_SIZE, V1_KINDS_BY_NUMBER, FrameHeader, FrameKind, check_fields

MAGIC = b"CKPF"
FLAG_CONTINUES_STREAM = 0x01
# magic, format version, kind, flags, window log, version, base version,
# state size, base size, payload size, prefix size, state xxh3, base xxh3
HEAD = struct.Struct("<4sBBBBQQIIIIQQ")
CHECKSUM = struct.Struct("<Q")
STATE_XXH3_OFFSET = 40
assert HEAD.size + CHECKSUM.size == V1_HEADER_SIZE


def frame_checksum(frame: memoryview) -> int:
    """``frame_xxh3``: xxh3-64 of header bytes 0..55 followed by the payload."""
    hasher = xxhash.xxh3_64(frame[: HEAD.size])
    hasher.update(frame[V1_HEADER_SIZE:])
    return hasher.intdigest()


def pack(header: FrameHeader, payload: bytes) -> bytes:
    head = HEAD.pack(
        MAGIC,
        1,
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


def parse(view: memoryview, of: str = "frame") -> tuple[FrameHeader, memoryview]:
    """Check one whole format-1 frame (its bytes 0..2 are b"CKP") and return its header and payload.

    ``of`` names the frame in the errors found before its version field can be trusted.
    """
    if len(view) < V1_HEADER_SIZE:
        raise TruncatedFrameError(
            f"{of} is {len(view)} bytes, shorter than the {V1_HEADER_SIZE}-byte header of format 1"
        )
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
        raise UnsupportedFormatError(
            f"{of} has bad magic {bytes(magic)!r} at offset 0 (expected {MAGIC!r} or b'CK\\x02')"
        )
    if fmt != 1:
        raise UnsupportedFormatError(
            f"frame of version {version} has format version {fmt} at offset 4; this codec reads formats 1 and 2"
        )
    expected_len = V1_HEADER_SIZE + payload_size
    if len(view) < expected_len:
        raise TruncatedFrameError(
            f"frame of version {version} is {len(view)} bytes; its header says {expected_len}"
            f" ({V1_HEADER_SIZE}-byte header + {payload_size}-byte payload)"
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
            f"frame checksum mismatch for version {version} ({expected_len} bytes, format 1):"
            f" stored {stored:#018x}, computed {computed:#018x}"
        )
    # The checksum passed, so what follows catches encoder bugs and forged
    # frames rather than bit rot; still, never trust a field we did not check.
    if kind not in V1_KINDS_BY_NUMBER:
        raise UnsupportedFormatError(f"frame of version {version} has unknown kind {kind} at offset 5")
    if flags & ~FLAG_CONTINUES_STREAM:
        raise UnsupportedFormatError(f"frame of version {version} has unknown flags {flags:#04x} at offset 6")
    header = FrameHeader(
        V1_KINDS_BY_NUMBER[kind],
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
        1,
    )
    check_fields(header)
    return header, view[V1_HEADER_SIZE:]


def scan(f: bytes | bytearray | memoryview) -> tuple[int, int, int, int, int, int, int, int, int, int, int]:
    """The fields decode()'s first pass needs, in frame_v2.scan's shape, without the frame checksum.

    (kind_flags as format 2 packs them, window_log, version, base_distance,
    state_size, base_size, prefix_size, payload_size, state_xxh3 offset,
    payload offset, base_xxh3). Raises ValueError for what format 2 cannot
    express (the caller then runs parse(), which names it).
    """
    magic, fmt, kind, flags, wl, version, base_version, state_size, base_size, payload_size, prefix, _, bx = (
        HEAD.unpack_from(f)
    )
    if magic != MAGIC or fmt != 1 or not 0 < kind <= 3 or flags > 1:
        raise ValueError("not a format 1 header")
    if kind == FrameKind.FULL:
        if base_version or bx:
            raise ValueError("a FULL frame with a base")
        distance = 0
    else:
        distance = version - base_version
    return (
        kind | flags << 2,
        wl,
        version,
        distance,
        state_size,
        base_size,
        prefix,
        payload_size,
        STATE_XXH3_OFFSET,
        V1_HEADER_SIZE,
        bx,
    )
