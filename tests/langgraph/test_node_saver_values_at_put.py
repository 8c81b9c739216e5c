"""The LangGraph.js saver takes a checkpoint's values as they are when put is called. LangGraph.js hands a
saver the state's own objects (its checkpoint copy is shallow) and runs on while the put is under way: a
node changing an object in place then changed the checkpoint the saver had not yet serialized (it did so
after its first awaits), and the checkpoint stored before the node held the node's change."""

from __future__ import annotations

from tests.langgraph.test_node_saver_records import run_node
from tests.support import Sidecar

# Puts a checkpoint of a list and an object, changes both in place as soon as put has been called (before
# it is awaited), then prints the checkpoint read back.
_CHANGED_AFTER_PUT = r"""
const { emptyCheckpoint, uuid6 } = require(process.argv[1] + '/node_modules/@langchain/langgraph-checkpoint');
const { CkptSaver } = require(process.argv[1] + '/langgraph.js');
const config = { configurable: { thread_id: 't', checkpoint_ns: '' } };
(async () => {
  const saver = new CkptSaver(process.argv[2]);
  const values = { items: ['x'], obj: { count: 0 } };
  const versions = { items: 1, obj: 1 };
  const checkpoint = { ...emptyCheckpoint(), id: uuid6(-1), channel_values: values, channel_versions: versions };
  const putting = saver.put(config, checkpoint, { source: 'loop', step: 0, parents: {} }, versions);
  values.items.push('later');  // what the next node does while the put is under way
  values.obj.count += 1;
  await putting;
  const fresh = new CkptSaver(process.argv[2]);
  const read = await fresh.getTuple(config);
  console.log(JSON.stringify(read.checkpoint.channel_values));
  saver.close();
  fresh.close();
})().catch((err) => { console.error(err); process.exit(1); });
"""


def test_a_checkpoint_holds_its_values_as_they_were_when_put_was_called(sidecar: Sidecar) -> None:
    assert run_node(_CHANGED_AFTER_PUT, sidecar) == {"items": ["x"], "obj": {"count": 0}}


# The same with bytes: JsonPlusSerializer keeps a Uint8Array as it is ("bytes", by reference), so the
# saver copies it when put (or putWrites) is called.
_BYTES_CHANGED_AFTER_PUT = r"""
const { emptyCheckpoint, uuid6 } = require(process.argv[1] + '/node_modules/@langchain/langgraph-checkpoint');
const { CkptSaver } = require(process.argv[1] + '/langgraph.js');
const config = { configurable: { thread_id: 'bytes', checkpoint_ns: '' } };
(async () => {
  const saver = new CkptSaver(process.argv[2]);
  const blob = new Uint8Array([1, 2, 3]);
  const values = { blob, items: [Buffer.from([4, 5, 6])] };
  const versions = { blob: 1, items: 1 };
  const checkpoint = { ...emptyCheckpoint(), id: uuid6(-1), channel_values: values, channel_versions: versions };
  const putting = saver.put(config, checkpoint, { source: 'loop', step: 0, parents: {} }, versions);
  blob[0] = 99;
  values.items[0][0] = 99;
  const written = await putting;
  const sent = new Uint8Array([7, 8, 9]);
  const writing = saver.putWrites(written, [['blob', sent]], 'task');
  sent[0] = 99;
  await writing;
  const fresh = new CkptSaver(process.argv[2]);
  const read = await fresh.getTuple(config);
  const v = read.checkpoint.channel_values;
  console.log(JSON.stringify({
    blob: Array.from(v.blob), items: v.items.map((e) => Array.from(e)), write: Array.from(read.pendingWrites[0][2]),
  }));
  saver.close();
  fresh.close();
})().catch((err) => { console.error(err); process.exit(1); });
"""


def test_bytes_are_stored_as_they_were_when_put_or_put_writes_was_called(sidecar: Sidecar) -> None:
    assert run_node(_BYTES_CHANGED_AFTER_PUT, sidecar) == {"blob": [1, 2, 3], "items": [[4, 5, 6]], "write": [7, 8, 9]}
