"""A Node.js client's calls after close(): each fails CANCELLED naming close() (a CallError with its code),
as the Python clients' ClientClosedError, never gRPC's "Channel has been shut down" without a code."""

from __future__ import annotations

import time
from pathlib import Path

from ckpt.sidecar.client import CheckpointClient
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


# A client retrying for ever (retries 1e9, timeoutMs a minute), closed: each call is timed, none waited on past 5 s.
_CLOSED_NOT_RETRIED = """
run(async () => {
  const patient = new CheckpointClient(process.argv[2], { retries: 1e9, timeoutMs: 60000 });
  await patient.put('s', Buffer.from([8, 1]));
  patient.close();
  const timed = async (fn) => {
    const t0 = Date.now();
    const late = new Promise((resolve) => setTimeout(resolve, 5000, 'still waiting'));
    const failed = await Promise.race([failure(fn), late]);
    return { failed, ms: Date.now() - t0 };
  };
  return {
    get: await timed(() => patient.get('s')),
    putStream: await timed(async () => {
      for await (const r of patient.putStream([{ sessionId: 's', state: Buffer.from([8, 2]) }])) void r;
    }),
  };
});
"""


def test_a_closed_node_clients_calls_fail_at_once_and_are_not_retried(sidecar: Sidecar) -> None:
    # Its CANCELLED was retried as a sidecar's is: a get took the retries' 4.55 s, and a putStream of a
    # client with many retries never ended.
    out = _run_node(_CLOSED_NOT_RETRIED, sidecar.unix_target)
    for name, timed in out.items():
        assert timed["failed"] != "still waiting", name
        assert timed["failed"]["code"] == 1, (name, timed)
        assert "the client is closed (close() was called)" in timed["failed"]["message"], (name, timed)
        assert timed["ms"] < 1000, (name, timed)


# A putStream of 30 writes given 100 ms apart, close() called at 0.5 s; what it threw, with `answered`,
# `unanswered`, the results it gave and how many came after close().
_CLOSED_UNDER_STREAM = """
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
run(async () => {
  async function* steps() {
    for (let i = 0; i < 30; i++) {
      yield { sessionId: 'st', state: Buffer.from([8, i + 1]) };
      await sleep(100);
    }
  }
  let closed = false;
  const out = { results: 0, after_close: 0 };
  const stream = (async () => {
    for await (const r of client.putStream(steps(), { batchSize: 4 })) {
      out.results += 1;
      if (closed) out.after_close += 1;
    }
  })().catch((e) => ({ code: e.code, message: e.message, answered: e.answered, unanswered: e.unanswered.length }));
  await sleep(500);
  client.close();
  closed = true;
  out.failed = (await stream) ?? null;
  return out;
});
"""


def test_close_ends_a_node_put_stream_naming_the_writes_answered_and_writes_no_more(sidecar: Sidecar) -> None:
    # close() closed the channel only: the stream went on reading `puts` and committing its writes
    # (25 more of 30), then ended as if nothing had happened.
    out = _run_node(_CLOSED_UNDER_STREAM, sidecar.unix_target)
    failed = out["failed"]
    assert failed is not None, out
    assert failed["code"] == 1, failed  # CANCELLED
    assert "the client is closed (close() was called) during putStream" in failed["message"], failed
    assert 1 <= out["results"] < 30 and out["after_close"] == 0, out
    assert failed["answered"] == out["results"], out
    assert f"{out['results']} writes" in failed["message"], failed
    time.sleep(0.5)  # a write sent after close() would land by now
    with CheckpointClient(sidecar.unix_target) as python:  # one sent and cut by close() may have landed
        assert out["results"] <= python.get("st").version <= out["results"] + failed["unanswered"], out


# A 32 MiB blob read a chunk at a time, close() called after the first: what reading on throws.
_CLOSED_UNDER_READ = """
run(async () => {
  const other = new CheckpointClient(process.argv[2]);
  const ref = await other.putBlob(crypto.randomBytes(32 << 20), { sessionId: 's' });
  other.close();
  let chunks = 0;
  const failed = await failure(async () => {
    for await (const c of client.getBlob(ref)) {
      chunks += 1;
      if (chunks === 1) client.close();
    }
  });
  return { failed, chunks };
});
"""


