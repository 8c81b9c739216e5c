"""Property tests: any sequence of REPLACE and MERGE writes decodes to exactly
the expected state at every version, under every policy; damaged input never
decodes to wrong bytes."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt.codec import (
    ChainEncoder,
    ChainLinkError,
    ChainPolicy,
    ChecksumError,
    CodecError,
    DecodeError,
    FrameKind,
    StateSnapshot,
    decode,
    frame_kind,
    iter_versions,
    keyframe,
)
from ckpt.v1 import checkpoint_pb2 as pb
from tests.codec.strategies import big_checkpoints, checkpoints, serialize
from tests.golden.cases import GOLDEN_POLICY

# Hypothesis states are small; the default per-frame cost would keep their
# chains at one frame, so every policy but the default sets it to 0.
POLICIES = {
    "default": ChainPolicy(),
    "every-frame-full": ChainPolicy(max_depth=0),
    "depth-1": ChainPolicy(max_depth=1, frame_cost_bytes=0),
    "depth-3-no-patch-window": ChainPolicy(max_depth=3, patch_window_bytes=0, frame_cost_bytes=0),
    "unbounded-cost": ChainPolicy(max_decode_cost_ratio=1e9, frame_cost_bytes=0, delta_byte_cost=1.0),
    "cost-2x-cap-4k": ChainPolicy(max_decode_cost_ratio=2.0, max_materialized_bytes=4096, frame_cost_bytes=0),
    "level-1-small-window": ChainPolicy(level=1, min_window_log=10, patch_window_bytes=16, frame_cost_bytes=0),
    "negative-level": ChainPolicy(level=-5, max_delta_to_full_ratio=1.0, frame_cost_bytes=0),
    "strict-delta": ChainPolicy(max_delta_to_full_ratio=0.01, frame_cost_bytes=0),
}

# One write: ("replace", full state) or ("merge", patch); "rollback-replace"
# and "rollback-merge" encode a write and drop its frame (a write that was
# never stored), and "resume" restarts the encoder from stored data, as a
# store does after a restart; "keyframe" rewrites the head as a sealed
# keyframe and resumes the encoder on it, as a store does with a quiet head.
writes = st.one_of(
    st.tuples(st.just("replace"), checkpoints().map(serialize)),
    st.tuples(st.just("merge"), checkpoints(partial=True).map(serialize)),
)
ops = st.tuples(
    writes,
    st.lists(
        st.one_of(
            writes,
            st.tuples(st.just("rollback-replace"), checkpoints().map(serialize)),
            st.tuples(st.just("rollback-merge"), checkpoints(partial=True).map(serialize)),
            st.tuples(st.just("resume"), st.just(b"")),
            st.tuples(st.just("keyframe"), st.just(b"")),
        ),
        max_size=24,
    ),
).map(lambda t: [t[0], *t[1]])


class Store:
    """The test oracle: every stored frame and the state each version must decode to."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.expected: list[bytes] = []
        #: The encoder's snapshot of each version, taken right after its frame.
        self.snapshots: list[StateSnapshot] = []

    def chain_of(self, version: int) -> list[bytes]:
        """Frames from the chain start of ``version`` to ``version`` (1-based)."""
        start = version - 1
        while self.kind(start) is not FrameKind.FULL:
            start -= 1
        return self.frames[start:version]

    def kind(self, index: int) -> FrameKind:
        return frame_kind(self.frames[index])


def run_ops(policy: ChainPolicy, operations: list[tuple[str, bytes]], compact: bool = False) -> Store:
    compact_type = pb.Checkpoint if compact else None
    enc = ChainEncoder(policy=policy, compact_message_type=compact_type)
    store = Store()
    for op, data in operations:
        if op.startswith("rollback"):
            if store.frames:
                enc.replace(data) if op == "rollback-replace" else enc.merge(data)  # encoded, "not stored"
                enc.rollback()
            continue
        if op == "keyframe":
            if store.frames:
                keyed = keyframe(store.expected[-1], version=len(store.frames), policy=policy)
                store.frames[-1] = keyed.data
                enc = ChainEncoder.resume(
                    store.expected[-1], [keyed.header], policy=policy, compact_message_type=compact_type
                )
            continue
        if op == "resume":
            if store.frames:
                head = store.chain_of(len(store.frames))
                headers = [d.header for d in iter_versions(head)]
                enc = ChainEncoder.resume(store.expected[-1], headers, policy=policy, compact_message_type=compact_type)
            continue
        prev = store.expected[-1] if store.expected else b""
        frame = enc.replace(data) if op == "replace" else enc.merge(data)
        assert frame.version == len(store.frames) + 1
        store.frames.append(frame.data)
        if op == "replace" or not compact or frame.kind is not FrameKind.FULL:
            expected = data if op == "replace" else prev + data
            assert enc.state == expected
        else:
            # A FULL frame of a MERGE may be compacted: same message, maybe other bytes.
            expected = enc.state
            merged = pb.Checkpoint.FromString(prev + data)
            assert pb.Checkpoint.FromString(expected) == merged
        store.expected.append(expected)
        snapshot = enc.snapshot()
        if len(store.snapshots) % 2:
            assert snapshot.tobytes() == expected  # read at once; the others only at the end
        store.snapshots.append(snapshot)
    return store


