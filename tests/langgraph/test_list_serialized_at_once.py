"""A step continuing the head serializes a list channel in one call (``Elements.dumps_after``) and takes the
elements the head holds from the list's bytes: the head's own when those bytes show them unchanged, else cut
out of them; what ``Elements.dumps`` gives element by element, or nothing (None) when an element is not
msgpack or the bytes do not end with the added elements', so that ``dumps`` serializes each."""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import START, MessagesState, StateGraph

from ckpt.sidecar.langgraph import CkptSaver
from ckpt.sidecar.langgraph.elements import Elements, msgpack_array_header
from ckpt.sidecar.langgraph.views import loads_all
from tests.support import Sidecar

PLAIN = Elements(JsonPlusSerializer())


@pytest.fixture
def serialized(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Each value JsonPlusSerializer.dumps_typed is called with, in order, while the test runs."""
    calls: list[Any] = []
    dumps = JsonPlusSerializer.dumps_typed

    def counted(self: JsonPlusSerializer, obj: Any) -> tuple[str, bytes]:
        calls.append(obj)
        return dumps(self, obj)

    monkeypatch.setattr(JsonPlusSerializer, "dumps_typed", counted)
    return calls


def _conversation(n: int) -> list[Any]:
    kinds = (
        lambda i: HumanMessage(content=f"question {i}", id=f"h{i}"),
        lambda i: AIMessage(content="", id=f"a{i}", tool_calls=[{"name": "ls", "args": {"n": i}, "id": f"c{i}"}]),
        lambda i: ToolMessage(content=f"file-{i}.txt\n" * 3, tool_call_id=f"c{i}", id=f"t{i}"),
    )
    return [kinds[i % 3](i) for i in range(n)]


@pytest.mark.parametrize("count", [3, 15, 16, 300, 70_000])  # array headers of 1, 3 and 5 bytes
def test_a_list_continuing_the_head_gives_the_pairs_dumps_gives(count: int) -> None:
    values: list[Any] = [{"i": i} for i in range(count)] if count > 300 else _conversation(count)
    known = PLAIN.dumps(values[: count - 1])
    pairs = PLAIN.dumps_after(values, known)
    assert pairs == PLAIN.dumps(values)
    assert pairs is not None and all(a is b for a, b in zip(pairs, known, strict=False))  # the head's own pairs


def test_the_array_header_is_that_of_the_serializer() -> None:
    for count in (0, 1, 15, 16, 65_535, 65_536):
        _, data = JsonPlusSerializer().dumps_typed([None] * count)
        assert data.startswith(msgpack_array_header(count))
        assert len(data) == len(msgpack_array_header(count)) + count  # one byte per nil


def test_an_element_the_head_holds_changed_in_place_is_cut_from_the_lists_bytes(
    serialized: list[Any],
) -> None:
    values = _conversation(9)
    known = PLAIN.dumps(values)
    values[3].content = "question X"  # as long as it was: only its bytes tell
    values.append(HumanMessage(content="next", id="n"))
    serialized.clear()
    pairs = PLAIN.dumps_after(values, known)
    assert sorted(type(obj).__name__ for obj in serialized) == ["HumanMessage", "list"]  # the list, the added one
    assert pairs is not None and pairs == PLAIN.dumps(values)
    assert pairs[3] != known[3] and pairs[2] == known[2]


@pytest.mark.parametrize("held", [None, b"raw", bytearray(b"raw")], ids=["none", "bytes", "bytearray"])
def test_a_held_element_replaced_by_one_that_is_not_msgpack_is_serialized_one_by_one(held: Any) -> None:
    known = PLAIN.dumps(["a", "b"])
    assert PLAIN.dumps_after([held, "b", "c"], known) is None


@pytest.mark.parametrize(
    ("values", "known_count"),
    [
        pytest.param(["a", "b", "c"], 3, id="shorter-than-the-head"),
        pytest.param(["a", "b"], 1, id="head-of-one"),
        pytest.param(["a", "b", None], 2, id="none-added"),
        pytest.param(["a", "b", b"raw"], 2, id="bytes-added"),
        pytest.param(["a", "b", bytearray(b"raw")], 2, id="bytearray-added"),
        pytest.param([None, "b", "c"], 2, id="none-held"),
        pytest.param([b"raw", "b", "c"], 2, id="bytes-held"),
    ],
)
def test_elements_that_are_not_msgpack_are_serialized_one_by_one(values: list[Any], known_count: int) -> None:
    known = PLAIN.dumps(values[:known_count])
    if known_count == 3:
        known = [*known, ("msgpack", b"\xa1d")]  # a head longer than the list
    assert PLAIN.dumps_after(values, known) is None


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def _serializes(value: Any) -> bool:
    try:
        JsonPlusSerializer().dumps_typed(value)
    except TypeError:
        return False
    return True


@pytest.mark.parametrize("at", [0, 2], ids=["held", "added"])
def test_an_element_nested_to_the_depth_limit_is_serialized_one_by_one(at: int) -> None:
    # The deepest element msgpack takes alone: inside the list, one level deeper, it refuses it.
    deepest = next(d for d in range(1, 1000) if not _serializes([_nested(d)]))
    assert _serializes(_nested(deepest))
    values: list[Any] = ["a", "b", "c"]
    values[at] = _nested(deepest)
    assert PLAIN.dumps_after(values, PLAIN.dumps(values[:2])) is None
    assert loads_all(JsonPlusSerializer(), PLAIN.dumps(values)) == values


class _Tagged(JsonPlusSerializer):
    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        type_, data = super().dumps_typed(obj)
        return type_, data + b"!"


@pytest.mark.parametrize(
    "serde",
    [
        pytest.param(_Tagged(), id="subclass-with-its-own-dumps"),
        pytest.param(EncryptedSerializer.from_pycryptodome_aes(key=b"k" * 32), id="encrypted"),
    ],
)
def test_other_serializers_serialize_one_by_one(serde: Any) -> None:
    codec = Elements(serde)
    values = ["a", "b", "c"]
    assert codec.dumps_after(values, codec.dumps(values[:2])) is None


def test_a_list_whose_bytes_end_otherwise_than_its_added_elements_is_serialized_one_by_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dumps = JsonPlusSerializer.dumps_typed

    def last_byte_flipped(self: JsonPlusSerializer, obj: Any) -> tuple[str, bytes]:
        type_, data = dumps(self, obj)
        return (type_, data[:-1] + bytes((data[-1] ^ 1,))) if isinstance(obj, list) else (type_, data)

    monkeypatch.setattr(JsonPlusSerializer, "dumps_typed", last_byte_flipped)
    codec = Elements(JsonPlusSerializer())
    values = ["a", "b", "c"]
    assert codec.dumps_after(values, codec.dumps(values[:2])) is None


class Opaque:
    """No msgpack form: JsonPlusSerializer(pickle_fallback=True) pickles it, and a list holding it whole."""


def test_a_pickled_element_is_serialized_one_by_one() -> None:
    codec = Elements(JsonPlusSerializer(pickle_fallback=True))
    values: list[Any] = ["a", "b", Opaque()]
    assert codec.dumps(values)[2][0] == "pickle"
    assert codec.dumps_after(values, codec.dumps(values[:2])) is None


class Items(TypedDict):
    items: Annotated[list[Any], operator.add]


@pytest.mark.parametrize("where", ["embedded", "sidecar"])
def test_a_list_pickled_reads_back_as_in_memory_saver_reads_it(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # An int past 64 bits has no msgpack form: JsonPlusSerializer(pickle_fallback=True) pickles the list
    # whole, so the tuple and the bytearray in it read back as such, not as msgpack's list and bytes.
    def node(state: Items) -> dict[str, Any]:
        return {"items": [(1, 2), bytearray(b"ba"), 2**70, "text", None]}

    def values(saver: Any) -> Any:
        graph: Any = StateGraph(Items)
        app = graph.add_node("n", node).add_edge(START, "n").compile(checkpointer=saver)
        config: Any = {"configurable": {"thread_id": "pickled"}}
        app.invoke({"items": [("first", 0)]}, config, durability="sync")
        return [s.values for s in app.get_state_history(config)]

    serde = JsonPlusSerializer(pickle_fallback=True)
    expected = values(InMemorySaver(serde=serde))
    assert expected[0]["items"][1] == (1, 2)
    if where == "embedded":
        with CkptSaver.embedded(tmp_path / "data", serde=serde) as saver:
            assert values(saver) == expected
        return
    sidecar: Sidecar = request.getfixturevalue("sidecar")
    with CkptSaver(sidecar.unix_target, serde=serde) as saver:
        assert values(saver) == expected
    with CkptSaver(sidecar.unix_target, serde=serde) as saver:  # read back, not remembered
        graph: Any = StateGraph(Items)
        app = graph.add_node("n", node).add_edge(START, "n").compile(checkpointer=saver)
        assert [s.values for s in app.get_state_history({"configurable": {"thread_id": "pickled"}})] == expected


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=40),
    st.binary(max_size=20),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    values=st.lists(_values, min_size=2, max_size=30),
    cut=st.integers(min_value=2, max_value=30),
    change=st.none() | st.tuples(st.integers(min_value=0, max_value=29), _values),
)
def test_dumps_after_gives_what_dumps_gives_or_nothing(
    values: list[Any], cut: int, change: tuple[int, Any] | None
) -> None:
    cut = min(cut, len(values))
    known = PLAIN.dumps(values[:cut])
    if change is not None:  # the head held another element there
        index, other = change
        values = list(values)
        values[index % cut] = other
    pairs = PLAIN.dumps_after(values, known)
    expected = PLAIN.dumps(values)
    if pairs is not None:
        assert pairs == expected
    elif all(t == "msgpack" for t, _ in expected) and expected[:cut] == known:
        pytest.fail("dumps_after refused a list continuing its head whose elements are all msgpack")


def test_a_step_continuing_the_head_serializes_its_conversation_once(tmp_path: Path, serialized: list[Any]) -> None:
    messages = _conversation(60)
    with CkptSaver.embedded(tmp_path / "data") as saver:
        config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        for step in (59, 60):
            checkpoint = empty_checkpoint()
            checkpoint["id"] = str(uuid6(clock_seq=step))
            checkpoint["channel_values"] = {"messages": messages[:step]}
            checkpoint["channel_versions"] = {"messages": step}
            serialized.clear()
            config = saver.put(config, checkpoint, {"step": step}, {"messages": step})
        # The second step: the list once, the message it added, the checkpoint and its metadata.
        assert sum(obj is messages[59] for obj in serialized) == 1
        assert len(serialized) <= 4, [type(obj).__name__ for obj in serialized]
        got = saver.get_tuple(config)
        assert got is not None and got.checkpoint["channel_values"]["messages"] == messages


def _edits_the_first_message(state: MessagesState) -> dict[str, Any]:
    first = state["messages"][0]
    text = str(first.content)
    first.content = text[1:] + text[:1]  # in place, as long as it was: only its bytes tell
    return {"messages": [AIMessage(content=f"answer {len(state['messages'])}", id=f"a{len(state['messages'])}")]}


def _app(saver: Any) -> Any:
    graph: Any = StateGraph(MessagesState)
    return graph.add_node("reply", _edits_the_first_message).add_edge(START, "reply").compile(checkpointer=saver)


CONFIG: Any = {"configurable": {"thread_id": "edited"}}


def _run(saver: Any) -> list[Any]:
    app = _app(saver)
    for turn in range(4):
        # Each put done before the next node runs: with "async", one still under way when a node changes a
        # message may serialize it changed, as PostgresSaver's and SqliteSaver's do.
        app.invoke({"messages": [HumanMessage(content=f"question {turn}", id=f"h{turn}")]}, CONFIG, durability="sync")
    return _history(saver)


def _history(saver: Any) -> list[Any]:
    return [(s.values, s.metadata, s.parent_config is None) for s in _app(saver).get_state_history(CONFIG)]


@pytest.mark.parametrize("where", ["embedded", "sidecar"])
def test_a_message_changed_in_place_is_stored_as_in_memory_saver_keeps_it(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    expected = _run(InMemorySaver())
    # Each turn's reply stores the first message as it was changed by then: five forms in the history.
    assert len({values["messages"][0].content for values, _, _ in expected if values.get("messages")}) == 5
    if where == "embedded":
        with CkptSaver.embedded(tmp_path / "data") as saver:
            assert _run(saver) == expected
        with CkptSaver.embedded(tmp_path / "data") as saver:  # read back from the store, not remembered
            assert _history(saver) == expected
        return
    sidecar: Sidecar = request.getfixturevalue("sidecar")
    with CkptSaver(sidecar.unix_target) as saver:
        assert _run(saver) == expected
    with CkptSaver(sidecar.unix_target) as saver:
        assert _history(saver) == expected
