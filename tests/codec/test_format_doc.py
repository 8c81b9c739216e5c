"""codec/FORMAT.md is enough to read frames: a reader written from it alone.

The reader below uses only struct, xxhash and the standard zstd API; it does
not import codec.frame or codec.decoder. It must return exactly the states the
encoder holds, for every version of every chain shape the encoder writes.
"""

from __future__ import annotations

import json
import re
import struct
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import xxhash

from ckpt.codec import READABLE_FORMATS, ChainEncoder, ChainPolicy, EncodedFrame, keyframe, prefix_frame
from tests.codec.layout import with_fields
from tests.golden.cases import SEGMENT_CASE, SEGMENT_FILE

if sys.version_info >= (3, 14):
    from compression.zstd import (
        DecompressionParameter,
        ZstdDecompressor,
        ZstdDict,
        ZstdError,
        get_frame_info,
        get_frame_size,
    )
else:
    from backports.zstd import (
        DecompressionParameter,
        ZstdDecompressor,
        ZstdDict,
        ZstdError,
        get_frame_info,
        get_frame_size,
    )

FORMAT_MD = Path(__file__).parents[2] / "codec" / "FORMAT.md"


# -- the independent reader, from FORMAT.md §2-§6 and §8-§9 ---------------------


class FormatError(Exception):
    pass


FIELDS = struct.Struct("<4sBBBBQQIIIIQQ")  # offsets 0..55
FULL, DELTA, PATCH = 1, 2, 3
PREFIX = 0  # format 2 only (§12)
CONTINUES_STREAM = 0x01
SEALED = 0x08  # format 2's kind_flags bit, kept in place (§13)


@dataclass(frozen=True)
class Header:
    kind: int
    flags: int
    window_log: int
    version: int
    base_version: int
    state_size: int
    base_size: int
    payload_size: int
    prefix_size: int
    state_xxh3: int
    base_xxh3: int | None  # format 1 only
    format: int = 1

    @property
    def continues(self) -> bool:
        return bool(self.flags & CONTINUES_STREAM)

    @property
    def sealed(self) -> bool:
        return bool(self.flags & SEALED)

    @property
    def content_size(self) -> int:
        if self.kind == PREFIX:
            return 0
        return self.state_size - self.base_size if self.kind == PATCH else self.state_size


def read_frame(frame: bytes) -> tuple[Header, bytes]:
    if len(frame) < 3:
        raise FormatError("truncated header")
    if frame[:2] != b"CK" or frame[2] not in (0x50, 0x02):
        raise FormatError("magic or format")
    h, payload = read_v2(frame) if frame[2] == 2 else read_v1(frame)
    if h.kind == PREFIX and h.format == 2:  # §12's table
        if h.flags or not 10 <= h.window_log <= 31 or h.version < 1 or h.base_version <= h.version:
            raise FormatError("PREFIX fields")
        if h.state_size > h.base_size or h.prefix_size or h.payload_size:
            raise FormatError("PREFIX fields")
        return h, payload
    if h.kind not in (FULL, DELTA, PATCH) or h.flags & ~(CONTINUES_STREAM | SEALED):
        raise FormatError("kind or flags")
    if h.sealed and h.kind != FULL:
        raise FormatError("SEALED on a frame that is not FULL")  # §13
    if not 10 <= h.window_log <= 31 or h.version < 1:
        raise FormatError("window_log or version")
    if h.kind == FULL:
        if h.base_version or h.base_size or h.prefix_size or h.base_xxh3 or h.continues:
            raise FormatError("FULL fields")
    else:
        segment = h.kind == PATCH and h.format == 2 and h.base_version < h.version - 1 and not h.continues  # §14
        ok = (segment or h.base_version == h.version - 1) and not (h.continues and h.prefix_size)
        ok = ok and (h.prefix_size == 0 or h.prefix_size >= 8)
        if h.kind == DELTA:
            ok = ok and h.prefix_size in (0, h.base_size)
        else:
            ok = ok and h.state_size >= h.base_size and h.prefix_size <= h.base_size
        if not ok:
            raise FormatError("DELTA/PATCH fields")
    if h.content_size > 32768 * h.payload_size:
        raise FormatError("content size bound")
    return h, payload


