"""Hostile input to the codec's decoding side: every input decodes correctly or
raises a CodecError naming what is wrong; never another exception, a hang or
an allocation far beyond what the input declares.

The tables are minimized inputs a fuzzer found (each failed before its fix);
the property test at the end states the contract over mutations of the golden
chains.
"""

from __future__ import annotations

import contextlib
import json
import struct
import sys
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt.codec import (
    READABLE_FORMATS,
    ChainEncoder,
    CodecError,
    DecodeError,
    FrameKind,
    UnsupportedFormatError,
    WireFormatError,
    check_patch,
    compact,
    decode,
    iter_versions,
    open_chain,
    parse,
    state_checksum,
)
from ckpt.v1 import checkpoint_pb2 as pb
from tests.codec.layout import (
    FULL,
    PATCH,
    V1,
    V2_VARINTS,
    is_v2,
    kind_of,
    payload_of,
    v1_field_spans,
    v2_frame,
    with_checksum,
    with_fields,
)
from tests.golden.cases import GOLDEN_FILES

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

DELTA = 2


def forge(
    kind: int,
    payload: bytes,
    *,
    fmt: int = 2,
    version: int = 1,
    state: bytes = b"",
    base: bytes = b"",
    window_log: int = 16,
    continues: bool = False,
    prefix_size: int = 0,
    state_size: int | None = None,
    payload_size: int | None = None,
) -> bytes:
    """A frame with the given fields and a correct frame checksum, so that the
    checks after the checksum (and zstd) see the hostile part."""
    state_size = len(state) if state_size is None else state_size
    payload_size = len(payload) if payload_size is None else payload_size
    if fmt == 2:
        fields = {
            "kind_flags": kind | (4 if continues else 0),
            "window_log": window_log,
            "version": version,
            "base_distance": 0 if kind == FULL else 1,
            "state_size": state_size,
            "base_size": 0 if kind == FULL else len(base),
            "prefix_size": prefix_size,
            "payload_size": payload_size,
            "state_xxh3": state_checksum(state),
        }
        return v2_frame(fields, payload)
    head = V1.pack(
        b"CKPF",
        1,
        kind,
        1 if continues else 0,
        window_log,
        version,
        0 if kind == FULL else version - 1,
        state_size,
        0 if kind == FULL else len(base),
        payload_size,
        prefix_size,
        state_checksum(state),
        0 if kind == FULL else state_checksum(base),
    )
    return with_checksum(head + bytes(8) + payload)


def decoders(frames: Sequence[bytes | memoryview]) -> list[Callable[[], object]]:
    """Every way to decode a chain: latest only, every version, and each header."""
    return [lambda: decode(frames), lambda: list(iter_versions(frames)), lambda: [parse(f) for f in frames]]


STATE = b"hello world, " * 20
PATCH_BYTES = b"\x08\x01"


def ended_stream_then_continuation(fmt: int) -> list[bytes]:
    # Frame 1's payload is a whole zstd frame (Last_Block set, so the stream
    # ends); frame 2 continues that stream. The stdlib decompressor raised
    # EOFError("Already at the end of a Zstandard frame") from iter_versions.
    first = forge(FULL, zstd.compress(STATE), fmt=fmt, state=STATE)
    raw_block = (len(PATCH_BYTES) << 3).to_bytes(3, "little") + PATCH_BYTES  # Last_Block 0, raw
    second = forge(PATCH, raw_block, fmt=fmt, version=2, state=STATE + PATCH_BYTES, base=STATE, continues=True)
    return [first, second]


def skippable_frame_then_continuation(fmt: int) -> list[bytes]:
    # An empty state whose payload is a zstd skippable frame: the decompressor
    # reports the end of a frame, and the continuing frame hit the same EOFError.
    skippable = struct.pack("<II", 0x184D2A50, 3) + b"abc"
    first = forge(FULL, skippable, fmt=fmt, state=b"")
    raw_block = (len(PATCH_BYTES) << 3).to_bytes(3, "little") + PATCH_BYTES
    second = forge(PATCH, raw_block, fmt=fmt, version=2, state=PATCH_BYTES, base=b"", continues=True)
    return [first, second]


# (name, chain, error and message of decode() and of iter_versions(): the frame that ended the stream)
CHAIN_CASES: list[tuple[str, Callable[[int], list[bytes]], type[CodecError], str]] = [
    (
        "ended-stream-then-continuation",
        ended_stream_then_continuation,
        DecodeError,
        r"zstd stream of version 1 ends in its \d+-byte payload; a ckpt stream never ends its zstd frame",
    ),
    (
        "skippable-frame-then-continuation",
        skippable_frame_then_continuation,
        DecodeError,
        "zstd stream of version 1 ends in its 11-byte payload",
    ),
]


