"""Real LangGraph graphs on CkptSaver against a real sidecar: an agent (a scripted model, a ToolNode, an
``interrupt()`` for approval) killed at its interrupt and resumed by a new process; its history against
what InMemorySaver records for the same run; replay and update_state on earlier checkpoints; a subgraph's
namespace; a state of tens of MB; two processes racing one superstep; the embedded saver across a restart.

The graph and the agent program are in tests/langgraph/agent.py."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, StateSnapshot

from ckpt.sidecar.client import CheckpointClient
from ckpt.sidecar.langgraph import AsyncCkptSaver, CkptSaver
from tests.client.support import wait_for
from tests.langgraph.agent import (
    QUESTION,
    SCRIPT,
    State,
    build,
    config,
    interrupts,
    open_saver,
    plain,
    question,
)
from tests.support import ROOT, Sidecar

APPROVAL = [{"approve": [{"path": "/scratch"}]}]


# -- agent processes --------------------------------------------------------------------------------


@contextmanager
def agent(target: str, thread: str, *steps: str) -> Iterator[subprocess.Popen[str]]:
    """An agent process running ``steps`` (see agent.py); killed if the test leaves it running."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.langgraph.agent", target, thread, *steps],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield process
    finally:
        process.kill()
        process.wait(30)
        for pipe in (process.stdin, process.stdout):
            assert pipe is not None
            pipe.close()


def outcome(process: subprocess.Popen[str]) -> tuple[str, Any]:
    """The next line the agent prints: ("interrupted" | "final", its JSON) or ("conflict" | "waiting", text)."""
    assert process.stdout is not None
    kind, _, rest = process.stdout.readline().rstrip("\n").partition(" ")
    assert kind, f"the agent ended (exit {process.wait(30)})"
    return kind, json.loads(rest) if kind in ("interrupted", "final") else rest


def run_agent(target: str, thread: str, *steps: str) -> list[tuple[str, Any]]:
    """Run an agent process to its end; what each step printed."""
    with agent(target, thread, *steps) as process:
        outcomes = [outcome(process) for step in steps if not step.startswith("gate=")]
        assert process.wait(60) == 0
    return outcomes


def start_and_kill(target: str, thread: str) -> None:
    """An agent process asks the question, stops for approval, and is SIGKILLed there."""
    with agent(target, thread, f"ask={QUESTION}", "wait") as process:
        assert outcome(process) == ("interrupted", APPROVAL)
        assert outcome(process) == ("waiting", "")
        process.kill()
        assert process.wait(30) == -signal.SIGKILL


def waiting_for_approval(target: str, thread: str) -> bool:
    """What a human's approval screen reads, from a new saver: the thread stopped before the approval,
    with the question the interrupt asked."""
    with open_saver(target) as saver:
        state = build(saver).get_state(config(thread))
    assert state.next == ("approve",)
    assert [i.value for i in state.interrupts] == APPROVAL
    return True


# -- what InMemorySaver records for the same run ------------------------------------------------------------------


def approved_run(graph: Any, thread: str) -> dict[str, Any]:
    """The question, then the approval; the final state."""
    assert interrupts(graph.invoke(question(), config(thread))) == APPROVAL
    result: dict[str, Any] = graph.invoke(Command(resume="yes"), config(thread))
    return result


def checkpoint_id(cfg: RunnableConfig | None) -> str:
    assert cfg is not None
    return str(cfg["configurable"]["checkpoint_id"])


