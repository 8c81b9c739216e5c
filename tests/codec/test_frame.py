"""The frame header of both formats: every field's check, as boundary tables, and the varints of format 2."""

from __future__ import annotations

import pytest
import xxhash

from ckpt.codec import (
    READABLE_FORMATS,
    ChainEncoder,
    ChainLinkError,
    ChecksumError,
    DecodeError,
    FrameKind,
    TruncatedFrameError,
    UnsupportedFormatError,
    decode,
    frame_kind,
    iter_versions,
    open_chain,
    pack,
    parse,
)
from tests.codec.layout import V2_VARINTS, is_v2, payload_of, v2_fields, v2_frame, varint, with_fields
from tests.golden.cases import GOLDEN_POLICY, SYSTEM


def frames(fmt: int) -> tuple[bytes, bytes]:
    """A FULL frame and the DELTA continuing its stream."""
    enc = ChainEncoder(policy=GOLDEN_POLICY, format_version=fmt)
    full = enc.replace(SYSTEM.encode() * 3).data
    delta = enc.replace(SYSTEM.encode() * 3 + b"one more line").data
    return full, delta


@pytest.mark.parametrize("fmt", READABLE_FORMATS)
def test_header_round_trip(fmt: int) -> None:
    full, delta = frames(fmt)
    h, payload = parse(delta)
    assert (h.kind.name, h.version, h.base_version, h.continues_stream, h.format) == ("DELTA", 2, 1, True, fmt)
    assert len(payload) == h.payload_size == len(delta) - h.header_size
    assert h.frame_size == len(delta)
    assert with_fields(delta) == delta  # the test's layout is the real one
    for frame in (full, delta):
        header, payload = parse(frame)
        assert pack(header, bytes(payload)) == frame
        assert frame_kind(frame) is header.kind


def test_format_2_headers_are_compact() -> None:
    v1, v2 = frames(1)[1], frames(2)[1]
    assert len(v1) - len(v2) == 64 - parse(v2)[0].header_size
    assert parse(v2)[0].header_size == 5 + 6 + 12 + 2  # state_size and base_size take two bytes each


def test_pack_writes_either_format_on_request() -> None:
    h1, payload = parse(frames(1)[1])
    h2, _ = parse(frames(2)[1])
    assert pack(h1, bytes(payload)) == frames(1)[1]  # a format 1 header packs as format 1
    assert pack(h2, bytes(payload), format_version=2) == frames(2)[1]
    with pytest.raises(ValueError, match="format_version must be one of"):
        pack(h2, bytes(payload), format_version=3)


