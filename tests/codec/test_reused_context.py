"""A one-shot decode (decode, decode_latest) reads each stream without a prefix, and with a window up to
_zstd.REUSED_WINDOW_LOG_MAX, through its thread's reused zstd context; it answers what the stdlib path
answers, state or error, and leaves every doubt to that path. A kept stream (open_chain) stays a stdlib
decompressor."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ckpt.codec._zstd
from ckpt.codec import ChainEncoder, ChainPolicy, FrameKind, decode_latest, open_chain, parse
from ckpt.codec._zstd import REUSED_WINDOW_LOG_MAX, decompress_once, new_reader, new_stream, zstd
from ckpt.codec.decoder import _latest
from ckpt.codec.sealed import FrameBytes
from ckpt.v1 import checkpoint_pb2 as pb
from tests.codec.layout import with_checksum
from tests.codec.strategies import checkpoints, serialize
from tests.codec.test_codec_hostile import mutated_chains

LONG = ChainPolicy(max_depth=64, max_decode_cost_ratio=1e9, frame_cost_bytes=0)


def text(rng: random.Random, size: int) -> str:
    return " ".join(rng.choice(("plan", "tool", "result", "step", "ok", "retry")) for _ in range(size // 5))


def merge_chain(steps: int, *, step_bytes: int = 1000, policy: ChainPolicy = LONG) -> tuple[list[bytes], bytes]:
    """A chain of a FULL frame and ``steps`` MERGE patches (one stream), and its last state."""
    rng = random.Random(steps)
    enc = ChainEncoder(policy=policy)
    frames = [enc.replace(serialize(pb.Checkpoint(goal=text(rng, 10_000))))]
    for _ in range(steps):
        frames.append(enc.merge(serialize(pb.Checkpoint(messages=[pb.Message(content=text(rng, step_bytes))]))))
    assert [f.kind for f in frames] == [FrameKind.FULL] + [FrameKind.PATCH] * steps
    return [f.data for f in frames], enc.state


@contextmanager
def counted_readers() -> Iterator[list[dict[str, Any]]]:
    """Every new stdlib decompressor made meanwhile, by its arguments."""
    calls: list[dict[str, Any]] = []

    def counting(**kwargs: Any) -> Any:
        calls.append(kwargs)
        return new_reader(**kwargs)

    with mock.patch.object(ckpt.codec._zstd, "new_reader", counting):
        yield calls


@contextmanager
def stdlib_only() -> Iterator[None]:
    """Today's path: every stream read by a new stdlib decompressor."""
    with mock.patch.object(ckpt.codec._zstd, "decompress_once", lambda data, **kwargs: None):
        yield


def outcome(run: Callable[[], object]) -> object:
    try:
        return run()
    except Exception as exc:  # the first pass may trip on anything; decode_latest raises CodecErrors
        return type(exc), str(exc)


def test_a_cold_read_of_a_stream_without_prefix_makes_no_stdlib_decompressor() -> None:
    frames, state = merge_chain(10)
    with counted_readers() as calls:
        assert decode_latest(frames).state == state
        assert decode_latest([memoryview(f) for f in frames]).state == state  # what the store passes
    assert calls == []


def test_open_chain_keeps_its_last_stream_in_a_stdlib_decompressor() -> None:
    frames, _ = merge_chain(4)
    with counted_readers() as calls:
        latest, reader = open_chain(frames[:3])
    assert [c["prefix"] for c in calls] == [None]
    assert reader is not None and latest.state == decode_latest(frames[:3]).state
    advanced = reader.advance(frames[3:])  # the kept decompressor goes on with the stream
    assert advanced is not None and advanced.state == decode_latest(frames).state


def test_a_stream_with_a_prefix_takes_the_stdlib_path() -> None:
    # A frame not stored drops the live stream: the next PATCH starts one on the end of the head state.
    rng = random.Random(3)
    enc = ChainEncoder(policy=LONG)
    frames = [enc.replace(serialize(pb.Checkpoint(goal=text(rng, 10_000)))).data]
    for _ in range(2):
        enc.merge(serialize(pb.Checkpoint(goal="not stored")))
        enc.rollback()
        for _ in range(3):
            frames.append(enc.merge(serialize(pb.Checkpoint(messages=[pb.Message(content=text(rng, 500))]))).data)
    headers = [parse(f)[0] for f in frames]
    prefixed = [h.prefix_size for h in headers if h.prefix_size and not h.continues_stream]
    assert headers[0].kind is FrameKind.FULL and len(prefixed) == 2
    with counted_readers() as calls:
        assert decode_latest(frames).state == enc.state
    assert [len(c["prefix"]) for c in calls] == prefixed


