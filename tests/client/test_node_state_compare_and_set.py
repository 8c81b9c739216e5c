"""The Node.js client's compare-and-set on the head's content against a real sidecar: every reply's
state_xxh3 is the XXH3-64 of its state as a decimal string (exact, over 2^53 too), and a write's
expectedStateXxh3 (that string, or a BigInt) lands only on that state: put, merge, an appendEvents' put
and putStream's writes."""

from __future__ import annotations

import xxhash

from ckpt.sidecar.client import CheckpointClient
from tests.client.test_node_events_and_blobs import _run_node
from tests.support import Sidecar

_CAS = """
const { xxh3 } = require(path.join(path.dirname(process.argv[1]), 'node_modules/@node-rs/xxhash'));
const b = (...bytes) => Buffer.from(bytes);
run(async () => {
  const out = {};
  const put = await client.put('s', b(8, 1));
  const got = await client.get('s');
  out.put = [put.version, put.state_xxh3, typeof put.state_xxh3];
  out.info = [got.info.state_xxh3, typeof got.info.state_xxh3];
  out.history = (await client.history('s')).map((v) => v.state_xxh3);
  // A read-modify-merge on the state it read lands; one expecting another state writes nothing.
  const expected = { expectedVersion: got.version, expectedStateXxh3: got.info.state_xxh3 };
  const merged = await client.merge('s', b(16, 2), expected);
  out.merged = [merged.version, merged.state_xxh3];
  out.stale = await failure(() => client.merge('s', b(16, 3), { expectedStateXxh3: put.state_xxh3 }));
  out.staleBoth = await failure(() =>
    client.merge('s', b(16, 3), { expectedVersion: merged.version, expectedStateXxh3: put.state_xxh3 }));
  // A BigInt is taken too: @node-rs/xxhash's XXH3-64 of the head's state.
  const head = await client.get('s');
  const fromBigInt = await client.put('s', b(8, 4), { expectedStateXxh3: xxh3.xxh64(head.state) });
  out.bigint = [typeof xxh3.xxh64(head.state), fromBigInt.version, fromBigInt.state_xxh3];
  // A retry (the same request id) answers the first write's.
  const first = await client.put('r', b(8, 5), { requestId: 'once' });
  const again = await client.put('r', b(8, 5), { requestId: 'once' });
  out.replay = [first.state_xxh3, again.state_xxh3, again.replayed];
  // Deleted and written again to the same version with another state: a writer holding the old head
  // passes expectedVersion alone, and is refused with the state's XXH3-64.
  const old = await client.put('d', b(8, 6));
  await client.delete('d');
  await client.put('d', b(8, 7));
  out.recreated = await failure(() =>
    client.merge('d', b(16, 8), { expectedVersion: old.version, expectedStateXxh3: old.state_xxh3 }));
  // An appendEvents' put: its reply's state_xxh3 and its expectedStateXxh3; a conflict appends nothing.
  const appended = await client.appendEvents('a', [{ type: 'one' }], { put: { state: b(8, 9) } });
  const onIt = await client.appendEvents('a', [{ type: 'two' }], {
    put: { state: b(16, 10), merge: true, expectedStateXxh3: appended.put.state_xxh3 },
  });
  out.append = [appended.put.state_xxh3, onIt.put.version, onIt.put.state_xxh3];
  out.appendStale = await failure(() => client.appendEvents('a', [{ type: 'lost' }], {
    put: { state: b(16, 11), merge: true, expectedStateXxh3: appended.put.state_xxh3 },
  }));
  // null, as put and merge take it, asks no compare-and-set.
  const noCas = { state: b(8, 16), expectedVersion: null, expectedStateXxh3: null };
  out.appendNull = (await client.appendEvents('n', [{ type: 'x' }], { put: noCas })).put.version;
  out.appendTypes = [];
  for await (const e of client.events('a')) out.appendTypes.push(e.type);
  // putStream: the first write expects the head it continues and lands; the second expects that head
  // too, no longer the head: its result is the conflict's, and the other writes go on.
  const base = await client.put('p', b(8, 12));
  const writes = [
    { sessionId: 'p', state: b(16, 13), merge: true, expectedStateXxh3: base.state_xxh3 },
    { sessionId: 'p', state: b(16, 14), merge: true, expectedStateXxh3: BigInt(base.state_xxh3) },
    { sessionId: 'q', state: b(8, 15) },
  ];
  out.stream = [];
  for await (const r of client.putStream(writes)) {
    out.stream.push(r.outcome === 'response' ? [r.response.version, r.response.state_xxh3]
      : [r.error.code, r.error.current_version, r.error.message]);
  }
  // Bad values are refused by name before anything is sent.
  const bad = { number: 5, float: 1.5, words: 'abc', signed: '-1', hex: '0x10', negative: -1n,
                over: (1n << 64n).toString(), overBigInt: 1n << 64n, object: {} };
  out.bad = {};
  for (const [label, value] of Object.entries(bad)) {
    out.bad[label] = [
      await failure(() => client.put('s', b(8, 1), { expectedStateXxh3: value })),
      await failure(() => client.merge('s', b(8, 1), { expectedStateXxh3: value })),
      await failure(() => client.appendEvents('s', [], { put: { state: b(8, 1), expectedStateXxh3: value } })),
      await failure(async () => { for await (const r of client.putStream([{ sessionId: 's', state: b(8, 1),
        expectedStateXxh3: value }])) void r; }),
    ].map((f) => f && [f.name, f.code, f.message]);
  }
  const top = (1n << 64n) - 1n;
  out.top = await failure(() => client.merge('s', b(8, 1), { expectedStateXxh3: top }));
  return out;
});
"""


