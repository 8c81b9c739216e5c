"""ChainEncoder behaviour: policy bounds, rollback, resume, compaction, misuse."""

from __future__ import annotations

import random
import tracemalloc
from dataclasses import replace

import pytest

import ckpt.codec
import ckpt.codec._zstd
import ckpt.codec.encoder
from ckpt.codec import (
    ChainEncoder,
    ChainPolicy,
    ChainStats,
    EncodeError,
    FrameKind,
    MergeTooLargeError,
    decode,
    iter_versions,
    keyframe,
    parse,
)
from ckpt.v1 import checkpoint_pb2 as pb
from tests.golden.cases import GOLDEN_POLICY, SYSTEM

# These tests use states of a few hundred bytes; the default policy's per-frame
# cost would (rightly) keep such chains at one frame.
SMALL = GOLDEN_POLICY


def grow(n: int) -> list[bytes]:
    """n states, each the previous plus one line: the shape of an agent log."""
    lines = [SYSTEM]
    out = []
    for i in range(n):
        lines.append(f"step {i}: ran the tests, {i} failures left")
        out.append("\n".join(lines).encode())
    return out


@pytest.mark.parametrize("max_depth", [0, 1, 5])
def test_max_depth_bounds_the_chain(max_depth: int) -> None:
    enc = ChainEncoder(policy=ChainPolicy(max_depth=max_depth, max_decode_cost_ratio=1e9))
    kinds = [enc.replace(s).kind for s in grow(20)]
    starts = [i for i, k in enumerate(kinds) if k is FrameKind.FULL]
    assert starts == list(range(0, 20, max_depth + 1))


def test_each_chain_start_decodes_on_its_own_when_the_stream_is_reused() -> None:
    # A new chain reuses the previous chain's compressor (a new zstd frame on
    # the same context); its FULL frame must still need nothing before it.
    enc = ChainEncoder(policy=replace(SMALL, max_depth=2))
    states = grow(12)
    frames, compressors = [], set()
    for s in states:
        frames.append(enc.replace(s))
        assert enc._stream is not None
        compressors.add(id(enc._stream.compressor))
    assert len(compressors) == 1  # the reuse path ran
    for i, f in enumerate(frames):
        if f.kind is FrameKind.FULL:
            assert decode([f.data]) == states[i]
            fresh = ChainEncoder(policy=replace(SMALL, max_depth=2))
            assert parse(fresh.replace(states[i]).data)[1] == parse(f.data)[1]  # same payload as a new context
    assert sum(f.kind is FrameKind.FULL for f in frames) == 4
    assert decode([f.data for f in frames[-3:]]) == states[-1]


@pytest.mark.parametrize(
    ("index_bytes", "table_log"),
    [
        (0, 12),
        (4096, 12),
        (8191, 12),
        (8192, 13),
        (6451, 12),
        ((1 << 16) - 1, 15),
        (1 << 16, 16),
        (1 << 19, 18),
        (64 << 20, 18),
    ],
)
def test_match_tables_index_about_one_state(index_bytes: int, table_log: int) -> None:
    # Sized to the window (2**16 at least) a small state's live encoder held
    # ~576 KiB of tables and missed the CPU cache on every frame.
    assert ckpt.codec._zstd.table_log_for(index_bytes) == table_log


def test_a_chain_start_reuses_the_stream_only_with_tables_of_its_size() -> None:
    enc = ChainEncoder(policy=ChainPolicy(max_depth=0))  # every frame starts a chain
    small, large = b"s" * 3000, random.Random(7).randbytes(30_000)  # both within a 64 KiB window
    enc.replace(small)
    first = enc._stream
    assert first is not None and first.table_log == 12
    enc.replace(small + b"!")
    assert enc._stream is first  # same window, same tables: the context is reused
    enc.replace(large)
    assert enc._stream is not first and enc._stream.table_log == 14
    assert enc._stream.window_log == first.window_log == 16


def decode_cost(chain: ChainStats, policy: ChainPolicy, state_size: int) -> float:
    """The policy's decode-cost estimate, recomputed independently of the encoder."""
    full_and_patches = chain.materialized_bytes - chain.delta_bytes
    per_delta_byte = policy.small_delta_byte_cost if state_size <= policy.small_state_bytes else policy.delta_byte_cost
    return full_and_patches + per_delta_byte * chain.delta_bytes + chain.depth * policy.frame_cost_bytes