def shape(snapshots: list[StateSnapshot]) -> list[tuple[Any, ...]]:
    """A history as two runs can agree on it: checkpoint ids (random) replaced by positions in the list, a
    namespace's task ids by its node names, and each checkpoint's metadata, next nodes, values and tasks
    (their interrupts and results)."""
    position = {checkpoint_id(s.config): i for i, s in enumerate(snapshots)}

    def at(cfg: RunnableConfig | None) -> int | str | None:
        return None if cfg is None else position.get(checkpoint_id(cfg), "elsewhere")

    out = []
    for s in snapshots:
        ns = "|".join(part.partition(":")[0] for part in s.config["configurable"]["checkpoint_ns"].split("|"))
        parents = {k: position.get(v, "elsewhere") for k, v in metadata(s)["parents"].items()}
        tasks = [(t.name, [i.value for i in t.interrupts], t.result and plain(t.result)) for t in s.tasks]
        out.append((at(s.parent_config), ns, {**metadata(s), "parents": parents}, s.next, plain(s.values), tasks))
    return out


def metadata(snapshot: StateSnapshot) -> dict[str, Any]:
    assert snapshot.metadata is not None
    return dict(snapshot.metadata)


def history(graph: Any, thread: str) -> list[StateSnapshot]:
    return list(graph.get_state_history(config(thread)))


# -- the tests -----------------------------------------------------------------------------------------


def test_an_agent_killed_at_its_interrupt_is_resumed_by_a_new_process(sidecar: Sidecar) -> None:
    """SIGKILL while the graph waits for approval; a new process resumes the thread with the answer and
    finishes, and the thread's history is the one InMemorySaver records for the same run."""
    start_and_kill(sidecar.unix_target, "killed")
    assert waiting_for_approval(sidecar.unix_target, "killed")
    [(kind, final)] = run_agent(sidecar.unix_target, "killed", "resume=yes")
    assert kind == "final"
    memory = build(InMemorySaver())
    assert final == plain(approved_run(memory, "killed"))
    assert [m["data"]["content"] for m in final["messages"][-2:]] == ["deleted /scratch", SCRIPT[3].content]
    assert final["approvals"] == ["yes"]
    with CkptSaver(sidecar.unix_target) as saver:
        stored = history(build(saver), "killed")
    expected = history(memory, "killed")
    assert len(stored) == len(expected) == 10
    assert shape(stored) == shape(expected)
    with CheckpointClient(sidecar.unix_target) as client:  # one session, one version per checkpoint
        [session] = client.sessions(labels={"langgraph.thread": "killed"})
        assert session.session_id == "langgraph/6/killed/"
        assert len(list(client.history(session.session_id))) == 10


def test_replay_and_update_state_on_earlier_checkpoints_fork_branches(sidecar: Sidecar) -> None:
    """Replaying from the second tool call reaches the approval again on a new branch; update_state on the
    checkpoint waiting for approval (the model's dangerous call replaced by an answer) forks another. The
    whole history, both branches included, is InMemorySaver's."""

    def travel(graph: Any) -> tuple[StateSnapshot, StateSnapshot, list[StateSnapshot]]:
        approved_run(graph, "travel")
        first_run = history(graph, "travel")
        second_tools = next(s for s in first_run if metadata(s)["step"] == 3)
        assert second_tools.next == ("tools",)
        assert interrupts(graph.invoke(None, second_tools.config)) == APPROVAL
        at_approval = next(s for s in first_run if s.next == ("approve",))
        answer = AIMessage("I will leave /scratch alone.", id="ai-2")  # replaces the dangerous call
        forked = graph.update_state(at_approval.config, {"messages": [answer]}, as_node="model")
        assert graph.get_state(forked).next == ()
        return second_tools, at_approval, first_run

    with CkptSaver(sidecar.unix_target) as saver:
        graph = build(saver)
        replayed_from, updated_from, first_run = travel(graph)
        stored = history(graph, "travel")
    memory = build(InMemorySaver())
    travel(memory)
    assert shape(stored) == shape(history(memory, "travel"))

    first_ids = {checkpoint_id(s.config) for s in first_run}
    assert first_ids <= {checkpoint_id(s.config) for s in stored}
    update, *replay = [s for s in stored if checkpoint_id(s.config) not in first_ids]  # newest first
    assert metadata(update)["source"] == "update"
    assert checkpoint_id(update.parent_config) == checkpoint_id(updated_from.config)
    assert update.values["messages"][-1].content == "I will leave /scratch alone."
    assert checkpoint_id(replay[-1].parent_config) == checkpoint_id(replayed_from.config)
    # A copy of the checkpoint replayed starts the branch; then the tools run again, and the model.
    assert [(metadata(s)["source"], metadata(s)["step"]) for s in replay] == [("loop", 6), ("loop", 5), ("fork", 4)]
    assert replay[0].next == ("approve",)
    with CkptSaver(sidecar.unix_target) as saver:  # the thread's head is the update; the first run still there
        graph = build(saver)
        assert checkpoint_id(graph.get_state(config("travel")).config) == checkpoint_id(update.config)
        assert graph.get_state(first_run[0].config).values["approvals"] == ["yes"]


