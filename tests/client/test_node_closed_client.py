"""A Node.js client's calls after close(): each fails CANCELLED naming close() (a CallError with its code),
as the Python clients' ClientClosedError, never gRPC's "Channel has been shut down" without a code."""

from __future__ import annotations

from tests.client.test_node_events_and_blobs import _run_node
from tests.support import Sidecar

_CLOSED = """
run(async () => {
  const state = Buffer.from([8, 1]);
  await client.put('s', state);  // connected
  const pending = client.put('s', state);  // issued before close(), sent after it
  client.close();
  const calls = {
    pending: () => pending,
    put: () => client.put('s', state, { requestId: 'after-close' }),
    get: () => client.get('s'),
    appendEvents: () => client.appendEvents('s', [{ type: 't' }]),
    events: async () => { for await (const e of client.events('s')) void e; },
    putStream: async () => { for await (const r of client.putStream([{ sessionId: 's', state }])) void r; },
    putBlob: () => client.putBlob(Buffer.from('blob'), { sessionId: 's' }),
    getBlob: async () => { for await (const c of client.getBlob('0'.repeat(64))) void c; },
    getBlobToFile: () => client.getBlobToFile('0'.repeat(64), path.join(process.argv[3], 'out')),
  };
  const out = {};
  for (const [name, call] of Object.entries(calls)) out[name] = await failure(call);
  return out;
});
"""


def test_every_call_on_a_closed_node_client_fails_cancelled_naming_close(sidecar: Sidecar, tmp_path) -> None:
    out = _run_node(_CLOSED, sidecar.unix_target, str(tmp_path))
    for name, failed in out.items():
        assert failed is not None, name
        assert failed["code"] == 1, (name, failed)  # CANCELLED
        assert "the client is closed (close() was called)" in failed["message"], (name, failed)
    assert out["put"]["requestId"] == "after-close"
    assert not (tmp_path / "out").exists()
