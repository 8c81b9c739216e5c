"""The Node.js client's event log (appendEvents, events, fork's copyEvents) and blobs (putBlob, getBlob,
getBlobToFile) against a real sidecar, and what either client writes read back by the other."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
import signal
import stat
import subprocess
from pathlib import Path
from typing import Any

from ckpt.sidecar.client import CheckpointClient, event
from tests.client.test_node_client import node_command
from tests.support import Sidecar, start_sidecar

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
_UUID7 = "[0-9a-f]{12}7[0-9a-f]{3}[89ab][0-9a-f]{15}"

# What a Node script shares: a client on argv[2], `failure(fn)` (what fn threw, or null) and `seqs(it)`.
_PRELUDE = """
const { CheckpointClient } = require(process.argv[1]);
const crypto = require('crypto');
const fs = require('fs');
const path = require('path');
const { Readable } = require('stream');
const client = new CheckpointClient(process.argv[2]);
const failure = async (fn) => {
  try {
    await fn();
    return null;
  } catch (e) {
    return { name: e.name, code: e.code ?? null, message: e.message, current: e.currentVersion ?? null,
             requestId: e.requestId ?? null, lastSeq: e.lastSeq ?? null };
  }
};
const seqs = async (events) => {
  const out = [];
  for await (const e of events) out.push(e.seq);
  return out;
};
const run = (main) => main().then((out) => console.log(JSON.stringify(out)))
  .catch((err) => { console.error(err); process.exit(1); }).finally(() => client.close());
