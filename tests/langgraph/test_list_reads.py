"""What the saver's ``list`` reads through a real sidecar: a page of a namespace's history with its states
per call, not a Get per checkpoint; nothing newer than ``before`` and nothing past ``limit``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ckpt.sidecar.client import CheckpointClient
from ckpt.sidecar.langgraph import CkptSaver
from ckpt.sidecar.langgraph.backends import HISTORY_PAGE_SIZE, ClientBackend
from ckpt.sidecar.langgraph.calls import Call, Out
from tests.langgraph.test_saver_sidecar import put, thread
from tests.support import Sidecar

STEPS = 130  # more than a page of history


class Recording(ClientBackend):
    """The saver's backend on a client, keeping every call made of it."""

    def __init__(self, client: CheckpointClient) -> None:
        super().__init__(client)
        self.calls: list[Call] = []

    def __getattribute__(self, name: str) -> Any:
        attr = super().__getattribute__(name)
        if name in ("get", "get_events", "history", "versions", "events", "sessions"):
            calls = super().__getattribute__("calls")

            def recorded(*args: Any) -> Any:
                calls.append(Call(name, args))
                return attr(*args)

            return recorded
        return attr


def listed(saver: CkptSaver, backend: Recording, *args: Any) -> list[str]:
    """``saver.list(*args)``'s checkpoint ids, its store calls made on ``backend``."""
    op = saver._ops.list(*args)  # the saver's own operation, driven on the recording backend
    out: list[str] = []
    answer = None
    while True:
        try:
            step = op.send(answer)
        except StopIteration:
            return out
        answer = None
        if isinstance(step, Out):
            out.append(step.item.config["configurable"]["checkpoint_id"])
        else:
            answer = getattr(backend, step.method)(*step.args)


@pytest.fixture
def written(sidecar: Sidecar) -> Iterator[tuple[CkptSaver, Recording, list[str], list[str]]]:
    """A thread of STEPS checkpoints in its root namespace and 5 in a child's; their ids, newest first."""
    with CkptSaver(sidecar.unix_target) as saver, CheckpointClient(sidecar.unix_target) as client:
        root: list[str] = []
        child: list[str] = []
        config = thread("t")
        for step in range(STEPS):
            config = put(saver, config, {"n": step, "log": ["x" * 50] * (step % 7)}, step)
            root.insert(0, config["configurable"]["checkpoint_id"])
        sub = thread("t", "child")
        for step in range(5):
            sub = put(saver, sub, {"m": step}, step)
            child.insert(0, sub["configurable"]["checkpoint_id"])
        yield saver, Recording(client), root, child


def test_the_whole_history_is_read_a_page_per_call(written: tuple[CkptSaver, Recording, list[str], list[str]]) -> None:
    saver, backend, root, child = written
    assert listed(saver, backend, thread("t"), None, None, None) == root
    assert [c.method for c in backend.calls].count("get") == 1  # the head's ids, masked
    assert next(c for c in backend.calls if c.method == "get").args[1] == 0
    pages = [c.args[1:] for c in backend.calls if c.method == "history"]  # (start_version, page_size)
    assert pages == [(STEPS, HISTORY_PAGE_SIZE), (STEPS - HISTORY_PAGE_SIZE, STEPS - HISTORY_PAGE_SIZE)]
    # Every namespace of the thread: the child's too, newest first by id across both.
    backend.calls.clear()
    both = listed(saver, backend, {"configurable": {"thread_id": "t"}}, None, None, None)
    assert both == sorted(root + child, reverse=True)
    assert [c.method for c in backend.calls].count("history") == 3  # two pages of the root's, one of the child's


def test_a_limit_and_before_read_no_state_the_list_skips(
    written: tuple[CkptSaver, Recording, list[str], list[str]],
) -> None:
    saver, backend, root, _ = written
    assert listed(saver, backend, thread("t"), None, None, 3) == root[:3]
    assert [c.args[1:] for c in backend.calls if c.method == "history"] == [(STEPS, 3)]
    backend.calls.clear()
    before = thread("t", checkpoint_id=root[40])  # versions STEPS - 40 and newer are skipped
    assert listed(saver, backend, thread("t"), None, before, 5) == root[41:46]
    assert [c.args[1:] for c in backend.calls if c.method == "history"] == [(STEPS - 41, 5)]
    backend.calls.clear()
    assert listed(saver, backend, thread("t", checkpoint_id=root[7]), None, None, None) == [root[7]]
    assert [c.args[1:] for c in backend.calls if c.method == "history"] == [(STEPS - 7, 1)]
    # A filter the labels cannot answer: pages go on until the limit is met.
    backend.calls.clear()
    odd = {"step": 1}
    assert listed(saver, backend, thread("t"), odd, None, 2) == [root[-2]]
    sizes = [c.args[2] for c in backend.calls if c.method == "history"]
    assert sizes == [2, 4, 8, 16, 32, 64, 4]  # growing, not the limit's size each; the last: what is left
