"""The Node.js client refuses bad numeric arguments by name before anything is sent, as the Python
clients do (sidecar/client/arguments.py): proto-loader would otherwise truncate or zero them."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from ckpt.sidecar.client import CheckpointClient, NotFoundError
from tests.client.test_node_client import node_command
from tests.support import Sidecar

# Each call of CASES, what it answered or threw, by its label; printed as JSON.
_RUN_CASES = """
(async () => {
  const out = {};
  for (const [label, call] of Object.entries(CASES)) {
    try {
      const r = await call();
      out[label] = { answered: JSON.stringify(r).slice(0, 80) };
    } catch (e) {
      out[label] = { [e.constructor.name]: e.message };
    }
  }
  console.log(JSON.stringify(out));
})().finally(() => client.close());
"""


# Each call of CASES against a session "n" with versions 1..3: prints [label, what it threw or answered].
_CALLS = (
    """
const { CheckpointClient } = require(process.argv[1]);
const client = new CheckpointClient(process.argv[2], { timeoutMs: 5000 });
const state = Buffer.from([0x08, 0x07]);
const drain = async (results) => { const out = []; for await (const r of results) out.push(r); return out; };
const CASES = {
  'get -1': () => client.get('n', -1),
  'get NaN': () => client.get('n', NaN),
  'get abc': () => client.get('n', 'abc'),
  'get 1.5': () => client.get('n', 1.5),
  'get 2^53': () => client.get('n', 2 ** 53),
  'get sessionId 5': () => client.get(5),
  'put expectedVersion 3.7': () => client.put('n', state, { expectedVersion: 3.7 }),
  'put expectedVersion -1': () => client.put('new', state, { expectedVersion: -1 }),
  'put expectedVersion "3"': () => client.put('n', state, { expectedVersion: '3' }),
  'merge expectedVersion NaN': () => client.merge('n', state, { expectedVersion: NaN }),
  'fork version -1': () => client.fork('n', 'n-fork', { version: -1 }),
  'fork version 1.5': () => client.fork('n', 'n-fork', { version: 1.5 }),
  'putStream batchSize 0': () => drain(client.putStream([{ sessionId: 'n', state }], { batchSize: 0 })),
  'putStream batchSize 1001': () => drain(client.putStream([{ sessionId: 'n', state }], { batchSize: 1001 })),
  'putStream batchSize 2.5': () => drain(client.putStream([{ sessionId: 'n', state }], { batchSize: 2.5 })),
  'putStream puts 5': () => drain(client.putStream(5)),
  'putStream expectedVersion -1': () => drain(client.putStream([{ sessionId: 'new', state, expectedVersion: -1 }])),
  'putStream expectedVersion 3.7': () => drain(client.putStream([{ sessionId: 'n', state, expectedVersion: 3.7 }])),
  'put state string': () => client.put('n', 'text'),
  'put state array 300': () => client.put('n', [8, 300]),
  'put labels value 5': () => client.put('n', state, { labels: { k: 5 } }),
  'put requestId 5': () => client.put('n', state, { requestId: 5 }),
  'merge messageType 5': () => client.merge('n', state, { messageType: 5 }),
  'putStream state string': () => drain(client.putStream([{ sessionId: 'n', state: 'text' }])),
};
"""
    + _RUN_CASES
)

_WHOLE = "whole Number"


def _expected() -> dict[str, dict[str, Any]]:
    top = 2**53 - 1
    return {
        "get -1": {"RangeError": f"version must be in 0..{top}, got -1"},
        "get NaN": {"TypeError": f"version must be a {_WHOLE}, not NaN"},
        "get abc": {"TypeError": f'version must be a {_WHOLE}, not "abc"'},
        "get 1.5": {"TypeError": f"version must be a {_WHOLE}, not 1.5"},
        "get 2^53": {"TypeError": f"version must be a {_WHOLE}, not {2**53}"},
        "get sessionId 5": {"TypeError": "sessionId must be a string, not number"},
        "put expectedVersion 3.7": {"TypeError": f"expectedVersion must be a {_WHOLE}, not 3.7"},
        "put expectedVersion -1": {"RangeError": f"expectedVersion must be in 0..{top}, got -1"},
        'put expectedVersion "3"': {"TypeError": f'expectedVersion must be a {_WHOLE}, not "3"'},
        "merge expectedVersion NaN": {"TypeError": f"expectedVersion must be a {_WHOLE}, not NaN"},
        "fork version -1": {"RangeError": f"version must be in 0..{top}, got -1"},
        "fork version 1.5": {"TypeError": f"version must be a {_WHOLE}, not 1.5"},
        "putStream batchSize 0": {"RangeError": "batchSize must be in 1..1000, got 0"},
        "putStream batchSize 1001": {"RangeError": "batchSize must be in 1..1000, got 1001"},
        "putStream batchSize 2.5": {"TypeError": f"batchSize must be a {_WHOLE}, not 2.5"},
        "putStream puts 5": {"TypeError": "puts must be an iterable or async iterable of writes, not number"},
        "putStream expectedVersion -1": {"RangeError": f"puts[0]: expectedVersion must be in 0..{top}, got -1"},
        "putStream expectedVersion 3.7": {"TypeError": f"puts[0]: expectedVersion must be a {_WHOLE}, not 3.7"},
        "put state string": {"TypeError": "state must be a Buffer or a Uint8Array, not string"},
        "put state array 300": {"TypeError": "state[1] must be a byte value 0..255, not 300"},
        "put labels value 5": {"TypeError": 'labels["k"] must be a string, not number'},
        "put requestId 5": {"TypeError": "requestId must be a string, not number"},
        "merge messageType 5": {"TypeError": "messageType must be a string, not number"},
        "putStream state string": {"TypeError": "puts[0]: state must be a Buffer or a Uint8Array, not string"},
    }


def test_node_refuses_bad_versions_and_batch_sizes_by_name_and_writes_nothing(sidecar: Sidecar) -> None:
    """Before, get(-1), get(NaN) and get('abc') read the head and get(1.5) version 1; expectedVersion 3.7
    ran the compare-and-set against 3 and -1 against 0 (creating 'new'); fork version -1 forked the head;
    putStream with batchSize 0 wrote nothing and answered nothing, silently."""
    with CheckpointClient(sidecar.unix_target) as c:
        for k in range(3):
            c.put("n", bytes([0x08, k]))
    proc = subprocess.run(node_command(_CALLS, sidecar.unix_target), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == _expected()
    with CheckpointClient(sidecar.unix_target) as c:
        assert [v.version for v in c.history("n")] == [3, 2, 1]  # nothing written
        assert c.get("n").state == bytes([0x08, 2])
        for absent in ("new", "n-fork"):
            with pytest.raises(NotFoundError):
                c.get(absent)


_OPTIONS = """
const { CheckpointClient } = require(process.argv[1]);
const CASES = {
  'retries -1': { retries: -1 },
  'retries 1.5': { retries: 1.5 },
  'retries "8"': { retries: '8' },
  'maxMessageBytes 100': { maxMessageBytes: 100 },
  'maxMessageBytes 2^31': { maxMessageBytes: 2 ** 31 },
  'maxMessageBytes NaN': { maxMessageBytes: NaN },
};
const out = {};
for (const [label, options] of Object.entries(CASES)) {
  try {
    new CheckpointClient(process.argv[2], options).close();
    out[label] = 'accepted';
  } catch (e) {
    out[label] = { [e.constructor.name]: e.message };
  }
}
const TAKEN = [{ retries: Infinity }, { retries: 0 }, { maxMessageBytes: 1024 }, { maxMessageBytes: 2 ** 31 - 1 }];
for (const options of TAKEN) {
  new CheckpointClient(process.argv[2], options).close();
}
console.log(JSON.stringify(out));
"""


def test_node_refuses_bad_client_options_by_name(sidecar: Sidecar) -> None:
    """retries and maxMessageBytes were taken unchecked: a negative or fractional retry count, or a message
    limit gRPC cannot hold, failed later or not at all. Refused as the Python clients refuse them."""
    proc = subprocess.run(node_command(_OPTIONS, sidecar.unix_target), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    top = 2**53 - 1
    assert json.loads(proc.stdout) == {
        "retries -1": {"RangeError": f"retries must be in 0..{top}, got -1"},
        "retries 1.5": {"TypeError": f"retries must be a {_WHOLE}, not 1.5"},
        'retries "8"': {"TypeError": f'retries must be a {_WHOLE}, not "8"'},
        "maxMessageBytes 100": {"RangeError": f"maxMessageBytes must be in 1024..{2**31 - 1}, got 100"},
        "maxMessageBytes 2^31": {"RangeError": f"maxMessageBytes must be in 1024..{2**31 - 1}, got {2**31}"},
        "maxMessageBytes NaN": {"TypeError": f"maxMessageBytes must be a {_WHOLE}, not NaN"},
    }


# Calls whose ids, labels, page sizes and flags were sent unchecked: printed as _CALLS prints its own.
_UNCHECKED = (
    """
