"""A thread's history (``list``, what ``get_state_history`` reads) deserializes each list element once: a
message a later checkpoint still holds at the same place is the object read for the first checkpoint listed
that holds it, not read again per checkpoint. Listed values match InMemorySaver's, an element changed at
its place included; a listing's checkpoints share their common elements, another listing reads its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from ckpt.sidecar.langgraph import CkptSaver
from tests.langgraph.test_saver_sidecar import put, thread
from tests.support import Sidecar

STEPS = 40


class CountingSerializer(JsonPlusSerializer):
    """LangGraph's serializer, counting the values it reads (its own ``loads_typed``: one value a call)."""

    def __init__(self) -> None:
        super().__init__()
        self.loads = 0

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        self.loads += 1
        return super().loads_typed(data)


@pytest.fixture(params=["embedded", "sidecar"])
def saver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CkptSaver]:
    serde = CountingSerializer()
    if request.param == "embedded":
        with CkptSaver.embedded(tmp_path / "embedded", serde=serde) as s:
            yield s
        return
    sidecar: Sidecar = request.getfixturevalue("sidecar")
    with CkptSaver(sidecar.unix_target, serde=serde) as s:
        yield s


def conversation(n: int) -> list[Any]:
    return [
        HumanMessage(f"question {i}", id=f"h{i}") if i % 2 == 0 else AIMessage(f"answer {i}", id=f"a{i}")
        for i in range(n)
    ]


def write_thread(saver: Any, thread_id: str) -> None:
    """STEPS checkpoints, each adding a message; the 30th rewrites the first message in its place."""
    config = thread(thread_id)
    messages = conversation(STEPS)
    for n in range(1, STEPS + 1):
        if n == 30:
            messages[0] = HumanMessage("question 0, edited", id="h0")
        config = put(saver, config, {"messages": messages[:n], "turn": n}, n)


def values(saver: Any, thread_id: str) -> list[dict[str, Any]]:
    return [t.checkpoint["channel_values"] for t in saver.list(thread(thread_id))]


def test_a_history_reads_each_message_once_and_matches_in_memory_saver(saver: CkptSaver) -> None:
    write_thread(saver, "t")
    memory = InMemorySaver()
    write_thread(memory, "t")
    serde = saver.serde
    assert isinstance(serde, CountingSerializer)
    serde.loads = 0
    listed = values(saver, "t")
    assert listed == values(memory, "t")
    assert [v["messages"][0].content for v in listed][:12] == ["question 0, edited"] * 11 + ["question 0"]
    # Per checkpoint its checkpoint, its metadata and its "turn" value, plus each message once (the first
    # message twice: as edited, and as it was): O(checkpoints + messages). Read again per checkpoint, the
    # messages alone were STEPS * (STEPS + 1) / 2 = 820 reads.
    assert serde.loads == 3 * STEPS + STEPS + 1


def test_a_listings_checkpoints_share_their_common_elements_and_another_listing_reads_its_own(
    saver: CkptSaver,
) -> None:
    write_thread(saver, "t")
    newest, older = list(saver.list(thread("t"), limit=2))
    first = newest.checkpoint["channel_values"]["messages"]
    second = older.checkpoint["channel_values"]["messages"]
    assert first is not second and len(first) == len(second) + 1
    assert all(a is b for a, b in zip(first, second, strict=False))
    again = next(iter(saver.list(thread("t"), limit=1))).checkpoint["channel_values"]["messages"]
    assert again == first
    assert not any(a is b for a, b in zip(again, first, strict=True))