def read_v1(frame: bytes) -> tuple[Header, bytes]:
    if len(frame) < 64:
        raise FormatError("truncated header")
    magic, fmt, *fields = FIELDS.unpack_from(frame)
    if magic != b"CKPF" or fmt != 1:
        raise FormatError("magic or format")
    h = Header(*fields)
    if len(frame) != 64 + h.payload_size:
        raise FormatError("frame length")
    (stored,) = struct.unpack_from("<Q", frame, 56)
    if xxhash.xxh3_64_intdigest(frame[:56] + frame[64:]) != stored:
        raise FormatError("frame checksum")
    return h, frame[64:]


def read_varint(frame: bytes, at: int) -> tuple[int, int]:
    value = 0
    for n in range(10):
        if at + n >= len(frame):
            raise FormatError("truncated header")
        byte = frame[at + n]
        value |= (byte & 0x7F) << (7 * n)
        if byte < 0x80:
            if (n and not byte) or value >= 1 << 64:
                raise FormatError("varint")
            return value, at + n + 1
    raise FormatError("varint")


def read_v2(frame: bytes) -> tuple[Header, bytes]:
    if len(frame) < 5:
        raise FormatError("truncated header")
    kind_flags, window_log = frame[3], frame[4]
    at = 5
    values = []
    for _ in range(6):
        value, at = read_varint(frame, at)
        values.append(value)
    version, distance, state_size, base_size, prefix_size, payload_size = values
    if len(frame) != at + 12 + payload_size:
        raise FormatError("frame length")
    state_xxh3, stored = struct.unpack_from("<QI", frame, at)
    if xxhash.xxh3_64_intdigest(frame[: at + 8] + frame[at + 12 :]) & 0xFFFF_FFFF != stored:
        raise FormatError("frame checksum")
    kind = kind_flags & 0x03
    segment = kind == PATCH and distance > 1  # §14
    if segment and (kind_flags & 0x04 or distance >= version):
        raise FormatError("segment")
    if not segment and (distance < 1 if kind == PREFIX else distance != (0 if kind == FULL else 1)):
        raise FormatError("base_distance")
    flags = (CONTINUES_STREAM if kind_flags & 0x04 else 0) | (kind_flags & ~0x07)  # SEALED stays 0x08
    base_version = version + distance if kind == PREFIX else 0 if kind == FULL else version - distance
    h = Header(
        kind, flags, window_log, version, base_version, state_size, base_size, payload_size, prefix_size, state_xxh3,
        None, 2,
    )  # fmt: skip
    return h, frame[at + 12 :]


def check_link(prev: Header | None, h: Header) -> None:
    if h.kind == PREFIX:
        raise FormatError("PREFIX frame in a chain")  # §12: it belongs to no chain
    if prev is None:
        if h.kind != FULL:
            raise FormatError("chain must start FULL")
        return
    if h.kind == FULL:
        raise FormatError("FULL inside a chain")
    if (h.base_version, h.base_size) != (prev.version, prev.state_size):
        raise FormatError("link")
    if h.base_xxh3 is not None and h.base_xxh3 != prev.state_xxh3:  # format 1 only
        raise FormatError("link")
    if h.continues and prev.sealed:
        raise FormatError("continues a sealed stream")  # §13
    if h.continues and h.window_log != prev.window_log:
        raise FormatError("window_log of a continuing frame")


