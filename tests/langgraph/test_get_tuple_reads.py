"""What the saver's ``get_tuple`` of the latest checkpoint reads through a real sidecar: the head and its
pending writes in one call when the saver put (or read) that head, two when another saver moved it or the
saver never saw the namespace; the pending writes right either way."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from ckpt.sidecar.client import CheckpointClient
from ckpt.sidecar.langgraph import CkptSaver, backends
from ckpt.sidecar.langgraph.calls import Call
from ckpt.v1 import service_pb2
from tests.langgraph.test_list_reads import Recording
from tests.langgraph.test_saver_against_memory import comparable
from tests.langgraph.test_saver_sidecar import put, thread
from tests.support import Sidecar


def read_latest(saver: CkptSaver, backend: Recording, thread_id: str) -> tuple[Any, list[str]]:
    """``saver.get_tuple`` of the thread's latest checkpoint, driven on ``backend``, and the calls it made."""
    backend.calls.clear()
    op = saver._ops.get_tuple(thread(thread_id))  # the saver's own operation and memory
    answer = None
    while True:
        try:
            step = op.send(answer)
        except StopIteration as done:
            return done.value, [c.method for c in backend.calls]
        assert isinstance(step, Call)  # get_tuple yields calls only
        answer = getattr(backend, step.method)(*step.args)


def _pending(found: Any) -> list[tuple[str, str, Any]]:
    return sorted(found.pending_writes)


@contextmanager
def _two_writers_and_a_reader(sidecar: Sidecar) -> Iterator[tuple[CkptSaver, CkptSaver, CkptSaver, Recording]]:
    """Savers ``a`` and ``b`` that write, ``fresh`` that only reads, and a recording backend to drive them on."""
    with (
        CkptSaver(sidecar.unix_target) as a,
        CkptSaver(sidecar.unix_target) as b,
        CkptSaver(sidecar.unix_target) as fresh,
        CheckpointClient(sidecar.unix_target) as client,
    ):
        yield a, b, fresh, Recording(client)


def test_one_call_after_its_own_put_and_two_after_another_saver_moved_the_head(sidecar: Sidecar) -> None:
    with _two_writers_and_a_reader(sidecar) as (a, b, fresh, backend):
        config = thread("t")
        for step in range(3):
            config = put(a, config, {"n": step}, step)
        a.put_writes(config, [("n", "pending"), ("log", "x")], "task-1")
        found, calls = read_latest(a, backend, "t")
        assert calls == ["get_events"]
        assert found.config["configurable"]["checkpoint_id"] == config["configurable"]["checkpoint_id"]
        assert _pending(found) == [("task-1", "log", "x"), ("task-1", "n", "pending")]
        assert _pending(found) == _pending(fresh.get_tuple(thread("t")))  # a saver that reads it in two calls
        again, calls = read_latest(a, backend, "t")
        assert calls == ["get_events"] and _pending(again) == _pending(found)

        # A saver that never saw the namespace reads it in two calls, then in one.
        with CkptSaver(sidecar.unix_target) as newcomer:
            first, calls = read_latest(newcomer, backend, "t")
            assert calls == ["get", "events"] and _pending(first) == _pending(found)
            _, calls = read_latest(newcomer, backend, "t")
            assert calls == ["get_events"]

        # Another saver moves the head: the one call's events are not used; the writes are read after it.
        moved = put(b, config, {"n": 99}, 3)
        b.put_writes(moved, [("n", "b's write")], "task-2")
        found, calls = read_latest(a, backend, "t")
        assert calls == ["get_events", "events"]
        assert found.config["configurable"]["checkpoint_id"] == moved["configurable"]["checkpoint_id"]
        assert _pending(found) == [("task-2", "n", "b's write")]
        # Now it has seen that head: one call again.
        found, calls = read_latest(a, backend, "t")
        assert calls == ["get_events"] and _pending(found) == [("task-2", "n", "b's write")]


