"""The LangGraph.js saver holds the state of each head it put or read (clients/node/langgraph_states.js): a
read of that head names it and the sidecar leaves the state's bytes out of the reply, as the Python saver's
head views do. A head another writer moved is read whole; held states are bounded in bytes."""

from __future__ import annotations

from pathlib import Path

from tests.langgraph.test_node_saver_records import run_node
from tests.support import Sidecar, start_sidecar

# Saver A puts steps of a growing conversation, reading the head after each; saver B then writes a step on
# the same thread. Prints, for each head read of A, whether the sidecar left the state out, and whether what
# A read equals what a fresh saver reads.
_READS = r"""
const { emptyCheckpoint, uuid6 } = require(process.argv[1] + '/node_modules/@langchain/langgraph-checkpoint');
const { CkptSaver } = require(process.argv[1] + '/langgraph.js');
const thread = { configurable: { thread_id: 'held', checkpoint_ns: '' } };
const omitted = [];
const watched = (saver) => {
  const get = saver.client.get.bind(saver.client);
  saver.client.get = async (...args) => {
    const got = await get(...args);
    if (args[1] === 0 || args[1] === undefined) omitted.push(got.state_omitted);
    return got;
  };
  return saver;
};
const step = async (saver, config, messages, n) => {
  const versions = { messages: n + 1 };
  const checkpoint = { ...emptyCheckpoint(), id: uuid6(-1), channel_values: { messages }, channel_versions: versions };
  return saver.put(config, checkpoint, { source: 'loop', step: n, parents: {} }, versions);
};
const same = async (saver) => {
  const fresh = new CkptSaver(process.argv[2]);
  const [a, b] = [await saver.getTuple(thread), await fresh.getTuple(thread)];
  fresh.close();
  const of = (t) => JSON.stringify([t.checkpoint, t.metadata, t.pendingWrites]);
  return of(a) === of(b);
};
(async () => {
  const a = watched(new CkptSaver(process.argv[2]));
  const b = new CkptSaver(process.argv[2]);
  const out = { equal: [] };
  let config = thread;
  const messages = [];
  for (let n = 0; n < 4; n++) {
    messages.push(`message ${n} `.repeat(50));
    config = await step(a, config, [...messages], n);
    await a.putWrites(config, [['messages', `write ${n}`]], `task-${n}`);
    out.equal.push(await same(a));
  }
  const head = await b.getTuple(thread);
  await step(b, head.config, [...messages, 'from b'], 4);
  out.equal.push(await same(a));
  out.afterB = (await a.getTuple(thread)).checkpoint.channel_values.messages.at(-1);
  out.omitted = omitted;
  a.close();
  b.close();
  console.log(JSON.stringify(out));
})().catch((err) => { console.error(err); process.exit(1); });
"""


def test_a_head_this_saver_holds_is_read_without_its_state_and_reads_the_same(sidecar: Sidecar) -> None:
    out = run_node(_READS, sidecar)
    assert out["equal"] == [True] * 5
    assert out["afterB"] == "from b"
    # A's reads of the four heads it put, then of B's head: read whole once, then held.
    assert out["omitted"] == [True, True, True, True, False, True]


# HeadStates alone: a bound in bytes, a merge onto another state than the one held, bytes that do not hash
# to the XXH3-64 they were held under.
_BOUNDS = r"""
const { xxh3 } = require(process.argv[1] + '/node_modules/@node-rs/xxhash');
const { HeadStates } = require(process.argv[1] + '/langgraph_states.js');
const digest = (b) => xxh3.xxh64(b).toString();
const states = new HeadStates(10);
const [x, y, p] = [Buffer.from('xxxxxx'), Buffer.from('yyyyyy'), Buffer.from('pp')];
const out = {};
states.hold('x', digest(x), x);
states.hold('y', digest(y), y);  // 12 bytes: x goes
out.afterTwo = [states.known('x'), states.known('y') === digest(y), states.bytes];
const xy = Buffer.concat([y, p]);
states.merged('y', digest(y), p, digest(xy));
out.merged = states.state('y', digest(xy)).toString();
states.merged('y', 'another', p, '1');  // onto a state not held: dropped
out.afterOther = [states.known('y'), states.bytes];
states.hold('z', '12345', Buffer.from('zz'));  // bytes that do not hash to it
out.unhashed = [states.state('z', '12345'), states.known('z'), states.bytes];
states.hold('big', digest(Buffer.alloc(11)), Buffer.alloc(11));
out.big = [states.known('big'), states.bytes];
console.log(JSON.stringify(out));
"""


