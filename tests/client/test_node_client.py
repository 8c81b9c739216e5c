"""The contract works from another language with nothing but proto/: a Node.js
client (@grpc/grpc-js + @grpc/proto-loader) against a real sidecar."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lmdb

from ckpt.sidecar.client import CheckpointClient
from ckpt.sidecar.store import keys
from tests.client.support import Fleet
from tests.support import ROOT, start_sidecar

NODE_CLIENT = ROOT / "clients" / "node"
_NOT_INSTALLED = "node is not installed: `make test` (or .ci/run) installs what the tests need"


def node_command(script: str, *args: str) -> list[str]:
    """``node -e script``, the client's path as its process.argv[1] and ``args`` after it."""
    node = shutil.which("node")
    assert node, _NOT_INSTALLED
    return [node, "-e", script, str(NODE_CLIENT / "ckpt_client.js"), *args]


def test_node_client_put_merge_get_history_conflict(tmp_path: Path) -> None:
    node = shutil.which("node")
    assert node, _NOT_INSTALLED
    assert (NODE_CLIENT / "node_modules" / "@grpc" / "grpc-js").is_dir(), (
        "run `make install` (npm install in clients/node)"
    )
    sidecar = start_sidecar(tmp_path / "data")
    began_ms = time.time_ns() // 1_000_000
    try:
        results: dict[str, Any] = {}
        for target in (sidecar.unix_target, sidecar.tcp_target):
            session = f"node-{len(results)}"
            proc = subprocess.run(
                [node, str(NODE_CLIENT / "demo.js"), target, session], capture_output=True, text=True, timeout=60
            )
            assert proc.returncode == 0, proc.stderr
            results[target] = json.loads(proc.stdout)
    finally:
        assert sidecar.stop() == 0
    state = "0801" + "2a046e6f6465"
    for out in results.values():
        assert out["put"] == {"version": 1, "frame_kind": "FRAME_KIND_FULL"}
        assert out["merge"]["version"] == 2
        assert out["get"] == {"version": 2, "state_hex": state + "1002"}
        assert out["get_v1"] == {"version": 1, "state_hex": state}
        assert out["history"] == [
            {"version": 2, "mode": "WRITE_MODE_MERGE", "labels": {}},
            {"version": 1, "mode": "WRITE_MODE_REPLACE", "labels": {"lang": "node"}},
        ]
        assert out["conflict"]["current_version"] == 2
        assert "expected_version 1 but the head is version 2" in out["conflict"]["message"]
    # The client had no fork, sessions or delete. The second run also lists the first's session
    # (its fork deleted), page by page (page_size 1), with a label and a time filter.
    for n, out in enumerate(results.values()):
        assert out["fork"] == {"session_id": f"node-{n}-fork", "head": 1, "from": 1}
        assert out["sessions"] == [f"node-{i}" for i in range(n)] + [f"node-{n}", f"node-{n}-fork"]
        assert out["sessions_later"] == []
        assert out["deleted"] == 1
        assert out["delete_again"] == 5  # NOT_FOUND, not retried
    # The ids it generated for its writes are UUIDv7s, time first, which the store keeps side by side.
    generated = stored_request_ids(tmp_path / "data")
    assert len(generated) == 2 * 2, generated  # per run: put and merge (the conflicting put wrote nothing)
    assert all(re.fullmatch("[0-9a-f]{12}7[0-9a-f]{3}[89ab][0-9a-f]{15}", i) for i in generated), generated
    assert all(began_ms <= int(i[:12], 16) <= time.time_ns() // 1_000_000 for i in generated), generated


def stored_request_ids(data: Path) -> list[str]:
    """The request ids a sidecar's store remembers, in key order."""
    env = lmdb.open(str(data / "lmdb"), max_dbs=8, readonly=True)
    try:
        with env.begin() as txn:
            cursor = txn.cursor(db=env.open_db(b"requests", txn=txn, create=False))
            parts = [keys.request_key_parts(bytes(k)) for k in cursor.iternext(values=False)]
    finally:
        env.close()
    return [rid.decode() for _, rid in filter(None, parts)]


# One write from Node, printed as JSON: its result, or its error's code and requestId.
_PUT_ONCE = """
const { CheckpointClient } = require(process.argv[1]);
const [target, session, timeoutMs, requestId] = process.argv.slice(2);
const client = new CheckpointClient(target, { timeoutMs: Number(timeoutMs) });
client.put(session, Buffer.from([0x08, 0x01]), { requestId }).then(
  (r) => console.log(JSON.stringify({ version: r.version, replayed: r.replayed })),
  (e) => console.log(JSON.stringify({ code: e.code, requestId: e.requestId || null, message: e.message })),
).finally(() => client.close());
"""

# A putStream of one write, printed as JSON: its result, or the error it threw (code and message).
_STREAM_ONCE = """
const { CheckpointClient } = require(process.argv[1]);
const [target, timeoutMs] = process.argv.slice(2);
const client = new CheckpointClient(target, { timeoutMs: Number(timeoutMs) });
(async () => {
  for await (const r of client.putStream([{ sessionId: 'hung-stream', state: Buffer.from([0x08, 0x01]) }])) {
    console.log(JSON.stringify({ outcome: r.outcome }));
  }
})().catch((e) => console.log(JSON.stringify({ code: e.code, message: e.message }))).finally(() => client.close());
"""


def _node_put(target: str, session: str, *, timeout_ms: int, request_id: str = "") -> subprocess.Popen[str]:
    args = node_command(_PUT_ONCE, target, session, str(timeout_ms), request_id)
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _answer(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return dict(json.loads(out))


def _without_message(answer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in answer.items() if k != "message"}


def test_node_client_outlasts_a_restart_and_bounds_a_call_by_its_timeout(tmp_path: Path) -> None:
    # The client had neither: a put to a stopped sidecar failed at once (with no request id to resend
    # it by), and one to a hung sidecar waited forever.
    socket_path = tmp_path / "late.sock"
    early = _node_put(f"unix:{socket_path}", "restart", timeout_ms=20_000)  # nothing listens yet
    sidecar = start_sidecar(tmp_path / "data", socket_path=socket_path)
    try:
        assert _answer(early) == {"version": 1, "replayed": False}
        sidecar.process.send_signal(signal.SIGSTOP)  # hung: accepts nothing, answers nothing
        try:
            hung = _answer(_node_put(sidecar.unix_target, "hung", timeout_ms=1000, request_id="n-1"))
        finally:
            sidecar.process.send_signal(signal.SIGCONT)
        assert _without_message(hung) == {"code": 4, "requestId": "n-1"}  # DEADLINE_EXCEEDED, with the id to resend by
        # Named as the Python clients name it: gRPC's own words name no address for a sidecar it reached.
        assert hung["message"] == (
            f"4 DEADLINE_EXCEEDED: the sidecar at {sidecar.unix_target} did not answer within the call's timeout"
            " (timeoutMs=1000)"
        )
        resent = _answer(_node_put(sidecar.unix_target, "hung", timeout_ms=20_000, request_id="n-1"))
        assert resent["version"] == 1  # written once, whether the first attempt reached the writer or not
    finally:
        assert sidecar.stop() == 0


def test_node_put_stream_to_a_hung_sidecar_names_it_when_its_timeout_passes(tmp_path: Path) -> None:
    sidecar = start_sidecar(tmp_path / "data")
    try:
        sidecar.process.send_signal(signal.SIGSTOP)  # hung: accepts nothing, answers nothing
        try:
            proc = subprocess.Popen(
                node_command(_STREAM_ONCE, sidecar.unix_target, "1000"),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            hung = _answer(proc)
        finally:
            sidecar.process.send_signal(signal.SIGCONT)
        assert hung == {
            "code": 4,
            "message": f"4 DEADLINE_EXCEEDED: the sidecar at {sidecar.unix_target} did not answer within 1000 ms",
        }
    finally:
        assert sidecar.stop() == 0


# Puts to session "loop" one after another (request ids l0, l1, ...) until a line comes on stdin; prints
# "started" after the first, then {"puts": n} or the error that stopped them.
_LOOP = """
const readline = require('readline');
const { CheckpointClient } = require(process.argv[1]);
const client = new CheckpointClient(process.argv[2], { timeoutMs: 20000, retries: 30 });
let stop = false;
readline.createInterface({ input: process.stdin }).on('line', () => { stop = true; });
(async () => {
  let i = 0;
  for (; !stop; i++) {
    await client.put('loop', Buffer.from([0x08, i % 128]), { requestId: `l${i}` });
    if (i === 0) console.log('started');
  }
  console.log(JSON.stringify({ puts: i }));
  client.close();
  process.exit(0);
})().catch((e) => { console.log(JSON.stringify({ failed: e.code, message: e.message })); process.exit(1); });
"""


@contextlib.contextmanager
def _ended(proc: subprocess.Popen[str], fleet: Fleet) -> Iterator[None]:
    """Whatever the test's outcome, the Node process is not left running, nor any sidecar of ``fleet``."""
    try:
        yield
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        fleet.close()


def test_node_calls_in_flight_outlast_sidecar_restarts_and_each_write_lands_once(tmp_path: Path) -> None:
    """A call in flight when the sidecar stopped failed at once, INTERNAL "Received RST_STREAM ...
    Session closed" from grpc-js, and was not retried: a LangGraph.js run died at a routine restart."""
    fleet = Fleet(tmp_path / "data")
    pipe = subprocess.PIPE
    proc = subprocess.Popen(node_command(_LOOP, fleet[-1].unix_target), stdin=pipe, stdout=pipe, stderr=pipe, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    with _ended(proc, fleet):
        assert proc.stdout.readline() == "started\n", proc.stderr.read() if proc.stderr else ""
        for sig in (signal.SIGTERM, signal.SIGKILL, signal.SIGTERM, signal.SIGKILL):
            time.sleep(0.3)  # puts flowing when it stops
            fleet.restart(sig)
        time.sleep(0.3)
        out, err = proc.communicate("stop\n", timeout=120)
        assert proc.returncode == 0, (out, err)
        puts = json.loads(out)["puts"]
        with CheckpointClient(fleet[-1].unix_target) as c:
            assert c.get("loop").version == puts  # each put once: a resent one replayed by its request id
        assert fleet[-1].stop() == 0


# putStream from Node: writes per session i % 3, REPLACE of [0x08, i % 128]; pauses (prints "paused <i>" and waits for
# a line on stdin) before giving each write listed in argv; prints one line per result, then "done".
_STREAM = """
const readline = require('readline');
const { CheckpointClient } = require(process.argv[1]);
const [target, count, pauses, extra] = process.argv.slice(2);
const client = new CheckpointClient(target, { timeoutMs: 20000, retries: 30 });
const lines = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();
const pauseAt = new Set(JSON.parse(pauses));
async function* puts() {
  for (let i = 0; i < Number(count); i++) {
    if (pauseAt.has(i)) {
      console.log(`paused ${i}`);
      await lines.next();
    }
    const put = { sessionId: `stream-${i % 3}`, state: Buffer.from([0x08, i % 128]), requestId: `w${i}` };
    const changed = { ...JSON.parse(extra)[i] };
    if (changed.state) changed.state = Buffer.from(changed.state);  // sent as a JSON array of bytes
    yield { ...put, ...changed };
  }
}
(async () => {
  for await (const r of client.putStream(puts(), { batchSize: 8 })) {
    console.log(JSON.stringify(r.outcome === 'response'
      ? { version: r.response.version, replayed: r.response.replayed }
      : { code: r.error.code, current: r.error.current_version }));
  }
  console.log('done');
  client.close();
})().catch((e) => { console.log(JSON.stringify({ failed: e.code, message: e.message })); process.exit(1); });
"""


def _node_stream(
    target: str, count: int, pauses: list[int], extra: dict[int, Any] | None = None
) -> subprocess.Popen[str]:
    args = node_command(_STREAM, target, str(count), json.dumps(pauses))
    pipe = subprocess.PIPE
    return subprocess.Popen([*args, json.dumps(extra or {})], stdin=pipe, stdout=pipe, stderr=pipe, text=True)


def test_node_put_stream_answers_each_write_in_order_and_replays_a_resent_one(tmp_path: Path) -> None:
    # The Node client had no PutStream at all.
    sidecar = start_sidecar(tmp_path / "data")
    try:
        extra = {4: {"expectedVersion": 7}, 9: {"merge": True, "state": [0x0A, 0xFF]}}
        runs = []
        for _ in range(2):  # the second run resends every write with the same request ids
            out, err = _node_stream(sidecar.unix_target, 20, [], extra).communicate(timeout=60)
            assert out.splitlines()[-1] == "done", (out, err)
            runs.append([json.loads(line) for line in out.splitlines()[:-1]])
    finally:
        assert sidecar.stop() == 0
    first, again = runs
    assert len(first) == 20
    assert first[4] == {"code": 10, "current": 1}  # ABORTED, with the head: stream-1 had write 1 only
    assert first[9]["code"] == 3  # INVALID_ARGUMENT: a malformed MERGE patch; the writes after it go on
    heads, expected = [0, 0, 0], []
    for i in range(20):  # a failed write writes nothing: its session's next write makes the next version
        if i not in extra:
            heads[i % 3] += 1
        expected.append(None if i in extra else heads[i % 3])
    versions = [r.get("version") for r in first]
    assert versions == expected
    assert [r.get("version") for r in again] == versions
    assert all(r["replayed"] for r in again if "version" in r)


def test_node_put_stream_outlasts_sidecar_restarts_and_each_write_lands_once(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path / "data")
    n = 240
    proc = _node_stream(fleet[-1].unix_target, n, [80, 160])
    assert proc.stdin is not None and proc.stdout is not None
    lines: list[str] = []

    def until_paused(at: int) -> None:
        while (line := proc.stdout.readline()) != f"paused {at}\n":  # type: ignore[union-attr]
            assert line, proc.stderr.read() if proc.stderr else ""
            lines.append(line)

    def go() -> None:
        proc.stdin.write("go\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]

    with _ended(proc, fleet):
        until_paused(80)  # writes 0-79 answered
        fleet.restart(signal.SIGTERM)  # the stream is idle: broken, reopened for the next batch
        go()
        until_paused(160)
        fleet[-1].process.send_signal(signal.SIGSTOP)  # the next batch goes out and is not answered
        go()
        time.sleep(0.3)
        fleet[-1].process.send_signal(signal.SIGCONT)
        fleet.restart(signal.SIGKILL)  # the batch in flight was committed or not: resent either way
        out, err = proc.communicate(timeout=120)
        lines += out.splitlines(keepends=True)
        assert lines[-1] == "done\n", (lines[-3:], err)
        results = [json.loads(line) for line in lines[:-1]]
        assert [r["version"] for r in results] == [i // 3 + 1 for i in range(n)]  # in order, each once
        with CheckpointClient(fleet[-1].unix_target) as c:
            for k in range(3):
                assert c.get(f"stream-{k}").version == n // 3  # nothing lost or doubled
                assert c.get(f"stream-{k}", version=n // 3).state == bytes([0x08, (n - 3 + k) % 128])
        assert fleet[-1].stop() == 0


_GET_LARGE = """
const { CheckpointClient } = require(process.argv[1]);
const [target, limit] = process.argv.slice(2);
const client = new CheckpointClient(target, limit === '' ? {} : { maxMessageBytes: Number(limit) });
client.get('large').then(
  (r) => console.log(JSON.stringify({ bytes: r.state.length })),
  (e) => console.log(JSON.stringify({ code: e.code })),
).finally(() => client.close());
"""


def test_node_client_takes_the_message_limit_the_sidecar_was_given(tmp_path: Path) -> None:
    # It was fixed at 64 MiB: a sidecar serving larger states (--max-message-bytes raised) could store
    # what a Node client could then never read back.
    sidecar = start_sidecar(tmp_path / "data", "--max-message-bytes", str(4 << 20))
    try:
        with CheckpointClient(sidecar.unix_target, max_message_bytes=4 << 20) as c:
            c.put("large", bytes(3 << 20))
        answers = {}
        for limit in ("", str(4 << 20), str(1 << 20)):
            proc = subprocess.run(
                node_command(_GET_LARGE, sidecar.unix_target, limit), capture_output=True, text=True, timeout=60
            )
            assert proc.returncode == 0, proc.stderr
            answers[limit] = json.loads(proc.stdout)
    finally:
        assert sidecar.stop() == 0
    assert answers[""] == answers[str(4 << 20)] == {"bytes": 3 << 20}
    assert answers[str(1 << 20)] == {"code": 8}  # RESOURCE_EXHAUSTED: over the limit it was given


_TYPED = """
const path = require('path');
const { CheckpointClient } = require(process.argv[1]);
const protobuf = require(require.resolve('protobufjs', { paths: [path.dirname(process.argv[1])] }));
const [target, protoFile] = process.argv.slice(2);
(async () => {
  const root = protobuf.loadSync(protoFile);
  const State = root.lookupType('acme.agent.v1.State');
  const client = new CheckpointClient(target);
  const out = { registered: await client.registerType(root, 'acme.agent.v1.State') };
  for (let step = 1; step <= 30; step++) {
    const entity = { name: `entity revision ${step} ${'x'.repeat(200)}`, score: step };
    const patch = State.encode(State.fromObject({ entities: { e1: entity }, log: [`step ${step}`], step })).finish();
    await client.merge('node-typed', patch, { messageType: 'acme.agent.v1.State' });
  }
  const got = await client.get('node-typed');
  out.message_type = got.message_type;
  out.state_size = got.info.state_size;
  out.state = State.toObject(State.decode(got.state), { longs: Number });
  try {
    await client.merge('node-typed', Buffer.from([0x12, 0x01, 0xff]));  // log: not UTF-8
    out.bad = null;
  } catch (err) {
    out.bad = { code: err.code, details: err.details };
  }
  client.close();
  console.log(JSON.stringify(out));
})().catch((err) => { console.error(err); process.exit(1); });
"""

_STATE_PROTO = """syntax = "proto3";
package acme.agent.v1;
import "google/protobuf/timestamp.proto";
message Entity {
  string name = 1;
  int64 score = 2;
  message Note { string text = 1; }
  Note note = 3;
}
message State {
  map<string, Entity> entities = 1;
  repeated string log = 2;
  optional int32 step = 3;
  Entity.Note last = 4;
  google.protobuf.Timestamp at = 5;
}
"""


def test_node_client_registers_a_type_from_its_proto_and_merges_typed_patches(tmp_path: Path) -> None:
    proto = tmp_path / "state.proto"
    proto.write_text(_STATE_PROTO)
    sidecar = start_sidecar(tmp_path / "data")
    try:
        proc = subprocess.run(
            node_command(_TYPED, sidecar.unix_target, str(proto)), capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        with CheckpointClient(sidecar.unix_target) as c:  # the same session, read from Python
            assert c.get("node-typed").message_type == "acme.agent.v1.State"
    finally:
        assert sidecar.stop() == 0
    assert out["registered"] == ["acme.agent.v1.Entity", "acme.agent.v1.Entity.Note", "acme.agent.v1.State"]
    assert out["message_type"] == "acme.agent.v1.State"
    assert out["state"] == {
        "entities": {"e1": {"name": f"entity revision 30 {'x' * 200}", "score": 30}},
        "log": [f"step {n}" for n in range(1, 31)],
        "step": 30,
    }
    assert out["state_size"] < 8 * 230, out["state_size"]  # compacted: not 30 copies of the entity
    assert out["bad"]["code"] == 3 and "field 2 (log) at offset 0" in out["bad"]["details"]


def test_the_typescript_declarations_cover_every_method_of_the_client() -> None:
    # The client had no types; its .d.ts (package.json "types") must not fall behind the code. tsc is not
    # a dependency here: the declarations were checked with it once, this keeps their list of methods whole.
    listing = (
        "console.log(JSON.stringify(Object.getOwnPropertyNames(require(process.argv[1]).CheckpointClient.prototype)))"
    )
    proc = subprocess.run(node_command(listing), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    internal = {"constructor", "call", "once", "request", "stub"}  # the stub and the calls on it
    methods = set(json.loads(proc.stdout)) - internal
    package = json.loads((NODE_CLIENT / "package.json").read_text())
    declarations = (NODE_CLIENT / package["types"]).read_text()
    body = declarations.split("export class CheckpointClient {", 1)[1]
    declared = set(re.findall(r"^  (\w+)[(<]", body, re.M)) - {"constructor"}
    assert declared == methods
    assert "export class ConflictError" in declarations
