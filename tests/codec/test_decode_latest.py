"""decode(): a first pass that checks headers, links and the result's xxh3, and the frame-by-frame
pass that names what failed; chains that mix formats 1 and 2."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

import ckpt.codec.decoder
from ckpt.codec import (
    READABLE_FORMATS,
    ChainEncoder,
    ChainLinkError,
    ChainPolicy,
    ChecksumError,
    DecodeError,
    FrameKind,
    TruncatedFrameError,
    decode,
    decode_latest,
    iter_versions,
    parse,
)
from tests.codec.layout import V2_VARINTS, is_v2, v2_fields, varint, with_fields
from tests.golden.cases import GOLDEN_FILES, GOLDEN_POLICY, SYSTEM

LONG = ChainPolicy(max_depth=64, max_decode_cost_ratio=1e9, frame_cost_bytes=0)


def golden_chains(fmt: int) -> Iterator[tuple[list[bytes], list[bytes]]]:
    for vectors in json.loads(GOLDEN_FILES[fmt].read_text()).values():
        frames = [bytes.fromhex(v["frame"]) for v in vectors]
        states = [bytes.fromhex(v["state"]) for v in vectors]
        start = 0
        for i, frame in enumerate(frames):
            if parse(frame)[0].kind is FrameKind.FULL:
                start = i
            yield frames[start : i + 1], states[start : i + 1]


@pytest.fixture
def first_pass_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if decode() falls back to its frame-by-frame pass."""

    def refuse(chain: object, limit: object) -> bytes:
        raise AssertionError("decode() fell back to the frame-by-frame pass on a sound chain")

    monkeypatch.setattr(ckpt.codec.decoder, "_latest_checked", refuse)


def mixed_chain(first: int, then: int) -> tuple[list[bytes], list[bytes]]:
    """A chain written in format ``first``, resumed (as an upgraded store does) and continued in ``then``."""
    enc = ChainEncoder(policy=LONG, format_version=first)
    frames, states = [], []
    state = SYSTEM.encode() * 2
    for step in range(3):
        state += f"step {step}: ran the tests\n".encode()
        frames.append(enc.replace(state) if step != 1 else enc.merge(b"\x08\x01"))
        states.append(enc.state)
    enc = ChainEncoder.resume(enc.state, [parse(f.data)[0] for f in frames], policy=LONG, format_version=then)
    for step in range(3, 6):
        frames.append(enc.merge(f"\x12\x05step{step}".encode()) if step % 2 else enc.replace(enc.state + b"\x08\x02"))
        states.append(enc.state)
    assert [parse(f.data)[0].format for f in frames] == [first] * 3 + [then] * 3
    assert frames[0].kind is FrameKind.FULL and all(f.kind is not FrameKind.FULL for f in frames[1:])
    return [f.data for f in frames], states


@pytest.mark.parametrize("fmt", READABLE_FORMATS)
def test_sound_chains_decode_in_the_first_pass(fmt: int, first_pass_only: None) -> None:
    for frames, states in golden_chains(fmt):
        assert decode(frames) == states[-1]
        assert decode([memoryview(f) for f in frames]) == states[-1]  # what the store passes


@pytest.mark.parametrize(("first", "then"), [(1, 2), (2, 1)])
def test_a_chain_may_mix_formats(first: int, then: int, first_pass_only: None) -> None:
    frames, states = mixed_chain(first, then)
    for n in range(1, len(frames) + 1):
        assert decode(frames[:n]) == states[n - 1]
    assert [d.state for d in iter_versions(frames)] == states


@pytest.mark.parametrize(("first", "then"), [(1, 2), (2, 1)])
def test_links_across_formats_are_checked(first: int, then: int) -> None:
    frames, _ = mixed_chain(first, then)
    wrong_base = [*frames[:3], with_fields(frames[3], base_size=parse(frames[3])[0].base_size + 1)]
    with pytest.raises(ChainLinkError, match="frame of version 4 expects a base of"):
        decode(wrong_base)
    with pytest.raises(ChainLinkError, match="frame of version 4 expects a base of"):
        list(iter_versions(wrong_base))
    skipped = [*frames[:2], *frames[3:]]
    with pytest.raises(ChainLinkError, match="frame of version 4 is a delta against version 3, but follows version 2"):
        decode(skipped)


def test_a_format_1_frame_after_format_2_still_checks_its_base_xxh3() -> None:
    frames, _ = mixed_chain(2, 1)
    forged = [*frames[:3], with_fields(frames[3], base_xxh3=12345)]
    with pytest.raises(ChainLinkError, match="with xxh3 0x0000000000003039"):
        decode(forged)


def test_a_failed_first_pass_names_the_damaged_frame() -> None:
    frames, _ = mixed_chain(2, 2)
    damaged = bytearray(frames[2])
    damaged[-1] ^= 0x01  # a payload byte: zstd or the result's xxh3 fails, and frame 3's checksum says why
    with pytest.raises(ChecksumError, match="frame checksum mismatch for version 3"):
        decode([*frames[:2], bytes(damaged), *frames[3:]])