def test_head_states_are_bounded_and_used_only_as_the_state_they_were_held_as(sidecar: Sidecar) -> None:
    out = run_node(_BOUNDS, sidecar)
    assert out == {
        "afterTwo": [None, True, 6],
        "merged": "yyyyyypp",
        "afterOther": [None, 0],
        "unhashed": [None, None, 0],
        "big": [None, 0],
    }


# Steps put, then the thread left quiet until the sidecar folds its head (the same Step in other bytes,
# another XXH3-64); prints the head Gets of the reads after the fold and whether they read right.
_FOLDED = r"""
const { emptyCheckpoint, uuid6 } = require(process.argv[1] + '/node_modules/@langchain/langgraph-checkpoint');
const { CkptSaver } = require(process.argv[1] + '/langgraph.js');
const thread = { configurable: { thread_id: 'quiet', checkpoint_ns: '' } };
(async () => {
  const saver = new CkptSaver(process.argv[2]);
  const gets = [];
  const get = saver.client.get.bind(saver.client);
  saver.client.get = async (...args) => {
    const got = await get(...args);
    gets.push([got.state_omitted, got.info.state_xxh3]);
    return got;
  };
  let config = thread;
  for (let n = 0; n < 12; n++) {
    const versions = { messages: n + 1, n: n + 1 };
    const values = { messages: Array.from({ length: n + 1 }, (_, i) => `m${i}`), n };
    const checkpoint = { ...emptyCheckpoint(), id: uuid6(-1), channel_values: values, channel_versions: versions };
    config = await saver.put(config, checkpoint, { source: 'loop', step: n, parents: {} }, versions);
  }
  // Read once: the state held is then the stored bytes (a put's merge the sidecar stored compacted is read
  // whole at the next read).
  await saver.getTuple(thread);
  const written = saver.heads.get('langgraph/5/quiet/').stateXxh3;
  const deadline = Date.now() + 30000;
  const probe = new CkptSaver(process.argv[2]);
  while ((await probe.client.get('langgraph/5/quiet/', 0)).info.state_xxh3 === written) {
    if (Date.now() > deadline) throw new Error('the head was never folded');
    await new Promise((r) => setTimeout(r, 200));
  }
  probe.close();
  gets.length = 0;
  const out = { values: [] };
  for (let i = 0; i < 2; i++) out.values.push((await saver.getTuple(thread)).checkpoint.channel_values.n);
  out.gets = gets.map(([omitted, xxh3]) => [omitted, xxh3 !== written]);
  saver.close();
  console.log(JSON.stringify(out));
})().catch((err) => { console.error(err); process.exit(1); });
"""


def test_a_head_folded_while_quiet_is_read_in_one_call_without_its_state(tmp_path: Path) -> None:
    """The sidecar leaves the state out for the digest the put answered, though a fold stored it in other
    bytes since; the saver used to take that reply for another head's and read the state again, whole."""
    sidecar = start_sidecar(tmp_path / "data", "--fold-after-quiet-seconds", "1", "--sweep-interval-seconds", "1")
    try:
        out = run_node(_FOLDED, sidecar)
        assert out == {"values": [11, 11], "gets": [[True, True], [True, True]]}
    finally:
        assert sidecar.stop() == 0, sidecar.log()
