"""What the LangGraph.js saver's ``getTuple`` of the latest checkpoint reads through a real sidecar, as the
Python saver's ``get_tuple`` does (test_get_tuple_reads.py): the head and its pending writes in one Get
when the saver put (or read) that head, a Get and a ReadEvents when another saver moved it or the saver
never saw the namespace; the pending writes right either way, a cut page read on from its token."""

from __future__ import annotations

from typing import Any

from tests.langgraph.test_node_saver_records import run_node
from tests.support import Sidecar

#: More writes events than a page of the saver's log reads (LogReader.filter's page size), in batches of 100.
CUT_WRITES = 1100

# Every saver's client records its calls: [method, what it asked] where Get is "events" when it also read
# events and ReadEvents is "token" when it read on from a page token. `older` savers' clients answer a Get
# as a sidecar from before GetRequest.events does: the state alone. "calls": reads of thread "t" by savers
# that put it, never saw it, or saw it moved; "cut": a read of more writes than a page. Prints each read's
# checkpoint id, pending writes and calls.
_READS = r"""
const { emptyCheckpoint, uuid6 } = require(process.argv[1] + '/node_modules/@langchain/langgraph-checkpoint');
const { CkptSaver } = require(process.argv[1] + '/langgraph.js');
const [target, scenario, cutWrites] = process.argv.slice(2);
const thread = (id) => ({ configurable: { thread_id: id, checkpoint_ns: '' } });

function saver({ older = false } = {}) {
  const s = new CkptSaver(target);
  s.calls = [];
  const call = s.client.call.bind(s.client);
  s.client.call = async (method, request, ...rest) => {
    const events = method === 'Get' && request.events ? 'events' : '';
    const asked = method === 'ReadEvents' && request.page_token ? 'token' : events;
    s.calls.push([method, asked]);
    const reply = await call(method, older && method === 'Get' ? { ...request, events: undefined } : request, ...rest);
    return older && method === 'Get' ? { ...reply, events: null } : reply;
  };
  return s;
}

async function put(s, config, step) {
  const versions = { n: step + 1 };
  const checkpoint = { ...emptyCheckpoint(), id: uuid6(-1), channel_values: { n: step }, channel_versions: versions };
  return s.put(config, checkpoint, { source: 'loop', step, parents: {} }, versions);
}

// getTuple of the thread's latest checkpoint: its id, pending writes and the calls made for it.
async function readLatest(s, threadId) {
  s.calls.length = 0;
  const t = await s.getTuple(thread(threadId));
  return { id: t.config.configurable.checkpoint_id, pending: t.pendingWrites, calls: [...s.calls] };
}

async function calls() {
  const out = {};
  const [a, b, fresh, newcomer, older] = [saver(), saver(), saver(), saver(), saver({ older: true })];
  let config = thread('t');
  for (let step = 0; step < 3; step++) config = await put(a, config, step);
  await a.putWrites(config, [['n', 'pending'], ['log', 'x']], 'task-1');
  out.put = config.configurable.checkpoint_id;
  out.own = await readLatest(a, 't');
  out.ownAgain = await readLatest(a, 't');
  out.fresh = await readLatest(fresh, 't');
  out.newcomer = [await readLatest(newcomer, 't'), await readLatest(newcomer, 't')];
  out.older = [await readLatest(older, 't'), await readLatest(older, 't')];

  // Another saver moves the head: a's Get reads writes after the head it remembers, not the new one's.
  await b.getTuple(thread('t'));
  const moved = await put(b, config, 3);
  await b.putWrites(moved, [['n', "b's write"]], 'task-2');
  out.moved = moved.configurable.checkpoint_id;
  out.afterMove = [await readLatest(a, 't'), await readLatest(a, 't')];
  for (const s of [a, b, fresh, newcomer, older]) s.close();
  return out;
}

async function cutPage() {
  const cut = saver();
  const head = await put(cut, thread('cut'), 0);
  for (let i = 0; i < Number(cutWrites); i += 100) {
    await Promise.all(Array.from({ length: 100 }, (_, j) => cut.putWrites(head, [['n', i + j]], `task-${i + j}`)));
  }
  const out = await readLatest(cut, 'cut');
  cut.close();
  return out;
}

(async () => {
  console.log(JSON.stringify(await (scenario === 'cut' ? cutPage() : calls())));
})().catch((e) => { console.error(e); process.exit(1); });
"""

ONE = [["Get", "events"]]
TWO = [["Get", ""], ["ReadEvents", ""]]


def _pending(read: dict[str, Any]) -> list[list[Any]]:
    return sorted(read["pending"])


def test_node_get_tuple_reads_the_head_and_its_pending_writes_in_one_call(sidecar: Sidecar) -> None:
    out = run_node(_READS, sidecar, "calls")
    written = [["task-1", "log", "x"], ["task-1", "n", "pending"]]

    # After its own put: one Get, the head and its writes; again after reading it.
    assert out["own"]["calls"] == ONE and out["own"]["id"] == out["put"]
    assert _pending(out["own"]) == written
    assert out["ownAgain"]["calls"] == ONE and _pending(out["ownAgain"]) == written
    # A saver that never saw the thread: a Get, then the writes; then one Get.
    assert out["fresh"]["calls"] == TWO and _pending(out["fresh"]) == written
    first, second = out["newcomer"]
    assert first["calls"] == TWO and second["calls"] == ONE
    assert _pending(first) == _pending(second) == written
    # A sidecar whose Get reply has no events read none: not an empty page, the writes read after it.
    first, second = out["older"]
    assert first["calls"] == TWO and second["calls"] == [["Get", "events"], ["ReadEvents", ""]]
    assert _pending(first) == _pending(second) == written

    # Another saver moved the head: the Get's writes are not used, the new head's read after it.
    moved, again = out["afterMove"]
    assert moved["calls"] == [["Get", "events"], ["ReadEvents", ""]]
    assert moved["id"] == again["id"] == out["moved"]
    assert _pending(moved) == [["task-2", "n", "b's write"]]
    # Now it has seen that head: one call again.
    assert again["calls"] == ONE and _pending(again) == [["task-2", "n", "b's write"]]


def test_node_get_tuple_reads_a_cut_page_on_from_its_token(sidecar: Sidecar) -> None:
    out = run_node(_READS, sidecar, "cut", str(CUT_WRITES))
    assert out["calls"] == [["Get", "events"], ["ReadEvents", "token"]]
    assert _pending(out) == sorted([f"task-{i}", "n", i] for i in range(CUT_WRITES))
