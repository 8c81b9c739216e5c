"""Store.list_sessions(session_id_prefix=...): the sessions whose id starts with the prefix, read from the
prefix's first id to its last, so that a page costs the matching sessions and not the store's others."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt.sidecar import InvalidArgument, NewEvent, SessionInfo, Store, StoreConfig
from ckpt.sidecar.store import listings


def _all(store: Store, page_size: int = 100, **filters: object) -> list[list[str]]:
    """The session ids of every page of a listing."""
    pages, token = [], ""
    while True:
        page, token = store.list_sessions(page_size=page_size, page_token=token, **filters)  # type: ignore[arg-type]
        pages.append([s.session_id for s in page])
        if not token:
            return pages


def _fill(store: Store) -> None:
    """Ten unrelated sessions on each side of "m/" (in id order), and three of "m/": one holding only events."""
    for i in range(10):
        store.put(f"a/{i}", b"\x08\x01", labels={"team": "x"})
        store.put(f"z/{i}", b"\x08\x01", labels={"team": "x"})
    store.put("m/1", b"\x08\x01", labels={"team": "x"})
    store.put("m/2", b"\x08\x01", labels={"team": "y"})
    store.append_events("m/3", [NewEvent("note", b"")])


def test_a_prefix_listing_reads_the_prefixs_sessions_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With at most 4 index entries examined a page, a listing that read the ten sessions before "m/" (or
    the ten after it) would take pages without a session of it, or not end at its last one."""
    monkeypatch.setattr(listings, "_MAX_SCAN_PER_PAGE", 4)
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        _fill(store)
        assert _all(store, session_id_prefix="m/") == [["m/1", "m/2", "m/3"]]
        assert _all(store, session_id_prefix="m/", label_filter={"team": "x"}) == [["m/1"]]
        assert _all(store, 2, session_id_prefix="m/") == [["m/1", "m/2"], ["m/3"]]
        assert _all(store, session_id_prefix="m/2") == [["m/2"]]
        assert _all(store, session_id_prefix="n") == [[]]
        # The unfiltered listing still reads everything, a page of at most 4 entries at a time.
        assert sum(map(len, _all(store))) == 23


def test_a_prefix_narrows_the_update_time_listing(tmp_path: Path) -> None:
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        _fill(store)
        (listed,) = _all(store, session_id_prefix="m/", updated_after_nanos=0)
        assert sorted(listed) == ["m/1", "m/2"]  # the update-time index is of checkpoints: "m/3" is left out


def test_a_prefix_the_store_refuses_is_named(tmp_path: Path) -> None:
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        store.put("é" * 128, b"")
        page, _ = store.list_sessions(session_id_prefix="é" * 128)
        assert [s.session_id for s in page] == ["é" * 128]
        for prefix, message in (
            ("x" * 257, r"^session_id_prefix is 257 bytes; the limit is 256$"),
            ("a\x7f", r"^session_id_prefix 'a\\x7f' contains an ASCII control character"),
            ("a\udcc3", r"^session_id_prefix 'a\\udcc3' is not valid UTF-8"),
            (b"a", r"^session_id_prefix must be a string, not bytes$"),
        ):
            with pytest.raises(InvalidArgument, match=message):
                store.list_sessions(session_id_prefix=prefix)  # type: ignore[arg-type]
        store.append_events("events", [NewEvent("note", b"")])
        unfiltered: list[SessionInfo] = store.list_sessions()[0]
        assert store.list_sessions(session_id_prefix="")[0] == unfiltered  # an empty prefix: no filter
        assert [s.session_id for s in unfiltered] == ["events", "é" * 128]