const { CheckpointClient } = require(process.argv[1]);
const client = new CheckpointClient(process.argv[2], { timeoutMs: 5000 });
const state = Buffer.from([0x08, 0x07]);
const drain = async (results) => { const out = []; for await (const r of results) out.push(r); return out; };
const CASES = {
  'delete 7': () => client.delete(7),
  "delete ['null']": () => client.delete(['null']),
  'delete lone surrogate': () => client.delete('n\\ud800'),
  'fork labels undefined value': () => client.fork('n', 'n-fork', { labels: { k: undefined } }),
  'fork labels object value': () => client.fork('n', 'n-fork', { labels: { k: { a: 1 } } }),
  'fork labels string': () => client.fork('n', 'n-fork', { labels: 'k=v' }),
  'fork labels Map': () => client.fork('n', 'n-fork', { labels: new Map([['k', 'v']]) }),
  'sessions labels Map': () => drain(client.sessions({ labels: new Map([['team', 'none']]) })),
  'fork copyEvents "yes"': () => client.fork('n', 'n-fork', { copyEvents: 'yes' }),
  'sessions labels null value': () => drain(client.sessions({ labels: { e: null } })),
  'sessions pageSize 5000': () => drain(client.sessions({ pageSize: 5000 })),
  'sessions pageSize "5"': () => drain(client.sessions({ pageSize: '5' })),
  'get fieldMask [5]': () => client.get('n', 0, { fieldMask: [5] }),
  'registerType typeName 5': () => client.registerType(null, 5),
  'appendEvents put.merge "false"': () => client.appendEvents('n', [{ type: 't' }], { put: { state, merge: 'false' } }),
  'putStream merge 1': () => drain(client.putStream([{ sessionId: 'n', state, merge: 1 }])),
};
"""
    + _RUN_CASES
)


def test_node_refuses_unchecked_ids_labels_page_sizes_and_flags_by_name_and_sends_nothing(sidecar: Sidecar) -> None:
    """Before, delete(7) deleted session "7" and delete(['null']) "null"; fork stored the labels
    {k: undefined} as "undefined" and {k: {a: 1}} as "[object Object]"; sessions filtered on e="null";
    merge: 'false' merged; labels given as a Map read as none (a fork without labels, every session listed)."""
    with CheckpointClient(sidecar.unix_target) as c:
        for session_id in ("7", "null"):
            c.put(session_id, b"x")
        for k in range(3):
            c.put("n", bytes([0x08, k]))
    proc = subprocess.run(node_command(_UNCHECKED, sidecar.unix_target), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {
        "delete 7": {"TypeError": "sessionId must be a string, not number"},
        "delete ['null']": {"TypeError": "sessionId must be a string, not an array"},
        "delete lone surrogate": {"TypeError": "sessionId holds a lone surrogate, which is not text"},
        "fork labels undefined value": {"TypeError": 'labels["k"] must be a string, not undefined'},
        "fork labels object value": {"TypeError": 'labels["k"] must be a string, not Object'},
        "fork labels string": {"TypeError": "labels must be an object of strings, not string"},
        "fork labels Map": {"TypeError": "labels must be an object of strings, not Map"},
        "sessions labels Map": {"TypeError": "labels must be an object of strings, not Map"},
        'fork copyEvents "yes"': {"TypeError": "copyEvents must be a boolean, not string"},
        "sessions labels null value": {"TypeError": 'labels["e"] must be a string, not null'},
        "sessions pageSize 5000": {"RangeError": "pageSize must be in 0..1000, got 5000"},
        'sessions pageSize "5"': {"TypeError": f'pageSize must be a {_WHOLE}, not "5"'},
        "get fieldMask [5]": {"TypeError": "fieldMask[0] must be a string, not number"},
        "registerType typeName 5": {"TypeError": "typeName must be a string, not number"},
        'appendEvents put.merge "false"': {"TypeError": "put.merge must be a boolean, not string"},
        "putStream merge 1": {"TypeError": "puts[0]: merge must be a boolean, not number"},
    }
    with CheckpointClient(sidecar.unix_target) as c:
        assert sorted(s.session_id for s in c.sessions()) == ["7", "n", "null"]  # none deleted nor forked
        assert [v.version for v in c.history("n")] == [3, 2, 1]
        assert list(c.events("n")) == []
