"""A read of events within a ReadBound, and pages cut by max_page_bytes, against plain lists."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt.sidecar import EventQuery, NewEvent, Store, StoreConfig
from ckpt.sidecar.errors import ResourceExhausted
from ckpt.sidecar.store import ReadBound
from ckpt.sidecar.store.events import SEAL_EVENTS

SECOND = 1_000_000_000
TYPES = ("tool", "msg")
#: Events of 20 bytes of payload: SEAL_EVENTS to a block, so the blocks' seqs are known.
BLOCKS = 4
UNBOUNDED = ReadBound(max_blocks=10**6, max_raw_bytes=10**12, max_events=10**6)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(StoreConfig(data_dir=tmp_path / "data"))
    events = [NewEvent(TYPES[i % 2], b"%020d" % i, {}, (i + 1) * SECOND) for i in range(BLOCKS * SEAL_EVENTS)]
    for start in range(0, len(events), 500):
        s.append_events("log", events[start : start + 500])
    yield s
    s.close()


def _read(store: Store, bound: ReadBound | None, **query: object) -> list[int]:
    page = store.read_events("log", EventQuery(**query), bound=bound)  # type: ignore[arg-type]
    return [e.seq for e in page.events]


def test_a_read_within_its_bound_is_the_unbounded_read(store: Store) -> None:
    one_block = ReadBound(max_blocks=1, max_raw_bytes=48 * 1024, max_events=50)
    assert _read(store, one_block, newest_first=True, page_size=50) == _read(
        store, None, newest_first=True, page_size=50
    )
    assert _read(store, one_block, after_seq=BLOCKS * SEAL_EVENTS) == []  # past the tail: no block visited
    # The page cut by the bound's events, not a larger one: the unbounded read's, exactly.
    assert _read(store, UNBOUNDED, page_size=1000) == _read(store, None, page_size=1000) == list(range(1, 1001))


@pytest.mark.parametrize(
    ("bound", "query", "field"),
    [
        # The newest events, from the last block back, over two blocks.
        (ReadBound(1, 10**9, 10**6), {"newest_first": True, "page_size": SEAL_EVENTS + 1}, "max_blocks"),
        (ReadBound(10, 1000, 10**6), {"page_size": 1}, "max_raw_bytes"),
        (ReadBound(10, 10**9, 49), {"page_size": 50}, "max_events"),
        (ReadBound(10, 10**9, 49), {"page_size": 50, "types": ["tool"]}, "max_events"),
        # Blocks skipped by their times count as visited, but decompress nothing.
        (ReadBound(2, 10**9, 10**6), {"after_unix_nanos": 10**18}, "max_blocks"),
    ],
)
def test_a_read_past_its_bound_is_refused_naming_the_limit(
    store: Store, bound: ReadBound, query: dict[str, object], field: str
) -> None:
    with pytest.raises(ResourceExhausted, match=field):
        _read(store, bound, **query)


def test_skipped_blocks_decompress_nothing(store: Store) -> None:
    skipping = ReadBound(max_blocks=BLOCKS, max_raw_bytes=0, max_events=0)
    assert _read(store, skipping, after_unix_nanos=10**18) == []


sizes_st = st.lists(st.one_of(st.integers(0, 40), st.integers(0, 3000)), min_size=1, max_size=300)


@settings(max_examples=100, deadline=None)
@given(
    sizes=sizes_st,
    cut=st.integers(1, 300),
    slack=st.one_of(st.integers(-8, 8 * 300), st.integers(-8, 16)),
    page_size=st.sampled_from((1, 7, 100, 1000)),
    newest_first=st.booleans(),
)
def test_pages_cut_by_bytes_are_what_each_events_size_says(
    sizes: list[int], cut: int, slack: int, page_size: int, newest_first: bool
) -> None:
    """The oracle: a page takes events in order while it has room and, past its first, their encodings
    (8 bytes each more) fit ``max_page_bytes``; the filtered read (types naming every type) agrees.
    ``max_page_bytes`` is near the encodings of the first ``cut`` events, where counting goes wrong."""
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(StoreConfig(data_dir=Path(tmp) / "data"))
        try:
            store.append_events("s", [NewEvent(TYPES[i % 2], b"x" * n, {}, SECOND) for i, n in enumerate(sizes)])
            events = store.read_events("s", EventQuery(page_size=1000)).events
            ordered = list(reversed(events)) if newest_first else events
            max_page_bytes = max(1, sum(e.ByteSize() for e in ordered[:cut]) + slack)
            expected: list[list[int]] = []
            page: list[int] = []
            used = 0
            for event in ordered:
                size = event.ByteSize() + 8
                if len(page) == page_size or (page and used + size > max_page_bytes):
                    expected.append(page)
                    page, used = [], 0
                page.append(event.seq)
                used += size
            expected.append(page)
            for types in ((), TYPES):
                got: list[list[int]] = []
                token = ""
                while True:
                    query = EventQuery(types=types, newest_first=newest_first, page_size=page_size, page_token=token)
                    read = store.read_events("s", query, max_page_bytes=max_page_bytes)
                    got.append([e.seq for e in read.events])
                    token = read.next_page_token
                    if not token:
                        break
                assert got == expected
        finally:
            store.close()
