"""Sessions that hold events and no checkpoint are sessions: listed in session id order with the others."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt.sidecar import NewEvent, NotFound, SessionInfo, Store, StoreConfig
from ckpt.sidecar.client import CheckpointClient, event
from tests.support import ckpt, metric, start_sidecar_with_metrics


def _all(store: Store, page_size: int, **filters: object) -> list[SessionInfo]:
    out, token = [], ""
    while True:
        page, token = store.list_sessions(page_size=page_size, page_token=token, **filters)  # type: ignore[arg-type]
        assert len(page) <= page_size
        out += page
        if not token:
            return out


def test_an_events_only_session_is_listed_with_its_logs_times_and_no_head(tmp_path: Path) -> None:
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        before = time.time_ns()
        store.put("b-checkpoint", b"\x08\x01", labels={"team": "x"})
        store.append_events("a-events", [NewEvent("tool_call", b"{}")])
        store.append_events("a-events", [NewEvent("tool_result", b"{}")])
        store.append_events("b-checkpoint", [NewEvent("note", b"")])
        after = time.time_ns()
        listed = _all(store, 100)
        assert [s.session_id for s in listed] == ["a-events", "b-checkpoint"]
        events_only, checkpointed = listed
        assert (events_only.head_version, events_only.version_count, events_only.stored_bytes) == (0, 0, 0)
        assert events_only.labels == {} and events_only.message_type == ""
        assert before <= events_only.created_unix_nanos <= events_only.updated_unix_nanos <= after
        assert checkpointed.head_version == 1 and checkpointed.labels == {"team": "x"}
        # The label and update-time indexes are of checkpoints: a filtered listing holds none of events alone.
        assert [s.session_id for s in _all(store, 100, label_filter={"team": "x"})] == ["b-checkpoint"]
        assert [s.session_id for s in _all(store, 100, updated_after_nanos=before)] == ["b-checkpoint"]
        store.delete_session("a-events")
        assert [s.session_id for s in _all(store, 100)] == ["b-checkpoint"]


@settings(max_examples=25, deadline=None)
@given(
    kinds=st.lists(st.sampled_from(["put", "events", "both"]), min_size=1, max_size=12),
    page_size=st.integers(1, 4),
)
def test_pages_list_every_session_once_in_id_order(
    tmp_path_factory: pytest.TempPathFactory, kinds: list[str], page_size: int
) -> None:
    with Store(StoreConfig(data_dir=tmp_path_factory.mktemp("mixed") / "data")) as store:
        # Ids out of order, so that the two tables' keys interleave.
        ids = [f"s{(i * 7) % 13:02d}" for i in range(len(kinds))]
        for sid, kind in zip(ids, kinds, strict=True):
            if kind in ("put", "both"):
                store.put(sid, b"\x08\x01")
            if kind in ("events", "both"):
                store.append_events(sid, [NewEvent("e", b"")])
        listed = _all(store, page_size)
        assert [s.session_id for s in listed] == sorted(ids)
        heads = {s.session_id: s.head_version for s in listed}
        assert heads == {sid: 0 if kind == "events" else 1 for sid, kind in zip(ids, kinds, strict=True)}


def test_sessions_of_events_alone_count_where_they_are_listed(tmp_path: Path) -> None:
    """`ckpt stats` and `ckpt backup` count the sessions `ckpt sessions` lists, events alone too. The metrics,
    read at every scrape, keep to counts LMDB holds: sessions with a checkpoint, and event logs."""
    data = tmp_path / "data"
    sidecar = start_sidecar_with_metrics(data)
    try:
        with CheckpointClient(sidecar.unix_target) as c:
            c.put("checkpoints-only", b"x")
            c.put("both", b"x")
            c.append_events("both", [event("note", b"")])
            c.append_events("events-only", [event("tool_call", b"{}")])
            c.append_events("events-deleted", [event("tool_call", b"{}")])
            c.delete("events-deleted")
            listed = [s.session_id for s in c.sessions()]
        assert listed == ["both", "checkpoints-only", "events-only"]
        assert metric(sidecar, "ckpt_sessions") == 2
        assert metric(sidecar, "ckpt_event_logs") == 2
        assert metric(sidecar, "ckpt_versions") == 2
        assert sidecar.stop() == 0, sidecar.log()
    finally:
        sidecar.stop()
    stats = ckpt("stats", "--data-dir", str(data))
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["sessions"] == 3
    backup = ckpt("backup", str(tmp_path / "backup"), "--data-dir", str(data))
    assert backup.returncode == 0, backup.stderr
    assert json.loads(backup.stdout)["sessions"] == 3
    with Store(StoreConfig(data_dir=tmp_path / "backup")) as restored:
        assert len(_all(restored, 100)) == 3
        assert (restored.stats()["sessions"], restored.stats()["event_logs"]) == (2, 2)


def test_reading_a_version_of_an_events_only_session_says_it_has_only_events(tmp_path: Path) -> None:
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        store.append_events("events", [NewEvent("note", b"")])
        for version in (0, 1):
            with pytest.raises(NotFound, match="session 'events' has no versions, only events"):
                store.get("events", version)
        with pytest.raises(NotFound, match="session 'events' has no versions, only events"):
            store.list_versions("events")
        with pytest.raises(NotFound, match=r"session 'missing' does not exist$"):
            store.get("missing")
        with pytest.raises(NotFound, match=r"session 'missing' does not exist$"):
            store.list_versions("missing")
