"""Kinds of graph state the savers keep as LangGraph's own savers do: a DeltaChannel's value through
``prune``, the graph's own types under strict msgpack (the ``with_allowlist`` copy ``compile()`` makes),
and ``bytearray`` values, in a channel, a list channel and a pending write. Embedded and through a real
sidecar."""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph._internal import _serde as graph_serde
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde import _msgpack
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, StateGraph
from pydantic import BaseModel

from ckpt.sidecar.langgraph import AsyncCkptSaver, CkptSaver

FORMS = ["embedded", "sidecar"]


def thread(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id}}


@contextmanager
def opened(form: str, request: pytest.FixtureRequest, tmp_path: Path, **options: Any) -> Iterator[CkptSaver]:
    """A CkptSaver of ``form``: embedded, or on a real sidecar."""
    if form == "embedded":
        with CkptSaver.embedded(tmp_path / "embedded", **options) as embedded:
            yield embedded
    else:
        with CkptSaver(request.getfixturevalue("sidecar").unix_target, **options) as client:
            yield client


@pytest.fixture(params=FORMS)
def saver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CkptSaver]:
    with opened(request.param, request, tmp_path) as subject:
        yield subject


# -- DeltaChannel and prune ------------------------------------------------------------------------


def extend(state: list[str], writes: Any) -> list[str]:
    out = list(state)
    for w in writes:
        out.extend(w if isinstance(w, list) else [w])
    return out


class Deltas(TypedDict):
    log: Annotated[list[str], DeltaChannel(extend, snapshot_frequency=1000)]
    n: int


class Snapshots(TypedDict):
    log: Annotated[list[str], DeltaChannel(extend, snapshot_frequency=1)]
    n: int


class Plain(TypedDict):
    log: Annotated[list[str], operator.add]
    n: int


def counting(state: Any) -> Any:
    """A graph of four steps, each adding ``x<n>`` to ``log``."""
    builder = StateGraph(state)
    builder.add_node("step", lambda s: {"log": [f"x{s['n']}"], "n": s["n"] + 1})
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", lambda s: END if s["n"] >= 4 else "step")
    return builder


RUN = ["start", "x0", "x1", "x2", "x3"]


def test_keep_latest_refuses_a_thread_whose_delta_channel_is_rebuilt_from_older_checkpoints(
    saver: CkptSaver,
) -> None:
    delta = counting(Deltas).compile(checkpointer=saver)
    plain = counting(Plain).compile(checkpointer=saver)
    assert delta.invoke({"log": ["start"], "n": 0}, thread("delta"))["log"] == RUN
    assert plain.invoke({"log": ["start"], "n": 0}, thread("plain"))["log"] == RUN
    before = {t: len(list(saver.list(thread(t)))) for t in ("delta", "plain")}
    assert before["delta"] > 1 and before["plain"] > 1

    with pytest.raises(NotImplementedError, match="DeltaChannel") as refused:
        saver.prune(["plain", "delta"])
    assert "'delta'" in str(refused.value) and "'plain'" not in str(refused.value)

    # Nothing pruned, of either thread: the delta channel's value is whole and the run goes on from it.
    assert {t: len(list(saver.list(thread(t)))) for t in ("delta", "plain")} == before
    assert delta.get_state(thread("delta")).values["log"] == RUN
    assert delta.invoke({"log": ["more"], "n": 0}, thread("delta"))["log"] == [*RUN, "more", *RUN[1:]]
    saver.prune(["plain"])
    assert len(list(saver.list(thread("plain")))) == 1
    assert plain.get_state(thread("plain")).values["log"] == RUN


def test_keep_latest_prunes_a_thread_whose_latest_checkpoint_snapshots_its_delta_channel(saver: CkptSaver) -> None:
    graph = counting(Snapshots).compile(checkpointer=saver)
    graph.invoke({"log": ["start"], "n": 0}, thread("snapshot"))
    assert "counters_since_delta_snapshot" not in graph.get_state(thread("snapshot")).metadata

    saver.prune(["snapshot"])

    assert len(list(saver.list(thread("snapshot")))) == 1
    assert graph.get_state(thread("snapshot")).values["log"] == RUN
    assert graph.invoke({"log": ["more"], "n": 0}, thread("snapshot"))["log"] == [*RUN, "more", *RUN[1:]]


