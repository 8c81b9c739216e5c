"""Sessions that stored blobs and never wrote a checkpoint (an agent that crashed or was abandoned between its
PutBlob and the Put naming it): listed and counted as sessions, and their blobs released by age retention."""

from __future__ import annotations

import time
from pathlib import Path

import lmdb
import pytest

from ckpt.sidecar import AlreadyExists, NewEvent, NotFound, SessionInfo, Store, StoreConfig
from ckpt.sidecar.config import Retention
from ckpt.sidecar.store import blobs as blobs_module
from ckpt.sidecar.store import count_sessions
from ckpt.sidecar.store.ops import Op
from tests.store.test_event_only_sessions import _all as every_session
from tests.support import ckpt

HOUR_NANOS = 3600 * 10**9


def _all(store: Store, page_size: int = 100) -> list[SessionInfo]:
    return every_session(store, page_size)


def _damage(data: Path, table: bytes, key: bytes, value: bytes | None) -> None:
    """Overwrite (or, with None, delete) one key of a closed store's LMDB table."""
    env = lmdb.open(str(data / "lmdb"), max_dbs=16)
    try:
        db = env.open_db(table)  # before the write transaction: opening one takes a write transaction too
        with env.begin(write=True) as txn:
            assert txn.delete(key, db=db) if value is None else txn.put(key, value, db=db)
    finally:
        env.close()


def test_a_blobs_only_session_is_listed_with_its_references_times_and_counted(tmp_path: Path) -> None:
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        before = time.time_ns()
        store.put_blob("a-blobs", [b"first"])
        store.put_blob("a-blobs", [b"second"])
        after = time.time_ns()
        store.put("b-checkpoint", b"\x08\x01")
        store.put_blob("b-checkpoint", [b"first"])
        store.append_events("c-events", [NewEvent("note", b"")])
        store.put_blob("c-events", [b"third"])
        listed = _all(store)
        assert [s.session_id for s in listed] == ["a-blobs", "b-checkpoint", "c-events"]
        blobs_only = listed[0]
        assert (blobs_only.head_version, blobs_only.version_count, blobs_only.labels) == (0, 0, {})
        assert before <= blobs_only.created_unix_nanos < blobs_only.updated_unix_nanos <= after
        with store.read() as txn:
            assert count_sessions(txn, store.tables) == 3
        for read in (
            lambda: store.get("a-blobs"),
            lambda: store.list_versions("a-blobs"),
            lambda: store.list_versions("a-blobs", include_states=True),
        ):
            with pytest.raises(NotFound, match="session 'a-blobs' has no versions, only blobs"):
                read()
        store.delete_session("a-blobs")
        assert [s.session_id for s in _all(store)] == ["b-checkpoint", "c-events"]


@pytest.mark.parametrize("page_size", [1, 2, 5])
def test_pages_list_sessions_of_blobs_alone_once_in_id_order(tmp_path: Path, page_size: int) -> None:
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        store.put("a", b"\x08\x01")
        for i in range(3):  # several references of one session: listed once
            store.put_blob("a0", [b"blob %d" % i])
        store.append_events("b", [NewEvent("e", b"")])
        store.put_blob("b", [b"x"])
        store.put_blob("c", [b"x"])
        store.put("d", b"\x08\x01")
        store.put_blob("d", [b"y"])
        assert [s.session_id for s in _all(store, page_size)] == ["a", "a0", "b", "c", "d"]
        assert [s.session_id for s in store.list_sessions(session_id_prefix="a")[0]] == ["a", "a0"]


def _aged(tmp_path: Path, retention: Retention) -> StoreConfig:
    return StoreConfig(data_dir=tmp_path / "data", retention=retention)


def test_age_retention_releases_the_blobs_of_a_session_that_never_wrote_a_checkpoint(tmp_path: Path) -> None:
    with Store(_aged(tmp_path, Retention(max_version_age_seconds=3600))) as store:
        abandoned = store.put_blob("abandoned", [b"screenshot"])
        shared = store.put_blob("abandoned", [b"shared"])
        store.put_blob("named", [b"shared"])
        store.put("named", b"state naming " + shared.uri.encode())
        store.append_events("logged", [NewEvent("tool_result", b"{}")])
        logged = store.put_blob("logged", [b"log attachment"])
        now = time.time_ns()
        store.sweep(now_nanos=now)  # nothing is an hour old yet
        assert store.blob_refs("abandoned") == sorted([abandoned.sha256, shared.sha256])
        store.sweep(now_nanos=now + 2 * HOUR_NANOS)
        assert store.blob_refs("abandoned") == []
        with pytest.raises(NotFound):
            store.blob(abandoned.sha256)
        assert not store.blob_files.path(abandoned.sha256).exists()
        # Still referenced by a session with a checkpoint, and by one with an event log (its events may name
        # it: they go with the session, or when it is deleted).
        assert store.blob(shared.sha256).ref_count == 1
        assert store.blob_files.path(shared.sha256).read_bytes() == b"shared"
        assert store.blob_refs("logged") == [logged.sha256]
        assert [s.session_id for s in _all(store)] == ["logged", "named"]


def test_retention_by_count_alone_keeps_the_blobs_of_sessions_without_a_checkpoint(tmp_path: Path) -> None:
    with Store(_aged(tmp_path, Retention(keep_last_versions=1))) as store:
        ref = store.put_blob("waiting", [b"bytes"])
        store.sweep(now_nanos=time.time_ns() + 1000 * HOUR_NANOS)
        assert store.blob_refs("waiting") == [ref.sha256]


