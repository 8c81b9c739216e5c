"""A Node.js blob transfer the caller stops mid-stream, as Node code stops a stream: a putBlob whose
Readable is destroyed (with or without an error) rejects at once and stores nothing, leaving no partly
written file in the sidecar; a getBlob read through Readable.from that is destroyed, or piped into a
writer that fails, ends its call, so the sidecar holds the blob file no longer. The same client goes on."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from ckpt.bench.output import process_and_children
from tests.client.test_node_client import node_command
from tests.support import Sidecar

_SCRIPT = r"""
const { CheckpointClient } = require(process.argv[1]);
const crypto = require('crypto');
const fs = require('fs');
const path = require('path');
const { Readable, Writable } = require('stream');
const { pipeline } = require('stream/promises');
const [target, dir, dataDir, pids] = process.argv.slice(2);
const client = new CheckpointClient(target);
const tmpDir = path.join(dataDir, 'blobs', 'tmp');
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const failure = async (fn) => {
  try {
    await fn();
    return null;
  } catch (e) {
    return { code: e.code ?? null, message: e.message };
  }
};
const partial = () => (fs.existsSync(tmpDir) ? fs.readdirSync(tmpDir) : []);
// Blob files open in the sidecar's processes.
const openBlobFiles = () => JSON.parse(pids).flatMap((pid) => {
  try {
    return fs.readdirSync(`/proc/${pid}/fd`).map((fd) => fs.readlinkSync(`/proc/${pid}/fd/${fd}`));
  } catch {
    return [];
  }
}).filter((name) => name.includes('/blobs/')).length;
const until = async (condition) => {
  for (const deadline = Date.now() + 5000; !condition() && Date.now() < deadline;) await sleep(10);
  return condition();
};
const unhandled = [];
process.on('unhandledRejection', (err) => unhandled.push(String(err)));

(async () => {
  const out = { puts: [], reads: [] };
  const big = crypto.randomBytes(64 << 20);
  const file = path.join(dir, 'big.bin');
  fs.writeFileSync(file, big);
  for (const error of [null, new Error('stopped by the caller')]) {
    const source = fs.createReadStream(file, { highWaterMark: 16 << 10 });
    const put = client.putBlob(source, { sessionId: 's', chunkSizeBytes: 16 << 10 });
    let settled = false;
    put.then(() => {}, () => {}).finally(() => { settled = true; });
    const started = await until(() => partial().length > 0 || settled); // the sidecar is writing it
    const underWay = started && !settled;
    if (error === null) source.destroy(); else source.destroy(error);
    const before = Date.now();
    const outcome = await failure(() => put);
    out.puts.push({ underWay, outcome, ms: Date.now() - before, partialGone: await until(() => partial().length === 0),
      stored: await failure(() => client.getBlobToFile(crypto.createHash('sha256').update(big).digest('hex'),
        path.join(dir, 'copy.bin'))) });
  }
  const ref = await client.putBlob(big.subarray(0, 48 << 20), { sessionId: 's' });
  for (const how of ['destroyed', 'write failed']) {
    let outcome;
    if (how === 'destroyed') {
      const reader = Readable.from(client.getBlob(ref));
      await new Promise((resolve) => reader.once('data', resolve));
      reader.destroy();
      outcome = await new Promise((resolve) => reader.once('close', () => resolve(null)));
    } else {
      let written = 0;
      const sink = new Writable({ write(chunk, _, done) {
        written += chunk.length;
        done(written > (4 << 20) ? new Error('the reader went away') : null);
      } });
      outcome = await failure(() => pipeline(Readable.from(client.getBlob(ref)), sink));
    }
    out.reads.push({ how, outcome, blobFilesClosed: await until(() => openBlobFiles() === 0) });
  }
  const small = await client.putBlob(Buffer.from('after'), { sessionId: 's' });
  const back = [];
  for await (const chunk of client.getBlob(small)) back.push(chunk);
  out.after = Buffer.concat(back).toString();
  await client.put('s', Buffer.from('state'));
  out.state = (await client.get('s')).state.toString();
  out.files = fs.readdirSync(dir).sort();
  out.kept = [ref, small].map((r) => r.content_hash.slice('sha256:'.length)).sort();
  out.unhandled = unhandled;
  return out;
})().then((out) => console.log(JSON.stringify(out))).catch((err) => { console.error(err); process.exit(1); })
  .finally(() => client.close());
"""


def test_node_blob_transfers_stopped_mid_stream_leave_nothing_and_the_client_goes_on(
    sidecar: Sidecar, tmp_path: Path
) -> None:
    files = tmp_path / "files"
    files.mkdir()
    pids = json.dumps(process_and_children(sidecar.pid))
    args = node_command(_SCRIPT, sidecar.unix_target, str(files), str(sidecar.data_dir), pids)
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    destroyed, failed = out["puts"]
    for put in out["puts"]:
        assert put["underWay"], put  # stopped mid-stream
        assert put["ms"] < 1000, put  # rejected at once
        assert put["partialGone"], put  # the sidecar's partly written file removed
        assert put["stored"]["code"] == 5, put  # NOT_FOUND: nothing stored
    assert destroyed["outcome"]["code"] == "ERR_STREAM_PREMATURE_CLOSE", destroyed
    assert failed["outcome"] == {"code": None, "message": "stopped by the caller"}, failed  # the caller's own
    assert out["reads"] == [
        {"how": "destroyed", "outcome": None, "blobFilesClosed": True},
        {"how": "write failed", "outcome": {"code": None, "message": "the reader went away"}, "blobFilesClosed": True},
    ]
    assert out["after"] == "after" and out["state"] == "state"
    assert out["files"] == ["big.bin"]  # the NOT_FOUND getBlobToFile left no partial file
    assert out["unhandled"] == []
    # The blobs stored whole, and no part of a stopped one.
    assert sorted(p.name for p in (sidecar.data_dir / "blobs" / "sha256").rglob("*") if p.is_file()) == out["kept"]