@pytest.mark.parametrize("small_state_bytes", [0, 1 << 20])  # every state large, or every state small
@pytest.mark.parametrize("floor", [0, 4096])
@pytest.mark.parametrize("ratio", [1.5, 3.0, 6.0])
def test_decode_cost_ratio_bounds_replace_chains(ratio: float, floor: int, small_state_bytes: int) -> None:
    policy = ChainPolicy(
        max_decode_cost_ratio=ratio,
        frame_cost_bytes=64,
        delta_byte_cost=0.25,
        small_delta_byte_cost=0.05,
        small_state_bytes=small_state_bytes,
        decode_floor_bytes=floor,
    )
    enc = ChainEncoder(policy=policy)
    depths = []
    for state in grow(60):
        enc.replace(state)
        assert decode_cost(enc.chain, policy, len(state)) <= max(ratio * len(state), floor)
        depths.append(enc.chain.depth)
    assert max(depths) >= 1  # deltas happen
    if (ratio, small_state_bytes) != (6.0, 1 << 20):  # there, cheap deltas run all 60 versions in one chain
        assert max(depths) < 60 - 1  # and chains restart


def test_a_bigger_cost_budget_means_longer_chains() -> None:
    def chains(policy: ChainPolicy) -> int:
        enc = ChainEncoder(policy=policy)
        return sum(enc.replace(s).kind is FrameKind.FULL for s in grow(60))

    no_floor = ChainPolicy(decode_floor_bytes=0)
    assert chains(replace(no_floor, max_decode_cost_ratio=1.5)) > chains(replace(no_floor, max_decode_cost_ratio=6.0))
    # and the fixed per-frame cost shortens chains of small states
    assert chains(replace(no_floor, frame_cost_bytes=4096)) > chains(replace(no_floor, frame_cost_bytes=0))


def test_below_the_floor_the_ratio_does_not_end_a_chain() -> None:
    # States of 300-2,000 bytes: a 4x ratio ends their chains within a few
    # frames, though decoding such a chain costs microseconds.
    def depths(policy: ChainPolicy) -> list[int]:
        enc = ChainEncoder(policy=policy)
        out = []
        for s in grow(60):
            enc.replace(s)
            out.append(enc.chain.depth)
        return out

    no_floor = depths(ChainPolicy(decode_floor_bytes=0))
    floor = ChainPolicy(decode_floor_bytes=32 * 1024)
    with_floor = depths(floor)
    assert max(no_floor) <= 2
    assert max(with_floor) > 3 * max(no_floor)
    enc = ChainEncoder(policy=floor)
    for s in grow(60):
        enc.replace(s)
        assert decode_cost(enc.chain, floor, len(s)) <= max(
            floor.max_decode_cost_ratio * len(s), floor.decode_floor_bytes
        )
    # max_depth stays a hard bound whatever the floor
    assert max(depths(ChainPolicy(decode_floor_bytes=10**9, max_depth=5))) == 5
    assert ChainPolicy().decode_floor_bytes == 32 * 1024


def test_merge_chains_have_their_own_floor() -> None:
    # The same states written as REPLACEs end their chains at decode_floor_bytes, as MERGEs run on to
    # merge_decode_floor_bytes (a store folds quiet MERGE heads, so their chains' decode is seldom paid).
    policy = ChainPolicy(
        max_decode_cost_ratio=1.0,
        frame_cost_bytes=512,
        decode_floor_bytes=8 * 1024,
        merge_decode_floor_bytes=64 * 1024,
        max_depth=1000,
    )
    patches = [
        pb.Checkpoint(messages=[pb.Message(content=f"turn {i}: " + "ok " * 30)]).SerializeToString() for i in range(300)
    ]

    def depths(write: str) -> list[int]:
        enc = ChainEncoder(policy=policy)
        out, state = [], b""
        for patch in patches:
            state += patch
            enc.replace(state) if write == "replace" else enc.merge(patch)
            out.append(enc.chain.depth)
            floor = policy.decode_floor_bytes if write == "replace" else policy.merge_decode_floor_bytes
            assert decode_cost(enc.chain, policy, len(state)) <= max(len(state), floor)
        return out

    replace_depths, merge_depths = depths("replace"), depths("merge")
    assert 2 <= max(replace_depths) < 16, max(replace_depths)
    assert 64 <= max(merge_depths) < len(patches) - 1, max(merge_depths)