def test_a_window_over_the_cap_takes_the_stdlib_path() -> None:
    rng = random.Random(7)
    big = text(rng, 2 << REUSED_WINDOW_LOG_MAX).encode()  # a window of 2**(cap + 1) or more
    enc = ChainEncoder(policy=LONG)
    frames = [enc.replace(big).data, enc.merge(serialize(pb.Checkpoint(goal="done"))).data]
    window_log = parse(frames[0])[0].window_log
    assert window_log > REUSED_WINDOW_LOG_MAX
    with counted_readers() as calls:
        assert decode_latest(frames).state == enc.state
    assert calls == [{"window_log": window_log, "prefix": None}]


def stream(state: bytes, window_log: int = 16) -> bytes:
    return new_stream(level=3, window_log=window_log, table_log=12, prefix=None).compress(
        state, mode=ckpt.codec._zstd.FLUSH_BLOCK
    )


STATE = b"hello, stream " * 500
DATA = stream(STATE)


@pytest.mark.parametrize(
    ("data", "window_log", "size"),
    [
        (stream(STATE, 17), 16, len(STATE)),  # the zstd frame header's window is over the ckpt header's
        (DATA, 16, len(STATE) - 1),  # more output than the stream's size
        (DATA, 16, len(STATE) + 1),  # less
        (DATA[:-3], 16, len(STATE)),  # cut short
        (DATA + zstd.ZstdCompressor().flush(), 16, len(STATE)),  # the zstd frame ends after the state
        (zstd.compress(STATE), 16, len(STATE)),  # a whole zstd frame
        (DATA[:6] + bytes([DATA[6] ^ 0xFF]) + DATA[7:], 16, len(STATE)),  # a damaged block header
        (DATA, REUSED_WINDOW_LOG_MAX + 1, len(STATE)),  # a window over the cap
    ],
    ids=["window", "longer", "shorter", "cut", "ended", "whole-frame", "damaged", "over-cap"],
)
def test_the_reused_context_refuses_what_it_has_any_doubt_about(data: bytes, window_log: int, size: int) -> None:
    assert decompress_once(data, window_log=window_log, size=size) is None


def test_the_reused_context_reads_a_sound_stream() -> None:
    assert decompress_once(DATA, window_log=16, size=len(STATE)) == STATE
    assert decompress_once(memoryview(DATA), window_log=16, size=len(STATE)) == STATE


def stdlib_answer(data: bytes, window_log: int, size: int) -> bytes | None:
    """What a new stdlib decompressor accepts of a whole stream (the first pass's checks), else None."""
    reader = new_reader(window_log=window_log, prefix=None)
    try:
        out = reader.decompress(data, max_length=size + 1)
    except zstd.ZstdError:
        return None
    return out if len(out) == size and not reader.eof and reader.needs_input else None


@settings(max_examples=500)
@given(
    st.sampled_from([DATA, stream(STATE, 10), stream(STATE, 17), stream(b""), zstd.compress(STATE)]),
    st.lists(st.tuples(st.sampled_from(["flip", "cut", "add"]), st.integers(0, 2**16), st.binary(max_size=8))),
    st.integers(10, REUSED_WINDOW_LOG_MAX + 1),
    st.sampled_from([0, 1, len(STATE) - 1, len(STATE), len(STATE) + 1]),
)
def test_what_the_reused_context_reads_a_stdlib_decompressor_accepts_the_same(
    data: bytes, damage: list[tuple[str, int, bytes]], window_log: int, size: int
) -> None:
    for op, at, extra in damage:
        at %= max(len(data), 1)
        if op == "flip" and data:
            data = data[:at] + bytes([data[at] ^ (1 << (len(extra) % 8))]) + data[at + 1 :]
        elif op == "cut":
            data = data[:at]
        else:
            data = data[:at] + extra + data[at:]
    fast = decompress_once(data, window_log=window_log, size=size)
    stdlib = stdlib_answer(data, window_log, size)
    assert fast is None or fast == stdlib
    # A sound stream within the cap takes the reused context (an empty payload, its zstd frame not begun,
    # is left to the stdlib decompressor).
    if data and not damage and 16 <= window_log <= REUSED_WINDOW_LOG_MAX and stdlib is not None:
        assert fast is not None


