"""The LangGraph.js checkpointer (clients/node/langgraph.js) against a real sidecar: thread ids it cannot store
refused naming them, before anything is sent, and sessions other clients name langgraph/... left alone, a number
thread id returned as given."""

from __future__ import annotations

import json
from typing import Any

from ckpt.sidecar.client import CheckpointClient
from tests.langgraph.test_node_saver import node_output
from tests.support import Sidecar

_SCRIPT = r"""
const { emptyCheckpoint, uuid6 } = require(process.argv[1] + '/node_modules/@langchain/langgraph-checkpoint');
const { CkptSaver } = require(process.argv[1] + '/langgraph.js');
const saver = new CkptSaver(process.argv[2]);
const failure = async (fn) => {
  try {
    await fn();
    return null;
  } catch (err) {
    return `${err.name}: ${err.message}`;
  }
};
const thread = (threadId, ns = '') => ({ configurable: { thread_id: threadId, checkpoint_ns: ns } });
const put = (config) => saver.put(config, { ...emptyCheckpoint(), id: uuid6(-1) }, { source: 'input', step: -1 }, {});
const listed = async (config) => {
  const seen = [];
  for await (const { config: c } of saver.list(config)) {
    seen.push([c.configurable.thread_id, c.configurable.checkpoint_ns]);
  }
  return seen.sort();
};
(async () => {
  const out = {};
  await put(thread('undefined'));
  await put(thread('x'));
  out.deleteUndefined = await failure(() => saver.deleteThread(undefined));
  out.deleteObject = await failure(() => saver.deleteThread({ id: 'x' }));
  out.putLone = await failure(() => put(thread('a\ud800')));
  out.getLone = await failure(() => saver.getTuple(thread('a\ud800')));
  out.listLone = await failure(() => listed(thread('a\ud800')));
  out.deleteLone = await failure(() => saver.deleteThread('a\ud800'));
  out.nsLone = await failure(() => put(thread('t', 'n\udcff')));
  for (const [name, id] of [['Long', 'x'.repeat(200)], ['Control', 'a\nb']]) {
    out[`put${name}`] = await failure(() => put(thread(id)));
    out[`list${name}`] = await failure(() => listed(thread(id)));
    out[`delete${name}`] = await failure(() => saver.deleteThread(id));
  }
  out.all = await listed(undefined);
  out.x = await listed({ configurable: { thread_id: 'x' } });
  // A number is stored as its decimal string, as a config's thread_id; put returns it as given, as the
  // Python savers do (LangGraph.js's MemorySaver refuses a number).
  const seven = await put(thread(7));
  out.numberPut = typeof seven.configurable.thread_id;
  out.numberRead = (await saver.getTuple(seven)).checkpoint.id === seven.configurable.checkpoint_id;
  await saver.deleteThread(7);
  saver.close();
  console.log(JSON.stringify(out));
})().catch((err) => { console.error(err); process.exit(1); });
"""

#: Sessions another client names langgraph/..., labelled as the saver labels its own: not the saver's
#: (the length is ASCII digits without a leading zero), so they are not read as thread "x".
FOREIGN = {"langgraph/01/x/": b"a", "langgraph/\N{SUPERSCRIPT TWO}/notes": b"b", "langgraph/\u0661/x/": b"c"}


def test_langgraph_js_saver_refuses_thread_ids_it_cannot_store_and_reads_no_foreign_session(
    sidecar: Sidecar,
) -> None:
    """deleteThread(undefined) deleted the thread "undefined" (String(threadId)), and a lone surrogate in
    a thread id (an id too long or with a control character, for list and deleteThread) was refused naming
    sessionId or labels, which the caller never gave."""
    with CheckpointClient(sidecar.unix_target) as client:
        for session_id, state in FOREIGN.items():
            client.put(session_id, state, labels={"langgraph.thread": "x"})
    out: dict[str, Any] = json.loads(node_output(_SCRIPT, sidecar.unix_target, timeout_seconds=60))
    lone = "TypeError: thread_id holds a lone surrogate, which is not text: ckpt's savers cannot store it"
    # As put refuses them, so do list and deleteThread, before the sidecar refuses a label filter.
    long = "RangeError: thread_id is 200 bytes of UTF-8; ckpt's LangGraph saver takes at most 128 (a label's limit)"
    control = (
        'RangeError: thread_id "a\\nb" contains an ASCII control character (U+0000-U+001F or U+007F):'
        " ckpt's savers cannot store it"
    )
    assert out == {
        "deleteUndefined": "TypeError: threadId must be a string, not undefined",
        "deleteObject": "TypeError: threadId must be a string, not object",
        "putLone": lone,
        "getLone": lone,
        "listLone": lone,
        "deleteLone": lone.replace("thread_id", "threadId"),
        "nsLone": lone.replace("thread_id", "checkpoint_ns"),
        "putLong": long,
        "listLong": long,
        "deleteLong": long.replace("thread_id", "threadId"),
        "putControl": control,
        "listControl": control,
        "deleteControl": control.replace("thread_id", "threadId"),
        "all": [["undefined", ""], ["x", ""]],
        "x": [["x", ""]],
        "numberPut": "number",
        "numberRead": True,
    }
    with CheckpointClient(sidecar.unix_target) as client:
        stored = {s.session_id for s in client.sessions()}
        assert stored == {"langgraph/9/undefined/", "langgraph/1/x/", *FOREIGN}  # none deleted
        assert {s: client.get(s).state for s in FOREIGN} == FOREIGN
