"""The LMDB store, on real LMDB directories."""

from __future__ import annotations

import base64
import hashlib
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import lmdb
import pytest

from ckpt.codec import ChainEncoder, ChainPolicy, FrameKind
from ckpt.sidecar import (
    AlreadyExists,
    DataLoss,
    EventQuery,
    InvalidArgument,
    NewEvent,
    NotFound,
    PutRequest,
    ResourceExhausted,
    Retention,
    Store,
    StoreConfig,
    StoreFull,
    Unavailable,
    VersionConflict,
    WriteMode,
)
from ckpt.sidecar.store.cache import LRU
from ckpt.sidecar.store.requestids import RequestIds
from ckpt.v1 import checkpoint_pb2 as pb
from tests.store.support import CHAINS as CHAINS  # re-exported: other test folders import them from here
from tests.store.support import patch_of as patch_of
from tests.store.support import put_later, wait_queued, writer_held
from tests.store.support import state_of as state_of


@pytest.fixture
def config(tmp_path: Path) -> StoreConfig:
    return StoreConfig(data_dir=tmp_path / "data", chain_policy=CHAINS, sweep_interval_seconds=3600)


@pytest.fixture
def store(config: StoreConfig) -> Iterator[Store]:
    with Store(config) as s:
        yield s


def test_replace_and_merge_round_trip_at_every_version_hot_and_cold(config: StoreConfig) -> None:
    expected: dict[int, bytes] = {}
    with Store(config) as store:
        merged = b""
        for v in range(1, 31):
            if v % 3:
                data = state_of("s", v)
                r = store.put("s", data)
                merged = data
            else:
                data = patch_of(v)
                r = store.put("s", data, mode=WriteMode.MERGE)
                merged += data
            assert r.version == v and r.state_size == len(merged)
            expected[v] = merged
            assert store.get("s").state == merged  # hot
        kinds = {i.frame_kind for i in store.list_versions("s", page_size=100)[0]}
        assert kinds == {FrameKind.FULL, FrameKind.DELTA, FrameKind.PATCH}
    with Store(config) as store:  # cold: a new process would see the same
        for v, want in expected.items():
            got = store.get("s", v)
            assert (got.version, got.state) == (v, want)
        assert store.get("s").version == 30


# Ids whose frame keys sit side by side: "a" ends where "a " (0x20 after it) begins, "`" sorts just
# before "a", and "é" (UTF-8 0xC3 0xA9) after every ASCII id; the first and last ids hold the table's ends.
NEIGHBOURS = ("`", "a", "a ", "a!", "aa", "b", "é")


def test_cold_reads_find_each_session_among_neighbouring_ids(config: StoreConfig) -> None:
    """A cold read finds a session's head from the frames table alone (the last key before the session's
    range ends); each read must land in its own session's range, including at the table's first and last key."""
    written = {sid: 2 + n % 3 for n, sid in enumerate(NEIGHBOURS[1:-1], start=1)}  # "`" and "é" stay unwritten
    with Store(config) as store:
        for sid, versions in written.items():
            for v in range(1, versions + 1):
                store.put(sid, state_of(sid, v))
    with Store(replace(config, cache_size_bytes=0)) as store:
        for sid, versions in written.items():
            got = store.get(sid)
            assert (got.version, got.state, got.info.version) == (versions, state_of(sid, versions), versions)
            for v in range(1, versions + 1):
                assert store.get(sid, v).state == state_of(sid, v)
            with pytest.raises(
                NotFound, match=re.escape(f"session {sid!r} has no version {versions + 1}; the head is")
            ):
                store.get(sid, versions + 1)
        for sid in ("`", "é", "a\u00a0", "ab"):  # before the first, after the last, between two
            with pytest.raises(NotFound, match=re.escape(f"session {sid!r} does not exist")):
                store.get(sid)
            with pytest.raises(NotFound, match=re.escape(f"session {sid!r} does not exist")):
                store.get(sid, 1)
        store.delete_session("b")  # now "aa" holds the table's last key
        assert store.get("aa").state == state_of("aa", written["aa"])
        with pytest.raises(NotFound, match="session 'b' does not exist"):
            store.get("b")


def test_compare_and_set_under_many_threads_never_forks(store: Store) -> None:
    store.put("cas", state_of("cas", 1))
    wins: list[tuple[int, int]] = []
    conflicts = 0
    lock = threading.Lock()

    def worker(n: int) -> None:
        nonlocal conflicts
        for _ in range(25):
            head = store.get("cas").version
            try:
                r = store.put("cas", state_of(f"w{n}", head + 1), expected_version=head)
            except VersionConflict as exc:
                assert exc.current_version > head
                with lock:
                    conflicts += 1
                continue
            with lock:
                wins.append((head, r.version))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert conflicts > 0  # the threads really raced
    expected_heads = [h for h, _ in wins]
    assert len(expected_heads) == len(set(expected_heads)), "two writers succeeded against the same head"
    assert all(v == h + 1 for h, v in wins)
    head = store.get("cas").version
    assert head == 1 + len(wins)
    for v in range(1, head + 1):
        store.get("cas", v)  # every version decodes