"""


def _run_node(script: str, *args: str) -> dict[str, Any]:
    proc = subprocess.run(node_command(_PRELUDE + script, *args), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


_EVENTS = """
const T0 = Date.UTC(2026, 0, 1);
run(async () => {
  const out = {};
  const steps = Array.from({ length: 250 }, (_, i) => ({
    type: i % 2 ? 'tool' : 'msg', payload: Buffer.from(`${i}`), time: new Date(T0 + i * 1000),
    attributes: i === 0 ? { tool: 'search' } : undefined,
  }));
  const put = { state: Buffer.from([0x08, 0x01]), labels: { from: 'node' } };
  const first = await client.appendEvents('s', steps, { put, requestId: 'first' });
  out.first = [first.first_seq, first.last_seq, first.put.version, first.replayed];
  const again = await client.appendEvents('s', steps, { put, requestId: 'first' });
  out.again = [again.first_seq, again.last_seq, again.put.version, again.replayed];
  out.paged = await seqs(client.events('s', { pageSize: 7 }));
  // null bounds are no bounds, as Python's None.
  out.null_bounds = (await seqs(client.events('s', { after: null, before: null }))).length;
  out.newest = await seqs(client.events('s', { afterSeq: 245, newestFirst: true }));
  out.tools = [];
  for await (const e of client.events('s', { types: ['tool'], after: new Date(T0 + 10000) })) {
    out.tools.push([e.type, e.payload.toString()]);
  }
  out.window = [];
  for await (const e of client.events('s', { after: new Date(T0), before: new Date(T0 + 3000) })) {
    out.window.push(e.payload.toString());
  }
  // A conflict on the put appends nothing.
  out.conflict = await failure(() => client.appendEvents('s', [{ type: 'lost' }], {
    put: { state: Buffer.from([0x10, 0x02]), merge: true, expectedVersion: 9 },
  }));
  out.head_seq = (await client.events('s', { newestFirst: true }).next()).value.seq;
  // Compare-and-set on the log's tail: refused on another seq, taken on the last one.
  await client.appendEvents('tail', [{ type: 'first' }], { expectedLastSeq: 0 });
  out.tail_conflict = await failure(() => client.appendEvents('tail', [{ type: 'late' }], { expectedLastSeq: 7 }));
  out.tail_taken = (await client.appendEvents('tail', [{ type: 'next' }], { expectedLastSeq: 1 })).first_seq;
  out.nobody = await failure(() => seqs(client.events('nobody')));
  out.fork = (await client.fork('s', 's2', { copyEvents: true })).head_version;
  out.forked = (await seqs(client.events('s2', { pageSize: 1000 }))).length;
  await client.fork('s', 's3');
  out.forked_without = await seqs(client.events('s3'));
  out.deleted = await client.delete('s2');
  out.deleted_events = await failure(() => seqs(client.events('s2')));  // the log went with the session
  // One request id generated per call: two calls are two appends.
  out.generated = [];
  for (const n of [1, 2]) {
    out.generated.push((await client.appendEvents('s', [{ type: 'x', payload: `n${n}` }])).first_seq);
  }
  const patch = { state: Buffer.from([0x10, 0x02]), merge: true, expectedVersion: 1 };
  const merged = await client.appendEvents('s', [], { put: patch });
  out.merged = [merged.first_seq, merged.last_seq, merged.put.version];
  // What Python appended.
  out.from_python = [];
  for await (const e of client.events('from-python')) {
    out.from_python.push({ seq: e.seq, type: e.type, payload: e.payload.toString('hex'), attributes: e.attributes,
                           time: e.time.seconds * 1000 + e.time.nanos / 1e6 - T0 });
  }
  // Refused by name before anything is sent.
  out.refused = [
    await failure(() => client.appendEvents('s', ['not an event'])),
    await failure(() => client.appendEvents('s', 'events')),
    await failure(() => client.appendEvents('s', Array(1001).fill({ type: 't' }))),
    await failure(() => client.appendEvents('s', [{ type: 't', payload: 7 }])),
    await failure(() => client.appendEvents('s', [{ type: 't', time: 'today' }])),
    await failure(() => client.appendEvents('s', [], { put: { state: 'text' } })),
    await failure(() => client.events('s', { types: 'tool' })),
    await failure(() => client.events('s', { pageSize: 5000 })),
    await failure(() => client.fork('s', 's4', { copyEvents: 'yes' })),
  ].map((e) => `${e.name}: ${e.message}`);
  // The sidecar's own checks come back as its status, naming the field.
  out.bad_type = await failure(() => client.appendEvents('s', [{ type: '' }]));
  return out;
});
"""


def test_node_appends_and_reads_events_and_python_reads_them(sidecar: Sidecar) -> None:
    with CheckpointClient(sidecar.unix_target) as c:
        c.append_events(
            "from-python",
            [event("msg", b"\x00\xff", attributes={"k": "v"}, time=T0 + datetime.timedelta(seconds=5)), event("m2")],
        )
        out = _run_node(_EVENTS, sidecar.unix_target)
        # Node's events and its put, read from Python: one transaction, nothing doubled by the replay.
        seen = list(c.events("s", page_size=1000))
        assert c.get("s", version=1).info.labels == {"from": "node"}
        assert c.get("s").version == 2
    assert out["first"] == [1, 250, 1, False]
    assert out["again"] == [1, 250, 1, True]  # the same request id: a replay, nothing appended
    assert out["paged"] == list(range(1, 251))
    assert out["null_bounds"] == 250
    assert out["newest"] == [250, 249, 248, 247, 246]
    assert out["tools"][:3] == [["tool", "11"], ["tool", "13"], ["tool", "15"]] and len(out["tools"]) == 120
    assert out["window"] == ["1", "2"]  # both bounds exclusive
    assert out["conflict"]["name"] == "ConflictError" and out["conflict"]["code"] == 10
    assert out["conflict"]["current"] == 1 and re.fullmatch(_UUID7, out["conflict"]["requestId"])
    assert out["head_seq"] == 250
    assert out["tail_conflict"]["name"] == "ConflictError" and out["tail_conflict"]["lastSeq"] == 1
    assert "expected_last_seq 7 but the event log's last seq is 1" in out["tail_conflict"]["message"]
    assert out["tail_taken"] == 2
    assert out["nobody"]["code"] == 5 and "nobody" in out["nobody"]["message"]
    assert (out["fork"], out["forked"], out["forked_without"]) == (1, 250, [])
    assert out["deleted"] == 1 and out["deleted_events"]["code"] == 5
    assert out["generated"] == [251, 252]
    assert out["merged"] == [0, 0, 2]  # a put alone: no events
    assert [(e.seq, e.type, e.payload) for e in seen[:2]] == [(1, "msg", b"0"), (2, "tool", b"1")]
    assert seen[1].time.ToDatetime(datetime.UTC) == T0 + datetime.timedelta(seconds=1)
    assert dict(seen[0].attributes) == {"tool": "search"} and len(seen) == 252
    assert [e.payload for e in seen[250:]] == [b"n1", b"n2"]
    assert out["from_python"][0] == {"seq": 1, "type": "msg", "payload": "00ff", "attributes": {"k": "v"}, "time": 5000}
    assert out["from_python"][1]["seq"] == 2 and out["from_python"][1]["type"] == "m2"
    assert out["from_python"][1]["time"] > 0  # no time given: the commit's
    assert out["refused"] == [
        "TypeError: events[0] must be an object { type, payload, attributes, time }, not string",
        "TypeError: events must be an array of { type, payload, attributes, time }, not string",
        "RangeError: events has 1001 entries; the sidecar takes at most 1000 per append",
        "TypeError: events[0].payload must be a Buffer or a Uint8Array, not number",
        "TypeError: events[0].time must be a valid Date, not today",
        "TypeError: put.state must be a Buffer or a Uint8Array, not string",
        "TypeError: types must be an array of strings, not a string: pass ['tool'] for one type",
        "RangeError: pageSize must be in 0..1000, got 5000",
        "TypeError: copyEvents must be a boolean, not string",
    ]
    assert out["bad_type"]["code"] == 3 and "type" in out["bad_type"]["message"]


# One append from Node, printed as JSON: its result, or its error's code and requestId.
_APPEND_ONCE = """
const [, , , session, timeoutMs, requestId] = process.argv;
client.timeoutMs = Number(timeoutMs);
run(async () => {
  try {
    const events = [{ type: 'step', payload: 'once' }];
    const r = await client.appendEvents(session, events, { requestId: requestId || undefined });
    return { first_seq: r.first_seq, last_seq: r.last_seq, replayed: r.replayed };
  } catch (e) {
    return { code: e.code, requestId: e.requestId || null };
  }
});
"""


def _node_append(target: str, session: str, *, timeout_ms: int, request_id: str = "") -> subprocess.Popen[str]:
    args = node_command(_PRELUDE + _APPEND_ONCE, target, session, str(timeout_ms), request_id)
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _answer(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return dict(json.loads(out))


def test_node_append_is_retried_and_resent_by_its_request_id_lands_once(tmp_path: Path) -> None:
    socket_path = tmp_path / "late.sock"
    early = _node_append(f"unix:{socket_path}", "early", timeout_ms=20_000)  # nothing listens yet: retried
    sidecar = start_sidecar(tmp_path / "data", socket_path=socket_path)
    try:
        assert _answer(early) == {"first_seq": 1, "last_seq": 1, "replayed": False}
        sidecar.process.send_signal(signal.SIGSTOP)  # hung: answers nothing
        try:
            hung = _answer(_node_append(sidecar.unix_target, "hung", timeout_ms=1000))
        finally:
            sidecar.process.send_signal(signal.SIGCONT)
        assert hung["code"] == 4 and re.fullmatch(_UUID7, hung["requestId"])  # the generated id, to resend by
        resent = _answer(_node_append(sidecar.unix_target, "hung", timeout_ms=20_000, request_id=hung["requestId"]))
        assert (resent["first_seq"], resent["last_seq"]) == (1, 1)  # whether or not the first reached the writer
        with CheckpointClient(sidecar.unix_target) as c:
            assert [e.payload for e in c.events("hung")] == [b"once"]
            assert [e.payload for e in c.events("early")] == [b"once"]
    finally:
        assert sidecar.stop() == 0


_BLOBS = """
const [, , , dir, pythonSha] = process.argv;
const sha = (bytes) => crypto.createHash('sha256').update(bytes).digest('hex');
const gather = async (chunks) => {
  const got = [];
  for await (const c of chunks) got.push(c);
  return { bytes: Buffer.concat(got), count: got.length };
};
run(async () => {
  const out = {};
  const size = (3 << 20) + 12345;
  const whole = crypto.randomBytes(size);
  out.sha = sha(whole);
  // Pieces of uneven sizes, as a file or a socket gives them, recut into 256 KiB messages.
  async function* pieces() {
    for (let at = 0; at < size;) {
      const n = Math.min(size - at, 1 + crypto.randomInt(200000));
      yield whole.subarray(at, at + n);
      at += n;
    }
  }
  const options = { sessionId: 'a', mediaType: 'application/x-test', chunkSizeBytes: 256 << 10 };
  const ref = await client.putBlob(Readable.from(pieces()), options);
  out.ref = ref;
  const back = await gather(client.getBlob(ref));
  out.back = { equal: back.bytes.equals(whole), chunks: back.count };
  const range = await gather(client.getBlob(ref.uri, { offset: 1000000, length: 1500000 }));
  out.range_equal = range.bytes.equals(whole.subarray(1000000, 2500000));
  const tail = await gather(client.getBlob(`sha256:${out.sha}`, { offset: size - 10 }));
  out.tail = tail.bytes.equals(whole.subarray(size - 10));
  out.at_end = (await gather(client.getBlob(out.sha, { offset: size }))).count;
  out.past_end = await failure(() => gather(client.getBlob(out.sha, { offset: size + 1 })));
  out.to_file = await client.getBlobToFile(ref, path.join(dir, 'copy.bin'));
  out.file_equal = fs.readFileSync(path.join(dir, 'copy.bin')).equals(whole);
  // Stopping early cancels the call; the next read is whole.
  for await (const c of client.getBlob(ref)) break;
  out.again_equal = (await gather(client.getBlob(ref))).bytes.equals(whole);
  // The same bytes from another session, as one Buffer: the same blob.
  out.dedup = await client.putBlob(whole, { sessionId: 'b' });
  // Refused or failed streams store nothing.
  const other = Buffer.from('other bytes');
  out.mismatch = await failure(() => client.putBlob(other, { sessionId: 'a', expectedSha256: out.sha }));
  out.mismatch_stored = await failure(() => gather(client.getBlob(sha(other))));
  const half = whole.subarray(0, 1 << 20);
  let closed = false;
  async function* breaking() {
    try {
      yield half;
      throw new Error('the source broke');
    } finally {
      closed = true;
    }
  }
  out.broken = await failure(() => client.putBlob(breaking(), { sessionId: 'a' }));
  out.broken_closed = closed;
  out.broken_stored = await failure(() => gather(client.getBlob(sha(half))));
  out.unknown = await failure(() => gather(client.getBlob('0'.repeat(64))));
  fs.writeFileSync(path.join(dir, 'kept.bin'), 'kept');
  out.unknown_to_file = await failure(() => client.getBlobToFile('0'.repeat(64), path.join(dir, 'kept.bin')));
  out.files = fs.readdirSync(dir).sort();
  out.kept = fs.readFileSync(path.join(dir, 'kept.bin'), 'utf8');
  const fromPython = await gather(client.getBlob(`ckpt-blob:sha256:${pythonSha}`));
  out.from_python = { sha: sha(fromPython.bytes), size: fromPython.bytes.length };
  out.refused = [
    await failure(() => client.getBlob('xyz')),
    await failure(() => client.getBlob({ uri: 'https://example.com/a' })),
    await failure(() => client.getBlob(out.sha, { offset: -1 })),
    await failure(() => client.putBlob('/tmp/a.png', { sessionId: 'a' })),
    await failure(() => client.putBlob(whole, {})),
    await failure(() => client.putBlob(whole, { sessionId: 'a', chunkSizeBytes: 64 << 20 })),
    await failure(() => client.putBlob(Readable.from(['text']), { sessionId: 'a' })),
  ].map((e) => `${e.name}: ${e.message}`);
  return out;
});
"""


def _blob_files(data: Path) -> list[str]:
    return sorted(p.name for p in (data / "blobs" / "sha256").rglob("*") if p.is_file())


def test_node_stores_and_reads_blobs_and_python_reads_them(sidecar: Sidecar, tmp_path: Path) -> None:
    python_bytes = b"stored from python " * 50_000
    files = tmp_path / "files"
    files.mkdir()
    with CheckpointClient(sidecar.unix_target) as c:
        python_ref = c.put_blob(python_bytes, session_id="py")
        python_sha = python_ref.content_hash.removeprefix("sha256:")
        out = _run_node(_BLOBS, sidecar.unix_target, str(files), python_sha)
        node_back = hashlib.sha256(b"".join(c.get_blob(out["ref"]["uri"]))).hexdigest()
    size = (3 << 20) + 12345
    assert out["ref"] == {
        "uri": f"ckpt-blob:sha256:{out['sha']}",
        "content_hash": f"sha256:{out['sha']}",
        "size_bytes": size,
        "media_type": "application/x-test",
    }
    assert node_back == out["sha"]  # what Node stored, read from Python
    assert out["from_python"] == {"sha": python_sha, "size": len(python_bytes)}
    assert out["back"] == {"equal": True, "chunks": 4}  # the sidecar's 1 MiB messages
    assert out["range_equal"] and out["tail"] and out["again_equal"]
    assert out["at_end"] == 0
    assert out["past_end"]["code"] == 3 and "past the end" in out["past_end"]["message"]
    assert out["to_file"] == size and out["file_equal"]
    assert out["dedup"]["uri"] == out["ref"]["uri"] and out["dedup"]["media_type"] == ""
    assert out["mismatch"]["code"] == 3 and f"expected_sha256 is {out['sha']}" in out["mismatch"]["message"]
    assert out["mismatch_stored"]["code"] == 5
    assert out["broken"]["code"] is None and out["broken"]["message"] == "the source broke"  # its own error
    assert out["broken_closed"] and out["broken_stored"]["code"] == 5
    assert out["unknown"]["code"] == 5 and "0" * 64 in out["unknown"]["message"]
    assert out["unknown_to_file"]["code"] == 5
    assert out["files"] == ["copy.bin", "kept.bin"] and out["kept"] == "kept"  # no partial file left
    assert _blob_files(sidecar.data_dir) == sorted([out["sha"], python_sha])  # stored once each, nothing else
    assert not list((sidecar.data_dir / "blobs" / "tmp").iterdir())
    assert out["refused"] == [
        'TypeError: ref "xyz" names no blob: give an ArtifactRef, ckpt-blob:sha256:<hex>, sha256:<hex> or the 64'
        " lowercase hex digits of its SHA-256",
        'TypeError: ref "undefined" names no blob: give an ArtifactRef, ckpt-blob:sha256:<hex>, sha256:<hex> or the'
        " 64 lowercase hex digits of its SHA-256",
        "RangeError: offset must be in 0..9007199254740991, got -1",
        "TypeError: data must be bytes or a stream of them, not a string (a file's path? pass"
        " fs.createReadStream(path))",
        "TypeError: sessionId must be a string, not undefined",
        "RangeError: chunkSizeBytes must be in 1..67104768, got 67108864",
        "TypeError: the blob's stream gave a string, not bytes: create it without an encoding",
    ]


# An endless source: how much of it putBlob read before the sidecar refused the blob, and whether it was closed.
_ENDLESS = """
run(async () => {
  let pulled = 0;
  let closed = false;
  async function* endless() {
    try {
      for (;;) {
        pulled += 65536;
        yield Buffer.alloc(65536, 7);
      }
    } finally {
      closed = true;
    }
  }
  const refused = await failure(() => client.putBlob(endless(), { sessionId: 'big' }));
  return { refused, pulled, closed };
});
"""


def test_node_put_blob_streams_and_stops_reading_at_the_sidecars_limit(tmp_path: Path) -> None:
    limit = 4 << 20
    sidecar = start_sidecar(tmp_path / "data", "--max-blob-bytes", str(limit))
    try:
        out = _run_node(_ENDLESS, sidecar.unix_target)
        assert not _blob_files(sidecar.data_dir)
    finally:
        assert sidecar.stop() == 0
    assert out["refused"]["code"] == 8 and "--max-blob-bytes" in out["refused"]["message"]
    # Read as it was sent, so past the limit by what HTTP/2's windows and the sockets hold (4-16 MiB seen),
    # not ahead of the sidecar: an endless source read ahead would have been pulled without end.
    assert limit < out["pulled"] < 64 << 20, out["pulled"]
    assert out["closed"]


_BLOB_TO_LINK_AND_PIPE = """
run(async () => {
  const [dir, sha] = [process.argv[3], process.argv[4]];
  const out = {};
  out.link = await client.getBlobToFile(sha, path.join(dir, 'link.bin'));
  // A named pipe: read while the client writes into it.
  const read = new Promise((resolve) => {
    const parts = [];
    fs.createReadStream(path.join(dir, 'pipe'))
      .on('data', (d) => parts.push(d))
      .on('end', () => resolve(Buffer.concat(parts)));
  });
  out.pipe = await client.getBlobToFile(sha, path.join(dir, 'pipe'));
  out.pipe_sha = crypto.createHash('sha256').update(await read).digest('hex');
  return out;
});
"""


def test_node_get_blob_to_file_writes_through_a_symlink_and_into_a_named_pipe_in_place(
    sidecar: Sidecar, tmp_path: Path
) -> None:
    """Only a regular file is replaced by a rename: a named pipe or a device (/dev/null) is written in place,
    and a symlink keeps pointing at the file it names."""
    data = os.urandom(700_000)
    with CheckpointClient(sidecar.unix_target) as c:
        sha = c.put_blob(data, session_id="s").content_hash
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "real.bin").write_bytes(b"old")
    (out_dir / "link.bin").symlink_to(out_dir / "real.bin")
    os.mkfifo(out_dir / "pipe")
    out = _run_node(_BLOB_TO_LINK_AND_PIPE, sidecar.unix_target, str(out_dir), sha)
    assert out == {"link": len(data), "pipe": len(data), "pipe_sha": hashlib.sha256(data).hexdigest()}
    assert (out_dir / "link.bin").is_symlink() and (out_dir / "real.bin").read_bytes() == data
    assert stat.S_ISFIFO(os.lstat(out_dir / "pipe").st_mode)
    assert sorted(p.name for p in out_dir.iterdir()) == ["link.bin", "pipe", "real.bin"]