V1_FULL_CASES = [
    ({"magic": b"CKPX"}, UnsupportedFormatError, "bad magic"),
    ({"format": 2}, UnsupportedFormatError, "format version 2 at offset 4"),
    ({"format": 0}, UnsupportedFormatError, "format version 0 at offset 4"),
    ({"kind": 0}, UnsupportedFormatError, "unknown kind 0 at offset 5"),
    ({"kind": 4}, UnsupportedFormatError, "unknown kind 4 at offset 5"),
    ({"flags": 0x02}, UnsupportedFormatError, "unknown flags 0x02 at offset 6"),
    ({"flags": 0x01}, UnsupportedFormatError, "no base, prefix or stream"),
    ({"window_log": 9}, UnsupportedFormatError, "window_log 9 outside 10..31"),
    ({"window_log": 32}, UnsupportedFormatError, "window_log 32 outside 10..31"),
    ({"version": 0}, UnsupportedFormatError, "version 0"),
    ({"base_version": 3}, UnsupportedFormatError, "no base"),
    ({"base_size": 1}, UnsupportedFormatError, "no base"),
    ({"base_xxh3": 1}, UnsupportedFormatError, "no base"),
    ({"state_size": 32768 * 300}, UnsupportedFormatError, "cannot decompress to"),
]
V1_DELTA_CASES = [
    ({"base_version": 0}, UnsupportedFormatError, "base_version 0 is not version - 1"),
    ({"base_version": 2}, UnsupportedFormatError, "base_version 2 is not version - 1"),
    ({"prefix_size": 8}, UnsupportedFormatError, "continues a stream"),
    ({"flags": 0, "prefix_size": 7}, UnsupportedFormatError, "neither 0 nor >= 8"),
    ({"flags": 0, "prefix_size": 9}, UnsupportedFormatError, "neither 0 nor base_size"),
    ({"kind": 3, "state_size": 1}, UnsupportedFormatError, "state_size 1 < base_size"),
]
V2_FULL_CASES = [
    # Kind 0 is PREFIX, whose source is a newer version: a base_distance of 0 names none.
    ({"kind_flags": 0x00}, UnsupportedFormatError, "base_distance 0 of a PREFIX frame"),
    ({"kind_flags": 0x04}, UnsupportedFormatError, "base_distance 0 of a PREFIX frame"),
    ({"kind_flags": 0x11}, UnsupportedFormatError, "unknown flags 0x10 at offset 3"),
    ({"kind_flags": 0x0D}, UnsupportedFormatError, "no base, prefix or stream"),
    ({"kind_flags": 0x81}, UnsupportedFormatError, "unknown flags 0x80 at offset 3"),
    ({"kind_flags": 0x05}, UnsupportedFormatError, "no base, prefix or stream"),
    ({"window_log": 9}, UnsupportedFormatError, "window_log 9 outside 10..31"),
    ({"window_log": 32}, UnsupportedFormatError, "window_log 32 outside 10..31"),
    ({"version": 0}, UnsupportedFormatError, "version 0"),
    ({"base_distance": 1}, UnsupportedFormatError, "base_distance 1 of a FULL frame is not 0"),
    ({"base_size": 1}, UnsupportedFormatError, "no base"),
    ({"prefix_size": 8}, UnsupportedFormatError, "no base, prefix"),
    ({"state_size": 32768 * 300}, UnsupportedFormatError, "cannot decompress to"),
]
V2_DELTA_CASES = [
    ({"base_distance": 0}, UnsupportedFormatError, r"base_distance 0 of a DELTA frame is not 1 \(other distances"),
    ({"base_distance": 2}, UnsupportedFormatError, "base_distance 2 of a DELTA frame is not 1"),
    ({"base_distance": 2**63}, UnsupportedFormatError, "base_distance 9223372036854775808 of a DELTA"),
    ({"prefix_size": 8}, UnsupportedFormatError, "continues a stream"),
    ({"kind_flags": 0x02, "prefix_size": 7}, UnsupportedFormatError, "neither 0 nor >= 8"),
    ({"kind_flags": 0x02, "prefix_size": 9}, UnsupportedFormatError, "neither 0 nor base_size"),
    ({"kind_flags": 0x07, "state_size": 1}, UnsupportedFormatError, "state_size 1 < base_size"),
    ({"kind_flags": 0x0E}, UnsupportedFormatError, "SEALED flag on a DELTA frame"),
    ({"kind_flags": 0x0B}, UnsupportedFormatError, "SEALED flag on a PATCH frame"),
    ({"kind_flags": 0x1E}, UnsupportedFormatError, "unknown flags 0x10 at offset 3"),
]
FIELD_CASES = [(1, "full", *c) for c in V1_FULL_CASES] + [(1, "delta", *c) for c in V1_DELTA_CASES]
FIELD_CASES += [(2, "full", *c) for c in V2_FULL_CASES] + [(2, "delta", *c) for c in V2_DELTA_CASES]


@pytest.mark.parametrize(("fmt", "which", "changes", "error", "message"), FIELD_CASES, ids=lambda x: str(x))
def test_header_fields_are_checked(fmt: int, which: str, changes, error, message) -> None:
    full, delta = frames(fmt)
    damaged = with_fields(full if which == "full" else delta, **changes)
    with pytest.raises(error, match=message):
        parse(damaged)
    # decode() refuses exactly what parse() refuses, with the same precise error.
    chain = [damaged] if which == "full" else [full, damaged]
    with pytest.raises(error, match=message):
        decode(chain)
    with pytest.raises(error, match=message):
        list(iter_versions(chain))


