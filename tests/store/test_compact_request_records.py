"""Request records of client-generated ids, keyed compactly (store layout 6), and those keyed before it.

The clients generate request ids of 32 lowercase hex digits (a UUIDv7). Layout 6 keys their records by
the id's 16 bytes and the session id, and their expiry entries by the id alone. A retry must still be
answered across a restart, from a record of either form: tests/store/fixtures/layout4_requests.tar.gz
was written by the last build of layout 4, which keyed every id in full
(fixtures/write_layout4_requests.py, with the manifest of what each write answered).
"""

from __future__ import annotations

import json
import random
import tarfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import lmdb
import pytest

from ckpt.sidecar import InvalidArgument, PutRequest, PutResult, Store, StoreConfig
from ckpt.sidecar.client import CheckpointClient, event
from ckpt.sidecar.client.arguments import new_request_id
from ckpt.sidecar.store import NewEvent
from ckpt.v1 import service_pb2
from tests.store.fixtures.write_layout4_requests import CENTURY_SECONDS
from tests.support import ckpt, start_sidecar

FIXTURE = Path(__file__).parent / "fixtures" / "layout4_requests.tar.gz"
#: The first byte of a compact request key (the id's 16 bytes follow), and of one with the id in full.
COMPACT, FULL = b"\x00", b"\x01"