def test_a_cut_page_is_read_on_from_its_token(sidecar: Sidecar, monkeypatch: pytest.MonkeyPatch) -> None:
    with CkptSaver(sidecar.unix_target) as saver, CheckpointClient(sidecar.unix_target) as client:
        backend = Recording(client)
        config = put(saver, thread("t"), {"n": 0}, 0)
        for i in range(5):
            saver.put_writes(config, [("n", i)], f"task-{i}")
        monkeypatch.setattr(backends, "PAGE_SIZE", 2)
        found, calls = read_latest(saver, backend, "t")
        assert calls == ["get_events", "events"]
        token = backend.calls[1].args[3]
        assert token  # the rest of the page read from its token
        assert _pending(found) == sorted((f"task-{i}", "n", i) for i in range(5))


def test_a_reply_without_events_is_no_page_and_the_writes_are_read_after_it() -> None:
    """A sidecar that predates GetRequest.events answers the state alone: not an empty page of writes."""
    info = service_pb2.VersionInfo(state_xxh3=7)
    state_only = service_pb2.GetResponse(version=3, state=b"s", info=info)
    assert backends._head_and_events(state_only) == (3, b"s", 7, None, "")
    empty_page = service_pb2.GetResponse(version=3, state=b"s", info=info, events=service_pb2.ReadEventsResponse())
    assert backends._head_and_events(empty_page) == (3, b"s", 7, [], "")


def _driven(saver: CkptSaver, backend: Recording, thread_id: str, *, drop_view: bool = False) -> tuple[Any, list[Any]]:
    """``read_latest``, with the reply of each call kept beside it; ``drop_view``: the saver's view of the
    head is dropped as soon as a reply without the state comes (as another thread's head pushes it out)."""
    backend.calls.clear()
    op = saver._ops.get_tuple(thread(thread_id))
    answer: Any = None
    replies: list[Any] = []
    while True:
        try:
            step = op.send(answer)
        except StopIteration as done:
            return done.value, replies
        assert isinstance(step, Call)  # get_tuple yields calls only
        answer = getattr(backend, step.method)(*step.args)
        replies.append(answer)
        if drop_view and step.method == "get_events" and answer is not None and answer[1] is None:
            saver._ops._views.forget(step.args[0])


def test_the_head_it_holds_is_not_sent_again(sidecar: Sidecar) -> None:
    with _two_writers_and_a_reader(sidecar) as (a, b, fresh, backend):
        config = thread("held")
        for step in range(3):
            config = put(a, config, {"n": step, "text": "x" * 5000}, step)
        a.put_writes(config, [("n", "pending")], "task-1")
        expected = comparable(fresh.get_tuple(thread("held")))

        # After its own put: the state's XXH3-64 named as known, and the reply leaves the state out.
        found, replies = _driven(a, backend, "held")
        [call] = backend.calls
        assert call.method == "get_events" and call.args[3] == replies[0][2] != 0
        assert replies[0][1] is None
        assert comparable(found) == expected

        # Its view dropped between the call and the reply: asked again, the state whole this time.
        found, replies = _driven(a, backend, "held", drop_view=True)
        assert [(c.method, c.args[3]) for c in backend.calls] == [("get_events", replies[0][2]), ("get_events", None)]
        assert replies[0][1] is None and replies[1][1] is not None
        assert comparable(found) == expected

        # Another saver moved the head: the state held is not the head's, which comes whole.
        moved = put(b, config, {"n": 99, "text": "y" * 5000}, 3)
        found, replies = _driven(a, backend, "held")
        assert backend.calls[0].args[3] is not None and replies[0][1] is not None
        assert found.config["configurable"]["checkpoint_id"] == moved["configurable"]["checkpoint_id"]
        assert found.checkpoint["channel_values"]["text"] == "y" * 5000
        # Read once, held: left out from then on.
        _, replies = _driven(a, backend, "held")
        assert replies[0][1] is None
