"""The event log against a plain list: random appends, retention sweeps and filtered, paged reads."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from ckpt.sidecar import EventQuery, NewEvent, Retention, Store, StoreConfig
from ckpt.sidecar.tools.crosscheck import CrossCheck

TYPES = ("tool", "msg", "decision")
SECOND = 1_000_000_000


@dataclass(frozen=True)
class Logged:
    seq: int
    type: str
    payload: bytes
    nanos: int


events_st = st.lists(
    st.builds(
        lambda t, size, when: NewEvent(t, b"p" * size, {"n": str(size)}, when * SECOND),
        st.sampled_from(TYPES),
        st.sampled_from((0, 10, 3000, 20000)),  # some fill a block by bytes before SEAL_EVENTS
        st.integers(0, 100),
    ),
    min_size=0,
    max_size=400,
)

#: Appends of an event or two, as an agent makes them: onto the open block's tail, folded into the block.
small_appends_st = st.lists(
    st.lists(
        st.builds(
            lambda t, payload, when: NewEvent(t, payload, {}, when * SECOND),
            st.sampled_from(TYPES),
            st.binary(max_size=400),  # incompressible: a few fill a tail
            st.integers(0, 100),
        ),
        min_size=1,
        max_size=2,
    ),
    max_size=40,
)


def _ordered(query: dict[str, Any]) -> bool:
    """Swapped time bounds are refused (test_event_log.py), not read."""
    low, high = query["after_unix_nanos"], query["before_unix_nanos"]
    return low is None or high is None or bool(low <= high)


reads_st: st.SearchStrategy[dict[str, Any]] = st.fixed_dictionaries(
    {
        "after_seq": st.integers(0, 800),
        "types": st.lists(st.sampled_from(TYPES), max_size=2).map(tuple),
        "after_unix_nanos": st.none() | st.integers(0, 100).map(lambda s: s * SECOND),
        "before_unix_nanos": st.none() | st.integers(0, 100).map(lambda s: s * SECOND + 1),
        "newest_first": st.booleans(),
        "page_size": st.sampled_from((0, 1, 7, 1000)),
    }
).filter(_ordered)
ops_st = st.lists(
    st.one_of(
        st.tuples(st.just("append"), events_st),
        st.tuples(st.just("appends"), small_appends_st),
        st.tuples(st.just("sweep"), st.integers(0, 100)),
        st.tuples(st.just("read"), reads_st),
    ),
    max_size=12,
)


def expected_read(log: list[Logged], query: dict[str, object]) -> list[int]:
    types = query["types"]
    low, high = query["after_unix_nanos"], query["before_unix_nanos"]
    seqs = [
        e.seq
        for e in log
        if e.seq > query["after_seq"]  # type: ignore[operator]
        and (not types or e.type in types)  # type: ignore[operator]
        and (low is None or e.nanos > low)  # type: ignore[operator]
        and (high is None or e.nanos < high)  # type: ignore[operator]
    ]
    return seqs[::-1] if query["newest_first"] else seqs


def read_all(store: Store, query: dict[str, object]) -> list[Logged]:
    out: list[Logged] = []
    token = ""
    size = query["page_size"] or 100
    while True:
        page = store.read_events("s", EventQuery(page_token=token, **query))  # type: ignore[arg-type]
        assert len(page.events) <= size  # type: ignore[operator]
        out += [Logged(e.seq, e.type, e.payload, e.time.ToNanoseconds()) for e in page.events]
        token = page.next_page_token
        if not token:
            return out


@given(keep=st.sampled_from((0, 5, 300)), age=st.sampled_from((0, 30)), ops=ops_st)
def test_the_log_reads_as_a_list_appended_to_and_cut_at_the_front(keep: int, age: int, ops: list[Any]) -> None:
    retention = Retention(keep_last_events=keep, max_event_age_seconds=age)
    with tempfile.TemporaryDirectory() as tmp:
        config = StoreConfig(data_dir=Path(tmp), retention=retention, sweep_interval_seconds=3600)
        log: list[Logged] = []
        next_seq = 1
        with Store(config) as store:
            for kind, arg in ops:
                if kind in ("append", "appends"):
                    for events in arg if kind == "appends" else [arg]:
                        if not events:
                            continue  # an append of nothing is refused (test_event_log.py)
                        assert store.append_events("s", events).first_seq == next_seq
                        for e in events:
                            log.append(Logged(next_seq, e.type, e.payload, e.time_unix_nanos))
                            next_seq += 1
                elif kind == "sweep":
                    now = (arg + age) * SECOND  # events older than `arg` seconds are past max_event_age
                    before = len(log)
                    cut = log[-keep].seq if keep and len(log) > keep else (log[0].seq if log else next_seq)
                    kept = [e for e in log if e.seq >= cut]
                    if age:  # the front of the log while it is older than the cutoff
                        while kept and kept[0].nanos < now - age * SECOND:
                            kept.pop(0)
                    log = kept
                    if next_seq > 1:
                        assert store.sweep(now_nanos=now).events_removed == before - len(log)
                elif next_seq > 1:
                    got = read_all(store, arg)
                    assert [e.seq for e in got] == expected_read(log, arg)
                    by_seq = {e.seq: e for e in log}
                    assert all(e == by_seq[e.seq] for e in got)
            if next_seq > 1:
                everything = {"after_seq": 0, "types": (), "after_unix_nanos": None, "before_unix_nanos": None}
                assert read_all(store, {**everything, "newest_first": False, "page_size": 0}) == log
                with store.read() as txn:
                    assert list(CrossCheck(store, txn, None).run("events")) == []