def new_stream(h: Header, base: bytes) -> ZstdDecompressor:
    options: dict[int, int] = {DecompressionParameter.window_log_max: h.window_log}
    if h.prefix_size == 0:
        return ZstdDecompressor(options=options)
    prefix = base[len(base) - h.prefix_size :]
    return ZstdDecompressor(options=options, zstd_dict=ZstdDict(prefix, is_raw=True).as_prefix)


def decompress(dec: ZstdDecompressor, data: bytes, size: int) -> bytes:
    try:
        out = dec.decompress(data, max_length=size + 1)
    except ZstdError as exc:  # a corrupt payload, or a window over window_log
        raise FormatError(f"zstd: {exc}") from None
    if dec.eof:
        raise FormatError("stream ends")  # §4: nothing may end a stream's zstd frame
    if len(out) != size:
        raise FormatError("content size")
    return out


def read_sealed(h: Header, payload: bytes) -> bytes:
    """A sealed FULL frame's state: one whole zstd frame declaring state_size (§13)."""
    if payload[:4] != b"\x28\xb5\x2f\xfd":
        raise FormatError("sealed: not a zstd frame")
    try:
        declared = get_frame_info(payload).decompressed_size
        end = get_frame_size(payload)
    except ZstdError as exc:
        raise FormatError(f"sealed: zstd: {exc}") from None
    if declared != h.state_size:
        raise FormatError("sealed: content size")
    if end != len(payload):
        raise FormatError("sealed: bytes after the zstd frame")
    dec = ZstdDecompressor(options={DecompressionParameter.window_log_max: h.window_log})
    try:
        out = dec.decompress(payload, max_length=h.state_size + 1)
    except ZstdError as exc:
        raise FormatError(f"zstd: {exc}") from None
    if not dec.eof or dec.unused_data or len(out) != h.state_size:
        raise FormatError("sealed: content size")
    return out


def verify(h: Header, state: bytes) -> bytes:
    if len(state) != h.state_size or xxhash.xxh3_64_intdigest(state) != h.state_xxh3:
        raise FormatError("state check")
    return state


def read_versions(frames: Iterable[bytes]) -> Iterator[tuple[int, bytes]]:
    """Every version of one chain, as §6 "Every version" describes."""
    prev: Header | None = None
    state = b""
    dec: ZstdDecompressor | None = None
    for frame in frames:
        h, payload = read_frame(frame)
        check_link(prev, h)
        if h.sealed:
            dec, content = None, read_sealed(h, payload)
        else:
            if not h.continues:
                dec = new_stream(h, state)
            assert dec is not None
            content = decompress(dec, payload, h.content_size)
        state = verify(h, state + content if h.kind == PATCH else content)
        yield h.version, state
        prev = h


def read_prefix(frame: bytes, source_state: bytes, source_version: int) -> bytes:
    """The state of a PREFIX frame, from its source's state (§12's loop, one hop)."""
    h, _ = read_frame(frame)
    if h.kind != PREFIX or h.base_version != source_version or h.base_size != len(source_state):
        raise FormatError("PREFIX source")
    return verify(h, source_state[: h.state_size])


def hydrate(frames: Iterable[bytes]) -> bytes:
    """The latest state of one chain, one zstd call per stream (§6 "Latest state only")."""
    parsed = [read_frame(f) for f in frames]
    prev: Header | None = None
    for h, _ in parsed:
        check_link(prev, h)
        prev = h
    streams: list[list[tuple[Header, bytes]]] = []
    for h, payload in parsed:
        if not h.continues:
            streams.append([])
        streams[-1].append((h, payload))
    state = b""
    for stream in streams:
        if stream[0][0].sealed:  # a sealed FULL frame is a stream of its own (§13)
            state = verify(stream[0][0], read_sealed(*stream[0]))
            continue
        dec = new_stream(stream[0][0], state)
        out = decompress(dec, b"".join(p for _, p in stream), sum(h.content_size for h, _ in stream))
        start, offset = None, 0
        for h, _ in stream:
            if h.kind != PATCH:
                start = offset
            offset += h.content_size
        state = verify(stream[-1][0], state + out if start is None else out[start:])
    return state


