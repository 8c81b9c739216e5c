"""The Node.js client's putStream against a sidecar that stops mid-stream: the writes it did not queue
are resent on the next stream, as the Python clients' put_stream resends them."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ckpt.sidecar.client import CheckpointClient
from ckpt.v1 import checkpoint_pb2, service_pb2
from tests.client.support import Fleet, scripted_server, wait_for
from tests.client.test_node_client import node_command
from tests.client.test_node_events_and_blobs import _UUID7
from tests.store.test_write_backlog import BUDGET_BYTES, lmdb_write_lock_held, queued_write_bytes, state
from tests.support import Sidecar, free_port


def _run(script: str, *args: str) -> list[dict[str, Any]]:
    proc = subprocess.run(node_command(script, *args), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


# putStream of `count` writes q-<i> to session q<i % 4>, state(i) of test_write_backlog, 8 to a batch;
# prints one line per result (JSON), then "done" (or the error it threw, with its `answered` and `unanswered`).
_STREAM = """
const { CheckpointClient } = require(process.argv[1]);
const [target, count, size] = process.argv.slice(2).map((a, i) => (i ? Number(a) : a));
const client = new CheckpointClient(target, { timeoutMs: 20000 });
function state(i) {
  const tail = Buffer.alloc(8);
  tail.writeBigUInt64BE(BigInt(i));
  return Buffer.concat([Buffer.alloc(size - 8, i % 251), tail]);
}
const puts = Array.from({ length: count }, (_, i) => ({
  sessionId: `q${i % 4}`, state: state(i), requestId: `q-${i}`,
}));
(async () => {
  for await (const r of client.putStream(puts, { batchSize: 8 })) {
    console.log(JSON.stringify(r.outcome === 'response'
      ? { version: r.response.version } : { code: r.error.code, message: r.error.message }));
  }
  console.log('"done"');
})().catch((e) => console.log(JSON.stringify({
  failed: e.code, answered: e.answered, unanswered: (e.unanswered || []).map((p) => p.requestId),
}))).finally(() => client.close());
"""


def test_node_resends_the_writes_a_stopping_sidecar_did_not_queue_in_order(fleet: Callable[..., Fleet]) -> None:
    """SIGTERM while the stream waits for room in a full write backlog (the writer stalled: this process
    holds LMDB's write lock): the sidecar answers the batch whole, the writes it had not queued UNAVAILABLE
    (not written), and ends the stream. Before, Node gave those as errors (code 14) and went on with the
    next batch on a new stream, so later writes to the same sessions were made and those were lost."""
    port = free_port()
    sidecars = fleet("--max-queued-write-bytes", str(BUDGET_BYTES), "--metrics-port", str(port))
    sidecar = sidecars[-1]
    sidecar.metrics_port = port  # type: ignore[attr-defined]
    n = 24
    args = node_command(_STREAM, sidecar.unix_target, str(n), str(len(state(0))))
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with lmdb_write_lock_held(sidecar):
            wait_for(lambda: queued_write_bytes(sidecar) == BUDGET_BYTES, "a full backlog")
            time.sleep(0.1)  # the stream's reader is waiting for room for its 4th write
            sidecar.process.send_signal(signal.SIGTERM)
            time.sleep(0.3)  # stop_streams(): the batch is answered once its 3 queued writes commit
            assert proc.poll() is None
        sidecars.restart(signal.SIGTERM)  # the queued writes commit, the sidecar exits and starts again
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines[-1:] == ["done"], (lines[-3:], err)
    results = lines[:-1]
    assert len(sidecars) == 2
    assert [r.get("version") for r in results] == [1 + i // 4 for i in range(n)], results[:8]
    with CheckpointClient(sidecars[-1].unix_target) as c:
        for s in range(4):
            head = c.get(f"q{s}")
            assert (head.version, head.state) == (6, state(20 + s))
            assert [v.version for v in c.history(f"q{s}")] == [6, 5, 4, 3, 2, 1]
    assert sidecars[-1].stop() == 0, sidecars[-1].log()


def _not_queued_after(batch: service_pb2.PutStreamRequest, queued: int) -> service_pb2.PutStreamResponse:
    """A stopping sidecar's answer to ``batch``: its first ``queued`` writes committed, the rest UNAVAILABLE."""
    unavailable = service_pb2.PutError(code=14, message="stopping: not queued")
    results = [
        service_pb2.PutResult(response=service_pb2.PutResponse(version=k + 1))
        if k < queued
        else service_pb2.PutResult(error=unavailable)
        for k in range(len(batch.puts))
    ]
    return service_pb2.PutStreamResponse(results=results, batch_id=batch.batch_id)


def test_node_gives_the_not_queued_results_as_they_are_when_the_stream_ends_ok(tmp_path: Path) -> None:
    """Trailing UNAVAILABLE results on a stream that then ends OK are results like any other (as the Python
    clients' ledger gives them): nothing is resent."""
    streams: list[list[str]] = []

    def script(requests: Iterator[service_pb2.PutStreamRequest]) -> Iterator[service_pb2.PutStreamResponse]:
        streams.append([])
        for batch in requests:
            streams[-1] += [p.request_id for p in batch.puts]
            yield _not_queued_after(batch, 2)

    with scripted_server(tmp_path / "stub.sock", script) as target:
        lines = _run(_STREAM, target, "4", "16")
    assert lines == [{"version": 1}, {"version": 2}, *[{"code": 14, "message": "stopping: not queued"}] * 2, "done"]
    assert streams == [["q-0", "q-1", "q-2", "q-3"]]


def test_node_gives_up_naming_the_not_queued_writes_unanswered(tmp_path: Path) -> None:
    """A stream that fails with a status not retried after trailing UNAVAILABLE results: those writes have
    no result; the error names them as `unanswered` (to resend as they are), after the 2 answered."""

    def script(requests: Iterator[service_pb2.PutStreamRequest]) -> Iterator[service_pb2.PutStreamResponse]:
        for batch in requests:
            yield _not_queued_after(batch, 2)
            raise RuntimeError("the stream fails UNKNOWN")

    with scripted_server(tmp_path / "stub.sock", script) as target:
        lines = _run(_STREAM, target, "4", "16")
    assert lines == [{"version": 1}, {"version": 2}, {"failed": 2, "answered": 2, "unanswered": ["q-2", "q-3"]}]


def test_node_gives_up_with_internal_when_the_stream_ends_ok_before_answering_a_batch(tmp_path: Path) -> None:
    """A stream that ends OK with a batch sent and not answered breaks the sidecar's contract: putStream
    ends with INTERNAL (as the Python clients' put_stream does), naming that batch unanswered, and opens no
    new stream to resend it."""
    streams: list[list[str]] = []

    def script(requests: Iterator[service_pb2.PutStreamRequest]) -> Iterator[service_pb2.PutStreamResponse]:
        streams.append([])
        for batch in requests:
            streams[-1] += [p.request_id for p in batch.puts]
            if len(streams[-1]) > 8:
                return  # ends the stream OK, this batch unanswered
            yield _not_queued_after(batch, len(batch.puts))

    with scripted_server(tmp_path / "stub.sock", script) as target:
        lines = _run(_STREAM, target, "12", "16")
    assert lines[:8] == [{"version": k + 1} for k in range(8)]
    assert lines[8:] == [{"failed": 13, "answered": 8, "unanswered": [f"q-{i}" for i in range(8, 12)]}]
    assert streams == [[f"q-{i}" for i in range(12)]]


# A putStream of one write on a client retrying without bound (retries: Infinity, timeoutMs 2 s) to a socket
# nobody serves: what it threw and when, or 'still retrying' after 15 s.
_STREAM_TO_NOBODY = """
const { CheckpointClient } = require(process.argv[1]);
const client = new CheckpointClient(process.argv[2], { retries: Infinity, timeoutMs: 2000 });
const t0 = Date.now();
const stream = (async () => {
  for await (const r of client.putStream([{ sessionId: 'down', state: Buffer.from([8, 1]), requestId: 'd-0' }])) void r;
})().catch((e) => ({ code: e.code, answered: e.answered, unanswered: e.unanswered.map((w) => w.requestId) }));
const late = new Promise((resolve) => setTimeout(resolve, 15000, 'still retrying'));
Promise.race([stream, late]).then((failed) => {
  console.log(JSON.stringify({ failed, ms: Date.now() - t0 }));
  client.close();
});
"""


def test_node_put_stream_to_a_sidecar_that_stays_down_gives_up_after_timeout_ms_with_unbounded_retries(
    tmp_path: Path,
) -> None:
    # Only `retries` ended a run of failures: with retries: Infinity putStream reconnected for ever, where a
    # unary put (and the Python clients' put_stream) gives up timeout_seconds after the failure.
    [out] = _run(_STREAM_TO_NOBODY, f"unix:{tmp_path / 'nobody.sock'}")
    assert out["failed"] == {"code": 14, "answered": 0, "unanswered": ["d-0"]}, out
    assert out["ms"] < 10000, out


# Writes to a socket nobody serves (two retries): the StreamError's `unanswered` as they are, then resent
# twice with putStream on the live sidecar: the results of each resend.
_RESEND_UNANSWERED = """
const { CheckpointClient } = require(process.argv[1]);
const [live, nobody, patch, whole] = process.argv.slice(2);
const down = new CheckpointClient(nobody, { retries: 2, timeoutMs: 5000 });
const client = new CheckpointClient(live);
const puts = [
  { sessionId: 'm', state: Buffer.from(patch, 'hex'), merge: true },
  { sessionId: 'r', state: Buffer.from(whole, 'hex'), requestId: 'mine', labels: { k: 'v' } },
];
(async () => {
  const out = {};
  try {
    for await (const r of down.putStream(puts)) void r;
  } catch (e) {
    out.unanswered = e.unanswered.map((w) => ({ ...w, state: Buffer.from(w.state).toString('hex') }));
    out.given_unchanged = puts.map((p) => p.requestId ?? null);
    const resend = async () => {
      const results = [];
      for await (const r of client.putStream(e.unanswered)) results.push([r.response.version, r.response.replayed]);
      return results;
    };
    out.first = await resend();
    out.again = await resend();
  }
  console.log(JSON.stringify(out));
})().finally(() => { down.close(); client.close(); });
"""


def test_node_put_stream_resends_a_stream_errors_unanswered_as_they_are(sidecar: Sidecar, tmp_path: Path) -> None:
    # `unanswered` held PutRequests (session_id, mode, request_id): putStream refused them (sessionId must be
    # a string), and rebuilding writes from them lost the request id and the mode (a merge resent as a
    # replace, under a new id).
    with CheckpointClient(sidecar.unix_target) as python:
        python.put("m", checkpoint_pb2.Checkpoint(goal="kept").SerializeToString())
    patch = checkpoint_pb2.Checkpoint(working_memory={"b": "2"}).SerializeToString().hex()
    whole = checkpoint_pb2.Checkpoint(goal="whole").SerializeToString().hex()
    [out] = _run(_RESEND_UNANSWERED, sidecar.unix_target, f"unix:{tmp_path / 'nobody.sock'}", patch, whole)
    first, second = out["unanswered"]
    assert re.fullmatch(_UUID7, first.pop("requestId")), out
    assert first == {"sessionId": "m", "state": patch, "merge": True}, out
    assert second == {"sessionId": "r", "state": whole, "requestId": "mine", "labels": {"k": "v"}}, out
    assert out["given_unchanged"] == [None, "mine"], out  # the caller's writes are not changed
    assert out["first"] == [[2, False], [1, False]], out
    assert out["again"] == [[2, True], [1, True]], out  # the same request ids: each write landed once
    with CheckpointClient(sidecar.unix_target) as python:
        merged = python.get("m")
        state = checkpoint_pb2.Checkpoint.FromString(merged.state)
        assert (merged.version, state.goal, dict(state.working_memory)) == (2, "kept", {"b": "2"})
        assert python.get("r").info.labels == {"k": "v"}
