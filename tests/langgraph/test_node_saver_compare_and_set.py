"""The LangGraph.js saver (clients/node/langgraph.js) compare-and-sets a put on the head's content, as the
Python saver does (test_saver_sidecar.py): a thread another saver deleted and wrote again up to the version
a stale saver holds is not mistaken for that saver's head."""

from __future__ import annotations

from typing import Any

import pytest

from ckpt.sidecar.langgraph import CkptSaver
from tests.langgraph.test_node_saver_records import JsonSerde, run_node, thread
from tests.support import Sidecar

# Saver a writes thread "t" three checkpoints deep (messages A0..A2), and with "read" reads it back; saver b
# deletes the thread and writes three checkpoints (B0..B2), up to the version a holds. a's next put
# continues its own head; then a reads the new head and continues from it, as the error says to.
_STALE = r"""
const { emptyCheckpoint, uuid6 } = require(process.argv[1] + '/node_modules/@langchain/langgraph-checkpoint');
const { CkptSaver, CheckpointConflictError } = require(process.argv[1] + '/langgraph.js');
const [target, readsFirst] = process.argv.slice(2);
const thread = { configurable: { thread_id: 't', checkpoint_ns: '' } };
const idOf = (config) => config.configurable.checkpoint_id;

function step(saver, config, n, messages) {
  const versions = { messages: n + 1 };
  const checkpoint = { ...emptyCheckpoint(), id: uuid6(n), channel_values: { messages }, channel_versions: versions };
  return saver.put(config, checkpoint, { source: 'loop', step: n, parents: {} }, versions);
}

(async () => {
  const [a, b] = [new CkptSaver(target), new CkptSaver(target)];
  const out = {};
  let [config, messages] = [thread, []];
  for (let n = 0; n < 3; n++) {
    messages = [...messages, `A${n}`];
    config = await step(a, config, n, messages);
  }
  if (readsFirst === 'read') out.read = idOf((await a.getTuple(thread)).config) === idOf(config);
  await b.deleteThread('t');
  let [bConfig, bMessages] = [thread, []];
  for (let n = 0; n < 3; n++) {
    bMessages = [...bMessages, `B${n}`];
    bConfig = await step(b, bConfig, 10 + n, bMessages);
  }
  try {
    const landed = await step(a, config, 3, [...messages, 'A3']);
    out.stale = { landed: idOf(landed) };
  } catch (err) {
    if (!(err instanceof CheckpointConflictError)) throw err;
    out.stale = { conflict: err.name, currentVersion: err.currentVersion, threadId: err.threadId };
  }
  const head = await b.getTuple(thread);
  out.head = { id: idOf(head.config), messages: head.checkpoint.channel_values.messages };
  out.b = idOf(bConfig);
  out.ids = [];
  for await (const t of a.list(thread)) out.ids.push(idOf(t.config));
  const onB = await step(a, (await a.getTuple(thread)).config, 13, [...bMessages, 'A3']);
  const after = await b.getTuple(thread);
  out.retried = { onB: idOf(onB), head: idOf(after.config), messages: after.checkpoint.channel_values.messages };
  a.close();
  b.close();
  console.log(JSON.stringify(out));
})().catch((err) => { console.error(err); process.exit(1); });
"""


@pytest.mark.parametrize("reads_first", ["own-head", "read"], ids=["own-head", "read-head"])
def test_a_thread_deleted_and_written_again_to_the_same_version_refuses_the_stale_node_saver(
    sidecar: Sidecar, reads_first: str
) -> None:
    out = run_node(_STALE, sidecar, reads_first)
    if reads_first == "read":
        assert out["read"] is True
    assert out["stale"] == {"conflict": "CheckpointConflictError", "currentVersion": 3, "threadId": "t"}
    # The other saver's thread is untouched: its head, its messages alone, its three checkpoints.
    assert out["head"] == {"id": out["b"], "messages": ["B0", "B1", "B2"]}
    assert len(out["ids"]) == 3 and out["ids"][0] == out["b"]
    with CkptSaver(sidecar.unix_target, serde=JsonSerde()) as py:
        listed: list[Any] = list(py.list(thread("t")))
    assert [t.config["configurable"]["checkpoint_id"] for t in listed][1:] == out["ids"]
    # Retrying as the error says: read the new head, continue from it.
    retried = out["retried"]
    assert retried["onB"] == retried["head"] and retried["messages"] == ["B0", "B1", "B2", "A3"]
    assert listed[0].checkpoint["channel_values"]["messages"] == ["B0", "B1", "B2", "A3"]
    assert listed[0].parent_config is not None
    assert listed[0].parent_config["configurable"]["checkpoint_id"] == out["b"]