def kind_of(frame: bytes) -> int:
    return frame[3] & 0x03 if frame[2] == 2 else frame[5]  # §8


def split_chains(frames: list[bytes]) -> list[list[bytes]]:
    chains: list[list[bytes]] = []
    for frame in frames:
        if kind_of(frame) == FULL:
            chains.append([])
        chains[-1].append(frame)
    return chains


# -- sessions written by the real encoder ------------------------------------------


def agent_state(step: int) -> bytes:
    """A protobuf-like state (field 1, length-delimited) of about 16 KB that grows by a line per step.

    Big enough that the default policy keeps DELTA and PATCH frames rather than
    starting a new chain at every write.
    """
    lines = [f"step {i}: ran pytest on tests/test_mod{i * 7 % 13}.py, {i * 37 % 101} failures" for i in range(250)]
    lines += [f"agent step {i}: edited codec/file{i}.py" for i in range(step)]
    data = "\n".join(lines).encode()
    return b"\x0a" + _varint(len(data)) + data


def tool_patch(step: int) -> bytes:
    data = f"tool output {step}: ".encode() + b"ok " * (step % 7 + 3)
    return b"\x12" + _varint(len(data)) + data


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class Session:
    """Drives a ChainEncoder; records each stored frame and the encoder's state after it."""

    def __init__(self, enc: ChainEncoder) -> None:
        self.enc = enc
        self.frames: list[EncodedFrame] = []
        self.states: dict[int, bytes] = {}

    def store(self, frame: EncodedFrame) -> None:
        assert frame.version == self.enc.version
        self.frames.append(frame)
        self.states[frame.version] = self.enc.state

    def replace(self, state: bytes) -> None:
        self.store(self.enc.replace(state))

    def merge(self, patch: bytes) -> None:
        self.store(self.enc.merge(patch))

    def refused(self, frame: EncodedFrame) -> None:
        """The write of ``frame`` failed: it is not stored, and the encoder forgets it."""
        assert frame.version == self.enc.version
        self.enc.rollback()

    def resume(self, policy: ChainPolicy | None = None, *, format_version: int | None = None) -> None:
        chain = split_chains([f.data for f in self.frames])[-1]
        headers = [f.header for f in self.frames[-len(chain) :]]
        fmt = self.enc.format_version if format_version is None else format_version
        self.enc = ChainEncoder.resume(self.enc.state, headers, policy=policy or self.enc.policy, format_version=fmt)


def mixed(fmt: int) -> Session:
    s = Session(ChainEncoder(format_version=fmt))
    s.replace(agent_state(1))
    s.replace(agent_state(2))
    s.merge(tool_patch(3))
    s.merge(tool_patch(4))
    s.replace(s.enc.state + agent_state(5)[-40:])
    s.merge(tool_patch(6))
    return s


def patch_stream_after_rollback(fmt: int) -> Session:
    s = Session(ChainEncoder(format_version=fmt))
    s.replace(agent_state(3))
    s.merge(tool_patch(4))
    s.refused(s.enc.merge(tool_patch(99)))  # drops the live stream
    s.merge(tool_patch(5))  # a PATCH starting a stream on a prefix
    s.merge(tool_patch(6))
    s.refused(s.enc.replace(agent_state(98)))
    s.replace(s.enc.state + b"\x08\x07")  # a DELTA starting a stream on the whole base
    s.merge(tool_patch(8))
    return s


