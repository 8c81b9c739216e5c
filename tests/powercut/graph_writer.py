"""A LangGraph graph checkpointed by the embedded saver, for the power cut tests, run as a program:
``python -m tests.powercut.graph_writer DATA_DIR``.

Two threads of the process run the graph, each on a LangGraph thread of its own, turn after turn with
``durability="sync"`` (each checkpoint put before the graph goes on). After each turn it prints one line of
JSON: the thread, its head's checkpoint id and how many turns it has run (its items are then
``items_after(turns)``); a line printed is a turn every checkpoint of which the saver acknowledged. It runs
until killed.
"""

from __future__ import annotations

import json
import operator
import sys
import threading
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

from ckpt.sidecar.langgraph import CkptSaver

THREADS = ("a", "b")


class State(TypedDict):
    items: Annotated[list[str], operator.add]


def _answer(state: State) -> dict[str, Any]:
    # A few hundred bytes a turn, so that the items outgrow a page within the run.
    return {"items": [f"answer {len(state['items'])} " + "x" * 300]}


def items_after(turns: int) -> list[str]:
    """A thread's items once it has run ``turns`` turns."""
    items: list[str] = []
    for turn in range(turns):
        items.append(f"question {turn}")
        items += _answer({"items": items})["items"]
    return items


def graph(saver: CkptSaver) -> Any:
    builder = StateGraph(State)
    builder.add_node("answer", _answer)
    builder.add_edge(START, "answer")
    builder.add_edge("answer", END)
    return builder.compile(checkpointer=saver)


def _run(app: Any, thread: str, out: threading.Lock) -> None:
    config = {"configurable": {"thread_id": thread}}
    turn = 0
    while True:
        app.invoke({"items": [f"question {turn}"]}, config, durability="sync")
        turn += 1
        head = app.get_state(config).config["configurable"]["checkpoint_id"]
        with out:
            print(json.dumps({"thread": thread, "checkpoint_id": head, "turns": turn}), flush=True)


def main(data_dir: str) -> None:
    saver = CkptSaver.embedded(data_dir)
    app, out = graph(saver), threading.Lock()
    runs = [threading.Thread(target=_run, args=(app, t, out), daemon=True) for t in THREADS]
    for run in runs:
        run.start()
    for run in runs:
        run.join()


if __name__ == "__main__":
    main(sys.argv[1])
