"""The head a saver put or read last, read again from what the saver holds of it (sidecar/langgraph/views.py):
not parsed again, and read back as InMemorySaver reads it after every step (the values the saver wrote,
merged onto the head it continued as the store merges them); the bytes it holds bounded; values read in one
msgpack call only with LangGraph's own serializer."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from ckpt.sidecar.client import CheckpointClient
from ckpt.sidecar.langgraph import CkptSaver, operations
from ckpt.sidecar.langgraph.records import Where, decode_step, where_of
from ckpt.sidecar.langgraph.views import HeadViews, View, loads_all, view_of
from tests.langgraph.test_saver_against_memory import comparable, replay, writes
from tests.langgraph.test_saver_sidecar import put, thread
from tests.support import Sidecar, start_sidecar

_threads = itertools.count()
# Elements of every type the serializer tags apart: msgpack, "bytes", "null".
elements = st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=6), st.binary(max_size=6), st.none())
values = st.one_of(
    st.integers(-(2**63), 2**63 - 1), st.text(max_size=8), st.binary(max_size=4), st.lists(elements, max_size=20)
)
steps = st.lists(
    st.tuples(
        st.one_of(st.just(-1), st.just(-1), st.integers(0, 30)),
        st.dictionaries(st.sampled_from(("a", "b", "messages")), st.one_of(st.none(), values), max_size=3),
        st.booleans(),
        writes,
    ),
    min_size=1,
    max_size=16,
)


@pytest.fixture(scope="module")
def saver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CkptSaver]:
    with CkptSaver.embedded(tmp_path_factory.mktemp("lg") / "data") as s:
        yield s


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=steps)
def test_the_latest_checkpoint_read_after_every_step_matches_in_memory_saver(
    saver: CkptSaver, history: list[Any]
) -> None:
    oracle = InMemorySaver()
    thread_id = f"views-{next(_threads)}"
    config: Any = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    sid = Where(thread_id, "").session_id

    def latest_matches() -> None:
        # What the saver holds of the head it just put is what a read of the stored state makes.
        held = saver._ops._views._kept.get(sid)
        if held is not None:
            got = saver._backend.store.get(sid)
            assert (held.version, held.state_xxh3) == (got.version, got.info.state_xxh3)
            assert held.view == view_of(decode_step(got.state))
        assert comparable(saver.get_tuple(config)) == comparable(oracle.get_tuple(config))

    replay([saver, oracle], thread_id, history, latest_matches)


class _Parses:
    """Counts the Steps the saver's operations parse."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0

        def counted(state: bytes) -> Any:
            self.count += 1
            return decode_step(state)

        monkeypatch.setattr(operations, "decode_step", counted)

    def of(self, saver: CkptSaver, config: Any) -> tuple[int, Any]:
        before = self.count
        found = saver.get_tuple(config)
        return self.count - before, comparable(found)


def test_a_head_the_saver_put_or_read_last_is_not_parsed_again(
    sidecar: Sidecar, monkeypatch: pytest.MonkeyPatch
) -> None:
    parses = _Parses(monkeypatch)
    with CkptSaver(sidecar.unix_target) as a, CkptSaver(sidecar.unix_target) as b:
        config = thread("t")
        for step in range(5):
            config = put(a, config, {"messages": [f"m{i}" for i in range(step + 1)], "n": step}, step)
        a.put_writes(config, [("n", "pending")], "task-1")
        latest = thread("t")
        parsed, mine = parses.of(a, latest)
        assert parsed == 0  # the head it put
        assert mine[1]["channel_values"] == {"messages": ["m0", "m1", "m2", "m3", "m4"], "n": 4}
        assert mine[4] == [("task-1", "n", "pending")]
        assert parses.of(b, latest) == (1, mine)  # a saver that never saw it parses it once
        assert parses.of(b, latest) == (0, mine)  # then holds it
        moved = put(b, config, {"messages": ["m0", "x"], "n": 9}, 5)  # b moves the head: a reads it whole
        parsed, theirs = parses.of(a, latest)
        assert parsed == 1 and theirs[0]["checkpoint_id"] == moved["configurable"]["checkpoint_id"]
        assert theirs[1]["channel_values"] == {"messages": ["m0", "x"], "n": 9}
        assert parses.of(b, latest) == (0, theirs)


def _view(size: int) -> View:
    return View("c", "", ("msgpack", b"\x80"), ("msgpack", b"\x80"), {}, {}, 0, size)


def test_head_views_hold_at_most_their_bytes_the_least_recently_used_dropped_first() -> None:
    views = HeadViews(max_bytes=2000)
    views.put("s1", 1, 11, _view(1000))
    views.put("s2", 1, 12, _view(1000))
    assert views.get("s1", 1, 11) is not None  # s1 used last: s2 goes first
    views.put("s3", 1, 13, _view(1000))
    assert views.get("s2", 1, 12) is None and views.get("s1", 1, 11) is not None
    assert views.get("s3", 1, 13) is not None
    assert views.get("s3", 2, 13) is None and views.get("s3", 1, 14) is None  # another version or state
    views.put("s4", 1, 0, _view(10))  # no digest (an old sidecar): the version alone may be another's
    assert views.get("s4", 1, 0) is None
    views.put("s5", 1, 15, _view(10_000))  # heavier than them all: not held, and nothing dropped for it
    assert views.get("s5", 1, 15) is None and views.get("s1", 1, 11) is not None