@st.composite
def written_chains(draw: st.DrawFn) -> list[bytes]:
    """Chains the encoder writes (MERGE and REPLACE; frames not stored and small windows start streams
    with prefixes), then maybe damaged: a bit flipped, bytes cut or added, the frame's checksum maybe recomputed."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    policy = ChainPolicy(
        max_depth=draw(st.integers(1, 30)),
        max_decode_cost_ratio=1e9,
        frame_cost_bytes=0,
        min_window_log=draw(st.sampled_from([10, 12, 16])),
        patch_window_bytes=draw(st.sampled_from([0, 512, 64 * 1024])),
    )
    enc = ChainEncoder(policy=policy)
    frames = [enc.replace(serialize(draw(checkpoints()))).data]
    for _ in range(draw(st.integers(0, 12))):
        if draw(st.booleans()):  # a frame not stored: the next one starts a stream, with a prefix
            enc.merge(serialize(pb.Checkpoint(goal="not stored")))
            enc.rollback()
        if draw(st.integers(0, 3)):
            patch = pb.Checkpoint(messages=[pb.Message(content=text(rng, draw(st.integers(0, 1500))))])
            frames.append(enc.merge(serialize(patch)).data)
        else:
            frames.append(enc.replace(serialize(draw(checkpoints())) + text(rng, 600).encode()).data)
    start = max(i for i, f in enumerate(frames) if parse(f)[0].kind is FrameKind.FULL)
    chain = frames[start:]
    for _ in range(draw(st.integers(0, 2))):
        i = draw(st.integers(0, len(chain) - 1))
        frame = chain[i]
        op = draw(st.sampled_from(["flip", "cut", "add"]))
        if op == "flip" and frame:
            bit = draw(st.integers(0, len(frame) * 8 - 1))
            frame = frame[: bit // 8] + bytes([frame[bit // 8] ^ 1 << (bit % 8)]) + frame[bit // 8 + 1 :]
        elif op == "cut" and frame:
            frame = frame[: draw(st.integers(0, len(frame) - 1))]
        else:
            frame += draw(st.binary(min_size=1, max_size=8))
        chain[i] = with_checksum(frame) if draw(st.booleans()) else frame
    return chain


def same_answer(chain: list[FrameBytes]) -> None:
    """decode_latest's state or error, and the first pass's answer, are the stdlib path's."""
    fast = outcome(lambda: decode_latest(chain))
    first_pass = outcome(lambda: _latest(chain, None))
    with stdlib_only():
        assert outcome(lambda: decode_latest(chain)) == fast
        assert outcome(lambda: _latest(chain, None)) == first_pass


@settings(max_examples=300)
@given(written_chains())
def test_the_reused_context_answers_as_the_stdlib_path_on_written_chains(chain: list[bytes]) -> None:
    same_answer(list(chain))


@settings(max_examples=300)
@given(mutated_chains())
def test_the_reused_context_answers_as_the_stdlib_path_on_damaged_golden_chains(case: Any) -> None:
    same_answer(list(case[0]))


def test_threads_decoding_at_once_each_read_through_their_own_context() -> None:
    chains = [merge_chain(steps, step_bytes=step_bytes) for steps in (3, 10, 20) for step_bytes in (200, 3000)]
    barrier = threading.Barrier(8)
    contexts: list[object] = []
    wrong: list[int] = []

    def reader(k: int) -> None:
        barrier.wait()
        for i in range(200):
            frames, state = chains[(k + i) % len(chains)]
            if decode_latest(frames).state != state:
                wrong.append(k)
        contexts.append(ckpt.codec._zstd._per_thread.dctx)

    with counted_readers() as calls:
        threads = [threading.Thread(target=reader, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert wrong == [] and calls == []
    assert len({id(c) for c in contexts}) == 8