@pytest.mark.parametrize("name", V2_VARINTS)
def test_non_minimal_varints_are_refused(name: str) -> None:
    _, delta = frames(2)
    fields = v2_fields(delta)
    at = fields["varint_end"] - sum(len(varint(fields[n])) for n in V2_VARINTS[V2_VARINTS.index(name) :])
    padded = with_fields(delta, widths={name: len(varint(fields[name])) + 1})
    with pytest.raises(UnsupportedFormatError, match=f"varint {name} at offset {at} is not minimally encoded"):
        parse(padded)
    with pytest.raises(UnsupportedFormatError, match="not minimally encoded"):
        decode([frames(2)[0], padded])


def splice_version(frame: bytes, raw: bytes) -> bytes:
    """``frame`` with its version varint's bytes replaced by ``raw`` and frame_check recomputed."""
    fields = v2_fields(frame)
    end = 5 + len(varint(fields["version"]))
    head = frame[:5] + raw + frame[end : fields["varint_end"] + 8]
    return with_fields_raw(head, payload_of(frame))


def with_fields_raw(head: bytes, payload: bytes) -> bytes:
    digest = xxhash.xxh3_64(head)
    digest.update(payload)
    return head + (digest.intdigest() & 0xFFFF_FFFF).to_bytes(4, "little") + payload


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\x81" + b"\x80" * 9 + b"\x00", "varint version at offset 5 is longer than 10 bytes"),
        (b"\xff" * 12, "varint version at offset 5 is longer than 10 bytes"),
        (b"\x80" * 9 + b"\x02", "varint version at offset 5 is over 64 bits"),
        (b"\x81\x00", "varint version at offset 5 is not minimally encoded"),
    ],
)
def test_over_long_varints_are_refused(raw: bytes, message: str) -> None:
    full, _ = frames(2)
    damaged = splice_version(full, raw)
    for run in (lambda: parse(damaged), lambda: decode([damaged]), lambda: list(iter_versions([damaged]))):
        with pytest.raises(UnsupportedFormatError, match=message):
            run()


def test_a_ten_byte_varint_reads() -> None:
    full, _ = frames(2)
    big = with_fields(full, version=2**64 - 1)
    assert len(big) == len(full) + 9
    assert parse(big)[0].version == 2**64 - 1
    assert decode([big]) == SYSTEM.encode() * 3


@pytest.mark.parametrize("fmt", READABLE_FORMATS)
def test_short_frames_are_truncated(fmt: int) -> None:
    full, _ = frames(fmt)
    for keep in range(len(full)):
        with pytest.raises(TruncatedFrameError):
            parse(full[:keep])
    with pytest.raises(TruncatedFrameError, match="frame is 2 bytes; its first 3 bytes say its format"):
        parse(full[:2])


def test_truncation_messages_name_the_place() -> None:
    full, _ = frames(2)
    with pytest.raises(TruncatedFrameError, match="shorter than the 64-byte header of format 1"):
        parse(frames(1)[0][:63])
    with pytest.raises(TruncatedFrameError, match="ends inside varint version"):
        parse(full[:5])
    with pytest.raises(TruncatedFrameError, match=rf"frame of version 1 is {len(full) - 1} bytes; its header says"):
        parse(full[:-1])


@pytest.mark.parametrize("fmt", READABLE_FORMATS)
def test_trailing_bytes_are_refused(fmt: int) -> None:
    full, _ = frames(fmt)
    with pytest.raises(ChecksumError, match="1 trailing bytes"):
        parse(full + b"\x00")