@pytest.mark.parametrize("fmt", READABLE_FORMATS)
@pytest.mark.parametrize(("make", "error", "message"), [c[1:] for c in CHAIN_CASES], ids=[c[0] for c in CHAIN_CASES])
def test_hostile_chains_raise_codec_errors(
    make: Callable[[int], list[bytes]], error: type[CodecError], message: str, fmt: int
) -> None:
    frames = make(fmt)
    runs: list[Callable[[], object]] = [*decoders(frames)[:2], lambda: open_chain(frames), lambda: decode(frames[:1])]
    for run in runs:
        with pytest.raises(error, match=message):
            run()
    # Each frame on its own is well-formed: only decoding the stream finds the damage.
    assert [parse(f)[0].version for f in frames] == [1, 2]


# -- MERGE patches: what the scan accepts, protobuf (upb) must parse ------------

WIRE_CASES = [
    # upb refuses tag and length varints over 5 bytes; the scan took up to 10,
    # so a patch was stored that made every later version unparseable.
    (b"\x88\x80\x80\x80\x80\x00\x01", 0, "tag varint at offset 0 is longer than 5 bytes"),
    (b"\x08\x01\xf8\xff\xff\xff\x8f\x00\x01", 2, "tag varint at offset 2 is longer than 5 bytes"),
    (b"\x0a\x81\x80\x80\x80\x80\x00a", 1, "field 1 length varint at offset 1 is longer than 5 bytes"),
    # Groups nest at most 100 deep (protobuf's default recursion limit).
    (b"\x0b" * 101 + b"\x0c" * 101, 100, "group of field 1 at offset 100 nests 101 deep"),
    (b"\x0b" * 100_000 + b"\x0c" * 100_000, 100, "nests 101 deep"),
]


@pytest.mark.parametrize(("patch", "offset", "message"), WIRE_CASES, ids=lambda x: repr(x)[:24])
def test_patches_protobuf_cannot_parse_are_refused(patch: bytes, offset: int, message: str) -> None:
    with pytest.raises(WireFormatError, match=message) as info:
        check_patch(patch)
    assert info.value.offset == offset
    with pytest.raises(WireFormatError):
        ChainEncoder().merge(patch)


def test_patch_limits_match_protobuf() -> None:
    from google.protobuf import empty_pb2

    five_byte_tag = b"\xf8\xff\xff\xff\x0f\x01"  # field 536870911, the largest
    five_byte_length = b"\x0a\x81\x80\x80\x80\x00a"
    deepest = b"\x0b" * 100 + b"\x0c" * 100
    for patch in (five_byte_tag, five_byte_length, deepest):
        check_patch(patch)
        empty_pb2.Empty.FromString(patch)  # protobuf parses what the scan accepts


# -- sizes: refused from the header, before zstd allocates anything ------------


def open_stream(data: bytes) -> bytes:
    """``data`` as the writer's payloads are: a zstd frame (window 2**16) whose block is flushed, not ended."""
    compressor = zstd.ZstdCompressor(options={zstd.CompressionParameter.window_log: 16})
    return compressor.compress(data, zstd.ZstdCompressor.FLUSH_BLOCK)


def rle_blocks(count: int, block: int = 128 * 1024) -> bytes:
    """A zstd frame header (window 2**17, no content size) and ``count`` RLE
    blocks of ``block`` bytes each: 4 payload bytes per block, zstd's densest."""
    header = b"\x28\xb5\x2f\xfd\x00" + bytes([(17 - 10) << 3])
    return header + (((1 << 1) | (block << 3)).to_bytes(3, "little") + b"A") * count


IMPOSSIBLE_SIZES = [
    # (kind, state_size, base, payload): no zstd payload yields more than
    # 32768 bytes per byte (a 4-byte RLE block makes at most 128 KiB).
    (FULL, 0xFFFF_FFFF, b"", zstd.compress(b"x")),
    (FULL, 32768 * 6 + 1, b"", b"\x00" * 6),
    (FULL, 1, b"", b""),
    (DELTA, 0xFFFF_FFFF, STATE, b"\x00" * 100),
    (PATCH, len(STATE) + 32768 * 4 + 1, STATE, b"\x00" * 4),
]