def test_expected_version_zero_means_create_only(store: Store) -> None:
    store.put("new", b"\x08\x01", expected_version=0)
    with pytest.raises(VersionConflict, match="expected_version 0 but the head is version 1"):
        store.put("new", b"\x08\x02", expected_version=0)


def test_a_conflict_on_a_session_without_versions_says_so(store: Store) -> None:
    with pytest.raises(VersionConflict) as info:
        store.put("absent", b"\x08\x01", expected_version=3)
    assert (
        str(info.value)
        == "session 'absent': expected_version 3 but the session has no versions (the head is version 0)"
    )
    assert info.value.current_version == 0
    store.put("gone", b"\x08\x01")
    store.delete_session("gone")
    with pytest.raises(VersionConflict, match="'gone': expected_version 1 but the session has no versions"):
        store.put("gone", b"\x08\x02", expected_version=1)


@pytest.mark.parametrize("request_id", ["", "rid"])
@pytest.mark.parametrize(
    ("expected", "error", "message"),
    [
        (-1, InvalidArgument, "expected_version must be in 0..2**64-1 (a uint64), got -1"),
        (2**64, InvalidArgument, f"expected_version must be in 0..2**64-1 (a uint64), got {2**64}"),
        (2**63, VersionConflict, f"expected_version {2**63} but the head is version 1"),
        (2**64 - 1, VersionConflict, f"expected_version {2**64 - 1} but the head is version 1"),
    ],
)
def test_expected_version_is_a_uint64(
    store: Store, request_id: str, expected: int, error: type[Exception], message: str
) -> None:
    store.put(f"ev{expected}{request_id}", b"\x08\x01")
    with pytest.raises(error) as info:
        store.put(f"ev{expected}{request_id}", b"\x08\x02", expected_version=expected, request_id=request_id)
    assert message in str(info.value)
    assert store.get(f"ev{expected}{request_id}").version == 1


def test_request_id_retries_are_idempotent(store: Store) -> None:
    first = store.put("r", state_of("r", 1), request_id="req-1")
    again = store.put("r", state_of("r", 1), request_id="req-1")  # a retry after a lost reply: the same write
    assert again.replayed and not first.replayed
    assert (again.version, again.stored_bytes, again.frame_kind) == (
        first.version,
        first.stored_bytes,
        first.frame_kind,
    )
    assert store.session("r").version_count == 1
    assert store.get("r").state == state_of("r", 1)
    # the same id on another session is another request
    assert store.put("other", state_of("o", 1), request_id="req-1").replayed is False


def test_request_ids_expire(config: StoreConfig) -> None:
    with Store(replace(config, request_id_ttl_seconds=0.05)) as store:
        store.put("r", b"\x08\x01", request_id="x")
        time.sleep(0.1)
        assert store.sweep().request_ids_expired == 1
        assert store.put("r", b"\x08\x02", request_id="x").version == 2


def test_history_is_paged_newest_first(store: Store) -> None:
    for v in range(1, 251):
        store.put("h", b"\x08" + bytes([v % 128]), labels={"n": str(v)})
    seen, token, pages = [], "", 0
    while True:
        page, token = store.list_versions("h", page_size=100, page_token=token)
        pages += 1
        seen += [i.version for i in page]
        if not token:
            break
    assert pages == 3 and seen == list(range(250, 0, -1))
    info = store.list_versions("h", page_size=1)[0][0]
    assert (info.version, info.parent_version, info.labels, info.mode) == (250, 249, {"n": "250"}, WriteMode.REPLACE)
    with pytest.raises(InvalidArgument, match="page_token"):
        store.list_versions("h", page_token="not-a-token!")
    with pytest.raises(NotFound, match="'nope' does not exist"):
        store.list_versions("nope")


def test_a_page_token_resumes_only_the_listing_it_came_from(store: Store) -> None:
    """Tokens named only the resume point: another session's token made ListVersions skip the
    versions above it, and another filter's token made ListSessions start mid-way, each ending
    with an empty next token, so a cut-short listing looked complete."""
    for v in range(1, 11):
        store.put("A", b"\x08" + bytes([v]), labels={"team": "a"})
    for v in range(1, 5):
        store.put("B", b"\x08" + bytes([v]), labels={"team": "a", "aaa": "b"})
    token_b = store.list_versions("B", page_size=1)[1]
    token_a = store.list_versions("A", page_size=1)[1]
    assert [i.version for i in store.list_versions("A", page_token=token_a)[0]] == list(range(9, 0, -1))
    by_team = store.list_sessions(page_size=1, label_filter={"team": "a"})[1]
    by_time = store.list_sessions(page_size=1, updated_after_nanos=0)[1]
    assert [s.session_id for s in store.list_sessions(page_token=by_team, label_filter={"team": "a"})[0]] == ["B"]
    # A deleted and made again: its old token must not resume the new session's versions.
    store.delete_session("B")
    for v in range(1, 6):
        store.put("B", b"\x08" + bytes([v]))
    other = "was issued for another listing (another session, one deleted since under the same id, or other filters)"
    for listing in (
        lambda: store.list_versions("A", page_token=token_b),
        lambda: store.list_versions("B", page_token=token_b),
        lambda: store.list_sessions(page_token=by_team, label_filter={"aaa": "b"}),
        lambda: store.list_sessions(page_token=by_team, label_filter={"team": "a", "aaa": "b"}),
        lambda: store.list_sessions(page_token=by_time, updated_after_nanos=1),
        lambda: store.list_sessions(page_token=by_time, updated_after_nanos=0, updated_before_nanos=2**62),
    ):
        with pytest.raises(InvalidArgument, match=re.escape(other)):
            listing()
    for listing in (  # a token of another kind of listing
        lambda: store.list_sessions(page_token=token_a),
        lambda: store.list_versions("A", page_token=by_team),
        lambda: store.list_sessions(page_token=by_time),
    ):
        with pytest.raises(InvalidArgument, match="is not a token this server issued for this listing"):
            listing()