def patch_stream_after_resume(fmt: int) -> Session:
    s = Session(ChainEncoder(format_version=fmt))
    s.replace(agent_state(2))
    s.merge(tool_patch(3))
    s.resume()
    s.merge(tool_patch(4))  # starts a new stream: the old one is gone
    s.merge(b"")  # empty content, continuing
    s.merge(tool_patch(5))
    s.resume(ChainPolicy(patch_window_bytes=0))
    s.merge(b"")  # a stream starting with an empty payload and no prefix
    s.merge(tool_patch(6))  # carries the zstd frame header
    s.resume(ChainPolicy(patch_window_bytes=4096))
    s.merge(tool_patch(7))  # a PATCH starting a stream on the last 4096 bytes of its base
    s.merge(tool_patch(8))
    return s


def tiny_states(fmt: int) -> Session:
    """States under 8 bytes: no prefix at all."""
    s = Session(ChainEncoder(policy=ChainPolicy(frame_cost_bytes=0), format_version=fmt))
    s.replace(b"\x08\x01")
    s.merge(b"\x10\x02")
    s.refused(s.enc.merge(b"\x18\x03"))
    s.merge(b"\x18\x04")
    s.refused(s.enc.replace(b"\x08\x09"))
    s.replace(b"\x0a\x20" + b"abcd" * 8)  # a DELTA starting a stream on a 6-byte base: no prefix
    return s


def restarting(fmt: int) -> Session:
    """Long enough that max_depth=3 starts new chains with FULL frames."""
    s = Session(ChainEncoder(policy=ChainPolicy(max_depth=3), format_version=fmt))
    for step in range(1, 15):
        if step % 3 == 0:
            s.replace(agent_state(step))
        else:
            s.merge(tool_patch(step))
    return s


def upgraded(fmt: int) -> Session:
    """A chain written in format 1 and continued in format 2, as a store written by an older build is."""
    assert fmt == 1
    s = patch_stream_after_rollback(1)
    s.resume(format_version=2)
    s.merge(tool_patch(9))  # a PATCH of format 2 on a prefix of a format 1 chain's state
    s.merge(tool_patch(10))
    s.replace(s.enc.state + b"\x08\x0b")
    return s


def keyframed(fmt: int) -> Session:
    """A head rewritten as a keyframe (sealed in format 2), then written on by an encoder resumed on it."""
    s = mixed(fmt)
    s.frames[-1] = keyframe(s.enc.state, version=s.enc.version, format_version=fmt)
    s.resume()
    s.merge(tool_patch(7))  # a PATCH starting a stream on the keyframe's state
    s.merge(tool_patch(8))
    s.replace(s.enc.state + b"\x08\x09")
    s.frames.append(keyframe(s.enc.state + b"\x08\x0a", version=s.enc.version + 1, format_version=fmt))
    s.states[s.enc.version + 1] = s.enc.state + b"\x08\x0a"  # a keyframe written as a new chain
    return s


SESSIONS = [mixed, patch_stream_after_rollback, patch_stream_after_resume, tiny_states, restarting, keyframed]
CASES = [(make, fmt) for make in SESSIONS for fmt in READABLE_FORMATS] + [(upgraded, 1)]


@pytest.mark.parametrize(("make", "fmt"), CASES, ids=lambda x: getattr(x, "__name__", str(x)))
def test_independent_reader_returns_the_encoders_states(make: Callable[[int], Session], fmt: int) -> None:
    s = make(fmt)
    assert {f.header.format for f in s.frames} == ({1, 2} if make is upgraded else {fmt})
    for f in s.frames:  # the reader sees the header the encoder wrote
        h, payload = read_frame(f.data)
        e = f.header
        assert (h.kind, h.continues, h.sealed, h.window_log, h.version, h.base_version, h.format) == (
            e.kind,
            e.continues_stream,
            e.sealed,
            e.window_log,
            e.version,
            e.base_version,
            e.format,
        )
        assert (h.state_size, h.base_size, h.prefix_size, h.state_xxh3, h.base_xxh3) == (
            e.state_size,
            e.base_size,
            e.prefix_size,
            e.state_xxh3,
            e.base_xxh3 if e.format == 1 else None,
        )
        assert len(payload) == h.payload_size == e.payload_size
    got: dict[int, bytes] = {}
    for chain in split_chains([f.data for f in s.frames]):
        got.update(read_versions(chain))
        assert hydrate(chain) == got[max(got)]
        for n in range(1, len(chain)):  # the latest state of every prefix of the chain
            assert hydrate(chain[:n]) == got[read_frame(chain[n - 1])[0].version]
    assert got == s.states
    assert sorted(got) == list(range(1, len(s.frames) + 1))


