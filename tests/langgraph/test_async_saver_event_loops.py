"""AsyncCkptSaver used on one event loop after another (a program that calls asyncio.run more than once):
its async methods and its sync ones (LangGraph's sync APIs from a worker thread) work on each."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph

from ckpt.sidecar.langgraph import AsyncCkptSaver


class Count(TypedDict):
    n: int


def test_the_sync_methods_follow_the_saver_to_a_new_event_loop(tmp_path: Path) -> None:
    graph = StateGraph(Count).add_node("inc", lambda s: {"n": s["n"] + 1})
    graph.add_edge(START, "inc").add_edge("inc", END)
    saver = AsyncCkptSaver.embedded(tmp_path / "data")
    app = graph.compile(checkpointer=saver)

    async def turn(thread_id: str) -> Any:
        config: Any = {"configurable": {"thread_id": thread_id}}
        await app.ainvoke({"n": 0}, config)
        return (await asyncio.to_thread(app.get_state, config)).values

    try:
        assert asyncio.run(turn("first")) == {"n": 1}
        assert asyncio.run(turn("second")) == {"n": 1}  # a new loop: the sync call is handed to it
        assert asyncio.run(turn("first")) == {"n": 1}
    finally:
        asyncio.run(saver.aclose())


def test_the_sync_methods_work_from_a_worker_thread_before_any_async_call(tmp_path: Path) -> None:
    """A graph given a new AsyncCkptSaver and run with its sync API on a worker thread (asyncio.to_thread)
    failed ("need its event loop running") until one async method had been awaited: the saver learnt its
    loop only then. Made on the loop, or entered there, it knows it."""
    graph = StateGraph(Count).add_node("inc", lambda s: {"n": s["n"] + 1})
    graph.add_edge(START, "inc").add_edge("inc", END)
    config: Any = {"configurable": {"thread_id": "t"}}

    async def made_on_the_loop() -> Any:
        saver = AsyncCkptSaver.embedded(tmp_path / "made")
        try:
            app: Any = graph.compile(checkpointer=saver)
            return await asyncio.to_thread(app.invoke, {"n": 0}, config)
        finally:
            await saver.aclose()

    made_outside = AsyncCkptSaver.embedded(tmp_path / "entered")

    async def entered_on_the_loop() -> Any:
        async with made_outside as saver:
            app: Any = graph.compile(checkpointer=saver)
            return await asyncio.to_thread(app.invoke, {"n": 0}, config)

    assert asyncio.run(made_on_the_loop()) == {"n": 1}
    assert asyncio.run(entered_on_the_loop()) == {"n": 1}
