"""Request records keyed by two hashes (store layout 5): 17 bytes whatever the ids, and records of layouts
2-4 answered until they expire, in real LMDB directories, checked by the real `ckpt verify`."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckpt.sidecar import IncompatibleStore, InvalidArgument, PutRequest, Store, StoreConfig
from ckpt.sidecar.client import CheckpointClient
from ckpt.sidecar.store import NewEvent, keys, layout
from ckpt.sidecar.store.layout import OlderRequestKeys
from ckpt.store.v1 import records_pb2
from tests.store.support import older_request_keys, older_request_lookups, request_keys_as_older_layout
from tests.support import ckpt, start_sidecar


@contextlib.contextmanager
def lmdb_tables(data: Path) -> Iterator[tuple[lmdb.Transaction, lmdb._Database, lmdb._Database]]:
    """A write transaction on a store's LMDB environment, and its requests and req_expiry tables."""
    env = lmdb.open(str(data / "lmdb"), max_dbs=10)
    try:
        with env.begin(write=True) as txn:
            yield txn, env.open_db(b"requests", txn=txn), env.open_db(b"req_expiry", txn=txn)
    finally:
        env.close()


def request_keys(data: Path) -> tuple[list[bytes], list[bytes]]:
    """The requests table's keys, and the requests keys the req_expiry entries name (in time order)."""
    with lmdb_tables(data) as (txn, requests, expiry):
        return (
            [bytes(k) for k in txn.cursor(db=requests).iternext(values=False)],
            [bytes(k[8:]) for k in txn.cursor(db=expiry).iternext(values=False)],
        )


def verify(data: Path, *sessions: str) -> tuple[int, str]:
    result = ckpt("verify", *sessions, "--data-dir", str(data))
    return result.returncode, result.stderr.decode()


def test_records_of_layouts_2_to_4_answer_retries_until_the_sweeper_expires_them(tmp_path: Path) -> None:
    """A store upgraded from layout 4 keeps its records where they are: retries of writes acknowledged before
    the upgrade are answered from them (a Put's and an AppendEvents', through the store and through a real
    sidecar), a write with another id makes a current record, and the sweeper expires both forms. Once no
    older record is left, writes stop looking under the older key. An older ckpt refuses the store."""
    data = tmp_path / "data"
    ttl = 2.0
    with Store(StoreConfig(data_dir=data, request_id_ttl_seconds=ttl)) as store:
        for sid in ("a", "b", "s"):
            store.put(sid, b"\x08\x01", request_id=f"{sid}-old")
        store.append_events("c", [NewEvent("step")], request_id="c-old")
    old = [("a", "a-old"), ("b", "b-old"), ("s", "s-old"), ("c", "c-old")]
    request_keys_as_older_layout(data, old, 4)
    older_keys = sorted(keys.layout4_request_key(sid.encode(), rid) for sid, rid in old)
    assert request_keys(data)[0] == older_keys
    assert verify(data) == (0, "")

    sidecar = start_sidecar(data, "--sweep-interval-seconds", "3600")
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            reply = client.put("s", b"\x08\x01", request_id="s-old")
            assert (reply.version, reply.replayed) == (1, True)
    finally:
        assert sidecar.stop() == 0
    config = StoreConfig(data_dir=data, request_id_ttl_seconds=ttl, sweep_interval_seconds=3600)
    with Store(config) as store:
        assert older_request_keys(store) == OlderRequestKeys(layout4=True, layout1=False)
        retried = store.put("a", b"\x08\x01", request_id="a-old")
        assert retried.replayed and retried.version == 1
        with pytest.raises(InvalidArgument, match="request_id 'a-old' was used for a different write"):
            store.put("a", b"\x08\x02", request_id="a-old")
        appended = store.append_events("c", [NewEvent("step")], request_id="c-old")
        assert appended.replayed and (appended.first_seq, appended.last_seq) == (1, 1)
        assert store.put("a", b"\x08\x03", request_id="a-new").version == 2
        # A deleted session's record answers nothing for a new holder of the id, in either form.
        assert store.delete_session("b") == 1
        assert not store.put("b", b"\x08\x01", request_id="b-old").replayed
        assert store.put("b", b"\x08\x01", request_id="b-old").replayed  # now from its current record
    requests, expiry = request_keys(data)
    current = sorted(keys.request_key(sid, rid) for sid, rid in ((b"a", "a-new"), (b"b", "b-old")))
    assert requests == older_keys + current  # the older records stay where they are until they expire
    assert sorted(expiry) == sorted(requests)
    assert all(len(key) == keys.REQUEST_KEY_BYTES for key in current)
    assert verify(data) == (0, "")

    time.sleep(ttl)
    with Store(config) as store:
        assert older_request_keys(store)  # still there at open: expired, not yet swept
        assert store.sweep().request_ids_expired == 6  # both forms: the four older records, the two current
        assert not older_request_keys(store)
        looked = older_request_lookups(store)
        assert not store.put("a", b"\x08\x04", request_id="a-old").replayed  # expired: a new write
        assert store.put("a", b"\x08\x04", request_id="a-old").replayed
        assert not store.put("a", b"\x08\x05", request_id="a-newer").replayed
        assert older_request_lookups(store) == looked  # one get per lookup: no older key is looked under
    requests, expiry = request_keys(data)
    assert requests == sorted(keys.request_key(b"a", rid) for rid in ("a-old", "a-newer")) == sorted(expiry)
    with pytest.raises(IncompatibleStore, match="store layout 5; this ckpt reads layout 4"), _layout_version(4):
        Store(StoreConfig(data_dir=data))