def check_every_version(store: Store) -> None:
    for version in range(1, len(store.frames) + 1):
        assert decode(store.chain_of(version)) == store.expected[version - 1], f"version {version}"
    # Later writes, rollbacks and resumes never change what an earlier snapshot holds.
    for version, (snapshot, expected) in enumerate(zip(store.snapshots, store.expected, strict=True), 1):
        assert (len(snapshot), snapshot.tobytes()) == (len(expected), expected), f"snapshot of version {version}"
    # Streaming every version of the last chain gives the same states.
    last = store.chain_of(len(store.frames))
    first = len(store.frames) - len(last)
    got = [(d.version, d.state) for d in iter_versions(last)]
    assert got == [(first + i + 1, store.expected[first + i]) for i in range(len(last))]


@pytest.mark.parametrize("policy", POLICIES.values(), ids=POLICIES.keys())
@given(operations=ops)
def test_every_version_decodes_to_the_written_state(policy: ChainPolicy, operations) -> None:
    check_every_version(run_ops(policy, operations))


@given(operations=ops)
def test_compaction_keeps_the_message(operations) -> None:
    store = run_ops(ChainPolicy(max_depth=2, frame_cost_bytes=0), operations, compact=True)
    check_every_version(store)


@settings(max_examples=3)
@given(first=big_checkpoints(), patch=checkpoints(partial=True).map(serialize), second=checkpoints().map(serialize))
def test_states_over_10_mib(first: pb.Checkpoint, patch: bytes, second: bytes) -> None:
    big = serialize(first)
    assert len(big) >= 10 * 1024 * 1024
    edited = pb.Checkpoint()
    edited.CopyFrom(first)
    edited.step = 7
    edited.messages.add(content="one more step")
    operations = [("replace", big), ("merge", patch), ("replace", serialize(edited)), ("replace", second)]
    store = run_ops(ChainPolicy(), operations)
    kinds = [store.kind(i) for i in range(4)]
    assert kinds[:3] == [FrameKind.FULL, FrameKind.PATCH, FrameKind.DELTA]
    # The delta of a 10 MiB state with one edit and one appended message is small.
    assert len(store.frames[2]) < 4096, len(store.frames[2])
    check_every_version(store)


@given(operations=ops, data=st.data())
def test_damaged_frames_never_decode_to_wrong_bytes(operations, data) -> None:
    store = run_ops(ChainPolicy(), operations)
    version = data.draw(st.integers(1, len(store.frames)), label="version")
    chain = store.chain_of(version)
    index = data.draw(st.integers(0, len(chain) - 1), label="frame")
    frame = chain[index]
    damage = data.draw(st.sampled_from(["flip", "truncate", "extend"]), label="damage")
    if damage == "flip":
        bit = data.draw(st.integers(0, len(frame) * 8 - 1), label="bit")
        damaged = bytearray(frame)
        damaged[bit // 8] ^= 1 << (bit % 8)
    elif damage == "truncate":
        damaged = bytearray(frame[: data.draw(st.integers(0, len(frame) - 1), label="keep")])
    else:
        damaged = bytearray(frame + data.draw(st.binary(min_size=1, max_size=8), label="extra"))
    broken = [*chain[:index], bytes(damaged), *chain[index + 1 :]]
    # decode() checks the state it returns, not each frame's checksum: damage
    # that leaves the state unchanged (a frame_check bit, say) still yields
    # the right state; anything else raises. iter_versions() checks every frame.
    try:
        latest = decode(broken)
    except DecodeError:
        pass
    else:
        assert damage == "flip" and latest == store.expected[version - 1]
    with pytest.raises(DecodeError):
        list(iter_versions(broken))


@given(operations=ops.filter(lambda o: sum(op in ("replace", "merge") for op, _ in o) >= 2))
def test_frames_out_of_order_or_on_the_wrong_base_are_refused(operations) -> None:
    store = run_ops(ChainPolicy(max_depth=64, max_decode_cost_ratio=1e9), operations)
    frames = store.frames
    if len(frames) < 2:
        return
    rng = random.Random(len(frames))
    # Dropping a middle frame or swapping two frames breaks a base link.
    if len(frames) >= 3 and frame_kind(frames[1]) is not FrameKind.FULL:
        chain = store.chain_of(len(frames))
        if len(chain) >= 3:
            with pytest.raises(DecodeError):
                decode([chain[0], *chain[2:]])
            i = rng.randrange(1, len(chain) - 1)
            swapped = [*chain]
            swapped[i], swapped[i + 1] = swapped[i + 1], swapped[i]
            with pytest.raises(DecodeError):
                decode(swapped)
    # A chain cannot start with a delta frame.
    delta = next((f for f in frames if frame_kind(f) is not FrameKind.FULL), None)
    if delta is not None:
        with pytest.raises(DecodeError):
            decode([delta])


@pytest.mark.parametrize(
    ("fmt", "error", "message"),
    [
        (1, ChainLinkError, "expects a base of 360 bytes with xxh3"),  # format 1 records the base's xxh3
        (2, ChecksumError, r"state of version 2 \(378 bytes\) fails its xxh3 check"),  # format 2: the result's
    ],
)
def test_a_frame_applied_to_another_sessions_base_is_refused(fmt: int, error: type[DecodeError], message: str) -> None:
    a = ChainEncoder(policy=GOLDEN_POLICY, format_version=fmt)
    b = ChainEncoder(policy=GOLDEN_POLICY, format_version=fmt)
    a_full = a.replace(b"state of session a" * 20).data
    b.replace(b"state of session b" * 20)
    b_delta = b.replace(b"state of session b" * 21).data
    for run in (lambda: decode([a_full, b_delta]), lambda: list(iter_versions([a_full, b_delta]))):
        with pytest.raises(error, match=message):
            run()


def test_errors_share_one_root() -> None:
    assert issubclass(DecodeError, CodecError)