def request_keys(data: Path) -> tuple[list[bytes], list[bytes]]:
    """The requests table's keys, and the expiry index's keys without their times."""
    env = lmdb.open(str(data / "lmdb"), max_dbs=16, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            requests = [bytes(k) for k in txn.cursor(db=env.open_db(b"requests", txn=txn)).iternext(values=False)]
            expiry = [bytes(k[8:]) for k in txn.cursor(db=env.open_db(b"req_expiry", txn=txn)).iternext(values=False)]
        return requests, expiry
    finally:
        env.close()


def verified(data: Path) -> None:
    result = ckpt("verify", "--data-dir", str(data))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture
def layout4(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    data = tmp_path / "data"
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(data, filter="data")
    manifest: dict[str, Any] = json.loads((data / "manifest.json").read_text())
    return data, manifest


def test_a_retry_through_a_restarted_sidecar_is_answered_from_the_compact_record(tmp_path: Path) -> None:
    data = tmp_path / "data"
    appended_id, put_id = new_request_id(), new_request_id()
    sidecar = start_sidecar(data)
    try:
        with CheckpointClient(sidecar.unix_target) as c:
            first = c.append_events("agent", [event("step", b"one"), event("step", b"two")], request_id=appended_id)
            made = c.put("agent", b"\x08\x01", request_id=put_id)
    finally:
        assert sidecar.stop() == 0, sidecar.log()
    requests, expiry = request_keys(data)
    compact = [COMPACT + bytes.fromhex(rid) + b"agent" for rid in (appended_id, put_id)]
    assert requests == sorted(compact)  # 22 bytes each, where the id in full took 40
    assert expiry == []  # UUIDv7s of now: their records are swept by the ids' time (store layout 8)
    verified(data)
    sidecar = start_sidecar(data)
    try:
        with CheckpointClient(sidecar.unix_target) as c:
            again = c.append_events("agent", [event("step", b"one"), event("step", b"two")], request_id=appended_id)
            assert (again.first_seq, again.last_seq) == (first.first_seq, first.last_seq) == (1, 2)
            replayed = c.put("agent", b"\x08\x01", request_id=put_id)
            assert replayed.replayed and replayed.version == made.version == 1
            assert [e.seq for e in c.events("agent")] == [1, 2]  # nothing appended twice
            assert [h.version for h in c.history("agent")] == [1]
            with pytest.raises(Exception, match="was used for a different write"):
                c.append_events("agent", [event("step", b"other")], request_id=appended_id)
    finally:
        assert sidecar.stop() == 0, sidecar.log()


def test_retries_of_records_keyed_in_full_by_layout_4_are_answered_after_the_upgrade(
    layout4: tuple[Path, dict[str, Any]],
) -> None:
    data, manifest = layout4
    put, append, append_put, other = (manifest[k] for k in ("put", "append", "append_put", "other"))
    fresh = new_request_id()
    for restart in range(2):  # the first start upgrades the store; the second reads it as upgraded
        sidecar = start_sidecar(data)
        try:
            with CheckpointClient(sidecar.unix_target) as c:
                done = c.put(put["session"], b"\x0a\x03one", request_id=put["request_id"])
                assert done.replayed and done.version == put["version"] and done.state_xxh3 == put["state_xxh3"]
                events = [event("message", b'{"text": "event %d"}' % i, attributes={"role": "user"}) for i in range(3)]
                again = c.append_events(append["session"], events, request_id=append["request_id"])
                assert [again.first_seq, again.last_seq] == append["seqs"]
                with_put = c.append_events(
                    append_put["session"],
                    events[:2],
                    put=service_pb2.PutRequest(state=b"\x0a\x03two"),
                    request_id=append_put["request_id"],
                )
                assert [with_put.first_seq, with_put.last_seq] == append_put["seqs"]
                assert with_put.put.replayed and with_put.put.version == append_put["version"]
                assert c.put(other["session"], b"\x0a\x05three", request_id=other["request_id"]).replayed
                assert [e.seq for e in c.events("log")] == list(range(1, 6 + restart))  # nothing appended twice
                assert [h.version for h in c.history("log")] == [1]
                with pytest.raises(Exception, match="was used for a different write"):
                    c.put(put["session"], b"\x0a\x03new", request_id=put["request_id"])
                if restart == 0:
                    c.append_events("log", [event("message", b"after")], request_id=fresh)
        finally:
            assert sidecar.stop() == 0, sidecar.log()
        requests, _ = request_keys(data)
        full = {
            FULL + manifest[k]["request_id"].encode() + b"\x00" + manifest[k]["session"].encode()
            for k in ("put", "append", "append_put", "other")
        }
        assert full <= set(requests)  # answered where they are, until they expire
        assert COMPACT + bytes.fromhex(fresh) + b"log" in requests
        verified(data)


def test_a_write_under_the_id_of_a_deleted_sessions_record_keyed_in_full_replaces_it(
    layout4: tuple[Path, dict[str, Any]],
) -> None:
    data, manifest = layout4
    rid = manifest["put"]["request_id"]
    with Store(StoreConfig(data_dir=data)) as store:
        assert store.delete_session("put") == 1
        made = store.put("put", b"\x0a\x03one", request_id=rid)  # another session of that id: a new write
        assert not made.replayed and made.version == 1
        assert store.put("put", b"\x0a\x03one", request_id=rid).replayed
    requests, expiry = request_keys(data)
    compact = COMPACT + bytes.fromhex(rid) + b"put"
    assert compact in requests and FULL + rid.encode() + b"\x00put" not in requests
    assert compact[:17] in expiry and FULL + rid.encode() + b"\x00put" not in expiry
    verified(data)


def test_the_sweep_expires_records_of_either_form_and_a_retry_after_it_writes_again(
    layout4: tuple[Path, dict[str, Any]],
) -> None:
    data, manifest = layout4
    rid = uuid.uuid4().hex  # compact, but not time-ordered: its records have expiry entries
    # No sweep of the sweeper's own: the fixture's last one was long ago, so with any shorter interval one
    # would run as the store opens and expire the fixture's expired record before the count below.
    config = StoreConfig(data_dir=data, request_id_ttl_seconds=1.0, sweep_interval_seconds=CENTURY_SECONDS)
    with Store(config) as store:
        for sid in ("one", "two"):  # one id, two sessions: one expiry entry names both records
            store.append_events(sid, [NewEvent("step", b"x")], request_id=rid)
        assert store.append_events("two", [NewEvent("step", b"x")], request_id=rid).replayed
    requests, expiry = request_keys(data)
    assert len(requests) == 7 and expiry.count(COMPACT + bytes.fromhex(rid)) == 2
    time.sleep(1.1)
    with Store(config) as store:
        # The fixture's expired record (keyed in full) and the two just written (compact).
        assert store.sweep().request_ids_expired == 3
    requests, expiry = request_keys(data)
    assert not [key for key in requests if key.startswith(COMPACT)]
    assert FULL + manifest["expired"]["request_id"].encode() + b"\x00expired" not in requests
    assert len(requests) == len(expiry) == 4  # the fixture's, for a century
    with Store(config) as store:
        again = store.append_events("one", [NewEvent("step", b"x")], request_id=rid)
        assert not again.replayed and again.first_seq == 2
        expired = manifest["expired"]
        late = store.append_events(expired["session"], [NewEvent("step", b"x")], request_id=expired["request_id"])
        assert not late.replayed and late.first_seq == 3
    verified(data)


def test_a_hex_id_in_capitals_is_its_own_id_keyed_in_full(tmp_path: Path) -> None:
    rid = new_request_id()
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        store.put("s", b"\x08\x01", request_id=rid)
        with pytest.raises(InvalidArgument, match="was used for a different write"):
            store.put("s", b"\x08\x02", request_id=rid)
        assert store.put("s", b"\x08\x02", request_id=rid.upper()).version == 2
    requests, _ = request_keys(tmp_path / "data")
    assert requests == [
        COMPACT + bytes.fromhex(rid) + b"s",
        b"\x01" + rid.upper().encode() + b"\x00s",
    ]
    verified(tmp_path / "data")


def test_a_retry_in_the_commit_of_its_first_write_is_answered(tmp_path: Path) -> None:
    """A commit's request records are put just before it commits (in key order): a retry the same commit
    carries still finds the record its first write left, and appends nothing twice."""
    rid = new_request_id()
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        first, again, other = store.put_many(
            [
                PutRequest("s", b"\x08\x01", request_id=rid),
                PutRequest("s", b"\x08\x01", request_id=rid),
                PutRequest("s", b"\x08\x02", request_id=rid),
            ]
        )
        assert isinstance(first, PutResult) and isinstance(again, PutResult)
        assert (first.version, first.replayed, again.version, again.replayed) == (1, False, 1, True)
        assert isinstance(other, InvalidArgument) and "was used for a different write" in str(other)
        ids = [new_request_id() for _ in range(16)]
        with ThreadPoolExecutor(16) as pool:  # appends and their retries, many in each commit
            results = list(
                pool.map(
                    lambda n: [
                        store.append_events(f"log{n}", [NewEvent("step", b"x")], request_id=ids[n]) for _ in range(3)
                    ],
                    range(16),
                )
            )
        assert all([(r.first_seq, r.replayed) for r in rs] == [(1, False), (1, True), (1, True)] for rs in results)
        assert store.put("s", b"\x08\x01", request_id=rid).replayed
    requests, _ = request_keys(tmp_path / "data")
    assert len(requests) == 17 and all(key.startswith(COMPACT) for key in requests)
    verified(tmp_path / "data")


def test_the_records_of_one_commit_fill_the_pages_they_take_whatever_the_order_of_their_ids(tmp_path: Path) -> None:
    """Put one by one as their writes came, ids out of order split the page at the table's right edge in
    the middle, leaving it half full; put in key order at the commit, each lands at the right edge."""
    ids = sorted(new_request_id() for _ in range(400))
    random.Random(7).shuffle(ids)
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        results = store.put_many([PutRequest(f"session-{n:03d}", b"\x08\x01", request_id=i) for n, i in enumerate(ids)])
        assert all(not isinstance(r, Exception) and r.version == 1 for r in results)
    env = lmdb.open(str(tmp_path / "data" / "lmdb"), max_dbs=16, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            db = env.open_db(b"requests", txn=txn)
            stat = txn.stat(db)
            used = sum(len(k) + len(v) + 10 for k, v in txn.cursor(db=db))  # 8 bytes of node header, 2 of pointer
    finally:
        env.close()
    assert stat["entries"] == 400
    assert stat["leaf_pages"] <= -(-used // int(0.9 * (stat["psize"] - 16))), (stat, used)
