"""LangGraph.js: a put whose call ended unanswered (a reply lost, the sidecar gone before or after storing it)
is found out before the saver builds on it, as the Python savers do (test_put_unanswered.py). A put
continuing it continues it if it was stored and is still the head, starts a branch if it was not stored and
nothing was put since, and throws CheckpointConflictError if another writer put since, never writing past
that writer's checkpoint, and serializes the state as it was when the put was called; the same put made
again while the first is still under way keeps the writes saved before it. A real sidecar; the client's
call is failed at the chosen point."""

from __future__ import annotations

from tests.langgraph.test_node_saver_records import run_node
from tests.support import Sidecar

_JS = r"""
const { emptyCheckpoint } = require(process.argv[1] + '/node_modules/@langchain/langgraph-checkpoint');
const { CkptSaver } = require(process.argv[1] + '/langgraph.js');
const config = (t, id) => ({ configurable: { thread_id: t, checkpoint_ns: '', ...(id ? { checkpoint_id: id } : {}) } });
const checkpoint = (id, n) => ({ ...emptyCheckpoint(), id, channel_values: { n }, channel_versions: { n } });
// The saver's next put call fails unanswered: after the sidecar stored it (stored) or before it reached it.
const fail = (saver, stored) => {
  const real = saver.client.appendEvents.bind(saver.client);
  saver.client.appendEvents = async (...args) => {
    saver.client.appendEvents = real;
    if (stored) await real(...args);
    throw Object.assign(new Error('unanswered'), { code: 14 });
  };
};
const ids = async (saver, t) => {
  const out = [];
  for await (const tuple of saver.list(config(t))) out.push(tuple.checkpoint.id);
  return out;
};
const outcome = (promise) => promise.then(() => 'put', (err) => err.name);
(async () => {
  const [target] = process.argv.slice(2);
  const saver = new CkptSaver(target);
  const writer = new CkptSaver(target);
  const out = {};
  for (const stored of [true, false]) {
    for (const other of [true, false]) {
      const t = `${stored ? 'stored' : 'unstored'}-${other ? 'other' : 'alone'}`;
      const r1 = await saver.put(config(t), checkpoint('1', 1), { step: 0 }, { n: 1 });
      fail(saver, stored);
      const failed = await outcome(saver.put(r1, checkpoint('2', 2), { step: 1 }, { n: 2 }));
      if (other) {
        const head = await writer.getTuple(config(t));
        await writer.put(head.config, checkpoint('3', 3), { step: 2 }, { n: 3 });
      }
      const next = await outcome(saver.put(config(t, '2'), checkpoint('4', 4), { step: 2 }, { n: 4 }));
      const latest = await writer.getTuple(config(t));
      out[t] = { failed, next, listed: await ids(writer, t), latest: latest.checkpoint.channel_values.n };
    }
  }
  // The put continuing an unanswered one serializes the state as the put was called, before it reads the
  // head: the next node, running meanwhile, may change a list in place.
  const r0 = await saver.put(config('live'), checkpoint('1', ['a']), { step: 0 }, { n: 1 });
  fail(saver, true);
  await outcome(saver.put(r0, checkpoint('2', ['a', 'b']), { step: 1 }, { n: 2 }));
  const live = ['a', 'b', 'c'];
  const continuing = saver.put(config('live', '2'), checkpoint('3', live), { step: 2 }, { n: 3 });
  live.push('changed by the next node');
  await continuing;
  out.live = (await writer.getTuple(config('live'))).checkpoint.channel_values.n;
  // The same put made again while the first is still under way: the writes saved before it come with it.
  const r1 = await saver.put(config('again'), checkpoint('1', 1), { step: 0 }, { n: 1 });
  await saver.putWrites(config('again', '2'), [['__interrupt__', 'approve?']], 'task-1');
  const real = saver.client.appendEvents.bind(saver.client);
  let release;
  const held = new Promise((resolve) => { release = resolve; });
  saver.client.appendEvents = async (...args) => {
    saver.client.appendEvents = real;
    await held;
    return real(...args);
  };
  const first = saver.put(r1, checkpoint('2', 2), { step: 1 }, { n: 2 });
  await saver.put(r1, checkpoint('2', 2), { step: 1 }, { n: 2 });
  release();
  out.firstOfTwo = await outcome(first);
  out.pending = (await new CkptSaver(target).getTuple(config('again'))).pendingWrites;
  saver.close();
  writer.close();
  console.log(JSON.stringify(out));
  process.exit(0);
})().catch((err) => { console.error(err); process.exit(1); });
"""


def test_js_puts_after_an_unanswered_put_never_write_past_another_writer(sidecar: Sidecar) -> None:
    out = run_node(_JS, sidecar)
    failed = "Error"
    assert out.pop("stored-other") == {
        "failed": failed, "next": "CheckpointConflictError", "listed": ["3", "2", "1"], "latest": 3,
    }  # fmt: skip
    assert out.pop("stored-alone") == {"failed": failed, "next": "put", "listed": ["4", "2", "1"], "latest": 4}
    assert out.pop("unstored-other") == {
        "failed": failed, "next": "CheckpointConflictError", "listed": ["3", "1"], "latest": 3,
    }  # fmt: skip
    assert out.pop("unstored-alone") == {"failed": failed, "next": "put", "listed": ["4", "1"], "latest": 4}
    assert out.pop("live") == ["a", "b", "c"]
    assert out == {"firstOfTwo": "put", "pending": [["task-1", "__interrupt__", "approve?"]]}
