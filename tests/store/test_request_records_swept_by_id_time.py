"""Request records of UUIDv7 ids dated about their write: no expiry entry, swept in the order of the ids' times.

A real store on a real LMDB directory; the tables read back with lmdb; `ckpt verify` run on them.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import lmdb
import pytest

from ckpt.sidecar import NewEvent, Store, StoreConfig
from ckpt.sidecar.store import keys, requestids
from ckpt.store.v1 import records_pb2
from tests.support import ckpt

SLACK = keys.ID_TIME_SLACK_NANOS
#: A sweep interval no test outlives: the sweeps below are the tests' own.
NO_SWEEPER = 100 * 365 * 86400.0
_KEEP = ~(0xF << 76 | 0x3 << 62) & ((1 << 128) - 1)
_V7 = 0x7 << 76 | 0x2 << 62


def uuid7(nanos: int) -> str:
    """A UUIDv7 of 32 hex digits dated ``nanos`` (to the ms), as the clients make them."""
    value = (nanos // 1_000_000) << 80 | int.from_bytes(os.urandom(10), "big")
    return f"{value & _KEEP | _V7:032x}"


def tables(data: Path) -> tuple[dict[bytes, records_pb2.RequestRecord], list[bytes], bytes | None]:
    """The requests table's records by key, the expiry index's keys, and the layout stamp."""
    env = lmdb.open(str(data / "lmdb"), max_dbs=16, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            requests = {
                bytes(k): records_pb2.RequestRecord.FromString(bytes(v))
                for k, v in txn.cursor(db=env.open_db(b"requests", txn=txn))
            }
            expiry = [bytes(k) for k in txn.cursor(db=env.open_db(b"req_expiry", txn=txn)).iternext(values=False)]
            stamp = txn.get(b"layout_version", db=env.open_db(b"meta", txn=txn))
        return requests, expiry, stamp
    finally:
        env.close()


def verify(data: Path) -> tuple[int, str]:
    result = ckpt("verify", "--data-dir", str(data))
    return result.returncode, (result.stdout + result.stderr).decode()


@pytest.fixture
def config(tmp_path: Path) -> StoreConfig:
    return StoreConfig(data_dir=tmp_path / "data", request_id_ttl_seconds=1.0, sweep_interval_seconds=NO_SWEEPER)


def test_a_uuid7_of_now_keeps_no_expiry_entry_is_answered_and_stamps_layout_8(config: StoreConfig) -> None:
    rid, appended = uuid7(time.time_ns()), uuid7(time.time_ns())
    with Store(config) as store:
        made = store.put("s", b"\x08\x01", request_id=rid)
        first = store.append_events("s", [NewEvent("step", b"x")], request_id=appended)
        assert store.put("s", b"\x08\x01", request_id=rid).replayed
        again = store.append_events("s", [NewEvent("step", b"x")], request_id=appended)
        assert again.replayed and (again.first_seq, again.last_seq) == (first.first_seq, first.last_seq) == (1, 1)
        assert store.get("s").version == made.version == 1
    requests, expiry, stamp = tables(config.data_dir)
    assert sorted(requests) == sorted(keys.request_key(b"s", r) for r in (rid, appended))
    assert all(r.swept_by_id_time for r in requests.values())
    assert expiry == []
    assert stamp == b"8"
    assert verify(config.data_dir) == (0, "verified 1 session: 1 ok, 0 failed\n")


@pytest.mark.parametrize(
    ("request_id", "swept_by_id_time"),
    [
        (lambda now: uuid7(now), True),
        (lambda now: uuid7(now - SLACK + 2_000_000_000), True),  # a client's clock behind, within the slack
        (lambda now: uuid7(now + SLACK - 2_000_000_000), True),  # ahead, within it
        (lambda now: uuid7(now - SLACK - 2_000_000_000), False),  # further off: an entry, as before
        (lambda now: uuid7(now + SLACK + 2_000_000_000), False),
        (lambda now: uuid.uuid4().hex, False),  # compact, but its first bytes are no time
        (lambda now: "step-1", False),  # keyed in full
    ],
    ids=["now", "behind", "ahead", "far-behind", "far-ahead", "uuid4", "other"],
)
def test_which_records_go_without_an_entry(
    config: StoreConfig, request_id: Callable[[int], str], swept_by_id_time: bool
) -> None:
    rid = request_id(time.time_ns())
    with Store(config) as store:
        store.put("s", b"\x08\x01", request_id=rid)
    requests, expiry, stamp = tables(config.data_dir)
    (key,) = requests
    assert requests[key].swept_by_id_time is swept_by_id_time
    assert expiry == ([] if swept_by_id_time else [keys.expiry_key(requests[key].expires_unix_nanos, key)])
    assert stamp == (b"8" if swept_by_id_time else b"6")
    assert verify(config.data_dir)[0] == 0


def test_the_sweep_removes_them_once_their_ids_are_a_ttl_and_the_slack_old(config: StoreConfig) -> None:
    now = time.time_ns()
    v7 = [uuid7(now) for _ in range(3)]
    v4 = uuid.uuid4().hex
    with Store(config) as store:
        store.put("a", b"\x08\x01", request_id=v7[0])
        store.append_events("b", [NewEvent("step", b"x")], request_id=v7[1])
        store.append_events("c", [NewEvent("step", b"x")], put=None, request_id=v7[2])
        store.put("d", b"\x08\x01", request_id=v4)
        time.sleep(1.1)  # every record expired (a TTL of 1 s)
        # The v4 record by its entry; the v7 ones stay until their ids are a TTL and the slack old.
        assert store.sweep().request_ids_expired == 1
        assert store.sweep(now_nanos=now + SLACK - 1_000_000_000).request_ids_expired == 0
        late = store.put("a", b"\x08\x01", request_id=v7[0])  # expired: written again, not answered
        assert not late.replayed and late.version == 2
        assert store.sweep(now_nanos=time.time_ns() + 2 * SLACK).request_ids_expired == 3
    requests, expiry, _ = tables(config.data_dir)
    assert requests == {} and expiry == []
    assert verify(config.data_dir)[0] == 0


def test_a_walk_cut_at_the_chunk_goes_on_in_the_next_op(config: StoreConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(requestids, "EXPIRE_CHUNK", 3)
    now = time.time_ns()
    with Store(config) as store:
        for i in range(10):
            store.put(f"s{i}", b"\x08\x01", request_id=uuid7(now + i * 1_000_000))
        for i in range(4):  # records with entries, expiring first, by the index
            store.put(f"e{i}", b"\x08\x01", request_id=uuid.uuid4().hex)
        assert store.sweep(now_nanos=now + 2 * SLACK).request_ids_expired == 14
        kept = store.put("kept", b"\x08\x01", request_id=uuid7(time.time_ns()))
    requests, _, _ = tables(config.data_dir)
    assert [r.version for r in requests.values()] == [kept.version]


def test_a_record_written_under_a_longer_ttl_stays_until_it_expires(config: StoreConfig) -> None:
    rid = uuid7(time.time_ns())
    longer = StoreConfig(data_dir=config.data_dir, request_id_ttl_seconds=3600.0, sweep_interval_seconds=NO_SWEEPER)
    with Store(longer) as store:
        store.put("s", b"\x08\x01", request_id=rid)
    with Store(config) as store:  # the TTL shortened since: the walk reaches the record before it expires
        assert store.sweep(now_nanos=time.time_ns() + 2 * SLACK).request_ids_expired == 0
        assert store.put("s", b"\x08\x01", request_id=rid).replayed
        assert store.sweep(now_nanos=time.time_ns() + 3600 * 10**9 + 2 * SLACK).request_ids_expired == 1


def test_verify_names_a_record_kept_without_an_entry_whose_id_is_no_uuid7(config: StoreConfig) -> None:
    rid = uuid.uuid4().hex
    with Store(config) as store:
        store.put("s", b"\x08\x01", request_id=rid)
    env = lmdb.open(str(config.data_dir / "lmdb"), max_dbs=16)
    with env.begin(write=True) as txn:
        requests, expiry = env.open_db(b"requests", txn=txn), env.open_db(b"req_expiry", txn=txn)
        key = keys.request_key(b"s", rid)
        raw = txn.get(key, db=requests)
        assert raw is not None
        done = records_pb2.RequestRecord.FromString(raw)
        done.swept_by_id_time = True
        txn.put(key, done.SerializeToString(), db=requests)
        assert txn.delete(keys.expiry_key(done.expires_unix_nanos, key), db=expiry)
    env.close()
    code, out = verify(config.data_dir)
    assert code == 1, out
    assert f"FAIL session 's': req_expiry table: request_id '{rid}' is not a UUIDv7" in out, out
    assert "the sweep never removes it" in out