def _edited(token: str, resume: bytes) -> str:
    """``token`` with its resume key (what follows its kind, colon and 8-byte hash) replaced by ``resume``."""
    raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    head = raw[: raw.index(b":") + 9]
    return base64.urlsafe_b64encode(head + resume).decode().rstrip("=")


def test_a_page_token_edited_by_hand_is_refused(store: Store) -> None:
    """A token's hash covered its listing and not its resume key: one edited by hand was taken and resumed
    the listing elsewhere (events read again, or skipped)."""
    for v in range(1, 11):
        store.put("A", b"\x08" + bytes([v]))
    store.append_events("A", [NewEvent("note", bytes([i])) for i in range(10)])
    versions_token = store.list_versions("A", page_size=1)[1]
    events_token = store.read_events("A", EventQuery(page_size=5)).next_page_token
    assert [e.seq for e in store.read_events("A", EventQuery(page_size=5, page_token=events_token)).events] == [
        6, 7, 8, 9, 10,
    ]  # fmt: skip
    for listing in (
        lambda: store.list_versions("A", page_token=_edited(versions_token, b"3")),
        lambda: store.read_events("A", EventQuery(page_size=5, page_token=_edited(events_token, b"2"))),
    ):
        with pytest.raises(InvalidArgument, match="or altered; a listing resumes only with the tokens it returned"):
            listing()


def test_fork_from_an_old_version_and_delete(store: Store) -> None:
    for v in range(1, 12):
        store.put("src", state_of("src", v), labels={"team": "a"}, request_id=f"q{v}")
    info = store.fork("src", 4, "child", labels={"team": "b"})
    assert (info.head_version, info.forked_from_session_id, info.forked_from_version) == (1, "src", 4)
    got = store.get("child")
    assert got.state == state_of("src", 4) and got.info.frame_kind is FrameKind.FULL and got.info.parent_version == 0
    with pytest.raises(AlreadyExists):
        store.fork("src", 0, "child")
    with pytest.raises(NotFound, match="has no version 12"):
        store.fork("src", 12, "child2")

    assert store.delete_session("src") == 11
    with pytest.raises(NotFound):
        store.get("src")
    with pytest.raises(NotFound):
        store.delete_session("src")
    assert [s.session_id for s in store.list_sessions(label_filter={"team": "a"})[0]] == []
    assert [s.session_id for s in store.list_sessions()[0]] == ["child"]
    # a recreated session starts over: no stale frames, request ids or cache
    assert store.put("src", b"\x08\x07", request_id="q1").version == 1
    assert store.get("src").state == b"\x08\x07"


def test_list_sessions_filters_by_label_and_time(store: Store) -> None:
    for i in range(30):
        store.put(f"s{i:02d}", b"\x08\x01", labels={"tenant": "acme" if i % 3 == 0 else "other", "i": str(i)})
    mid = time.time_ns()
    for i in range(30, 40):
        store.put(f"s{i:02d}", b"\x08\x01", labels={"tenant": "acme"})
    got, token = [], ""
    while True:
        page, token = store.list_sessions(page_size=4, page_token=token, label_filter={"tenant": "acme"})
        assert len(page) <= 4
        got += [s.session_id for s in page]
        if not token:
            break
    assert got == [f"s{i:02d}" for i in range(40) if i % 3 == 0 or i >= 30]
    recent = store.list_sessions(page_size=100, updated_after_nanos=mid)[0]
    assert [s.session_id for s in recent] == [f"s{i:02d}" for i in range(30, 40)]
    both = store.list_sessions(label_filter={"tenant": "acme", "i": "3"}, updated_before_nanos=mid)[0]
    assert [s.session_id for s in both] == ["s03"]
    all_ids, token = [], ""
    while True:
        page, token = store.list_sessions(page_size=7, page_token=token)
        all_ids += [s.session_id for s in page]
        if not token:
            break
    assert all_ids == sorted(f"s{i:02d}" for i in range(40))


def _updated_index(store: Store) -> list[tuple[int, bytes]]:
    with store.read() as txn:
        return [(int.from_bytes(k[:8], "big"), k[8:]) for k in txn.scan_keys(store.tables.updated)]


