"""read_head and advance_head (store/headreads.py): the head read whole with a reader to keep, then read by
advancing that reader with the frames stored since; None whenever that is not how the head is reached."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from ckpt.codec import ChainPolicy
from ckpt.sidecar.config import StoreConfig
from ckpt.sidecar.errors import NotFound, StateTooLarge
from ckpt.sidecar.store import EventQuery, HeadEvents, NewEvent, Store, WriteMode, advance_head, read_head


def _field(data: bytes) -> bytes:
    n = len(data)
    return b"\x12" + (bytes([n]) if n < 0x80 else bytes([(n & 0x7F) | 0x80, n >> 7])) + data


def _base(seed: int) -> bytes:
    rng = random.Random(seed)
    return b"".join(_field(bytes(rng.randrange(97, 123) for _ in range(100))) for _ in range(200))


def _store(tmp_path: Path, **policy: int) -> Store:
    return Store(StoreConfig(data_dir=tmp_path, chain_policy=ChainPolicy(**policy)))


def test_the_head_advances_by_the_frames_since(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        store.put("a", _base(1))
        store.put("a", _field(b"first"), mode=WriteMode.MERGE)
        got, reader, page = read_head(store, "a")
        assert reader is not None and page is None
        assert (got.version, got.state) == (2, store.get("a", use_cache=False).state)
        for n in (1, 3, 1):
            for i in range(n):
                store.put("a", _field(b"step %d" % i), mode=WriteMode.MERGE)
            advanced = advance_head(store, "a", reader)
            assert advanced is not None
            want = store.get("a", use_cache=False)
            assert advanced[0] == want and advanced[1] is None


def test_the_page_of_events_is_read_with_the_head(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        store.put("a", _base(1))
        _, reader, _ = read_head(store, "a")
        assert reader is not None
        store.append_events("a", [NewEvent("w", b"one")])
        store.put("a", _field(b"next"), mode=WriteMode.MERGE)
        events = HeadEvents(EventQuery(), max_page_bytes=1 << 20, bound=None)
        advanced = advance_head(store, "a", reader, events=events)
        assert advanced is not None and advanced[1] is not None
        assert [e.payload for e in advanced[1].events] == [b"one"]


def test_the_page_read_with_the_head_holds_what_its_state_leaves(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        store.put("a", _base(1))
        store.append_events("a", [NewEvent("w", b"%d" % i + b"e" * 99) for i in range(5)])
        state_bytes = len(_base(1))
        events = HeadEvents(EventQuery(), max_page_bytes=state_bytes + 300, bound=None)
        _, reader, page = read_head(store, "a", events=events)
        assert reader is not None and page is not None
        assert len(page.events) == 2 and page.next_page_token  # 2 of ~110 bytes each fit in the 300 left
        store.put("a", _field(b"x" * 150), mode=WriteMode.MERGE)  # the state grows: 1 fits
        advanced = advance_head(store, "a", reader, events=events)
        assert advanced is not None and advanced[1] is not None
        assert [e.seq for e in advanced[1].events] == [1] and advanced[1].next_page_token


def test_no_frame_since_or_a_new_chain_is_not_advanced(tmp_path: Path) -> None:
    with _store(tmp_path, max_depth=3) as store:
        store.put("a", _base(1))
        _, reader, _ = read_head(store, "a")
        assert reader is not None
        assert advance_head(store, "a", reader) is None  # nothing since: the caller reads whole
        for i in range(4):  # the fourth write starts a new chain: a FULL frame among those since
            store.put("a", _field(b"step %d" % i), mode=WriteMode.MERGE)
        assert store.session("a").chain_start_version > 1
        assert advance_head(store, "a", reader) is None
        _, reader, _ = read_head(store, "a")
        assert reader is not None and reader.version == 5


def test_a_session_written_again_is_not_advanced(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        store.put("a", _base(1))
        store.put("a", _field(b"x"), mode=WriteMode.MERGE)
        _, reader, _ = read_head(store, "a")
        assert reader is not None
        store.delete_session("a")
        store.put("a", _base(2))
        store.put("a", _field(b"x"), mode=WriteMode.MERGE)
        store.put("a", _field(b"y"), mode=WriteMode.MERGE)
        assert advance_head(store, "a", reader) is None
        assert reader.spent


def test_read_head_refuses_as_get_does(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        with pytest.raises(NotFound):
            read_head(store, "nobody")
        store.put("a", _base(1))
        with pytest.raises(StateTooLarge):
            read_head(store, "a", max_state_bytes=100)
        _, reader, _ = read_head(store, "a", max_state_bytes=len(_base(1)) + 10)
        assert reader is not None
        store.put("a", _field(b"more than ten bytes"), mode=WriteMode.MERGE)
        assert advance_head(store, "a", reader) is None  # over the bound the reader was opened with