def test_replace_deltas_of_a_large_state_stay_small_however_long_the_stream() -> None:
    # A ~140 KB state changed by one short line a version, in one long chain. A zstd stream fed past
    # its window wraps its buffer and loses most of the state before each delta: every few versions
    # a delta came out at 2-20 KB.
    rng = random.Random(7)
    lines = [rng.randbytes(60).hex() for _ in range(1200)]
    policy = ChainPolicy(max_depth=1000, max_decode_cost_ratio=1000.0, decode_floor_bytes=1 << 30)
    enc = ChainEncoder(policy=policy)
    sizes, frames = [], []
    for v in range(40):
        lines[rng.randrange(len(lines))] = f"version {v} changed this line".encode().hex()
        frame = enc.replace("\n".join(lines).encode())
        frames.append(frame.data)
        if v:
            assert frame.kind is FrameKind.DELTA
            sizes.append(len(frame.data))
    assert max(sizes) < 400, sizes
    assert decode(frames) == "\n".join(lines).encode()


def test_the_floor_does_not_change_chains_above_it() -> None:
    # States of ~40 KB: 4x a FULL decode is over the floor, so the ratio decides as before.
    big = [random.Random(i).randbytes(8000).hex().encode() * 3 for i in range(1)]
    states = [big[0] + b"step %d\n" % i * 40 for i in range(30)]

    def kinds(policy: ChainPolicy) -> list[FrameKind]:
        enc = ChainEncoder(policy=policy)
        return [enc.replace(s).kind for s in states]

    assert kinds(ChainPolicy(decode_floor_bytes=0)) == kinds(ChainPolicy(decode_floor_bytes=32 * 1024))


def test_merge_chains_materialise_only_the_state() -> None:
    enc = ChainEncoder(policy=SMALL)
    state = b""
    for i in range(40):
        patch = pb.Checkpoint(step=i, messages=[pb.Message(content=f"message {i} " + SYSTEM)]).SerializeToString()
        frame = enc.merge(patch)
        state = state + patch if frame.kind is FrameKind.PATCH else enc.state
        assert enc.chain.materialized_bytes == len(enc.state)
    assert enc.chain.depth == 40 - 1 - enc.chain.start_version + 1
    assert enc.chain.start_version == 34  # max_depth 32: chains start at 1 and 34


def test_a_delta_no_smaller_than_a_full_frame_starts_a_chain() -> None:
    rng = random.Random(0)
    enc = ChainEncoder()
    enc.replace(rng.randbytes(4096))
    assert enc.replace(rng.randbytes(4096)).kind is FrameKind.FULL  # unrelated state: no delta
    assert enc.replace(enc.state + b"x").kind is FrameKind.DELTA


def test_rollback_restores_the_head_and_drops_the_stream() -> None:
    states = grow(4)
    enc = ChainEncoder(policy=SMALL)
    f1 = enc.replace(states[0])
    f2 = enc.replace(states[1])
    enc.rollback()
    assert (enc.version, enc.state, enc.chain.depth) == (1, states[0], 0)
    f2b = enc.replace(states[2])
    assert f2b.version == 2 and not f2b.header.continues_stream and f2b.header.prefix_size == len(states[0])
    assert decode([f1.data, f2b.data]) == states[2]
    assert f2.data != f2b.data
    enc.rollback()
    enc.rollback()  # a second rollback has nothing to undo
    assert enc.version == 1


def test_rollback_of_a_merge_truncates_the_state() -> None:
    base = pb.Checkpoint(goal=SYSTEM).SerializeToString()
    enc = ChainEncoder(policy=SMALL)
    enc.merge(base)
    enc.merge(b"\x10\x02")
    enc.rollback()
    assert enc.state == base
    frame = enc.merge(pb.Checkpoint(messages=[pb.Message(content=SYSTEM[:80])]).SerializeToString())
    assert frame.kind is FrameKind.PATCH and frame.header.prefix_size == len(base)


