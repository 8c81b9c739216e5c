"""The event log record's last seq of each type: a read filtered by types stops there, and a read after it
decompresses nothing; a log that cannot keep it (too many types, or appended to by a build that did not)
is read in full, and verify reports a bound below an event of its type."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import lmdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt.sidecar import EventQuery, NewEvent, Store, StoreConfig
from ckpt.sidecar.errors import ResourceExhausted
from ckpt.sidecar.store import ReadBound
from ckpt.sidecar.store.eventlog import MAX_TRACKED_TYPES
from ckpt.store.v1 import records_pb2
from tests.support import ckpt

#: A read that may not visit a single block: it succeeds only if the log's record answers it alone.
NO_BLOCK = ReadBound(max_blocks=0, max_raw_bytes=0, max_events=1000)


def _seqs(store: Store, session: str, bound: ReadBound | None = None, **query: object) -> list[int]:
    page = store.read_events(session, EventQuery(**query), bound=bound)  # type: ignore[arg-type]
    return [e.seq for e in page.events]


def _edit_log(data_dir: Path, session: bytes, edit: Callable[[records_pb2.EventLogRecord], None]) -> None:
    env = lmdb.open(str(data_dir / "lmdb"), max_dbs=32)
    with env.begin(write=True) as txn:
        logs = env.open_db(b"event_logs", txn=txn)
        raw = txn.get(session, db=logs)
        assert raw is not None
        log = records_pb2.EventLogRecord.FromString(raw)
        edit(log)
        txn.put(session, log.SerializeToString(), db=logs)
    env.close()


def test_a_read_past_a_types_last_event_decompresses_nothing(tmp_path: Path) -> None:
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        store.append_events("s", [NewEvent("writes", b"w1"), NewEvent("marker", b"m1")])
        store.append_events("s", [NewEvent("marker", b"m2")] * 3)
        # The saver's read: its checkpoint's writes after the marker it put.
        assert _seqs(store, "s", NO_BLOCK, types=("writes",), after_seq=1) == []
        assert _seqs(store, "s", NO_BLOCK, types=("never",)) == []
        with pytest.raises(ResourceExhausted, match="max_blocks"):  # a read with events to find visits blocks
            _seqs(store, "s", NO_BLOCK, types=("writes",))
        assert _seqs(store, "s", types=("writes",)) == [1]
        assert _seqs(store, "s", types=("writes", "marker"), after_seq=1) == [2, 3, 4, 5]
        assert _seqs(store, "s", types=("writes",), newest_first=True) == [1]
        store.append_events("s", [NewEvent("writes", b"w2")])
        assert _seqs(store, "s", types=("writes",), after_seq=1) == [6]


def test_a_log_with_more_types_than_kept_is_read_in_full(tmp_path: Path) -> None:
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        store.append_events("s", [NewEvent(f"t{i}") for i in range(MAX_TRACKED_TYPES)])
        assert _seqs(store, "s", NO_BLOCK, types=("t0",), after_seq=1) == []
        store.append_events("s", [NewEvent("one-too-many")])
        with pytest.raises(ResourceExhausted, match="max_blocks"):
            _seqs(store, "s", NO_BLOCK, types=("t0",), after_seq=1)
        assert _seqs(store, "s", types=("t0",)) == [1]
        assert _seqs(store, "s", types=("one-too-many",)) == [MAX_TRACKED_TYPES + 1]
    assert ckpt("verify", "--data-dir", str(tmp_path / "data")).returncode == 0


@pytest.mark.parametrize("types_next_seq", [0, 2], ids=["never-kept", "left-behind"])
def test_a_log_whose_bounds_were_not_kept_is_read_in_full_for_good(tmp_path: Path, types_next_seq: int) -> None:
    """0: a log an older build began (it has no bounds); 2: one an older build appended seq 3 to."""
    config = StoreConfig(data_dir=tmp_path / "data")
    with Store(config) as store:
        store.append_events("s", [NewEvent("writes"), NewEvent("marker"), NewEvent("writes")])
    _edit_log(config.data_dir, b"s", lambda log: setattr(log, "types_next_seq", types_next_seq))
    with Store(config) as store:
        with pytest.raises(ResourceExhausted, match="max_blocks"):
            _seqs(store, "s", NO_BLOCK, types=("marker",), after_seq=2)
        store.append_events("s", [NewEvent("writes")])  # this build's append does not take them up again
        with pytest.raises(ResourceExhausted, match="max_blocks"):
            _seqs(store, "s", NO_BLOCK, types=("marker",), after_seq=2)
        assert _seqs(store, "s", types=("writes",)) == [1, 3, 4]
    assert ckpt("verify", "--data-dir", str(config.data_dir)).returncode == 0


def test_verify_reports_a_bound_below_an_event_of_its_type(tmp_path: Path) -> None:
    config = StoreConfig(data_dir=tmp_path / "data")
    with Store(config) as store:
        store.append_events("s", [NewEvent("writes"), NewEvent("marker"), NewEvent("writes")])
    assert ckpt("verify", "--data-dir", str(config.data_dir)).returncode == 0
    _edit_log(config.data_dir, b"s", lambda log: log.last_seq_by_type.__setitem__("writes", 1))
    verify = ckpt("verify", "--data-dir", str(config.data_dir))
    assert verify.returncode == 1
    assert "event seq 3: an event of type 'writes' lies past the last seq" in verify.stderr.decode()


@settings(max_examples=40, deadline=None)
@given(
    appends=st.lists(st.lists(st.sampled_from(("a", "b", "c")), min_size=1, max_size=5), min_size=1, max_size=12),
    types=st.lists(st.sampled_from(("a", "b", "c", "never")), min_size=1, max_size=2, unique=True),
    after_seq=st.integers(0, 70),
    newest_first=st.booleans(),
)
def test_filtered_reads_match_a_plain_list(
    tmp_path_factory: pytest.TempPathFactory, appends: list[list[str]], types: list[str], after_seq: int,
    newest_first: bool,
) -> None:  # fmt: skip
    logged: list[tuple[int, str]] = []
    with Store(StoreConfig(data_dir=tmp_path_factory.mktemp("bounds") / "data")) as store:
        for names in appends:
            store.append_events("s", [NewEvent(n) for n in names])
            logged += [(len(logged) + 1 + i, n) for i, n in enumerate(names)]
        expected = [seq for seq, n in logged if n in types and seq > after_seq]
        got = _seqs(store, "s", types=tuple(types), after_seq=after_seq, newest_first=newest_first, page_size=1000)
        assert got == (expected[::-1] if newest_first else expected)
