"""The commands that read a data directory themselves (inspect, verify, stats), beside a sidecar and after it."""

from __future__ import annotations

import json
from pathlib import Path

import lmdb

from ckpt.sidecar.client import CheckpointClient, event
from ckpt.sidecar.store.records import META_LEN
from ckpt.store.v1 import records_pb2
from ckpt.v1 import service_pb2
from tests.support import Sidecar, ckpt, start_sidecar


def test_inspect_verify_and_stats_beside_a_running_sidecar(sidecar: Sidecar) -> None:
    t = ("--target", sidecar.unix_target)
    ckpt("put", "v", *t, stdin=b"\x2a\x80\x50" + b"agent notes " * 853 + b"....")  # a 10 KB goal
    for n in range(2, 8):
        ckpt("put", "v", "--merge", *t, stdin=b"\x0a\x40" + bytes([65 + n]) * 64)
    d = ("--data-dir", str(sidecar.data_dir))
    inspect = ckpt("inspect", "v", *d).stdout.decode()
    assert "versions 1..7" in inspect and "FULL" in inspect and "PATCH" in inspect
    # Each version's creation time, as history gives it (RFC 3339, UTC, to the nanosecond).
    created = [json.loads(line)["created_at"] for line in ckpt("history", "v", *t).stdout.decode().splitlines()]
    rows = [line.split() for line in inspect.splitlines()[2:]]
    assert [row[-1] for row in reversed(rows)] == created
    ok = ckpt("verify", *d)
    assert ok.returncode == 0 and b"verified 1 session: 1 ok, 0 failed" in ok.stdout
    stats = json.loads(ckpt("stats", *d).stdout)
    assert stats["sessions"] == 1 and stats["versions"] == 7
    # Only what the directory holds: the read-only opening's own counters (commits,
    # cache hits) would read 0 beside a busy sidecar.
    assert set(stats) == {"sessions", "versions", "map_size_bytes", "used_bytes", "data_mdb_bytes"}


def test_verify_names_a_corrupt_frame(tmp_path: Path) -> None:
    sidecar = start_sidecar(tmp_path / "data")
    for n in range(1, 5):
        ckpt("put", "bad", "--merge", "--target", sidecar.unix_target, stdin=b"\x0a\x40" + bytes([65 + n]) * 64)
    ckpt("put", "good", "--target", sidecar.unix_target, stdin=b"\x08\x01")
    assert sidecar.stop() == 0
    env = lmdb.open(str(tmp_path / "data" / "lmdb"), max_dbs=8)
    with env.begin(write=True) as txn:
        db = env.open_db(b"frames", txn=txn)
        key = b"bad\x00" + (3).to_bytes(8, "big")
        value = bytearray(txn.get(key, db=db) or b"")
        value[-2] ^= 0xFF
        txn.put(key, bytes(value), db=db)
    env.close()
    result = ckpt("verify", "--data-dir", str(tmp_path / "data"))
    assert result.returncode == 1
    assert b"FAIL session 'bad': frame checksum mismatch for version 3" in result.stderr
    assert b"verified 2 sessions: 1 ok, 1 failed" in result.stdout