# -- strict msgpack --------------------------------------------------------------------------------


class Item(BaseModel):
    name: str
    qty: int


class ItemState(TypedDict):
    item: Item


def bumping() -> Any:
    builder = StateGraph(ItemState)
    builder.add_node("bump", lambda s: {"item": Item(name=s["item"].name, qty=s["item"].qty + 1)})
    builder.add_edge(START, "bump")
    builder.add_edge("bump", END)
    return builder


@pytest.fixture
def strict_serde(monkeypatch: pytest.MonkeyPatch) -> JsonPlusSerializer:
    """LANGGRAPH_STRICT_MSGPACK=true (which LangGraph reads once, at import), and the serializer it makes
    the savers' default: the built-in safe types only, and those compile() adds for a graph."""
    monkeypatch.setattr(_msgpack, "STRICT_MSGPACK_ENABLED", True)
    monkeypatch.setattr(graph_serde, "STRICT_MSGPACK_ENABLED", True)
    return JsonPlusSerializer()


@pytest.mark.parametrize("form", FORMS)
def test_a_strict_msgpack_graph_reads_its_own_types_back(
    form: str, strict_serde: JsonPlusSerializer, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    with opened(form, request, tmp_path, serde=strict_serde) as saver:
        graph = bumping().compile(checkpointer=saver)
        graph.invoke({"item": Item(name="a", qty=1)}, thread("strict"))
        assert graph.get_state(thread("strict")).values["item"] == Item(name="a", qty=2)
        assert graph.invoke({}, thread("strict"))["item"] == Item(name="a", qty=3)
        # The saver itself keeps the strict allowlist: the graph's type is not on it.
        latest = saver.get_tuple(thread("strict"))
        assert latest is not None and latest.checkpoint["channel_values"]["item"] == {"name": "a", "qty": 3}


@pytest.mark.parametrize("form", FORMS)
def test_a_strict_msgpack_graph_reads_its_own_types_back_with_the_async_saver(
    form: str, strict_serde: JsonPlusSerializer, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    async def run() -> list[Any]:
        async with (
            AsyncCkptSaver.embedded(tmp_path / "embedded", serde=strict_serde)
            if form == "embedded"
            else AsyncCkptSaver(request.getfixturevalue("sidecar").unix_target, serde=strict_serde)
        ) as saver:
            graph = bumping().compile(checkpointer=saver)
            await graph.ainvoke({"item": Item(name="a", qty=1)}, thread("strict"))
            read = (await graph.aget_state(thread("strict"))).values["item"]
            return [read, (await graph.ainvoke({}, thread("strict")))["item"]]

    assert asyncio.run(run()) == [Item(name="a", qty=2), Item(name="a", qty=3)]


# -- bytearray -------------------------------------------------------------------------------------


class Bytes(TypedDict):
    blob: bytearray
    parts: Annotated[list[Any], operator.add]


def growing() -> Any:
    builder = StateGraph(Bytes)
    builder.add_node("grow", lambda s: {"blob": s["blob"] + b"!", "parts": [bytearray(b"p"), b"q"]})
    builder.add_edge(START, "grow")
    builder.add_edge("grow", END)
    return builder


def typed(value: Any) -> Any:
    """``value`` with the type of everything in it, to compare bytes and bytearray apart."""
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value), [typed(v) for v in value]
    return type(value), value


def test_bytearray_values_round_trip_as_with_the_memory_saver(saver: CkptSaver) -> None:
    results = []
    for subject in (InMemorySaver(), saver):
        graph = growing().compile(checkpointer=subject)
        state = graph.invoke({"blob": bytearray(b"ab"), "parts": [bytearray(b"o")]}, thread("bytes"))
        again = graph.invoke({"parts": []}, thread("bytes"))
        checkpoint = subject.get_tuple(thread("bytes"))
        assert checkpoint is not None
        subject.put_writes(checkpoint.config, [("blob", bytearray(b"w")), ("parts", [bytearray(b"v")])], "task")
        pending = subject.get_tuple(thread("bytes")).pending_writes  # type: ignore[union-attr]
        results.append(typed([state, again, pending]))
    memory, ours = results
    assert ours == memory
    assert ours[1][1]["blob"] == (bytearray, bytearray(b"ab!!"))