def test_commit_frees_the_state_a_rollback_would_restore() -> None:
    size = 1 << 20
    rng = random.Random(7)
    enc = ChainEncoder()
    tracemalloc.start()
    try:
        enc.replace(rng.randbytes(size))  # only the encoder refers to it from here
        enc.commit()
        enc.replace(rng.randbytes(size))
        counted = enc.memory_bytes
        held = tracemalloc.get_traced_memory()[0]
        enc.commit()
        freed = held - tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert freed >= size  # the first state
    assert counted - enc.memory_bytes == size  # and memory_bytes counted it until then
    enc.rollback()  # nothing left to undo
    assert enc.version == 2 and len(enc.state) == size


def test_a_merge_shares_its_head_with_the_undo_so_it_counts_once() -> None:
    base = pb.Checkpoint(goal=SYSTEM).SerializeToString()
    enc = ChainEncoder(policy=SMALL)
    enc.merge(base)
    enc.commit()
    committed = enc.memory_bytes
    patch = b"\x10\x02"
    enc.merge(patch)
    assert enc.memory_bytes - committed <= len(patch) + 64 * 1024  # the patch, and the stream its frame started
    enc.commit()
    before = enc.memory_bytes
    enc.merge(patch)
    assert enc.memory_bytes == before + len(patch)  # the same stream: only the patch is new


def test_resume_continues_a_stored_chain() -> None:
    states = grow(6)
    enc = ChainEncoder(policy=SMALL)
    frames = [enc.replace(s) for s in states[:3]]
    resumed = ChainEncoder.resume(states[2], [f.header for f in frames], policy=SMALL)
    assert resumed.version == 3 and resumed.chain == enc.chain
    nxt = resumed.replace(states[3])
    assert nxt.kind is FrameKind.DELTA and not nxt.header.continues_stream
    assert decode([*(f.data for f in frames), nxt.data]) == states[3]


def test_resume_refuses_a_state_that_is_not_the_head() -> None:
    enc = ChainEncoder()
    frame = enc.replace(b"head state")
    with pytest.raises(ValueError, match="is not the head state of version 1"):
        ChainEncoder.resume(b"other state", [frame.header])
    with pytest.raises(ValueError, match="needs the head's chain"):
        ChainEncoder.resume(b"head state", [])


def test_chain_stats_of_headers() -> None:
    enc = ChainEncoder(policy=SMALL)
    frames = [enc.replace(s) for s in grow(4)]
    assert ChainStats.of([f.header for f in frames]) == enc.chain
    with pytest.raises(ValueError, match="starts with a FULL frame"):
        ChainStats.of([frames[1].header])


def test_compaction_drops_superseded_fields_at_a_chain_start() -> None:
    # Only max_depth ends chains here: superseded bytes would end them sooner (the test below).
    enc = ChainEncoder(
        policy=replace(SMALL, max_depth=3, max_superseded_fraction=1.0), compact_message_type=pb.Checkpoint
    )
    merged = pb.Checkpoint()
    frames = []
    for i in range(8):
        patch = pb.Checkpoint(step=i, goal=f"goal revision {i} " + SYSTEM)
        merged.MergeFrom(patch)
        frames.append(enc.merge(patch.SerializeToString()))
        assert pb.Checkpoint.FromString(enc.state) == merged
    # Version 5 starts a chain (max_depth 3): its state is the canonical
    # encoding of the merged message, not five concatenated goal revisions.
    assert [f.kind for f in frames].index(FrameKind.FULL, 1) == 4
    v5 = next(iter_versions([frames[4].data]))
    canonical_v5 = pb.Checkpoint(step=4, goal="goal revision 4 " + SYSTEM).SerializeToString(deterministic=True)
    assert v5.state == canonical_v5
    # and the chain after it decodes to the merged message again
    assert pb.Checkpoint.FromString(decode([f.data for f in frames[4:]])) == merged