class _Tagged(JsonPlusSerializer):
    """A serializer reading values its own way (a dict, a checkpoint's or its metadata, as it is): each one
    is handed to it alone."""

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        value = super().loads_typed(data)
        return value if isinstance(value, dict) else ("mine", value)


@pytest.mark.parametrize("count", [1, 15, 16, 65_536])  # msgpack's array headers: fixarray, array 16, array 32
def test_values_read_together_are_each_as_read_alone(count: int) -> None:
    serde = JsonPlusSerializer()
    mixed = [serde.dumps_typed(v) for v in ([1, "two", b"three", None, {"four": [4]}, bytearray(b"5")] * count)[:count]]
    assert loads_all(serde, mixed) == [serde.loads_typed(p) for p in mixed]
    tagged = _Tagged()
    assert loads_all(tagged, mixed[:20]) == [tagged.loads_typed(p) for p in mixed[:20]]
    assert ("mine", 1) in loads_all(tagged, mixed[:20])


def test_a_saver_with_its_own_serializer_reads_every_value_with_it(tmp_path: Path) -> None:
    with CkptSaver.embedded(tmp_path / "data", serde=_Tagged()) as saver:
        put(saver, thread("t"), {"messages": ["a", "b"], "n": 1}, 0)
        found = saver.get_tuple(thread("t"))
        assert found is not None
        assert found.checkpoint["channel_values"] == {"messages": [("mine", "a"), ("mine", "b")], "n": ("mine", 1)}


def test_a_head_folded_while_the_thread_was_quiet_is_read_in_one_call_without_its_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A quiet fold stores the head compacted (the same Step in other bytes, another XXH3-64). The sidecar
    still leaves the state out for the digest the saver's put answered; the saver then took the reply for
    another head and read it again, whole: two calls and a parse at the moment a paused thread resumes."""
    sidecar = start_sidecar(tmp_path / "data", "--fold-after-quiet-seconds", "1", "--sweep-interval-seconds", "1")
    parses = _Parses(monkeypatch)
    try:
        with CkptSaver(sidecar.unix_target) as saver:
            config = thread("quiet")
            for step in range(12):  # each step replaces the last one's checkpoint: a fold drops those
                config = put(saver, config, {"messages": [f"m{i}" for i in range(step + 1)], "n": step}, step)
            sid = where_of(thread("quiet")).session_id
            written = saver._ops._heads[sid].state_xxh3
            with CheckpointClient(sidecar.unix_target) as client:
                deadline = time.monotonic() + 30
                while client.get(sid).info.state_xxh3 == written:
                    assert time.monotonic() < deadline, "the head was never folded"
                    time.sleep(0.2)
            calls: list[str] = []
            backend: Any = saver._backend
            for name in ("get", "get_events", "events"):
                monkeypatch.setattr(backend, name, _counted(calls, name, getattr(backend, name)))
            parsed, found = parses.of(saver, thread("quiet"))
            assert (calls, parsed) == (["get_events"], 0)
            assert found[1]["channel_values"] == {"messages": [f"m{i}" for i in range(12)], "n": 11}
            calls.clear()
            put(saver, config, {"messages": [f"m{i}" for i in range(13)], "n": 12}, 12)  # its compare-and-set holds
            assert parses.of(saver, thread("quiet"))[1][1]["channel_values"]["n"] == 12
    finally:
        assert sidecar.stop() == 0, sidecar.log()


def _counted(calls: list[str], name: str, call: Any) -> Any:
    def counted(*args: Any) -> Any:
        calls.append(name)
        return call(*args)

    return counted


def test_an_embedded_read_of_the_head_the_saver_holds_copies_no_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process the state is left out as the sidecar leaves it out: the store's cache says whether the
    state the saver holds is the head's, and the pending writes are read; no state is copied out of it."""
    with CkptSaver.embedded(tmp_path / "data") as saver:
        config = put(saver, thread("held"), {"messages": ["a", "b"], "n": 1}, 0)
        saver.put_writes(config, [("n", 2)], "task-1")
        put(saver, thread("other"), {"n": 5}, 0)
        store: Any = saver._backend.store

        def refused(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("the held head's state was read")

        with monkeypatch.context() as patched:
            for name in ("get", "get_with_events", "_cached"):
                patched.setattr(store, name, refused)
            found = saver.get_tuple(thread("held"))
        assert found is not None
        assert found.checkpoint["channel_values"] == {"messages": ["a", "b"], "n": 1}
        assert found.pending_writes == [("task-1", "n", 2)]
        # A head the cache no longer holds (evicted, or another process's) is read whole, as before.
        store._states.clear()
        again = saver.get_tuple(thread("held"))
        assert again is not None and again.pending_writes == [("task-1", "n", 2)]
        assert again.checkpoint["channel_values"] == found.checkpoint["channel_values"]