def test_an_unknown_format_byte_is_refused() -> None:
    full, _ = frames(2)
    for byte in (0x00, 0x01, 0x03, 0x51):
        with pytest.raises(UnsupportedFormatError, match=f"format byte {byte:#04x} at offset 2"):
            parse(full[:2] + bytes([byte]) + full[3:])
    with pytest.raises(UnsupportedFormatError, match="bad magic"):
        parse(b"XK" + full[2:])


def test_frame_kind_reads_only_the_first_bytes() -> None:
    for fmt in READABLE_FORMATS:
        full, delta = frames(fmt)
        assert frame_kind(full) is FrameKind.FULL
        assert frame_kind(memoryview(delta)) is FrameKind.DELTA
        assert frame_kind(full[:6]) is FrameKind.FULL  # nothing past the kind is read
    assert frame_kind(with_fields(frames(2)[1], kind_flags=0x07)[:4]) is FrameKind.PATCH
    padded = frames(2)[0][:40]  # buffers of other shapes are read as their bytes
    for view in (memoryview(padded).cast("Q"), memoryview(padded).cast("B", shape=[5, 8]), bytearray(padded)):
        assert frame_kind(view) is FrameKind.FULL
    for short in (b"", b"CK", b"CK\x02", b"CKPF\x01"):
        with pytest.raises(TruncatedFrameError):
            frame_kind(short)
    assert frame_kind(b"CK\x02\x00") is FrameKind.PREFIX  # kind 0 of format 2; format 1 has none
    assert frame_kind(b"CK\x02\x09") is FrameKind.FULL  # sealed (FORMAT.md §13)
    for bad in (
        b"CK\x02\x04",
        b"CK\x02\x08",
        b"CK\x02\x0a",
        b"CK\x02\x0f",
        b"CK\x02\x11",
        b"CKPF\x01\x00",
        b"CKPF\x01\x04",
        b"CKPF\x02\x01",
        b"XYZ\x01\x01\x01",
    ):
        with pytest.raises(UnsupportedFormatError):
            frame_kind(bad)


@pytest.mark.parametrize("fmt", READABLE_FORMATS)
def test_payload_damage_behind_a_valid_checksum_is_caught_by_the_state_check(fmt: int) -> None:
    # A writer bug (not bit rot): the frame checksum is right, the content is not.
    full, _ = frames(fmt)
    h, _ = parse(full)
    forged = with_fields(full, state_xxh3=h.state_xxh3 ^ 1)
    with pytest.raises(ChecksumError, match=r"state of version 1 .* fails its xxh3 check"):
        decode([forged])
    wrong_size = with_fields(full, state_size=h.state_size + 1)
    with pytest.raises(ChecksumError, match="its headers say"):
        decode([wrong_size])


@pytest.mark.parametrize("fmt", READABLE_FORMATS)
def test_garbage_payload_with_valid_checksum_is_a_decode_error(fmt: int) -> None:
    full, _ = frames(fmt)
    garbage = bytes(range(256)) * 2
    forged = with_fields(full, payload=garbage, payload_size=len(garbage))
    with pytest.raises(DecodeError, match="version 1"):
        decode([forged])


def test_parse_refuses_non_bytes() -> None:
    with pytest.raises(TypeError):
        parse("not bytes")  # type: ignore[arg-type]


LINK_CASES = [
    (1, {"base_xxh3": 1}, "expects a base of .* bytes with xxh3 0x0000000000000001"),
    (1, {"base_size": 1}, "expects a base of 1 bytes"),
    (1, {"window_log": 20}, "continues a stream with window_log 20"),
    (1, {"version": 3, "base_version": 2}, "delta against version 2, but follows version 1"),
    (2, {"base_size": 1}, "expects a base of 1 bytes; version 1 is"),
    (2, {"window_log": 20}, "continues a stream with window_log 20"),
    (2, {"version": 3}, "delta against version 2, but follows version 1"),
]