def test_updated_index_moves_once_per_granule_and_listings_stay_exact(
    config: StoreConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    granule = 1 << 30
    clock = [100 * granule + 5]
    monkeypatch.setattr(time, "time_ns", lambda: clock[0])
    with Store(config) as store:
        store.put("a", b"\x08\x01")
        clock[0] += 1000  # same granule: the index entry stays where it is
        store.put("a", b"\x08\x02")
        updated = store.session("a").updated_unix_nanos
        assert updated == 100 * granule + 1005
        assert _updated_index(store) == [(100 * granule, b"a")]

        # Listings compare the exact time, not the rounded index key.
        def ids(after: int | None = None, before: int | None = None) -> list[str]:
            page = store.list_sessions(updated_after_nanos=after, updated_before_nanos=before)[0]
            return [s.session_id for s in page]

        assert ids(after=updated) == ["a"]
        assert ids(after=updated + 1) == []
        assert ids(before=updated) == []
        assert ids(before=updated + 1) == ["a"]
        clock[0] += granule  # next granule: the entry moves, the old one goes
        store.put("a", b"\x08\x03")
        assert _updated_index(store) == [(101 * granule, b"a")]
        assert ids(after=updated + 1) == ["a"]


def test_labels_merge_into_the_session(store: Store) -> None:
    store.put("l", b"\x08\x01", labels={"a": "1", "b": "1"})
    store.put("l", b"\x08\x02", labels={"b": "2"})
    assert store.session("l").labels == {"a": "1", "b": "2"}
    assert store.list_sessions(label_filter={"b": "1"})[0] == []
    assert [s.session_id for s in store.list_sessions(label_filter={"b": "2"})[0]] == ["l"]


def test_retention_keeps_whole_chains(config: StoreConfig) -> None:
    policy = ChainPolicy(frame_cost_bytes=0, max_depth=3)  # chains start at 1, 5, 9, ...
    cfg = replace(config, chain_policy=policy, retention=Retention(keep_last_versions=5))
    with Store(cfg) as store:
        for v in range(1, 19):
            store.put("k", state_of("k", v))
        kinds = {i.version: i.frame_kind for i in store.list_versions("k", page_size=100)[0]}
        assert [v for v, k in sorted(kinds.items()) if k is FrameKind.FULL] == [1, 5, 9, 13, 17]
        result = store.sweep()
        assert (result.sessions_pruned, result.versions_removed) == (1, 12)
        # keep-last-5 means versions 14..18; 14's chain starts at 13, so 13 stays too
        info = store.session("k")
        assert (info.first_version, info.version_count, info.head_version) == (13, 6, 18)
        for v in range(13, 19):
            assert store.get("k", v).state == state_of("k", v)
        with pytest.raises(NotFound, match="removed by retention; the oldest kept is version 13"):
            store.get("k", 12)
        assert info.stored_bytes == sum(i.stored_bytes for i in store.list_versions("k")[0])
        assert store.sweep().versions_removed == 0  # idempotent


def test_retention_by_age_never_removes_the_head(config: StoreConfig) -> None:
    cfg = replace(config, retention=Retention(max_version_age_seconds=60))
    with Store(cfg) as store:
        for v in range(1, 10):
            store.put("t", state_of("t", v))
        assert store.sweep().versions_removed == 0  # nothing is a minute old
        later = time.time_ns() + 3600 * 10**9
        store.sweep(now_nanos=later)
        info = store.session("t")
        assert info.head_version == 9 and info.first_version <= 9
        assert store.get("t").state == state_of("t", 9)


def test_the_map_grows_when_full(config: StoreConfig) -> None:
    cfg = replace(config, map_size_bytes=1 << 20, max_map_size_bytes=64 << 20)
    rnd = __import__("random").Random(1)
    blobs = {f"m{i}": rnd.randbytes(200_000) for i in range(20)}  # incompressible, 4 MB total
    with Store(cfg) as store:
        for sid, blob in blobs.items():
            store.put(sid, blob)
        assert store.stats()["map_resizes"] >= 2
    with Store(cfg) as store:
        for sid, blob in blobs.items():
            assert store.get(sid).state == blob


def test_a_full_map_fails_cleanly_and_keeps_serving(config: StoreConfig) -> None:
    cfg = replace(config, map_size_bytes=1 << 20, max_map_size_bytes=2 << 20)
    rnd = __import__("random").Random(2)
    written = {}
    with Store(cfg) as store:
        with pytest.raises(StoreFull, match="max_map_size_bytes"):
            for i in range(100):
                blob = rnd.randbytes(100_000)
                store.put(f"f{i}", blob)
                written[f"f{i}"] = blob
        failed = f"f{len(written)}"
        with pytest.raises(NotFound):
            store.get(failed)  # nothing half-written is visible
        for sid, blob in written.items():
            assert store.get(sid).state == blob
        store.delete_session("f0")  # freeing space lets writes through again
        store.put("small", b"\x08\x01")
    with Store(cfg) as store:
        assert store.get("small").state == b"\x08\x01"
        assert store.get("f1").state == written["f1"]


@pytest.mark.parametrize(
    ("session_id", "message"),
    [
        ("", "session_id is empty"),
        ("x" * 257, "session_id is 257 bytes; the limit is 256"),
        ("é" * 129, "session_id is 258 bytes; the limit is 256"),
        ("a\x00b", "contains an ASCII control character"),
        ("tab\there", "contains an ASCII control character"),
        ("\ud800", "not valid UTF-8"),
    ],
)
def test_bad_session_ids_are_refused(store: Store, session_id: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        store.put(session_id, b"")
    with pytest.raises(InvalidArgument, match=message):
        store.get(session_id)


def test_limits_name_the_field(config: StoreConfig) -> None:
    with Store(replace(config, max_state_bytes=1000)) as store:
        with pytest.raises(ResourceExhausted, match="state is 1001 bytes; the limit \\(max_state_bytes\\) is 1000"):
            store.put("s", b"x" * 1001)
        store.put("s", b"\x0a\x03abc" * 110, mode=WriteMode.MERGE)
        with pytest.raises(
            ResourceExhausted, match="would make a state of 1100 bytes, over max_state_bytes \\(1000\\)"
        ):
            store.put("s", b"\x0a\x03abc" * 110, mode=WriteMode.MERGE)
        with pytest.raises(InvalidArgument, match="request_id is 129 bytes; the limit is 128"):
            store.put("s", b"", request_id="r" * 129)
        with pytest.raises(InvalidArgument, match="labels key '' is 0 bytes"):
            store.put("s", b"", labels={"": "v"})
        with pytest.raises(InvalidArgument, match="labels has 65 entries; the limit is 64"):
            store.put("s", b"", labels={str(i): "v" for i in range(65)})
        with pytest.raises(InvalidArgument, match="not a valid MERGE patch: field 1 at offset 0 declares 5 bytes"):
            store.put("s", b"\x0a\x05ab", mode=WriteMode.MERGE)
        with pytest.raises(InvalidArgument, match="mode must be REPLACE"):
            store.put("s", b"", mode=7)  # type: ignore[arg-type]
        for version in (-1, True, 1.0, "1", 2**64):
            with pytest.raises(
                InvalidArgument, match=r"^version must be (an int|in 0\.\.2\*\*64-1 \(a uint64\)) \(0 = latest\)"
            ):
                store.get("s", version)  # type: ignore[arg-type]
            with pytest.raises(InvalidArgument, match=r"^version must be (an int|in 0\.\.2\*\*64-1)"):
                store.fork("s", version, "f")  # type: ignore[arg-type]
        assert store.session("s").head_version == 1  # nothing bad was written


def test_put_many_reports_each_write(store: Store) -> None:
    results = store.put_many(
        [
            PutRequest("pm", b"\x08\x01"),
            PutRequest("pm", b"\x08\x02", expected_version=5),
            PutRequest("", b""),
            PutRequest("pm", b"\x10\x01", mode=WriteMode.MERGE, expected_version=1),
        ]
    )
    assert [type(r).__name__ for r in results] == ["PutResult", "VersionConflict", "InvalidArgument", "PutResult"]
    assert store.get("pm").state == b"\x08\x01\x10\x01"


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (PutRequest("s", b"", expected_version=1.0), "expected_version must be an int or None, not float"),  # type: ignore[arg-type]
        (PutRequest("s", b"", expected_version=True), "expected_version must be an int or None, not bool"),
        (PutRequest("s", b"", request_id=5), "request_id must be a str, not int"),  # type: ignore[arg-type]
        (PutRequest("s", b"", labels={5: "v"}), "labels must map str to str; entry 5: 'v' does not"),  # type: ignore[dict-item]
        (PutRequest("s", b"", labels={"k": 5}), "labels must map str to str; entry 'k': 5 does not"),  # type: ignore[dict-item]
        (PutRequest("s", b"", labels=None), "labels must be a dict of str to str, not NoneType"),  # type: ignore[arg-type]
    ],
)
def test_a_put_of_the_wrong_types_is_invalid_argument_naming_the_field(
    store: Store, request_: PutRequest, message: str
) -> None:
    (outcome,) = store.put_many([request_])
    assert isinstance(outcome, InvalidArgument)
    assert str(outcome) == message
    with pytest.raises(NotFound):
        store.get("s")


