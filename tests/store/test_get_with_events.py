"""Store.get_with_events: a state and a page of its session's events in one read, against a Get and a
read_events of the same data."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt.sidecar import EventQuery, InvalidArgument, NewEvent, NotFound, PutRequest, Store, StoreConfig, WriteMode
from ckpt.sidecar.store import GetWithEvents

TYPES = ("writes", "msg")

reads_st: st.SearchStrategy[dict[str, Any]] = st.fixed_dictionaries(
    {
        "after_seq": st.integers(0, 120),
        "types": st.lists(st.sampled_from(TYPES), max_size=2).map(tuple),
        "newest_first": st.booleans(),
        "page_size": st.sampled_from((0, 1, 5, 1000)),
    }
)
ops_st = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.lists(st.sampled_from(TYPES), min_size=1, max_size=30)),
        st.tuples(st.just("append_put"), st.lists(st.sampled_from(TYPES), max_size=3)),
        st.tuples(st.just("put"), st.binary(max_size=300)),
    ),
    min_size=1,
    max_size=12,
)


def _same(a: GetWithEvents, get_state: Any, page: Any) -> None:
    assert (a.got.version, a.got.state, a.got.info) == (get_state.version, get_state.state, get_state.info)
    assert [e.SerializeToString() for e in a.events.events] == [e.SerializeToString() for e in page.events]
    assert a.events.next_page_token == page.next_page_token


@settings(max_examples=40, deadline=None)
@given(ops=ops_st, reads=st.lists(reads_st, min_size=1, max_size=4), use_cache=st.booleans())
def test_a_get_with_events_reads_what_a_get_and_a_read_events_read(
    ops: list[Any], reads: list[dict[str, Any]], use_cache: bool
) -> None:
    with tempfile.TemporaryDirectory() as tmp, Store(StoreConfig(data_dir=Path(tmp))) as store:
        sid = "s"
        store.put(sid, b"\x0a\x01a")
        for kind, arg in ops:
            if kind == "append":
                store.append_events(sid, [NewEvent(t, t.encode() * 40) for t in arg])
            elif kind == "append_put":
                patch = PutRequest("", b"\x0a\x01x", WriteMode.MERGE)
                store.append_events(sid, [NewEvent(t, b"x") for t in arg], put=patch)
            else:
                store.put(sid, arg)
        head = store.session(sid).head_version
        for read in reads:
            query = EventQuery(**read)
            for version in (0, head, max(1, head - 1)):
                both = store.get_with_events(sid, version, events=query, use_cache=use_cache)
                _same(both, store.get(sid, version), store.read_events(sid, query))
                token = both.events.next_page_token
                if token:  # its token continues the read as a ReadEvents' does
                    query = EventQuery(**read, page_token=token)
                    _same(
                        store.get_with_events(sid, version, events=query),
                        store.get(sid, version),
                        store.read_events(sid, query),
                    )
                    query = EventQuery(**read)


def test_a_session_with_versions_and_no_events_answers_an_empty_page(tmp_path: Path) -> None:
    with Store(StoreConfig(data_dir=tmp_path)) as store:
        store.put("s", b"state")
        both = store.get_with_events("s", events=EventQuery())
        assert (both.got.state, both.events.events, both.events.next_page_token) == (b"state", [], "")


def test_errors_name_the_events_field_and_the_get_errors_come_first(tmp_path: Path) -> None:
    with Store(StoreConfig(data_dir=tmp_path)) as store:
        store.put("s", b"state")
        store.append_events("s", [NewEvent("msg", b"hi")])
        with pytest.raises(InvalidArgument, match=r"^events\.page_size must be in 0\.\.1000"):
            store.get_with_events("s", events=EventQuery(page_size=1001))
        with pytest.raises(InvalidArgument, match=r"^events\.page_token 'nope' is not a token"):
            store.get_with_events("s", events=EventQuery(page_token="nope"))
        with pytest.raises(InvalidArgument, match=r"^events\.types\[0\]"):
            store.get_with_events("s", events=EventQuery(types=("",)))
        with pytest.raises(NotFound, match="has no version 9"):
            store.get_with_events("s", 9, events=EventQuery())
        with pytest.raises(NotFound, match="does not exist"):
            store.get_with_events("nobody", events=EventQuery())


def _page_bytes(events: Any) -> int:
    return sum(e.ByteSize() + 8 for e in events)  # each event's encoding and what eventreads adds for it


@pytest.mark.parametrize("use_cache", [False, True], ids=["read", "cached"])
def test_the_page_holds_what_max_page_bytes_leaves_beside_the_state(tmp_path: Path, use_cache: bool) -> None:
    with Store(StoreConfig(data_dir=tmp_path)) as store:
        store.put("s", b"s" * 1000)
        store.append_events("s", [NewEvent("msg", b"%02d" % i + b"e" * 98) for i in range(10)])
        store.get("s")  # the state cached
        both = store.get_with_events("s", events=EventQuery(), use_cache=use_cache, max_page_bytes=1500)
        assert 0 < len(both.events.events) < 10 and both.events.next_page_token
        assert 1000 + _page_bytes(both.events.events) <= 1500
        rest = store.read_events("s", EventQuery(page_token=both.events.next_page_token), max_page_bytes=1500)
        assert [e.seq for e in (*both.events.events, *rest.events)] == list(range(1, 11))
        assert not rest.next_page_token


@pytest.mark.parametrize("newest_first", [False, True], ids=["oldest-first", "newest-first"])
def test_an_event_that_does_not_fit_beside_the_state_leaves_the_page_empty_with_a_token_to_it(
    tmp_path: Path, newest_first: bool
) -> None:
    with Store(StoreConfig(data_dir=tmp_path)) as store:
        store.put("s", b"s" * 1400)
        store.append_events("s", [NewEvent("msg", b"a" * 200), NewEvent("msg", b"b" * 200)])
        query = EventQuery(newest_first=newest_first)
        both = store.get_with_events("s", events=query, max_page_bytes=1500)
        assert both.got.state == b"s" * 1400
        assert both.events.events == [] and both.events.next_page_token
        # read_events carries it: a page holds one event at least, even one over max_page_bytes.
        page = store.read_events(
            "s", EventQuery(newest_first=newest_first, page_token=both.events.next_page_token), max_page_bytes=150
        )
        assert [e.seq for e in page.events] == ([2] if newest_first else [1]) and page.next_page_token
        # Without a limit (0), the page is not cut.
        assert len(store.get_with_events("s", events=query).events.events) == 2


def test_a_page_token_is_refused_on_a_session_with_versions_and_no_events(tmp_path: Path) -> None:
    with Store(StoreConfig(data_dir=tmp_path)) as store:
        store.put("s", b"state")
        store.append_events("other", [NewEvent("msg"), NewEvent("msg")])
        issued = store.read_events("other", EventQuery(page_size=1)).next_page_token
        with pytest.raises(InvalidArgument, match=r"^events\.page_token 'nope' is not a token"):
            store.get_with_events("s", events=EventQuery(page_token="nope"))
        with pytest.raises(InvalidArgument, match=r"^events\.page_token '.*' was issued for another listing"):
            store.get_with_events("s", events=EventQuery(page_size=1, page_token=issued))
