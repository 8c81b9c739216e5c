"""The Node.js client retries a blob read the sidecar could not start (it is restarting) as it retries a
unary read, until its first chunk reaches the caller; a read cut after that is thrown at once, never sent
again, since the caller already holds part of the blob (the Python clients' rule: test_blob_retries.py)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from ckpt.sidecar.client import CheckpointClient
from tests.client.test_node_client import node_command
from tests.client.test_node_events_and_blobs import _PRELUDE
from tests.support import Sidecar, start_sidecar

MIB = 1024 * 1024
# Retries waiting ~16 s in all: a restart outlasts them even on a loaded machine.
_RETRIES = 20


def _start_node(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        node_command(_PRELUDE + script, *args),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _said(proc: subprocess.Popen[str], line: str) -> None:
    """Wait until the Node process printed ``line`` (it prints it when a step is done)."""
    assert proc.stdout is not None
    got = proc.stdout.readline().strip()
    if got != line:
        proc.kill()
        raise AssertionError(f"node said {got!r}, not {line!r}: {proc.communicate()[1]}")


def _answer(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return dict(json.loads(out))


# A getBlob and a getBlobToFile issued together on a client with many retries; what each read (its SHA-256
# and size) or threw, and the files left in the directory.
_READ = """
const [, , , sha, dir, retries] = process.argv;
const patient = new CheckpointClient(process.argv[2], { retries: Number(retries) });
const digest = (bytes) => ({ sha: crypto.createHash('sha256').update(bytes).digest('hex'), size: bytes.length });
run(async () => {
  const gathered = (async () => {
    const got = [];
    for await (const c of patient.getBlob(sha)) got.push(c);
    return digest(Buffer.concat(got));
  })();
  const written = patient.getBlobToFile(sha, path.join(dir, 'copy.bin'));
  console.log('reading');
  const out = {
    get_blob: await gathered.catch((e) => ({ code: e.code, message: e.message })),
    to_file: await written.catch((e) => ({ code: e.code, message: e.message })),
  };
  out.file = fs.existsSync(path.join(dir, 'copy.bin')) ? digest(fs.readFileSync(path.join(dir, 'copy.bin'))) : null;
  out.files = fs.readdirSync(dir).sort();
  patient.close();
  return out;
});
"""


def test_a_node_blob_read_while_the_sidecar_is_down_returns_the_blob_once_it_is_started_again(
    tmp_path: Path,
) -> None:
    data = os.urandom(3 * MIB + 17)
    sha = hashlib.sha256(data).hexdigest()
    sidecar = start_sidecar(tmp_path / "data")
    with CheckpointClient(sidecar.unix_target) as client:
        client.put_blob(data, session_id="s")
    assert sidecar.stop() == 0, sidecar.log()
    files = tmp_path / "files"
    files.mkdir()
    node = _start_node(_READ, sidecar.unix_target, sha, str(files), str(_RETRIES))
    restarted: Sidecar | None = None
    try:
        _said(node, "reading")
        time.sleep(0.5)  # its first attempts find no sidecar
        restarted = start_sidecar(tmp_path / "data", socket_path=Path(sidecar.unix_target.removeprefix("unix:")))
        out = _answer(node)
    finally:
        node.kill()
        if restarted is not None:
            assert restarted.stop() == 0, restarted.log()
    # Without the retries both failed UNAVAILABLE (code 14) at once.
    assert out["get_blob"] == {"sha": sha, "size": len(data)}, out
    assert out["to_file"] == len(data), out
    assert out["file"] == {"sha": sha, "size": len(data)}
    assert out["files"] == ["copy.bin"]  # no partial file left beside it


# A getBlob with many retries: its first chunk taken, then (once the sidecar was killed: a line on stdin) the
# rest read, timed; then, the sidecar down, a new read of the blob while it is started again.
_CUT = """
const [, , , sha, retries] = process.argv;
const patient = new CheckpointClient(process.argv[2], { retries: Number(retries) });
const lines = require('readline').createInterface({ input: process.stdin })[Symbol.asyncIterator]();
run(async () => {
  const out = {};
  const chunks = patient.getBlob(sha);
  const held = [(await chunks.next()).value];
  console.log('first');
  await lines.next();  // the sidecar was killed
  const began = Date.now();
  out.cut = await failure(async () => { for await (const c of chunks) held.push(c); });
  out.cut_ms = Date.now() - began;
  const bytes = Buffer.concat(held);
  out.held = { size: bytes.length, sha: crypto.createHash('sha256').update(bytes).digest('hex') };
  const again = patient.getBlob(sha);
  const got = [];
  const read = (async () => { for await (const c of again) got.push(c); })();
  console.log('reading');
  out.again = await failure(() => read);
  out.again_sha = crypto.createHash('sha256').update(Buffer.concat(got)).digest('hex');
  patient.close();
  return out;
});
"""


def test_a_node_blob_read_cut_after_its_first_chunk_is_thrown_and_a_new_read_returns_the_blob(
    tmp_path: Path,
) -> None:
    """Small chunks (the sidecar's smallest message limit), so the stream is long: the sidecar is killed
    with most of it unsent. A new stream would send again the bytes the caller holds, so the failure is
    thrown at once, not retried; reading again (as the caller then does) is, across the restart."""
    data = os.urandom(32 * MIB)
    sha = hashlib.sha256(data).hexdigest()
    sidecar = start_sidecar(tmp_path / "data", "--max-message-bytes", str(128 * 1024))
    restarted: Sidecar | None = None
    node: subprocess.Popen[str] | None = None
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            client.put_blob(data, session_id="s", chunk_size_bytes=64 * 1024)
        node = _start_node(_CUT, sidecar.unix_target, sha, str(_RETRIES))
        _said(node, "first")
        sidecar.stop(signal.SIGKILL)
        assert node.stdin is not None
        node.stdin.write("killed\n")
        node.stdin.flush()
        _said(node, "reading")
        time.sleep(0.5)  # its first attempts find no sidecar
        restarted = start_sidecar(tmp_path / "data", socket_path=Path(sidecar.unix_target.removeprefix("unix:")))
        out = _answer(node)
    finally:
        if node is not None:
            node.kill()
        if restarted is not None:
            assert restarted.stop() == 0, restarted.log()
        else:
            sidecar.stop(signal.SIGKILL)
    # Thrown as the stream broke: a resent stream would have met no sidecar and given up after the retries
    # (~16 s), or (once one was started) sent the first bytes again.
    assert out["cut"] is not None and out["cut"]["code"] == 14, out
    assert out["cut_ms"] < 5000, out
    held = out["held"]["size"]
    assert 0 < held < len(data) and out["held"]["sha"] == hashlib.sha256(data[:held]).hexdigest()
    # Read again across the restart: without the retries that failed UNAVAILABLE at once.
    assert out["again"] is None, out
    assert out["again_sha"] == sha


# A getBlob and a getBlobToFile retrying for ever (no sidecar), the client closed at 2 s (its retries then
# waiting 1 s each): what each threw and how long after close() it came.
_CLOSED_WHILE_RETRYING = """
const patient = new CheckpointClient(process.argv[2], { retries: 1e9 });
const dir = process.argv[3];
run(async () => {
  const read = failure(async () => { for await (const c of patient.getBlob('0'.repeat(64))) void c; });
  const written = failure(() => patient.getBlobToFile('0'.repeat(64), path.join(dir, 'out')));
  await new Promise((resolve) => setTimeout(resolve, 2000));
  const closedAt = Date.now();
  patient.close();
  const out = { get_blob: await read, to_file: await written, ms: Date.now() - closedAt };
  out.files = fs.readdirSync(dir);
  return out;
});
"""


def test_a_node_blob_read_retrying_fails_at_once_when_the_client_is_closed(tmp_path: Path) -> None:
    out = _answer(_start_node(_CLOSED_WHILE_RETRYING, f"unix:{tmp_path / 'nobody.sock'}", str(tmp_path)))
    for name in ("get_blob", "to_file"):
        assert out[name]["code"] == 1, out  # CANCELLED
        assert "the client is closed (close() was called)" in out[name]["message"], out
    assert out["ms"] < 700, out  # not at the end of the retry's 1 s wait under way (a loaded machine: slack)
    assert out["files"] == []


# A putBlob whose source gave one piece and then waits for ever (an idle Readable); "waiting" once it was
# asked for the next, then (the sidecar killed) what putBlob threw, or 'still waiting' 10 s later, and
# whether the source was stopped.
_WRITE_WAITING_ON_ITS_SOURCE = """
run(async () => {
  let reads = 0;
  const source = new Readable({
    read() {
      reads += 1;
      if (reads === 1) this.push(Buffer.alloc(1000, 1));
      if (reads === 2) console.log('waiting');
    },
  });
  const stored = failure(() => client.putBlob(source, { sessionId: 's' }));
  const late = new Promise((resolve) => setTimeout(resolve, 10000, 'still waiting'));
  const failed = await Promise.race([stored, late]);
  return { failed, destroyed: source.destroyed };
});
"""


def test_a_node_blob_write_waiting_on_its_source_fails_when_the_sidecar_goes_down(tmp_path: Path) -> None:
    # putBlob looked at the call only once the source gave its next piece: on a source that gave none its
    # promise never settled, though the call had failed.
    sidecar = start_sidecar(tmp_path / "data")
    node = _start_node(_WRITE_WAITING_ON_ITS_SOURCE, sidecar.unix_target)
    try:
        _said(node, "waiting")
        sidecar.stop(signal.SIGKILL)
        out = _answer(node)
    finally:
        node.kill()
        sidecar.stop(signal.SIGKILL)
    assert out["failed"] != "still waiting", out
    assert out["failed"]["code"] == 14, out  # UNAVAILABLE: the sidecar's connection dropped
    assert out["destroyed"] is True, out
