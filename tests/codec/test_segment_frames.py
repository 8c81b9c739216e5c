"""Segment frames (FORMAT.md §14): MERGE chains whose reads stay short without rewriting the state whole.

Golden bytes both ways; every version read three ways (through its segments, after every version
before it, by a reader advancing one frame at a time) against a model of MERGE; damaged and
hostile segment headers; and the writes a growing state costs.
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt.codec import (
    ChainEncoder,
    ChainPolicy,
    ChainStats,
    DecodeError,
    FrameKind,
    UnsupportedFormatError,
    decode,
    iter_versions,
    open_chain,
    parse,
)
from ckpt.codec.chainstats import Step, segment_base, started
from ckpt.codec.pieces import StatePieces
from tests.codec.layout import V2_CONTINUES, v2_fields, varint, with_fields
from tests.golden.cases import SEGMENT_CASE, SEGMENT_FILE, run

SEGMENTS = ChainPolicy(
    segment_fanout=2,
    segment_min_state_bytes=0,
    segment_max_fraction=1.0,
    max_delta_to_full_ratio=1.0,
    frame_cost_bytes=0,
)
GOLDEN = json.loads(SEGMENT_FILE.read_text())[SEGMENT_CASE.name]


def _field(n: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field ``n``: a patch that parses."""
    return bytes([n << 3 | 2]) + varint(len(payload)) + payload


