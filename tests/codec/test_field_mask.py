"""Field-masked reads agree with protobuf's own FieldMask.MergeMessage on the parsed state (the oracle),
on Checkpoint states built by concatenated MERGE patches and on a proto2 type with what a byte scan could
get wrong: real oneofs, closed enums with unknown values, packed fields, groups, fields of a wrong wire type."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, field_mask_pb2, message_factory, text_format
from hypothesis import given
from hypothesis import strategies as st

from ckpt.codec import FieldMaskError, MaskedStateError, compile_mask
from ckpt.v1 import checkpoint_pb2 as pb
from tests.codec.strategies import checkpoints, serialize

_MASKTEST = """
name: "masktest.proto" package: "masktest" syntax: "proto2"
enum_type {
  name: "Color" value { name: "RED" number: 0 } value { name: "GREEN" number: 1 } value { name: "BLUE" number: 2 }
}
message_type {
  name: "Inner"
  field { name: "a" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING }
  field { name: "b" number: 2 label: LABEL_OPTIONAL type: TYPE_INT32 }
  field { name: "c" number: 3 label: LABEL_REPEATED type: TYPE_STRING }
  field { name: "deeper" number: 4 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".masktest.Inner" }
  field { name: "color" number: 5 label: LABEL_OPTIONAL type: TYPE_ENUM type_name: ".masktest.Color" }
}
message_type {
  name: "Outer"
  field { name: "n" number: 1 label: LABEL_OPTIONAL type: TYPE_INT32 }
  field { name: "s" number: 2 label: LABEL_OPTIONAL type: TYPE_STRING }
  field { name: "inner" number: 3 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".masktest.Inner" }
  field { name: "inners" number: 4 label: LABEL_REPEATED type: TYPE_MESSAGE type_name: ".masktest.Inner" }
  field { name: "nums" number: 5 label: LABEL_REPEATED type: TYPE_INT32 options { packed: true } }
  field { name: "by_id" number: 6 label: LABEL_REPEATED type: TYPE_MESSAGE type_name: ".masktest.Outer.ByIdEntry" }
  field { name: "color" number: 7 label: LABEL_OPTIONAL type: TYPE_ENUM type_name: ".masktest.Color" }
  field { name: "colors" number: 8 label: LABEL_REPEATED type: TYPE_ENUM type_name: ".masktest.Color" }
  field {
    name: "pick_msg" number: 9 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".masktest.Inner" oneof_index: 0
  }
  field { name: "pick_str" number: 10 label: LABEL_OPTIONAL type: TYPE_STRING oneof_index: 0 }
  field { name: "pick_num" number: 11 label: LABEL_OPTIONAL type: TYPE_INT64 oneof_index: 0 }
  field { name: "g" number: 12 label: LABEL_OPTIONAL type: TYPE_GROUP type_name: ".masktest.Outer.G" }
  field { name: "other" number: 14 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".masktest.Inner" }
  field { name: "fixed" number: 15 label: LABEL_OPTIONAL type: TYPE_FIXED64 }
  field {
    name: "pick_color" number: 16 label: LABEL_OPTIONAL type: TYPE_ENUM type_name: ".masktest.Color" oneof_index: 0
  }
  field { name: "tags" number: 17 label: LABEL_REPEATED type: TYPE_MESSAGE type_name: ".masktest.Outer.TagsEntry" }
  nested_type {
    name: "TagsEntry" options { map_entry: true }
    field { name: "key" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING }
    field { name: "value" number: 2 label: LABEL_OPTIONAL type: TYPE_ENUM type_name: ".masktest.Color" }
  }
  nested_type {
    name: "ByIdEntry" options { map_entry: true }
    field { name: "key" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING }
    field { name: "value" number: 2 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".masktest.Inner" }
  }
  nested_type { name: "G" field { name: "x" number: 13 label: LABEL_OPTIONAL type: TYPE_INT32 } }
  oneof_decl { name: "choice" }
}
"""


def _outer_class() -> Any:
    pool = descriptor_pool.DescriptorPool()
    pool.Add(text_format.Parse(_MASKTEST, descriptor_pb2.FileDescriptorProto()))
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("masktest.Outer"))


Outer = _outer_class()
Inner = Outer.DESCRIPTOR.fields_by_name["inner"].message_type._concrete_class

_OUTER_PATHS = [
    "n", "s", "inner", "inners", "nums", "by_id", "color", "colors", "pick_msg", "pick_str", "pick_num", "g",
    "other", "fixed", "pick_color", "tags", "inner.a", "inner.c", "inner.deeper", "inner.deeper.b",
    "inner.color", "pick_msg.a", "pick_msg.deeper.c", "g.x", "other.deeper",
]  # fmt: skip
_CHECKPOINT_PATHS = [
    "handoff", "plan", "status", "step", "goal", "model", "messages", "tool_cache", "working_memory",
    "current_step_id", "handoff.next", "handoff.decided", "model.temperature", "model.seed", "schema_version",
    "discoveries",
]  # fmt: skip


def _oracle(message_class: Any, state: bytes, paths: list[str]) -> bytes:
    out = message_class()
    field_mask_pb2.FieldMask(paths=paths).MergeMessage(message_class.FromString(state), out)
    return bytes(out.SerializeToString(deterministic=True))


def _masked(message_class: Any, state: bytes, paths: list[str]) -> bytes:
    masked = compile_mask(message_class, paths).apply(state)
    return bytes(message_class.FromString(masked).SerializeToString(deterministic=True))


_small = st.text(max_size=6)


@st.composite
def inners(draw: st.DrawFn, depth: int = 0) -> Any:
    msg = Inner()
    if draw(st.booleans()):
        msg.a = draw(_small)
    if draw(st.booleans()):
        msg.b = draw(st.integers(-(2**31), 2**31 - 1))
    msg.c.extend(draw(st.lists(_small, max_size=2)))
    if depth < 2 and draw(st.booleans()):
        msg.deeper.CopyFrom(draw(inners(depth + 1)))
    if draw(st.booleans()):
        msg.color = draw(st.integers(0, 2))
    return msg


def _tag(number: int, wire: int) -> bytes:
    key = number << 3 | wire
    out = bytearray()
    while key >= 0x80:
        out.append(key & 0x7F | 0x80)
        key >>= 7
    out.append(key)
    return bytes(out)


@st.composite
def outer_patches(draw: st.DrawFn) -> bytes:
    """One MERGE patch of Outer, sometimes followed by what a parser keeps as unknown fields: a closed
    enum's unknown value (a oneof member's, a map entry's), a known field number with a wire type it does
    not read."""
    msg = Outer()
    if draw(st.booleans()):
        msg.n = draw(st.integers(-5, 5))
    if draw(st.booleans()):
        msg.s = draw(_small)
    if draw(st.booleans()):
        msg.inner.CopyFrom(draw(inners()))
    for _ in range(draw(st.integers(0, 2))):
        msg.inners.append(draw(inners()))
    msg.nums.extend(draw(st.lists(st.integers(-3, 300), max_size=3)))
    for key in draw(st.lists(st.sampled_from("xyz"), max_size=2)):
        msg.by_id[key].CopyFrom(draw(inners()))
    if draw(st.booleans()):
        msg.color = draw(st.integers(0, 2))
    msg.colors.extend(draw(st.lists(st.integers(0, 2), max_size=2)))
    choice = draw(st.sampled_from(["", "pick_msg", "pick_str", "pick_num", "pick_color"]))
    if choice == "pick_msg":
        msg.pick_msg.CopyFrom(draw(inners()))
    elif choice == "pick_str":
        msg.pick_str = draw(_small)
    elif choice == "pick_num":
        msg.pick_num = draw(st.integers(0, 9))
    elif choice == "pick_color":
        msg.pick_color = draw(st.integers(0, 2))
    for key in draw(st.lists(st.sampled_from("xy"), max_size=2)):
        msg.tags[key] = draw(st.integers(0, 2))
    if draw(st.booleans()):
        msg.g.x = draw(st.integers(0, 9))
    if draw(st.booleans()):
        msg.other.CopyFrom(draw(inners()))
    if draw(st.booleans()):
        msg.fixed = draw(st.integers(0, 2**64 - 1))
    patch = bytes(msg.SerializeToString())
    for number, value in draw(
        st.lists(st.sampled_from([(7, 9), (8, 7), (16, 9), (17, 9), (1, None), (3, None), (15, None)]), max_size=2)
    ):
        if value is not None and number == 17:  # a map entry whose value the closed enum lacks
            patch += _tag(number, 2) + b"\x05\x0a\x01x\x10" + bytes([value])
        elif value is not None:  # an unknown value of a closed enum
            patch += _tag(number, 0) + bytes([value])
        elif number == 15:  # fixed64 sent as a varint
            patch += _tag(number, 0) + b"\x05"
        else:  # an int32 or a message sent as a fixed32
            patch += _tag(number, 5) + b"\x01\x02\x03\x04"
    return patch


@given(st.lists(outer_patches(), max_size=4), st.lists(st.sampled_from(_OUTER_PATHS), max_size=5))
def test_a_masked_concatenation_of_patches_equals_protobufs_merge_message(
    patches: list[bytes], paths: list[str]
) -> None:
    state = b"".join(patches)
    assert _masked(Outer, state, paths) == _oracle(Outer, state, paths)


@given(
    st.lists(checkpoints(partial=True), min_size=1, max_size=5),
    st.lists(st.sampled_from(_CHECKPOINT_PATHS), max_size=4),
)
def test_a_masked_checkpoint_built_by_merges_equals_protobufs_merge_message(
    patches: list[pb.Checkpoint], paths: list[str]
) -> None:
    for cp in patches[1::2]:  # handoffs merged field by field across patches
        cp.handoff.next = f"next {cp.step}"
    for cp in patches[::3]:
        cp.handoff.decided = "decided"
    state = b"".join(serialize(cp) for cp in patches)
    assert _masked(pb.Checkpoint, state, paths) == _oracle(pb.Checkpoint, state, paths)


def test_later_occurrences_win_merge_and_append() -> None:
    state = b"".join(
        serialize(cp)
        for cp in [
            pb.Checkpoint(step=1, handoff=pb.Handoff(next="a", decided="x"), plan={"s1": pb.PlanStep(title="one")}),
            pb.Checkpoint(goal="long history", messages=[pb.Message(content="m" * 1000)]),
            pb.Checkpoint(step=2, handoff=pb.Handoff(next="b"), plan={"s1": pb.PlanStep(title="uno")}),
        ]
    )
    got = pb.Checkpoint.FromString(compile_mask(pb.Checkpoint, ["handoff", "plan", "step"]).apply(state))
    assert got == pb.Checkpoint(
        step=2, handoff=pb.Handoff(next="b", decided="x"), plan={"s1": pb.PlanStep(title="uno")}
    )
    nested = pb.Checkpoint.FromString(compile_mask(pb.Checkpoint, ["handoff.decided"]).apply(state))
    assert nested == pb.Checkpoint(handoff=pb.Handoff(decided="x"))


_UNKNOWN_COLOR = b"\x80\x01\x09"  # pick_color = 9: Color has no 9, so a parser keeps it as an unknown field


@pytest.mark.parametrize(
    ("state", "paths", "expected"),
    [
        (Outer(pick_msg=Inner(b=5)).SerializeToString() + _UNKNOWN_COLOR, ["pick_msg"], Outer(pick_msg=Inner(b=5))),
        (Outer(pick_str="s").SerializeToString() + _UNKNOWN_COLOR, ["pick_str", "n"], Outer(pick_str="s")),
        (Outer(pick_color=2).SerializeToString() + _UNKNOWN_COLOR, ["pick_color"], Outer(pick_color=2)),
        (Outer(pick_num=1).SerializeToString() + _UNKNOWN_COLOR, ["pick_color"], Outer()),
        (Outer(pick_num=1).SerializeToString() + b"\x80\x01" + b"\xff" * 9 + b"\x01", ["pick_num"], Outer(pick_num=1)),
        (Outer(pick_num=1).SerializeToString() + b"\x80\x01\x81\x80\x80\x80\x10", ["pick_num"], Outer()),
        (Outer(tags={"a": 1}).SerializeToString() + b"\x8a\x01\x05\x0a\x01b\x10\x09", ["tags"], Outer(tags={"a": 1})),
    ],
    ids=["msg", "str", "enum", "none", "negative", "low-32-bits", "map"],
)
def test_a_closed_enums_unknown_value_neither_sets_its_oneof_nor_enters_a_map(
    state: bytes, paths: list[str], expected: Any
) -> None:
    assert _masked(Outer, state, paths) == _oracle(Outer, state, paths) == expected.SerializeToString()


def test_a_oneof_member_set_later_clears_the_masked_one() -> None:
    state = Outer(pick_msg=Inner(a="first")).SerializeToString() + Outer(pick_num=3).SerializeToString()
    assert compile_mask(Outer, ["pick_msg"]).apply(state) == b""
    state += Outer(pick_msg=Inner(b=2)).SerializeToString()
    assert Outer.FromString(compile_mask(Outer, ["pick_msg"]).apply(state)) == Outer(pick_msg=Inner(b=2))


@pytest.mark.parametrize(
    ("paths", "refusal"),
    [
        (["handoff.summary"], r"field_mask path 'handoff\.summary': ckpt\.v1\.Handoff has no field 'summary'"),
        (["nope"], r"field_mask path 'nope': ckpt\.v1\.Checkpoint has no field 'nope'"),
        (["plan.s1"], r"field_mask path 'plan\.s1': ckpt\.v1\.Checkpoint\.plan is not a singular message field"),
        (["messages.content"], r"ckpt\.v1\.Checkpoint\.messages is not a singular message field"),
        (["goal.x"], r"ckpt\.v1\.Checkpoint\.goal is not a singular message field"),
        ([""], r"field_mask path '' is malformed"),
        (["handoff."], r"field_mask path 'handoff\.' is malformed"),
        (["a..b"], r"field_mask path 'a\.\.b' is malformed"),
        (["handOff-note"], r"field_mask path 'handOff-note' is malformed"),
        (["x"] * 1001, r"field_mask has 1001 paths; the limit is 1000"),
    ],
)
def test_a_bad_path_is_refused_naming_it(paths: list[str], refusal: str) -> None:
    with pytest.raises(FieldMaskError, match=refusal):
        compile_mask(pb.Checkpoint, paths)


def test_a_path_deeper_than_protobuf_parses_is_refused_naming_the_limit() -> None:
    state = Outer()
    deepest = state.inner
    for _ in range(99):  # masktest.Inner nested 100 deep: as deep as protobuf parses
        deepest = deepest.deeper
    deepest.a = "bottom"
    data = state.SerializeToString()
    path = ".".join(["inner", *["deeper"] * 99, "a"])
    assert _masked(Outer, data, [path]) == _oracle(Outer, data, [path]) == data
    for depth in (101, 2000):
        path = ".".join(["inner", *["deeper"] * (depth - 1), "a"])
        with pytest.raises(
            FieldMaskError,
            match=rf"^field_mask path 'inner\.deeper\.[a-z.]+'\.\.\. \({len(path)} characters\) goes {depth} messages"
            r" deep; the limit is 100 \(protobuf parses messages nested no deeper\)$",
        ):
            compile_mask(Outer, [path])


def test_a_path_into_a_field_that_does_not_parse_as_its_type_names_the_field() -> None:
    # inner (field 3) holding bytes that are no masktest.Inner: what a field number given another type leaves.
    state = Outer(n=1).SerializeToString() + _tag(3, 2) + b"\x02\xff\xff"
    assert compile_mask(Outer, ["inner", "n"]).apply(state) == state  # kept whole: not parsed
    with pytest.raises(
        MaskedStateError,
        match=r"^masktest\.Outer's field 3 \(inner\) does not parse as declared \(4 bytes\): ",
    ):
        compile_mask(Outer, ["inner.a", "n"]).apply(state)


def test_paths_are_canonical() -> None:
    mask = compile_mask(pb.Checkpoint, ["plan", "handoff.next", "handoff", "plan", "model.seed", "model.top_p"])
    assert mask.paths == ("handoff", "model.seed", "model.top_p", "plan")


def test_a_closed_enums_unknown_values_stay_out_as_they_do_when_parsed() -> None:
    # proto2 enums are closed: a value the enum lacks goes to the unknown fields, which a mask drops.
    state = Outer(color=1, colors=[2]).SerializeToString() + _tag(7, 0) + b"\x09" + _tag(8, 0) + b"\x07"
    for paths, expected in ((["color"], Outer(color=1)), (["colors", "n"], Outer(colors=[2]))):
        assert _masked(Outer, state, paths) == _oracle(Outer, state, paths) == expected.SerializeToString()