@contextlib.contextmanager
def _layout_version(version: int) -> Iterator[None]:
    """The store code reading only layouts up to ``version``: an older ckpt, as far as the stamp goes.
    (A private hook: the layout this code reads is a constant of its module.)"""
    before = layout.LAYOUT_VERSION
    layout.LAYOUT_VERSION = version
    try:
        yield
    finally:
        layout.LAYOUT_VERSION = before


def test_verify_names_the_session_of_a_damaged_current_record_in_a_mixed_store(tmp_path: Path) -> None:
    """A current key names its session only by a hash: verify finds each session's records by it, in a
    store holding both forms, and names the session of a record that is wrong or does not parse."""
    data = tmp_path / "data"
    with Store(StoreConfig(data_dir=data)) as store:
        for sid in ("a", "b"):
            store.put(sid, b"\x08\x01", request_id=f"{sid}-old")
            store.put(sid, b"\x08\x02", request_id=f"{sid}-new")
    request_keys_as_older_layout(data, [("a", "a-old"), ("b", "b-old")], 4)
    with Store(StoreConfig(data_dir=data)) as store:
        store.put("a", b"\x08\x03", request_id="a-newest")  # stamps the store 5
    assert verify(data) == (0, "")
    assert verify(data, "a") == (0, "")

    past_head = keys.request_key(b"a", "a-new")
    hashed = f"request hash {past_head[9:].hex()}"
    with lmdb_tables(data) as (txn, requests, _):
        done = records_pb2.RequestRecord.FromString(bytes(txn.get(past_head, db=requests) or b""))
        done.version = 9
        txn.put(past_head, done.SerializeToString(), db=requests)
    code, err = verify(data)
    assert code == 1
    assert err == (
        f"FAIL session 'a': requests table: the record of {hashed} says the write made version 9, but the head is"
        " version 3\n"
    )
    assert verify(data, "a") == (1, err)
    assert verify(data, "b") == (0, "")

    with lmdb_tables(data) as (txn, requests, _):
        txn.put(past_head, b"\xff\xff\xff", db=requests)
    code, err = verify(data, "a")
    assert code == 1 and err.startswith(f"FAIL session 'a': requests table: the record of {hashed} does not parse")


