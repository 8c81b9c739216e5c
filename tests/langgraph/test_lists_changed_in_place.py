"""A node that changes a list channel in place (appends to it, sets an element) without returning it makes
no change LangGraph sees: the checkpoint's ``new_versions`` leaves the channel out, while the list it holds
is longer or other than the head's. The saver kept digests of that list while storing the head's: a later
step that wrote the channel was stored against the wrong elements, a silently wrong state, or an entry past
the stored list's end, after which no read of the thread succeeded ("channel 'lst''s items start at 3,
past its 2 elements"). Each graph runs beside InMemorySaver, whose reads these match."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypedDict

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.graph import END, START, StateGraph

from ckpt.sidecar.langgraph import CkptSaver
from tests.support import Sidecar, start_sidecar


class State(TypedDict, total=False):
    lst: list[str]
    k: int


def _graph(b: Callable[[Any], Any], c: Callable[[Any], Any]) -> Any:
    def a(s: Any) -> Any:
        return {"lst": ["a1", "a2"], "k": 1}

    builder: Any = StateGraph(State)
    return (
        builder.add_node("a", a)
        .add_node("b", b)
        .add_node("c", c)
        .add_edge(START, "a")
        .add_edge("a", "b")
        .add_edge("b", "c")
        .add_edge("c", END)
    )


def _edit_in_place(s: State) -> State:
    s["lst"][1] = "X"
    s["lst"].append("b")
    return {"k": 2}


def _append_in_place(s: State) -> State:
    s["lst"].append("b-inplace")
    return {"k": 2}


GRAPHS = {
    # c writes the list cut back: stored against the in-place list's digests, the cut kept the old element.
    "edited-then-cut": _graph(_edit_in_place, lambda s: {"lst": s["lst"][:2], "k": 3}),
    # c writes the list grown: its new entry was stored past the stored list's end.
    "appended-then-grown": _graph(_append_in_place, lambda s: {"lst": [*s["lst"], "c"], "k": 3}),
}


def _reads(saver: Any, graph: Any, thread_id: str, interrupt_after: list[str]) -> list[Any]:
    app = graph.compile(checkpointer=saver, interrupt_after=interrupt_after)
    config: Any = {"configurable": {"thread_id": thread_id}}
    out = [app.invoke({"k": 0}, config, durability="sync")]
    if interrupt_after:
        out.append(app.invoke(None, config, durability="sync"))  # resumed after the pause
    out.append(app.get_state(config).values)
    out.append([snapshot.values for snapshot in app.get_state_history(config)])
    out.append(app.invoke({"k": 0}, config, durability="sync"))  # the thread goes on
    return out


@pytest.fixture(params=["embedded", "sidecar"])
def make_saver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Any]]:
    if request.param == "embedded":
        with CkptSaver.embedded(tmp_path / "embedded") as saver:
            yield lambda: saver
        return
    sidecar: Sidecar = request.getfixturevalue("sidecar")
    savers: list[CkptSaver] = []

    def fresh() -> CkptSaver:  # a saver of its own for each read: as a new process would read
        savers.append(CkptSaver(sidecar.unix_target))
        return savers[-1]

    yield fresh
    for saver in savers:
        saver.close()


@pytest.mark.parametrize("interrupt_after", [[], ["a"]], ids=["straight", "paused-after-a"])
@pytest.mark.parametrize("shape", list(GRAPHS))
def test_a_list_changed_in_place_is_stored_as_in_memory_saver_keeps_it(
    make_saver: Callable[[], Any], shape: str, interrupt_after: list[str]
) -> None:
    thread_id = f"{shape}-{len(interrupt_after)}"
    expected = _reads(InMemorySaver(), GRAPHS[shape], thread_id, interrupt_after)
    assert _reads(make_saver(), GRAPHS[shape], thread_id, interrupt_after) == expected
    # Read again by another saver (in process, the same store's): what was stored, not what one remembers.
    app = GRAPHS[shape].compile(checkpointer=make_saver())
    assert app.get_state({"configurable": {"thread_id": thread_id}}).values == expected[-1]


def test_a_list_changed_in_place_at_a_step_written_whole_stays_readable(tmp_path: Path) -> None:
    """A step written whole (here: the cut-off elements of another list past the allowance) serializes the
    lists it did not change as they are now: their digests must be those of what it wrote, or the next
    step's list is stored against elements the store does not hold."""

    class Two(TypedDict, total=False):
        big: list[str]
        lst: list[str]

    def fill(s: Two) -> Two:
        return {"big": [f"m{i}" for i in range(300)], "lst": ["a1", "a2"]}

    def cut(s: Two) -> Two:  # 300 elements cut off: the next step is written whole
        return {"big": []}

    def in_place(s: Two) -> Two:
        s["lst"][1] = "X"
        return {"big": ["x"]}

    def grow(s: Two) -> Two:
        return {"lst": ["a1", "a2", "c"]}

    graph: Any = StateGraph(Two)
    nodes: list[tuple[str, Any]] = [("fill", fill), ("cut", cut), ("in_place", in_place), ("grow", grow)]
    for name, node in nodes:
        graph.add_node(name, node)
    graph.add_edge(START, "fill").add_edge("fill", "cut").add_edge("cut", "in_place")
    graph.add_edge("in_place", "grow").add_edge("grow", END)
    config: Any = {"configurable": {"thread_id": "whole"}}
    with CkptSaver.embedded(tmp_path / "data") as saver:
        out = graph.compile(checkpointer=saver).invoke({}, config, durability="sync")
    in_memory = graph.compile(checkpointer=InMemorySaver())
    memory = in_memory.invoke({}, config, durability="sync")
    assert out == memory == {"big": ["x"], "lst": ["a1", "a2", "c"]}
    with CkptSaver.embedded(tmp_path / "data") as reopened:
        app = graph.compile(checkpointer=reopened)
        assert app.get_state(config).values == memory
        # The step written whole keeps the list as stored, not as the node changed it in place.
        history = [snapshot.values for snapshot in app.get_state_history(config)]
        assert history == [snapshot.values for snapshot in in_memory.get_state_history(config)]
        assert len(list(app.get_state_history(config))) == 6


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
@pytest.mark.parametrize("on", ["embedded", "sidecar"])
def test_a_branch_keeps_the_stored_values_of_the_channels_it_did_not_change(
    tmp_path: Path, on: str, encrypted: bool
) -> None:
    """A replay from an earlier checkpoint puts the fork's checkpoint (new_versions empty) while the next node
    already runs: its channel values are the live objects, which that node may be changing in place. The
    fork holds the parent's values as stored, as InMemorySaver reads them from the versions it names."""
    serde = EncryptedSerializer.from_pycryptodome_aes(key=b"k" * 16) if encrypted else None
    config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}

    def at(checkpoint_id: str) -> Any:
        return {"configurable": {**config["configurable"], "checkpoint_id": checkpoint_id}}

    def checkpoint(checkpoint_id: str, lst: list[str], k: int, versions: dict[str, int]) -> Any:
        made: Any = empty_checkpoint()
        made.update(id=checkpoint_id, channel_values={"lst": lst, "k": k}, channel_versions=versions)
        return made

    def run(saver: Any) -> list[Any]:
        saver.put(config, checkpoint("1", ["x"], 1, {"lst": 1, "k": 1}), {"step": 0}, {"lst": 1, "k": 1})
        saver.put(at("1"), checkpoint("2", ["x", "y"], 2, {"lst": 2, "k": 2}), {"step": 1}, {"lst": 2, "k": 2})
        # The fork of "1": its list changed in place by the node running after it, as the put reads it.
        saver.put(at("1"), checkpoint("3", ["x", "changed"], 1, {"lst": 1, "k": 1}), {"step": 1}, {})
        saver.put(at("3"), checkpoint("4", ["x", "z"], 1, {"lst": 3, "k": 1}), {"step": 2}, {"lst": 3})
        return [saver.get_tuple(at(i)).checkpoint["channel_values"] for i in ("3", "4")]

    expected = run(InMemorySaver())
    assert expected == [{"lst": ["x"], "k": 1}, {"lst": ["x", "z"], "k": 1}]
    if on == "embedded":
        with CkptSaver.embedded(tmp_path / "data", serde=serde) as saver:
            assert run(saver) == expected
        with CkptSaver.embedded(tmp_path / "data", serde=serde) as fresh:
            assert [fresh.get_tuple(at(i)).checkpoint["channel_values"] for i in ("3", "4")] == expected  # type: ignore[union-attr]
        return
    sidecar = start_sidecar(tmp_path / "data")
    try:
        with CkptSaver(sidecar.unix_target, serde=serde) as saver:
            assert run(saver) == expected
        with CkptSaver(sidecar.unix_target, serde=serde) as fresh:
            assert [fresh.get_tuple(at(i)).checkpoint["channel_values"] for i in ("3", "4")] == expected  # type: ignore[union-attr]
    finally:
        assert sidecar.stop() == 0, sidecar.log()