def _write(policy: ChainPolicy, patches: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    """Frames and states of MERGE writes of ``patches`` (each committed)."""
    enc = ChainEncoder(policy=policy)
    frames, states, state = [], [], b""
    for p in patches:
        frames.append(enc.merge(p).data)
        enc.commit()
        state += p
        states.append(state)
    return frames, states


def _read_through(frames: list[bytes], version: int) -> list[bytes]:
    """The frames ``version`` is read through, FULL frame first (as the store reads them)."""
    headers = [parse(f)[0] for f in frames[:version]]
    start = max(i for i, h in enumerate(headers) if h.kind is FrameKind.FULL)
    return [frames[s.version - 1] for s in ChainStats.of(headers[start:]).path]


def _check_every_read(frames: list[bytes], states: list[bytes]) -> None:
    headers = [parse(f)[0] for f in frames]
    starts = [i for i, h in enumerate(headers) if h.kind is FrameKind.FULL] + [len(frames)]
    for start, end in itertools.pairwise(starts):
        assert [d.state for d in iter_versions(frames[start:end])] == states[start:end]
        _, reader = open_chain(frames[start : start + 1])
        assert reader is not None
        for i in range(start, end):
            assert decode(frames[start : i + 1]) == states[i]  # after every version before it
            assert decode(_read_through(frames, i + 1)) == states[i]  # through its segments
            if i > start:
                got = reader.advance([frames[i]])
                assert got is not None and got.state == states[i]


# -- golden bytes ------------------------------------------------------------------------------------


def test_the_encoder_writes_the_golden_segment_frames() -> None:
    got = [(f.hex(), s.hex()) for f, s in run(SEGMENT_CASE)]
    assert got == [(v["frame"], v["state"]) for v in GOLDEN]


def test_the_golden_segment_frames_decode_every_way() -> None:
    frames = [bytes.fromhex(v["frame"]) for v in GOLDEN]
    states = [bytes.fromhex(v["state"]) for v in GOLDEN]
    bases = [(h.version, h.base_version) for h in (parse(f)[0] for f in frames)]
    # Fanout 2: a segment at every even offset from the FULL frame (version 1), over the largest power of 2.
    assert bases == [(1, 0), (2, 1), (3, 1), (4, 3), (5, 1), (6, 5), (7, 5), (8, 7)]
    _check_every_read(frames, states)
    assert len(_read_through(frames, 8)) == 4  # 1, 5, 7, 8: not all eight


# -- every version, read every way, against the model ------------------------------------------------

_patch = st.binary(max_size=60).map(lambda b: _field(1, b))


@settings(max_examples=60, deadline=None)
@given(
    patches=st.lists(_patch, min_size=1, max_size=70),
    fanout=st.integers(2, 5),
    max_chain_versions=st.integers(1, 80),
    replace_at=st.sets(st.integers(0, 69), max_size=3),
)
def test_merges_and_replaces_read_back_every_way(
    patches: list[bytes], fanout: int, max_chain_versions: int, replace_at: set[int]
) -> None:
    policy = replace(SEGMENTS, segment_fanout=fanout, max_chain_versions=max_chain_versions)
    enc = ChainEncoder(policy=policy)
    frames, states, state = [], [], b""
    for i, p in enumerate(patches):
        if i in replace_at:  # a REPLACE ends the run of patches a segment may span
            frame = enc.replace(p)
            state = p
        else:
            frame = enc.merge(p)
            state += p
        enc.commit()
        frames.append(frame.data)
        states.append(state)
    _check_every_read(frames, states)
    headers = [parse(f)[0] for f in frames]
    start = max(i for i, h in enumerate(headers) if h.kind is FrameKind.FULL)
    assert headers[-1].version - headers[start].version < max_chain_versions


def test_a_resumed_encoder_writes_the_segments_an_unbroken_one_writes() -> None:
    patches = [_field(1, bytes([i]) * 30) for i in range(40)]
    whole, states = _write(SEGMENTS, patches)
    enc = ChainEncoder(policy=SEGMENTS)
    resumed: list[bytes] = []
    for i, p in enumerate(patches):
        if i and i % 7 == 0:  # as a store resumes an encoder from the stored chain
            headers = [parse(f)[0] for f in resumed]
            start = max(j for j, h in enumerate(headers) if h.kind is FrameKind.FULL)
            enc = ChainEncoder.resume(states[i - 1], headers[start:], policy=SEGMENTS)
        resumed.append(enc.merge(p).data)
        enc.commit()
    # The same bases everywhere (a resumed encoder starts a new stream, so payloads may differ).
    assert [parse(f)[0].base_version for f in resumed] == [parse(f)[0].base_version for f in whole]
    _check_every_read(resumed, states)


# -- what a growing state costs ----------------------------------------------------------------------


def test_a_growing_state_is_not_rewritten_whole_every_max_depth_versions() -> None:
    policy = ChainPolicy(max_chain_versions=512)  # the default fanout and state size for segments
    big = _field(2, random.Random(0).randbytes(200_000))  # past segment_min_state_bytes, incompressible
    patches = [big] + [_field(1, b"tool output %05d " % i + bytes([i % 251]) * 200) for i in range(1, 1100)]
    frames, states = _write(policy, patches)
    headers = [parse(f)[0] for f in frames]
    fulls = [h.version for h in headers if h.kind is FrameKind.FULL]
    # Without segments the chain ends every max_depth + 1 versions (17 FULL frames of ~200 KB).
    assert fulls == [1, 513, 1025]
    without, _ = _write(replace(policy, segment_fanout=0), patches)
    assert sum(parse(f)[0].kind is FrameKind.FULL for f in without) == 17
    assert sum(map(len, frames)) < sum(map(len, without)) / 3
    for v in (512, 1024, 1100):
        path = ChainStats.of(headers[fulls[-1 if v > 1024 else 0 if v < 513 else 1] - 1 : v]).path
        assert len(path) - 1 <= 7 * 3  # at most fanout - 1 frames a level, three levels under 512
        assert decode(_read_through(frames, v)) == states[v - 1]


def test_small_states_keep_chains_without_segments() -> None:
    frames, _ = _write(ChainPolicy(), [_field(1, b"x" * 40) for _ in range(200)])
    assert all(parse(f)[0].base_version in (0, parse(f)[0].version - 1) for f in frames)


@pytest.mark.parametrize(
    ("path_versions", "run_start", "new_version", "want"),
    [
        ([1, 2, 3], 1, 4, None),  # offset 3: no multiple of 2
        ([1, 2, 3, 4], 1, 5, 1),  # offset 4 = 2**2: over four versions, from the FULL frame
        ([1, 5, 6], 1, 7, 5),  # offset 6: over two versions
        ([1, 5, 6], 5, 7, 5),  # offset 2 from a DELTA at 5
        ([1, 2], 2, 3, None),  # offset 1 from the run's start
        ([1, 2, 3, 4, 6], 1, 7, None),  # base 5 is not on the path (another fanout wrote it): on the head
    ],
)
def test_segment_bases(path_versions: list[int], run_start: int, new_version: int, want: int | None) -> None:
    chain = replace(
        started(parse(_write(SEGMENTS, [_field(1, b"a")])[0][0])[0], 10),
        start_version=path_versions[0],
        path=tuple(Step(v, 10 * v, 10 * v, 0) for v in path_versions),
        run_start_version=run_start,
    )
    assert chain.path[-1].version + 1 == new_version
    index = segment_base(SEGMENTS, chain, 1000)
    assert (None if index is None else chain.path[index].version) == want


# -- damage and hostile headers ----------------------------------------------------------------------


def _golden_frames() -> list[bytes]:
    return [bytes.fromhex(v["frame"]) for v in GOLDEN]


def test_every_bit_flip_in_a_segment_frame_is_caught_or_changes_nothing() -> None:
    frames = _golden_frames()
    states = [bytes.fromhex(v["state"]) for v in GOLDEN]
    segment = 4  # version 5, over versions 2..5
    assert parse(frames[segment])[0].base_version == 1
    for bit in range(len(frames[segment]) * 8):
        damaged = bytearray(frames[segment])
        damaged[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(DecodeError):
            parse(bytes(damaged))
        consecutive = [*frames[:segment], bytes(damaged)]
        with pytest.raises(DecodeError):
            list(iter_versions(consecutive))
        for chain in (consecutive, [frames[0], bytes(damaged)]):
            try:
                got = decode(chain)
            except DecodeError:
                continue
            assert got == states[segment], bit


@pytest.mark.parametrize("cut", [1, 5, 8, 20, -1])
def test_a_truncated_segment_frame_is_refused(cut: int) -> None:
    frames = _golden_frames()
    with pytest.raises(DecodeError):
        decode([frames[0], frames[4][:cut]])
    with pytest.raises(DecodeError):
        list(iter_versions([*frames[:4], frames[4][:cut]]))


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"kind_flags": 3 | V2_CONTINUES}, "a PATCH frame of base_distance 4 .a segment. continues a stream"),
        ({"base_distance": 5}, "base_distance 5 of a PATCH frame names version 0"),
        ({"base_distance": 2**63}, "names version -"),
    ],
)
def test_segment_headers_a_writer_could_not_mean_are_refused(changes: dict[str, Any], error: str) -> None:
    frame = _golden_frames()[4]
    assert v2_fields(frame)["base_distance"] == 4
    with pytest.raises(UnsupportedFormatError, match=error):
        parse(with_fields(frame, **changes))


