"""`ckpt verify` checks the records whose damage makes a retry write twice, serves another session's state,
or fails every later write: the times naming a session and its event log, the meta table, the log's counts.

Each damage left verify at exit 0 before: a session record whose creation time went back (its request
records looked like an earlier, deleted holder's, so a retry of an acknowledged write was written again),
two sessions' frames swapped (frames do not name their session), a meta value no typed write can read, an
event log record naming the wrong open block. A store written through the public API, with deletes and
re-creations under the same ids, forks, retention and events, verifies clean.
"""

from __future__ import annotations

import shutil
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import lmdb
import pytest

from ckpt.codec import ChainPolicy
from ckpt.sidecar import PutRequest, Retention, Store, StoreConfig, WriteMode
from ckpt.sidecar.store import NewEvent
from ckpt.sidecar.store.keys import request_key
from ckpt.store.v1 import records_pb2
from ckpt.v1 import checkpoint_pb2 as pb
from tests.support import ckpt

Tables = dict[str, lmdb._Database]
NAMES = ("frames", "sessions", "requests", "event_logs", "events", "meta")


def state(step: int) -> bytes:
    return pb.Checkpoint(step=step, goal="g" * 300).SerializeToString()


def build(data: Path) -> None:
    """Writes with request ids, a delete and a re-creation under the same ids (session and event log), forks,
    retention, events past a sealed block."""
    config = StoreConfig(
        data_dir=data,
        retention=Retention(keep_last_versions=2),
        chain_policy=ChainPolicy(max_depth=1),
        sweep_interval_seconds=3600,
    )
    with Store(config) as store:
        store.put("typed", state(1), message_type="ckpt.v1.Checkpoint", request_id="t:1")
        for step in range(1, 4):
            store.put("agent", state(step), request_id=f"agent:{step}")
            store.append_events("agent", [NewEvent("step", b"s%d" % step)], request_id=f"ev:{step}")
        assert store.delete_session("agent") == 3
        store.put("agent", state(9), request_id="agent:9")  # agent:1-3 and ev:1-3 name the deleted holder
        store.append_events("agent", [NewEvent("step", b"again")], request_id="ev:9")
        for step in range(1, 6):
            store.put("pruned", state(step), mode=WriteMode.REPLACE, request_id=f"p:{step}")
        store.fork("pruned", 3, "fork", copy_events=False)
        store.append_events("log", [NewEvent("step", b"x%d" % i) for i in range(300)], request_id="log:1")
        store.append_events("log", [NewEvent("step", b"y")])
        # A put and events in one write.
        store.append_events("both", [NewEvent("step", b"z")], put=PutRequest("both", state(1)), request_id="both:1")
        assert store.sweep().sessions_pruned >= 1


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("records") / "data"
    build(data)
    return data


