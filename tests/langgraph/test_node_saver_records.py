"""The LangGraph.js checkpointer (clients/node/langgraph.js) keeps the records' contract
(proto/ckpt/langgraph/v1/records.proto) as the Python saver does, against a real sidecar: pending writes
saved before their checkpoint's put, list channels element by element, and each saver reading what the
other wrote."""

from __future__ import annotations

import json
from typing import Any

from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6

from ckpt.langgraph.v1 import records_pb2
from ckpt.sidecar.client import CheckpointClient
from ckpt.sidecar.langgraph import CkptSaver
from ckpt.v1 import service_pb2
from tests.langgraph.test_node_saver import node_output
from tests.support import Sidecar


class JsonSerde:
    """LangGraph.js's serializer writes "json": the Python saver reads and writes it with this one."""

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        return "json", json.dumps(obj).encode()

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        type_, raw = data
        assert type_ == "json", type_
        return json.loads(raw)


def run_node(script: str, sidecar: Sidecar, *args: str) -> dict[str, Any]:
    return dict(json.loads(node_output(script, sidecar.unix_target, *args)))


def thread(thread_id: str, checkpoint_id: str | None = None) -> Any:
    configurable = {"thread_id": thread_id, "checkpoint_ns": ""}
    if checkpoint_id:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def stored(client: CheckpointClient, thread_id: str) -> tuple[list[records_pb2.Step], list[Any]]:
    """A thread's Steps, oldest first, and its event log."""
    session = f"langgraph/{len(thread_id)}/{thread_id}/"
    versions = list(client.history(session))[::-1]
    steps = [records_pb2.Step.FromString(client.get(session, v.version).state) for v in versions]
    return steps, list(client.events(session))


# Writes to checkpoint c1 before its put, one while the put is under way and one after; each fresh saver
# finds them all as c1's, and none of them among c0's.
_EARLY_WRITES = r"""
const { emptyCheckpoint, uuid6 } = require(process.argv[1] + '/node_modules/@langchain/langgraph-checkpoint');
const { CkptSaver } = require(process.argv[1] + '/langgraph.js');
const target = process.argv[2];
const thread = { configurable: { thread_id: 'early', checkpoint_ns: '' } };
const checkpoint = (n) => ({ ...emptyCheckpoint(), id: uuid6(-1), channel_values: { n }, channel_versions: { n } });
const metadata = (step) => ({ source: 'loop', step, parents: {} });
const at = (id) => ({ configurable: { ...thread.configurable, checkpoint_id: id } });
(async () => {
  const saver = new CkptSaver(target);
  const c0 = checkpoint(1);
  const c1 = checkpoint(2);
  await saver.put(thread, c0, metadata(0), { n: 1 });
  await saver.putWrites(at(c0.id), [['n', 'for c0']], 'task-0');
  await saver.putWrites(at(c1.id), [['n', 'early'], ['other', 'early too']], 'task-1');
  await Promise.all([
    saver.put(at(c0.id), c1, metadata(1), { n: 2 }),
    saver.putWrites(at(c1.id), [['n', 'during']], 'task-2'),
  ]);
  await saver.putWrites(at(c1.id), [['n', 'after']], 'task-3');
  saver.close();
  const fresh = new CkptSaver(target);
  const listed = [];
  for await (const t of fresh.list(thread)) listed.push(t.pendingWrites);
  const out = {
    c0: c0.id,
    c1: c1.id,
    latest: (await fresh.getTuple(thread)).pendingWrites,
    byId: (await fresh.getTuple(at(c1.id))).pendingWrites,
    c0Writes: (await fresh.getTuple(at(c0.id))).pendingWrites,
    listed,
  };
  fresh.close();
  console.log(JSON.stringify(out));
})().catch((err) => { console.error(err); process.exit(1); });
"""