@pytest.mark.parametrize("fraction", [0.5, 0.67, 0.9])
def test_a_typed_chain_restarts_compacted_once_superseded_bytes_reach_the_fraction(fraction: float) -> None:
    policy = replace(SMALL, max_depth=1000, decode_floor_bytes=1 << 30, max_superseded_fraction=fraction)
    enc = ChainEncoder(policy=policy, compact_message_type=pb.Checkpoint)
    merged = pb.Checkpoint()
    starts = []
    for i in range(40):
        patch = pb.Checkpoint(step=i, goal=f"goal revision {i:03d} " + SYSTEM)  # overwrites the same fields
        merged.MergeFrom(patch)
        frame = enc.merge(patch.SerializeToString())
        enc.commit()
        state = enc.state
        assert pb.Checkpoint.FromString(state) == merged
        if frame.kind is FrameKind.FULL:
            starts.append(i)
            assert state == merged.SerializeToString(deterministic=True)
        # Never more superseded than the fraction, beyond the patch that crossed it.
        live = len(merged.SerializeToString(deterministic=True))
        assert len(state) - len(patch.SerializeToString()) <= live / (1.0 - fraction) + 1
    # Each patch supersedes the last whole: a chain holds about 1 / (1 - fraction) patches.
    per_chain = 1 / (1.0 - fraction)
    assert len(starts) >= 40 / (per_chain + 1) - 1


def test_a_merge_past_max_state_size_is_stored_compacted_when_that_fits() -> None:
    # The superseded fraction alone would let three revisions pile up (max_superseded_fraction 1.0).
    policy = replace(SMALL, max_depth=1000, decode_floor_bytes=1 << 30, max_superseded_fraction=1.0)
    enc = ChainEncoder(policy=policy, compact_message_type=pb.Checkpoint)
    goal = "g" * 1000
    limit = 2500  # two revisions of the goal as merged; one as compacted
    merged = pb.Checkpoint()
    kinds = []
    for i in range(6):
        patch = pb.Checkpoint(step=i, goal=goal + str(i))
        merged.MergeFrom(patch)
        frame = enc.merge(patch.SerializeToString(), max_state_size=limit)
        enc.commit()
        kinds.append(frame.kind)
        assert pb.Checkpoint.FromString(enc.state) == merged
        assert enc.state_size <= limit
        if frame.kind is FrameKind.FULL and i:  # a chain started by the limit holds the canonical state
            assert enc.state == decode([frame.data]) == merged.SerializeToString(deterministic=True)
    # Every other merge crosses the limit as merged (three revisions), and starts a chain compacted.
    assert [kind is FrameKind.FULL for kind in kinds] == [True, False, True, False, True, False]


def test_a_merge_too_large_even_compacted_names_its_sizes_and_changes_nothing() -> None:
    enc = ChainEncoder(compact_message_type=pb.Checkpoint)
    enc.merge(pb.Checkpoint(goal="g" * 1000).SerializeToString())
    enc.commit()
    before = enc.state
    grown = pb.Checkpoint(messages=[pb.Message(content="m" * 1000)]).SerializeToString()
    with pytest.raises(MergeTooLargeError) as refused:
        enc.merge(grown, max_state_size=1500)
    assert (refused.value.version, refused.value.state_size, refused.value.limit) == (2, len(before) + len(grown), 1500)
    assert f"would make a state of {len(before) + len(grown)} bytes (compacted" in str(refused.value)
    assert enc.version == 1 and enc.state == before
    untyped = ChainEncoder()
    untyped.merge(b"\x0a\x03abc")
    with pytest.raises(
        MergeTooLargeError, match="merging 5 bytes onto version 1 would make a state of 10 bytes; the limit is 9"
    ):
        untyped.merge(b"\x0a\x03abc", max_state_size=9)
    enc.merge(grown, max_state_size=len(before) + len(grown))  # at the limit: taken
    assert enc.version == 2 and pb.Checkpoint.FromString(enc.state).messages[0].content == "m" * 1000


def test_appends_to_a_typed_state_do_not_restart_its_chain() -> None:
    policy = replace(SMALL, max_depth=1000, decode_floor_bytes=1 << 30, max_decode_cost_ratio=1000.0)
    enc = ChainEncoder(policy=policy, compact_message_type=pb.Checkpoint)
    frames = [enc.merge(pb.Checkpoint(goal=SYSTEM).SerializeToString())]
    for i in range(60):  # a message appended each step: nothing superseded
        frames.append(enc.merge(pb.Checkpoint(messages=[pb.Message(content=f"m{i} " + SYSTEM)]).SerializeToString()))
        enc.commit()
    assert [f.kind for f in frames].count(FrameKind.FULL) == 1


def test_compaction_refuses_a_patch_that_does_not_parse() -> None:
    enc = ChainEncoder(compact_message_type=pb.Checkpoint)
    with pytest.raises(EncodeError, match=r"does not parse as ckpt\.v1\.Checkpoint"):
        enc.merge(b"\x82\x01\x01\x08")  # framing fine, nested message broken