def nested(checkpointer: Any) -> Any:
    """The agent as a subgraph node of a parent graph (the subgraph checkpoints in the parent's saver)."""
    g = StateGraph(State)
    g.add_node("agent", build(None))
    g.add_edge(START, "agent")
    g.add_edge("agent", END)
    return g.compile(checkpointer=checkpointer)


def test_a_subgraphs_checkpoints_keep_a_namespace_of_their_own(sidecar: Sidecar) -> None:
    def at_interrupt(graph: Any) -> StateSnapshot:
        assert interrupts(graph.invoke(question(), config("nested"))) == APPROVAL
        state: StateSnapshot = graph.get_state(config("nested"), subgraphs=True)
        return state

    with CkptSaver(sidecar.unix_target) as saver:
        graph = nested(saver)
        parent = at_interrupt(graph)
    memory = nested(InMemorySaver())
    expected = at_interrupt(memory)
    [task] = parent.tasks
    assert isinstance(task.state, StateSnapshot) and isinstance(expected.tasks[0].state, StateSnapshot)
    assert task.state.next == ("approve",) and len(task.state.values["messages"]) == 7
    assert len(parent.values["messages"]) == 1  # the parent holds the question until the subgraph returns
    assert shape([parent, task.state]) == shape([expected, expected.tasks[0].state])

    ns = task.state.config["configurable"]["checkpoint_ns"]
    assert ns.startswith("agent:")
    with CheckpointClient(sidecar.unix_target) as client:
        ids = sorted(s.session_id for s in client.sessions(labels={"langgraph.thread": "nested"}))
        assert ids == ["langgraph/6/nested/", f"langgraph/6/nested/{ns}"]

    with CkptSaver(sidecar.unix_target) as saver:  # another saver resumes the subgraph
        graph = nested(saver)
        final = graph.invoke(Command(resume="yes"), config("nested"))
        stored = history(graph, "nested")
    assert plain(final) == plain(memory.invoke(Command(resume="yes"), config("nested")))
    assert final["messages"][-1].content == SCRIPT[3].content
    assert shape(stored) == shape(history(memory, "nested"))


def test_a_channel_of_tens_of_mb_round_trips(sidecar: Sidecar) -> None:
    """20 MiB in one channel, under the sidecar's default 64 MiB message bound: written with the question,
    read back by another saver, carried through the run, then replaced by update_state, four times over."""
    blob = random.Random(1).randbytes(20 * 2**20)  # incompressible: 20 MiB on the wire
    with CkptSaver(sidecar.unix_target) as saver:
        graph = build(saver)
        assert interrupts(graph.invoke({**question(), "blob": blob}, config("large"))) == APPROVAL
    with CkptSaver(sidecar.unix_target) as saver:  # nothing of it cached in this saver
        graph = build(saver)
        assert graph.get_state(config("large")).values["blob"] == blob
        final = graph.invoke(Command(resume="yes"), config("large"))
        assert final["blob"] == blob and final["approvals"] == ["yes"]
        # Rewritten again and again: each checkpoint stores the new 20 MiB, and the namespace's state,
        # merged, counts only the latest (the store compacts it at max_state_bytes).
        for k in range(1, 5):
            replaced = bytes([k]) + blob[1:]
            graph.update_state(config("large"), {"blob": replaced})
    with CkptSaver(sidecar.unix_target) as saver:
        graph = build(saver)
        assert graph.get_state(config("large")).values["blob"] == replaced
        earlier = list(graph.get_state_history(config("large")))
        assert [s.values["blob"][:1] for s in earlier[:4]] == [b"\x04", b"\x03", b"\x02", b"\x01"]