def v2_chain() -> tuple[list[bytes], bytes]:
    """A format 2 chain of three streams: FULL + continuing PATCH/DELTA, a PATCH on a prefix, a DELTA on its base."""
    enc = ChainEncoder(policy=GOLDEN_POLICY)
    frames = [enc.replace(SYSTEM.encode() * 2).data, enc.merge(b"\x08\x01").data]
    frames.append(enc.replace(enc.state + b"\x10\x02").data)
    enc = ChainEncoder.resume(enc.state, [parse(f)[0] for f in frames], policy=GOLDEN_POLICY)
    frames += [enc.merge(b"\x18\x03").data, enc.merge(b"\x20\x04").data]
    enc = ChainEncoder.resume(enc.state, [parse(f)[0] for f in frames], policy=GOLDEN_POLICY)
    frames.append(enc.replace(enc.state + b"\x28\x05").data)
    headers = [parse(f)[0] for f in frames]
    assert [(h.kind.name, h.continues_stream) for h in headers] == [
        ("FULL", False),
        ("PATCH", True),
        ("DELTA", True),
        ("PATCH", False),
        ("PATCH", True),
        ("DELTA", False),
    ]
    assert decode(frames) == enc.state
    return frames, enc.state


def header_bytes_read(frames: list[bytes]) -> set[tuple[int, int]]:
    """(frame, byte) places of the header bytes whose damage decode() always sees: all but each frame_check,
    the state_xxh3 of frames before the last (the last one's checks the result), and of a stream's first
    frame the window_log and prefix_size (a larger window, or a prefix its content does not reach into,
    decodes the same)."""
    places = set()
    for i, frame in enumerate(frames):
        fields = v2_fields(frame)
        end = fields["varint_end"]
        places |= {(i, b) for b in range(end + (8 if i == len(frames) - 1 else 0))}
        if not frame[3] & 0x04:
            prefix_at = 5 + sum(len(varint(fields[n])) for n in V2_VARINTS[:4])
            places -= {(i, 4)} | {(i, b) for b in range(prefix_at, prefix_at + len(varint(fields["prefix_size"])))}
    return places


def test_every_single_bit_flip_is_caught_or_changes_nothing() -> None:
    frames, latest = v2_chain()
    always_caught = header_bytes_read(frames)
    unchanged = 0
    for i, frame in enumerate(frames):
        assert is_v2(frame)
        for bit in range(len(frame) * 8):
            damaged = bytearray(frame)
            damaged[bit // 8] ^= 1 << (bit % 8)
            chain = [*frames[:i], bytes(damaged), *frames[i + 1 :]]
            with pytest.raises(DecodeError):
                parse(damaged)
            with pytest.raises(DecodeError):
                list(iter_versions(chain))
            try:
                got = decode(chain)
            except DecodeError:
                continue
            # Damage decode() does not see (a frame_check bit, an equivalent
            # zstd encoding) leaves the latest state as it was.
            assert got == latest, (i, bit)
            assert (i, bit // 8) not in always_caught, (i, bit)
            unchanged += 1
    assert 0 < unchanged < sum(len(f) for f in frames) * 8 // 4


def test_every_truncation_is_caught() -> None:
    frames, _ = v2_chain()
    for i, frame in enumerate(frames):
        for keep in range(len(frame)):
            chain = [*frames[:i], frame[:keep], *frames[i + 1 :]]
            with pytest.raises(TruncatedFrameError):
                decode(chain)
            with pytest.raises(TruncatedFrameError):
                list(iter_versions(chain))


def test_decode_refuses_an_empty_chain() -> None:
    with pytest.raises(ValueError, match="at least one frame"):
        decode([])
    with pytest.raises(ValueError, match="at least one frame"):
        decode(iter([]))


def test_decode_reads_a_chain_given_as_an_iterator_once(first_pass_only: None) -> None:
    frames, latest = v2_chain()
    assert decode(iter(frames)) == latest
    assert decode(f for f in frames) == latest


@pytest.mark.parametrize("fmt", sorted(READABLE_FORMATS))
def test_decode_latest_reports_the_last_frames_header_as_parse_reads_it(fmt: int, first_pass_only: None) -> None:
    for frames, states in golden_chains(fmt):
        got = decode_latest(frames)
        assert got.state == states[-1]
        assert got.header == parse(frames[-1])[0]


@pytest.mark.parametrize(("first", "then"), [(1, 2), (2, 1)])
def test_decode_latest_reports_the_header_of_a_mixed_chains_last_frame(first: int, then: int) -> None:
    frames, states = mixed_chain(first, then)
    for end in range(1, len(frames) + 1):
        start = max(i for i in range(end) if parse(frames[i])[0].kind is FrameKind.FULL)
        got = decode_latest(frames[start:end])
        assert (got.state, got.header) == (states[end - 1], parse(frames[end - 1])[0])


def test_decode_latest_reports_the_header_from_the_checked_pass_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ckpt.codec.decoder, "_latest", lambda chain, limit: None)  # as if the first pass failed
    for frames, states in golden_chains(2):
        got = decode_latest(frames)
        assert (got.state, got.header) == (states[-1], parse(frames[-1])[0])