def test_close_cancels_a_node_call_in_flight(sidecar: Sidecar) -> None:
    # close() closed the channel only, which lets the calls on it run on: the read went on to the end.
    out = _run_node(_CLOSED_UNDER_READ, sidecar.unix_target)
    assert out["failed"] is not None, out
    assert out["failed"]["code"] == 1, out
    assert "the client is closed (close() was called)" in out["failed"]["message"], out
    assert out["chunks"] < 32, out


# putBlob on sources that wait for ever once they gave a first piece (an idle Readable, an async generator,
# an iterator whose next() never settles), close() called at 200 ms: what each threw, how long after close()
# (or 'still waiting' 3 s later), and whether its source was stopped.
_CLOSED_UNDER_BLOB_SOURCE = """
const waitForever = () => new Promise(() => {});
run(async () => {
  const stopped = {};
  const readable = new Readable({ read() {} });
  readable.push(Buffer.alloc(1000, 1));
  readable.on('close', () => { stopped.readable = true; });
  async function* generator() {
    try {
      yield Buffer.alloc(1000, 2);
      await new Promise((resolve) => setTimeout(resolve, 1500));
      yield Buffer.alloc(1000, 3);
    } finally {
      stopped.generator = true;
    }
  }
  let given = false;
  const iterator = {
    next() {
      if (given) return waitForever();
      given = true;
      return Promise.resolve({ value: Buffer.alloc(1000, 4), done: false });
    },
    return: async () => { stopped.iterator = true; return { done: true }; },
    [Symbol.asyncIterator]() { return this; },
  };
  const calls = Object.entries({ readable, generator: generator(), iterator })
    .map(([name, source]) => [name, client.putBlob(source, { sessionId: 'b' })]);
  await new Promise((resolve) => setTimeout(resolve, 200));
  const closedAt = Date.now();
  client.close();
  const out = {};
  for (const [name, call] of calls) {
    const late = new Promise((resolve) => setTimeout(resolve, 3000, 'still waiting'));
    const failed = await Promise.race([failure(() => call), late]);
    out[name] = { failed, ms: Date.now() - closedAt };
  }
  await new Promise((resolve) => setTimeout(resolve, 1600));  // the generator's wait over: its finally ran
  out.stopped = stopped;
  return out;
});
"""


def test_close_ends_a_node_put_blob_waiting_on_its_source_at_once_and_stops_the_source(sidecar: Sidecar) -> None:
    # putBlob read its source before it looked at the call again: on a source that never gave another piece
    # its promise never settled after close(), and on a slow one it rejected only once the piece came.
    out = _run_node(_CLOSED_UNDER_BLOB_SOURCE, sidecar.unix_target)
    for name in ("readable", "generator", "iterator"):
        timed = out[name]
        assert timed["failed"] != "still waiting", (name, timed)
        assert timed["failed"]["code"] == 1, (name, timed)
        assert "the client is closed (close() was called)" in timed["failed"]["message"], (name, timed)
        assert timed["ms"] < 1000, (name, timed)
    assert out["stopped"] == {"readable": True, "generator": True, "iterator": True}, out


# Five clients retrying a put for ever (a socket nobody serves), each closed at its own moment of the retries'
# 1 s waits: how long after close() each put rejected, and with what.
_CLOSED_WAITING_TO_RETRY = """
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
run(async () => {
  const puts = Array.from({ length: 5 }, async (_, i) => {
    const patient = new CheckpointClient(process.argv[3], { retries: 1e9, timeoutMs: 60000 });
    const put = failure(() => patient.put('s', Buffer.from([8, 1]), { requestId: `r${i}` }));
    await sleep(2600 + 200 * i);  // past the backoff's growth: each wait is 1 s
    const closedAt = Date.now();
    patient.close();
    const failed = await put;
    return { failed, ms: Date.now() - closedAt };
  });
  return { puts: await Promise.all(puts) };
});
"""


def test_close_ends_a_node_call_waiting_to_retry_at_once(sidecar: Sidecar, tmp_path: Path) -> None:
    # The wait before a retry was a plain timer: close() rejected the call only once it fired, up to 1 s
    # later, and the timer kept the process alive that long.
    out = _run_node(_CLOSED_WAITING_TO_RETRY, sidecar.unix_target, f"unix:{tmp_path / 'nobody.sock'}")["puts"]
    for i, timed in enumerate(out):
        assert timed["failed"]["code"] == 1, timed
        assert "the client is closed (close() was called)" in timed["failed"]["message"], timed
        assert timed["failed"]["requestId"] == f"r{i}", timed
    assert max(timed["ms"] for timed in out) < 500, out
