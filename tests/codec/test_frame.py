"""The frame header: every field's check, as a boundary table."""

from __future__ import annotations

import struct

import pytest
import xxhash

from ckpt.codec import (
    HEADER_SIZE,
    ChainEncoder,
    ChainLinkError,
    ChecksumError,
    DecodeError,
    TruncatedFrameError,
    UnsupportedFormatError,
    decode,
    parse,
)
from tests.golden.cases import GOLDEN_POLICY, SYSTEM

# The layout as FORMAT.md documents it, independent of codec.frame's struct.
LAYOUT = struct.Struct("<4sBBBBQQIIIIQQ")
FIELDS = [
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


def frames() -> tuple[bytes, bytes]:
    enc = ChainEncoder(policy=GOLDEN_POLICY)
    full = enc.replace(SYSTEM.encode() * 3).data
    delta = enc.replace(SYSTEM.encode() * 3 + b"one more line").data
    return full, delta


def with_field(frame: bytes, **changes: object) -> bytes:
    """The frame with header fields changed and its checksum recomputed (so
    the field check, not the checksum, must catch the change)."""
    values = dict(zip(FIELDS, LAYOUT.unpack_from(frame), strict=True))
    values.update(changes)
    head = LAYOUT.pack(*values.values())
    payload = frame[HEADER_SIZE:]
    digest = xxhash.xxh3_64(head)
    digest.update(payload)
    return head + struct.pack("<Q", digest.intdigest()) + payload


def test_header_round_trip() -> None:
    _full, delta = frames()
    h, payload = parse(delta)
    assert (h.kind.name, h.version, h.base_version, h.continues_stream) == ("DELTA", 2, 1, True)
    assert len(payload) == h.payload_size == len(delta) - HEADER_SIZE
    assert with_field(delta) == delta  # the test's layout is the real one


FULL_CASES = [
    ({"magic": b"CKPX"}, UnsupportedFormatError, "bad magic"),
    ({"format": 2}, UnsupportedFormatError, "format version 2"),
    ({"format": 0}, UnsupportedFormatError, "format version 0"),
    ({"kind": 0}, UnsupportedFormatError, "unknown kind 0"),
    ({"kind": 4}, UnsupportedFormatError, "unknown kind 4"),
    ({"flags": 0x02}, UnsupportedFormatError, "unknown flags 0x02"),
    ({"flags": 0x01}, UnsupportedFormatError, "no base, prefix or stream"),
    ({"window_log": 9}, UnsupportedFormatError, "window_log 9 outside 10..31"),
    ({"window_log": 32}, UnsupportedFormatError, "window_log 32 outside 10..31"),
    ({"version": 0}, UnsupportedFormatError, "version 0"),
    ({"base_version": 3}, UnsupportedFormatError, "no base"),
    ({"base_size": 1}, UnsupportedFormatError, "no base"),
    ({"base_xxh3": 1}, UnsupportedFormatError, "no base"),
]
DELTA_CASES = [
    ({"base_version": 0}, UnsupportedFormatError, "base_version 0 is not version - 1"),
    ({"base_version": 2}, UnsupportedFormatError, "base_version 2 is not version - 1"),
    ({"prefix_size": 8}, UnsupportedFormatError, "continues a stream"),
    ({"flags": 0, "prefix_size": 7}, UnsupportedFormatError, "neither 0 nor >= 8"),
    ({"flags": 0, "prefix_size": 9}, UnsupportedFormatError, "neither 0 nor base_size"),
    ({"kind": 3, "state_size": 1}, UnsupportedFormatError, "state_size 1 < base_size"),
]


@pytest.mark.parametrize(("changes", "error", "message"), FULL_CASES, ids=lambda x: str(x))
def test_full_header_fields_are_checked(changes, error, message) -> None:
    full, _ = frames()
    with pytest.raises(error, match=message):
        parse(with_field(full, **changes))


@pytest.mark.parametrize(("changes", "error", "message"), DELTA_CASES, ids=lambda x: str(x))
def test_delta_header_fields_are_checked(changes, error, message) -> None:
    _, delta = frames()
    with pytest.raises(error, match=message):
        parse(with_field(delta, **changes))


@pytest.mark.parametrize("keep", [0, 1, 4, HEADER_SIZE - 1])
def test_short_header_is_truncated(keep: int) -> None:
    full, _ = frames()
    with pytest.raises(TruncatedFrameError, match=f"frame is {keep} bytes, shorter than the 64-byte header"):
        parse(full[:keep])


def test_short_payload_is_truncated_naming_sizes() -> None:
    full, _ = frames()
    with pytest.raises(TruncatedFrameError, match=rf"is {len(full) - 1} bytes; its header says {len(full)}"):
        parse(full[:-1])


def test_trailing_bytes_are_refused() -> None:
    full, _ = frames()
    with pytest.raises(ChecksumError, match="1 trailing bytes"):
        parse(full + b"\x00")


@pytest.mark.parametrize("offset", [0, 8, 24, 40, 55, 56, 63, 64, -1])
def test_any_flipped_byte_fails(offset: int) -> None:
    full, _ = frames()
    damaged = bytearray(full)
    damaged[offset] ^= 0x40
    with pytest.raises(DecodeError):
        decode([bytes(damaged)])


def test_payload_damage_behind_a_valid_checksum_is_caught_by_the_state_check() -> None:
    # A writer bug (not bit rot): the frame checksum is right, the content is not.
    full, _ = frames()
    h, _ = parse(full)
    forged = with_field(full, state_xxh3=h.state_xxh3 ^ 1)
    with pytest.raises(ChecksumError, match=r"state of version 1 .* fails its xxh3 check"):
        decode([forged])
    wrong_size = with_field(full, state_size=h.state_size + 1)
    with pytest.raises(ChecksumError, match="its headers say"):
        decode([wrong_size])


def test_garbage_payload_with_valid_checksum_is_a_decode_error() -> None:
    full, _ = frames()
    head = full[:HEADER_SIZE]
    garbage = bytes(range(256)) * 2
    forged = with_field(head + garbage, payload_size=len(garbage))
    with pytest.raises(DecodeError, match="version 1"):
        decode([forged])


def test_parse_refuses_non_bytes() -> None:
    with pytest.raises(TypeError):
        parse("not bytes")  # type: ignore[arg-type]


LINK_CASES = [
    ({"base_xxh3": 1}, "expects a base of"),
    ({"base_size": 1}, "expects a base of"),
    ({"window_log": 20}, "continues a stream with window_log 20"),
    ({"version": 3, "base_version": 2}, "delta against version 2, but follows version 1"),
]


@pytest.mark.parametrize(("changes", "error", "message"), DELTA_CASES, ids=lambda x: str(x))
def test_decode_fast_path_refuses_what_parse_refuses(changes, error, message) -> None:
    # decode() checks continuing frames inline; it must refuse exactly what
    # parse() refuses, with the same precise error.
    full, delta = frames()
    with pytest.raises(error, match=message):
        decode([full, with_field(delta, **changes)])


@pytest.mark.parametrize(("changes", "message"), LINK_CASES, ids=lambda x: str(x))
def test_decode_fast_path_checks_links(changes, message) -> None:
    full, delta = frames()
    with pytest.raises(ChainLinkError, match=message):
        decode([full, with_field(delta, **changes)])


def test_decode_fast_path_checks_the_frame_checksum() -> None:
    full, delta = frames()
    damaged = bytearray(delta)
    damaged[-1] ^= 1
    with pytest.raises(ChecksumError, match="frame checksum mismatch for version 2"):
        decode([full, bytes(damaged)])