def test_langgraph_js_writes_saved_before_their_checkpoint_are_its_pending_writes(sidecar: Sidecar) -> None:
    out = run_node(_EARLY_WRITES, sidecar)
    c1_writes = [
        ["task-1", "n", "early"],
        ["task-1", "other", "early too"],
        ["task-2", "n", "during"],
        ["task-3", "n", "after"],
    ]
    assert out["latest"] == c1_writes
    assert out["byId"] == c1_writes
    assert out["c0Writes"] == [["task-0", "n", "for c0"]]
    assert out["listed"] == [c1_writes, [["task-0", "n", "for c0"]]]
    with CheckpointClient(sidecar.unix_target) as client:
        steps, events = stored(client, "early")
    # The case itself: c1's first writes are in the log before its put (awaited before it), after the seq
    # its Step names, which skips c0's write; a put appends no event of its own.
    assert {e.type for e in events} == {"langgraph.writes"}
    early = [e.seq for e in events if b"early" in e.payload]
    for_c0 = [e.seq for e in events if b"for c0" in e.payload]
    assert [s.checkpoint_id for s in steps] == [out["c0"], out["c1"]]
    assert all(s.HasField("writes_after_seq") for s in steps)
    assert early and for_c0 and for_c0[0] <= steps[1].writes_after_seq < early[0]
    # The Python saver reads them where the Node saver put them.
    with CkptSaver(sidecar.unix_target, serde=JsonSerde()) as saver:
        found = saver.get_tuple(thread("early"))
        assert found is not None and found.pending_writes is not None
        assert [list(w) for w in found.pending_writes] == c1_writes


# A real graph that asks for approval: LangGraph.js saves the interrupt while the checkpoint it belongs
# to is not stored yet (the saver here holds that put until the interrupt is stored, so it is so on
# every run). A fresh process finds the interrupt and resumes the run.
_INTERRUPT = r"""
const { StateGraph, Annotation, START, END, interrupt, Command } = require('@langchain/langgraph');
const { CkptSaver } = require(process.argv[1] + '/langgraph.js');
const target = process.argv[2];
const calls = [];
class InterruptFirst extends CkptSaver {
  constructor(...args) {
    super(...args);
    this.interrupted = new Promise((resolve) => { this.stored = resolve; });
  }
  async put(config, checkpoint, metadata, newVersions) {
    if (metadata.source === 'loop') await this.interrupted;
    calls.push(`put ${metadata.source} ${metadata.step}`);
    return super.put(config, checkpoint, metadata, newVersions);
  }
  async putWrites(config, writes, taskId, taskPath) {
    await super.putWrites(config, writes, taskId, taskPath);
    calls.push(`putWrites ${writes.map(([channel]) => channel).join(' ')}`);
    if (writes.some(([channel]) => channel === '__interrupt__')) this.stored();
  }
}
const State = Annotation.Root({ log: Annotation({ reducer: (a, b) => a.concat(b), default: () => [] }) });
const build = (saver) =>
  new StateGraph(State)
    .addNode('approve', () => ({ log: [`approved: ${interrupt('approve the plan?')}`] }))
    .addEdge(START, 'approve')
    .addEdge('approve', END)
    .compile({ checkpointer: saver });
(async () => {
  const config = { configurable: { thread_id: 'approval' } };
  const first = new InterruptFirst(target);
  const paused = await build(first).invoke({ log: ['plan'] }, config);
  first.close();
  const fresh = new CkptSaver(target);
  const tuple = await fresh.getTuple(config);
  const state = await build(fresh).getState(config);
  const done = await build(fresh).invoke(new Command({ resume: 'yes' }), config);
  fresh.close();
  console.log(JSON.stringify({
    calls,
    paused: paused.__interrupt__.map((i) => i.value),
    pending: tuple.pendingWrites.map(([, channel, value]) => [channel, value.map((i) => i.value)]),
    interrupts: state.tasks.flatMap((t) => t.interrupts.map((i) => i.value)),
    done: done.log,
  }));
})().catch((err) => { console.error(err); process.exit(1); });
"""


def test_an_interrupt_of_a_langgraph_js_graph_is_found_by_a_fresh_saver(sidecar: Sidecar) -> None:
    out = run_node(_INTERRUPT, sidecar)
    assert out["calls"] == [
        "put input -1",
        "putWrites log branch:to:approve",
        "putWrites __interrupt__",
        "put loop 0",
    ]
    assert out["paused"] == ["approve the plan?"]
    assert out["pending"] == [["__interrupt__", ["approve the plan?"]]]
    assert out["interrupts"] == ["approve the plan?"]
    assert out["done"] == ["plan", "approved: yes"]