def test_a_stray_expiry_entry_is_named_by_its_sessions_hash(tmp_path: Path) -> None:
    """An expiry entry whose record is gone: the session its key's hash names fails, and one whose hash no
    session has is a problem of the table alone."""
    data = tmp_path / "data"
    with Store(StoreConfig(data_dir=data)) as store:
        store.put("a", b"\x08\x01", request_id="r1")
    with lmdb_tables(data) as (txn, _, expiry):
        txn.put(keys.time_key(time.time_ns(), keys.request_key(b"a", "never-made")), b"", db=expiry)
        txn.put(keys.time_key(time.time_ns(), keys.request_key(b"ghost", "g")), b"", db=expiry)
    code, err = verify(data)
    lines = err.splitlines()
    assert code == 1 and len(lines) == 2, err
    assert lines[0].startswith("FAIL session 'a': req_expiry table: an entry at "), err
    assert lines[0].endswith(
        f"names request hash {keys.request_key(b'a', 'never-made')[9:].hex()}, which has no record"
    )
    assert lines[1].startswith("FAIL req_expiry table: an entry at "), err
    assert lines[1].endswith("which has no record (no session with a record has its session's hash)"), err


_IDS = st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=40)


@given(st.lists(st.tuples(_IDS, _IDS), min_size=1, max_size=30, unique=True))
def test_a_request_key_is_the_same_for_its_pair_and_another_for_any_other(pairs: list[tuple[str, str]]) -> None:
    """The key depends on the (session, request id) pair alone: the same pair always gives it, two pairs never
    share one, and a session's keys share its prefix (its records are one key range)."""
    made = {(sid, rid): keys.request_key(sid.encode(), rid) for sid, rid in pairs}
    assert len(set(made.values())) == len(made)
    for (sid, rid), key in made.items():
        assert keys.request_key(sid.encode(), rid) == key
        assert len(key) == keys.REQUEST_KEY_BYTES
        assert key.startswith(keys.session_requests_prefix(sid.encode()))


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (("ab", "c"), ("a", "bc")),  # the same bytes split at another place
        (("s", "r"), ("r", "s")),  # the ids swapped
        (("s", "r"), ("s", "r ")),
        (("s", "r"), ("s ", "r")),
    ],
)
def test_pairs_of_the_same_bytes_get_different_keys(a: tuple[str, str], b: tuple[str, str]) -> None:
    assert keys.request_key(a[0].encode(), a[1]) != keys.request_key(b[0].encode(), b[1])


def test_the_request_id_is_still_checked() -> None:
    with pytest.raises(InvalidArgument, match="request_id is 129 bytes; the limit is 128"):
        keys.request_key(b"s", "x" * 129)
    with pytest.raises(InvalidArgument, match="request_id 'a\\\\nb'"):
        keys.request_key(b"s", "a\nb")


def _key_and_value_bytes(data: Path) -> int:
    with lmdb_tables(data) as (txn, requests, expiry):
        return sum(len(k) + len(v) for db in (requests, expiry) for k, v in txn.cursor(db=db))


def test_a_write_s_request_record_and_expiry_entry_take_80_bytes_fewer_than_layout_4_s(tmp_path: Path) -> None:
    """Layouts 2-4 keyed a record by both ids, and its expiry entry repeated the key: a UUIDv7 request id (32
    hex digits, as the clients make them) and a UUID session id (a LangGraph thread's) gave 70-byte keys.
    Keyed by the two hashes they are 17 bytes: 2 x 53 bytes fewer per write, the values unchanged."""
    data = tmp_path / "data"
    writes = [(str(uuid.uuid4()), uuid.uuid4().hex) for _ in range(200)]
    with Store(StoreConfig(data_dir=data)) as store:
        store.put_many([PutRequest(sid, b"\x08\x01", request_id=rid) for sid, rid in writes])
    current = _key_and_value_bytes(data)
    request_keys_as_older_layout(data, writes, 4)  # the same records, keyed as layout 4 did
    older = _key_and_value_bytes(data)
    assert (older - current) / len(writes) >= 80, (older, current)
    assert (older - current) / len(writes) == 2 * (1 + 32 + 1 + 36 - keys.REQUEST_KEY_BYTES)
