"""Format 2: a compact header of varints and a zstd payload (FORMAT.md, "format version 2").

"CK" 02, kind_flags (kind, CONTINUES_STREAM, SEALED), window_log, then the varints version, base_distance,
state_size, base_size, prefix_size and payload_size (LEB128), then
state_xxh3 (u64) and frame_check (u32), then the payload.
"""

from __future__ import annotations

import struct

import xxhash

from .errors import ChecksumError, TruncatedFrameError, UnsupportedFormatError
from .header import (
    KINDS_BY_NUMBER,
    V2_HEAD_BYTES,
    V2_TAIL_BYTES,
    FrameHeader,
    FrameKind,
    check_fields,
)

MAGIC = b"CK\x02"  # magic "CK" and the format byte
KIND_MASK = 0x03
FLAG_CONTINUES_STREAM = 0x04
#: A sealed FULL frame (FORMAT.md §13): one whole zstd frame declaring its content size; no frame continues it.
FLAG_SEALED = 0x08
KNOWN_BITS = KIND_MASK | FLAG_CONTINUES_STREAM | FLAG_SEALED
VARINTS = ("version", "base_distance", "state_size", "base_size", "prefix_size", "payload_size")
MAX_VARINT_BYTES = 10
MIN_HEADER_SIZE = V2_HEAD_BYTES + len(VARINTS) + V2_TAIL_BYTES
U64 = struct.Struct("<Q")
U32 = struct.Struct("<I")


def put_varint(out: bytearray, value: int) -> None:
    if not 0 <= value < 1 << 64:
        raise ValueError(f"varint value {value} outside 0..2**64-1")
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)


def _varint(value: int) -> bytes:
    # Once per field of every frame written: the one- and two-byte cases without a loop.
    if 0 <= value < 0x80:
        return _ONE_BYTE[value]
    if 0x80 <= value < 0x4000:
        return bytes((value & 0x7F | 0x80, value >> 7))
    out = bytearray()
    put_varint(out, value)
    return bytes(out)


_ONE_BYTE = [bytes((v,)) for v in range(0x80)]


def pack(header: FrameHeader, payload: bytes) -> bytes:
    # Once per frame the encoder writes: no calls, and the kind number as FrameKind's value but PREFIX's 0.
    kind = header.kind
    if kind is FrameKind.FULL:
        distance = 0
    elif kind is FrameKind.PREFIX:
        kind = 0  # type: ignore[assignment]
        distance = header.base_version - header.version
        if distance < 1:
            raise ValueError(f"base_version {header.base_version} is not after version {header.version}")
    else:
        distance = header.version - header.base_version
        if distance < 1:
            raise ValueError(f"base_version {header.base_version} is not before version {header.version}")
    sealed = FLAG_SEALED if header.sealed else 0
    head = b"".join(
        (
            MAGIC,
            bytes((kind | (FLAG_CONTINUES_STREAM if header.continues_stream else 0) | sealed, header.window_log)),
            _varint(header.version),
            _varint(distance),
            _varint(header.state_size),
            _varint(header.base_size),
            _varint(header.prefix_size),
            _varint(header.payload_size),
            U64.pack(header.state_xxh3),
        )
    )
    hasher = xxhash.xxh3_64(head)
    hasher.update(payload)
    return b"".join((head, U32.pack(hasher.intdigest() & 0xFFFF_FFFF), payload))


def frame_check(frame: memoryview, check_at: int) -> int:
    """``frame_check``: the low 32 bits of xxh3-64 over the header before it, then the payload."""
    hasher = xxhash.xxh3_64(frame[:check_at])
    hasher.update(frame[check_at + 4 :])
    return hasher.intdigest() & 0xFFFF_FFFF


