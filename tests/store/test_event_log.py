"""A session's event log in the store, on real LMDB directories: appends, reads, limits, lifecycle, damage."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest
import xxhash

from ckpt.codec._zstd import ZstdDecompressor
from ckpt.sidecar import (
    AlreadyExists,
    AppendResult,
    DataLoss,
    EventQuery,
    EventSeqConflict,
    FailedPrecondition,
    InvalidArgument,
    NewEvent,
    NotFound,
    PutRequest,
    Retention,
    StateTooLarge,
    Store,
    StoreConfig,
    VersionConflict,
    WriteMode,
)
from ckpt.sidecar.ids import session_key
from ckpt.sidecar.store.eventblocks import block_key
from ckpt.sidecar.store.events import SEAL_EVENTS
from ckpt.sidecar.tools.crosscheck import CrossCheck
from tests.support import AGENT_STATE, agent_file, ckpt, descriptor_set_of

SECOND = 1_000_000_000


@pytest.fixture
def config(tmp_path: Path) -> StoreConfig:
    return StoreConfig(data_dir=tmp_path / "data", sweep_interval_seconds=3600)


@pytest.fixture
def store(config: StoreConfig) -> Iterator[Store]:
    with Store(config) as s:
        yield s


def every(store: Store, session: str, **query: object) -> list[tuple[int, str, bytes]]:
    """Every event a read gives, following its pages: (seq, type, payload)."""
    out: list[tuple[int, str, bytes]] = []
    token = ""
    while True:
        page = store.read_events(session, EventQuery(page_token=token, **query))  # type: ignore[arg-type]
        out += [(e.seq, e.type, e.payload) for e in page.events]
        token = page.next_page_token
        if not token:
            return out


def test_events_get_dense_seqs_across_blocks_and_read_back_both_ways(store: Store) -> None:
    n = 3 * SEAL_EVENTS + 17
    for start in range(0, n, 100):  # appends of 100 fill, seal and begin blocks
        events = [NewEvent("step", b'{"i": %d}' % i, {"k": str(i % 3)}) for i in range(start, min(n, start + 100))]
        result = store.append_events("s", events)
        assert (result.first_seq, result.last_seq) == (start + 1, start + len(events))
    expected = [(i + 1, "step", b'{"i": %d}' % i) for i in range(n)]
    assert every(store, "s") == expected
    assert every(store, "s", newest_first=True, page_size=7) == expected[::-1]
    assert every(store, "s", after_seq=500, page_size=1000) == expected[500:]
    assert every(store, "s", after_seq=500, newest_first=True) == expected[500:][::-1]
    with store.read() as txn:
        assert store.tables.events is not None
        blocks = txn.count(store.tables.events)
    assert blocks == -(-n // SEAL_EVENTS)  # sealed at SEAL_EVENTS: the small events never reach the byte bound
    # The last 50 of a long log: one page, newest first.
    page = store.read_events("s", EventQuery(newest_first=True, page_size=50))
    assert [e.seq for e in page.events] == list(range(n, n - 50, -1)) and page.next_page_token


def test_an_append_with_a_put_commits_both_and_times_the_events_as_the_version(store: Store) -> None:
    result = store.append_events(
        "s", [NewEvent("tool_call"), NewEvent("note", time_unix_nanos=5 * SECOND)], put=PutRequest("", b"\x08\x01")
    )
    assert result.put is not None and result.put.version == 1 and (result.first_seq, result.last_seq) == (1, 2)
    info = store.list_versions("s")[0][0]
    events = store.read_events("s").events
    assert events[0].time.ToNanoseconds() == info.created_unix_nanos  # the commit's time, the version's
    assert events[1].time.ToNanoseconds() == 5 * SECOND  # given: kept
    assert store.get("s").state == b"\x08\x01"


def _log_record(store: Store, session: str) -> bytes:
    with store.read() as txn:
        raw = txn.get(session_key(session), db=store.tables.event_logs)
        assert raw is not None
        return bytes(raw)


def test_an_append_tells_where_the_log_ends_whether_or_not_it_appended(store: Store) -> None:
    # A put with no events learns the log's last seq without appending an event to learn it.
    alone = store.append_events("s", (), put=PutRequest("", b"\x08\x01"))
    assert (alone.first_seq, alone.last_seq, alone.log_last_seq) == (0, 0, 0)
    appended = store.append_events("s", [NewEvent("a"), NewEvent("b")])
    assert (appended.first_seq, appended.last_seq, appended.log_last_seq) == (1, 2, 2)
    log_before = _log_record(store, "s")
    put = store.append_events("s", (), put=PutRequest("", b"\x08\x02", expected_version=1), request_id="p")
    assert (put.first_seq, put.last_seq, put.log_last_seq) == (0, 0, 2) and put.put is not None
    assert _log_record(store, "s") == log_before  # nothing appended: the log's record is not rewritten
    assert [seq for seq, _, _ in every(store, "s")] == [1, 2]  # the puts appended nothing
    store.append_events("s", [NewEvent("c")])
    # A retry answers the first call's seqs, and where the log ends now.
    again = store.append_events("s", (), put=PutRequest("", b"\x08\x02", expected_version=1), request_id="p")
    assert again.replayed and (again.first_seq, again.last_seq, again.log_last_seq) == (0, 0, 3)


def test_a_version_conflict_on_the_put_appends_nothing(store: Store) -> None:
    store.append_events("s", [NewEvent("a")], put=PutRequest("s", b"\x08\x01"))
    with pytest.raises(VersionConflict, match="expected_version 5 but the head is version 1"):
        store.append_events("s", [NewEvent("b")], put=PutRequest("", b"\x08\x02", expected_version=5))
    assert every(store, "s") == [(1, "a", b"")] and store.get("s").version == 1
    merged = store.append_events(
        "s", [NewEvent("c")], put=PutRequest("", b"\x10\x02", mode=WriteMode.MERGE, expected_version=1)
    )
    assert merged.first_seq == 2 and merged.put is not None and merged.put.version == 2
    with pytest.raises(InvalidArgument, match=r"put\.session_id 'other' is not the session appended to"):
        store.append_events("s", [NewEvent("d")], put=PutRequest("other", b""))


@pytest.mark.parametrize(
    ("put", "error", "message"),
    [
        (
            PutRequest("", b"\x08\x01", labels={"": "v"}),
            InvalidArgument,
            r"^put\.labels key '' is 0 bytes; it must be 1-63",
        ),
        (
            PutRequest("", b"\x08\x01", mode=WriteMode.FORK),
            InvalidArgument,
            r"^put\.mode must be REPLACE \(1\) or MERGE",
        ),
        (PutRequest("", b"\xff\xff", mode=WriteMode.MERGE), InvalidArgument, r"^put\.state is not a valid MERGE patch"),
        (
            PutRequest("", b"x" * 4097),
            StateTooLarge,
            r"^put\.state is 4097 bytes; the limit \(max_state_bytes\) is 4096",
        ),
        (
            PutRequest("", b"", message_type="no.Such"),
            FailedPrecondition,
            r"^put\.message_type 'no\.Such' is not registered",
        ),
        (PutRequest("", b"", message_type="no such"), InvalidArgument, r"^put\.message_type 'no such' is not"),
    ],
)
def test_a_bad_put_in_an_append_is_refused_naming_its_field_as_put_dot(
    tmp_path: Path, put: PutRequest, error: type[Exception], message: str
) -> None:
    with Store(StoreConfig(data_dir=tmp_path / "data", max_state_bytes=4096)) as store:
        with pytest.raises(error, match=message):
            store.append_events("s", [NewEvent("a")], put=put)
        with pytest.raises(NotFound):
            store.read_events("s")


def test_a_put_in_an_append_that_its_typed_session_refuses_names_put_state(tmp_path: Path) -> None:
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        store.register_types(descriptor_set_of(agent_file()))
        store.put("s", b"\x08\x01", message_type=AGENT_STATE)
        # Checked against the session's type inside the write, and a large patch off the event loop: both named so.
        with pytest.raises(InvalidArgument, match=r"^put\.state \(6 bytes\) does not parse as acme\.agent\.v1\.State"):
            store.append_events("s", [NewEvent("a")], put=PutRequest("", b"\x18\x01\x12\x05ab"))
        big_bad_patch = b"\x08\x01" * 10_000 + b"\xff"
        with pytest.raises(InvalidArgument, match=r"^put\.state is not a valid MERGE patch"):
            asyncio.run(_aappend(store, PutRequest("", big_bad_patch, mode=WriteMode.MERGE)))
        assert every(store, "s") == [] and store.get("s").version == 1


async def _aappend(store: Store, put: PutRequest) -> AppendResult:
    return await store.aappend_events("s", [NewEvent("a")], put=put)


def test_an_expected_last_seq_appends_only_onto_that_seq(store: Store) -> None:
    assert store.append_events("s", [NewEvent("a")], expected_last_seq=0).first_seq == 1  # a new log
    with pytest.raises(EventSeqConflict, match="expected_last_seq 0 but the event log's last seq is 1") as caught:
        store.append_events("s", [NewEvent("b")], put=PutRequest("", b"\x08\x01"), expected_last_seq=0)
    assert caught.value.last_seq == 1
    assert every(store, "s") == [(1, "a", b"")]  # neither the events nor the put
    with pytest.raises(NotFound):
        store.get("s")
    done = store.append_events(
        "s", [NewEvent("b")], put=PutRequest("", b"\x08\x01"), expected_last_seq=1, request_id="r"
    )
    assert (done.first_seq, done.last_seq) == (2, 2) and done.put is not None and done.put.version == 1
    # A retry of a conditional append that landed is answered, not refused: the log moved on because of it.
    again = store.append_events(
        "s", [NewEvent("b")], put=PutRequest("", b"\x08\x01"), expected_last_seq=1, request_id="r"
    )
    assert again.replayed and again.first_seq == 2
    with pytest.raises(InvalidArgument, match="request_id 'r' was used for a different write"):
        store.append_events("s", [NewEvent("b")], put=PutRequest("", b"\x08\x01"), expected_last_seq=5, request_id="r")
    with pytest.raises(InvalidArgument, match="expected_last_seq must be an int >= 0, not -1"):
        store.append_events("s", [NewEvent("c")], expected_last_seq=-1)
    assert store.append_events("s", [NewEvent("c")], expected_last_seq=2).first_seq == 3


def test_a_request_id_makes_a_retry_append_nothing_twice(store: Store) -> None:
    first = store.append_events("s", [NewEvent("a"), NewEvent("b")], put=PutRequest("", b"\x08\x01"), request_id="r")
    store.append_events("s", [NewEvent("c")])
    again = store.append_events("s", [NewEvent("a"), NewEvent("b")], put=PutRequest("", b"\x08\x01"), request_id="r")
    assert again.replayed and (again.first_seq, again.last_seq) == (first.first_seq, first.last_seq)
    assert again.put is not None and again.put.replayed and again.put.version == 1
    assert [seq for seq, _, _ in every(store, "s")] == [1, 2, 3] and store.get("s").version == 1
    with pytest.raises(InvalidArgument, match="request_id 'r' was used for a different write to session 's'"):
        store.append_events("s", [NewEvent("other")], request_id="r")
    with pytest.raises(InvalidArgument, match="request_id 'r' was used for a different write"):
        store.put("s", b"\x08\x09", request_id="r")  # a Put reusing an append's id
    alone = store.append_events("t", [NewEvent("x")], request_id="q")
    assert store.append_events("t", [NewEvent("x")], request_id="q") == type(alone)(1, 1, None, True, 1)
    # Deleted and begun again: the id names the old log, so the same request appends anew.
    store.delete_session("t")
    assert not store.append_events("t", [NewEvent("x")], request_id="q").replayed


def test_a_put_reusing_an_appends_request_id_on_a_session_of_events_alone_is_refused(store: Store) -> None:
    store.append_events("e", [NewEvent("a"), NewEvent("b")], request_id="r")
    refused = r"request_id 'r' was used for a different write to session 'e' \(it appended events seq 1\.\.2\)"
    with pytest.raises(InvalidArgument, match=refused):
        store.put("e", b"\x08\x01", request_id="r")
    with pytest.raises(NotFound):
        store.get("e")  # the put made nothing
    # The record stands: the append's retry is answered, not refused or appended again.
    again = store.append_events("e", [NewEvent("a"), NewEvent("b")], request_id="r")
    assert again.replayed and (again.first_seq, again.last_seq) == (1, 2)
    # Once the session has versions too, the same id is refused the same way.
    store.put("e", b"\x08\x02")
    with pytest.raises(InvalidArgument, match=refused):
        store.put("e", b"\x08\x03", request_id="r")
    both = store.append_events("p", [NewEvent("a")], put=PutRequest("", b"\x08\x01"), request_id="q")
    assert both.put is not None and both.put.version == 1
    with pytest.raises(InvalidArgument, match=r"\(it appended events seq 1\.\.1 and made version 1\)"):
        store.put("p", b"\x08\x02", request_id="q")
    # A record of a deleted, earlier holder of the id answers nothing: the put is made, and its record replaces it.
    store.delete_session("e")
    made = store.put("e", b"\x08\x04", request_id="r")
    assert not made.replayed and made.version == 1
    assert store.put("e", b"\x08\x04", request_id="r").replayed
    assert [seq for seq, _, _ in every(store, "p")] == [1] and store.get("p").version == 1


@pytest.mark.parametrize(
    ("event", "message"),
    [
        (NewEvent(""), r"events\[1\].type is 0 bytes; it must be 1-128 bytes of UTF-8"),
        (NewEvent("t" * 129), r"events\[1\].type is 129 bytes; it must be 1-128"),
        (NewEvent("a\nb"), r"events\[1\].type 'a\\nb' contains an ASCII control character"),
        (NewEvent("\ud800"), r"events\[1\].type '\\ud800' is not valid UTF-8"),
        (NewEvent("t", attributes={"": "v"}), r"events\[1\].attributes key '' is 0 bytes; it must be 1-63"),
        (
            NewEvent("t", attributes={"k": "v" * 129}),
            r"events\[1\].attributes\['k'\] value is 129 bytes; the limit is 128",
        ),
        (NewEvent("t", time_unix_nanos=-1), r"events\[1\].time must be a time from 1970"),
    ],
)
def test_a_bad_event_is_refused_naming_it_and_nothing_is_appended(store: Store, event: NewEvent, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        store.append_events("s", [NewEvent("fine"), event])
    with pytest.raises(NotFound):
        store.read_events("s")


def test_the_limits_of_an_append(config: StoreConfig, tmp_path: Path) -> None:
    with Store(config) as store:
        with pytest.raises(InvalidArgument, match="events has 1001 entries; the limit is 1000 events per append"):
            store.append_events("s", [NewEvent("t")] * 1001)
        assert store.append_events("s", [NewEvent("t")] * 1000).last_seq == 1000
        with pytest.raises(InvalidArgument, match="events is empty and there is no put"):
            store.append_events("s", [])
    small = StoreConfig(data_dir=tmp_path / "small", max_state_bytes=1000, sweep_interval_seconds=3600)
    with (
        Store(small) as store,
        pytest.raises(StateTooLarge, match=r"by events\[1\]; the limit \(max_state_bytes\) is 1000 bytes"),
    ):
        store.append_events("s", [NewEvent("t", b"x" * 600), NewEvent("t", b"x" * 600)])


def test_reads_of_unknown_sessions_sessions_without_events_and_bad_queries(store: Store) -> None:
    with pytest.raises(NotFound, match=r"session 'nope' does not exist \(it has neither events nor versions\)"):
        store.read_events("nope")
    store.put("versions-only", b"")
    assert store.read_events("versions-only").events == []
    # No token was issued for a log it does not have: one is refused, as for a session with events.
    with pytest.raises(InvalidArgument, match="'not-a-token' is not a token this server issued"):
        store.read_events("versions-only", EventQuery(page_token="not-a-token"))
    store.append_events("s", [NewEvent("a"), NewEvent("b")])
    for query, message in [
        (EventQuery(page_size=1001), r"page_size must be in 0..1000"),
        (EventQuery(types=("",)), r"types\[0\] is 0 bytes"),
        (EventQuery(types=tuple(f"t{i}" for i in range(1001))), "types names 1001 event types; .* at most 1000$"),
        (EventQuery(after_unix_nanos=5, before_unix_nanos=4), "after .5 ns. is later than before .4 ns."),
        (EventQuery(page_token="garbage"), "is not a token this server issued"),
    ]:
        with pytest.raises(InvalidArgument, match=message):
            store.read_events("s", query)
    assert len(store.read_events("s", EventQuery(types=("a", *(f"t{i}" for i in range(999))))).events) == 1
    token = store.read_events("s", EventQuery(page_size=1)).next_page_token
    with pytest.raises(InvalidArgument, match="was issued for another listing"):
        store.read_events("s", EventQuery(page_size=1, types=("a",), page_token=token))


def test_type_and_time_filters(store: Store) -> None:
    store.append_events(
        "s", [NewEvent("tool" if i % 2 else "msg", b"%d" % i, time_unix_nanos=i * SECOND) for i in range(1, 11)]
    )
    assert [p for _, _, p in every(store, "s", types=("tool",))] == [b"1", b"3", b"5", b"7", b"9"]
    assert [p for _, _, p in every(store, "s", after_unix_nanos=3 * SECOND, before_unix_nanos=6 * SECOND)] == [
        b"4",
        b"5",
    ]
    assert every(store, "s", types=("msg", "other"), newest_first=True, after_seq=6) == [
        (10, "msg", b"10"),
        (8, "msg", b"8"),
    ]


def test_delete_removes_the_events_and_counts_them(store: Store) -> None:
    store.append_events("both", [NewEvent("a")] * 300, put=PutRequest("", b"\x08\x01"))
    store.append_events("events-only", [NewEvent("a")] * 3)
    assert store.delete_session_counts("both") == (1, 300)
    assert store.delete_session_counts("events-only") == (0, 3)
    for session in ("both", "events-only"):
        with pytest.raises(NotFound):
            store.read_events(session)
        with pytest.raises(NotFound, match="does not exist"):
            store.delete_session_counts(session)
    with store.read() as txn:
        assert store.tables.events is not None and txn.count(store.tables.events) == 0
    assert store.append_events("both", [NewEvent("again")]).first_seq == 1  # a new log


def test_a_fork_copies_the_log_only_when_asked(store: Store) -> None:
    store.append_events("s", [NewEvent("a", time_unix_nanos=SECOND)] * 300, put=PutRequest("", b"\x08\x01"))
    store.fork("s", 0, "plain")
    assert store.read_events("plain").events == []
    store.fork("s", 0, "copy", copy_events=True)
    assert every(store, "copy") == every(store, "s")
    assert store.append_events("copy", [NewEvent("b")]).first_seq == 301  # the copy goes on alone
    assert len(every(store, "s")) == 300
    store.append_events("taken", [NewEvent("x")])
    with pytest.raises(AlreadyExists, match=r"new_session_id 'taken' already exists \(it has an event log\)"):
        store.fork("s", 0, "taken")


def test_retention_keeps_the_newest_events_and_drops_old_ones_from_the_front(tmp_path: Path) -> None:
    retention = Retention(keep_last_events=100, max_event_age_seconds=10)
    config = StoreConfig(data_dir=tmp_path / "data", retention=retention, sweep_interval_seconds=3600)
    with Store(config) as store:
        store.append_events("count", [NewEvent("a", time_unix_nanos=100 * SECOND)] * 700)
        old = [NewEvent("old", time_unix_nanos=SECOND)] * 5
        store.append_events("age", [*old, NewEvent("new", time_unix_nanos=95 * SECOND), *old])
        result = store.sweep(now_nanos=100 * SECOND)
        assert result.events_removed == 600 + 5 and result.changed
        assert [seq for seq, _, _ in every(store, "count")] == list(range(601, 701))
        # Only the front goes: the old events after the first kept one stay, so seqs stay dense.
        assert [seq for seq, _, _ in every(store, "age")] == list(range(6, 12))
        assert store.append_events("count", [NewEvent("b")]).first_seq == 701
        assert store.sweep(now_nanos=100 * SECOND).events_removed == 1
    assert ckpt("verify", "--data-dir", str(config.data_dir)).returncode == 0


def _damage(data: Path, session: bytes, first_seq: int, change: object) -> None:
    env = lmdb.open(str(data / "lmdb"), max_dbs=16)
    with env.begin(write=True) as txn:
        db = env.open_db(b"events", txn=txn)
        key = block_key(session, first_seq)
        found = txn.get(key, db=db)
        assert found is not None
        value = bytearray(found)
        txn.put(key, bytes(change(value)), db=db)  # type: ignore[operator]
    env.close()


def _flip(at: int) -> object:
    def change(value: bytearray) -> bytearray:
        value[at % len(value)] ^= 0x10
        return value

    return change


@pytest.mark.parametrize(
    "change",
    [_flip(0), _flip(10), _flip(40), _flip(-20), _flip(-1), lambda v: v[:-3], lambda v: v[:20], lambda v: b""],
    ids=["magic", "header-seq", "body", "body-end", "checksum", "cut-end", "cut-header", "emptied"],
)
def test_a_damaged_event_block_is_data_loss_naming_the_session_and_seq(config: StoreConfig, change: object) -> None:
    with Store(config) as store:
        store.append_events("s", [NewEvent("a", b"payload %d" % i) for i in range(SEAL_EVENTS + 10)])
    _damage(config.data_dir, b"s", 1, change)
    with Store(config) as store:
        with pytest.raises(DataLoss, match="session 's' event seq 1: "):
            every(store, "s")
        assert every(store, "s", after_seq=SEAL_EVENTS)[0][0] == SEAL_EVENTS + 1  # the block after it reads
        with store.read() as txn:
            problems = list(CrossCheck(store, txn, None).run("events"))
        assert [(p.table, p.session) for p in problems] == [("events", b"s")]
        assert problems[0].text.startswith("event seq 1: ")
    verify = ckpt("verify", "--data-dir", str(config.data_dir))
    assert verify.returncode == 1
    assert "FAIL session 's': events table: event seq 1: " in verify.stderr.decode()


def test_a_missing_block_is_reported_as_the_seqs_it_held(config: StoreConfig) -> None:
    with Store(config) as store:
        store.append_events("s", [NewEvent("a")] * (2 * SEAL_EVENTS + 1))
    env = lmdb.open(str(config.data_dir / "lmdb"), max_dbs=16)
    with env.begin(write=True) as txn:
        txn.delete(block_key(b"s", SEAL_EVENTS + 1), db=env.open_db(b"events", txn=txn))
    env.close()
    verify = ckpt("verify", "--data-dir", str(config.data_dir))
    assert verify.returncode == 1
    assert (
        f"event seq {SEAL_EVENTS + 1}: events {SEAL_EVENTS + 1}-{2 * SEAL_EVENTS} are missing" in verify.stderr.decode()
    )


def test_the_block_header_is_little_endian_with_its_first_seq(config: StoreConfig) -> None:
    """docs/storage.md documents the block's bytes: a reader in another language depends on them."""
    with Store(config) as store:
        store.append_events("s", [NewEvent("a", time_unix_nanos=7), NewEvent("b", time_unix_nanos=9)])
        store.append_events("s", [NewEvent("c", b"x", time_unix_nanos=8)])
        store.append_events("sealed", [NewEvent("a", time_unix_nanos=5)] * SEAL_EVENTS)
        with store.read() as txn:
            assert store.tables.events is not None
            block = txn.get(block_key(b"s", 1), db=store.tables.events)
            tail = txn.get(block_key(b"s", 3), db=store.tables.events)
            sealed = txn.get(block_key(b"sealed", 1), db=store.tables.events)
    assert block is not None and tail is not None and sealed is not None
    # "EV", format 2, flags 1 (frame open), first seq 1, 2 events, 22 bytes of body, times 7 and 9.
    assert block[:36] == bytes.fromhex("455602010100000000000000020000001600000007000000000000000900000000000000")
    magic, fmt, flags, first, count, _raw, low, high = struct.unpack_from("<2sBBQIIQQ", block)
    assert (magic, fmt, flags, first, count, low, high) == (b"EV", 2, 1, 1, 2, 7, 9)
    # The tail: flags 3 (frame open, tail), its own seqs and times, then the XXH3-64 its block ends with.
    assert tail[:36] == bytes.fromhex("455602030300000000000000010000000e00000008000000000000000800000000000000")
    assert tail[36:44] == block[-8:]
    assert xxhash.xxh3_64_intdigest(tail[:-8]).to_bytes(8, "little") == tail[-8:]
    # A sealed block: flags 0, one ended zstd frame between the header and the checksum.
    assert struct.unpack_from("<2sBBQI", sealed) == (b"EV", 2, 0, 1, SEAL_EVENTS)
    decompressor = ZstdDecompressor()
    body = decompressor.decompress(sealed[36:-8])
    assert decompressor.eof and len(body) == struct.unpack_from("<I", sealed, 16)[0]
