"""`ckpt verify` cross-checks the session records against the frames table and the index tables.

Reading each listed session's record and frames alone, verify would miss a
session whose record is gone but whose frames are left (unless listing the
sessions table itself failed), and damage to the updated-time index, the
label index, the request records and their expiry index.

A directory is written through the public Store API (labels, request ids,
MERGE writes, forks, deletes, retention, expired request ids, index entries
moved by later writes), damaged with raw lmdb, and checked with the real CLI.
"""

from __future__ import annotations

import re
import shutil
import struct
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import lmdb
import pytest

from ckpt.codec import ChainPolicy
from ckpt.sidecar import PutRequest, Retention, Store, StoreConfig, WriteMode
from ckpt.sidecar.store.keys import label_key, request_key, time_key, updated_key
from ckpt.sidecar.tools.crosscheck import TABLES, CrossCheck
from ckpt.store.v1 import records_pb2
from ckpt.v1 import checkpoint_pb2 as pb
from tests.support import IS_LEAF, Pages, ckpt

_U64 = struct.Struct(">Q")
#: A request id as the clients generate them (a UUIDv7, 32 hex digits), whose record is keyed by its bytes.
HEX_ID = "019ad0a0a0a07000800000000000b001"
COMPACT_ENTRY = b"\x00" + bytes.fromhex(HEX_ID)


def state(session: str, step: int) -> bytes:
    return pb.Checkpoint(step=step, goal=f"{session} goal " + "x" * 200).SerializeToString()


def patch(session: str, step: int) -> bytes:
    return pb.Checkpoint(step=step, messages=[pb.Message(content=f"{session} patch {step}")]).SerializeToString()


def build(data: Path) -> None:
    """Every kind of write that moves index entries, ending undamaged."""
    retention = Retention(keep_last_versions=3)
    short_chains = ChainPolicy(max_depth=2)  # so that retention has whole chains to prune
    config = StoreConfig(data_dir=data, retention=retention, sweep_interval_seconds=3600, chain_policy=short_chains)
    with Store(config) as store:
        for step in range(1, 9):
            for s in ("a", "b", "c", "gone"):
                mode = WriteMode.MERGE if step % 3 else WriteMode.REPLACE
                body = patch(s, step) if mode is WriteMode.MERGE else state(s, step)
                labels = {"team": "red", "owner": s} if step == 1 else {}
                store.put(s, body, mode=mode, request_id=f"{s}:{step}", labels=labels)
        store.put("b", patch("b", 9), mode=WriteMode.MERGE, labels={"team": "blue"})  # the label entry moves
        store.fork("a", 4, "a-fork", labels={"forked": "yes"})
        store.fork("a", 0, "a-fork2")
        # Its record, frames, labels and updated entry go with it; its request ids' records stay until they
        # expire, answering nothing (the session they name is gone).
        assert store.delete_session("gone") == 8
        # And it starts over: the deleted holder's record of gone:1 is replaced; gone:2-8 are left.
        assert not store.put("gone", state("gone", 1), request_id="gone:1").replayed
        assert store.sweep().sessions_pruned >= 3  # retention: request records of pruned versions stay
        time.sleep(1.2)  # past the updated-time index's granule: the next writes move their entries
        store.put("a", patch("a", 9), mode=WriteMode.MERGE, request_id="a:9")
        store.put("c", state("c", 9), request_id="c:9", labels={"owner": "c2"})
        store.put_many([PutRequest(f"s{n}", state(f"s{n}", 1), request_id=f"s{n}:1") for n in range(20)])
        store.put("s8", state("s8", 2), request_id=HEX_ID)  # a client-generated id: keyed compactly
    # Request ids that expire at once and are not swept: the records and entries stay until a sweep.
    config = StoreConfig(data_dir=data, request_id_ttl_seconds=0.001, sweep_interval_seconds=3600)
    with Store(config) as store:
        store.put("c", patch("c", 10), mode=WriteMode.MERGE, request_id="c:exp")
        time.sleep(0.01)
        store.put("c", patch("c", 11), mode=WriteMode.MERGE, request_id="c:exp")  # replaces the expired record


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("indexes") / "data"
    build(data)
    return data


