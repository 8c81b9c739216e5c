"""PREFIX frames (FORMAT.md §12): a version whose state is the first bytes of a newer version's state.

Written by prefix_frame, read by prefix_state from the source's state; every chain reader refuses one,
naming the version and its source."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt.codec import (
    ChainEncoder,
    ChainLinkError,
    ChecksumError,
    DecodeError,
    FrameHeader,
    FrameKind,
    PrefixFrameError,
    TruncatedFrameError,
    UnsupportedFormatError,
    decode,
    decode_latest,
    frame_kind,
    iter_versions,
    open_chain,
    pack,
    parse,
    prefix_frame,
    prefix_state,
    state_checksum,
)
from ckpt.codec.decoder import scanned_frame_header
from tests.codec.layout import with_fields

# The golden PREFIX frame: version 1 of FORMAT.md §11 ("hello " * 1000) as the first 6000 bytes of
# version 2's state ("hello " * 1000 + 08 01). FORMAT.md §12 explains it byte by byte.
SOURCE = b"hello " * 1000 + b"\x08\x01"
GOLDEN = bytes.fromhex("434b02000a0101f02ef22e000073f8f55f9eab33f4017423b3")
GOLDEN_HEADER = FrameHeader(
    kind=FrameKind.PREFIX,
    version=1,
    base_version=2,
    state_size=6000,
    base_size=6002,
    payload_size=0,
    prefix_size=0,
    state_xxh3=0xF433AB9E5FF5F873,
    base_xxh3=0,
    window_log=10,
    continues_stream=False,
    format=2,
)
NAMED = "version 1 is a PREFIX frame: its state is the first 6000 bytes of version 2's state"


def test_prefix_frame_writes_the_golden_bytes() -> None:
    frame = prefix_frame(SOURCE, version=1, source_version=2, state_size=6000)
    assert frame.data == GOLDEN
    assert frame.header == GOLDEN_HEADER
    assert (frame.kind, frame.version, frame.stored_bytes) == (FrameKind.PREFIX, 1, 25)
    assert pack(GOLDEN_HEADER, b"") == GOLDEN


def test_golden_prefix_frame_parses_to_its_header() -> None:
    header, payload = parse(GOLDEN)
    assert header == GOLDEN_HEADER
    assert bytes(payload) == b""
    assert (header.content_size, header.header_size, header.frame_size) == (0, 25, 25)
    assert frame_kind(GOLDEN) is FrameKind.PREFIX
    assert frame_kind(memoryview(bytearray(GOLDEN))) is FrameKind.PREFIX
    # The kind a store may keep by value is the proto enum's FRAME_KIND_PREFIX.
    assert FrameKind.PREFIX.value == 4 and FrameKind(4) is FrameKind.PREFIX


def test_prefix_state_of_the_golden_frame_is_the_first_bytes_of_its_source() -> None:
    got = prefix_state(GOLDEN, SOURCE, source_version=2)
    assert got.state == b"hello " * 1000
    assert type(got.state) is bytes
    assert got.version == 1 and got.header == GOLDEN_HEADER
    assert prefix_state(memoryview(GOLDEN), bytearray(SOURCE), source_version=2).state == got.state


def test_every_version_of_an_appending_run_reads_back_from_the_head_state() -> None:
    enc = ChainEncoder()
    written = [enc.replace(b"system prompt " * 50)]
    written += [enc.merge(b"\x0a\x05step" + bytes([i])) for i in range(6)]
    head, head_version = enc.state, enc.version
    states = [d.state for d in iter_versions([f.data for f in written])]
    for old, state in zip(written[:-1], states, strict=False):
        new = prefix_frame(head, version=old.version, source_version=head_version, state_size=old.header.state_size)
        # The comparison a store makes before rewriting: the same state_xxh3 proves the prefix.
        assert new.header.state_xxh3 == old.header.state_xxh3
        assert prefix_state(new.data, head, source_version=head_version).state == state


def test_an_empty_prefix_is_a_valid_state() -> None:
    frame = prefix_frame(SOURCE, version=5, source_version=9, state_size=0)
    assert prefix_state(frame.data, SOURCE, source_version=9).state == b""
    assert parse(frame.data)[0].base_version == 9


def test_prefix_state_refuses_a_frame_of_another_kind() -> None:
    full = ChainEncoder().replace(b"hello " * 1000).data
    with pytest.raises(DecodeError, match="version 1 is a FULL frame, not a PREFIX frame"):
        prefix_state(full, SOURCE, source_version=2)


def test_prefix_state_refuses_another_source_version() -> None:
    with pytest.raises(ChainLinkError, match="takes its state from version 2, not from version 3"):
        prefix_state(GOLDEN, SOURCE, source_version=3)


@pytest.mark.parametrize("source", [SOURCE[:-1], SOURCE + b"\x00", b""])
def test_prefix_state_refuses_a_source_state_of_another_size(source: bytes) -> None:
    with pytest.raises(ChainLinkError, match=f"state to be 6002 bytes; the state given is {len(source)} bytes"):
        prefix_state(GOLDEN, source, source_version=2)


def test_prefix_state_refuses_a_prefix_whose_xxh3_differs() -> None:
    other = b"jello " + SOURCE[6:]  # the right size, another prefix
    with pytest.raises(ChecksumError, match=r"state of version 1 .*fails its xxh3 check: computed"):
        prefix_state(GOLDEN, other, source_version=2)
    # A frame whose recorded xxh3 is wrong (its frame_check right): the same refusal.
    forged = pack(GOLDEN_HEADER._replace(state_xxh3=GOLDEN_HEADER.state_xxh3 ^ 1), b"")
    with pytest.raises(ChecksumError, match="state of version 1"):
        prefix_state(forged, SOURCE, source_version=2)


def test_every_bit_flip_of_the_golden_frame_is_refused() -> None:
    for bit in range(len(GOLDEN) * 8):
        damaged = bytearray(GOLDEN)
        damaged[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(DecodeError):
            prefix_state(bytes(damaged), SOURCE, source_version=2)


def test_a_truncated_or_extended_golden_frame_is_refused() -> None:
    for cut in range(len(GOLDEN)):
        with pytest.raises(TruncatedFrameError):
            prefix_state(GOLDEN[:cut], SOURCE, source_version=2)
    with pytest.raises(ChecksumError, match="1 trailing bytes"):
        prefix_state(GOLDEN + b"\x00", SOURCE, source_version=2)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"kind_flags": 0x04}, "PREFIX frame has no payload, stream or zstd prefix"),
        ({"base_distance": 0}, "base_distance 0 of a PREFIX frame"),
        ({"state_size": 6003}, "state_size 6003 > base_size 6002"),
        ({"prefix_size": 8}, "prefix_size 8: a PREFIX frame has no payload"),
        ({"payload_size": 1, "payload": b"\x00"}, "payload_size 1: a PREFIX frame has no payload"),
        ({"window_log": 9}, "window_log 9 outside 10..31"),
        ({"version": 0}, "version 0"),
        ({"base_distance": 2**64 - 1}, "source version 18446744073709551616 of a PREFIX frame is over 64 bits"),
    ],
)
def test_a_prefix_header_breaking_a_field_rule_is_refused(changes: dict[str, int | bytes], message: str) -> None:
    # frame_check recomputed: the field rules must catch it
    forged = with_fields(GOLDEN, **changes)  # type: ignore[arg-type]
    with pytest.raises(UnsupportedFormatError, match=message):
        parse(forged)
    with pytest.raises(UnsupportedFormatError, match=message):
        prefix_state(forged, SOURCE, source_version=2)


def test_readers_take_any_window_log_a_header_may_hold() -> None:
    wide = with_fields(GOLDEN, window_log=31)
    assert parse(wide)[0].window_log == 31
    assert prefix_state(wide, SOURCE, source_version=2).state == SOURCE[:6000]


def test_a_farther_source_is_held_in_base_distance() -> None:
    frame = prefix_frame(SOURCE, version=3, source_version=300, state_size=10)
    header, _ = parse(frame.data)
    assert (header.version, header.base_version) == (3, 300)
    assert frame.data[5:8] == bytes([3, 0xA9, 0x02])  # version 3, base_distance 297
    assert scanned_frame_header(frame.data) == header


def test_format_1_has_no_prefix_kind() -> None:
    with pytest.raises(ValueError, match="format 1 has no PREFIX kind"):
        pack(GOLDEN_HEADER, b"", format_version=1)
    with pytest.raises(ValueError, match="format 1 has no PREFIX kind"):
        pack(GOLDEN_HEADER._replace(format=1), b"")


def _chain() -> list[bytes]:
    enc = ChainEncoder()
    return [enc.replace(b"hello " * 1000).data, enc.merge(b"\x08\x01").data]


@pytest.mark.parametrize(
    "frames",
    [[GOLDEN], [_chain()[0], GOLDEN], [*_chain(), GOLDEN], [GOLDEN, _chain()[1]]],
    ids=["alone", "after-full", "after-patch", "first"],
)
def test_chain_readers_refuse_a_prefix_frame_naming_its_source(frames: list[bytes]) -> None:
    for read in (decode, decode_latest, open_chain, lambda fs: list(iter_versions(fs))):
        with pytest.raises(PrefixFrameError, match=NAMED) as caught:
            read(frames)
        assert (caught.value.version, caught.value.source_version, caught.value.state_size) == (1, 2, 6000)
        assert isinstance(caught.value, ChainLinkError)


def test_iter_versions_yields_the_versions_before_a_prefix_frame() -> None:
    chain = _chain()
    got = iter_versions([*chain, GOLDEN])
    assert next(got).version == 1 and next(got).version == 2
    with pytest.raises(PrefixFrameError, match=NAMED):
        next(got)


def test_a_chain_reader_does_not_advance_onto_a_prefix_frame() -> None:
    chain = _chain()
    _, reader = open_chain(chain[:1])
    assert reader is not None
    assert reader.advance([prefix_frame(SOURCE, version=2, source_version=3, state_size=6000).data]) is None
    assert reader.spent


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"version": 0}, ValueError, "version must be in 1..18446744073709551615, got 0"),
        ({"version": 2}, ValueError, "source_version must be newer than version 2 .*got 2"),
        ({"source_version": 1}, ValueError, "source_version must be newer than version 1 .*got 1"),
        ({"source_version": 2**64}, ValueError, "source_version must be newer .*got 18446744073709551616"),
        ({"state_size": -1}, ValueError, r"state_size must be in 0..6002 \(the source state's size\), got -1"),
        ({"state_size": 6003}, ValueError, "state_size must be in 0..6002 .*got 6003"),
        ({"version": 1.0}, TypeError, "version must be an int, not float"),
        ({"source_version": True}, TypeError, "source_version must be an int, not bool"),
        ({"state_size": "1"}, TypeError, "state_size must be an int, not str"),
        ({"source_state": "hello"}, TypeError, "source_state must be bytes, bytearray or memoryview, not str"),
    ],
)
def test_prefix_frame_refuses_bad_arguments_naming_them(kwargs: dict[str, object], error: type, message: str) -> None:
    args: dict[str, object] = {"source_state": SOURCE, "version": 1, "source_version": 2, "state_size": 6000}
    args.update(kwargs)
    source = args.pop("source_state")
    with pytest.raises(error, match=message):
        prefix_frame(source, **args)  # type: ignore[arg-type]


def test_prefix_state_refuses_bad_arguments() -> None:
    with pytest.raises(TypeError, match="source_version must be an int, not str"):
        prefix_state(GOLDEN, SOURCE, source_version="2")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="source_state must be bytes"):
        prefix_state(GOLDEN, None, source_version=2)  # type: ignore[arg-type]


@settings(max_examples=200)
@given(
    source=st.binary(max_size=600),
    data=st.data(),
    version=st.integers(1, 2**64 - 2),
)
def test_prefix_frames_round_trip_and_detect_damage(source: bytes, data: st.DataObject, version: int) -> None:
    size = data.draw(st.integers(0, len(source)), label="state_size")
    source_version = data.draw(st.integers(version + 1, 2**64 - 1), label="source_version")
    frame = prefix_frame(source, version=version, source_version=source_version, state_size=size)
    header, _ = parse(frame.data)
    assert header == frame.header and pack(header, b"") == frame.data
    assert header.state_xxh3 == state_checksum(source[:size])
    assert prefix_state(frame.data, source, source_version=source_version).state == source[:size]
    assert frame_kind(frame.data) is FrameKind.PREFIX
    bit = data.draw(st.integers(0, len(frame.data) * 8 - 1), label="bit")
    damaged = bytearray(frame.data)
    damaged[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(DecodeError):
        prefix_state(bytes(damaged), source, source_version=source_version)
    with pytest.raises(PrefixFrameError):
        decode([frame.data])
