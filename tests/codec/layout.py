"""Both frame layouts as codec/FORMAT.md documents them, independent of codec.frame.

For tests that damage or forge frames: read a header's fields, change some,
and write the frame back with its checksum recomputed (so the checks after
the checksum must catch the change) or left as it was.
"""

from __future__ import annotations

import struct

import xxhash

V1 = struct.Struct("<4sBBBBQQIIIIQQ")  # offsets 0..55; frame_xxh3 at 56; payload at 64
V1_FIELDS = [
    "magic",
    "format",
    "kind",
    "flags",
    "window_log",
    "version",
    "base_version",
    "state_size",
    "base_size",
    "payload_size",
    "prefix_size",
    "state_xxh3",
    "base_xxh3",
]
V2_VARINTS = ["version", "base_distance", "state_size", "base_size", "prefix_size", "payload_size"]
FULL, DELTA, PATCH = 1, 2, 3
V2_CONTINUES = 0x04


def is_v2(frame: bytes) -> bool:
    return frame[:3] == b"CK\x02"


def varint(value: int, *, width: int | None = None) -> bytes:
    """Unsigned LEB128: minimal, or padded with 0x80 continuation bytes to ``width`` bytes (not minimal)."""
    out = bytearray()
    while True:
        out.append(value & 0x7F)
        value >>= 7
        if not value:
            break
    while width is not None and len(out) < width:
        out.append(0)
    for i in range(len(out) - 1):
        out[i] |= 0x80
    return bytes(out)


def read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def v2_fields(frame: bytes) -> dict[str, int]:
    """A format 2 frame's header fields, with ``varint_end`` (the offset of state_xxh3)."""
    fields = {"kind_flags": frame[3], "window_log": frame[4]}
    at = 5
    for name in V2_VARINTS:
        fields[name], at = read_varint(frame, at)
    fields["varint_end"] = at
    fields["state_xxh3"] = int.from_bytes(frame[at : at + 8], "little")
    fields["frame_check"] = int.from_bytes(frame[at + 8 : at + 12], "little")
    return fields


def v2_frame(fields: dict[str, int], payload: bytes, *, widths: dict[str, int] | None = None) -> bytes:
    """A format 2 frame of ``fields`` (varints padded to ``widths``) with its frame_check computed."""
    widths = widths or {}
    head = bytes([0x43, 0x4B, 2, fields["kind_flags"], fields["window_log"]])
    head += b"".join(varint(fields[name], width=widths.get(name)) for name in V2_VARINTS)
    head += fields["state_xxh3"].to_bytes(8, "little")
    digest = xxhash.xxh3_64(head)
    digest.update(payload)
    return head + (digest.intdigest() & 0xFFFF_FFFF).to_bytes(4, "little") + payload


def payload_of(frame: bytes) -> bytes:
    return frame[v2_fields(frame)["varint_end"] + 12 :] if is_v2(frame) else frame[64:]


def with_fields(frame: bytes, *, widths: dict[str, int] | None = None, **changes: int | bytes) -> bytes:
    """``frame`` (either format) with header fields changed and its checksum recomputed."""
    if is_v2(frame):
        fields = v2_fields(frame)
        payload = frame[fields["varint_end"] + 12 :]
        fields.update(changes)  # type: ignore[arg-type]
        if "payload" in changes:
            payload = changes["payload"]  # type: ignore[assignment]
        return v2_frame(fields, payload, widths=widths)
    values = dict(zip(V1_FIELDS, V1.unpack_from(frame), strict=True))
    payload = frame[64:]
    if "payload" in changes:
        payload = changes.pop("payload")  # type: ignore[assignment]
    values.update(changes)
    head = V1.pack(*values.values())
    digest = xxhash.xxh3_64(head)
    digest.update(payload)
    return head + struct.pack("<Q", digest.intdigest()) + payload


def with_checksum(frame: bytes) -> bytes:
    """``frame`` with its frame checksum recomputed over whatever its header and payload now are."""
    if is_v2(frame):
        try:
            check_at = v2_fields(frame)["varint_end"] + 8
        except IndexError:
            return frame
        if len(frame) < check_at + 4:
            return frame
        digest = xxhash.xxh3_64(frame[:check_at])
        digest.update(frame[check_at + 4 :])
        return frame[:check_at] + (digest.intdigest() & 0xFFFF_FFFF).to_bytes(4, "little") + frame[check_at + 4 :]
    if len(frame) < 64:
        return frame
    digest = xxhash.xxh3_64(frame[:56])
    digest.update(frame[64:])
    return frame[:56] + struct.pack("<Q", digest.intdigest()) + frame[64:]


def kind_of(frame: bytes) -> int:
    """The kind number of a well-formed frame of either format."""
    return frame[3] & 0x03 if is_v2(frame) else frame[5]


def v1_field_spans() -> list[tuple[int, int]]:
    """(offset, size) of each format 1 header field before frame_xxh3."""
    spans, at = [], 0
    for code in ["4s", "B", "B", "B", "B", "Q", "Q", "I", "I", "I", "I", "Q", "Q"]:
        size = struct.calcsize("<" + code)
        spans.append((at, size))
        at += size
    return spans
