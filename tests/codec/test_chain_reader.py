"""ChainReader: a chain's latest state advanced by the frames written after it equals decode() of the whole
chain, or is None (a new chain, or anything damaged); never a wrong state."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckpt.codec import (
    ChainEncoder,
    ChainLinkError,
    ChainPolicy,
    FrameKind,
    OutputTooLargeError,
    decode,
    decoder,
    frame_kind,
    keyframe,
    open_chain,
    parse,
)
from ckpt.codec.sealed import FrameBytes

# Short chains and narrow windows: chains end, and streams start anew, often.
SHORT = ChainPolicy(max_depth=6, min_window_log=10, patch_window_bytes=1024)
LONG = ChainPolicy(max_depth=64, max_decode_cost_ratio=1e9, frame_cost_bytes=0)

_text = st.binary(min_size=0, max_size=300)
# A write: REPLACE with the state grown or cut (a DELTA, or a FULL), or MERGE of one length-delimited field.
_writes = st.lists(
    st.one_of(
        st.tuples(st.just("grow"), _text),
        st.tuples(st.just("cut"), st.integers(0, 2000)),
        st.tuples(st.just("merge"), _text),
        st.tuples(st.just("new"), st.binary(min_size=0, max_size=3000)),
        # The head rewritten as a sealed keyframe, then a MERGE by an encoder resumed on it.
        st.tuples(st.just("keyframe"), _text),
    ),
    min_size=2,
    max_size=40,
)


def written(writes: list[tuple[str, object]], policy: ChainPolicy) -> list[bytes]:
    enc = ChainEncoder(policy=policy)
    frames = [enc.replace(b"\x0a\x05start" * 40).data]
    for op, arg in writes:
        if op == "grow":
            assert isinstance(arg, bytes)
            frames.append(enc.replace(enc.state + _field(arg)).data)
        elif op == "cut":
            assert isinstance(arg, int)
            frames.append(enc.replace(enc.state[: len(enc.state) - min(arg, len(enc.state))]).data)
        elif op == "merge":
            assert isinstance(arg, bytes)
            frames.append(enc.merge(_field(arg)).data)
        elif op == "keyframe":
            assert isinstance(arg, bytes)
            head = keyframe(enc.state, version=enc.version, policy=policy)
            frames[-1] = head.data
            enc = ChainEncoder.resume(enc.state, [head.header], policy=policy)
            frames.append(enc.merge(_field(arg)).data)
        else:
            assert isinstance(arg, bytes)
            frames.append(enc.replace(arg).data)
        enc.commit()
    return frames


def _field(data: bytes) -> bytes:
    # Field 2, length-delimited: a well-formed patch whatever ``data`` holds.
    n, size = len(data), b""
    while True:
        size += bytes([(n & 0x7F) | (0x80 if n > 0x7F else 0)])
        n >>= 7
        if not n:
            return b"\x12" + size + data


def chain_start(frames: list[bytes], version_index: int) -> int:
    return max(i for i in range(version_index + 1) if frame_kind(frames[i]) is FrameKind.FULL)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    writes=_writes,
    policy=st.sampled_from([SHORT, LONG]),
    data=st.data(),
)
def test_advanced_equals_decode_of_the_whole_chain(
    writes: list[tuple[str, object]], policy: ChainPolicy, data: st.DataObject
) -> None:
    frames = written(writes, policy)
    at = data.draw(st.integers(0, len(frames) - 2), label="first read")
    latest, reader = open_chain(frames[chain_start(frames, at) : at + 1])
    assert latest.state == decode(frames[chain_start(frames, at) : at + 1])
    assert reader is not None and reader.version == at + 1
    while at < len(frames) - 1:
        step = data.draw(st.integers(1, len(frames) - 1 - at), label="frames in one advance")
        new = frames[at + 1 : at + 1 + step]
        target = at + step
        expected = decode(frames[chain_start(frames, target) : target + 1])
        advanced = reader.advance(new)
        if any(frame_kind(f) is FrameKind.FULL for f in new):
            assert advanced is None  # a new chain: the caller decodes it whole
            assert reader.spent
            latest, kept = open_chain(frames[chain_start(frames, target) : target + 1])
            assert latest.state == expected and kept is not None
            reader = kept
        else:
            assert advanced is not None
            assert advanced.state == expected
            assert advanced.header == parse(frames[target])[0]
            assert reader.latest is advanced
        assert reader.version == target + 1
        at = target


def merge_chain(count: int, *, seed: int = 1) -> list[bytes]:
    """A FULL frame then ``count`` PATCH frames continuing its stream (what a MERGE-written session stores)."""
    rng = random.Random(seed)
    enc = ChainEncoder(policy=LONG)
    frames = [enc.replace(b"".join(_field(bytes(rng.randrange(97, 123) for _ in range(32))) for _ in range(600))).data]
    for i in range(count):
        frames.append(enc.merge(_field(f"message {i}: ran the tests".encode() * 3)).data)
        enc.commit()
    assert all(parse(f)[0].continues_stream for f in frames[1:])
    return frames


def test_a_continuing_stream_advances_one_frame_at_a_time() -> None:
    frames = merge_chain(20)
    _, reader = open_chain(frames[:5])
    assert reader is not None
    for i in range(5, 21):
        advanced = reader.advance([frames[i]])
        assert advanced is not None and advanced.state == decode(frames[: i + 1])


@pytest.mark.parametrize("where", ["header", "payload", "checksum"])
@given(data=st.data())
@settings(max_examples=60, deadline=None)
def test_a_bit_flipped_frame_never_advances_to_a_wrong_state(where: str, data: st.DataObject) -> None:
    frames = merge_chain(6)
    _, reader = open_chain(frames[:3])
    assert reader is not None
    new = [bytearray(f) for f in frames[3:]]
    victim = data.draw(st.integers(0, len(new) - 1))
    header, _ = parse(frames[3 + victim])
    start = len(frames[3 + victim]) - header.payload_size
    span = {"header": (0, start - 12), "checksum": (start - 12, start), "payload": (start, len(new[victim]))}[where]
    bit = data.draw(st.integers(span[0] * 8, span[1] * 8 - 1))
    new[victim][bit // 8] ^= 1 << (bit % 8)
    advanced = reader.advance(new)
    if advanced is not None:  # only a flip that leaves the state right (a skipped frame checksum) may pass
        assert advanced.state == decode(frames)
    # Once a flip is refused the reader is spent: the sound frames no longer advance it either.
    if advanced is None:
        assert reader.spent and reader.advance(frames[3:]) is None


@given(data=st.data())
@settings(max_examples=60, deadline=None)
def test_a_truncated_frame_does_not_advance(data: st.DataObject) -> None:
    frames = merge_chain(6)
    _, reader = open_chain(frames[:3])
    assert reader is not None
    new = list(frames[3:])
    victim = data.draw(st.integers(0, len(new) - 1))
    new[victim] = new[victim][: data.draw(st.integers(0, len(new[victim]) - 1))]
    assert reader.advance(new) is None


def test_frames_that_do_not_follow_the_version_read_do_not_advance() -> None:
    frames = merge_chain(8)
    for given_frames in ([frames[5]], frames[4:6][::-1], [frames[3], frames[3]], []):
        _, reader = open_chain(frames[:4])
        assert reader is not None
        assert reader.advance(given_frames) is None


def test_advancing_by_no_frames_answers_none_and_leaves_the_reader_usable() -> None:
    frames = merge_chain(6)
    _, reader = open_chain(frames[:3])
    assert reader is not None
    for _ in range(2):
        assert reader.advance([]) is None
        assert not reader.spent and reader.version == 3
    advanced = reader.advance(frames[3:])
    assert advanced is not None and advanced.state == decode(frames)
    assert reader.advance(()) is None and not reader.spent and reader.version == 7


def test_another_chains_frames_do_not_advance() -> None:
    # Another session (or this one deleted and written again) with the same versions and sizes.
    ours, other = merge_chain(6), merge_chain(6, seed=2)
    assert [parse(f)[0].state_size for f in other] == [parse(f)[0].state_size for f in ours]
    _, reader = open_chain(ours[:3])
    assert reader is not None
    assert reader.advance(other[3:]) is None


def test_the_limit_bounds_what_a_reader_advances_to() -> None:
    frames = merge_chain(6)
    limit = parse(frames[3])[0].state_size
    _, reader = open_chain(frames[:3], max_state_bytes=limit)
    assert reader is not None
    assert reader.advance(frames[3:4]) is not None
    assert reader.advance(frames[4:5]) is None


def _output(frames: Sequence[FrameBytes]) -> int:
    """What decoding ``frames`` materialises, from their headers: the oracle of the work bounds."""
    return sum(parse(f)[0].content_size for f in frames)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(writes=_writes, policy=st.sampled_from([SHORT, LONG]), data=st.data())
def test_the_output_bound_counts_whole_states_and_patches(
    writes: list[tuple[str, object]], policy: ChainPolicy, data: st.DataObject
) -> None:
    """FULL and DELTA frames count their whole state, PATCH frames their patch: a chain opens (and frames
    advance a reader) within exactly that many bytes of output, and not one byte fewer."""
    frames = written(writes, policy)
    at = data.draw(st.integers(0, len(frames) - 2), label="first read")
    chain = frames[chain_start(frames, at) : at + 1]
    if _output(chain):  # a chain of empty states outputs nothing: no budget is one byte fewer
        with pytest.raises(OutputTooLargeError) as refused:
            open_chain(chain, max_output_bytes=_output(chain) - 1)
        assert (refused.value.output_bytes, refused.value.version) == (_output(chain), at + 1)
    latest, reader = open_chain(chain, max_output_bytes=_output(chain))
    assert latest.state == decode(chain) and reader is not None
    new = frames[at + 1 : at + 1 + data.draw(st.integers(1, len(frames) - 1 - at), label="frames")]
    if any(frame_kind(f) is FrameKind.FULL for f in new):
        return
    if _output(new):
        _, other = open_chain(chain)
        assert other is not None and other.advance(new, max_output_bytes=_output(new) - 1) is None
    advanced = reader.advance(new, max_output_bytes=_output(new))
    assert advanced is not None and advanced.state == decode(frames[chain_start(frames, at) : at + 1 + len(new)])


def test_a_chain_that_outputs_nothing_opens_within_a_budget_of_zero() -> None:
    """A chain whose state was cut to nothing (a FULL frame of zero bytes) has no budget one byte fewer."""
    frames = written(
        [("grow", b"")] * 8 + [("new", b"\x00")] + [("grow", b"")] * 6 + [("cut", 13), ("grow", b"")], SHORT
    )
    chain = frames[chain_start(frames, 16) : 17]
    assert _output(chain) == 0
    latest, reader = open_chain(chain, max_output_bytes=0)
    assert latest.state == decode(chain) == b"" and reader is not None


def test_a_large_state_advances_by_its_new_frames_output() -> None:
    """A reader of a 20 KB state advances with 200 bytes of output allowed: the state's size is not work."""
    frames = merge_chain(4)
    assert parse(frames[0])[0].state_size > 19_000
    _, reader = open_chain(frames[:2], max_output_bytes=_output(frames[:2]))
    assert reader is not None
    for frame in frames[2:]:
        assert _output([frame]) < 200
        advanced = reader.advance([frame], max_output_bytes=200)
        assert advanced is not None and advanced.state == decode(frames[: advanced.version])


def test_the_frame_by_frame_pass_keeps_the_output_bound() -> None:
    """open_chain falls back to decode's frame-by-frame pass for chains the one-pass decode declines: that
    pass refuses too much output as well, after checking the headers and before decompressing."""
    frames: list[FrameBytes] = list(merge_chain(3))
    with pytest.raises(OutputTooLargeError):
        decoder._latest_checked(frames, None, _output(frames) - 1)
    assert decoder._latest_checked(frames, None, _output(frames)) == decode(frames)
    damaged = [frames[0], frames[2]]  # a link error is named first, whatever the bound
    with pytest.raises(ChainLinkError):
        decoder._latest_checked(damaged, None, 0)
    with pytest.raises(ValueError, match="max_output_bytes must be >= 0"):
        open_chain(frames, max_output_bytes=-1)
