"""The LangGraph.js saver's ``list`` through a real sidecar deserializes each list element once: an element a
later checkpoint still holds at the same place is the object read for the first checkpoint listed that holds
it. The listed values are each checkpoint's as written, an element changed at its place included; another
listing reads its own."""

from __future__ import annotations

from tests.langgraph.test_node_saver_records import run_node
from tests.support import Sidecar

STEPS = 40
EDITED_AT = 30

# Thread "t": STEPS checkpoints, the n-th holding a list of n objects; from step EDITED_AT on, the first
# object is another. Lists it (counting the serializer's reads) and prints what the test checks.
_SCRIPT = r"""
const { emptyCheckpoint, uuid6 } = require(process.argv[1] + '/node_modules/@langchain/langgraph-checkpoint');
const { CkptSaver } = require(process.argv[1] + '/langgraph.js');
const [target, steps, editedAt] = process.argv.slice(2);
const saver = new CkptSaver(target);
const loadsTyped = saver.serde.loadsTyped.bind(saver.serde);
let loads = 0;
saver.serde.loadsTyped = async (type, data) => { loads += 1; return loadsTyped(type, data); };
const entry = (i, n) => ({ text: i === 0 && n >= Number(editedAt) ? 'entry 0, edited' : `entry ${i}` });
(async () => {
  let config = { configurable: { thread_id: 't', checkpoint_ns: '' } };
  const written = [];
  for (let n = 1; n <= Number(steps); n++) {
    const values = { log: Array.from({ length: n }, (_, i) => entry(i, n)), turn: n };
    const versions = { log: n, turn: n };
    const checkpoint = { ...emptyCheckpoint(), id: uuid6(-1), channel_values: values, channel_versions: versions };
    config = await saver.put(config, checkpoint, { source: 'loop', step: n, parents: {} }, versions);
    written.unshift(values);
  }
  loads = 0;
  const thread = { configurable: { thread_id: 't' } };
  const listed = [];
  for await (const t of saver.list(thread)) listed.push(t.checkpoint.channel_values);
  const listLoads = loads;
  const again = [];
  for await (const t of saver.list(thread, { limit: 1 })) again.push(t.checkpoint.channel_values);
  saver.close();
  console.log(JSON.stringify({
    loads: listLoads,
    same: JSON.stringify(listed) === JSON.stringify(written),
    shared: listed[1].log.every((e, i) => e === listed[0].log[i]) && listed[0].log !== listed[1].log,
    againEqual: JSON.stringify(again[0]) === JSON.stringify(listed[0]),
    againShared: again[0].log.some((e, i) => e === listed[0].log[i]),
  }));
})().catch((e) => { console.error(e); process.exit(1); });
"""


def test_a_history_reads_each_element_once_and_shares_it_within_a_listing(sidecar: Sidecar) -> None:
    out = run_node(_SCRIPT, sidecar, str(STEPS), str(EDITED_AT))
    assert out["same"] is True
    # Per checkpoint its checkpoint, its metadata and its "turn" value, plus each element once (the first
    # twice: as edited, and as it was). Read per checkpoint, the elements alone were 40 * 41 / 2 = 820.
    assert out["loads"] == 3 * STEPS + STEPS + 1
    assert out["shared"] is True
    assert out["againEqual"] is True
    assert out["againShared"] is False