@pytest.fixture
def data(pristine: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "data"
    shutil.copytree(pristine, copy)
    return copy


@contextmanager
def tables(data: Path) -> Iterator[tuple[lmdb.Transaction, Tables]]:
    env = lmdb.open(str(data / "lmdb"), max_dbs=16)
    try:
        dbs = {name: env.open_db(name.encode()) for name in NAMES}
        with env.begin(write=True) as txn:
            yield txn, dbs
    finally:
        env.close()


def verify(data: Path) -> tuple[int, list[str]]:
    result = ckpt("verify", "--data-dir", str(data))
    err = result.stderr.decode()
    assert "Traceback" not in err, err
    return result.returncode, [line for line in err.splitlines() if line.startswith("FAIL ")]


def got(txn: lmdb.Transaction, key: bytes, db: lmdb._Database) -> bytes:
    value = txn.get(key, db=db)
    assert value is not None, key
    return bytes(value)


def frame_key(sid: bytes, version: int) -> bytes:
    return sid + b"\0" + struct.pack(">Q", version)


def edit_session(
    txn: lmdb.Transaction, dbs: Tables, sid: bytes, change: Callable[[records_pb2.SessionRecord], None]
) -> None:
    rec = records_pb2.SessionRecord.FromString(got(txn, sid, db=dbs["sessions"]))
    change(rec)
    txn.put(sid, rec.SerializeToString(), db=dbs["sessions"])


def edit_log(
    txn: lmdb.Transaction, dbs: Tables, sid: bytes, change: Callable[[records_pb2.EventLogRecord], None]
) -> None:
    log = records_pb2.EventLogRecord.FromString(got(txn, sid, db=dbs["event_logs"]))
    change(log)
    txn.put(sid, log.SerializeToString(), db=dbs["event_logs"])


def test_a_store_with_deletes_forks_retention_and_events_verifies_clean(pristine: Path) -> None:
    result = ckpt("verify", "--data-dir", str(pristine))
    assert (result.returncode, result.stderr) == (0, b""), result.stderr.decode()
    with tables(pristine) as (txn, dbs):  # what the checks are about is in the store
        pruned = records_pb2.SessionRecord.FromString(got(txn, b"pruned", db=dbs["sessions"]))
        assert pruned.first_version > 1
        agent = records_pb2.SessionRecord.FromString(got(txn, b"agent", db=dbs["sessions"]))
        earlier = records_pb2.RequestRecord.FromString(got(txn, request_key(b"agent", "agent:1"), db=dbs["requests"]))
        assert 0 < earlier.session_created_unix_nanos < agent.created_unix_nanos
        log = records_pb2.EventLogRecord.FromString(got(txn, b"log", db=dbs["event_logs"]))
        assert log.open_block_seq == 257 and log.next_seq == 302


def test_a_session_created_earlier_than_its_request_records_say_fails(data: Path) -> None:
    """A retry of an acknowledged write found its record naming another session, and wrote again."""
    with tables(data) as (txn, dbs):
        edit_session(txn, dbs, b"agent", lambda r: setattr(r, "created_unix_nanos", r.created_unix_nanos - (1 << 40)))
    code, lines = verify(data)
    assert code == 1
    assert any(
        line.startswith("FAIL session 'agent': requests table: the record of request_id 'agent:9' (version 1) names a")
        and "after the session's record says it was" in line
        for line in lines
    ), lines
    assert any(line.startswith("FAIL session 'agent': the session record says it was created at ") for line in lines)


def test_a_request_record_naming_a_later_session_fails_after_retention(data: Path) -> None:
    """Version 1 is gone (first_version > 1): the request records still tell a creation time gone back."""
    with tables(data) as (txn, dbs):
        edit_session(txn, dbs, b"pruned", lambda r: setattr(r, "created_unix_nanos", r.created_unix_nanos - 1))
    code, lines = verify(data)
    assert code == 1
    requests = [line for line in lines if line.startswith("FAIL session 'pruned': requests table: ")]
    assert len(requests) == 5 and all("names a session created at" in line for line in requests), lines


def test_a_request_record_whose_session_time_went_up_fails(data: Path) -> None:
    """One bit set in its session_created_unix_nanos: it names no session any more, as an earlier holder's."""
    with tables(data) as (txn, dbs):
        key = request_key(b"typed", "t:1")
        done = records_pb2.RequestRecord.FromString(got(txn, key, db=dbs["requests"]))
        bit = next(1 << n for n in range(8, 64) if not done.session_created_unix_nanos & 1 << n)
        done.session_created_unix_nanos |= bit
        txn.put(key, done.SerializeToString(), db=dbs["requests"])
    code, lines = verify(data)
    assert code == 1
    assert len(lines) == 1 and lines[0].startswith(
        "FAIL session 'typed': requests table: the record of request_id 't:1' (version 1) names a session created at"
    ), lines


def test_an_event_log_created_earlier_than_its_append_records_say_fails(data: Path) -> None:
    with tables(data) as (txn, dbs):
        edit_log(txn, dbs, b"log", lambda log: setattr(log, "created_unix_nanos", log.created_unix_nanos - (1 << 40)))
    code, lines = verify(data)
    assert code == 1
    assert any(
        line.startswith("FAIL session 'log': requests table: the record of request_id 'log:1' names an event log")
        and "a retry of that append would be written again" in line
        for line in lines
    ), lines


def test_an_append_record_naming_a_later_log_fails(data: Path) -> None:
    with tables(data) as (txn, dbs):
        key = request_key(b"both", "both:1")
        done = records_pb2.RequestRecord.FromString(got(txn, key, db=dbs["requests"]))
        done.events_log_created_unix_nanos += 1
        txn.put(key, done.SerializeToString(), db=dbs["requests"])
    code, lines = verify(data)
    assert code == 1
    assert any(
        line.startswith("FAIL session 'both': requests table: the record of request_id 'both:1'") for line in lines
    )


def test_two_sessions_frames_swapped_fail_both(data: Path) -> None:
    """Get served the other session's state: the frames' write times are not their records'."""
    with tables(data) as (txn, dbs):
        a, b = frame_key(b"typed", 1), frame_key(b"both", 1)
        va, vb = got(txn, a, db=dbs["frames"]), got(txn, b, db=dbs["frames"])
        txn.put(a, vb, db=dbs["frames"])
        txn.put(b, va, db=dbs["frames"])
    code, lines = verify(data)
    assert code == 1
    for session in ("typed", "both"):
        assert any(
            line.startswith(f"FAIL session '{session}': the session record says it was created at ") for line in lines
        )
        assert any(
            line.startswith(f"FAIL session '{session}': the session record says it was updated at ")
            and "but its head (version 1) was written at" in line
            for line in lines
        ), lines


def test_a_head_written_at_another_time_than_the_record_says_fails(data: Path) -> None:
    with tables(data) as (txn, dbs):
        edit_session(txn, dbs, b"pruned", lambda r: setattr(r, "updated_unix_nanos", r.updated_unix_nanos + 1))
    code, lines = verify(data)
    assert code == 1
    assert any(
        line.startswith("FAIL session 'pruned': the session record says it was updated at ")
        and "but its head (version 5) was written at" in line
        for line in lines
    ), lines


@pytest.mark.parametrize(
    ("key", "value", "line"),
    [
        (b"types_generation", b"zz", "types_generation b'zz' is not a number: typed writes and registrations fail"),
        (b"last_write_unix_nanos", b"-1", "last_write_unix_nanos b'-1' is not a number: it is taken as 0"),
        (b"last_sweep_unix_nanos", b"soon", "last_sweep_unix_nanos b'soon' is not a number"),
        (b"keyframed_before_unix_nanos", b"", "keyframed_before_unix_nanos b'' is not a number"),
        (b"layout_version", b"0", "layout_version b'0' is not a store layout (1-9)"),
        (b"types_field_history", b"\xff\xff", "types_field_history (2 bytes) does not parse as a FieldHistory"),
    ],
)
def test_a_meta_value_the_store_cannot_read_fails(data: Path, key: bytes, value: bytes, line: str) -> None:
    with tables(data) as (txn, dbs):
        txn.put(key, value, db=dbs["meta"])
    code, lines = verify(data)
    assert code == 1
    assert len(lines) == 1 and lines[0].startswith(f"FAIL meta table: {line}"), lines


def test_a_meta_types_generation_that_fails_typed_writes_fails_verify(data: Path) -> None:
    with tables(data) as (txn, dbs):
        txn.put(b"types_generation", b"zz", db=dbs["meta"])
    code, lines = verify(data)
    assert code == 1
    assert lines == [
        "FAIL meta table: types_generation b'zz' is not a number: typed writes and registrations fail (DataLoss)"
    ]


def test_an_event_log_naming_the_wrong_open_block_fails(data: Path) -> None:
    """Every later append failed DataLoss (the open event block is missing)."""
    with tables(data) as (txn, dbs):
        edit_log(txn, dbs, b"log", lambda log: setattr(log, "open_block_seq", 256))
    code, lines = verify(data)
    assert code == 1
    assert lines == [
        "FAIL session 'log': events table: event seq 256: the event log record says the open block begins at seq"
        " 256, but the last block begins at seq 257: every append to the log fails"
    ]


def test_an_event_log_naming_no_open_block_while_one_is_open_fails(data: Path) -> None:
    with tables(data) as (txn, dbs):
        edit_log(txn, dbs, b"log", lambda log: setattr(log, "open_block_seq", 0))
    code, lines = verify(data)
    assert code == 1
    assert lines == [
        "FAIL session 'log': events table: event seq 257: the last event block is open, but the event log record"
        " names no open block: the next append would start a block beside it"
    ]


def test_an_event_log_miscounting_its_events_fails(data: Path) -> None:
    with tables(data) as (txn, dbs):
        edit_log(txn, dbs, b"log", lambda log: setattr(log, "event_count", 300))
    code, lines = verify(data)
    assert code == 1
    assert lines == [
        "FAIL session 'log': events table: event seq 1: the event log record counts 300 events, but its seqs 1 to"
        " 301 are 301"
    ]