# A chat of LangChain messages (MessagesAnnotation: a plain array), then a list cut and a branch written
# whole, read back by a fresh saver.
_LISTS = r"""
const { StateGraph, MessagesAnnotation, START, END } = require('@langchain/langgraph');
const { AIMessage, HumanMessage, BaseMessage } = require('@langchain/core/messages');
const { emptyCheckpoint, uuid6 } = require(process.argv[1] + '/node_modules/@langchain/langgraph-checkpoint');
const { CkptSaver } = require(process.argv[1] + '/langgraph.js');
const target = process.argv[2];
const chat = { configurable: { thread_id: 'chat' } };
const lists = { configurable: { thread_id: 'lists', checkpoint_ns: '' } };
const at = (id) => ({ configurable: { ...lists.configurable, checkpoint_id: id } });
const metadata = (step) => ({ source: 'loop', step, parents: {} });
(async () => {
  const saver = new CkptSaver(target);
  const graph = new StateGraph(MessagesAnnotation)
    .addNode('reply', (s) => ({ messages: [new AIMessage(`re: ${s.messages.at(-1).content}`)] }))
    .addEdge(START, 'reply')
    .addEdge('reply', END)
    .compile({ checkpointer: saver });
  await graph.invoke({ messages: [new HumanMessage('hello')] }, chat);
  await graph.invoke({ messages: [new HumanMessage('again')] }, chat);
  // A list cut after its first element, another list emptied and one left as it was; then a branch
  // from the first checkpoint, whose unchanged list comes from it.
  const put = async (parent, step, values, versions, newVersions) => {
    const checkpoint = { ...emptyCheckpoint(), id: uuid6(-1), channel_values: values, channel_versions: versions };
    return saver.put(parent, checkpoint, metadata(step), newVersions);
  };
  const all = { a: 1, b: 1, c: 1 };
  const first = await put(lists, 0, { a: ['x', 'y', 'z'], b: [1, 2], c: ['kept'] }, all, all);
  const cut = await put(first, 1, { a: ['x', 'w'], b: [] }, { a: 2, b: 2, c: 1 }, { a: 2, b: 2 });
  const grown = await put(cut, 2, { a: ['x', 'w', 'v'] }, { a: 3, b: 2, c: 1 }, { a: 3 });
  const branch = await put(first, 1, { b: [1, 2, 3] }, { a: 1, b: 4, c: 1 }, { b: 4 });
  // 300 elements cut off outweigh the live ones: the step after is written whole, without them.
  const long = { configurable: { thread_id: 'rewritten', checkpoint_ns: '' } };
  const many = await put(long, 0, { a: Array.from({ length: 300 }, (_, i) => i) }, { a: 1 }, { a: 1 });
  const none = await put(many, 1, { a: [] }, { a: 2 }, { a: 2 });
  const rewritten = await put(none, 2, { a: ['again'] }, { a: 3 }, { a: 3 });
  saver.close();
  const fresh = new CkptSaver(target);
  const values = async (config) => (await fresh.getTuple(config)).checkpoint.channel_values;
  const messages = (await values(chat)).messages;
  const out = {
    chat: messages.map((m) => [m instanceof BaseMessage, m.getType(), m.content]),
    ids: [first, cut, grown, branch].map((c) => c.configurable.checkpoint_id),
    cut: await values(cut),
    grown: await values(grown),
    branch: await values(branch),
    first: await values(first),
    rewritten: [many, none, rewritten].map((c) => c.configurable.checkpoint_id),
    again: await values(rewritten),
  };
  fresh.close();
  console.log(JSON.stringify(out));
})().catch((err) => { console.error(err); process.exit(1); });
"""