def read_varint(view: memoryview, at: int, name: str, of: str) -> tuple[int, int]:
    """The varint field ``name`` at offset ``at``: (value, offset after it), or the error naming it."""
    value = shift = 0
    i = at
    while True:
        if i >= len(view):
            raise TruncatedFrameError(
                f"{of} is {len(view)} bytes: it ends inside varint {name} (format 2, starting at offset {at})"
            )
        byte = view[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            break
        if i - at == MAX_VARINT_BYTES:
            raise UnsupportedFormatError(f"{of}: varint {name} at offset {at} is longer than {MAX_VARINT_BYTES} bytes")
        shift += 7
    if i - at > 1 and byte == 0:
        raise UnsupportedFormatError(
            f"{of}: varint {name} at offset {at} is not minimally encoded ({i - at} bytes for {value})"
        )
    if value >> 64:
        raise UnsupportedFormatError(f"{of}: varint {name} at offset {at} is over 64 bits")
    return value, i


def parse(view: memoryview, of: str = "frame") -> tuple[FrameHeader, memoryview]:
    """Check one whole format-2 frame (its bytes 0..2 are b"CK\\x02") and return its header and payload.

    ``of`` names the frame in the errors found before its version field is read.
    """
    if len(view) < V2_HEAD_BYTES:
        raise TruncatedFrameError(
            f"{of} is {len(view)} bytes, shorter than the smallest format 2 header ({MIN_HEADER_SIZE} bytes)"
        )
    kind_flags, window_log = view[3], view[4]
    at = V2_HEAD_BYTES
    values: list[int] = []
    for name in VARINTS:
        value, at = read_varint(view, at, name, of)
        values.append(value)
        of = f"frame of version {values[0]}"
    version, distance, state_size, base_size, prefix_size, payload_size = values
    check_at = at + 8
    expected_len = at + V2_TAIL_BYTES + payload_size
    if len(view) < expected_len:
        raise TruncatedFrameError(
            f"{of} is {len(view)} bytes; its header says {expected_len}"
            f" ({at + V2_TAIL_BYTES}-byte header + {payload_size}-byte payload)"
        )
    if len(view) > expected_len:
        raise ChecksumError(
            f"{of} is {len(view)} bytes; its header says {expected_len} ({len(view) - expected_len} trailing bytes)"
        )
    (stored,) = U32.unpack_from(view, check_at)
    computed = frame_check(view, check_at)
    if computed != stored:
        raise ChecksumError(
            f"frame checksum mismatch for version {version} ({expected_len} bytes, format 2):"
            f" frame_check at offset {check_at} is {stored:#010x}, computed {computed:#010x}"
        )
    # As in format 1: past the checksum, refuse anything a writer could not mean.
    if kind_flags & ~KNOWN_BITS:
        raise UnsupportedFormatError(f"{of} has unknown flags {kind_flags & ~KNOWN_BITS:#04x} at offset 3")
    kind = KINDS_BY_NUMBER[kind_flags & KIND_MASK]
    if kind is FrameKind.PREFIX:
        if distance < 1:
            raise UnsupportedFormatError(
                f"{of}: base_distance 0 of a PREFIX frame (its source is a newer version: distance >= 1)"
            )
        base_version = version + distance
        if base_version >> 64:
            raise UnsupportedFormatError(f"{of}: source version {base_version} of a PREFIX frame is over 64 bits")
    elif kind is FrameKind.PATCH and distance > 1:  # a segment (FORMAT.md §14)
        if kind_flags & FLAG_CONTINUES_STREAM:
            raise UnsupportedFormatError(
                f"{of}: a PATCH frame of base_distance {distance} (a segment) continues a stream; a segment starts one"
            )
        if distance >= version:
            raise UnsupportedFormatError(
                f"{of}: base_distance {distance} of a PATCH frame names version {version - distance}"
                f" (versions start at 1)"
            )
        base_version = version - distance
    elif distance != (0 if kind is FrameKind.FULL else 1):
        raise UnsupportedFormatError(
            f"{of}: base_distance {distance} of a {kind.name} frame is not"
            f" {0 if kind is FrameKind.FULL else 1}"
            f"{' (other distances are reserved)' if kind is FrameKind.DELTA or distance == 0 else ''}"
        )
    else:
        base_version = 0 if kind is FrameKind.FULL else version - 1
    header = FrameHeader(
        kind,
        version,
        base_version,
        state_size,
        base_size,
        payload_size,
        prefix_size,
        U64.unpack_from(view, at)[0],
        0,
        window_log,
        bool(kind_flags & FLAG_CONTINUES_STREAM),
        2,
        bool(kind_flags & FLAG_SEALED),
    )
    check_fields(header)
    return header, view[check_at + 4 :]


def _long_varint(f: bytes | bytearray | memoryview, i: int) -> tuple[int, int]:
    """A varint of two bytes or more at ``i``: (value, offset after it). ValueError if it is over-long
    or not minimal (parse() then names the field)."""
    value = f[i] & 0x7F
    shift = 7
    i += 1
    while True:
        b = f[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift > 63:
            raise ValueError("varint over 10 bytes")
    if not b or (shift == 63 and b > 1):
        raise ValueError("varint not minimal or over 64 bits")
    return value, i


def segment_distance(f: bytes | bytearray | memoryview) -> int:
    """The base_distance of a format 2 frame, read without any check (a PATCH frame starting a stream:
    more than 1 for a segment, FORMAT.md §14); 0 if the varints cannot be read (decoding names why)."""
    try:
        i = 5
        while f[i] & 0x80:  # the version
            i += 1
        x = f[i + 1]
        return x if x < 0x80 else _long_varint(f, i + 1)[0]
    except (IndexError, ValueError):
        return 0


def scan(f: bytes | bytearray | memoryview) -> tuple[int, int, int, int, int, int, int, int, int, int, int]:
    """The fields decode()'s first pass needs, read without the frame checksum or any other check.

    (kind_flags, window_log, version, base_distance, state_size, base_size,
    prefix_size, payload_size, state_xxh3 offset, payload offset, -1 for "no
    base_xxh3"). It runs once per frame of every cold read, so the common
    one- and two-byte varints are read inline; a malformed varint raises
    ValueError and a header cut short IndexError.
    """
    if f[0] != 0x43 or f[1] != 0x4B:
        raise ValueError("bad magic")
    x = f[5]
    if x < 0x80:
        version = x
        i = 6
    elif 0 < (y := f[6]) < 0x80:
        version = (x & 0x7F) | y << 7
        i = 7
    else:
        version, i = _long_varint(f, 5)
    x = f[i]
    if x < 0x80:
        distance = x
        i += 1
    else:
        distance, i = _long_varint(f, i)
    x = f[i]
    if x < 0x80:
        state_size = x
        i += 1
    elif 0 < (y := f[i + 1]) < 0x80:
        state_size = (x & 0x7F) | y << 7
        i += 2
    else:
        state_size, i = _long_varint(f, i)
    x = f[i]
    if x < 0x80:
        base_size = x
        i += 1
    elif 0 < (y := f[i + 1]) < 0x80:
        base_size = (x & 0x7F) | y << 7
        i += 2
    else:
        base_size, i = _long_varint(f, i)
    x = f[i]
    if x < 0x80:
        prefix_size = x
        i += 1
    else:
        prefix_size, i = _long_varint(f, i)
    x = f[i]
    if x < 0x80:
        payload_size = x
        i += 1
    elif 0 < (y := f[i + 1]) < 0x80:
        payload_size = (x & 0x7F) | y << 7
        i += 2
    else:
        payload_size, i = _long_varint(f, i)
    return (f[3], f[4], version, distance, state_size, base_size, prefix_size, payload_size, i, i + 12, -1)
