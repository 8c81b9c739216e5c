"""The Node.js client's masked Gets and cachedCall against a real sidecar, and its tool-cache keys: the
same as the Python clients' for the same call, so a result either records the other hits."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt.sidecar.client import CheckpointClient
from ckpt.sidecar.client.toolcache import tool_cache_key
from ckpt.v1 import checkpoint_pb2 as pb
from tests.client.test_node_client import node_command
from tests.client.test_tool_cache import UNANSWERABLE, assert_each_entry_replaced, unanswerable_checkpoint
from tests.support import Sidecar

# Keys of calls read as JSON from stdin ([tool, args] pairs): printed as JSON.
_KEYS = """
const { toolCacheKey } = require(process.argv[1]);
let input = '';
process.stdin.on('data', (d) => { input += d; }).on('end', () => {
  console.log(JSON.stringify(JSON.parse(input).map(([tool, args]) => toolCacheKey(tool, args))));
});
"""

_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=8)  # no lone surrogates: not text
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=12,
)
_FIXED: list[list[Any]] = [
    ["search", {"q": "ckpt", "limit": 10}],
    ["search", {"limit": 10.0, "q": "ckpt"}],
    ["t", {"\U0001f600": 1, "\uffff": 2, "é": [1e21, 1e-7, -0.0, 0.1, 5e-324, 1.7976931348623157e308]}],
    ["t", ["\u2028", "\x00\x1f\x7f", '"\\']],
    ["", None],
]


def _node_keys(calls: list[Any]) -> list[dict[str, str]]:
    proc = subprocess.run(node_command(_KEYS), input=json.dumps(calls), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return list(json.loads(proc.stdout))


@settings(max_examples=10)
@given(st.lists(st.tuples(_text.filter(lambda t: "\0" not in t), _json), min_size=1, max_size=40))
def test_node_computes_the_python_clients_key_for_the_same_call(calls: list[tuple[str, Any]]) -> None:
    everything: list[list[Any]] = _FIXED + [[tool, args] for tool, args in calls]
    expected = [dict(zip(("key", "canonical"), tool_cache_key(tool, args), strict=True)) for tool, args in everything]
    assert _node_keys(everything) == expected


def test_node_keys_a_number_as_python_keys_the_numpy_float_of_it() -> None:
    values = [0.5, 0.1, 1e21, 1.5e-7, -2.5e-10, 5e-324, 1.7976931348623157e308, 10.0, -0.0]
    node = _node_keys([["t", {"x": x}] for x in values])
    python = [dict(zip(("key", "canonical"), tool_cache_key("t", {"x": np.float64(x)}), strict=True)) for x in values]
    assert node == python


# Node's side of a session: cachedCall of a tool that prints when it runs, then a masked Get.
_NODE_AGENT = """
const { CheckpointClient } = require(process.argv[1]);
const [target, session, tool, args, result] = process.argv.slice(2);
const client = new CheckpointClient(target);
(async () => {
  const out = { ran: 0 };
  const paid = async () => { out.ran += 1; return JSON.parse(result); };
  out.first = await client.cachedCall(session, tool, JSON.parse(args), paid);
  out.second = await client.cachedCall(session, tool, JSON.parse(args), paid);
  try {
    await client.cachedCall(session, tool, { other: true }, () => { throw new Error('the tool failed'); });
  } catch (err) {
    out.failed = err.message;
  }
  const masked = await client.get(session, 0, { fieldMask: ['tool_cache'] });
  out.masked = { type: masked.message_type, state: masked.state.toString('hex') };
  try {
    await client.get(session, 0, { fieldMask: ['tool_cache.x'] });
  } catch (err) {
    out.bad_mask = { code: err.code, details: err.details };
  }
  console.log(JSON.stringify(out));
})().catch((err) => { console.error(err); process.exit(1); }).finally(() => client.close());
"""


def _node_agent(sidecar: Sidecar, session: str, tool: str, args: Any, result: Any) -> dict[str, Any]:
    command = node_command(_NODE_AGENT, sidecar.unix_target, session, tool, json.dumps(args), json.dumps(result))
    proc = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def test_a_result_either_client_records_the_other_hits(sidecar: Sidecar) -> None:
    args = {"q": "ckpt", "filters": {"lang": "py", "year": 2026.0}}
    with CheckpointClient(sidecar.unix_target) as client:
        client.put("shared", message=pb.Checkpoint(goal="g", messages=[pb.Message(content="long history")]))
        assert client.cached_call("shared", "search", args, lambda: {"from": "python"}) == {"from": "python"}
        # Node hits Python's record (its tool never runs), and records a call of its own.
        node = _node_agent(sidecar, "shared", "search", args, {"from": "node"})
        assert node["ran"] == 0 and node["first"] == node["second"] == {"from": "python"}
        assert node["failed"] == "the tool failed"
        masked = pb.Checkpoint.FromString(bytes.fromhex(node["masked"]["state"]))
        assert node["masked"]["type"] == "ckpt.v1.Checkpoint"
        assert not masked.messages and not masked.goal and len(masked.tool_cache) == 1  # the failure: not recorded
        assert node["bad_mask"]["code"] == 3  # INVALID_ARGUMENT
        assert (
            "'tool_cache.x': ckpt.v1.Checkpoint.tool_cache is not a singular message field"
            in node["bad_mask"]["details"]
        )
        # A call Node records is one Python hits.
        fresh = _node_agent(sidecar, "shared", "fetch", [1, 2, 3], {"from": "node", "n": 1.5})
        assert fresh["ran"] == 1 and fresh["first"] == fresh["second"] == {"from": "node", "n": 1.5}
        hit = client.cached_call("shared", "fetch", (1, 2, 3.0), lambda: {"from": "python"})
        assert hit == {"from": "node", "n": 1.5}
        assert pb.Checkpoint.FromString(client.get("shared").state).goal == "g"  # the state beside it kept


# cachedCall with arguments or results that are no JSON values: each outcome printed, then nothing else.
_NODE_NOT_JSON = """
const { CheckpointClient } = require(process.argv[1]);
const client = new CheckpointClient(process.argv[2]);
(async () => {
  const out = { ran: 0, outcomes: [] };
  const tool = (result) => () => { out.ran += 1; return result; };
  const calls = [
    ['map', new Map([['q', 'a']]), tool('A')],
    ['map', new Map([['q', 'b']]), tool('B')],
    ['set', { q: ['x', new Set([1])] }, tool('S')],
    ['result', { q: 'x' }, tool({ found: new Map([['k', 1]]) })],
    ['plain', { when: new Date(0), bare: Object.assign(Object.create(null), { b: 1 }) }, tool({ ok: [new Date(0)] })],
  ];
  for (const [name, args, fn] of calls) {
    try {
      out.outcomes.push({ value: await client.cachedCall('not-json', name, args, fn) });
    } catch (err) {
      out.outcomes.push({ error: `${err.constructor.name}: ${err.message}` });
    }
  }
  console.log(JSON.stringify(out));
})().catch((err) => { console.error(err); process.exit(1); }).finally(() => client.close());
"""


def test_node_refuses_a_map_or_set_as_arguments_or_result_rather_than_write_it_as_an_empty_object(
    sidecar: Sidecar,
) -> None:
    proc = subprocess.run(node_command(_NODE_NOT_JSON, sidecar.unix_target), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    shape = "is not a JSON value (null, a boolean, number or string, an array, a plain object)"
    assert out["outcomes"] == [
        {"error": f"TypeError: args: a Map {shape}"},
        {"error": f"TypeError: args: a Map {shape}"},  # not a hit of the first: neither ran
        {"error": f"TypeError: args.q[1]: a Set {shape}"},
        {"error": f"TypeError: result.found: a Map {shape}"},  # the tool ran; nothing recorded
        {"value": {"ok": ["1970-01-01T00:00:00.000Z"]}},  # toJSON applied, a null prototype plain
    ]
    assert out["ran"] == 2
    with CheckpointClient(sidecar.unix_target) as client:
        cache = pb.Checkpoint.FromString(client.get("not-json").state).tool_cache
        key, canonical = tool_cache_key("plain", {"when": "1970-01-01T00:00:00.000Z", "bare": {"b": 1}})
        assert list(cache) == [key] and cache[key].canonical_args_json == canonical


# cachedCall of each case's arguments twice, with a tool that counts its runs: the outcomes printed.
_NODE_UNANSWERABLE = """
const { CheckpointClient } = require(process.argv[1]);
const [target, cases] = process.argv.slice(2);
const client = new CheckpointClient(target);
(async () => {
  const out = { ran: [], values: [] };
  for (const c of JSON.parse(cases)) {
    for (let i = 0; i < 2; i += 1) {
      const fetch = () => { out.ran.push(c); return { fresh: c }; };
      out.values.push(await client.cachedCall('node', 'fetch', { case: c }, fetch));
    }
  }
  console.log(JSON.stringify(out));
})().catch((err) => { console.error(err); process.exit(1); }).finally(() => client.close());
"""


def test_node_misses_an_entry_holding_no_readable_result_and_replaces_it(sidecar: Sidecar) -> None:
    with CheckpointClient(sidecar.unix_target) as client:
        client.put("node", message=unanswerable_checkpoint())
        command = node_command(_NODE_UNANSWERABLE, sidecar.unix_target, json.dumps(list(UNANSWERABLE)))
        proc = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["ran"] == list(UNANSWERABLE)  # once each: a miss, then a hit of its record
        assert out["values"] == [{"fresh": case} for case in UNANSWERABLE for _ in range(2)]
        assert_each_entry_replaced(client.get("node").state)


# Node's Gets naming a state it holds: the one a put answered, then another.
_NODE_KNOWN = """
const { CheckpointClient } = require(process.argv[1]);
const [target, session] = process.argv.slice(2);
const client = new CheckpointClient(target);
(async () => {
  const put = await client.put(session, Buffer.from('held state '.repeat(100)));
  const held = await client.get(session, 0, { knownStateXxh3: put.state_xxh3 });
  const other = await client.get(session, 0, { knownStateXxh3: 1n });
  const out = { xxh3: put.state_xxh3, info: held.info.state_xxh3, version: held.version };
  out.held = { omitted: held.state_omitted, bytes: held.state.length };
  out.other = { omitted: other.state_omitted, state: other.state.toString() };
  try {
    await client.get(session, 0, { knownStateXxh3: 2 ** 60 });
  } catch (err) {
    out.refused = err.message;
  }
  console.log(JSON.stringify(out));
})().catch((err) => { console.error(err); process.exit(1); }).finally(() => client.close());
"""


def test_node_leaves_out_the_state_it_holds(sidecar: Sidecar) -> None:
    proc = subprocess.run(
        node_command(_NODE_KNOWN, sidecar.unix_target, "node-held"), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["xxh3"] == out["info"] and out["version"] == 1
    assert out["held"] == {"omitted": True, "bytes": 0}
    assert out["other"] == {"omitted": False, "state": "held state " * 100}
    assert out["refused"].startswith("knownStateXxh3 must be a decimal string")