def test_a_closed_store_answers_no_read_even_from_its_cache(config: StoreConfig) -> None:
    store = Store(config)
    store.put("hot", b"\x08\x01")
    assert store.get_cached("hot") is not None  # in the state cache
    store.close()
    with pytest.raises(Unavailable, match="the store is closed"):
        store.get("hot")
    with pytest.raises(Unavailable, match="the store is closed"):
        store.get_cached("hot")
    with pytest.raises(Unavailable, match="the store is closed"):
        store.get("hot", 1)


def test_put_many_writes_nothing_when_an_item_is_no_put_request(store: Store) -> None:
    """Something that is not a PutRequest raises past put_many's per-write errors: then none of the batch is written."""
    with pytest.raises(InvalidArgument, match=r"^requests\[1\] must be a PutRequest, not NoneType$"):
        store.put_many([PutRequest("pm", b"\x08\x01"), None])  # type: ignore[list-item]
    # The next write (committed when put_many returns) is the session's first: nothing of the batch was.
    (after,) = store.put_many([PutRequest("pm", b"\x08\x02")])
    assert not isinstance(after, Exception) and after.version == 1


def test_a_second_store_on_the_same_directory_is_refused(store: Store, config: StoreConfig) -> None:
    with pytest.raises(Unavailable, match="is in use by another Store in this process"):
        Store(config)
    # Read-only beside it is refused the same way: the data is not damaged, only open (it said DataLoss).
    with pytest.raises(Unavailable, match="is in use by another Store in this process"):
        Store(config, readonly=True)