def test_compaction_leaves_a_head_that_does_not_parse_as_it_is() -> None:
    enc = ChainEncoder(policy=replace(SMALL, max_depth=1), compact_message_type=pb.Checkpoint)
    foreign = b"\x82\x01\x01\x08" + SYSTEM.encode()[:40]  # a REPLACE of some other message type
    enc.replace(foreign)
    patches = [pb.Checkpoint(step=i).SerializeToString() for i in range(3)]
    frames = [enc.merge(p) for p in patches]
    assert frames[1].kind is FrameKind.FULL  # max_depth 1: a chain start, where compaction runs
    assert enc.state == foreign + b"".join(patches)


def test_a_state_over_the_format_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ckpt.codec.encoder, "MAX_STATE_SIZE", 100)
    enc = ChainEncoder()
    enc.replace(b"x" * 99)
    with pytest.raises(EncodeError, match="state of version 2 would be 101 bytes; the frame format allows 100"):
        enc.merge(b"\x08\x01")
    with pytest.raises(EncodeError, match="state of version 2 would be 101 bytes"):
        enc.replace(b"x" * 101)
    assert (enc.version, enc.state) == (1, b"x" * 99)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_depth": -1}, "max_depth must be >= 0"),
        ({"max_decode_cost_ratio": 0.5}, "max_decode_cost_ratio must be >= 1.0"),
        ({"delta_byte_cost": 1.5}, r"delta_byte_cost must be in \[0, 1\]"),
        ({"frame_cost_bytes": -1}, "frame_cost_bytes must be >= 0"),
        ({"decode_floor_bytes": -1}, "decode_floor_bytes must be >= 0"),
        ({"merge_decode_floor_bytes": -1}, "merge_decode_floor_bytes must be >= 0"),
        ({"max_materialized_bytes": 0}, "max_materialized_bytes must be >= 1"),
        ({"max_delta_to_full_ratio": 0.0}, r"max_delta_to_full_ratio must be in \(0, 1\]"),
        ({"max_delta_to_full_ratio": 1.5}, r"max_delta_to_full_ratio must be in \(0, 1\]"),
        ({"patch_window_bytes": -1}, "patch_window_bytes must be >= 0"),
        ({"level": 23}, "level must be in -7..22"),
        ({"min_window_log": 9}, "min_window_log must be in 10..27"),
        ({"max_decode_cost_ratio": float("nan")}, "max_decode_cost_ratio must be >= 1.0"),
    ],
)
def test_policy_validates_its_fields(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        ChainPolicy(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_depth": 2.5}, "max_depth must be an int, got float 2.5"),
        ({"max_depth": "3"}, "max_depth must be an int, got str '3'"),
        ({"level": True}, "level must be an int, got bool True"),
        ({"level": 1.5}, "level must be an int, got float 1.5"),
        ({"patch_window_bytes": None}, "patch_window_bytes must be an int, got NoneType None"),
        ({"decode_floor_bytes": 1024.0}, "decode_floor_bytes must be an int, got float 1024.0"),
        ({"merge_decode_floor_bytes": 1.0}, "merge_decode_floor_bytes must be an int, got float 1.0"),
        ({"max_decode_cost_ratio": "4"}, "max_decode_cost_ratio must be a number, got str '4'"),
        ({"delta_byte_cost": False}, "delta_byte_cost must be a number, got bool False"),
    ],
)
def test_policy_refuses_fields_of_the_wrong_type(kwargs, message) -> None:
    with pytest.raises(TypeError, match=message):
        ChainPolicy(**kwargs)
    assert ChainPolicy(max_decode_cost_ratio=5).max_decode_cost_ratio == 5  # an int is a number


def test_policy_is_keyword_only_and_frozen() -> None:
    with pytest.raises(TypeError):
        ChainPolicy(8)  # type: ignore[call-arg]
    with pytest.raises(AttributeError):
        ChainPolicy().max_depth = 3  # type: ignore[misc]