@pytest.mark.parametrize("fmt", READABLE_FORMATS)
@pytest.mark.parametrize(
    ("kind", "state_size", "base", "payload", "continues"),
    [
        (*case, continues)
        for case in IMPOSSIBLE_SIZES
        for continues in (False, True)
        if case[0] != FULL or not continues
    ],
    ids=lambda x: repr(x)[:20],
)
def test_sizes_no_payload_can_yield_are_refused_before_decompressing(
    kind: int,
    state_size: int,
    base: bytes,
    payload: bytes,
    continues: bool,
    fmt: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # These made a decompressor (reserving its 2**window_log window) and ran
    # zstd before the size mismatch showed.
    import ckpt.codec._zstd

    new_reader = ckpt.codec._zstd.new_reader

    def only_the_first_frame(*, window_log: int, prefix: bytes | None) -> object:
        assert window_log == 16, "a decompressor was made for a frame its header rules out"
        return new_reader(window_log=window_log, prefix=prefix)

    monkeypatch.setattr(ckpt.codec._zstd, "new_reader", only_the_first_frame)
    hostile = forge(
        kind,
        payload,
        fmt=fmt,
        version=2 if base else 1,
        base=base,
        window_log=16 if continues else 31,
        continues=continues,
        prefix_size=len(base) if kind == DELTA and not continues else 0,
        state_size=state_size,
    )
    chain = [forge(FULL, open_stream(base), fmt=fmt, state=base), hostile] if base else [hostile]
    for run in decoders(chain):
        with pytest.raises(UnsupportedFormatError, match=rf"{len(payload)}-byte payload cannot decompress to"):
            run()


@pytest.mark.parametrize("fmt", READABLE_FORMATS)
def test_densest_payload_still_decodes(fmt: int) -> None:
    # The bound is exact: 4 payload bytes per 128 KiB block is legal.
    state = b"A" * (128 * 1024 * 3)
    frame = forge(FULL, rle_blocks(3), fmt=fmt, state=state, window_log=17)
    assert decode([frame]) == state
    assert [d.state for d in iter_versions([frame])] == [state]


@pytest.mark.parametrize("fmt", READABLE_FORMATS)
def test_a_zstd_bomb_is_cut_at_the_declared_size(fmt: int) -> None:
    # 16 KiB of payload that would expand to 512 MiB, in a frame declaring 1 KiB:
    # the decoder stops one byte past the declared size.
    frame = forge(FULL, rle_blocks(4096), fmt=fmt, state=b"A" * 1024, window_log=17)
    for run in decoders([frame])[:2]:
        with pytest.raises(DecodeError, match="decompressed to more than 1024 bytes"):
            run()


# -- buffers: any contiguous bytes-like object is read as bytes -----------------


def test_frames_given_as_wide_item_memoryviews_decode() -> None:
    # A 64-byte frame as memoryview(...).cast("Q") has len() 8: it was refused
    # as "frame is 8 bytes, shorter than the 64-byte header".
    vectors = json.loads(GOLDEN_FILES[1].read_text())["empty-state"]
    frame = bytes.fromhex(vectors[0]["frame"])
    for view in (memoryview(frame).cast("Q"), memoryview(frame).cast("B", shape=[8, 8])):
        assert parse(view)[0].state_size == 0
        assert decode([view]) == b""
        assert [d.state for d in iter_versions([view])] == [b""]


def test_non_contiguous_buffers_are_a_type_error() -> None:
    # They raised BufferError from struct.
    vectors = json.loads(GOLDEN_FILES[2].read_text())["empty-state"]
    strided = memoryview(bytes.fromhex(vectors[0]["frame"]) * 2)[::2]
    for run in decoders([strided]):
        with pytest.raises(TypeError, match="contiguous"):
            run()


# -- the contract, as properties over mutations of the golden chains ------------


def golden_chains() -> list[tuple[list[bytes], list[bytes]]]:
    """(frames, states) of every chain in the golden vectors of both formats, split at FULL frames."""
    chains: list[tuple[list[bytes], list[bytes]]] = []
    for path in GOLDEN_FILES.values():
        for vectors in json.loads(path.read_text()).values():
            for v in vectors:
                frame, state = bytes.fromhex(v["frame"]), bytes.fromhex(v["state"])
                if kind_of(frame) == FULL:
                    chains.append(([], []))
                chains[-1][0].append(frame)
                chains[-1][1].append(state)
    return chains


CHAINS = golden_chains()
ALL_STATES = {state for _, states in CHAINS for state in states}
STATE_OF = {frame: state for frames, states in CHAINS for frame, state in zip(frames, states, strict=True)}
# Format 1: (offset, size) of each header field before frame_xxh3, as FORMAT.md lays them out.
V1_HEADER_FIELDS = v1_field_spans()
# Format 2: (field, bytes of the values tried) before frame_check.
V2_HEADER_FIELDS = [("kind_flags", 1), ("window_log", 1), *((name, 8) for name in V2_VARINTS), ("state_xxh3", 8)]


def payload_start(frame: bytes | bytearray) -> int | None:
    """Where the payload of a (maybe damaged) frame starts, or None if its header cannot say."""
    if not is_v2(bytes(frame[:3])):
        return 64 if len(frame) >= 64 else None
    try:
        return len(frame) - len(payload_of(bytes(frame)))
    except IndexError:
        return None


def with_payload(frame: bytes, payload: bytes, *, fix_size: bool) -> bytes:
    """``frame`` with another payload, and its header's payload_size changed to match when ``fix_size``."""
    start = payload_start(frame)
    if start is None:
        return frame
    if not fix_size:
        return frame[:start] + payload
    if is_v2(frame):
        return with_fields(frame, payload=payload, payload_size=len(payload))
    return frame[:32] + struct.pack("<I", len(payload)) + frame[36:64] + payload


@st.composite
def extreme_or_any(draw: st.DrawFn, size: int) -> int:
    top = (1 << (8 * size)) - 1
    edges = [0, 1, 7, 8, 9, 10, 31, 32, top, top - 1, top >> 1, (top >> 1) + 1]
    return draw(st.one_of(st.sampled_from(edges), st.integers(0, top)))


@st.composite
def changed_field(draw: st.DrawFn, frame: bytes) -> bytes:
    """``frame`` with one header field set to an extreme or any value (its checksum recomputed for format 2)."""
    if not is_v2(frame):
        if len(frame) < 64:
            return frame
        offset, size = draw(st.sampled_from(V1_HEADER_FIELDS))
        return frame[:offset] + draw(extreme_or_any(size)).to_bytes(size, "little") + frame[offset + size :]
    name, size = draw(st.sampled_from(V2_HEADER_FIELDS))
    value = draw(extreme_or_any(size))
    widths = {name: draw(st.integers(1, 10))} if name in V2_VARINTS and draw(st.booleans()) else None
    try:
        return with_fields(frame, widths=widths, **{name: value})
    except IndexError:  # a header already cut short
        return frame


@st.composite
def mutated_chains(draw: st.DrawFn) -> tuple[list[bytes], list[bytes], bool]:
    """A golden chain with 1-3 mutations; the flag says whether frames were
    dropped, repeated, reordered or spliced in from another chain (which may
    then legally decode to an earlier state, or a spliced chain's)."""
    frames, states = draw(st.sampled_from(CHAINS))
    frames = list(frames)
    reshaped = False
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["flip", "truncate", "extend", "field", "payload", "reencode", "reshape"]))
        i = 0 if op == "reencode" else draw(st.integers(0, len(frames) - 1))
        frame = frames[i]
        if op == "reencode" and frame in STATE_OF and kind_of(frame) == FULL:
            # The same state as a whole zstd frame (the stream ends), maybe behind
            # a skippable frame or with bytes after it: what a careless writer makes.
            skippable = struct.pack("<II", 0x184D2A50, 2) + b"ab" if draw(st.booleans()) else b""
            ended = zstd.compress(STATE_OF[frame], level=draw(st.integers(1, 5)))
            frame = with_payload(frame, skippable + ended + draw(st.binary(max_size=4)), fix_size=True)
        if op == "flip" and frame:
            bit = draw(st.integers(0, len(frame) * 8 - 1))
            frame = frame[: bit // 8] + bytes([frame[bit // 8] ^ 1 << (bit % 8)]) + frame[bit // 8 + 1 :]
        elif op == "truncate":
            frame = frame[: draw(st.integers(0, max(len(frame) - 1, 0)))]
        elif op == "extend":
            frame += draw(st.binary(min_size=1, max_size=16))
        elif op == "field":
            frame = draw(changed_field(frame))
        elif op == "payload":
            frame = with_payload(frame, draw(st.binary(max_size=64)), fix_size=draw(st.booleans()))
        elif op == "reshape":
            reshaped = True
            other_frames, _ = draw(st.sampled_from(CHAINS))
            j = draw(st.integers(0, len(frames) - 1))
            how = draw(st.sampled_from(["drop", "repeat", "swap", "splice"]))
            if how == "drop" and len(frames) > 1:
                del frames[i]
            elif how == "repeat":
                frames.insert(i, frames[i])
            elif how == "swap":
                frames[i], frames[j] = frames[j], frames[i]
            else:
                frames.insert(i, draw(st.sampled_from(other_frames)))
            continue
        frames[i] = with_checksum(frame) if draw(st.booleans()) else frame
    return frames, states, reshaped


@settings(max_examples=300)
@given(mutated_chains())
def test_any_mutated_chain_decodes_to_its_state_or_raises_a_codec_error(case) -> None:
    frames, states, reshaped = case
    try:
        latest = decode(frames)
    except CodecError as error:
        # decode names the damage as reading every version does: the same error, naming the same version.
        with pytest.raises(CodecError) as every:
            list(iter_versions(frames))
        assert (type(every.value), str(every.value)) == (type(error), str(error))
    else:
        assert latest in ALL_STATES if reshaped else latest == states[-1]
    try:
        for i, version in enumerate(iter_versions(frames)):
            assert version.state in ALL_STATES if reshaped else version.state == states[i]
    except CodecError:
        pass
    for frame in frames:
        with contextlib.suppress(CodecError):
            parse(frame)


def golden_patches() -> list[bytes]:
    """Every golden state, and every MERGE patch (what a state appends to the one before)."""
    out = []
    for _, states in CHAINS:
        prev = b""
        for state in states:
            out.append(state)
            if state.startswith(prev) and len(state) > len(prev):
                out.append(state[len(prev) :])
            prev = state
    return out


@st.composite
def mutated_patches(draw: st.DrawFn) -> bytes:
    patch = bytearray(draw(st.sampled_from(golden_patches())))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(patch)))
        op = draw(st.sampled_from(["flip", "insert", "truncate", "varint", "groups"]))
        if op in ("varint", "groups"):
            at = draw(st.sampled_from([0, len(patch), at]))  # field boundaries of a valid patch, or anywhere
        if op == "flip" and patch:
            bit = draw(st.integers(0, len(patch) * 8 - 1))
            patch[bit // 8] ^= 1 << (bit % 8)
        elif op == "insert":
            patch[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == "truncate":
            del patch[at:]
        elif op == "varint":  # an over-long or huge varint where a tag, length or value may be
            width = draw(st.integers(1, 11))
            fill = draw(st.sampled_from([b"\x80", b"\x81", b"\xff"]))
            patch[at:at] = fill * (width - 1) + bytes([draw(st.integers(0, 0x7F))])
        else:  # groups nested around the rest
            depth = draw(st.integers(1, 130))
            tag = draw(st.sampled_from([0x0B, 0x13, 0x83]))
            end = bytes([tag + 1]) if tag != 0x83 else b"\x84"
            suffix = b"\x01" if tag == 0x83 else b""
            patch[at:at] = (bytes([tag]) + suffix) * depth + (end + suffix) * depth
    return bytes(patch)


@settings(max_examples=300)
@given(mutated_patches())
def test_a_patch_the_scan_accepts_parses_and_compaction_raises_only_codec_errors(patch: bytes) -> None:
    from google.protobuf import empty_pb2

    try:
        check_patch(patch)
    except WireFormatError:
        pass
    else:
        empty_pb2.Empty.FromString(patch)  # every protobuf parser's limits hold
    with contextlib.suppress(WireFormatError):
        check_patch(patch, message_type=pb.Checkpoint)
    with contextlib.suppress(CodecError):
        compact(patch, pb.Checkpoint)


def test_compaction_keeps_a_message_missing_required_fields() -> None:
    # A proto2 type with required fields: a MERGE state is built from partial
    # patches, so it may lack them. compact() raised protobuf's own EncodeError
    # ("missing required fields"), and so did ChainEncoder.merge with that
    # compaction type.
    from google.protobuf import descriptor_pb2

    name_part = descriptor_pb2.UninterpretedOption.NamePart  # required name_part, is_extension
    assert compact(b"", name_part) == b""
    assert compact(b"\x0a\x01a\x0a\x01b", name_part) == b"\x0a\x01b"
    enc = ChainEncoder(compact_message_type=name_part)
    frames = [enc.merge(b"\x0a\x01a"), enc.merge(b"\x10\x01"), enc.replace(b"\x0a\x01c")]
    start = max(i for i, f in enumerate(frames) if f.kind is FrameKind.FULL)
    chain = [f.data for f in frames[start:]]
    assert decode(chain) == b"\x0a\x01c"
    assert [d.version for d in iter_versions(chain)] == list(range(start + 1, 4))