@pytest.mark.parametrize("fmt", READABLE_FORMATS)
def test_sessions_cover_every_frame_shape(fmt: int) -> None:
    shapes: set[tuple[object, ...]] = set()
    for make in SESSIONS:
        for f in make(fmt).frames:
            h = f.header
            shapes.add((h.kind.name, h.continues_stream, h.prefix_size > 0 and h.prefix_size == h.base_size))
            if h.kind.name == "PATCH" and not h.continues_stream:
                shapes.add(("PATCH new stream", h.prefix_size > 0, h.payload_size > 0))
                if 0 < h.prefix_size < h.base_size:
                    shapes.add(("PATCH new stream", "prefix = tail of base"))
    assert {
        ("FULL", False, False),
        ("DELTA", True, False),
        ("DELTA", False, True),  # new stream, prefix = whole base
        ("DELTA", False, False),  # new stream, base under 8 bytes: no prefix
        ("PATCH", True, False),
        ("PATCH new stream", True, True),
        ("PATCH new stream", False, False),  # empty payload, no prefix
        ("PATCH new stream", "prefix = tail of base"),
    } <= shapes
    assert sum(f.header.kind.name == "FULL" for f in restarting(fmt).frames) >= 3


def expected_failure(frame: bytes, pos: int) -> str:
    """What the reader says of ``frame`` with bit 6 of byte ``pos`` flipped (bit 7 of a varint byte, its
    continuation bit, stays: the header keeps its shape)."""
    if frame[2] == 2:
        if pos < 3:
            return "magic or format"
        at = 5
        for i in range(6):  # varints: version ... payload_size
            start = at
            while frame[at] & 0x80:
                at += 1
            at += 1
            if start <= pos < at:
                if pos == at - 1 and at - start > 1 and frame[pos] ^ 0x40 == 0:
                    return "varint"  # the last byte of a multi-byte varint became 00
                return "frame length" if i == 5 else "frame checksum"
        return "frame checksum"
    if pos < 5:
        return "magic or format"  # checked before the checksum
    if 32 <= pos < 36:
        return "frame length"  # payload_size no longer matches the frame's length
    return "frame checksum"


@pytest.mark.parametrize("fmt", READABLE_FORMATS)
def test_independent_reader_checks_the_frame_checksum(fmt: int) -> None:
    frames = split_chains([f.data for f in mixed(fmt).frames])[0]
    assert len(frames) >= 4
    assert len(list(read_versions(frames))) == len(frames)
    for i, frame in enumerate(frames):
        for pos in range(len(frame)):
            bad = bytearray(frame)
            bad[pos] ^= 0x40
            damaged = [*frames[:i], bytes(bad), *frames[i + 1 :]]
            with pytest.raises(FormatError, match=expected_failure(frame, pos)):
                list(read_versions(damaged))


def test_worked_examples_match_the_encoder() -> None:
    blocks = re.findall(r"```\n([0-9a-f]+)\n```", FORMAT_MD.read_text())
    state = b"hello " * 1000
    expected = []
    for fmt in READABLE_FORMATS:  # §7, then §11
        enc = ChainEncoder(format_version=fmt)
        expected += [enc.replace(state).data.hex(), enc.merge(b"\x08\x01").data.hex()]
    # §12: version 1 of §11 as a PREFIX frame of version 2.
    expected.append(prefix_frame(state + b"\x08\x01", version=1, source_version=2, state_size=6000).data.hex())
    # §13: version 2 of §11 rewritten as a keyframe, sealed.
    expected.append(keyframe(state + b"\x08\x01", version=2).data.hex())
    assert blocks == expected
    for fmt, pair in zip(READABLE_FORMATS, (blocks[:2], blocks[2:4]), strict=True):
        frames = [bytes.fromhex(b) for b in pair]
        assert [read_frame(f)[0].format for f in frames] == [fmt, fmt]
        assert list(read_versions(frames)) == [(1, state), (2, state + b"\x08\x01")]