@pytest.mark.parametrize(("fmt", "changes", "message"), LINK_CASES, ids=lambda x: str(x))
def test_links_are_checked(fmt: int, changes, message) -> None:
    full, delta = frames(fmt)
    chain = [full, with_fields(delta, **changes)]
    with pytest.raises(ChainLinkError, match=message):
        decode(chain)
    with pytest.raises(ChainLinkError, match=message):
        list(iter_versions(chain))


def test_a_wrong_base_is_caught_by_the_produced_state_in_format_2() -> None:
    # Format 2 has no base_xxh3: a frame applied to another base of the same
    # size fails the xxh3 of the state it produces.
    enc = ChainEncoder(policy=GOLDEN_POLICY)
    a = enc.replace(b"a" * 600).data
    patch = enc.merge(b"\x08\x01").data
    other = ChainEncoder(policy=GOLDEN_POLICY).replace(b"b" * 600).data
    with pytest.raises(ChecksumError, match=r"state of version 2 .* fails its xxh3 check"):
        decode([other, patch])
    with pytest.raises(ChecksumError, match=r"state of version 2 .* fails its xxh3 check"):
        list(iter_versions([other, patch]))
    assert decode([a, patch]) == b"a" * 600 + b"\x08\x01"


@pytest.mark.parametrize("fmt", READABLE_FORMATS)
def test_decode_names_a_damaged_frame_checksum_when_the_state_fails(fmt: int) -> None:
    full, delta = frames(fmt)
    damaged = bytearray(delta)
    damaged[-1] ^= 1  # the payload: the state comes out wrong, and the frame's checksum says why
    with pytest.raises(ChecksumError, match="frame checksum mismatch for version 2"):
        decode([full, bytes(damaged)])


def test_the_tests_format_2_layout_matches_the_codec() -> None:
    full, delta = frames(2)
    for frame in (full, delta):
        assert is_v2(frame)
        fields = v2_fields(frame)
        assert v2_frame(fields, payload_of(frame)) == frame


# A frame whose magic, format byte or version field cannot be read: (format, damage, error, message).
UNREADABLE = [
    *[(fmt, lambda f: b"X" + f[1:], UnsupportedFormatError, "has bad magic b'X") for fmt in READABLE_FORMATS],
    *[
        (fmt, lambda f: f[:2] + b"\x09" + f[3:], UnsupportedFormatError, "has format byte 0x09 at offset 2")
        for fmt in READABLE_FORMATS
    ],
    (1, lambda f: f[:3] + b"X" + f[4:], UnsupportedFormatError, "has bad magic b'CKPX'"),
    *[(fmt, lambda f: f[:2], TruncatedFrameError, "is 2 bytes; its first 3 bytes say") for fmt in READABLE_FORMATS],
    (1, lambda f: f[:4], TruncatedFrameError, "is 4 bytes, shorter than the 64-byte header of format 1"),
    (2, lambda f: f[:4], TruncatedFrameError, "is 4 bytes, shorter than the smallest format 2 header"),
]


@pytest.mark.parametrize(("fmt", "damage", "error", "message"), UNREADABLE)
@pytest.mark.parametrize("position", [0, 1, 4])
def test_a_frame_unreadable_from_its_first_bytes_is_named_by_its_place_in_the_chain(
    fmt: int, damage, error: type[DecodeError], message: str, position: int
) -> None:
    enc = ChainEncoder(policy=GOLDEN_POLICY, format_version=fmt)
    chain = [enc.replace(SYSTEM.encode() * 3).data] + [enc.merge(b"\x08" + bytes([n])).data for n in range(4)]
    chain[position] = damage(chain[position])
    name = "first frame of the chain" if position == 0 else f"frame of version {position + 1}"
    for run in (lambda: decode(chain), lambda: list(iter_versions(chain)), lambda: open_chain(chain)):
        with pytest.raises(error) as info:
            run()
        assert str(info.value).startswith(f"{name} {message}"), str(info.value)
    with pytest.raises(error) as alone:  # one frame alone has no place to name it by
        parse(chain[position])
    assert str(alone.value).startswith(f"frame {message}"), str(alone.value)