def test_two_processes_racing_a_superstep_the_loser_conflicts_and_continues(sidecar: Sidecar, tmp_path: Path) -> None:
    """Both resume the interrupted thread and are held inside the approval, having read its head; one is let
    go and finishes; the other, let go next, conflicts on its put, nothing of it is kept, and its next
    question continues from the winner's head."""
    target = sidecar.unix_target
    with CkptSaver(target) as saver:
        assert interrupts(build(saver).invoke(question(), config("race"))) == APPROVAL
    gates = {name: tmp_path / name for name in ("winner", "loser")}
    for gate in gates.values():
        gate.mkdir()
    winner_steps = [f"gate={gates['winner']}", "resume=yes"]
    loser_steps = [f"gate={gates['loser']}", "resume=no", "ask=Anything else?"]
    with agent(target, "race", *winner_steps) as winner, agent(target, "race", *loser_steps) as loser:
        wait_for(lambda: all((g / "entered").exists() for g in gates.values()), "both agents in the approval")
        (gates["winner"] / "go").touch()
        kind, won = outcome(winner)
        assert kind == "final" and won["approvals"] == ["yes"]
        assert winner.wait(60) == 0
        (gates["loser"] / "go").touch()
        kind, message = outcome(loser)
        assert kind == "conflict", message
        kind, after = outcome(loser)
        assert loser.wait(60) == 0
    assert kind == "final"
    assert after["messages"][: len(won["messages"])] == won["messages"]
    assert [m["data"]["content"] for m in after["messages"][len(won["messages"]) :]] == [
        "Anything else?",
        SCRIPT[4].content,
    ]
    assert after["approvals"] == ["yes"]

    memory = build(InMemorySaver())
    approved_run(memory, "race")
    memory.invoke(question("Anything else?"), config("race"))
    with CkptSaver(target) as saver:
        stored = history(build(saver), "race")
    assert shape(stored) == shape(history(memory, "race"))


def test_the_embedded_saver_resumes_a_graph_after_a_process_restart(tmp_path: Path) -> None:
    target = f"embedded:{tmp_path / 'data'}"
    start_and_kill(target, "embedded")
    assert waiting_for_approval(target, "embedded")
    [(kind, final)] = run_agent(target, "embedded", "resume=yes")
    memory = build(InMemorySaver())
    assert (kind, final) == ("final", plain(approved_run(memory, "embedded")))
    with CkptSaver.embedded(tmp_path / "data") as saver:
        assert shape(history(build(saver), "embedded")) == shape(history(memory, "embedded"))


def test_the_asyncio_saver_runs_the_graph_as_in_memory_saver_does(sidecar: Sidecar) -> None:
    """ainvoke to the interrupt, resume, and aget_state_history, on AsyncCkptSaver through a sidecar."""

    async def main() -> tuple[dict[str, Any], list[StateSnapshot]]:
        async with AsyncCkptSaver.from_conn_string(sidecar.unix_target) as saver:
            graph = build(saver)
            assert interrupts(await graph.ainvoke(question(), config("async"))) == APPROVAL
            final = await graph.ainvoke(Command(resume="yes"), config("async"))
            return final, [s async for s in graph.aget_state_history(config("async"))]

    final, stored = asyncio.run(main())
    memory = build(InMemorySaver())
    assert plain(final) == plain(approved_run(memory, "async"))
    assert shape(stored) == shape(history(memory, "async"))