def test_independent_reader_reads_the_prefix_example_from_its_source() -> None:
    frame = bytes.fromhex(re.findall(r"```\n([0-9a-f]+)\n```", FORMAT_MD.read_text())[4])
    v1_state, v2_state = (state for _, state in read_versions(FORMAT_V2_CHAIN))
    assert read_prefix(frame, v2_state, 2) == v1_state
    with pytest.raises(FormatError, match="PREFIX source"):
        read_prefix(frame, v2_state, 3)
    with pytest.raises(FormatError, match="state check"):
        read_prefix(frame, b"J" + v2_state[1:], 2)
    with pytest.raises(FormatError, match="PREFIX frame in a chain"):
        list(read_versions([*FORMAT_V2_CHAIN, frame]))


FORMAT_V2_CHAIN = [bytes.fromhex(b) for b in re.findall(r"```\n([0-9a-f]+)\n```", FORMAT_MD.read_text())[2:4]]


SEALED_EXAMPLE = bytes.fromhex(re.findall(r"```\n([0-9a-f]+)\n```", FORMAT_MD.read_text())[5])


def test_independent_reader_reads_the_sealed_example_and_a_stream_started_after_it() -> None:
    v2_state = list(read_versions(FORMAT_V2_CHAIN))[1][1]
    assert read_frame(SEALED_EXAMPLE)[0].sealed
    assert list(read_versions([SEALED_EXAMPLE])) == [(2, v2_state)] and hydrate([SEALED_EXAMPLE]) == v2_state
    enc = ChainEncoder.resume(v2_state, [keyframe(v2_state, version=2).header])
    after = [enc.merge(b"\x10\x03").data, enc.merge(b"\x10\x04").data]
    assert list(read_versions([SEALED_EXAMPLE, *after]))[-1] == (4, v2_state + b"\x10\x03\x10\x04")
    assert hydrate([SEALED_EXAMPLE, *after]) == v2_state + b"\x10\x03\x10\x04"
    no_prefix = ChainEncoder.resume(
        v2_state, [keyframe(v2_state, version=2).header], policy=ChainPolicy(patch_window_bytes=0)
    )
    continuing = with_fields(no_prefix.merge(b"\x10\x03").data, kind_flags=0x07)  # PATCH, CONTINUES_STREAM
    for read in (
        lambda: list(read_versions([SEALED_EXAMPLE, continuing])),
        lambda: hydrate([SEALED_EXAMPLE, continuing]),
    ):
        with pytest.raises(FormatError, match="continues a sealed stream"):
            read()


def test_independent_reader_reads_segment_chains_through_their_bases() -> None:
    """§14: the golden segment vectors, each version read through the frames its bases name."""
    vectors = json.loads(SEGMENT_FILE.read_text())[SEGMENT_CASE.name]
    frames = {read_frame(bytes.fromhex(v["frame"]))[0].version: bytes.fromhex(v["frame"]) for v in vectors}
    for version, v in enumerate(vectors, 1):
        chain, at = [], version
        while True:
            h, _ = read_frame(frames[at])
            chain.append(frames[at])
            if h.kind == FULL:
                break
            at = h.base_version
        assert hydrate(chain[::-1]) == bytes.fromhex(v["state"])
    assert any(read_frame(f)[0].base_version < n - 1 for n, f in frames.items() if n > 1)
