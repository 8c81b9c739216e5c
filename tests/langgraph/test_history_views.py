"""A listing's views of a namespace's states, made oldest first with a state that extends the one before
parsed from its new bytes alone (``views_of``), are each the view of the whole state parsed (``view_of``),
the oracle: MERGE chains of random patches (channels replaced, a Typed's fields set one at a time,
writes_after_seq set to 0 or not at all, deleted ids, Items cutting and growing lists, an entry past its
list's end), states written whole between them, and states equal to the one before."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt.langgraph.v1 import records_pb2
from ckpt.sidecar.langgraph.records import decode_step
from ckpt.sidecar.langgraph.views import View, view_of, views_of

_CHANNELS = ["messages", "log", "turn"]
_short = st.binary(max_size=6)
_typed = st.builds(
    records_pb2.Typed,
    type=st.sampled_from(["msgpack", "json", "", "__items__"]),
    data=_short,
)


@st.composite
def _patch(draw: Any) -> bytes:
    step = records_pb2.Step()
    if draw(st.booleans()):
        step.checkpoint_id = draw(st.sampled_from(["a", "b", "c"]))
    if draw(st.booleans()):
        step.parent_checkpoint_id = draw(st.sampled_from(["a", "b", ""]))
    for field in ("checkpoint", "metadata"):
        if draw(st.booleans()):  # a Typed with one field or both: merged field by field
            typed = getattr(step, field)
            if draw(st.booleans()):
                typed.type = draw(st.sampled_from(["msgpack", "json"]))
            if draw(st.booleans()):
                typed.data = draw(_short)
    for k in draw(st.lists(st.sampled_from(_CHANNELS), max_size=3)):
        step.channels[k].CopyFrom(draw(_typed))
    step.deleted_checkpoint_ids.extend(draw(st.lists(st.sampled_from(["x", "y"]), max_size=2)))
    for _ in range(draw(st.integers(0, 3))):
        entry = step.items.add(channel=draw(st.sampled_from(_CHANNELS[:2])), start=draw(st.integers(0, 6)))
        entry.values.extend(draw(st.lists(_typed, max_size=3)))
    choice = draw(st.sampled_from(["unset", "zero", "set"]))
    if choice != "unset":
        step.writes_after_seq = 0 if choice == "zero" else draw(st.integers(1, 2**40))
    return step.SerializeToString()


@st.composite
def _histories(draw: Any) -> list[bytes]:
    states: list[bytes] = []
    for _ in range(draw(st.integers(1, 12))):
        how = draw(st.sampled_from(["extend", "extend", "extend", "whole", "same"]))
        patch = draw(_patch())
        if not states or how == "whole":
            states.append(patch)
        elif how == "same":
            states.append(states[-1])
        else:
            states.append(states[-1] + patch)
    return states


def _oracle(state: bytes) -> View | type[ValueError]:
    try:
        return view_of(decode_step(state))
    except ValueError:
        return ValueError


def _chained(states: list[bytes]) -> list[View | type[ValueError]]:
    """views_of over ``states``; where it raises, the views before the state that raised, then the error."""
    for end in range(1, len(states) + 1):
        try:
            views_of(states[:end])
        except ValueError:
            return [*views_of(states[: end - 1]), ValueError]
    return list(views_of(states))


@settings(max_examples=400, deadline=None)
@given(_histories())
def test_views_made_oldest_first_are_the_views_of_the_whole_states(states: list[bytes]) -> None:
    want = [_oracle(s) for s in states]
    if ValueError in want:
        want = want[: want.index(ValueError) + 1]
    assert _chained(states) == want


def test_an_extending_states_elements_are_those_of_the_view_before() -> None:
    first = records_pb2.Step(checkpoint_id="a")
    first.items.add(channel="messages", start=0).values.add(type="msgpack", data=b"m0")
    second = records_pb2.Step(checkpoint_id="b", parent_checkpoint_id="a")
    second.items.add(channel="messages", start=1).values.add(type="msgpack", data=b"m1")
    older = first.SerializeToString()
    views = views_of([older, older + second.SerializeToString()])
    assert views[1].lists["messages"] == [("msgpack", b"m0"), ("msgpack", b"m1")]
    assert views[1].lists["messages"][0] is views[0].lists["messages"][0]  # parsed once, shared
    assert views[0].lists["messages"] == [("msgpack", b"m0")]  # the older view left as it was
    assert views[1].checkpoint_id == "b" and views[1].parent_checkpoint_id == "a"


def test_an_entry_past_its_lists_end_is_refused_as_a_whole_read_refuses_it() -> None:
    first = records_pb2.Step(checkpoint_id="a")
    first.items.add(channel="messages", start=0).values.add(type="msgpack", data=b"m0")
    bad = records_pb2.Step(checkpoint_id="b")
    bad.items.add(channel="messages", start=3).values.add(type="msgpack", data=b"m3")
    with pytest.raises(ValueError, match="channel 'messages''s items start at 3, past its 1 elements"):
        views_of([first.SerializeToString(), first.SerializeToString() + bad.SerializeToString()])
