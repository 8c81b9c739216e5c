"""The Node.js client's sessions({ prefix }): the sessions whose id starts with it, through a real Node process
and a real sidecar, and a prefix refused by name (by the client before sending, or by the sidecar)."""

from __future__ import annotations

import json
import subprocess

from ckpt.sidecar.client import CheckpointClient
from ckpt.v1 import service_pb2
from tests.client.test_node_client import node_command
from tests.support import Sidecar

# Prints each listing's session ids (or the error it threw: its name, gRPC code and message).
_LISTINGS = """
const { CheckpointClient } = require(process.argv[1]);
const client = new CheckpointClient(process.argv[2], { timeoutMs: 5000 });
const CASES = {
  'a/': { prefix: 'a/' },
  'a/ by pages of 1': { prefix: 'a/', pageSize: 1 },
  'a with labels': { prefix: 'a', labels: { team: 'red' } },
  'é': { prefix: 'é' },
  'none': {},
  'empty': { prefix: '' },
  'number': { prefix: 5 },
  'lone surrogate': { prefix: 'a\\udcc3' },
  'too long': { prefix: 'x'.repeat(257) },
};
(async () => {
  const out = {};
  for (const [label, filter] of Object.entries(CASES)) {
    try {
      const ids = [];
      for await (const s of client.sessions(filter)) ids.push(s.session_id);
      out[label] = ids;
    } catch (err) {
      out[label] = `${err.name} ${err.code}: ${err.details || err.message}`;
    }
  }
  client.close();
  console.log(JSON.stringify(out));
})().catch((err) => { console.error(err); process.exit(1); });
"""


def test_node_client_lists_sessions_by_id_prefix(sidecar: Sidecar) -> None:
    with CheckpointClient(sidecar.unix_target) as c:
        for sid in ("a", "a/1", "a/2", "a0", "b", "é1", "ê"):
            c.put(sid, b"", labels={"team": "blue" if sid == "a/2" else "red"})
        c.append_events("a/3", [service_pb2.Event(type="note")])
    proc = subprocess.run(node_command(_LISTINGS, sidecar.unix_target), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    every = ["a", "a/1", "a/2", "a/3", "a0", "b", "é1", "ê"]
    assert json.loads(proc.stdout) == {
        "a/": ["a/1", "a/2", "a/3"],
        "a/ by pages of 1": ["a/1", "a/2", "a/3"],
        "a with labels": ["a", "a/1", "a0"],
        "é": ["é1"],
        "none": every,
        "empty": every,
        "number": "TypeError undefined: prefix must be a string, not number",
        "lone surrogate": "TypeError undefined: prefix holds a lone surrogate, which is not text",
        "too long": "Error 3: session_id_prefix is 257 bytes; the limit is 256",
    }