def test_a_corrupt_frame_is_data_loss_naming_session_and_version(config: StoreConfig) -> None:
    with Store(config) as store:
        for v in range(1, 4):
            store.put("c", state_of("c", v))
    env = lmdb.open(str(config.data_dir / "lmdb"), max_dbs=8)
    frames = env.open_db(b"frames")
    with env.begin(write=True, db=frames) as txn:
        key = b"c\x00" + (2).to_bytes(8, "big")
        value = bytearray(txn.get(key) or b"")
        value[-1] ^= 0x10
        txn.put(key, bytes(value))
    env.close()
    with Store(config) as store:
        assert store.get("c", 1).state == state_of("c", 1)
        with pytest.raises(DataLoss, match=r"session 'c' version 3: .*checksum"):
            store.get("c")
        with pytest.raises(DataLoss, match="session 'c' version 3"):
            store.put("c", state_of("c", 4))  # refuses to build on a corrupt head


@pytest.mark.parametrize("mode", [WriteMode.REPLACE, WriteMode.MERGE])
def test_readers_only_ever_see_committed_heads(store: Store, mode: WriteMode) -> None:
    # MERGE heads are cached as snapshots of the encoder's growing state and
    # joined by whichever reader comes first, while the writer appends.
    expected = {1: state_of("rw", 1)}
    for v in range(2, 60):
        expected[v] = state_of("rw", v) if mode is WriteMode.REPLACE else expected[v - 1] + patch_of(v)
    store.put("rw", expected[1])
    stop = threading.Event()
    errors: list[str] = []

    def reader() -> None:
        last = 0
        while not stop.is_set():
            got = store.get("rw")
            if got.state != expected[got.version]:
                errors.append(f"version {got.version} returned another version's state")
            if got.version < last:
                errors.append(f"went back from {last} to {got.version}")
            last = got.version

    readers = [threading.Thread(target=reader) for _ in range(4)]
    for t in readers:
        t.start()
    for v in range(2, 60):
        data = expected[v] if mode is WriteMode.REPLACE else patch_of(v)
        r = store.put("rw", data, mode=mode)
        assert store.get("rw").version == r.version  # acknowledged means visible
    stop.set()
    for t in readers:
        t.join()
    assert not errors, errors[:3]