def test_a_first_checkpoint_or_a_blob_stored_again_after_the_read_keeps_the_blobs(tmp_path: Path) -> None:
    with Store(_aged(tmp_path, Retention(max_version_age_seconds=3600))) as store:
        late = store.put_blob("late", [b"late"])
        again = store.put_blob("again", [b"again"])
        cutoff = time.time_ns()  # past both references
        blobs = store._blobs
        with store.read() as txn:
            doomed = {sid: blobs._sessionless_before(txn, sid, cutoff) for sid in (b"late", b"again")}
        assert doomed == {b"late": [bytes.fromhex(late.sha256)], b"again": [bytes.fromhex(again.sha256)]}
        store.put("late", b"names " + late.uri.encode())  # its checkpoint, between the read and the release
        store.put_blob("again", [b"again"])  # stored again: a fresh time, past the cutoff
        assert blobs._submit(Op(blobs._sessionless_op(doomed, cutoff))).wait() == 0
        assert store.blob(late.sha256).ref_count == 1
        assert store.blob(again.sha256).ref_count == 1
        assert store.blob_files.path(again.sha256).read_bytes() == b"again"


def test_a_fork_onto_a_session_of_blobs_alone_is_refused_as_onto_any_session(tmp_path: Path) -> None:
    """A fork's new session took over the blobs' references with their old times and a record: no sweep
    looked at them again, so the blobs of the abandoned session were kept for good."""
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        store.put("source", b"\x08\x01")
        ref = store.put_blob("target", [b"abandoned"])
        with pytest.raises(AlreadyExists, match=r"new_session_id 'target' already exists \(it holds blobs\)"):
            store.fork("source", 0, "target")
        assert store.blob_refs("target") == [ref.sha256]
        assert [s.session_id for s in _all(store)] == ["source", "target"]


def test_a_reference_record_that_does_not_parse_is_kept_and_the_rest_go_on(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Store(_aged(tmp_path, Retention(max_version_age_seconds=3600))) as store:
        damaged = store.put_blob("a-damaged", [b"one"])
        released = store.put_blob("b-abandoned", [b"two"])
        store.put("c-checkpoint", b"\x08\x01")
    _damage(data, b"blob_refs", b"a-damaged\x00" + bytes.fromhex(damaged.sha256), b"\xff\xff\xff")
    verify = ckpt("verify", "--data-dir", str(data))
    assert verify.returncode == 1, verify.stdout
    assert f"blob {damaged.sha256}: session 'a-damaged''s reference to it does not parse".encode() in verify.stderr
    with Store(_aged(tmp_path, Retention(max_version_age_seconds=3600))) as store:
        # Listed without it (the listing logs it), the others as ever; swept past it.
        assert [s.session_id for s in _all(store)] == ["b-abandoned", "c-checkpoint"]
        result = store.sweep(now_nanos=time.time_ns() + 2 * HOUR_NANOS)
        assert result.blob_refs_released == 1 and result.changed
        assert store.blob_refs("a-damaged") == [damaged.sha256]
        with pytest.raises(NotFound):
            store.blob(released.sha256)


def test_the_blobs_of_a_session_whose_record_was_lost_are_kept(tmp_path: Path) -> None:
    """A session with frames and no record is damage `ckpt verify` reports: its blobs may be what is recovered."""
    data = tmp_path / "data"
    with Store(StoreConfig(data_dir=data)) as store:
        ref = store.put_blob("s", [b"bytes"])
        store.put("s", b"\x08\x01")
    _damage(data, b"sessions", b"s", None)
    with Store(_aged(tmp_path, Retention(max_version_age_seconds=3600))) as store:
        store.sweep(now_nanos=time.time_ns() + 2 * HOUR_NANOS)
        assert store.blob_refs("s") == [ref.sha256]


def test_references_are_released_a_bounded_part_per_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(blobs_module, "_SWEEP_CHUNK", 2)
    with Store(_aged(tmp_path, Retention(max_version_age_seconds=3600))) as store:
        for i in range(5):  # five blobs of one session and one of another: three writes of two
            store.put_blob("many", [b"blob %d" % i])
        store.put_blob("one", [b"single"])
        store.put("kept", b"\x08\x01")
        parts: list[int] = []
        submit = store._blobs._submit

        def counted(op: Op) -> Op:
            parts.append(1)
            return submit(op)

        monkeypatch.setattr(store._blobs, "_submit", counted)
        assert store.sweep(now_nanos=time.time_ns() + 2 * HOUR_NANOS).blob_refs_released == 6
        assert len(parts) == 3
        assert store.blob_refs("many") == store.blob_refs("one") == []
        assert [s.session_id for s in _all(store)] == ["kept"]


@pytest.mark.parametrize("most", [1, 2, 3, 7])
def test_parts_hold_every_reference_once_in_order_and_at_most_their_bound(most: int) -> None:
    doomed = {b"a": [b"1", b"2", b"3"], b"b": [b"4"], b"c": [b"5", b"6", b"7", b"8", b"9"]}
    parts = list(blobs_module._in_parts(doomed, most))
    assert all(0 < sum(map(len, part.values())) <= most for part in parts)
    joined = [(sid, sha) for part in parts for sid, shas in part.items() for sha in shas]
    assert joined == [(sid, sha) for sid, shas in doomed.items() for sha in shas]
