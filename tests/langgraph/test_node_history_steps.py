"""The LangGraph.js saver's listing decodes a namespace's states oldest first, one that extends the state
before it from the bytes it added alone (``stepsOf`` in clients/node/langgraph_records.js): each Step, and the
list elements read off it, are those of the whole state decoded (``decodeStep``), the oracle. The same random
MERGE chains as the Python saver's views are checked on (test_history_views.py): channels replaced, a Typed's
fields set one at a time (protobufjs replaces a message field set again, where protobuf merges it), deleted
ids, Items cutting and growing lists, an entry past its list's end, states written whole between them and
states equal to the one before."""

from __future__ import annotations

import base64
import json
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.langgraph.test_history_views import _histories
from tests.langgraph.test_node_saver import node_output

# Reads histories (lists of base64 states, oldest first) from the file named by argv[2]; prints, per
# history, the index of each state whose Step or elements differ from the whole state's (none: []).
_SCRIPT = r"""
const fs = require('fs');
const { isDeepStrictEqual } = require('util');
const r = require(process.argv[1] + '/langgraph_records.js');
const elements = (step) => {
  try {
    return { elements: [...r.elementsOf(step)] };
  } catch (err) {
    return { error: err.message };
  }
};
const histories = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const differ = histories.map((encoded) => {
  const states = encoded.map((s) => Buffer.from(s, 'base64'));
  const steps = r.stepsOf(states);
  const out = [];
  states.forEach((state, i) => {
    const whole = r.decodeStep(state);
    if (!isDeepStrictEqual(steps[i], whole) || !isDeepStrictEqual(elements(steps[i]), elements(whole))) out.push(i);
  });
  return out;
});
console.log(JSON.stringify(differ));
"""


def _differing(histories: list[list[bytes]]) -> list[list[int]]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "histories.json"
        path.write_text(json.dumps([[base64.b64encode(s).decode() for s in h] for h in histories]))
        return list(json.loads(node_output(_SCRIPT, str(path))))


# One Node process per example, each checking a batch of histories: 20 x up to 30 histories.
@settings(max_examples=20, deadline=None)
@given(st.lists(_histories(), min_size=1, max_size=30))
def test_steps_decoded_oldest_first_are_those_of_the_whole_states(histories: list[list[bytes]]) -> None:
    assert _differing(histories) == [[] for _ in histories]