def test_langgraph_js_list_channels_are_stored_element_by_element(sidecar: Sidecar) -> None:
    out = run_node(_LISTS, sidecar)
    assert out["chat"] == [
        [True, "human", "hello"],
        [True, "ai", "re: hello"],
        [True, "human", "again"],
        [True, "ai", "re: again"],
    ]
    assert out["first"] == {"a": ["x", "y", "z"], "b": [1, 2], "c": ["kept"]}
    assert out["cut"] == {"a": ["x", "w"], "b": [], "c": ["kept"]}
    assert out["grown"] == {"a": ["x", "w", "v"], "b": [], "c": ["kept"]}
    assert out["branch"] == {"a": ["x", "y", "z"], "b": [1, 2, 3], "c": ["kept"]}
    with CheckpointClient(sidecar.unix_target) as client:
        chat, _ = stored(client, "chat")
        steps, _ = stored(client, "lists")
        history = list(client.history("langgraph/5/lists/"))[::-1]
        rewritten, _ = stored(client, "rewritten")
        rewritten_modes = [v.mode for v in client.history("langgraph/9/rewritten/")][::-1]

    def entries(step: records_pb2.Step) -> list[tuple[str, int, list[str]]]:
        return [(e.channel, e.start, [v.data.decode() for v in e.values]) for e in step.items]

    # Each step of the chat added its messages alone: the head's state holds each message once.
    contents = [(e.start, [json.loads(v.data)["kwargs"]["content"] for v in e.values]) for e in chat[-1].items]
    assert contents == [(0, ["hello"]), (1, ["re: hello"]), (2, ["again"]), (3, ["re: again"])]
    assert chat[-1].channels["messages"].type == "ckpt.items"
    # A cut list's entry starts where it parts from the parent's; an emptied list's is empty; a list that
    # did not change has none. The branch is written whole: every list from 0.
    assert entries(steps[2]) == [
        ("a", 0, ['"x"', '"y"', '"z"']),
        ("b", 0, ["1", "2"]),
        ("c", 0, ['"kept"']),
        ("a", 1, ['"w"']),
        ("b", 0, []),
        ("a", 2, ['"v"']),
    ]
    assert sorted(entries(steps[3])) == [
        ("a", 0, ['"x"', '"y"', '"z"']),
        ("b", 0, ["1", "2", "3"]),
        ("c", 0, ['"kept"']),
    ]
    replace, merge = service_pb2.WRITE_MODE_REPLACE, service_pb2.WRITE_MODE_MERGE
    assert [v.mode for v in history] == [replace, merge, merge, replace]
    assert [s.checkpoint_id for s in rewritten] == out["rewritten"]
    assert [len(e.values) for e in rewritten[1].items] == [300, 0]
    assert rewritten_modes == [replace, merge, replace]
    assert entries(rewritten[2]) == [("a", 0, ['"again"'])]
    assert out["again"] == {"a": ["again"]}


# The Node saver reads a thread the Python saver wrote, lists included, and continues it.
_CONTINUE = r"""
const { uuid6 } = require(process.argv[1] + '/node_modules/@langchain/langgraph-checkpoint');
const { CkptSaver } = require(process.argv[1] + '/langgraph.js');
const [target, c0, c1] = process.argv.slice(2);
const thread = { configurable: { thread_id: 'py', checkpoint_ns: '' } };
const at = (id) => ({ configurable: { ...thread.configurable, checkpoint_id: id } });
(async () => {
  const saver = new CkptSaver(target);
  const head = await saver.getTuple(thread);
  const out = {
    head: head.checkpoint.channel_values,
    first: (await saver.getTuple(at(c0))).checkpoint.channel_values,
    pending: head.pendingWrites,
  };
  const checkpoint = {
    ...head.checkpoint,
    id: uuid6(-1),
    channel_values: { log: [...head.checkpoint.channel_values.log, 'from node'] },
    channel_versions: { ...head.checkpoint.channel_versions, log: 3 },
  };
  const written = await saver.put(at(c1), checkpoint, { source: 'loop', step: 2, parents: {} }, { log: 3 });
  out.next = written.configurable.checkpoint_id;
  saver.close();
  console.log(JSON.stringify(out));
})().catch((err) => { console.error(err); process.exit(1); });
"""


def test_the_node_saver_reads_and_continues_lists_the_python_saver_wrote(sidecar: Sidecar) -> None:
    def put(saver: CkptSaver, config: Any, values: dict[str, Any], versions: dict[str, int], new: list[str]) -> Any:
        checkpoint: Any = {**empty_checkpoint(), "v": 4, "id": str(uuid6(clock_seq=-1))}
        checkpoint.update(channel_values=values, channel_versions=versions)
        metadata: Any = {"source": "loop", "step": versions["log"], "parents": {}}
        return saver.put(config, checkpoint, metadata, {k: versions[k] for k in new})

    with CkptSaver(sidecar.unix_target, serde=JsonSerde()) as saver:
        c0 = put(saver, thread("py"), {"log": ["a", "b", "c"], "n": 1}, {"log": 1, "n": 1}, ["log", "n"])
        c1 = put(saver, c0, {"log": ["a", "x"], "n": 1}, {"log": 2, "n": 1}, ["log"])
        saver.put_writes(c1, [("log", "pending")], "task-1")
        ids = [c["configurable"]["checkpoint_id"] for c in (c0, c1)]
        out = run_node(_CONTINUE, sidecar, *ids)
        found = saver.get_tuple(thread("py"))
    assert out["head"] == {"log": ["a", "x"], "n": 1}
    assert out["first"] == {"log": ["a", "b", "c"], "n": 1}
    assert out["pending"] == [["task-1", "log", "pending"]]
    assert found is not None and found.config["configurable"]["checkpoint_id"] == out["next"]
    assert found.checkpoint["channel_values"] == {"log": ["a", "x", "from node"], "n": 1}
    with CheckpointClient(sidecar.unix_target) as client:
        steps, _ = stored(client, "py")
    # The Node saver's step continued the Python saver's lists: it added its element alone.
    assert [(e.channel, e.start, len(e.values)) for e in steps[-1].items] == [
        ("log", 0, 3),
        ("log", 1, 1),
        ("log", 2, 1),
    ]


