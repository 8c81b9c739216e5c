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