def test_misuse_raises_type_errors() -> None:
    enc = ChainEncoder()
    with pytest.raises(TypeError, match="state must be bytes, not str"):
        enc.replace("text")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="patch must be bytes, not int"):
        enc.merge(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="policy must be a ChainPolicy"):
        ChainEncoder(policy={"max_depth": 3})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="state must be bytes, not str"):  # its utf-8 would pass the checksum
        ChainEncoder.resume("hello", [parse(ChainEncoder().replace(b"hello").data)[0]])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="compact_min_saving_ratio"):
        ChainEncoder(compact_min_saving_ratio=1.0)
    with pytest.raises(ValueError, match="at least one frame"):
        decode([])
    frame = ChainEncoder().replace(b"one frame").data
    for call in (decode, lambda frames: list(iter_versions(frames))):
        with pytest.raises(TypeError, match=r"not one bytes object; pass \[frame\]"):
            call(frame)  # type: ignore[arg-type]
    assert enc.replace(bytearray(b"ok")).version == 1  # bytes-like is fine


@pytest.mark.parametrize("state", [b"hello", b"\x0a\x10" + b"x" * 16 + b"y" * 20_000])
def test_the_package_docstring_example_runs_for_small_and_large_states(state: bytes) -> None:
    """It decoded [FULL, MERGE] as one chain, which a small state's new chain start broke."""

    example = "\n".join(line[4:] for line in ckpt.codec.__doc__.splitlines() if line.startswith("    "))
    exec(compile(example, "codec/__init__.py", "exec"), {**vars(ckpt.codec), "s1": state, "patch": b"\x08\x01"})


# (ChainEncoder keyword, value, error, message): each refused by the name of its field.
ENCODER_CONFIG = [
    ("compact_min_saving_ratio", "0.1", TypeError, "compact_min_saving_ratio must be a number, got str '0.1'"),
    ("compact_min_saving_ratio", True, TypeError, "compact_min_saving_ratio must be a number, got bool"),
    ("compact_min_saving_ratio", 1.0, ValueError, r"compact_min_saving_ratio must be in \[0, 1\), got 1.0"),
    ("compact_min_saving_ratio", -0.01, ValueError, r"compact_min_saving_ratio must be in \[0, 1\), got -0.01"),
    ("compact_message_type", "x", TypeError, "compact_message_type must be a protobuf message class or None, got 'x'"),
    ("compact_message_type", int, TypeError, "compact_message_type must be a protobuf message class or None"),
    ("compact_message_type", pb.ModelParams(), TypeError, "compact_message_type must be a protobuf message class"),
    ("format_version", 1.0, TypeError, "format_version must be an int, got float 1.0"),
    ("format_version", True, TypeError, "format_version must be an int, got bool True"),
    ("format_version", 3, ValueError, r"format_version must be one of \(1, 2\), got 3"),
    ("format_version", 0, ValueError, r"format_version must be one of \(1, 2\), got 0"),
]


@pytest.mark.parametrize(("name", "value", "error", "message"), ENCODER_CONFIG, ids=str)
def test_encoder_configuration_is_refused_by_its_name(name: str, value: object, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        ChainEncoder(**{name: value})  # type: ignore[arg-type]
    head = ChainEncoder().replace(b"state")
    with pytest.raises(error, match=message):
        ChainEncoder.resume(b"state", [head.header], **{name: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("ratio", [0, 0.5, 0.99])
def test_an_encoder_compacting_with_a_message_class_and_a_ratio_in_its_range_merges(ratio: float) -> None:
    enc = ChainEncoder(policy=SMALL, compact_message_type=pb.ModelParams, compact_min_saving_ratio=ratio)
    frames = [enc.replace(pb.ModelParams(model_id="m" * 100, seed=1).SerializeToString()).data]
    enc.commit()
    frames.append(enc.merge(pb.ModelParams(seed=2).SerializeToString()).data)
    assert pb.ModelParams.FromString(decode(frames)) == pb.ModelParams(model_id="m" * 100, seed=2)


@pytest.mark.parametrize("fmt", [1, 2])
@pytest.mark.parametrize(
    ("version", "message"), [(2**64 - 1, None), (2**64, "version must be <= 18446744073709551615")]
)
def test_a_keyframe_version_is_refused_past_what_a_frame_holds(fmt: int, version: int, message: str | None) -> None:
    if message is None:
        assert parse(keyframe(b"x", version=version, format_version=fmt).data)[0].version == version
        return
    with pytest.raises(ValueError, match=message):
        keyframe(b"x", version=version, format_version=fmt)