_READ = r"""
const { CkptSaver } = require(process.argv[1] + '/langgraph.js');
const saver = new CkptSaver(process.argv[2]);
saver
  .getTuple({ configurable: { thread_id: process.argv[3] } })
  .then((t) => ({ values: t.checkpoint.channel_values }), (err) => ({ error: `${err.name}: ${err.message}` }))
  .then((out) => {
    saver.close();
    console.log(JSON.stringify(out));
  });
"""


def test_a_step_whose_items_skip_elements_is_refused_naming_the_channel(sidecar: Sidecar) -> None:
    serde = JsonSerde()

    def typed(value: Any) -> records_pb2.Typed:
        type_, data = serde.dumps_typed(value)
        return records_pb2.Typed(type=type_, data=data)

    checkpoint_id = str(uuid6(clock_seq=-1))
    checkpoint = {**empty_checkpoint(), "v": 4, "id": checkpoint_id, "channel_versions": {"log": 1}}
    del checkpoint["channel_values"]
    step = records_pb2.Step(
        checkpoint_id=checkpoint_id,
        checkpoint=typed(checkpoint),
        metadata=typed({"source": "loop", "step": 0, "parents": {}}),
        channels={"log": records_pb2.Typed(type="ckpt.items")},
        items=[
            records_pb2.Items(channel="log", values=[typed("a")]),
            records_pb2.Items(channel="log", start=1, values=[typed("b")]),
        ],
        writes_after_seq=0,
    )
    with CheckpointClient(sidecar.unix_target) as client:
        labels = {"langgraph.thread": "good", "langgraph.id": checkpoint_id}
        client.put("langgraph/4/good/", step.SerializeToString(), labels=labels)
        assert run_node(_READ, sidecar, "good") == {"values": {"log": ["a", "b"]}}
        step.items[1].start = 2  # past the one element before it
        client.put("langgraph/3/bad/", step.SerializeToString(), labels={**labels, "langgraph.thread": "bad"})
    assert run_node(_READ, sidecar, "bad") == {
        "error": f'Error: checkpoint "{checkpoint_id}": channel "log"\'s items start at 2, past its 1 elements'
    }


# Six threads put and read by one saver keeping three heads: which heads it holds, and each thread's next
# put (continuing its head, remembered or read again).
_HEADS_BOUNDED = r"""
const { emptyCheckpoint, uuid6 } = require(process.argv[1] + '/node_modules/@langchain/langgraph-checkpoint');
const { CkptSaver } = require(process.argv[1] + '/langgraph.js');
const thread = (t) => ({ configurable: { thread_id: t, checkpoint_ns: '' } });
const checkpoint = (n) => ({
  ...emptyCheckpoint(), id: uuid6(-1), channel_values: { n: [n] }, channel_versions: { n },
});
const input = { source: 'input', step: -1, parents: {} };
(async () => {
  const saver = new CkptSaver(process.argv[2]);
  saver.headsRemembered = 3;
  const names = ['t0', 't1', 't2', 't3', 't4', 't5'];
  const configs = {};
  for (const t of names) configs[t] = await saver.put(thread(t), checkpoint(1), input, { n: 1 });
  const held = [...saver.heads.keys()].map((s) => s.split('/')[2]);
  for (const t of names) await saver.put(configs[t], checkpoint(2), { source: 'loop', step: 0, parents: {} }, { n: 2 });
  const values = [];
  for (const t of names) values.push((await saver.getTuple(thread(t))).checkpoint.channel_values.n);
  console.log(JSON.stringify({ held, size: saver.heads.size, values }));
  saver.close();
})().catch((err) => { console.error(err); process.exit(1); });
"""


def test_the_node_saver_keeps_a_bounded_number_of_heads(sidecar: Sidecar) -> None:
    """Its map of heads (each with its lists' digests) grew by every namespace read or written, for the
    saver's lifetime; it keeps the most recently seen now (16,384 by default, as the Python savers)."""
    out = run_node(_HEADS_BOUNDED, sidecar)
    assert out == {"held": ["t3", "t4", "t5"], "size": 3, "values": [[2]] * 6}