def test_close_commits_queued_writes_then_refuses(config: StoreConfig) -> None:
    store = Store(config)
    results = []
    threads = [
        threading.Thread(target=lambda n=n: results.append(store.put(f"c{n}", state_of("c", 1)))) for n in range(32)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store.close()
    with pytest.raises(Unavailable):
        store.put("late", b"")
    with Store(config) as reopened:
        assert {s.session_id for s in reopened.list_sessions(page_size=100)[0]} == {f"c{n}" for n in range(32)}


def test_group_commit_batches_concurrent_writers(store: Store) -> None:
    def writer(n: int) -> None:
        for v in range(1, 21):
            store.put(f"g{n}", state_of(f"g{n}", v))

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = store.stats()
    assert stats["versions"] == 16 * 20
    assert stats["commits"] < 16 * 20  # several writes shared a commit
    assert max(stats["batch_sizes"]) > 1


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_the_background_sweeper_applies_retention(config: StoreConfig) -> None:
    policy = ChainPolicy(frame_cost_bytes=0, max_depth=1)  # chains of 2: 1-2, 3-4, ...
    cfg = replace(config, chain_policy=policy, retention=Retention(keep_last_versions=2), sweep_interval_seconds=0.05)
    # Written before the sweeper runs: one sweeping between two puts would stop at another version.
    with Store(replace(cfg, sweep_interval_seconds=3600)) as store:
        for v in range(1, 11):
            store.put("bg", state_of("bg", v))
    with Store(cfg) as store:
        deadline = time.monotonic() + 10
        while store.session("bg").first_version == 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        info = store.session("bg")
        assert info.first_version == 9 and info.version_count == 2
        assert store.get("bg", 9).state == state_of("bg", 9)


def _entries_naming(config: StoreConfig, sid: bytes) -> dict[bytes, list[bytes]]:
    """Each table's keys that name session ``sid`` (the store closed)."""
    env = lmdb.open(str(config.data_dir / "lmdb"), max_dbs=8, readonly=True)
    found = {}
    with env.begin() as txn:
        for name in (b"frames", b"sessions", b"requests", b"req_expiry", b"labels", b"updated"):
            db = env.open_db(name, txn=txn, create=False)
            found[name] = [k for k in (bytes(k) for k in txn.cursor(db=db).iternext(values=False)) if sid in k]
    env.close()
    return found


def test_delete_leaves_no_entry_but_its_request_records_which_expire_on_time(config: StoreConfig) -> None:
    """A delete removes the session's record, frames and index entries at once. Its request records are
    keyed by request id first (keys.request_key), where no seek by session finds them: they stay until
    they expire, answering nothing meanwhile (test_a_request_id_of_a_deleted_session_makes_a_new_write)."""
    ttl = 1.0
    with Store(replace(config, request_id_ttl_seconds=ttl)) as store:
        for v in range(1, 6):
            store.put("gone", state_of("gone", v), labels={"k": f"v{v}"}, request_id=f"r{v}")
        store.put("kept", b"\x08\x01", labels={"k": "v1"}, request_id="r1")
        store.delete_session("gone")
    left = {name: len(found) for name, found in _entries_naming(config, b"gone").items() if found}
    assert left == {b"requests": 5, b"req_expiry": 5}
    assert all(_entries_naming(config, b"kept").values())  # the other session's entries are untouched
    time.sleep(ttl)
    with Store(config) as store:
        assert store.sweep().request_ids_expired == 6  # kept's r1 too
    assert not any(_entries_naming(config, b"gone").values())


def test_a_request_id_of_a_deleted_session_makes_a_new_write(store: Store) -> None:
    """Records name the session they were written to (its creation time): one of a deleted session of
    the same id answers nothing, and the new write's record takes its place."""
    first = store.put("d", state_of("d", 1), request_id="same")
    store.delete_session("d")
    again = store.put("d", state_of("d", 1), request_id="same")
    assert not again.replayed and (first.version, again.version) == (1, 1)
    assert store.put("d", state_of("d", 1), request_id="same").replayed  # its own retry is answered
    store.put("d", state_of("d", 2), request_id="next")
    store.delete_session("d")
    # Another write under a deleted session's request id is no misuse: that session is gone.
    assert store.put("d", b"\x08\x07", request_id="next").version == 1
    assert store.get("d").state == b"\x08\x07"


def test_hot_get_metadata_equals_what_lmdb_holds(config: StoreConfig) -> None:
    config = replace(config, fold_on_close_seconds=0)  # the close keeps the PATCH head as it is
    with Store(config) as store:
        store.put("m", state_of("m", 1), labels={"a": "1"})
        store.put("m", patch_of(2), mode=WriteMode.MERGE, labels={"b": "2"})
        store.fork("m", 1, "f", labels={"c": "3"})
        hot = {sid: store.get(sid) for sid in ("m", "f")}
        assert store.counters.cache_hits == 2
    with Store(config) as store:  # nothing cached: metadata read from LMDB
        for sid, got in hot.items():
            cold = store.get(sid)
            assert (cold.version, cold.state, cold.info) == (got.version, got.state, got.info)
    assert hot["f"].info.parent_version == 0 and hot["f"].info.mode is WriteMode.FORK


def test_an_unexpected_failure_mid_write_fails_alone_and_leaves_nothing(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Puts share the batch transaction; one that breaks after writing must not leak its writes."""
    real = RequestIds.remember

    # A private hook: a failure after a put's first writes cannot be caused through the store's API.
    def broken(self: RequestIds, txn: object, rid_key: bytes, *args: object) -> None:
        if b"boom" in rid_key:
            raise RuntimeError("disk gremlin")  # after the frame and session record were written
        real(self, txn, rid_key, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(RequestIds, "remember", broken)
    requests = [PutRequest(f"ok-{i}", state_of(f"ok-{i}", 1), request_id=f"r{i}") for i in range(4)]
    requests.insert(2, PutRequest("bad", state_of("bad", 1), request_id="boom"))
    with writer_held(store):  # queued behind it: they share the next commit
        futures = [put_later(store, r) for r in requests]
        wait_queued(store, len(requests))
    outcomes = [type(f.exception(timeout=30) or f.result()).__name__ for f in futures]
    assert outcomes == ["PutResult", "PutResult", "RuntimeError", "PutResult", "PutResult"]
    with pytest.raises(NotFound):
        store.session("bad")
    assert store.stats()["versions"] == 4  # no frame of the failed write was left behind
    for i in range(4):
        assert store.get(f"ok-{i}").state == state_of(f"ok-{i}", 1)
    monkeypatch.undo()
    assert store.put("bad", state_of("bad", 1), request_id="boom").version == 1


def _edit_in_place(version: int) -> pb.Checkpoint:
    """A patch that rewrites the same fields every step: the state's message never grows."""
    patch = pb.Checkpoint(step=version, goal=f"goal revision {version} " + "g" * 200)
    patch.working_memory["branch"] = f"fix/attempt-{version % 3}"
    patch.plan["s1"].CopyFrom(pb.PlanStep(id="s1", title="reproduce", notes=f"note {version} " + "n" * 100))
    return patch


@pytest.mark.parametrize("merge_message_type", [None, "ckpt.v1.Checkpoint"])
def test_merge_compaction_bounds_a_state_edited_in_place(config: StoreConfig, merge_message_type: str | None) -> None:
    config = replace(config, merge_message_type=merge_message_type)
    sizes = []
    with Store(config) as store:
        for v in range(1, 81):
            patch = _edit_in_place(v)
            store.put("edits", patch.SerializeToString(), mode=WriteMode.MERGE)
            sizes.append(len(store.get("edits").state))
    patch_bytes = _edit_in_place(80).ByteSize()
    with Store(config) as store:  # cold: every version from LMDB
        for v in (1, 9, 10, 47, 80):
            expected = pb.Checkpoint()
            for i in range(1, v + 1):
                expected.MergeFrom(_edit_in_place(i))
            assert pb.Checkpoint.FromString(store.get("edits", v).state) == expected, f"version {v}"
    if merge_message_type is None:
        assert sizes[-1] > 70 * patch_bytes  # every patch stays in the bytes, forever
    else:
        # at most a compacted state plus one chain (max_depth 8) of patches
        assert max(sizes) < 11 * patch_bytes, (max(sizes), patch_bytes)


def test_merge_compaction_config_names_the_type(config: StoreConfig) -> None:
    with pytest.raises(ValueError, match=r"merge_message_type 'no\.such\.Type' is not a protobuf message type"):
        replace(config, merge_message_type="no.such.Type")
    # framing fine, but field 16 (messages) holds a broken nested message
    broken = b"\x82\x01\x01\x08"
    with (
        Store(replace(config, merge_message_type="ckpt.v1.Checkpoint")) as store,
        pytest.raises(InvalidArgument, match=r"does not parse as ckpt\.v1\.Checkpoint"),
    ):
        store.put("m", broken, mode=WriteMode.MERGE)


def test_cached_encoders_stay_within_their_memory_budget(config: StoreConfig) -> None:
    # Six sessions written in turn, with room for about two encoders: most
    # writes find their encoder evicted and resume the chain from LMDB.
    sessions = [f"big-{i}" for i in range(6)]
    probe = ChainEncoder(policy=CHAINS)
    probe.replace(state_of("big-0", 6, size=20_000))
    budget = int(2.5 * probe.memory_bytes)
    expected: dict[str, list[bytes]] = {sid: [] for sid in sessions}
    with Store(replace(config, encoder_cache_bytes=budget, cache_size_bytes=0)) as store:
        for version in range(1, 7):
            for sid in sessions:
                if version % 3:
                    store.put(sid, state_of(sid, version, size=20_000))
                    expected[sid].append(state_of(sid, version, size=20_000))
                else:
                    store.put(sid, patch_of(version), mode=WriteMode.MERGE)
                    expected[sid].append(expected[sid][-1] + patch_of(version))
                stats = store.stats()
                assert stats["encoder_cache_bytes"] <= budget
        assert 1 <= stats["encoders_cached"] <= 2  # the budget bounded it, not the 1,024 entries
        for sid in sessions:
            assert [store.get(sid, v).state for v in range(1, 7)] == expected[sid]
            kinds = [info.frame_kind for info in store.list_versions(sid, page_size=10)[0]]
            assert FrameKind.DELTA in kinds or FrameKind.PATCH in kinds  # resumed chains, not all FULL


@pytest.mark.parametrize(
    ("capacity", "max_weight", "puts", "kept", "weight"),
    [
        (2, None, [("a", 1), ("b", 1), ("c", 1)], ["b", "c"], 0),  # count-bound only (no weigh)
        (10, 10, [("a", 4), ("b", 4), ("c", 4)], ["b", "c"], 8),
        (10, 10, [("a", 4), ("b", 4), ("a", 4), ("c", 4)], ["a", "c"], 8),  # a put refreshes recency
        (10, 10, [("a", 4), ("b", 4), ("a", 1)], ["b", "a"], 5),  # and re-weighs
        (10, 10, [("a", 4), ("b", 11)], ["a"], 4),  # heavier than the budget: not kept, and evicts nothing
        (10, 10, [("a", 4), ("b", 4), ("b", 11)], ["a"], 4),  # and drops what its key held
        (10, 10, [("a", 10)], ["a"], 10),  # exactly the budget fits
        (0, 10, [("a", 1)], [], 0),  # capacity 0 keeps nothing
    ],
)
def test_lru_bounds_count_and_weight(
    capacity: int, max_weight: int | None, puts: list[tuple[str, int]], kept: list[str], weight: int
) -> None:
    weighs = max_weight is not None
    lru: LRU[int] = LRU(capacity, max_weight=max_weight, weigh=(lambda w: w) if weighs else None)
    for key, w in puts:
        lru.put(key.encode(), w)
    assert [k for k in (b"a", b"b", b"c") if lru.get(k) is not None] == sorted(k.encode() for k in kept)
    assert lru.weight == weight
    for key in kept:
        lru.discard(key.encode())
    assert lru.weight == 0 and len(lru) == 0


@pytest.mark.parametrize(
    ("bad", "error", "message"),
    [
        ({"retention": None}, TypeError, "retention must be a Retention, not NoneType"),
        ({"chain_policy": {"max_depth": 4}}, TypeError, "chain_policy must be a ChainPolicy, not dict"),
        ({"max_readers": 0}, ValueError, "max_readers must be >= 1, got 0"),
        ({"max_readers": 2.5}, TypeError, "max_readers must be an int, not float"),
    ],
)
def test_a_store_config_of_the_wrong_kind_is_refused_naming_the_field(
    tmp_path: Path, bad: dict[str, object], error: type[Exception], message: str
) -> None:
    """These used to be taken, and failed later: the sweeper on every pass, the first put, LMDB's open."""
    with pytest.raises(error) as raised:
        StoreConfig(data_dir=tmp_path / "d", **bad)  # type: ignore[arg-type]
    assert str(raised.value) == message
