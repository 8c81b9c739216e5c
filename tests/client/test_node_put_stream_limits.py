"""The Node.js client's putStream within its limits: batches packed under the client's maxMessageBytes as
the Python clients pack them, a write too big for any message refused by name, and a timeoutMs checked
as the Python clients' timeout_seconds, long ones kept."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckpt.sidecar.client import CheckpointClient
from tests.client.test_node_events_and_blobs import _run_node
from tests.support import Sidecar, start_sidecar

_MIB = 1 << 20

# Writes of `sizes` (bytes) to sessions big0..big2 on one putStream of a client with a 4 MiB message limit
# and the default batchSize: the versions answered, and what it threw (with `answered` and `unanswered`).
_PACKED = """
run(async () => {
  const small = new CheckpointClient(process.argv[2], { maxMessageBytes: 4 << 20 });
  const sizes = JSON.parse(process.argv[3]);
  const puts = sizes.map((size, i) => ({ sessionId: `big${i % 3}`, state: Buffer.alloc(size, i), requestId: `w${i}` }));
  const versions = [];
  const failed = await failure(async () => {
    try {
      for await (const r of small.putStream(puts)) versions.push(r.response.version);
    } catch (e) {
      Object.assign(e, { requestId: [e.requestId ?? null, e.answered ?? null, e.unanswered?.length ?? null] });
      throw e;
    } finally {
      small.close();
    }
  });
  return { versions, failed };
});
"""


def _packed(tmp_path: Path, sizes: list[int]) -> tuple[Sidecar, dict[str, Any]]:
    sidecar = start_sidecar(tmp_path / "data", "--max-message-bytes", str(4 * _MIB))
    return sidecar, _run_node(_PACKED, sidecar.unix_target, str(sizes))


def test_node_put_stream_packs_its_batches_within_the_message_limit(tmp_path: Path) -> None:
    # Batches were cut by count only: 64 writes of 1.1 MB went as one 70 MB message, and the whole
    # stream failed RESOURCE_EXHAUSTED though each write fits a message.
    sidecar, out = _packed(tmp_path, [1100 * 1024] * 20)
    try:
        assert out["failed"] is None, out
        assert out["versions"] == [i // 3 + 1 for i in range(20)], out
        with CheckpointClient(sidecar.unix_target, max_message_bytes=4 * _MIB) as python:
            assert [python.get(f"big{k}").version for k in range(3)] == [7, 7, 6]
    finally:
        assert sidecar.stop() == 0, sidecar.log()


def test_node_put_stream_refuses_a_write_too_big_for_any_message_by_name_after_those_before(tmp_path: Path) -> None:
    # The write went out in a batch and gRPC failed the whole stream, naming no write.
    sidecar, out = _packed(tmp_path, [1000, 2000, 5 * _MIB, 3000])
    try:
        failed = out["failed"]
        assert out["versions"] == [1, 1], out
        assert failed["code"] == 8, failed  # RESOURCE_EXHAUSTED
        assert "puts[2] (requestId 'w2')" in failed["message"], failed
        assert "over this client's message limit (maxMessageBytes = 4194304)" in failed["message"], failed
        assert failed["requestId"] == ["w2", None, None], failed  # not a stream's error: none unanswered
        with CheckpointClient(sidecar.unix_target) as python:
            assert sorted(s.session_id for s in python.sessions()) == ["big0", "big1"]
    finally:
        assert sidecar.stop() == 0, sidecar.log()


# What a client with each timeoutMs does: refused when made (its error), or a put and a putStream's result.
_TIMEOUTS = """
run(async () => {
  const out = {};
  for (const timeoutMs of [2 ** 31, 100 * 365.25 * 24 * 3600 * 1000, Infinity, 0, '30000']) {
    let patient;
    try {
      patient = new CheckpointClient(process.argv[2], { timeoutMs });
    } catch (e) {
      out[String(timeoutMs)] = { name: e.name, message: e.message };
      continue;
    }
    const put = await failure(() => patient.put('long', Buffer.from([8, 1])));
    const results = [];
    const stream = await failure(async () => {
      const puts = [{ sessionId: 'long', state: Buffer.from([8, 2]) }];
      for await (const r of patient.putStream(puts)) results.push(r.outcome);
    });
    patient.close();
    out[String(timeoutMs)] = { put, stream, results };
  }
  return out;
});
"""


def test_node_client_refuses_a_timeout_over_100_years_and_waits_out_long_ones(sidecar: Sidecar) -> None:
    # A putStream's wait used setTimeout, which fires at once for over 2^31 - 1 ms: with timeoutMs
    # 2 ** 31 (or Infinity, taken as "no timeout") it failed DEADLINE_EXCEEDED before its answer came.
    out = _run_node(_TIMEOUTS, sidecar.unix_target)
    for long in ("2147483648", "3155760000000"):
        assert out[long] == {"put": None, "stream": None, "results": ["response"]}, (long, out[long])
    for bad, name in (("Infinity", "RangeError"), ("0", "RangeError"), ("30000", "TypeError")):
        assert out[bad]["name"] == name, (bad, out[bad])
        assert out[bad]["message"].startswith("timeoutMs must be"), (bad, out[bad])
    assert "at most 3155760000000 (100 years), got Infinity" in out["Infinity"]["message"]