@pytest.fixture
def data(pristine: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "data"
    shutil.copytree(pristine, copy)
    return copy


@contextmanager
def tables(data: Path) -> Iterator[tuple[lmdb.Transaction, dict[str, lmdb._Database]]]:
    """A write transaction on the store's LMDB environment and its named databases."""
    env = lmdb.open(str(data / "lmdb"), max_dbs=8)
    try:
        dbs = {
            n: env.open_db(n.encode()) for n in ("frames", "sessions", "requests", "req_expiry", "labels", "updated")
        }
        with env.begin(write=True) as txn:
            yield txn, dbs
    finally:
        env.close()


def keys_of(txn: lmdb.Transaction, db: lmdb._Database, match: Callable[[bytes], bool]) -> list[bytes]:
    return [bytes(k) for k in txn.cursor(db=db).iternext(values=False) if match(bytes(k))]


def record(txn: lmdb.Transaction, dbs: dict[str, lmdb._Database], sid: bytes) -> records_pb2.SessionRecord:
    return records_pb2.SessionRecord.FromString(bytes(txn.get(sid, db=dbs["sessions"]) or b"\xff"))


# -- the damages: each deletes or adds entries in one table; (session named, table named, what the line says) --


def delete_session_record(txn: lmdb.Transaction, dbs: dict[str, lmdb._Database]) -> tuple[str, str, str]:
    assert txn.delete(b"b", db=dbs["sessions"])
    return "b", "sessions", "no record, but the frames table holds its versions"


def delete_updated_entry(txn: lmdb.Transaction, dbs: dict[str, lmdb._Database]) -> tuple[str, str, str]:
    assert txn.delete(updated_key(record(txn, dbs, b"a").updated_unix_nanos, b"a"), db=dbs["updated"])
    return "a", "updated", "no entry for the record's update time"


def add_stale_updated_entry(txn: lmdb.Transaction, dbs: dict[str, lmdb._Database]) -> tuple[str, str, str]:
    txn.put(updated_key(record(txn, dbs, b"c").updated_unix_nanos - 5 * 2**30, b"c"), b"", db=dbs["updated"])
    return "c", "updated", "a stale entry at "


def add_updated_entry_of_no_session(txn: lmdb.Transaction, dbs: dict[str, lmdb._Database]) -> tuple[str, str, str]:
    txn.put(updated_key(time.time_ns(), b"ghost"), b"", db=dbs["updated"])
    return "ghost", "updated", "names a session with no record"


def delete_label_entry(txn: lmdb.Transaction, dbs: dict[str, lmdb._Database]) -> tuple[str, str, str]:
    assert txn.delete(label_key("team", "blue", b"b"), db=dbs["labels"])
    return "b", "labels", "no entry for its label 'team'='blue'"


def add_stale_label_entry(txn: lmdb.Transaction, dbs: dict[str, lmdb._Database]) -> tuple[str, str, str]:
    txn.put(label_key("team", "green", b"a"), b"", db=dbs["labels"])
    return "a", "labels", "a stale entry for label 'team'='green': the record says 'team'='red'"


def add_label_entry_of_no_session(txn: lmdb.Transaction, dbs: dict[str, lmdb._Database]) -> tuple[str, str, str]:
    txn.put(label_key("team", "red", b"ghost"), b"", db=dbs["labels"])
    return "ghost", "labels", "an entry for label 'team'='red' names a session with no record"


def delete_expiry_entry(txn: lmdb.Transaction, dbs: dict[str, lmdb._Database]) -> tuple[str, str, str]:
    (key,) = keys_of(txn, dbs["req_expiry"], lambda k: k[8:] == request_key(b"s7", "s7:1"))
    assert txn.delete(key, db=dbs["req_expiry"])
    return "s7", "req_expiry", "no entry for request_id 's7:1'"


def add_stray_expiry_entry(txn: lmdb.Transaction, dbs: dict[str, lmdb._Database]) -> tuple[str, str, str]:
    txn.put(time_key(time.time_ns(), request_key(b"a", "never-made")), b"", db=dbs["req_expiry"])
    return "a", "req_expiry", "names request_id 'never-made', which has no record"


def add_stale_expiry_entry(txn: lmdb.Transaction, dbs: dict[str, lmdb._Database]) -> tuple[str, str, str]:
    (key,) = keys_of(txn, dbs["req_expiry"], lambda k: k[8:] == request_key(b"a", "a:9"))
    txn.put(_U64.pack(_U64.unpack_from(key)[0] + 1) + key[8:], b"", db=dbs["req_expiry"])
    return "a", "req_expiry", "a stale entry at "


def delete_compact_expiry_entry(txn: lmdb.Transaction, dbs: dict[str, lmdb._Database]) -> tuple[str, str, str]:
    (key,) = keys_of(txn, dbs["req_expiry"], lambda k: k[8:] == COMPACT_ENTRY)
    assert txn.delete(key, db=dbs["req_expiry"])
    return "s8", "req_expiry", f"no entry for request_id '{HEX_ID}'"


def add_stale_compact_expiry_entry(txn: lmdb.Transaction, dbs: dict[str, lmdb._Database]) -> tuple[str, str, str]:
    (key,) = keys_of(txn, dbs["req_expiry"], lambda k: k[8:] == COMPACT_ENTRY)
    txn.put(_U64.pack(_U64.unpack_from(key)[0] + 1) + key[8:], b"", db=dbs["req_expiry"])
    return "s8", "req_expiry", f"for request_id '{HEX_ID}': no record of it expires then"


def put_request_record(
    txn: lmdb.Transaction, dbs: dict[str, lmdb._Database], key: bytes, version: int, session_created: int = 0
) -> None:
    """A request record, unexpired, with its expiry entry: as the store writes one."""
    expires = time.time_ns() + 10**12
    record = records_pb2.RequestRecord(
        version=version, expires_unix_nanos=expires, session_created_unix_nanos=session_created
    )
    txn.put(key, record.SerializeToString(), db=dbs["requests"])
    txn.put(time_key(expires, key), b"", db=dbs["req_expiry"])


def add_request_record_of_no_session(txn: lmdb.Transaction, dbs: dict[str, lmdb._Database]) -> tuple[str, str, str]:
    # Keyed as store layout 1 did: a delete removed those with their session. (A current record of
    # a deleted session is no damage: it stays until it expires, answering nothing.)
    put_request_record(txn, dbs, b"ghost\x00g:1", version=1)
    return "ghost", "requests", "the record of request_id 'g:1' (version 1) names a session with no record"


def add_request_record_past_the_head(txn: lmdb.Transaction, dbs: dict[str, lmdb._Database]) -> tuple[str, str, str]:
    created = record(txn, dbs, b"s3").created_unix_nanos
    put_request_record(txn, dbs, request_key(b"s3", "future"), version=5, session_created=created)
    return "s3", "requests", "says the write made version 5, but the head is version 1"


def zero_request_record_session_created(
    txn: lmdb.Transaction, dbs: dict[str, lmdb._Database], sid: bytes = b"s5"
) -> tuple[str, str, str]:
    """A current record whose session_created_unix_nanos is 0, as no write stores it: it can name no session,
    so a retry of its write, to the session it was written to, would be written again."""
    key = request_key(sid, f"{sid.decode()}:1")
    raw = txn.get(key, db=dbs["requests"])
    assert raw is not None
    done = records_pb2.RequestRecord.FromString(bytes(raw))
    assert done.session_created_unix_nanos == record(txn, dbs, sid).created_unix_nanos != 0
    done.session_created_unix_nanos = 0
    txn.put(key, done.SerializeToString(), db=dbs["requests"])  # its expiry, so its expiry entry, is unchanged
    return (
        sid.decode(),
        "requests",
        f"the record of request_id '{sid.decode()}:1' (version 1) names no session (session_created_unix_nanos is 0)",
    )


DAMAGES = [
    delete_session_record,
    delete_updated_entry,
    add_stale_updated_entry,
    add_updated_entry_of_no_session,
    delete_label_entry,
    add_stale_label_entry,
    add_label_entry_of_no_session,
    delete_expiry_entry,
    add_stray_expiry_entry,
    add_stale_expiry_entry,
    delete_compact_expiry_entry,
    add_stale_compact_expiry_entry,
    add_request_record_of_no_session,
    add_request_record_past_the_head,
    zero_request_record_session_created,
]


def verify(data: Path, *sessions: str) -> tuple[int, str, str]:
    result = ckpt("verify", *sessions, "--data-dir", str(data))
    err = result.stderr.decode()
    assert "Traceback" not in err, err
    return result.returncode, result.stdout.decode(), err


def test_an_undamaged_directory_verifies_clean(pristine: Path) -> None:
    code, out, err = verify(pristine)
    assert (code, err) == (0, ""), err
    assert out == "verified 26 sessions: 26 ok, 0 failed\n"
    with tables(pristine) as (txn, dbs):  # the directory has what the checks are about
        assert len(keys_of(txn, dbs["labels"], lambda k: True)) == 7
        assert txn.stat(dbs["requests"])["entries"] == txn.stat(dbs["req_expiry"])["entries"] > 20
        assert record(txn, dbs, b"a").first_version > 1  # pruned; its first request records name pruned versions
        expired = keys_of(txn, dbs["req_expiry"], lambda k: _U64.unpack_from(k)[0] < time.time_ns())
        assert [k[8:] for k in expired] == [request_key(b"c", "c:exp")]


@pytest.mark.parametrize("damage", DAMAGES, ids=[d.__name__ for d in DAMAGES])
def test_verify_names_the_session_and_table_of_each_damage(
    data: Path, damage: Callable[[lmdb.Transaction, dict[str, lmdb._Database]], tuple[str, str, str]]
) -> None:
    with tables(data) as (txn, dbs):
        session, table, what = damage(txn, dbs)
    code, out, err = verify(data)
    assert code == 1, (out, err)
    lines = [line for line in err.splitlines() if line.startswith(f"FAIL session '{session}': {table} table: ")]
    assert any(what in line for line in lines), err
    assert out.startswith("verified "), out


def test_the_summary_counts_damaged_sessions_and_entries_of_no_session(data: Path) -> None:
    with tables(data) as (txn, dbs):
        delete_session_record(txn, dbs)  # b: its frames, label, updated and request entries are left
        delete_label_entry_of_a = label_key("team", "red", b"a")
        assert txn.delete(delete_label_entry_of_a, db=dbs["labels"])
    code, out, err = verify(data)
    assert code == 1
    # b is found by its frames (checked, failed), a fails; b's leftover index entries name a session with no
    # record. Its request records do not count: as after a delete, they answer nothing until they expire.
    strays = [line for line in err.splitlines() if "names a session with no record" in line]
    assert {line.split(": ")[1] for line in strays} == {"updated table", "labels table"}, err
    assert all(line.startswith("FAIL session 'b': ") for line in strays), err
    assert len(strays) == 1 + 2, err
    assert out == "verified 26 sessions: 24 ok, 2 failed; 3 more problems cross-checking the tables (see above)\n"


def test_a_request_record_naming_no_session_is_damage_while_its_session_lives(data: Path) -> None:
    """A current request record with session_created_unix_nanos 0 matches no session, so a retry of its
    write would be written again: verify passed it over as if written to a deleted, earlier holder of the id.
    Once its session is deleted it answers nothing anyway, like every record of a deleted session, and
    is no damage (nor is one of store layout 1, which has no such time)."""
    with tables(data) as (txn, dbs):
        zero_request_record_session_created(txn, dbs, b"s5")
        zero_request_record_session_created(txn, dbs, b"s6")
        put_request_record(txn, dbs, b"s7\x00s7:0", version=1)  # keyed as store layout 1 wrote it: no time
    code, out, err = verify(data, "s5", "s7")
    assert code == 1 and out == "verified 2 sessions: 1 ok, 1 failed\n", (out, err)
    assert err == (
        "FAIL session 's5': requests table: the record of request_id 's5:1' (version 1) names no session"
        " (session_created_unix_nanos is 0): a retry of that write would be written again\n"
    )
    with Store(StoreConfig(data_dir=data, sweep_interval_seconds=3600)) as store:
        assert store.delete_session("s5") == 1
    code, out, err = verify(data)
    assert code == 1 and out == "verified 25 sessions: 24 ok, 1 failed\n", (out, err)
    assert "'s5'" not in err and err.startswith("FAIL session 's6': requests table: "), err
    with Store(StoreConfig(data_dir=data, sweep_interval_seconds=3600)) as store:
        assert store.delete_session("s6") == 1
    assert verify(data) == (0, "verified 24 sessions: 24 ok, 0 failed\n", "")
    with tables(data) as (txn, dbs):  # the records stayed: a delete leaves them to expire
        assert txn.get(request_key(b"s5", "s5:1"), db=dbs["requests"]) is not None


def test_named_sessions_are_cross_checked_alone(data: Path) -> None:
    with tables(data) as (txn, dbs):
        delete_updated_entry(txn, dbs)
        add_label_entry_of_no_session(txn, dbs)
    assert verify(data, "b", "c") == (0, "verified 2 sessions: 2 ok, 0 failed\n", "")
    code, out, err = verify(data, "b", "a")
    assert code == 1 and out == "verified 2 sessions: 1 ok, 1 failed\n", (out, err)
    assert err.startswith("FAIL session 'a': updated table: no entry for the record's update time"), err
    assert "ghost" not in err
    code, out, err = verify(data, "ghost")
    assert code == 1 and "FAIL session 'ghost': session 'ghost' does not exist" in err
    assert "FAIL session 'ghost': labels table: an entry for label 'team'='red' names a session with no record" in err


def test_a_cross_check_pass_lmdb_aborts_on_is_reported_and_the_other_tables_are_checked(tmp_path: Path) -> None:
    """A labels leaf whose flags are cleared: the labels pass dies (SIGABRT); the passes after it run in a new child."""
    data = tmp_path / "data"
    with Store(StoreConfig(data_dir=data)) as store:
        store.put_many(
            [PutRequest(f"s{n:03d}", state("s", n), request_id=f"r{n}", labels={"v": "x" * 120}) for n in range(300)]
        )
    with tables(data) as (txn, dbs):
        delete_expiry = keys_of(txn, dbs["req_expiry"], lambda k: k[8:] == request_key(b"s007", "r7"))
        assert txn.delete(delete_expiry[0], db=dbs["req_expiry"])
    pages = Pages(data)
    env = lmdb.open(str(data / "lmdb"), max_dbs=8, readonly=True, lock=False)
    with env.begin() as txn:
        pages.records["labels"] = txn.get(b"labels")  # the table's MDB_db record in the main database
    env.close()
    pgno, _ = pages.leaves("labels")[1]
    pages.put(pgno, 10, "<H", 0)
    pages.write()

    code, out, err = verify(data)
    assert code == 1, err
    assert re.search(
        re.escape(f"FAIL cross-checking the labels table: {data}/lmdb/data.mdb: LMDB aborted (SIGABRT: ")
        + IS_LEAF
        + re.escape(") while reading the labels table; its cross-checks are skipped\n"),
        err,
    ), err
    assert "FAIL session 's007': req_expiry table: no entry for request_id 'r7'" in err, err
    assert out == "verified 300 sessions: 299 ok, 1 failed; 1 more problem cross-checking the tables (see above)\n"


def _cross_check_peak_bytes(data: Path) -> tuple[int, int]:
    """Problems found and the peak of Python allocations while every cross-check pass runs in-process."""
    with Store(StoreConfig(data_dir=data), readonly=True) as store, store.read() as txn:
        tracemalloc.start()
        try:
            check = CrossCheck(store, txn, None)
            check.read_sessions()
            found = sum(1 for table in TABLES for _ in check.run(table))
            return found, tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()


@pytest.mark.parametrize("sessions", [50, 2_000])
def test_the_cross_checks_hold_no_entry_per_session_or_request_id(tmp_path: Path, sessions: int) -> None:
    """A store remembers every write's request id for a day: millions of records. The cross-checks
    used to collect the keys the records implied (100-140 bytes per session, label and request id:
    ~1.5 MB here for 2,000 sessions with 6 request ids each, gigabytes on a production store); they
    now look entries up, so their peak is the same for 50 sessions as for 2,000."""
    data = tmp_path / "data"
    with Store(StoreConfig(data_dir=data)) as store:
        store.put_many(
            [
                PutRequest(f"s{n:05d}", state("s", step), request_id=f"s{n:05d}:{step}", labels={"team": str(n % 3)})
                for step in range(1, 7)
                for n in range(sessions)
            ]
        )
    found, peak = _cross_check_peak_bytes(data)
    assert found == 0
    assert peak < 64 * 1024, f"{peak} bytes allocated at the peak for {sessions} sessions"


def test_a_named_id_no_session_can_have_fails_alone(pristine: Path) -> None:
    """An empty or overlong id was also looked up by the cross-checks, whose LMDB get failed on the
    key size: a second line said the tables were not cross-checked."""
    code, out, err = verify(pristine, "", "b", "x" * 300)
    assert code == 1 and out == "verified 3 sessions: 1 ok, 2 failed\n", (out, err)
    assert err.splitlines() == [
        "FAIL session '': session_id is empty; it must be 1-256 bytes of UTF-8",
        f"FAIL session '{'x' * 300}': session_id is 300 bytes; the limit is 256",
    ]
