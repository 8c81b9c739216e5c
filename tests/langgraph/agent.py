"""A LangGraph agent for the graph tests: a scripted chat model, a ToolNode with two tools and a dangerous
one that waits for a human's approval (``interrupt()``), and, run as a program, an agent process.

``python -m tests.langgraph.agent TARGET THREAD STEP...``, TARGET a sidecar's address or
``embedded:DIR`` for the in-process store; each STEP runs in turn on one saver and prints one line:

- ``ask=TEXT``: a question on the thread, from its head; ``resume=ANSWER``: ``Command(resume=ANSWER)``. Each
  prints ``interrupted <the interrupts' values as JSON>`` when the graph stopped for approval, else
  ``final <the state as JSON>`` (see ``plain``); or ``conflict <message>`` on a CheckpointConflictError.
- ``wait``: prints ``waiting`` and reads stdin until it closes (the tests SIGKILL the process there).
- ``gate=DIR``: from then on, before an approval returns, the process creates ``DIR/entered`` and waits
  for ``DIR/go``: a test holds it inside a superstep, after it read the thread's head and before its put.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolCall, messages_to_dict
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command, interrupt

from ckpt.sidecar.langgraph import CheckpointConflictError, CkptSaver

QUESTION = "Tidy up the scratch directory."
DANGEROUS = "delete_tree"


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def list_files(path: str) -> str:
    """The files under a path."""
    return f"{path}: a.txt, b.txt"


@tool
def delete_tree(path: str) -> str:
    """Delete a directory and everything in it."""
    return f"deleted {path}"


TOOLS = [add, list_files, delete_tree]


def _call(name: str, call_id: str, **args: Any) -> ToolCall:
    return ToolCall(name=name, args=args, id=call_id, type="tool_call")


#: The model's replies, in order: the n-th AI message of a thread is SCRIPT[n]. Two tools at once, one
#: more, the dangerous one, a summary; then the reply to any later question.
SCRIPT = [
    AIMessage("", id="ai-0", tool_calls=[_call("add", "c0", a=2, b=3), _call("list_files", "c1", path="/scratch")]),
    AIMessage("", id="ai-1", tool_calls=[_call("add", "c2", a=5, b=8)]),
    AIMessage("", id="ai-2", tool_calls=[_call(DANGEROUS, "c3", path="/scratch")]),
    AIMessage("Done: /scratch is gone.", id="ai-3"),
    AIMessage("Nothing else to do.", id="ai-4"),
]


class State(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    #: The human's answers to the approval, in order.
    approvals: list[str]
    #: A large value, for the tests that move tens of MB through one channel.
    blob: bytes


def scripted_model(state: State) -> dict[str, Any]:
    """A deterministic chat model: its reply depends only on how many replies the thread already holds, so
    a process that resumes a thread continues the same conversation."""
    n = sum(isinstance(m, AIMessage) for m in state["messages"])
    return {"messages": [SCRIPT[min(n, len(SCRIPT) - 1)]]}


def route(state: State) -> str:
    last = state["messages"][-1]
    if not isinstance(last, AIMessage) or not last.tool_calls:
        return END
    return "approve" if any(c["name"] == DANGEROUS for c in last.tool_calls) else "tools"


def no_gate() -> None:
    pass


def build(checkpointer: Any, gate: Callable[[], None] = no_gate) -> CompiledStateGraph[Any, Any, Any, Any]:
    """The agent: model -> (approval when a call is dangerous) -> tools -> model, until the model answers."""

    def approve(state: State) -> Command[Any]:
        last = state["messages"][-1]
        assert isinstance(last, AIMessage)
        calls = [c for c in last.tool_calls if c["name"] == DANGEROUS]
        answer = interrupt({"approve": [c["args"] for c in calls]})
        gate()
        approvals = [*state.get("approvals", []), answer]
        if answer == "yes":
            return Command(goto="tools", update={"approvals": approvals})
        refused = AIMessage("I will not delete anything.", id=f"refused-{last.id}")
        return Command(goto=END, update={"approvals": approvals, "messages": [refused]})

    g = StateGraph(State)
    g.add_node("model", scripted_model)
    g.add_node("approve", approve)
    g.add_node("tools", ToolNode(TOOLS))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, ["approve", "tools", END])
    g.add_edge("tools", "model")
    return g.compile(checkpointer=checkpointer)


def config(thread: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread}}


def question(text: str = QUESTION) -> State:
    return {"messages": [HumanMessage(text, id=f"human-{text}")]}


def plain(state: dict[str, Any]) -> dict[str, Any]:
    """A state as JSON can hold it: messages as dicts without the ids LangGraph generates (a ToolNode's
    ToolMessages get random ones), bytes by their length."""
    out: dict[str, Any] = {}
    for key, value in state.items():
        if key == "messages":
            out[key] = [_without_generated_id(m) for m in messages_to_dict(value)]
        elif isinstance(value, bytes):
            out[key] = {"bytes": len(value)}
        else:
            out[key] = value
    return out


def _without_generated_id(message: dict[str, Any]) -> dict[str, Any]:
    if message["type"] == "tool":
        message = {**message, "data": {**message["data"], "id": None}}
    return message


def interrupts(result: dict[str, Any]) -> list[Any]:
    return [i.value for i in result.get("__interrupt__", ())]


@contextmanager
def open_saver(target: str) -> Iterator[BaseCheckpointSaver[Any]]:
    saver = (
        CkptSaver.embedded(target.removeprefix("embedded:")) if target.startswith("embedded:") else CkptSaver(target)
    )
    with saver:
        yield saver


def file_gate(directory: Path) -> Callable[[], None]:
    def gate() -> None:
        (directory / "entered").touch()
        deadline = time.monotonic() + 60
        while not (directory / "go").exists():
            assert time.monotonic() < deadline, "never let go"
            time.sleep(0.005)

    return gate


def main(argv: Sequence[str]) -> None:
    target, thread, *steps = argv
    gate = no_gate
    with open_saver(target) as saver:
        for step in steps:
            name, _, arg = step.partition("=")
            if name == "gate":
                gate = file_gate(Path(arg))
                continue
            if name == "wait":
                print("waiting", flush=True)
                sys.stdin.read()
                continue
            if name not in ("ask", "resume"):
                raise SystemExit(f"unknown step {step!r}")
            graph = build(saver, gate)
            try:
                result = graph.invoke(question(arg) if name == "ask" else Command(resume=arg), config(thread))
            except CheckpointConflictError as exc:
                print("conflict", exc, flush=True)
                continue
            if waiting := interrupts(result):
                print("interrupted", json.dumps(waiting), flush=True)
            else:
                print("final", json.dumps(plain(result)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