def test_a_delta_frame_further_back_than_its_previous_version_is_refused() -> None:
    enc = ChainEncoder(policy=SEGMENTS)
    enc.replace(_field(1, b"a" * 100))
    enc.commit()
    enc.replace(_field(1, b"a" * 99 + b"b"))
    enc.commit()
    delta = enc.replace(_field(1, b"a" * 98 + b"bc"))
    assert delta.kind is FrameKind.DELTA
    with pytest.raises(UnsupportedFormatError, match="base_distance 2 of a DELTA frame is not 1"):
        parse(with_fields(delta.data, base_distance=2, kind_flags=2))


def test_a_segment_whose_base_is_outside_its_run_of_patches_is_named() -> None:
    # Versions 1-4 with a REPLACE at 3, then the golden segment of version 5, whose base is version 1.
    enc = ChainEncoder(policy=replace(SEGMENTS, segment_fanout=0))
    ops = [("merge", _field(1, b"a" * 50)), ("merge", _field(1, b"b")), ("replace", _field(1, b"a" * 50 + b"c"))]
    frames = []
    for op, data in [*ops, ("merge", _field(1, b"d"))]:
        frames.append((enc.merge(data) if op == "merge" else enc.replace(data)).data)
        enc.commit()
    assert [parse(f)[0].kind for f in frames] == [FrameKind.FULL, FrameKind.PATCH, FrameKind.DELTA, FrameKind.PATCH]
    with pytest.raises(DecodeError, match="segment on version 1, outside the run of PATCH frames it follows"):
        list(iter_versions([*frames, _golden_frames()[4]]))
    with pytest.raises(DecodeError):
        decode([*frames, _golden_frames()[4]])


@pytest.mark.parametrize(
    ("cut", "tail", "want_state", "want_tail"),
    [
        (10, 3, b"0123456789", b"789"),  # nothing cut
        (6, 4, b"012345", b"2345"),  # at a piece's end
        (5, 5, b"01234", b"01234"),  # inside a piece, the tail across two
        (3, 3, b"012", b"012"),  # at the first piece's end
        (2, 1, b"01", b"1"),  # inside the first piece
        (0, 0, b"", b""),
    ],
)
def test_state_pieces_cut_back_to_a_base(cut: int, tail: int, want_state: bytes, want_tail: bytes) -> None:
    pieces = StatePieces(b"012")
    pieces.add(b"345")
    pieces.add(b"")
    pieces.add(b"6789")
    pieces.cut(cut)
    assert pieces.size == cut and pieces.tail(tail) == want_tail
    pieces.add(b"ab")
    assert pieces.join() == want_state + b"ab" and pieces.size == cut + 2