def test_verify_counts_each_session_of_events_alone_once(tmp_path: Path) -> None:
    sidecar = start_sidecar(tmp_path / "data")
    with CheckpointClient(sidecar.unix_target) as client:
        client.append_events("events-only", [event("t", b"%d" % i) for i in range(230)])
        client.append_events("sound-events", [event("t")])
        client.put("versions", b"\x08\x01")
        client.append_events("both", [event("t")], put=service_pb2.PutRequest(state=b"\x08\x01"))
    assert sidecar.stop() == 0
    d = ("--data-dir", str(tmp_path / "data"))
    ok = ckpt("verify", *d)
    assert (ok.returncode, ok.stdout) == (0, b"verified 4 sessions: 4 ok, 0 failed\n"), ok.stderr
    named = ckpt("verify", *d, "events-only", "versions")
    assert (named.returncode, named.stdout) == (0, b"verified 2 sessions: 2 ok, 0 failed\n"), named.stderr
    env = lmdb.open(str(tmp_path / "data" / "lmdb"), max_dbs=16)
    with env.begin(write=True) as txn:
        db = env.open_db(b"events", txn=txn)
        key = b"events-only\x00" + (1).to_bytes(8, "big")
        value = bytearray(txn.get(key, db=db) or b"")
        value[len(value) // 2] ^= 0xFF
        txn.put(key, bytes(value), db=db)
    env.close()
    damaged = ckpt("verify", *d)
    assert damaged.returncode == 1
    assert b"FAIL session 'events-only': events table: event seq 1: " in damaged.stderr
    assert damaged.stdout == b"verified 4 sessions: 3 ok, 1 failed\n"
    some = ckpt("verify", *d, "events-only", "versions")
    assert (some.returncode, some.stdout) == (1, b"verified 2 sessions: 1 ok, 1 failed\n"), some.stderr


def test_verify_counts_and_checks_a_session_holding_blobs_alone(tmp_path: Path) -> None:
    sidecar = start_sidecar(tmp_path / "data")
    t = ("--target", sidecar.unix_target)
    (tmp_path / "shot.png").write_bytes(b"a screenshot" * 100)
    (tmp_path / "log.txt").write_bytes(b"a tool's output")
    ref = json.loads(ckpt("blob", "put", "blobs-only", str(tmp_path / "shot.png"), *t).stdout)
    assert ckpt("blob", "put", "events-and-blobs", str(tmp_path / "log.txt"), *t).returncode == 0
    with CheckpointClient(sidecar.unix_target) as client:
        client.append_events("events-and-blobs", [event("t")])
        client.put("versions", b"\x08\x01")
    assert sidecar.stop() == 0
    d = ("--data-dir", str(tmp_path / "data"))
    ok = ckpt("verify", *d)
    assert (ok.returncode, ok.stdout) == (0, b"verified 3 sessions: 3 ok, 0 failed; 2 blobs checked\n"), ok.stderr
    named = ckpt("verify", *d, "blobs-only", "versions")
    assert (named.returncode, named.stdout) == (0, b"verified 2 sessions: 2 ok, 0 failed\n"), named.stderr
    sha = ref["uri"].removeprefix("ckpt-blob:sha256:")
    blob = tmp_path / "data" / "blobs" / "sha256" / sha[:2] / sha
    blob.write_bytes(b"A" + blob.read_bytes()[1:])
    damaged = ckpt("verify", *d, "blobs-only", "versions")
    assert damaged.returncode == 1
    assert f"FAIL session 'blobs-only': blob {sha}: its file {blob} hashes to ".encode() in damaged.stderr
    assert damaged.stdout == b"verified 2 sessions: 1 ok, 1 failed\n"
    everything = ckpt("verify", *d)
    assert everything.returncode == 1
    assert f"FAIL blob {sha}: its file {blob} hashes to ".encode() in everything.stderr
    assert everything.stdout == (
        b"verified 3 sessions: 3 ok, 0 failed; 1 more problem cross-checking the tables (see above); 2 blobs checked\n"
    )
    assert ckpt("verify", *d, "never-written").stdout == b"verified 1 session: 0 ok, 1 failed\n"


def _restamp(data_dir: Path, session: bytes, version: int, nanos: int) -> None:
    """Rewrite one version record's write time in place, as damage to it would."""
    env = lmdb.open(str(data_dir / "lmdb"), max_dbs=8)
    with env.begin(write=True) as txn:
        db = env.open_db(b"frames", txn=txn)
        key = session + b"\x00" + version.to_bytes(8, "big")
        value = bytes(txn.get(key, db=db) or b"")
        (n,) = META_LEN.unpack_from(value)
        meta = records_pb2.VersionRecord.FromString(value[META_LEN.size : META_LEN.size + n])
        meta.created_unix_nanos = nanos
        raw = meta.SerializeToString()
        txn.put(key, META_LEN.pack(len(raw)) + raw + value[META_LEN.size + n :], db=db)
    env.close()


def test_verify_names_a_version_time_out_of_order(tmp_path: Path) -> None:
    """A version record's time was not checked but against the session record's, for version 1 and the
    head: one changed in between passed, and retention and history read it."""
    sidecar = start_sidecar(tmp_path / "data")
    for n in range(1, 5):
        ckpt("put", "t", "--target", sidecar.unix_target, stdin=b"\x08" + bytes([n]))
    times = [
        json.loads(line)["created_at"]
        for line in ckpt("history", "t", "--target", sidecar.unix_target).stdout.splitlines()
    ]
    assert sidecar.stop() == 0 and len(times) == 4
    ok = ckpt("verify", "--data-dir", str(tmp_path / "data"))
    assert ok.returncode == 0, ok.stderr
    _restamp(tmp_path / "data", b"t", 2, 2**62)  # in 2116: after the head
    late = ckpt("verify", "--data-dir", str(tmp_path / "data"))
    assert late.returncode == 1
    assert f"version 2 was written at {2**62} ns, after the head was (".encode() in late.stderr
    assert b"version 3 was written at " in late.stderr and b"before version 2" in late.stderr
    _restamp(tmp_path / "data", b"t", 2, 1)  # in 1970: before version 1
    early = ckpt("verify", "--data-dir", str(tmp_path / "data"))
    assert early.returncode == 1
    assert b"version 2 was written at 1 ns, before version 1 (" in early.stderr
    assert b"version times never go back" in early.stderr