def digest(*state: int) -> str:
    return str(xxhash.xxh3_64_intdigest(bytes(state)))


def test_node_client_reads_state_xxh3_exactly_and_writes_only_on_the_expected_state(sidecar: Sidecar) -> None:
    out = _run_node(_CAS, sidecar.unix_target)
    with CheckpointClient(sidecar.unix_target) as c:
        heads = {s: c.get(s) for s in ("s", "r", "d", "a", "p", "q")}
    v1 = digest(8, 1)
    assert int(v1) > 2**53  # a Number would not hold it
    assert out["put"] == [1, v1, "string"]
    assert out["info"] == [v1, "string"]
    assert out["history"] == [v1]
    assert out["merged"] == [2, digest(8, 1, 16, 2)]
    for stale in (out["stale"], out["staleBoth"]):
        assert stale["name"] == "ConflictError" and stale["code"] == 10 and stale["current"] == 2
        assert "expected_state_xxh3" in stale["message"]
    assert out["bigint"] == ["bigint", 3, digest(8, 4)]
    assert heads["s"].version == 3 and heads["s"].state == bytes([8, 4])  # the stale merges wrote nothing
    assert out["replay"] == [digest(8, 5), digest(8, 5), True]
    assert out["recreated"]["name"] == "ConflictError" and out["recreated"]["current"] == 1
    assert heads["d"].version == 1 and heads["d"].state == bytes([8, 7])
    assert out["append"] == [digest(8, 9), 2, digest(8, 9, 16, 10)]
    assert out["appendStale"]["name"] == "ConflictError" and out["appendStale"]["current"] == 2
    assert out["appendTypes"] == ["one", "two"]
    assert out["appendNull"] == 1
    assert heads["a"].version == 2
    assert out["stream"][0] == [2, digest(8, 12, 16, 13)]
    assert out["stream"][1][:2] == [10, 2] and "expected_state_xxh3" in out["stream"][1][2]
    assert out["stream"][2] == [1, digest(8, 15)]
    assert heads["p"].version == 2 and heads["p"].state == bytes([8, 12, 16, 13])
    assert heads["p"].info.state_xxh3 == int(out["stream"][0][1])
    for label, failures in out["bad"].items():
        kind = "RangeError" if label in ("negative", "over", "overBigInt") else "TypeError"
        assert [f[0] for f in failures] == [kind] * 4, (label, failures)
        assert all(f[1] is None and "expectedStateXxh3" in f[2] for f in failures), (label, failures)
    assert "decimal string" in out["bad"]["number"][0][2] and "Number (5)" in out["bad"]["number"][0][2]
    assert "0..18446744073709551615" in out["bad"]["over"][0][2]
    # 2^64-1 is sent as itself (the sidecar's message names it), and is not the head's.
    assert out["top"]["name"] == "ConflictError" and "0xffffffffffffffff" in out["top"]["message"]
