"""A real LangGraph ``StateGraph`` run once per thread with a recording saver, so that every saver measured
is handed the same calls: each step's ``put(config, checkpoint, metadata, new_versions)`` and
``put_writes(config, writes, task_id, task_path)``, as LangGraph's own loop made them.

The graph is the shape of a tool-using agent: an ``agent`` node appends the next assistant (or user)
message, a ``tools`` node the next tool result, each super-step one message, looping until the thread's
messages are used up. The messages are the shared trajectories' (bench/trajectories.py), read in place,
as LangChain messages (``add_messages``): thread *k* reads the corpus from its *k*-th trajectory on,
trajectory after trajectory, so that threads differ and each is as long as asked.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypedDict

# Imported for real, not for type checking only: LangGraph resolves its nodes' and routes' annotations.
from langchain_core.messages import AnyMessage
from langchain_core.runnables import RunnableConfig

from .trajectories import Trajectory

if TYPE_CHECKING:
    from langgraph.checkpoint.base import ChannelVersions, Checkpoint, CheckpointMetadata

#: Checkpoints LangGraph writes beyond one per message: the input's (step -1) and the one after it.
_EXTRA_CHECKPOINTS = 1


@dataclass(frozen=True, slots=True)
class Put:
    config: RunnableConfig
    checkpoint: Checkpoint
    metadata: CheckpointMetadata
    new_versions: ChannelVersions


@dataclass(frozen=True, slots=True)
class PutWrites:
    config: RunnableConfig
    writes: tuple[tuple[str, Any], ...]
    task_id: str
    task_path: str


Call = Put | PutWrites


@dataclass(frozen=True, slots=True)
class ThreadRecord:
    """One thread's calls, in the order LangGraph made them, and what its last checkpoint holds."""

    thread_id: str
    calls: tuple[Call, ...]
    messages: int

    @property
    def puts(self) -> int:
        return sum(isinstance(c, Put) for c in self.calls)

    @property
    def last_checkpoint_id(self) -> str:
        return next(c.checkpoint["id"] for c in reversed(self.calls) if isinstance(c, Put))

    @property
    def latest_config(self) -> dict[str, Any]:
        """The config that reads the thread's latest checkpoint (no id), made anew at each use."""
        return {"configurable": {"thread_id": self.thread_id, "checkpoint_ns": ""}}


def to_langchain(raw: dict[str, Any], index: int, thread_id: str) -> AnyMessage:
    """A corpus message as the LangChain message an agent holds (ids fixed, so every run is the same)."""
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    mid = f"{thread_id}-{index}"
    content = raw.get("content") or ""
    role = raw.get("role")
    if role == "assistant":
        calls = []
        for n, call in enumerate(raw.get("tool_calls") or ()):
            fn = call.get("function", {})
            try:
                args = json.loads(fn.get("arguments") or "{}")
            except json.JSONDecodeError:
                args = {"input": fn.get("arguments")}
            if not isinstance(args, dict):
                args = {"input": args}
            calls.append({"name": fn.get("name") or "tool", "args": args, "id": call.get("id") or f"{mid}-{n}"})
        return AIMessage(content=content, tool_calls=calls, id=mid)
    if role == "tool":
        return ToolMessage(
            content=content, tool_call_id=raw.get("tool_call_id") or f"{mid}-call", name=raw.get("name"), id=mid
        )
    if role == "system":
        return SystemMessage(content=content, id=mid)
    return HumanMessage(content=content, id=mid)


def feed(corpus: Sequence[Trajectory], thread: int, messages: int) -> list[dict[str, Any]]:
    """Thread ``thread``'s ``messages`` corpus messages: trajectory after trajectory from its own on."""
    if not corpus or not any(t.messages for t in corpus):
        raise ValueError("the trajectory corpus holds no messages")
    out: list[dict[str, Any]] = []
    i = thread
    while len(out) < messages:
        out += corpus[i % len(corpus)].messages[: messages - len(out)]
        i += 1
    return out


def _graph(feeds: dict[str, list[AnyMessage]], checkpointer: Any) -> Any:
    from langgraph.graph import START, StateGraph
    from langgraph.graph.message import add_messages

    # The functional form: its annotation is an object, not a string LangGraph would resolve in this
    # module's globals, where add_messages (imported here, with LangGraph) is not.
    State = TypedDict("State", {"messages": Annotated[list[AnyMessage], add_messages]})  # noqa: UP013

    def next_message(state: Any, config: RunnableConfig) -> dict[str, list[AnyMessage]]:
        mine = feeds[config["configurable"]["thread_id"]]
        return {"messages": [mine[len(state["messages"])]]}

    def route(state: Any, config: RunnableConfig) -> Literal["agent", "tools", "__end__"]:
        mine = feeds[config["configurable"]["thread_id"]]
        done = len(state["messages"])
        if done >= len(mine):
            return "__end__"  # langgraph.graph.END, spelled as the Literal names it
        return "tools" if mine[done].type == "tool" else "agent"

    graph = StateGraph(State)
    graph.add_node("agent", next_message)
    graph.add_node("tools", next_message)
    graph.add_conditional_edges(START, route)
    graph.add_conditional_edges("agent", route)
    graph.add_conditional_edges("tools", route)
    return graph.compile(checkpointer=checkpointer)


def _plain(config: RunnableConfig) -> RunnableConfig:
    """What a saver reads of a config: its ``configurable`` (less the run's own ``__pregel_*`` objects:
    callbacks, the runtime) and ``metadata``, as plain dicts that every replay may share."""
    configurable = {k: v for k, v in config.get("configurable", {}).items() if not k.startswith("__")}
    return {"configurable": configurable, "metadata": dict(config.get("metadata") or {})}


def _recorder() -> Any:
    """An InMemorySaver (the graph needs a working saver to run) that keeps a copy of every write call."""
    from langgraph.checkpoint.memory import InMemorySaver

    class Recorder(InMemorySaver):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[Call] = []

        def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            put = Put(_plain(config), *copy.deepcopy((checkpoint, metadata, new_versions)))
            self.calls.append(put)
            return super().put(config, checkpoint, metadata, new_versions)

        def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
            self.calls.append(PutWrites(_plain(config), tuple(copy.deepcopy(list(writes))), task_id, task_path))
            super().put_writes(config, writes, task_id, task_path)

    return Recorder()


def record(corpus: Sequence[Trajectory], *, threads: int, steps: int, prefix: str) -> list[ThreadRecord]:
    """Run the graph once per thread (``steps`` checkpoints each) and return each thread's calls."""
    if steps < 2:
        raise ValueError(f"--steps must be at least 2 (LangGraph's input checkpoint and one step), got {steps}")
    ids = [f"{prefix}-{k}" for k in range(threads)]
    messages = steps - _EXTRA_CHECKPOINTS
    feeds = {
        tid: [to_langchain(m, i, tid) for i, m in enumerate(feed(corpus, k, messages))] for k, tid in enumerate(ids)
    }
    out = []
    for tid in ids:
        recorder = _recorder()
        graph = _graph(feeds, recorder)
        config: RunnableConfig = {"configurable": {"thread_id": tid}, "recursion_limit": steps + 10}
        graph.invoke({"messages": [feeds[tid][0]]}, config, durability="sync")
        rec = ThreadRecord(tid, tuple(recorder.calls), messages)
        if rec.puts != steps:
            raise AssertionError(f"the graph wrote {rec.puts} checkpoints for {tid}, {steps} expected")
        out.append(rec)
    return out
