"""Compaction of MERGE states leaves the message unchanged, also for what a later version of the schema
knows: a state holding unknown fields (a closed enum's new value, a new oneof member, anywhere in the
message) is kept as written, since re-serializing moves unknown fields after the known ones."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt.codec import ChainEncoder, FrameKind, compact, decode
from tests.golden.cases import GOLDEN_POLICY
from tests.support import evolving_state_class

V1, V2 = evolving_state_class(1), evolving_state_class(2)
Sub2 = V2.DESCRIPTOR.fields_by_name["sub"].message_type._concrete_class
BLUE = 99  # known to version 2 only


@pytest.mark.parametrize(
    "unknown",
    [
        V2(color=BLUE),
        V2(onew=5),
        V2(sub=Sub2(c=BLUE)),
        V2(osub=Sub2(a=1, c=BLUE)),
        V2(cmap={"k": BLUE}),
        V2(note="x", sub=Sub2(a=2)).SerializeToString() + b"\x08\x05",  # a new field number would read so too
        b"\x22\x04\x10\x63\x08\x01",  # sub {c: 99, a: 1}: the unknown before a known field
        b"\x25\x01\x02\x03\x04",  # field 4 (a message) sent as a fixed32
    ],
    ids=["enum", "oneof-member", "sub-enum", "oneof-sub-enum", "map-entry", "new-field", "sub-order", "wire-type"],
)
def test_a_state_holding_unknown_fields_is_kept_as_written(unknown: Any) -> None:
    patch = unknown if isinstance(unknown, bytes) else unknown.SerializeToString()
    overwritten = [V2(color=1, note="n" * 50).SerializeToString() for _ in range(3)]
    for state in (patch + b"".join(overwritten), b"".join(overwritten) + patch):
        assert compact(state, V1) == state
    # Without the unknown fields the same state compacts.
    assert compact(b"".join(overwritten), V1) == overwritten[0]


def test_the_unknown_oneof_member_and_enum_value_keep_their_place_when_the_schema_learns_them() -> None:
    # A newer client's write before the type knows BLUE and onew, then writes of RED and ostr.
    writes = [V2(color=BLUE, onew=5).SerializeToString()]
    writes += [V2(color=1, ostr="x", note=f"{i}" * 400).SerializeToString() for i in range(1, 6)]
    enc = ChainEncoder(policy=replace(GOLDEN_POLICY, max_depth=2), compact_message_type=V1)
    want = V2()
    kinds = []
    for write in writes:
        kinds.append(enc.merge(write).kind)
        enc.commit()
        want.MergeFromString(write)
        got = V2.FromString(enc.state)
        assert got == want
        if len(kinds) > 1:
            assert (got.color, got.WhichOneof("choice")) == (1, "ostr")
    assert kinds.count(FrameKind.FULL) > 1  # chain starts, where compaction runs


def _patches() -> st.SearchStrategy[bytes]:
    colors = st.sampled_from([0, 1, BLUE])

    @st.composite
    def one(draw: st.DrawFn) -> bytes:
        msg = V2()
        if draw(st.booleans()):
            msg.color = draw(colors)
        choice = draw(st.sampled_from(["", "ostr", "osub", "onew"]))
        if choice == "ostr":
            msg.ostr = draw(st.text(max_size=3))
        elif choice == "osub":
            msg.osub.c = draw(colors)
        elif choice == "onew":
            msg.onew = draw(st.integers(0, 9))
        if draw(st.booleans()):
            msg.sub.c = draw(colors)
        if draw(st.booleans()):
            msg.sub.a = draw(st.integers(0, 9))
        for key in draw(st.lists(st.sampled_from("ab"), max_size=2)):
            msg.cmap[key] = draw(colors)
        msg.note = "n" * draw(st.integers(0, 60))
        return bytes(msg.SerializeToString())

    return one()


@settings(max_examples=200)
@given(st.lists(_patches(), min_size=1, max_size=8), st.integers(1, 3))
def test_every_compacted_version_parses_with_the_later_schema_as_its_writes_merged_in_order(
    writes: list[bytes], max_depth: int
) -> None:
    enc = ChainEncoder(
        policy=replace(GOLDEN_POLICY, max_depth=max_depth), compact_message_type=V1, compact_min_saving_ratio=0.0
    )
    want = V2()
    frames = []
    for write in writes:
        frames.append(enc.merge(write))
        enc.commit()
        want.MergeFromString(write)
        assert V2.FromString(enc.state) == want
    start = max(i for i, frame in enumerate(frames) if frame.kind is FrameKind.FULL)
    assert V2.FromString(decode([frame.data for frame in frames[start:]])) == want
